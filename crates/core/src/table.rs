//! A series table: folds parsed lines into one [`Aggregate`] per series.
//!
//! The table is keyed by the series' table key (kind byte + canonical id,
//! see [`SeriesKey`]), hashed as the pair (kind byte, id). Observing a line
//! of a series the table already holds allocates nothing: a line without
//! tags is looked up by its name as it lies in the datagram (its id), a
//! tagged line by its canonical id built in a reused buffer. [`Table::cut`] hands every aggregate touched since the last cut to
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

use std::hash::BuildHasher;
use std::sync::Arc;

use crate::aggregate::{
    Aggregate, AggregateError, Distribution, GaugeDeltas, MergeOrder, Observer, Reading, TimerUnit,
};
use crate::budget::MemoryBudget;
use crate::parse::{
    Line, MetricKind, ParseOptions, Parsed, RejectReason, SimpleLine, canonical_tags_len, parse_line_with,
    parse_simple_prefix, split_line,
};
use crate::series::{SeriesKey, TAGS_SEPARATOR, kind_byte, kind_from_byte, split_id};

use crate::index::{Positions, prefetch};

/// The observer source and the memory budget a new series is made with.
type NewSeries<'a> = (Option<&'a dyn ObserverSource>, Option<&'a MemoryBudget>);

/// Settings of a [`Table`].
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// Most series the table holds; new series beyond it are refused.
    pub max_series: Option<usize>,
    /// Slots not touched for this many cuts are dropped (`None`: never).
    pub expire_after_idle_cuts: Option<u32>,
    /// How signed gauge values are read.
    pub gauge_deltas: GaugeDeltas,
    /// The unit `|ms` values are kept in.
    pub timer_unit: TimerUnit,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            max_series: None,
            expire_after_idle_cuts: Some(300),
            gauge_deltas: GaugeDeltas::Statsd,
            timer_unit: TimerUnit::Seconds,
        }
    }
}

/// The table refused a new series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TableFull {
    /// It holds `max_series` already.
    #[error("series table is full ({max_series} series)")]
    Series {
        /// The cap that was hit.
        max_series: usize,
    },
    /// The daemon is near its memory limit, or growing the table would take it past it
    /// ([`Table::with_budget`]).
    #[error("near the memory limit: no new series")]
    Memory,
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
const INLINE_KEY_BYTES: usize = 38;

/// A key kept in a hash table's bucket: short keys (most statsd series)
/// live inside the bucket, so a lookup compares them without another cache
/// miss; longer ones go to the heap. Built only by [`KeyBytes::copy_of`]
/// (and the table), so its length always fits.
#[derive(Clone)]
pub struct KeyBytes(Repr);

#[derive(Clone)]
enum Repr {
    /// Up to 38 bytes, in place: the bytes used, then the key and zeros.
    Inline { len: u8, bytes: [u8; INLINE_KEY_BYTES] },
    /// Longer keys.
    Heap(Box<[u8]>),
}

impl KeyBytes {
    /// A key holding a copy of `key`.
    pub fn copy_of(key: &[u8]) -> KeyBytes {
        if key.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0u8; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            KeyBytes(Repr::Inline { len: key.len() as u8, bytes })
        } else {
            KeyBytes(Repr::Heap(key.into()))
        }
    }

    /// The key of `parts`: kind byte, name, and `|#` and the tags if any.
    fn new(parts: &KeyParts<'_>) -> KeyBytes {
        let len = parts.len();
        let mut key = [0u8; INLINE_KEY_BYTES];
        let mut heap = Vec::new();
        let bytes: &mut [u8] = if len <= INLINE_KEY_BYTES {
            &mut key[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        let name_end = 1 + parts.name.len();
        bytes[0] = parts.kind_byte;
        bytes[1..name_end].copy_from_slice(parts.name);
        if !parts.tags.is_empty() {
            bytes[name_end..name_end + 2].copy_from_slice(TAGS_SEPARATOR);
            bytes[name_end + 2..].copy_from_slice(parts.tags);
        }
        if len <= INLINE_KEY_BYTES {
            KeyBytes(Repr::Inline { len: len as u8, bytes: key })
        } else {
            KeyBytes(Repr::Heap(heap.into_boxed_slice()))
        }
    }

    /// The key's bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Heap(bytes) => bytes,
        }
    }

    /// Bytes held on the heap (0 for an inline key).
    fn heap_len(&self) -> usize {
        match &self.0 {
            Repr::Inline { .. } => 0,
            Repr::Heap(bytes) => bytes.len(),
        }
    }
}

impl KeyBytes {
    /// Whether this is the key of `parts`.
    #[inline(always)]
    fn matches(&self, parts: &KeyParts<'_>) -> bool {
        let key = self.as_slice();
        let name_end = 1 + parts.name.len();
        if key.len() != parts.len() || key[0] != parts.kind_byte || !same_bytes(&key[1..name_end], parts.name) {
            return false;
        }
        parts.tags.is_empty()
            || (key[name_end..name_end + 2] == *TAGS_SEPARATOR && same_bytes(&key[name_end + 2..], parts.tags))
    }
}

/// A table key in the pieces a line holds it in: the kind byte, the name,
/// and the canonical tags (empty when the series has none). The key itself
/// is `kind byte, name[, "|#", tags]`; hashing and comparing the pieces
/// means a line whose tags are already canonical is looked up in place.
#[derive(Debug, Clone, Copy)]
struct KeyParts<'a> {
    kind_byte: u8,
    name: &'a [u8],
    tags: &'a [u8],
}

impl<'a> KeyParts<'a> {
    /// The pieces of canonical id `id`, split at its first `|#` (an id
    /// ending in `|#` is all name, so that pieces and bytes map one to one).
    #[inline]
    fn of_id(kind: MetricKind, id: &'a [u8]) -> KeyParts<'a> {
        KeyParts::split(kind_byte(kind), id)
    }

    /// The pieces of a table key (kind byte, then the canonical id): the same pieces the
    /// key was made from, since every key's id splits as [`KeyParts::of_id`] splits it (a
    /// name never holds a `|`: the parsers refuse one before the `:`).
    #[inline]
    fn of_key(key: &'a [u8]) -> KeyParts<'a> {
        KeyParts::split(key[0], &key[1..])
    }

    #[inline]
    fn split(kind_byte: u8, id: &'a [u8]) -> KeyParts<'a> {
        let (name, tags) = match memchr::memchr(b'|', id) {
            Some(at) if id.get(at + 1) == Some(&b'#') => (&id[..at], &id[at + 2..]),
            Some(_) => split_id(id),
            None => (id, &b""[..]),
        };
        if tags.is_empty() {
            return KeyParts { kind_byte, name: id, tags: b"" };
        }
        KeyParts { kind_byte, name, tags }
    }

    /// The pieces of a line [`parse_simple_prefix`] took.
    #[inline(always)]
    fn of_simple(line: &SimpleLine<'a>) -> KeyParts<'a> {
        KeyParts { kind_byte: kind_byte(line.kind), name: line.name, tags: line.tags }
    }

    /// Bytes of the whole key.
    #[inline(always)]
    fn len(&self) -> usize {
        1 + self.name.len() + if self.tags.is_empty() { 0 } else { TAGS_SEPARATOR.len() + self.tags.len() }
    }

    #[inline(always)]
    fn hash(&self, seed: u64) -> u64 {
        let name_hash = key_hash(seed, self.kind_byte, self.name);
        if self.tags.is_empty() { name_hash } else { key_hash(name_hash, b'#', self.tags) }
    }
}

const K0: u64 = 0x9e37_79b9_7f4a_7c15;
const K1: u64 = 0xbf58_476d_1ce4_e5b9;
const K2: u64 = 0x94d0_49bb_1331_11eb;

#[inline(always)]
fn fold_multiply(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

#[inline(always)]
fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

#[inline(always)]
fn read_u32(bytes: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes")))
}

/// Hash of a table key `(kind byte, id)`, keyed by `seed`.
///
/// Series ids are short (most under 64 bytes), and a general-purpose hasher
/// spends more on its set-up than on the bytes, so this one reads them
/// the way wyhash and rapidhash do: two overlapping words for up to 16
/// bytes, 16 bytes per folded multiply beyond. It runs once per line.
#[inline(always)]
fn key_hash(seed: u64, kind_byte: u8, id: &[u8]) -> u64 {
    let len = id.len();
    let mut state = seed ^ u64::from(kind_byte).wrapping_mul(K0) ^ (len as u64).wrapping_mul(K2);
    let (a, b) = if len <= 16 {
        if len >= 8 {
            (read_u64(id, 0), read_u64(id, len - 8))
        } else if len >= 4 {
            (read_u32(id, 0), read_u32(id, len - 4))
        } else if len > 0 {
            ((u64::from(id[0]) << 16) | (u64::from(id[len / 2]) << 8) | u64::from(id[len - 1]), 0)
        } else {
            (0, 0)
        }
    } else {
        let mut at = 0;
        while len - at > 16 {
            state = fold_multiply(read_u64(id, at) ^ K1, read_u64(id, at + 8) ^ state);
            at += 16;
        }
        (read_u64(id, len - 16), read_u64(id, len - 8))
    };
    fold_multiply(fold_multiply(a ^ K1, b ^ state) ^ K0, state ^ K2)
}

/// Equality of two byte strings of the same length, inline: for the short
/// ids of statsd series it beats a call to `memcmp`.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let len = a.len();
    if len != b.len() {
        return false;
    }
    match len {
        8..=16 => read_u64(a, 0) == read_u64(b, 0) && read_u64(a, len - 8) == read_u64(b, len - 8),
        17..=32 => {
            read_u64(a, 0) == read_u64(b, 0)
                && read_u64(a, 8) == read_u64(b, 8)
                && read_u64(a, len - 16) == read_u64(b, len - 16)
                && read_u64(a, len - 8) == read_u64(b, len - 8)
        }
        _ => a == b,
    }
}

/// One series. Slots lie back to back in [`Table::slots`]; the hash index holds their
/// positions.
///
/// A slot is one cache line, aligned to one: a lookup that misses the cache reads one
/// line, and one prefetch starts it. The series' hash is not kept (it would take the slot
/// to 72 bytes, two lines for most slots): growing the index and moving a slot hash its
/// key again ([`Slots::hash_of`]), which a lookup never does.
#[repr(align(64))]
struct Slot {
    key: KeyBytes,
    aggregate: Aggregate,
    idle_cuts: u32,
    touched: bool,
}

/// Lines [`Table::fold_datagram`] looks up together: enough for their misses to overlap
/// (a core keeps a few tens of loads in flight), few enough that the first line's entry
/// has arrived by the time the last line is parsed.
const GROUP_LINES: usize = 16;

/// A simple line waiting in its group, with its hash and, once its index entry has been
/// read, the position of the slot it probably folds into.
#[derive(Clone, Copy)]
struct Pending<'a> {
    line: SimpleLine<'a>,
    hash: u64,
    candidate: Option<u32>,
}

impl Pending<'static> {
    const NONE: Pending<'static> = Pending {
        line: SimpleLine { name: b"", kind: MetricKind::Counter, value: 0.0, tags: b"" },
        hash: 0,
        candidate: None,
    };
}

/// A series [`Table::merge_all`] has hashed and prefetched.
struct PendingMerge<'a> {
    kind: MetricKind,
    parts: KeyParts<'a>,
    hash: u64,
    aggregate: &'a Aggregate,
    candidate: Option<u32>,
}

/// Where the lines of a datagram come from, for [`Table::fold_datagram_from`]: the
/// collector's origin detection, which tags each line with its sender's container and pod.
pub trait Origin {
    /// The origin tags of the datagram's sender, in canonical order
    /// ([`canonical_tags`](crate::series::canonical_tags)), when it has some: every line
    /// gets them. Without, only lines that name their own origin (a container id, external
    /// data) are asked for theirs.
    fn sender_tags(&self) -> Option<Arc<[u8]>>;

    /// The origin tags of `line`, comma-separated in DogStatsD form; `None` for none.
    fn tags_for(&mut self, line: &Line<'_>) -> Option<Arc<[u8]>>;
}

/// What [`Table::fold_datagram`] made of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folded {
    /// A metric line, folded into its series.
    Metric,
    /// A metric line, folded into its series, that had this many malformed
    /// tags written in its name, skipped (see
    /// [`name_tags`](crate::parse::name_tags)).
    MetricWithNameTagErrors(u32),
    /// A metric line of a new series, refused because the table is full.
    TableFull,
    /// A metric line of a new series, refused because the daemon is near its memory limit.
    MemoryLimit,
    /// An event or a service check (not folded).
    Event,
    /// A line that does not parse.
    Rejected(RejectReason),
}

impl Folded {
    /// What folding a metric line into the table did.
    #[inline]
    fn metric(observed: Result<bool, TableFull>) -> Folded {
        match observed {
            Ok(_) => Folded::Metric,
            Err(TableFull::Series { .. }) => Folded::TableFull,
            Err(TableFull::Memory) => Folded::MemoryLimit,
        }
    }
}

/// Which new series a statsd_exporter mapping makes a classic histogram (their values are
/// counted into fixed buckets as well as into their sketch,
/// [`FixedBuckets`](crate::aggregate::FixedBuckets)) or a summary with quantiles of its own
/// ([`Observer`]). Asked once per new timer, histogram or distribution series, never per line.
pub trait ObserverSource: Send + Sync {
    /// What a new series of `kind` with the statsd name `name` is written as, if a mapping says.
    fn observer(&self, kind: MetricKind, name: &[u8]) -> Option<Observer>;
}

/// A table of per-series aggregates for one window.
///
/// **Layout.** The slots lie back to back in a vector, and an index of their positions
/// ([`Positions`]: one `u32` an entry, at most three quarters full) finds them. A hash table
/// of the slots themselves is between 44 % and 88 % full, so a series cost up to twice its
/// slot: at 1 000 000 series, just past a doubling, 170 MB. Back to back they cost the
/// 64-byte slot and 5 to 11 bytes of index (75 MB at 1 000 000), and a cut walks them in order.
///
/// **Lookups in groups.** At a million series neither the index (8 MB) nor the slots
/// (64 MB) stay in cache: a line costs a miss on its index entry and then one on its slot.
/// [`Table::fold_datagram`] takes a datagram's simple lines [`GROUP_LINES`] at a time:
/// parsing and hashing each prefetches its index entry; then each entry read prefetches
/// its slot; then each line folds. A group's misses are in flight together instead of two
/// after another per line, which is what makes arrival order (random, against the
/// insertion order the slots lie in) cost little more than sequential order.
pub struct Table {
    slots: Slots,
    /// Where new distributions find their fixed buckets (a reader's table; `None` for the
    /// tables that merge partials, which take the buckets the partials carry).
    observers: Option<Arc<dyn ObserverSource>>,
    key: SeriesKey,
    /// Reused for a line's tags with its sender's origin tags merged in.
    merged_tags: Vec<u8>,
    options: TableOptions,
    /// Gauge merges whose order was ambiguous, since the last take.
    ambiguous_merges: u64,
    /// Merges that dropped fixed buckets, since the last take.
    buckets_dropped: u64,
    /// Lines whose origin tags were left off (they would pass [`MAX_TAGS`](crate::parse::MAX_TAGS)),
    /// since the last take.
    origin_tags_left_off: u64,
    /// While it sheds, new series are refused ([`TableFull::Memory`]); known ones go on.
    budget: Option<Arc<MemoryBudget>>,
}

impl Table {
    /// An empty table.
    pub fn new(options: TableOptions) -> Table {
        Table {
            slots: Slots::new(foldhash::fast::RandomState::default().hash_one(0u8)),
            observers: None,
            budget: None,
            key: SeriesKey::default(),
            merged_tags: Vec::new(),
            options,
            ambiguous_merges: 0,
            buckets_dropped: 0,
            origin_tags_left_off: 0,
        }
    }

    /// Refuses new series while `budget` sheds (a daemon near its memory limit: the
    /// runtime's memory guard), and a new series that would make the table double past
    /// the budget; the series it holds go on.
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Table {
        self.budget = Some(budget);
        self
    }

    /// Gives new distributions of this table the buckets or quantiles `source` says.
    pub fn with_observer_source(mut self, source: Arc<dyn ObserverSource>) -> Table {
        self.observers = Some(source);
        self
    }

    /// Parses every line of `datagram` and folds each metric into its
    /// series, calling `each` with what became of every non-blank line.
    /// `stamp_ns` is when the datagram was received (unix nanoseconds): it
    /// orders gauge lines (see [`Gauge`](crate::aggregate::Gauge)).
    ///
    /// Lines of the common shape `name:value|type` take [`parse_simple_prefix`] and
    /// are looked up by their name in place; the rest take the full parser.
    #[inline]
    pub fn fold_datagram(
        &mut self,
        datagram: &[u8],
        options: ParseOptions,
        stamp_ns: i64,
        mut each: impl FnMut(Folded),
    ) {
        let mut group = [Pending::NONE; GROUP_LINES];
        let mut pending = 0;
        let mut rest = datagram;
        while !rest.is_empty() {
            if let Some((line, used)) = parse_simple_prefix(rest, options.max_line_bytes) {
                rest = &rest[used..];
                let hash = KeyParts::of_simple(&line).hash(self.slots.seed);
                self.slots.index.prefetch(hash);
                group[pending] = Pending { line, hash, candidate: None };
                pending += 1;
                if pending == GROUP_LINES {
                    self.fold_group(&mut group, stamp_ns, &mut each);
                    pending = 0;
                }
                continue;
            }
            // Lines fold in the order they came (a gauge's last value is the last line).
            self.fold_group(&mut group[..pending], stamp_ns, &mut each);
            pending = 0;
            let (line, after) = split_line(rest);
            rest = after;
            if !line.is_empty() {
                each(self.fold_full(line, options, stamp_ns));
            }
        }
        self.fold_group(&mut group[..pending], stamp_ns, &mut each);
    }

    /// Folds a group of simple lines whose index entries [`Table::fold_datagram`] has
    /// prefetched: reads each entry and prefetches the slot it names, then folds each line
    /// into its slot. The misses of the whole group are in flight at once.
    ///
    /// A candidate is only a guess (a tag may match another series, and an earlier line of
    /// the group may have added the series since): a line whose candidate is not its
    /// series takes the whole lookup.
    #[inline(always)]
    fn fold_group(&mut self, group: &mut [Pending<'_>], stamp_ns: i64, each: &mut impl FnMut(Folded)) {
        for pending in group.iter_mut() {
            pending.candidate = self.slots.guess(pending.hash);
        }
        for pending in group.iter() {
            let parts = KeyParts::of_simple(&pending.line);
            each(Folded::metric(self.observe_simple_hashed(
                &pending.line,
                pending.candidate,
                &parts,
                pending.hash,
                stamp_ns,
            )));
        }
    }

    /// [`Table::fold_datagram`] for a receiver that adds origin tags. A line that names its
    /// own origin (a container id or external data) gets the tags [`Origin::tags_for`]
    /// gives it and loses its raw `container_id` tag (the origin's tags carry it when their
    /// cardinality asks for it); every other line gets the sender's
    /// ([`Origin::sender_tags`]), merged into its canonical tags on the one-pass path.
    pub fn fold_datagram_from(
        &mut self,
        datagram: &[u8],
        options: ParseOptions,
        stamp_ns: i64,
        origin: &mut impl Origin,
        mut each: impl FnMut(Folded),
    ) {
        let sender = origin.sender_tags();
        let every_line = sender.is_some();
        let mut rest = datagram;
        while !rest.is_empty() {
            // A line the one-pass parser takes has no container id and no external data,
            // and its tags are canonical: the sender's merge into them in one pass.
            if let Some((simple, used)) = parse_simple_prefix(rest, options.max_line_bytes) {
                rest = &rest[used..];
                let observed = match &sender {
                    None => self.observe_simple(&simple, stamp_ns),
                    Some(tags) => self.observe_simple_tagged(&simple, tags, stamp_ns),
                };
                each(Folded::metric(observed));
                continue;
            }
            let (line, after) = split_line(rest);
            rest = after;
            if line.is_empty() {
                continue;
            }
            each(match parse_line_with(line, options) {
                Parsed::Metric(line)
                    if every_line || !line.container_id.is_empty() || !line.external_data.is_empty() =>
                {
                    let tags = origin.tags_for(&line);
                    let tagged = Line { container_id: b"", origin_tags: tags.as_deref().unwrap_or_default(), ..line };
                    self.fold_metric(&tagged, stamp_ns)
                }
                parsed => self.fold_parsed(parsed, stamp_ns),
            });
        }
    }

    /// [`Table::observe_simple`] of `line` with `origin_tags` (canonical) merged into its
    /// tags: the same series as the full parse of the line with those origin tags. Past
    /// [`MAX_TAGS`](crate::parse::MAX_TAGS) the line goes on without them, as on the full path.
    fn observe_simple_tagged(
        &mut self,
        line: &SimpleLine<'_>,
        origin_tags: &[u8],
        stamp_ns: i64,
    ) -> Result<bool, TableFull> {
        let mut merged = std::mem::take(&mut self.merged_tags);
        merged.clear();
        let count = crate::series::merge_canonical_tags(line.tags, origin_tags, &mut merged);
        let observed = if count > crate::parse::MAX_TAGS {
            self.origin_tags_left_off += 1;
            self.observe_simple(line, stamp_ns)
        } else {
            self.observe_simple(&SimpleLine { tags: &merged, ..*line }, stamp_ns)
        };
        self.merged_tags = merged;
        observed
    }

    /// Parses one line (without its newline) with the full parser and folds
    /// it into its series: the path of every line [`parse_simple_prefix`]
    /// did not take.
    fn fold_full(&mut self, line: &[u8], options: ParseOptions, stamp_ns: i64) -> Folded {
        self.fold_parsed(parse_line_with(line, options), stamp_ns)
    }

    /// What folding one parsed line does.
    fn fold_parsed(&mut self, parsed: Parsed<'_>, stamp_ns: i64) -> Folded {
        match parsed {
            Parsed::Metric(line) => self.fold_metric(&line, stamp_ns),
            Parsed::Event(_) | Parsed::ServiceCheck(_) => Folded::Event,
            Parsed::Rejected { reason, .. } => Folded::Rejected(reason),
        }
    }

    /// Folds a metric line into its series.
    fn fold_metric(&mut self, line: &Line<'_>, stamp_ns: i64) -> Folded {
        match self.observe(line, stamp_ns) {
            Ok(_) if line.name_tag_errors > 0 => Folded::MetricWithNameTagErrors(line.name_tag_errors),
            observed => Folded::metric(observed),
        }
    }

    /// Folds a line [`parse_simple_prefix`] recognised; the same as [`Table::observe`]
    /// of the full parse of that line, without building its key.
    ///
    /// Returns whether the series is new to the table.
    #[inline(always)]
    pub fn observe_simple(&mut self, line: &SimpleLine<'_>, stamp_ns: i64) -> Result<bool, TableFull> {
        let parts = KeyParts::of_simple(line);
        self.observe_simple_hashed(line, None, &parts, parts.hash(self.slots.seed), stamp_ns)
    }

    /// [`Table::observe_simple`] of a line whose key is `parts`, of hash `hash`, trying the
    /// slot at `candidate` first.
    #[inline(always)]
    fn observe_simple_hashed(
        &mut self,
        line: &SimpleLine<'_>,
        candidate: Option<u32>,
        parts: &KeyParts<'_>,
        hash: u64,
        stamp_ns: i64,
    ) -> Result<bool, TableFull> {
        let value = self.options.timer_unit.convert(line.kind, line.value);
        if let Some(slot) = self.slots.find_from_mut(candidate, hash, parts) {
            slot.aggregate.observe_value(value, stamp_ns);
            slot.touched = true;
            return Ok(false);
        }
        let slot = Self::insert_into(
            &mut self.slots,
            &self.options,
            (self.observers.as_deref(), self.budget.as_deref()),
            hash,
            parts,
            line.kind,
        )?;
        slot.aggregate.observe_value(value, stamp_ns);
        Ok(true)
    }

    /// Series held (touched or idle).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table holds no series.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Folds a parsed line into its series' aggregate; `stamp_ns` is when
    /// it was received (unix nanoseconds), which orders gauge lines.
    ///
    /// Returns whether the series is new to the table.
    #[inline]
    pub fn observe(&mut self, line: &Line<'_>, stamp_ns: i64) -> Result<bool, TableFull> {
        let kind_byte = kind_byte(line.kind);
        // Without tags, or with tags already in canonical order, the key's
        // pieces lie in the line: no key to build. Tags written in the name
        // or a container id always take the build.
        let pieces_lie_in_line = !line.has_tags_beyond_tag_field()
            && (line.tags.is_empty() || canonical_tags_len(line.tags) == Some(line.tags.len()));
        let parts = if pieces_lie_in_line {
            KeyParts { kind_byte, name: line.name, tags: line.tags }
        } else {
            // The parser accepted the line, so its own tags fit; origin tags may not, and
            // then the line goes on without them.
            if self.key.build(line).is_err() {
                if line.origin_tags.is_empty() {
                    return Ok(false);
                }
                self.origin_tags_left_off += 1;
                return self.observe(&Line { origin_tags: b"", ..line.clone() }, stamp_ns);
            }
            let id = self.key.id();
            match split_id(id) {
                (name, tags) if !tags.is_empty() => KeyParts { kind_byte, name, tags },
                _ => KeyParts { kind_byte, name: id, tags: b"" },
            }
        };
        let reading = Reading { gauge_deltas: self.options.gauge_deltas, timer_unit: self.options.timer_unit };
        let hash = parts.hash(self.slots.seed);
        if let Some(slot) = self.slots.find_mut(hash, &parts) {
            slot.aggregate.observe(line, stamp_ns, reading);
            slot.touched = true;
            return Ok(false);
        }
        let slot = Self::insert_into(
            &mut self.slots,
            &self.options,
            (self.observers.as_deref(), self.budget.as_deref()),
            hash,
            &parts,
            line.kind,
        )?;
        slot.aggregate.observe(line, stamp_ns, reading);
        Ok(true)
    }

    /// Merges an aggregate for series `id` of `kind` into the table.
    /// Gauge merges whose order was ambiguous are counted
    /// ([`Table::take_ambiguous_merges`]).
    ///
    /// Returns whether the series is new to the table.
    pub fn merge(&mut self, kind: MetricKind, id: &[u8], aggregate: &Aggregate) -> Result<bool, MergeError> {
        let parts = KeyParts::of_id(kind, id);
        self.merge_hashed(None, &parts, parts.hash(self.slots.seed), kind, aggregate)
    }

    /// [`Table::merge`] of every series of `series`, looked up in groups as
    /// [`Table::fold_datagram`] looks lines up (their misses overlap): what merging a
    /// whole cut of a million series costs. `failed` hears of every merge that failed;
    /// the others go on.
    pub fn merge_all<'a>(
        &mut self,
        series: impl IntoIterator<Item = (MetricKind, &'a [u8], &'a Aggregate)>,
        mut failed: impl FnMut(MergeError),
    ) {
        let mut group: [Option<PendingMerge<'a>>; GROUP_LINES] = [const { None }; GROUP_LINES];
        let mut series = series.into_iter().peekable();
        while series.peek().is_some() {
            for (pending, (kind, id, aggregate)) in group.iter_mut().zip(series.by_ref()) {
                let parts = KeyParts::of_id(kind, id);
                let hash = parts.hash(self.slots.seed);
                self.slots.index.prefetch(hash);
                *pending = Some(PendingMerge { kind, parts, hash, aggregate, candidate: None });
            }
            for pending in group.iter_mut().flatten() {
                pending.candidate = self.slots.guess(pending.hash);
            }
            // Taken out, so that a short last group leaves no earlier series behind.
            for PendingMerge { kind, parts, hash, aggregate, candidate } in group.iter_mut().map_while(Option::take) {
                if let Err(error) = self.merge_hashed(candidate, &parts, hash, kind, aggregate) {
                    failed(error);
                }
            }
        }
    }

    /// [`Table::merge`] of the series of `parts`, of hash `hash`, trying the slot at
    /// `candidate` first.
    #[inline(always)]
    fn merge_hashed(
        &mut self,
        candidate: Option<u32>,
        parts: &KeyParts<'_>,
        hash: u64,
        kind: MetricKind,
        aggregate: &Aggregate,
    ) -> Result<bool, MergeError> {
        if let Some(slot) = self.slots.find_from_mut(candidate, hash, parts) {
            let order = slot.aggregate.merge(aggregate)?;
            slot.touched = true;
            self.count_merge(order);
            return Ok(false);
        }
        let slot = Self::insert_into(&mut self.slots, &self.options, (None, None), hash, parts, kind)?;
        let order = slot.aggregate.merge(aggregate)?;
        self.count_merge(order);
        Ok(true)
    }

    fn count_merge(&mut self, order: MergeOrder) {
        match order {
            MergeOrder::Exact => {}
            MergeOrder::Ambiguous => self.ambiguous_merges += 1,
            MergeOrder::BucketsDropped => self.buckets_dropped += 1,
        }
    }

    /// Lines since the last call that went on without their origin tags, which would have
    /// passed the tag limit ([`Table::fold_datagram_from`]), resetting the count.
    pub fn take_origin_tags_left_off(&mut self) -> u64 {
        std::mem::take(&mut self.origin_tags_left_off)
    }

    /// Merges since the last call that dropped a distribution's fixed buckets (its
    /// partials disagreed on them), resetting the count.
    pub fn take_buckets_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.buckets_dropped)
    }

    /// Gauge merges since the last call whose order was ambiguous (see
    /// [`Gauge::merge`](crate::aggregate::Gauge::merge)), resetting the count.
    pub fn take_ambiguous_merges(&mut self) -> u64 {
        std::mem::take(&mut self.ambiguous_merges)
    }

    /// Inserts a new slot (the caller has looked the key up and not found it).
    fn insert_into<'t>(
        slots: &'t mut Slots,
        options: &TableOptions,
        (observers, budget): NewSeries<'_>,
        hash: u64,
        parts: &KeyParts<'_>,
        kind: MetricKind,
    ) -> Result<&'t mut Slot, TableFull> {
        if let Some(max_series) = options.max_series
            && slots.len() >= max_series
        {
            return Err(TableFull::Series { max_series });
        }
        if let Some(budget) = budget
            && (budget.shedding() || slots.growth_bytes().is_some_and(|bytes| budget.would_exceed(bytes)))
        {
            return Err(TableFull::Memory);
        }
        let observer = match kind {
            MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution => {
                observers.and_then(|source| source.observer(kind, parts.name))
            }
            MetricKind::Counter | MetricKind::Gauge | MetricKind::Set => None,
        };
        let aggregate = match observer {
            Some(observer) => Aggregate::Distribution(Box::new(Distribution::for_observer(observer))),
            None => Aggregate::new(kind),
        };
        Ok(slots.push(hash, Slot { key: KeyBytes::new(parts), aggregate, idle_cuts: 0, touched: true }))
    }

    /// Hands every aggregate touched since the last cut to `each` (kind,
    /// canonical id, aggregate), resets it, and drops slots idle for longer
    /// than the table's expiry.
    pub fn cut(&mut self, mut each: impl FnMut(MetricKind, &[u8], &Aggregate)) -> CutStats {
        let mut stats = CutStats::default();
        let expire_after = self.options.expire_after_idle_cuts;
        let mut at = 0;
        while let Some(slot) = self.slots.get_mut(at) {
            if slot.touched {
                let key = slot.key.as_slice();
                let kind = kind_from_byte(key[0]).expect("table keys start with a kind byte");
                each(kind, &key[1..], &slot.aggregate);
                slot.aggregate.reset();
                slot.touched = false;
                slot.idle_cuts = 0;
                stats.emitted += 1;
                at += 1;
                continue;
            }
            slot.idle_cuts = slot.idle_cuts.saturating_add(1);
            if expire_after.is_none_or(|limit| slot.idle_cuts <= limit) {
                at += 1;
            } else {
                // The last slot moves here, not yet seen by this cut: look at `at` again.
                self.slots.swap_remove(at);
                stats.expired += 1;
            }
        }
        stats.remaining = self.slots.len();
        self.shrink_after_churn();
        stats
    }

    /// Gives back the memory of series that left: when a quarter or less of the table's
    /// room is used (after a burst of series that expired), it is rebuilt for twice what
    /// is left. Tables never shrank before, so a burst of new series kept its peak for the
    /// process' life. The rebuild moves every slot once, a cost paid once per burst.
    fn shrink_after_churn(&mut self) {
        let (len, capacity) = (self.slots.len(), self.slots.capacity());
        if capacity > MIN_SHRINK_CAPACITY && len <= capacity / 4 {
            self.slots.shrink_to(len * 2);
        }
    }

    /// Series the table has room for without growing.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Bytes held by the table's slots, index and keys, estimated (for memory gauges).
    pub fn estimated_bytes(&self) -> usize {
        self.slots.bytes()
            + self.slots.slots.iter().map(|slot| slot.key.heap_len() + slot.aggregate.heap_bytes()).sum::<usize>()
    }
}

/// The slots back to back, and a hash index of their positions ([`Table`]'s layout).
struct Slots {
    index: Positions,
    slots: Vec<Slot>,
    /// The key of the table's hashes.
    seed: u64,
}

impl Slots {
    fn new(seed: u64) -> Slots {
        Slots { index: Positions::default(), slots: Vec::new(), seed }
    }

    /// The hash `slot` is indexed under, from its key.
    #[inline]
    fn hash_of(seed: u64, slot: &Slot) -> u64 {
        KeyParts::of_key(slot.key.as_slice()).hash(seed)
    }

    #[inline(always)]
    fn find_mut(&mut self, hash: u64, parts: &KeyParts<'_>) -> Option<&mut Slot> {
        let slots = &self.slots;
        let at = self.index.find(hash, |at| slots[at as usize].key.matches(parts))?;
        Some(&mut self.slots[at as usize])
    }

    /// The first step of a lookup in a group, once the index entry of `hash` has been
    /// prefetched: the position the index probably holds the series at (its tag matches),
    /// whose slot (one cache line) starts loading.
    #[inline(always)]
    fn guess(&self, hash: u64) -> Option<u32> {
        let at = self.index.find(hash, |_| true)?;
        if let Some(slot) = self.slots.get(at as usize) {
            prefetch(slot);
        }
        Some(at)
    }

    /// [`Slots::find_mut`], trying the slot at `candidate` (a [`Slots::guess`]) first. A
    /// guess is checked: its tag may be another series', and the series may have been
    /// added since it was taken.
    #[inline(always)]
    fn find_from_mut(&mut self, candidate: Option<u32>, hash: u64, parts: &KeyParts<'_>) -> Option<&mut Slot> {
        let guessed = candidate.filter(|&at| self.slots.get(at as usize).is_some_and(|slot| slot.key.matches(parts)));
        match guessed {
            Some(at) => Some(&mut self.slots[at as usize]),
            None => self.find_mut(hash, parts),
        }
    }

    /// Adds a slot, of hash `hash`, whose key the table does not hold.
    fn push(&mut self, hash: u64, slot: Slot) -> &mut Slot {
        debug_assert_eq!(hash, Self::hash_of(self.seed, &slot), "a key hashes as the pieces it was made from");
        let at = self.slots.len();
        self.slots.push(slot);
        let (slots, seed) = (&self.slots, self.seed);
        self.index.insert(hash, at as u32, |at| Self::hash_of(seed, &slots[at as usize]));
        &mut self.slots[at]
    }

    fn get_mut(&mut self, at: usize) -> Option<&mut Slot> {
        self.slots.get_mut(at)
    }

    /// Removes the slot at `at`; the last slot takes its place.
    fn swap_remove(&mut self, at: usize) {
        let last = self.slots.len() - 1;
        let (slots, seed) = (&self.slots, self.seed);
        self.index
            .remove(Self::hash_of(seed, &slots[at]), at as u32, |held| Self::hash_of(seed, &slots[held as usize]));
        self.slots.swap_remove(at);
        if at != last {
            self.index.rename(Self::hash_of(seed, &self.slots[at]), last as u32, at as u32);
        }
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Series held without growing the index or the slots.
    fn capacity(&self) -> usize {
        self.index.capacity().min(self.slots.capacity())
    }

    /// Bytes the next series would allocate, if any: a doubled index or slot vector when either is
    /// full (the old index lives until the new one is filled; the vector mostly moves in
    /// place, but is counted whole).
    fn growth_bytes(&self) -> Option<u64> {
        let mut bytes = self.index.growth_bytes().unwrap_or(0);
        if self.slots.len() == self.slots.capacity() {
            bytes += (self.slots.capacity().max(4) as u64) * 2 * std::mem::size_of::<Slot>() as u64;
        }
        (bytes > 0).then_some(bytes)
    }

    fn shrink_to(&mut self, room: usize) {
        let (slots, seed) = (&self.slots, self.seed);
        self.index.shrink_to(room, |at| Self::hash_of(seed, &slots[at as usize]));
        self.slots.shrink_to(room);
    }

    /// Bytes of the index and the slots (not what slots point to).
    fn bytes(&self) -> usize {
        self.index.bytes() + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// A table with room for fewer slots than this never shrinks: rebuilding it would give back
/// little.
const MIN_SHRINK_CAPACITY: usize = 4096;

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
    fn a_budget_refuses_new_series_while_it_sheds_and_a_growth_that_would_pass_it() {
        let budget = Arc::new(MemoryBudget::new(10 << 20));
        let mut table = Table::new(TableOptions::default()).with_budget(budget.clone());
        assert!(observe(&mut table, b"known:1|c").unwrap());
        budget.update(1 << 20, true);
        assert_eq!(observe(&mut table, b"new:1|c"), Err(TableFull::Memory));
        assert_eq!(observe(&mut table, b"known:1|c"), Ok(false), "a known series goes on");
        budget.update(1 << 20, false);
        // Fill the table to its room: the next series doubles it, which 9 MiB of 10 do not allow.
        let mut n = 0;
        while table.len() < table.capacity() {
            observe(&mut table, format!("fill.{n}:1|c").as_bytes()).unwrap();
            n += 1;
        }
        budget.update(9 << 20, false);
        assert_eq!(observe(&mut table, b"one.more:1|c"), Err(TableFull::Memory));
        assert_eq!(observe(&mut table, b"fill.0:1|c"), Ok(false));
        budget.update(1 << 20, false);
        assert_eq!(observe(&mut table, b"one.more:1|c"), Ok(true), "room again: it grows");
    }

    #[test]
    fn a_burst_of_series_that_expired_gives_its_room_back() {
        let mut table = Table::new(TableOptions { expire_after_idle_cuts: Some(1), ..TableOptions::default() });
        for n in 0..100 {
            observe(&mut table, format!("steady.{n}:1|c").as_bytes()).unwrap();
        }
        table.cut(|_, _, _| {});
        let steady = table.capacity();
        // 100 000 new series in one window, then never again.
        for n in 0..100_000 {
            observe(&mut table, format!("burst.{n}:1|c").as_bytes()).unwrap();
        }
        for n in 0..100 {
            observe(&mut table, format!("steady.{n}:1|c").as_bytes()).unwrap();
        }
        table.cut(|_, _, _| {});
        let peak = table.capacity();
        assert!(peak >= 100_100, "{peak}");
        for _ in 0..3 {
            for n in 0..100 {
                observe(&mut table, format!("steady.{n}:1|c").as_bytes()).unwrap();
            }
            let emitted = table.cut(|_, _, _| {}).emitted;
            assert_eq!(emitted, 100, "the steady series go on");
        }
        assert_eq!(table.len(), 100);
        assert!(table.capacity() < peak / 100, "room for {} after the burst (steady: {steady})", table.capacity());
        assert!(observe(&mut table, b"steady.7:1|c").is_ok_and(|new| !new), "the steady series are still there");
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        // The layout's arithmetic (the type's docs) and the budget's growth estimate rest on it.
        assert_eq!((std::mem::size_of::<Slot>(), std::mem::align_of::<Slot>()), (64, 64));
    }

    proptest::proptest! {
        /// Expiry moves the last slot into the place of each one it drops: every series left
        /// must still be found, with its own total, across cuts that expire some and keep some.
        #[test]
        fn series_left_after_expiry_keep_their_own_totals(
            rounds in proptest::collection::vec(proptest::collection::vec(0u16..300, 0..200), 1..12),
        ) {
            let mut table = Table::new(TableOptions { expire_after_idle_cuts: Some(1), ..TableOptions::default() });
            // The model: each series' total in the window, and the cuts it has been idle for.
            let mut model: std::collections::HashMap<u16, (f64, u32)> = Default::default();
            for round in rounds {
                for &n in &round {
                    let new = observe(&mut table, format!("s{n}:1|c").as_bytes()).unwrap();
                    proptest::prop_assert_eq!(new, !model.contains_key(&n));
                    let entry = model.entry(n).or_insert((0.0, 0));
                    entry.0 += 1.0;
                }
                let mut got: Vec<(String, f64)> = cut(&mut table)
                    .into_iter()
                    .map(|(_, id, aggregate)| (String::from_utf8(id).unwrap(), aggregate.counter().unwrap()))
                    .collect();
                got.sort_by(|a, b| a.0.cmp(&b.0));
                let mut want: Vec<(String, f64)> =
                    model.iter().filter(|(_, (total, _))| *total > 0.0).map(|(n, (total, _))| (format!("s{n}"), *total)).collect();
                want.sort_by(|a, b| a.0.cmp(&b.0));
                proptest::prop_assert_eq!(got, want);
                model.retain(|_, (total, idle)| {
                    *idle = if *total > 0.0 { 0 } else { *idle + 1 };
                    *total = 0.0;
                    *idle <= 1
                });
                proptest::prop_assert_eq!(table.len(), model.len());
            }
        }
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
        assert_eq!(observe(&mut table, b"c:1|c"), Err(TableFull::Series { max_series: 2 }));
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

    /// Folds `datagram` with the table's fast paths and, line by line, with
    /// the full parser only; both tables must cut to the same series.
    fn assert_fast_path_agrees(datagram: &[u8]) {
        let mut fast = Table::new(TableOptions::default());
        let mut full = Table::new(TableOptions::default());
        fast.fold_datagram(datagram, ParseOptions::default(), 5, |_| {});
        crate::parse::parse_datagram(datagram, |parsed| {
            if let Parsed::Metric(line) = parsed {
                full.observe(&line, 5).unwrap();
            }
        });
        let sorted = |table: &mut Table| {
            let mut out = cut(table);
            out.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
            out
        };
        assert_eq!(sorted(&mut fast), sorted(&mut full), "{:?}", String::from_utf8_lossy(datagram));
    }

    #[test]
    fn the_fast_path_folds_into_the_same_series_as_the_full_parser() {
        assert_fast_path_agrees(
            b"a:1|c\na:2|c|#x:1,y:2\na:3|c|#y:2,x:1\na:4|c|@0.5|#x:1,y:2\na:5|ms|#x:1\nb:1|g\nb:+1|g\na:1|c|# x:1 ,y:2",
        );
        // Merged wire ids land in the slots that lines made.
        let mut table = Table::new(TableOptions::default());
        table.fold_datagram(b"a:1|c|#x:1,y:2\nb:1|c", ParseOptions::default(), 0, |_| {});
        assert!(!table.merge(MetricKind::Counter, b"a|#x:1,y:2", &Aggregate::Counter(1.0)).unwrap());
        assert!(!table.merge(MetricKind::Counter, b"b", &Aggregate::Counter(1.0)).unwrap());
        assert!(
            table.merge(MetricKind::Counter, b"b|#", &Aggregate::Counter(1.0)).unwrap(),
            "a name ending in |# is its own id"
        );
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn lines_looked_up_in_groups_fold_as_one_by_one_across_growth_and_repeats() {
        // Groups of lines whose series are new, known, repeated within the group, or
        // added by an earlier line of it, while the index and the slots grow under them;
        // gauges end on their last line; full-parser lines split the groups.
        let mut datagram = Vec::new();
        for i in 0..3_000u32 {
            let series = i.wrapping_mul(2_654_435_761) % 700;
            match i % 7 {
                0 if i % 2 == 0 => datagram.extend_from_slice(format!("g.{}:{i}|g\n", series % 5).as_bytes()),
                0 => datagram.extend_from_slice(format!("g.{}:{i}|g|@1\n", series % 5).as_bytes()),
                1 if i % 5 == 0 => datagram.extend_from_slice(format!("c.{series}:1|c|@0.5\n").as_bytes()),
                _ => datagram.extend_from_slice(format!("c.{series}:{}|c\n", i % 3).as_bytes()),
            }
        }
        assert_fast_path_agrees(&datagram);
        // A gauge's last line goes the full parser's way, behind a simple one still grouped.
        assert_fast_path_agrees(b"g:1|g\ng:2|g|@1\n");
    }

    #[test]
    fn a_wrong_guess_is_checked_and_the_whole_lookup_taken() {
        // A guess is a position whose tag matched: it may hold another series (or none).
        let mut table = Table::new(TableOptions::default());
        for id in [&b"a"[..], b"b"] {
            table.merge(MetricKind::Counter, id, &Aggregate::Counter(1.0)).unwrap();
        }
        let b_at = table.slots.index.find(KeyParts::of_id(MetricKind::Counter, b"b").hash(table.slots.seed), |_| true);
        let a = KeyParts::of_id(MetricKind::Counter, b"a");
        let a_hash = a.hash(table.slots.seed);
        for wrong in [b_at, Some(7)] {
            let merged = table.merge_hashed(wrong, &a, a_hash, MetricKind::Counter, &Aggregate::Counter(10.0));
            assert!(!merged.unwrap(), "a is no new series");
            let line = SimpleLine { name: b"a", kind: MetricKind::Counter, value: 100.0, tags: b"" };
            assert_eq!(table.observe_simple_hashed(&line, wrong, &a, a_hash, 0), Ok(false));
        }
        assert_eq!(
            cut(&mut table),
            vec![
                (MetricKind::Counter, b"a".to_vec(), Aggregate::Counter(221.0)),
                (MetricKind::Counter, b"b".to_vec(), Aggregate::Counter(1.0)),
            ]
        );
    }

    #[test]
    fn merging_in_groups_is_merging_one_by_one() {
        // Known, new and repeated series (a repeat added by an earlier one of its group),
        // gauges whose last merge wins, and a kind that does not fit (refused, the rest go on).
        let ids: Vec<(MetricKind, Vec<u8>, Aggregate)> = (0..500u32)
            .map(|i| {
                let series = i.wrapping_mul(2_654_435_761) % 150;
                match i % 4 {
                    0 => (MetricKind::Gauge, format!("g.{}", series % 7).into_bytes(), {
                        let mut gauge = Aggregate::new(MetricKind::Gauge);
                        gauge.observe_value(f64::from(i), 0);
                        gauge
                    }),
                    _ => (
                        MetricKind::Counter,
                        format!("c.{series}|#k:{}", series % 3).into_bytes(),
                        Aggregate::Counter(1.0),
                    ),
                }
            })
            .chain([(MetricKind::Counter, b"g.1".to_vec(), Aggregate::new(MetricKind::Set))])
            .collect();
        let mut one_by_one = Table::new(TableOptions::default());
        let mut grouped = Table::new(TableOptions::default());
        for table in [&mut one_by_one, &mut grouped] {
            table.merge(MetricKind::Counter, b"c.0|#k:0", &Aggregate::Counter(5.0)).unwrap();
        }
        let mut refused_one_by_one = 0;
        for (kind, id, aggregate) in &ids {
            refused_one_by_one += usize::from(one_by_one.merge(*kind, id, aggregate).is_err());
        }
        let mut refused = 0;
        grouped.merge_all(ids.iter().map(|(kind, id, aggregate)| (*kind, &id[..], aggregate)), |_| refused += 1);
        assert_eq!((refused, refused_one_by_one), (1, 1));
        assert_eq!(cut(&mut grouped), cut(&mut one_by_one));
    }

    proptest::proptest! {
        #[test]
        fn the_fast_path_agrees_on_generated_datagrams(
            lines in proptest::collection::vec(
                "[ab]{1,2}:[0-9]{1,3}(\\.[0-9])?\\|(c|g|ms|d)(\\|@0\\.5)?(\\|#[ab]{0,2}(:[ab]{0,2})?(,[ab]{0,2}(:[ab]{0,2})?){0,3})?",
                1..30,
            ),
        ) {
            assert_fast_path_agrees(lines.join("\n").as_bytes());
        }
    }

    #[test]
    fn tags_written_in_names_fold_into_the_series_of_their_tags() {
        let mut table = Table::new(TableOptions::default());
        let mut folded = Vec::new();
        let datagram = b"a:1|c|#env:prod\na,env=prod:1|c\na#env=prod,bad:1|c\na[env=prod]:1|c\na:1|c|c:f00d";
        table.fold_datagram(datagram, ParseOptions::default(), 0, |outcome| folded.push(outcome));
        assert_eq!(folded[2], Folded::MetricWithNameTagErrors(1));
        assert!(folded.iter().enumerate().all(|(at, outcome)| at == 2 || *outcome == Folded::Metric), "{folded:?}");
        let out = cut(&mut table);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], (MetricKind::Counter, b"a|#container_id:f00d".to_vec(), Aggregate::Counter(1.0)));
        assert_eq!(out[1], (MetricKind::Counter, b"a|#env:prod".to_vec(), Aggregate::Counter(4.0)));
        assert_fast_path_agrees(datagram);
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
