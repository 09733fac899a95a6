//! Series dictionaries: one per collector connection.
//!
//! A collector names a series in full the first time it sends it within a
//! dictionary (`SeriesValue.ref` with `series_id`), and by the ref alone
//! after that (see `PartialBatch.dictionary` in the wire contract). The
//! decoder keeps, per connection, what each ref means: the series' kind,
//! its shard, and a **slot**, a number dense per connection and merge
//! thread. The merge thread that owns the shard keeps, per connection, the
//! series number of each slot ([`crate::tile::Tiler`]), so a partial sent
//! by ref reaches its series with two array reads: no hash, no id compare.
//!
//! - A new connection starts with an empty dictionary. So does a batch that
//!   names a dictionary other than the connection's current one; the
//!   decoder then has the merge threads forget the old one
//!   ([`Decoder::take_forgotten`](super::Decoder::take_forgotten)).
//! - A ref the dictionary does not hold refuses its batch
//!   (`unknown_series_ref`, for good: the sender then starts a new
//!   dictionary). Nothing of the batch is applied.
//! - A batch the decoder refuses defines nothing: its definitions are
//!   rolled back ([`ConnectionDictionary::rollback`]). A batch refused
//!   after decoding (too late, buffers full) still has its definitions
//!   bound on the merge threads
//!   ([`Tiler::bind_definitions`](crate::tile::Tiler::bind_definitions)),
//!   because later batches of the same dictionary may already be on their
//!   way naming those series by ref.
//! - While a connection's dictionary names a series, the series is not
//!   expired; when the connection closes, its dictionaries go.

use tessera_core::parse::MetricKind;

/// What one ref means on one connection.
#[derive(Debug, Clone, Copy)]
pub struct RefEntry {
    /// The series' kind.
    pub kind: MetricKind,
    /// The series' shard.
    pub shard: u32,
    /// The slot on the merge thread that owns the shard.
    pub slot: u32,
}

/// One connection's dictionary, on the decoder.
#[derive(Debug, Default)]
pub struct ConnectionDictionary {
    /// The sender's dictionary id (`PartialBatch.dictionary`); 0 before any.
    pub generation: u64,
    /// By ref.
    entries: Vec<Option<RefEntry>>,
    /// Next free slot per merge thread.
    next_slot: Vec<u32>,
    /// Refs defined.
    defined: usize,
    /// What the batch being decoded changed: each ref it defined, with
    /// what it meant before.
    journal: Vec<(u32, Option<RefEntry>)>,
}

impl ConnectionDictionary {
    /// Starts the sender's dictionary `generation`, empty.
    pub fn restart(&mut self, generation: u64) {
        self.generation = generation;
        self.entries.clear();
        self.next_slot.clear();
        self.defined = 0;
        self.journal.clear();
    }

    /// Starts decoding a batch: [`rollback`](Self::rollback) undoes what
    /// is defined from here on.
    pub fn begin(&mut self) {
        self.journal.clear();
    }

    /// Undoes every definition since [`begin`](Self::begin) (the batch was
    /// refused). Slots handed out are not reused.
    pub fn rollback(&mut self) {
        while let Some((series_ref, previous)) = self.journal.pop() {
            // The journal holds refs this batch defined, so the entry is `Some`.
            self.defined -= usize::from(previous.is_none());
            self.entries[series_ref as usize] = previous;
        }
    }

    /// What `series_ref` means, if defined.
    #[inline]
    pub fn get(&self, series_ref: u32) -> Option<RefEntry> {
        self.entries.get(series_ref as usize).copied().flatten()
    }

    /// Defines `series_ref` as a series of `kind` in `shard`, owned by merge
    /// thread `thread`; a ref defined again for the same kind and shard
    /// keeps its slot (a batch sent again). Returns the slot.
    pub fn define(&mut self, series_ref: u32, kind: MetricKind, shard: u32, thread: usize) -> u32 {
        let index = series_ref as usize;
        if let Some(Some(entry)) = self.entries.get(index)
            && entry.kind == kind
            && entry.shard == shard
        {
            return entry.slot;
        }
        if index >= self.entries.len() {
            self.entries.resize(index + 1, None);
        }
        if thread >= self.next_slot.len() {
            self.next_slot.resize(thread + 1, 0);
        }
        let slot = self.next_slot[thread];
        self.next_slot[thread] += 1;
        if self.entries[index].is_none() {
            self.defined += 1;
        }
        let previous = self.entries[index].replace(RefEntry { kind, shard, slot });
        self.journal.push((series_ref, previous));
        slot
    }

    /// Refs defined.
    pub fn len(&self) -> usize {
        self.defined
    }

    /// Whether no ref is defined.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.defined == 0
    }
}

#[cfg(test)]
mod tests;
