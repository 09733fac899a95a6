//! A hash index of positions whose lookups can be prefetched: where each series' slot of
//! a [`Table`](crate::table::Table) lies, or each series number of the aggregator's registry.
//!
//! A flat array of `u32` entries, open addressing with linear probing, at most three
//! quarters full. An entry holds a slot's position in its low `bits` bits and, above
//! them, bits of the series' hash (its tag): a probe passes over another series without
//! reading its slot, so a lookup reads one entry's cache line and then the one slot it
//! names. The home entry of a hash is taken from the hash's top `bits` bits, which the
//! tag does not use.
//!
//! ```text
//!  hash: [ home: top `bits` bits | ... | tag: bits `bits`..32 | ... ]
//!  entry (u32):                        [ tag bits | position (`bits` bits) ]
//! ```
//!
//! The index exists so that a lookup's memory reads can be *started* before they are
//! needed ([`Positions::prefetch`]): at a million series neither the entries nor the
//! slots stay in cache, and a reader that prefetches a group of lines' entries, then
//! their slots, has all those misses in flight at once instead of two after another per
//! line. hashbrown's table gives no way to prefetch the bucket a hash will probe.
//!
//! **Invariant.** A table of `2^bits` entries holds fewer than `2^bits - 1` positions
//! (at most three quarters), so no entry is ever [`EMPTY`] (`u32::MAX`, whose position
//! bits would be `2^bits - 1`).

/// An unused entry.
const EMPTY: u32 = u32::MAX;

/// The smallest index: 16 entries, one cache line.
const MIN_BITS: u32 = 4;

/// Positions (dense numbers from 0: slots of a vector, series numbers) by hash. The
/// caller keeps what each position names and its hash: a lookup checks its candidate
/// itself, and growing or removing asks for the hashes of the positions held.
///
/// ```
/// use tessera_core::index::Positions;
///
/// let names: Vec<&str> = vec!["a", "b"];
/// let hash_of = |position: u32| (position as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
/// let mut index = Positions::default();
/// for position in 0..names.len() as u32 {
///     index.insert(hash_of(position), position, hash_of);
/// }
/// index.prefetch(hash_of(1)); // start loading the entry now, look it up later
/// assert_eq!(index.find(hash_of(1), |position| names[position as usize] == "b"), Some(1));
/// ```
pub struct Positions {
    entries: Box<[u32]>,
    bits: u32,
    len: usize,
}

impl Default for Positions {
    fn default() -> Positions {
        Positions::with_bits(MIN_BITS)
    }
}

/// Starts loading the cache line at `pointer` (a hint: nothing is read, nothing can fault).
#[inline(always)]
pub fn prefetch<T>(pointer: *const T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch is a hint to the cache. It reads nothing architecturally and
    // does not fault, whatever the address, so any pointer value is sound here.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(pointer.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = pointer;
}

impl Positions {
    fn with_bits(bits: u32) -> Positions {
        Positions { entries: vec![EMPTY; 1 << bits].into_boxed_slice(), bits, len: 0 }
    }

    /// Bits of an entry that hold the position.
    #[inline(always)]
    fn position_mask(&self) -> u32 {
        ((1u64 << self.bits) - 1) as u32
    }

    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        (hash >> (64 - self.bits)) as usize
    }

    #[inline(always)]
    fn tag(&self, hash: u64) -> u32 {
        (hash as u32) & !self.position_mask()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the index holds before it grows.
    pub fn capacity(&self) -> usize {
        self.entries.len() / 4 * 3
    }

    /// Bytes of the entries.
    pub fn bytes(&self) -> usize {
        self.entries.len() * std::mem::size_of::<u32>()
    }

    /// Bytes the index would allocate to take one more position (the old entries live
    /// until the new ones are filled), if it must grow to.
    pub fn growth_bytes(&self) -> Option<u64> {
        (self.len >= self.capacity()).then(|| (self.entries.len() * 2 * std::mem::size_of::<u32>()) as u64)
    }

    /// Starts loading the entry a lookup of `hash` reads first.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.entries[self.home(hash)]);
    }

    /// The first position whose entry carries `hash`'s tag and for which `is` holds, in
    /// probe order.
    #[inline(always)]
    pub fn find(&self, hash: u64, is: impl FnMut(u32) -> bool) -> Option<u32> {
        self.find_entry(hash, is).map(|at| self.entries[at] & self.position_mask())
    }

    /// Where the entry [`Positions::find`] would return lies.
    #[inline(always)]
    fn find_entry(&self, hash: u64, mut is: impl FnMut(u32) -> bool) -> Option<usize> {
        let mask = self.entries.len() - 1;
        let position_mask = self.position_mask();
        let tag = self.tag(hash);
        let mut at = self.home(hash);
        loop {
            let entry = self.entries[at];
            if entry == EMPTY {
                return None;
            }
            if entry & !position_mask == tag && is(entry & position_mask) {
                return Some(at);
            }
            at = (at + 1) & mask;
        }
    }

    /// Adds `position` under `hash` (the caller knows it is not there). `hash_of` gives
    /// the hash of a position already held, to move it when the index grows.
    pub fn insert(&mut self, hash: u64, position: u32, hash_of: impl Fn(u32) -> u64) {
        // Grown for one more, and wide enough for the position (positions are dense, so
        // this is the same but for a caller whose positions ran ahead of its count).
        let mut bits = self.bits;
        while (1usize << bits) / 4 * 3 <= self.len || u64::from(position) >= (1u64 << bits) - 1 {
            bits += 1;
        }
        if bits != self.bits {
            self.rebuild(bits, hash_of);
        }
        self.place(hash, position);
        self.len += 1;
    }

    fn place(&mut self, hash: u64, position: u32) {
        let mask = self.entries.len() - 1;
        let mut at = self.home(hash);
        while self.entries[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.entries[at] = self.tag(hash) | position;
    }

    /// Rebuilds the index with `2^bits` entries.
    fn rebuild(&mut self, bits: u32, hash_of: impl Fn(u32) -> u64) {
        let old_mask = self.position_mask();
        let old = std::mem::replace(self, Positions::with_bits(bits));
        for entry in old.entries.iter().copied().filter(|&entry| entry != EMPTY) {
            let position = entry & old_mask;
            self.place(hash_of(position), position);
        }
        self.len = old.len;
    }

    /// Rebuilds the index for `room` positions, no fewer than it holds.
    pub fn shrink_to(&mut self, room: usize, hash_of: impl Fn(u32) -> u64) {
        let room = room.max(self.len);
        let mut bits = MIN_BITS;
        while (1usize << bits) / 4 * 3 < room {
            bits += 1;
        }
        if bits < self.bits {
            self.rebuild(bits, hash_of);
        }
    }

    /// Removes `position`, held under `hash`. `hash_of` gives the hashes of the positions
    /// held, to close the gap (backward-shift deletion: no tombstones).
    pub fn remove(&mut self, hash: u64, position: u32, hash_of: impl Fn(u32) -> u64) {
        let Some(mut gap) = self.find_entry(hash, |held| held == position) else { return };
        let mask = self.entries.len() - 1;
        let position_mask = self.position_mask();
        let mut at = gap;
        loop {
            at = (at + 1) & mask;
            let entry = self.entries[at];
            if entry == EMPTY {
                break;
            }
            let home = self.home(hash_of(entry & position_mask));
            // The entry at `at` may fill the gap unless its home lies cyclically in
            // (gap, at]: then moving it before its home would hide it.
            let stays = if gap <= at { gap < home && home <= at } else { gap < home || home <= at };
            if !stays {
                self.entries[gap] = entry;
                gap = at;
            }
        }
        self.entries[gap] = EMPTY;
        self.len -= 1;
    }

    /// Moves the entry of `from`, held under `hash`, to name `to` instead.
    pub fn rename(&mut self, hash: u64, from: u32, to: u32) {
        if let Some(at) = self.find_entry(hash, |held| held == from) {
            self.entries[at] = self.tag(hash) | to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hash whose home and tag both come from `key`, spread.
    fn hash_of(key: u32) -> u64 {
        u64::from(key).wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17)
    }

    fn all_found(index: &Positions, held: &[u32]) -> bool {
        held.iter().all(|&position| index.find(hash_of(position), |found| found == position) == Some(position))
    }

    #[test]
    fn positions_are_found_through_growth_removal_renaming_and_shrinking() {
        let mut index = Positions::default();
        let mut held: Vec<u32> = (0..10_000).collect();
        for &position in &held {
            index.insert(hash_of(position), position, hash_of);
        }
        assert_eq!(index.len(), 10_000);
        assert!(index.capacity() >= 10_000 && index.bytes() == index.capacity() / 3 * 4 * 4);
        assert!(all_found(&index, &held));
        assert_eq!(index.find(hash_of(20_000), |found| found == 20_000), None);
        // Remove three in four, then the rest stay found (backward shifts keep every chain).
        for position in (0..10_000).filter(|position| position % 4 != 0) {
            index.remove(hash_of(position), position, hash_of);
        }
        held.retain(|position| position % 4 == 0);
        assert_eq!(index.len(), held.len());
        assert!(all_found(&index, &held));
        assert!((1..10_000).step_by(4).all(|gone| index.find(hash_of(gone), |found| found == gone).is_none()));
    }

    #[test]
    fn a_shrunk_index_finds_what_it_holds_in_less_room() {
        // Positions are dense, as a table's slots are: those left after a shrink fit it.
        let mut index = Positions::default();
        for position in 0..10_000 {
            index.insert(hash_of(position), position, hash_of);
        }
        for position in 2_000..10_000 {
            index.remove(hash_of(position), position, hash_of);
        }
        let bytes = index.bytes();
        index.shrink_to(4_000, hash_of);
        assert!(index.bytes() < bytes, "{} < {bytes}", index.bytes());
        assert!(index.capacity() >= 4_000);
        assert!(all_found(&index, &(0..2_000).collect::<Vec<_>>()));
    }

    #[test]
    fn a_renamed_position_is_found_under_its_new_name_only() {
        // Positions name slots; a hash stays with its series when the slot moves.
        let mut index = Positions::default();
        for position in 0..100 {
            index.insert(hash_of(position), position, hash_of);
        }
        index.remove(hash_of(99), 99, hash_of);
        index.rename(hash_of(7), 7, 99);
        assert_eq!(index.find(hash_of(7), |_| true), Some(99));
        assert_eq!(index.find(hash_of(7), |found| found == 7), None);
        assert_eq!(index.find(hash_of(99), |found| found == 99), None, "99's own hash is gone");
    }

    #[test]
    fn a_full_probe_chain_wraps_around_the_end() {
        // Every hash homes on the last entry: the chain wraps to the start.
        let mut index = Positions::default();
        let last_home = |tag: u32| u64::MAX << 32 | u64::from(tag << MIN_BITS);
        for position in 0..12 {
            index.insert(last_home(position), position, last_home);
        }
        assert_eq!(index.len(), 12);
        for position in 0..12 {
            assert_eq!(index.find(last_home(position), |found| found == position), Some(position));
        }
        index.remove(last_home(0), 0, last_home);
        for position in 1..12 {
            assert_eq!(index.find(last_home(position), |found| found == position), Some(position));
        }
    }
}
