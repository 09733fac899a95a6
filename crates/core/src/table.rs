//! A series table: folds parsed lines into one [`Aggregate`] per series.
//!
//! The table is keyed by the series' table key (kind byte + canonical id,
//! see [`SeriesKey`]). Observing a line of a series the table already holds
//! allocates nothing: the key is built in a reused buffer and looked up by
//! slice. [`Table::cut`] hands every aggregate touched since the last cut to
//! a callback and resets it in place, keeping the slot (and its sketch or
//! set allocations) for the next window; slots idle for a configurable
//! number of cuts are dropped. A cap on series protects the process from
//! a cardinality explosion: lines of new series beyond it are refused with
//! [`TableFull`], and the caller counts them.
//!
//! ```
//! use tessera_core::{parse::{parse_line, Parsed}, table::{Table, TableOptions}};
//!
//! let mut table = Table::new(TableOptions::default());
//! for text in [&b"a:1|c|#x:1,y:2"[..], b"a:2|c|#y:2,x:1"] {
//!     let Parsed::Metric(line) = parse_line(text) else { unreachable!() };
//!     table.observe(&line, 0).unwrap();
//! }
//! let mut out = Vec::new();
//! table.cut(|_kind, id, aggregate| out.push((id.to_vec(), aggregate.counter())));
//! assert_eq!(out, vec![(b"a|#x:1,y:2".to_vec(), Some(3.0))]);
//! ```

use std::collections::HashMap;

use crate::aggregate::{Aggregate, AggregateError, GaugeDeltas};
use crate::parse::{Line, MetricKind};
use crate::series::{SeriesKey, kind_from_byte};

/// Settings of a [`Table`].
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// Most series the table holds; new series beyond it are refused.
    pub max_series: Option<usize>,
    /// Slots not touched for this many cuts are dropped (`None`: never).
    pub expire_after_idle_cuts: Option<u32>,
    /// How signed gauge values are read.
    pub gauge_deltas: GaugeDeltas,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions { max_series: None, expire_after_idle_cuts: Some(300), gauge_deltas: GaugeDeltas::Statsd }
    }
}

/// The table refused a new series because it holds `max_series` already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("series table is full ({max_series} series)")]
pub struct TableFull {
    /// The cap that was hit.
    pub max_series: usize,
}

/// What [`Table::cut`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutStats {
    /// Aggregates handed to the callback.
    pub emitted: usize,
    /// Idle slots dropped.
    pub expired: usize,
    /// Slots left after the cut.
    pub remaining: usize,
}

/// Longest key stored inside the table's bucket rather than on the heap.
const INLINE_KEY_BYTES: usize = 46;

/// A table key: short keys (most statsd series) live inside the hash
/// table's bucket, so a lookup compares them without another cache miss.
#[derive(Clone)]
enum KeyBytes {
    Inline { len: u8, bytes: [u8; INLINE_KEY_BYTES] },
    Heap(Box<[u8]>),
}

impl KeyBytes {
    fn new(key: &[u8]) -> KeyBytes {
        if key.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0u8; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            KeyBytes::Inline { len: key.len() as u8, bytes }
        } else {
            KeyBytes::Heap(key.into())
        }
    }

    #[inline]
    fn as_slice(&self) -> &[u8] {
        match self {
            KeyBytes::Inline { len, bytes } => &bytes[..*len as usize],
            KeyBytes::Heap(bytes) => bytes,
        }
    }

    fn heap_len(&self) -> usize {
        match self {
            KeyBytes::Inline { .. } => 0,
            KeyBytes::Heap(bytes) => bytes.len(),
        }
    }
}

impl std::ops::Deref for KeyBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::borrow::Borrow<[u8]> for KeyBytes {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

// Hash and equality must agree with `[u8]`'s, since lookups borrow as `[u8]`.
impl std::hash::Hash for KeyBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialEq for KeyBytes {
    fn eq(&self, other: &KeyBytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for KeyBytes {}

struct Slot {
    aggregate: Aggregate,
    touched: bool,
    idle_cuts: u32,
}

/// A table of per-series aggregates for one window.
pub struct Table {
    slots: HashMap<KeyBytes, Slot, foldhash::fast::RandomState>,
    key: SeriesKey,
    options: TableOptions,
}

impl Table {
    /// An empty table.
    pub fn new(options: TableOptions) -> Table {
        Table { slots: HashMap::default(), key: SeriesKey::default(), options }
    }

    /// Series held (touched or idle).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table holds no series.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Folds a parsed line into its series' aggregate.
    ///
    /// Returns whether the series is new to the table.
    #[inline]
    pub fn observe(&mut self, line: &Line<'_>, now_ms: i64) -> Result<bool, TableFull> {
        // The parser accepted the line, so its tags fit.
        if self.key.build(line).is_err() {
            return Ok(false);
        }
        let gauge_deltas = self.options.gauge_deltas;
        if let Some(slot) = self.slots.get_mut(self.key.table_key()) {
            slot.aggregate.observe(line, now_ms, gauge_deltas);
            slot.touched = true;
            return Ok(false);
        }
        let slot = self.insert_slot(line.kind)?;
        slot.aggregate.observe(line, now_ms, gauge_deltas);
        Ok(true)
    }

    /// Merges an aggregate for series `id` of `kind` into the table.
    ///
    /// Returns whether the series is new to the table.
    pub fn merge(&mut self, kind: MetricKind, id: &[u8], aggregate: &Aggregate) -> Result<bool, MergeError> {
        self.key.set_raw(kind, id);
        if let Some(slot) = self.slots.get_mut(self.key.table_key()) {
            slot.aggregate.merge(aggregate)?;
            slot.touched = true;
            return Ok(false);
        }
        let slot = self.insert_slot(kind)?;
        slot.aggregate.merge(aggregate)?;
        Ok(true)
    }

    fn insert_slot(&mut self, kind: MetricKind) -> Result<&mut Slot, TableFull> {
        if let Some(max_series) = self.options.max_series
            && self.slots.len() >= max_series
        {
            return Err(TableFull { max_series });
        }
        let key = KeyBytes::new(self.key.table_key());
        let slot =
            self.slots.entry(key).or_insert(Slot { aggregate: Aggregate::new(kind), touched: true, idle_cuts: 0 });
        Ok(slot)
    }

    /// Hands every aggregate touched since the last cut to `each` (kind,
    /// canonical id, aggregate), resets it, and drops slots idle for longer
    /// than the table's expiry.
    pub fn cut(&mut self, mut each: impl FnMut(MetricKind, &[u8], &Aggregate)) -> CutStats {
        let mut stats = CutStats::default();
        let expire_after = self.options.expire_after_idle_cuts;
        self.slots.retain(|key, slot| {
            if slot.touched {
                let kind = kind_from_byte(key[0]).expect("table keys start with a kind byte");
                each(kind, &key[1..], &slot.aggregate);
                slot.aggregate.reset();
                slot.touched = false;
                slot.idle_cuts = 0;
                stats.emitted += 1;
                return true;
            }
            slot.idle_cuts = slot.idle_cuts.saturating_add(1);
            let keep = expire_after.is_none_or(|limit| slot.idle_cuts <= limit);
            if !keep {
                stats.expired += 1;
            }
            keep
        });
        stats.remaining = self.slots.len();
        stats
    }

    /// Bytes held by the table's slots and keys, estimated (for memory gauges).
    pub fn estimated_bytes(&self) -> usize {
        let per_slot = std::mem::size_of::<KeyBytes>() + std::mem::size_of::<Slot>() + 1;
        self.slots.iter().map(|(key, slot)| per_slot + key.heap_len() + slot.aggregate.heap_bytes()).sum::<usize>()
    }
}

/// Why [`Table::merge`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The table is full.
    #[error(transparent)]
    Full(#[from] TableFull),
    /// The aggregate does not fit the series.
    #[error(transparent)]
    Aggregate(#[from] AggregateError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Parsed, parse_line};

    fn observe(table: &mut Table, text: &[u8]) -> Result<bool, TableFull> {
        let Parsed::Metric(line) = parse_line(text) else { panic!("{text:?}") };
        table.observe(&line, 0)
    }

    fn cut(table: &mut Table) -> Vec<(MetricKind, Vec<u8>, Aggregate)> {
        let mut out = Vec::new();
        table.cut(|kind, id, aggregate| out.push((kind, id.to_vec(), aggregate.clone())));
        out.sort_by(|a, b| a.1.cmp(&b.1));
        out
    }

    #[test]
    fn folds_lines_per_series_and_kind() {
        let mut table = Table::new(TableOptions::default());
        assert!(observe(&mut table, b"a:1|c").unwrap());
        assert!(!observe(&mut table, b"a:2|c").unwrap());
        assert!(observe(&mut table, b"a:5|g").unwrap());
        assert!(observe(&mut table, b"b:1|c|#k:v").unwrap());
        let out = cut(&mut table);
        assert_eq!(out.len(), 3);
        assert!(out.contains(&(MetricKind::Counter, b"a".to_vec(), Aggregate::Counter(3.0))));
        assert!(out.contains(&(MetricKind::Counter, b"b|#k:v".to_vec(), Aggregate::Counter(1.0))));
    }

    #[test]
    fn cut_emits_only_touched_series_and_expires_idle_ones() {
        let mut table = Table::new(TableOptions { expire_after_idle_cuts: Some(2), ..TableOptions::default() });
        observe(&mut table, b"a:1|c").unwrap();
        observe(&mut table, b"b:1|c").unwrap();
        assert_eq!(cut(&mut table).len(), 2);
        observe(&mut table, b"a:1|c").unwrap();
        let out = cut(&mut table);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].2, Aggregate::Counter(1.0), "the aggregate was reset at the cut");
        assert_eq!(table.cut(|_, _, _| {}).expired, 0);
        let stats = table.cut(|_, _, _| {});
        assert_eq!((stats.emitted, stats.expired, stats.remaining), (0, 1, 1), "b idle for 3 cuts");
    }

    #[test]
    fn a_full_table_refuses_new_series_but_keeps_folding_known_ones() {
        let mut table = Table::new(TableOptions { max_series: Some(2), ..TableOptions::default() });
        observe(&mut table, b"a:1|c").unwrap();
        observe(&mut table, b"b:1|c").unwrap();
        assert_eq!(observe(&mut table, b"c:1|c"), Err(TableFull { max_series: 2 }));
        observe(&mut table, b"a:1|c").unwrap();
        let out = cut(&mut table);
        assert_eq!(out[0].2, Aggregate::Counter(2.0));
    }

    #[test]
    fn long_and_short_keys_are_the_same_series_however_stored() {
        let mut table = Table::new(TableOptions::default());
        let long_name = "x".repeat(200);
        for _ in 0..3 {
            observe(&mut table, format!("{long_name}:1|c").as_bytes()).unwrap();
            observe(&mut table, b"short:1|c").unwrap();
        }
        assert_eq!(table.len(), 2);
        let out = cut(&mut table);
        assert_eq!(out[0].1, b"short".to_vec());
        assert_eq!(out[1].1, long_name.as_bytes().to_vec());
        assert!(out.iter().all(|(_, _, aggregate)| *aggregate == Aggregate::Counter(3.0)));
    }

    #[test]
    fn merge_folds_wire_aggregates_into_the_same_slots() {
        let mut table = Table::new(TableOptions::default());
        observe(&mut table, b"a:1|c|#x:1").unwrap();
        assert!(!table.merge(MetricKind::Counter, b"a|#x:1", &Aggregate::Counter(4.0)).unwrap());
        assert!(table.merge(MetricKind::Counter, b"z", &Aggregate::Counter(1.0)).unwrap());
        let err = table.merge(MetricKind::Counter, b"z", &Aggregate::new(MetricKind::Set)).unwrap_err();
        assert!(err.to_string().contains("cannot merge a set into a counter"), "{err}");
        let out = cut(&mut table);
        assert_eq!(out[0], (MetricKind::Counter, b"a|#x:1".to_vec(), Aggregate::Counter(5.0)));
    }
}
