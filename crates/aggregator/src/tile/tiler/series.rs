//! The series a merge thread knows, by number.
//!
//! A [`Registry`] gives every (kind, canonical id) a small dense number the
//! first time it is seen. Everything else a merge thread keeps per series
//! is indexed by that number, without hashing: each policy's tile tables
//! ([`super::policy_tiles`]), the gauges' last values, and the connection
//! dictionaries of `intake/dictionary.rs` that let a collector name a series
//! by a number of its own. So a partial is hashed and its id compared at
//! most once, when it is resolved here, and not at all when it comes by a
//! dictionary reference.
//!
//! A number is freed when its series has been idle long enough for every
//! policy ([`Registry::expire`]) and no connection dictionary names it
//! ([`Registry::pin`]); freed numbers are reused.

use std::hash::BuildHasher;
use std::sync::Arc;

use tessera_core::budget::MemoryBudget;
use tessera_core::index::{Positions, prefetch};

use tessera_core::parse::MetricKind;
use tessera_core::series::kind_byte;

/// A series number, dense from 0.
pub type SeriesNumber = u32;

/// The series was not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryFull {
    /// The series cap was reached.
    Series,
    /// The aggregator is near its memory limit.
    Memory,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    kind: MetricKind,
    /// Empty while the number is free.
    id: Box<[u8]>,
    /// Start of the newest window merged into the series, unix ms.
    last_window_ms: i64,
    /// Connection dictionaries that name the series.
    pins: u32,
    live: bool,
}

/// A series hashed for [`Registry::resolve_prepared`], and the number it probably has.
#[derive(Debug, Clone, Copy)]
pub struct Prepared {
    hash: u64,
    candidate: Option<SeriesNumber>,
}

/// Series numbers of one merge thread; see the [module docs](self).
pub struct Registry {
    index: Positions,
    hasher: foldhash::fast::RandomState,
    entries: Vec<Entry>,
    free: Vec<SeriesNumber>,
    max_series: Option<usize>,
    /// While it sheds, new series are refused ([`RegistryFull::Memory`]); known ones go on.
    budget: Option<Arc<MemoryBudget>>,
}

impl Registry {
    /// Refuses new series while `budget` sheds (the memory guard's), and past its series
    /// cap ([`MemoryBudget::with_series_cost`]), which every merge thread's registry shares.
    pub fn set_budget(&mut self, budget: Arc<MemoryBudget>) {
        self.budget = Some(budget);
    }

    /// An empty registry holding at most `max_series` series.
    pub fn new(max_series: Option<usize>) -> Registry {
        Registry {
            index: Positions::default(),
            hasher: foldhash::fast::RandomState::default(),
            entries: Vec::new(),
            free: Vec::new(),
            max_series,
            budget: None,
        }
    }

    /// Series registered.
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    fn hash(&self, kind: MetricKind, id: &[u8]) -> u64 {
        self.hasher.hash_one((kind_byte(kind), id))
    }

    /// The number of `(kind, id)`, registering it if new; `true` if new.
    pub fn resolve(&mut self, kind: MetricKind, id: &[u8]) -> Result<(SeriesNumber, bool), RegistryFull> {
        let hash = self.hash(kind, id);
        self.resolve_prepared(kind, id, Prepared { hash, candidate: None })
    }

    /// The first step of resolving a group of series whose misses overlap: hashes
    /// `(kind, id)` and starts loading its index entry.
    #[inline]
    pub fn prepare(&self, kind: MetricKind, id: &[u8]) -> Prepared {
        let hash = self.hash(kind, id);
        self.index.prefetch(hash);
        Prepared { hash, candidate: None }
    }

    /// The second step: reads the (prefetched) index entry for the number the series
    /// probably has, and starts loading that number's entry.
    #[inline]
    pub fn guess(&self, prepared: &mut Prepared) {
        prepared.candidate = self.index.find(prepared.hash, |_| true);
        if let Some(entry) = prepared.candidate.and_then(|number| self.entries.get(number as usize)) {
            prefetch(entry);
        }
    }

    /// [`Registry::resolve`] of a series [`Registry::prepare`]d (and perhaps
    /// [`Registry::guess`]ed): the guess is checked, and the whole lookup taken when wrong.
    pub fn resolve_prepared(
        &mut self,
        kind: MetricKind,
        id: &[u8],
        prepared: Prepared,
    ) -> Result<(SeriesNumber, bool), RegistryFull> {
        let Prepared { hash, candidate } = prepared;
        let entries = &self.entries;
        let is = |number: SeriesNumber| {
            let entry = &entries[number as usize];
            entry.live && entry.hash == hash && entry.kind == kind && *entry.id == *id
        };
        if let Some(number) = candidate.filter(|&number| is(number)).or_else(|| self.index.find(hash, is)) {
            return Ok((number, false));
        }
        if self.max_series.is_some_and(|max| self.len() >= max) {
            return Err(RegistryFull::Series);
        }
        if let Some(budget) = &self.budget
            && (budget.shedding() || !budget.admit_series())
        {
            return Err(RegistryFull::Memory);
        }
        let entry = Entry { hash, kind, id: id.into(), last_window_ms: i64::MIN, pins: 0, live: true };
        let number = match self.free.pop() {
            Some(number) => {
                self.entries[number as usize] = entry;
                number
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as SeriesNumber
            }
        };
        let entries = &self.entries;
        self.index.insert(hash, number, |n| entries[n as usize].hash);
        Ok((number, true))
    }

    /// Records that the window at `window_start_ms` was merged into `number`.
    #[inline]
    pub fn touch(&mut self, number: SeriesNumber, window_start_ms: i64) {
        let entry = &mut self.entries[number as usize];
        entry.last_window_ms = entry.last_window_ms.max(window_start_ms);
    }

    /// The kind and canonical id of `number`.
    #[inline]
    pub fn series(&self, number: SeriesNumber) -> (MetricKind, &[u8]) {
        let entry = &self.entries[number as usize];
        (entry.kind, &entry.id)
    }

    /// Whether `number` is a live series.
    #[cfg(test)]
    pub fn is_live(&self, number: SeriesNumber) -> bool {
        self.entries.get(number as usize).is_some_and(|entry| entry.live)
    }

    /// A connection dictionary names `number`: it is not freed until unpinned.
    pub fn pin(&mut self, number: SeriesNumber) {
        self.entries[number as usize].pins += 1;
    }

    /// A connection dictionary no longer names `number`.
    pub fn unpin(&mut self, number: SeriesNumber) {
        let entry = &mut self.entries[number as usize];
        entry.pins = entry.pins.saturating_sub(1);
    }

    /// Frees every unpinned series whose newest window started before
    /// `idle_before_ms`, calling `freed` with each number; returns how many.
    pub fn expire(&mut self, idle_before_ms: i64, mut freed: impl FnMut(SeriesNumber)) -> usize {
        let mut count = 0;
        for (number, entry) in self.entries.iter_mut().enumerate() {
            if !entry.live || entry.pins > 0 || entry.last_window_ms >= idle_before_ms {
                continue;
            }
            let number = number as SeriesNumber;
            entry.live = false;
            entry.id = Box::default();
            self.free.push(number);
            count += 1;
            freed(number);
        }
        // Out of the index after the walk: removing one moves others, which asks for their
        // hashes (freed entries keep theirs).
        let entries = &self.entries;
        for &number in &self.free[self.free.len() - count..] {
            self.index.remove(entries[number as usize].hash, number, |n| entries[n as usize].hash);
        }
        if let Some(budget) = &self.budget {
            budget.release_series(count);
        }
        count
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release_series(self.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_lookups_resolve_as_plain_ones_even_when_the_guess_is_stale() {
        let mut registry = Registry::new(None);
        let ids: Vec<Vec<u8>> = (0..5_000).map(|i| format!("s.{i}").into_bytes()).collect();
        // Prepared and guessed before any is registered: every guess is empty, and the
        // repeats of a group find what an earlier one of the group registered.
        let mut numbers = Vec::new();
        for group in ids.chunks(16).chain(ids.chunks(16)) {
            let mut prepared: Vec<Prepared> =
                group.iter().map(|id| registry.prepare(MetricKind::Counter, id)).collect();
            prepared.iter_mut().for_each(|ahead| registry.guess(ahead));
            for (id, ahead) in group.iter().zip(prepared) {
                numbers.push(registry.resolve_prepared(MetricKind::Counter, id, ahead).unwrap());
            }
        }
        assert_eq!(registry.len(), 5_000);
        let (first, second) = numbers.split_at(5_000);
        assert!(first.iter().all(|&(_, new)| new) && second.iter().all(|&(_, new)| !new));
        assert!(first.iter().zip(second).all(|(a, b)| a.0 == b.0));
        for (id, &(number, _)) in ids.iter().zip(first) {
            assert_eq!(registry.resolve(MetricKind::Counter, id), Ok((number, false)));
            assert_eq!(
                registry.resolve(MetricKind::Gauge, id).map(|(_, new)| new),
                Ok(true),
                "kind is part of the key"
            );
        }
        // A guess naming another series is checked, not taken.
        let (b, _) = registry.resolve(MetricKind::Counter, &ids[1]).unwrap();
        let wrong = Prepared { hash: registry.hash(MetricKind::Counter, &ids[0]), candidate: Some(b) };
        assert_eq!(registry.resolve_prepared(MetricKind::Counter, &ids[0], wrong), Ok((first[0].0, false)));
        // A guess made before the series expired names a freed number: not taken.
        let mut stale = registry.prepare(MetricKind::Counter, &ids[0]);
        registry.guess(&mut stale);
        registry.expire(i64::MAX, |_| {});
        assert_eq!(registry.len(), 0);
        assert_eq!(registry.resolve_prepared(MetricKind::Counter, &ids[0], stale).map(|(_, new)| new), Ok(true));
    }

    #[test]
    fn numbers_are_dense_reused_after_expiry_and_kept_while_pinned() {
        let mut registry = Registry::new(Some(3));
        assert_eq!(registry.resolve(MetricKind::Counter, b"a"), Ok((0, true)));
        assert_eq!(registry.resolve(MetricKind::Gauge, b"a"), Ok((1, true)), "kind is part of the key");
        assert_eq!(registry.resolve(MetricKind::Counter, b"a"), Ok((0, false)));
        assert_eq!(registry.resolve(MetricKind::Counter, b"b"), Ok((2, true)));
        assert_eq!(registry.resolve(MetricKind::Counter, b"c"), Err(RegistryFull::Series));
        registry.touch(0, 5_000);
        registry.touch(1, 1_000);
        registry.touch(2, 1_000);
        registry.pin(2);
        let mut freed = Vec::new();
        assert_eq!(registry.expire(2_000, |n| freed.push(n)), 1);
        assert_eq!(freed, [1], "0 is recent, 2 is pinned");
        assert_eq!(registry.len(), 2);
        assert!(!registry.is_live(1));
        assert_eq!(registry.resolve(MetricKind::Counter, b"c"), Ok((1, true)), "the freed number is reused");
        assert_eq!(registry.series(1), (MetricKind::Counter, &b"c"[..]));
        registry.unpin(2);
        assert_eq!(registry.expire(2_000, |_| {}), 2, "c never merged a window, 2 unpinned");
        assert_eq!(registry.resolve(MetricKind::Counter, b"a"), Ok((0, false)));
    }
}
