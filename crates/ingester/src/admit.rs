//! Admission: each tile batch becomes the storage samples of one queue record, at ingest
//! time, before it is made durable.
//!
//! The writer thread ([`crate::writer`]) hands every decoded batch to its target's [`Converter`], appends the
//! record to the queue, then commits the conversion (or rolls it back when the record
//! could not be queued); what admission decides per tile is below (*Each tile counts once*).
//!
//! [`Converter::convert`] turns one [`TileBatch`] into one [`Record`] of final samples
//! before the record is written to the queue, so a replay resends exactly what was
//! computed the first time. Names and labels follow [`names`]; a target that stores several
//! resolutions gives every sample a `resolution` label from the batch's storage policy
//! (`10s:2d` → `resolution="10s"`, [`Converter::with_resolution_label`]), so that they stay
//! apart in one store; a target of one resolution (the default) writes none, so that a query
//! written for statsd_exporter gives the same answer. Every sample is stamped with the
//! tile's end.
//!
//! | statsd type | samples (OpenMetrics family type) |
//! |---|---|
//! | counter | `<name>_total`, **cumulative** (counter; a name already ending in `_total` keeps it) |
//! | gauge | `<name>`: the tile's value; a tile holding only `+N`/`-N` deltas gives `0 + delta` (gauge) |
//! | set | `<name>`: the estimated number of distinct members in the tile (gauge) |
//! | timer, histogram, distribution | by the target's `histograms` setting ([`HistogramMode`]): `native` (remote write's default), `<name>` as a cumulative native histogram; `summary` (the file sink's only choice), `<name>{quantile="0.5"\|"0.9"\|"0.99"}` per tile with `<name>_sum` and `<name>_count` cumulative; `both`; and always `<name>_min`, `<name>_max` per tile (gauges) |
//!
//! **Cumulative values.** Counters, `_sum` and `_count` are running totals per series
//! (name, tags and resolution), kept in memory and added to in record order. They go on
//! across a restart, a crash included: the writer thread checkpoints them beside the
//! target's queue every `checkpoint_interval_secs` and at shutdown, and a start restores the
//! checkpoint and rolls forward through the records queued after it ([`checkpoint`]). What a
//! restart still loses: the checkpoint itself when its disk is lost (with the queue). A late
//! tile's correction (below) is a queued sample like any other and rolls forward. A series idle
//! for longer than the expiry starts from 0 again, which storage sees as a counter reset
//! (`rate()` and `increase()` handle it). Quantiles are clamped to the tile's `[min, max]`.
//!
//! **Native histograms.** The sketch's buckets are Prometheus' (schema 5 by default), so a
//! histogram is the running sum of the tiles' sketches: per series the converter keeps that
//! cumulative sketch and the running sum, and writes them at each tile (spans, integer
//! counts, zero bucket, count and sum; [`crate::queue::series::HistogramEncoder`]). Cumulative, like
//! the counters, so that `rate()` and `sum()` across series and hosts work as for any
//! Prometheus histogram. A series' first sample (or its first since its total expired)
//! carries the reset hint `YES`; the cumulative histograms are checkpointed with the totals,
//! so the first sample after a restart carries none. When the cumulative histogram has more
//! buckets than the target's `max_buckets`, its schema is lowered one step at a time
//! (neighbouring buckets merge, exactly as Prometheus reduces a schema) until it fits; it
//! never goes back up, so a series' schema only falls. The quantile error bound is then that
//! of the lower schema (see the README).
//!
//! **Each tile counts once.** For every cumulative series the converter remembers the
//! end of the newest tile written, what that tile added, which of the 64 tiles before it
//! were written, and which statsd series the total belongs to. A tile is then:
//!
//! | tile | verdict | running total | counted as |
//! |---|---|---|---|
//! | newer than the newest written | written | adds, new sample | `tiles_written` |
//! | same end, same value as the one written | duplicate (a replica, a resend) | unchanged | `tiles_skipped{reason="duplicate"}` |
//! | same end, another value, the written copy incomplete and this one whole (an aggregator marks a tile `incomplete` when it started after the tile began, a replica restarted mid-tile, or closed it before every collector confirmed its end, a link stalled) | replaced | the whole copy's total, written as a correction one millisecond after the newest sample | `reason="replaced"` |
//! | same end, another value, this copy incomplete | incomplete | unchanged | `reason="incomplete"` |
//! | same end, another value, both whole | conflict: two whole copies disagree, which no fault the design survives explains | unchanged (the first one stays) | `reason="conflict"` |
//! | older, and that tile was written | duplicate | unchanged | `reason="duplicate"` |
//! | older, never written (**late**: its tile was written nowhere; a tile before the first of a total adopted from another writer counts as written, the earlier writer's, unless its batch says the ingester it was routed to refused it for good, `owner_refused`: that one never wrote it) | late | adds; the new total is written at once as a **correction**, one millisecond after the series' newest sample (at its own timestamp, [`StoredSample::timestamp_ms`]: the tile's own end would be out of order), so a series that then goes idle shows it too; more than `resolution − 2` corrections between two tiles leave the rest to the next sample | `reason="late"` |
//! | another statsd series with the same Prometheus name (`a.b` and `a_b` both become `a_b`) | name collision | unchanged: the first series keeps the name | `reason="name_collision"`, logged |
//! | a follower's completion (`completes_version`) of a leader copy routed to the shard's owner before this ingester's tenure (at an earlier version, or a tile before the tenure's cutover), of a tile the series' total does not hold (a gauge or set: no incomplete copy converted here wrote it) | duplicate: the owner before wrote the short copy, and a second writer would begin a total beside it (RELIABILITY.md, fix 24) | unchanged; gauges and sets not written | `reason="duplicate"` and `completions_of_earlier_owner` |
//!
//! Whoever sends a tile, it is never added twice to a total: what the converter remembers is
//! checkpointed with the totals (the roll-forward rebuilds it from the records' tile ends),
//! and only a duplicate of a tile more than 64 tiles back is taken as late. Gauges, sets
//! and the quantiles of a tile that was written are written again when a duplicate arrives
//! (same timestamp: storage keeps one sample when the values agree). A tile's gauges and sets
//! have no running total to correct, and storage keeps the first value written at a
//! timestamp: so when a whole copy of a tile follows an incomplete one, its gauges and sets
//! are written one millisecond after the tile's end (unless a newer tile was converted
//! already: that sample would be out of order), and an incomplete copy of a tile a whole copy
//! was written for writes none (`reason="incomplete"`). The last 64 copies of each kind are
//! remembered, in memory only.
//!
//! The conversion is transactional: [`Converter::commit`] keeps the new totals once the
//! record is durable, [`Converter::rollback`] restores them when it could not be queued.

pub mod checkpoint;
pub mod lines;
pub mod names;

use tessera_runtime::RateLimitedLog;

static COLLISION_LOG: RateLimitedLog = RateLimitedLog::new("ingester.name_collision", 5);

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_core::prehashed::BuildPrehashed;
use tessera_core::series::split_id;
use tessera_proto::TileBatch;

use serde::Deserialize;
use tessera_core::sketch::{MIN_SCHEMA, Sketch};

use crate::queue::record::{Record, SampleKind, StoredSample};
use crate::queue::series::{HistogramEncoder, encode_label};
use crate::sink::metadata::{Families, FamilyMeta, FamilyNotes};
use crate::tier::Ownership;

/// How timers, histograms and distributions are written to a target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistogramMode {
    /// One cumulative native histogram per series (remote write only).
    #[default]
    Native,
    /// Quantile samples per tile with cumulative `_sum` and `_count`.
    Summary,
    /// Both: the summary's series and the native histogram (which shares the name of the
    /// quantile series, so aggregations select it with `{quantile=""}`).
    Both,
}

/// The running native histogram of one series.
#[derive(Default)]
struct Cumulative {
    sketch: Sketch,
    sum: f64,
    /// A sample of it has been written (the next is not a reset).
    written: bool,
    /// When the newest tile came from an incomplete copy: the histogram and sum before
    /// it, so that a complete copy can replace it (a sketch cannot be subtracted). Kept
    /// for such tiles only, and not in checkpoints: after a restart a complete copy of
    /// that tile is counted `incomplete` instead.
    before_last: Option<Box<(Sketch, f64)>>,
}

/// The series named by `TESSERA_TRACE_SERIES` (a substring of the statsd series id), whose
/// every conversion is logged: for following one series through a fault campaign. Read once.
fn traced_series() -> Option<&'static [u8]> {
    static TRACED: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    TRACED
        .get_or_init(|| {
            std::env::var("TESSERA_TRACE_SERIES").ok().filter(|needle| !needle.is_empty()).map(String::into_bytes)
        })
        .as_deref()
}

/// The tenure of a shard gained by a tile ahead of the view: the view catching up begins
/// no second tenure.
const GAINED_AHEAD: u32 = u32::MAX;

/// Where a sample's bytes are in the arena, and what it is.
#[derive(Debug, Clone, Copy)]
struct Span {
    labels: (usize, usize),
    /// An explicit reset (a 0 just before) precedes the sample: its series was adopted.
    reset_before: bool,
    /// The encoded histogram, or an empty range.
    histogram: (usize, usize),
    value: f64,
    kind: SampleKind,
    /// The sample's own timestamp (a late tile's correction), or 0 for the tile's end.
    timestamp_ms: i64,
}

/// Spare cumulative histograms kept for reuse (each holds its bucket memory).
const SPARE_HISTOGRAMS: usize = 256;

/// Why a whole batch was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    /// Neither a storage policy nor a resolution.
    #[error("batch from `{source_name}` has no storage policy and no resolution")]
    NoResolution {
        /// The batch's source.
        source_name: String,
    },
    /// The tile end is not a positive unix time.
    #[error("batch from `{source_name}` has an invalid tile end {tile_end_ms}")]
    TileEnd {
        /// The batch's source.
        source_name: String,
        /// The tile end given.
        tile_end_ms: i64,
    },
}

/// Why a single tile was skipped (the rest of the batch is kept): the `reason` of
/// `tiles_skipped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The metric type is unknown.
    UnknownType,
    /// The aggregate is missing or invalid (non-finite values, bad sketch or set).
    InvalidAggregate,
    /// The aggregate does not match the metric type.
    TypeMismatch,
    /// Older than the series' last sample and never written: added to the running total,
    /// written as a correction after the newest sample.
    Late,
    /// Written already (same tile end, same value): not added again.
    Duplicate,
    /// Same tile end as a written tile, another value: not added.
    Conflict,
    /// Another statsd series already owns the Prometheus series: not added.
    NameCollision,
    /// A copy marked incomplete (its aggregator started after the tile began) of a tile
    /// written already: not added.
    Incomplete,
    /// A complete copy of a tile written from an incomplete one: it replaces it, and the
    /// corrected total is written as a correction.
    Replaced,
}

impl SkipReason {
    /// Every reason, in label order.
    pub const ALL: [SkipReason; 9] = [
        SkipReason::UnknownType,
        SkipReason::InvalidAggregate,
        SkipReason::TypeMismatch,
        SkipReason::Late,
        SkipReason::Duplicate,
        SkipReason::Conflict,
        SkipReason::NameCollision,
        SkipReason::Incomplete,
        SkipReason::Replaced,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::UnknownType => "unknown_type",
            SkipReason::InvalidAggregate => "invalid_aggregate",
            SkipReason::TypeMismatch => "type_mismatch",
            SkipReason::Late => "late",
            SkipReason::Duplicate => "duplicate",
            SkipReason::Conflict => "conflict",
            SkipReason::NameCollision => "name_collision",
            SkipReason::Incomplete => "incomplete",
            SkipReason::Replaced => "replaced",
        }
    }
}

/// Tiles of one batch skipped, per reason (`skipped[SkipReason::Late]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkippedTiles([u64; SkipReason::ALL.len()]);

impl SkippedTiles {
    /// Counts one tile skipped for `reason`.
    pub fn add(&mut self, reason: SkipReason) {
        self.0[reason as usize] += 1;
    }

    /// Every reason with its count, for metrics.
    pub fn by_reason(&self) -> impl Iterator<Item = (SkipReason, u64)> {
        SkipReason::ALL.into_iter().zip(self.0)
    }

    fn count(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Write(_) => {}
            Verdict::Late => self.add(SkipReason::Late),
            Verdict::Duplicate => self.add(SkipReason::Duplicate),
            Verdict::Conflict => self.add(SkipReason::Conflict),
            Verdict::Collision => self.add(SkipReason::NameCollision),
            Verdict::Incomplete => self.add(SkipReason::Incomplete),
            Verdict::Replace(_) => self.add(SkipReason::Replaced),
        }
    }
}

impl std::ops::Index<SkipReason> for SkippedTiles {
    type Output = u64;

    fn index(&self, reason: SkipReason) -> &u64 {
        &self.0[reason as usize]
    }
}

/// What became of one tile of a cumulative series; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// Newer than what was written: the new running total, to write.
    Write(f64),
    /// Older and never written: added to the total (with a correction sample, if room).
    Late,
    /// Written already.
    Duplicate,
    /// Same tile end as a written tile, another value.
    Conflict,
    /// Another statsd series owns the name.
    Collision,
    /// An incomplete copy of a written tile.
    Incomplete,
    /// A complete copy of a tile written from an incomplete one: the corrected total.
    Replace(f64),
}

/// Where a tile sits: its end, its resolution, and which statsd series it is.
#[derive(Debug, Clone, Copy)]
struct TileRef {
    end_ms: i64,
    resolution_ms: i64,
    origin: u64,
    /// The ownership epoch of the series' shard (0 without an ingesters' placement).
    epoch: u32,
    /// The series' shard plus one (0 without an ingesters' placement).
    shard: u32,
    /// The copy came from an aggregator that started after the tile began.
    incomplete: bool,
    /// The ingester the batch was routed to first refused it for good: it never wrote it.
    owner_refused: bool,
    /// A follower's completion of a tile whose leader copy was routed under a placement
    /// version before this ingester's tenure of the series' shard: that copy went to the
    /// owner before, who wrote it.
    before_tenure: bool,
}

/// The result of converting one batch.
#[derive(Debug)]
pub struct Conversion {
    /// The record to queue.
    pub record: Record,
    /// Tiles that gave no samples, by reason.
    pub skipped: SkippedTiles,
}

/// The running total of one cumulative series. Its fields are written to checkpoints by
/// [`checkpoint`]'s `total_fields`: a field added here is one line there.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Total {
    value: f64,
    /// Tile end of the last sample written for the series.
    last_tile_end_ms: i64,
    /// What that tile added (a duplicate adds the same).
    last_delta: f64,
    /// Bit `k`: the tile ending `k` resolutions before `last_tile_end_ms` was written (or
    /// is before the first tile of a total adopted from another writer).
    written: u64,
    /// Hash of the statsd series (kind and id) the total belongs to; [`UNKNOWN_ORIGIN`]
    /// when rolled forward from the queue at start, until a tile adopts it.
    origin: u64,
    /// The ownership epoch of the series' shard when the total was made: a total of an
    /// older epoch is stale (the shard went to another ingester and came back). Local to
    /// the process, so not in checkpoints: what a restart restores is epoch 0, and a
    /// checkpoint holds only current totals ([`Converter::total_is_current`]).
    epoch: u32,
    /// The series' shard in the ingesters' placement, plus one; 0 when unknown (no
    /// placement, or rolled forward from a queued sample until a tile reaches it).
    shard: u32,
    /// Timestamp of the newest sample written for the series: `last_tile_end_ms`, or a
    /// late tile's correction after it (0 in checkpoints before version 3).
    last_sample_ms: i64,
    /// The newest written tile came from an incomplete copy: a complete one replaces it.
    last_incomplete: bool,
    /// Adopted from another writer (begun with an explicit reset, a new epoch of its shard),
    /// and its first tile is still among the 64 `written` remembers: the tiles before the
    /// highest bit of `written` are the earlier writer's (see [`Total::written_at`]).
    adopted: bool,
}

impl Total {
    /// Where a late tile's correction goes: one millisecond after the series' newest
    /// sample, if that is still before the next tile's reset marker (end − 1); past that
    /// (a burst of late tiles in one tile) the total shows in the next sample.
    fn correction_at(&self, resolution_ms: i64) -> Option<i64> {
        let next = self.last_sample_ms.max(self.last_tile_end_ms) + 1;
        (next < self.last_tile_end_ms + resolution_ms - 1).then_some(next)
    }
}

/// The origin of a total rolled forward from a queued sample, which does not say which
/// statsd series it came from: the first tile to reach the total adopts it.
const UNKNOWN_ORIGIN: u64 = 0;

impl Total {
    fn verdict(&self, delta: f64, tile: TileRef) -> Verdict {
        if self.origin != tile.origin {
            return Verdict::Collision;
        }
        if tile.end_ms > self.last_tile_end_ms {
            return Verdict::Write(self.value + delta);
        }
        if tile.end_ms == self.last_tile_end_ms {
            return match (delta == self.last_delta, self.last_incomplete, tile.incomplete) {
                (true, ..) => Verdict::Duplicate,
                (false, true, false) => Verdict::Replace(self.value - self.last_delta + delta),
                // Two incomplete copies: each replica's copy sums the whole batches it
                // admitted, so for counts that only grow the larger holds more of the tile
                // (found by the fault campaign, seed 34 at 5 minutes: a pause cost one
                // replica a few windows, a stall cost the other more, and the smaller copy was
                // the one kept). It stays replaceable by a whole copy.
                (false, true, true) if delta > self.last_delta && self.last_delta >= 0.0 => {
                    Verdict::Replace(self.value - self.last_delta + delta)
                }
                (false, _, true) => Verdict::Incomplete,
                // Two complete copies that disagree: a fault, kept apart from the rest.
                (false, false, false) => Verdict::Conflict,
            };
        }
        match self.tiles_back(tile) {
            Some(back) if self.written & (1 << back) != 0 => Verdict::Duplicate,
            // Before an adopted total's first tile: the earlier writer's, unless the ingester
            // it was routed to refused it (it never wrote it) and it came here re-routed.
            Some(back) if self.written_at(back) && !tile.owner_refused => Verdict::Duplicate,
            _ => Verdict::Late,
        }
    }

    /// Whether `tile` was written on this total: its newest tile, or one of the 64 before
    /// it marked written (or before the first tile of a total adopted from another writer).
    fn holds(&self, tile: TileRef) -> bool {
        tile.end_ms == self.last_tile_end_ms || self.tiles_back(tile).is_some_and(|back| self.written_at(back))
    }

    /// Whether the tile `back` tiles before the newest written one counts as written: this
    /// total wrote it, or the total was adopted and the tile is before its first (the
    /// earlier writer's).
    fn written_at(&self, back: u32) -> bool {
        let own = self.written & (1 << back) != 0;
        own || (self.adopted && back > self.oldest_written_back())
    }

    /// How many tiles back the oldest tile `written` remembers lies (its highest bit): an
    /// adopted total's first, while [`adopted`](Self::adopted) holds.
    fn oldest_written_back(&self) -> u32 {
        63 - self.written.leading_zeros()
    }

    /// How many tiles before the newest written one `tile` ends, if it is within the 64
    /// remembered.
    fn tiles_back(&self, tile: TileRef) -> Option<u32> {
        let behind = self.last_tile_end_ms.checked_sub(tile.end_ms)?;
        if tile.resolution_ms <= 0 || behind % tile.resolution_ms != 0 {
            return None;
        }
        u32::try_from(behind / tile.resolution_ms).ok().filter(|back| *back < 64)
    }
}

/// Keys are xxh3-128 hashes of the labels already.
type Totals = HashMap<u128, Total, BuildPrehashed>;
type Histograms = HashMap<u128, Cumulative, BuildPrehashed>;

/// Converts tile batches into records; holds the running totals. See the [module docs](self).
pub struct Converter {
    quantiles: Vec<(f64, String)>,
    /// Reused for the label value of a mapping's quantile or a classic bucket's `le`.
    label_scratch: String,
    totals: Totals,
    undo: Vec<(u128, Option<Total>)>,
    expire_after_ms: i64,
    newest_tile_end_ms: i64,
    last_sweep_tile_end_ms: i64,
    tags: names::TagLabels,
    /// The target's `external_labels`, sorted by name.
    external_labels: Vec<(String, String)>,
    name: String,
    /// The statsd name `name` was made from (consecutive tiles often share it).
    raw_name: Vec<u8>,
    arena: Vec<u8>,
    /// Label bytes per tile of the last batch, to size the next arena at once.
    arena_bytes_per_tile: usize,
    spans: Vec<Span>,
    histogram_mode: HistogramMode,
    max_buckets: usize,
    /// Whether samples carry the `resolution` label (a target that stores several).
    resolution_label: bool,
    /// Running native histograms, by the key of their series (whose count is in `totals`).
    histograms: Histograms,
    /// Histograms of the last conversion, kept at [`Converter::commit`].
    pending: Vec<(u128, Cumulative)>,
    spare: Vec<Cumulative>,
    encoder: HistogramEncoder,
    /// Which shards this ingester owns, when it is one of an ingesters' placement.
    ownership: Option<Arc<Ownership>>,
    ownership_seen: u64,
    /// Per shard of the ingesters' placement: owned now, and the ownership epoch
    /// (bumped each time the shard is gained).
    owned: Vec<bool>,
    epochs: Vec<u32>,
    /// Per shard: the tenure of the last view taken in ([`OwnershipView::tenure`](crate::tier::OwnershipView::tenure)), or
    /// [`GAINED_AHEAD`].
    tenures: Vec<u32>,
    /// Per shard: the cutover of its tenure in the last view taken in (0: none), and the
    /// start of the tile that gained it ahead of the view (`i64::MAX`: none).
    cutovers: Vec<i64>,
    gained_ahead_at: Vec<i64>,
    /// Per shard: the cutoff at which this ingester gives it away in the last view taken in
    /// (0: none). Once a tile ending after it was converted, the shard's totals are of a
    /// tenure that ended: its receiver writes it from an explicit reset.
    cutoffs: Vec<i64>,
    /// The placement version of the last view taken in.
    view_version: u64,
    /// Per shard: the placement version its tenure began at ([`OwnershipView::since`](crate::tier::OwnershipView::since);
    /// 0: not known), or that of the view that showed a tenure began that the placement did
    /// not stamp, or the version after the view's for a shard gained ahead of it.
    since: Vec<u64>,
    /// Per shard: the cutover its tenure began at (0: none), kept after a finalize or a
    /// failover sets the view's to 0.
    tenure_from_ms: Vec<i64>,
    /// The placement the restored checkpoint recorded, until the first view is taken in and
    /// compared with it ([`checkpoint`] docs, *Placement*).
    restored_placement: Option<checkpoint::PlacementSeen>,
    /// Per shard: the oldest epoch whose totals are of a tenure this process held. A shard
    /// it did not own all along at its first view (joining, rejoined, or not owned) has
    /// none below its first epoch: any total there was restored from a tenure that ended.
    first_epoch_held: Vec<u32>,
    /// Per shard: owned in a view taken in, not in a later one, and given back by none
    /// since. A tile for it is of the tenure that ended (a batch in flight to a paused
    /// ingester when it was failed over), not a gain ahead of the view.
    lost: Vec<bool>,
    /// Per shard: the epoch of such tiles is open (bumped once per loss).
    stale_open: Vec<bool>,
    /// A shard was gained or lost since this process started: a total whose shard is
    /// unknown may be stale.
    ownership_changed: bool,
    /// A total was just made fresh for an adopted series: its sample gets a reset before it.
    adopted_marker: bool,
    /// Set by [`Converter::add_to_total`] for a late tile: its correction sample (the new
    /// total and its timestamp), if it gets one.
    correction: Option<(f64, i64)>,
    /// Series adopted by the last conversion, counted at [`Converter::commit`].
    adopted_pending: u64,
    adopted: Option<prometheus_client::metrics::counter::Counter>,
    /// Tiles of the last conversion that started before their shard's tenure, counted at
    /// [`Converter::commit`] into `earlier_tenure`.
    earlier_tenure_pending: u64,
    earlier_tenure: Option<prometheus_client::metrics::counter::Counter>,
    /// Series of the last conversion's completion skipped because the leader's copy went
    /// to the shard's owner before this ingester, counted at [`Converter::commit`] into
    /// `earlier_owner`.
    earlier_owner_pending: u64,
    earlier_owner: Option<prometheus_client::metrics::counter::Counter>,
    /// A per-tile target's rendering ([`lines`]); `None` for a cumulative one.
    lines: Option<lines::Lines>,
    /// Which copies of recent tiles came: for the gauges and sets of a whole copy
    /// that follows an incomplete one.
    copies: TileCopies,
    /// Where the gauges and sets of the batch being converted go.
    per_tile: PerTile,
    /// The copy being converted, and the series it wrote at the tile's end: remembered in
    /// `copies` on commit, forgotten on rollback (a batch a full disk refused, converted
    /// again when it comes back, must find the copies as they were).
    copy_pending: Option<PendingCopy>,
    written_at_end_pending: Vec<u64>,
    /// The families written, for remote write's metadata (a remote-write target's), and
    /// the unit of timers' families.
    families: Option<(FamilyNotes, &'static str)>,
    /// The statsd kind of the tile whose families were noted last.
    noted_kind: Option<MetricKind>,
    /// The memory budget, and the count of totals evicted while it shed.
    shedding: Option<(Arc<tessera_core::budget::MemoryBudget>, prometheus_client::metrics::counter::Counter)>,
    /// When totals were last evicted (at most once a second).
    last_eviction: Option<std::time::Instant>,
    /// A view taken in said `rejoined`.
    rejoined_seen: bool,
    /// Totals were evicted: every new total starts with an explicit reset, since the series
    /// may have been written before from a total that is gone.
    evicted_any: bool,
}

/// The share of the totals an eviction removes, least recently written first.
const EVICTED_SHARE: f64 = 0.1;

/// Where a tile's gauges and sets (values of the tile alone, with no running total to
/// correct) are written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PerTile {
    /// At the tile's end.
    AtEnd,
    /// One millisecond after the tile's end: a whole copy after an incomplete one was
    /// written, so that storage, which keeps the first value at a timestamp, reads the
    /// whole one as the tile's last sample.
    Correction,
    /// Not at all, counted as `Verdict`: a whole copy of this tile was written already.
    Skip(Verdict),
    /// At the tile's end for a series no earlier incomplete copy wrote a value of there;
    /// not at all (counted as `Verdict`) for one it did: storage holds that value, a
    /// different one at its timestamp (or a correction after a newer tile) is refused, and
    /// Prometheus refuses the whole request with it, the counters' corrections included
    /// (found by the fault campaign, seed 61).
    UnlessWritten(Verdict),
}

/// The ends of recent tiles converted from incomplete and from whole copies, per
/// resolution (a few dozen each); an incomplete copy's with its aggregator (a hash of
/// the batch's source), since one copy comes in several batches, each with its own
/// series. For the last few tiles with incomplete copies, which series got a value
/// at the tile's end from one.
#[derive(Debug, Default)]
struct TileCopies {
    incomplete: std::collections::VecDeque<(i64, i64, u64)>,
    whole: std::collections::VecDeque<(i64, i64)>,
    /// Per resolution, the newest tile end converted.
    newest: Vec<(i64, i64)>,
    /// `(resolution, end)` of a tile with an incomplete copy, and the series (hashes of
    /// their ids) whose gauge or set value an incomplete copy wrote at its end.
    written_at_end: std::collections::VecDeque<((i64, i64), HashSet<u64>)>,
}

/// Tile copies remembered, per kind of copy.
const TILE_COPIES_KEPT: usize = 64;

/// Tiles whose series written at the end by an incomplete copy are remembered (incomplete
/// copies come only with faults; each tile's set holds its gauge and set series).
const WRITTEN_AT_END_KEPT: usize = 8;

impl TileCopies {
    /// Where the gauges and sets of a copy from `source` (a hash of the batch's source)
    /// of the tile of `resolution_ms` ending at `end_ms` go, by the copies committed so far.
    fn per_tile(&self, resolution_ms: i64, end_ms: i64, incomplete: bool, source: u64) -> PerTile {
        let key = (resolution_ms, end_ms);
        let newest = self
            .newest
            .iter()
            .find(|(resolution, _)| *resolution == resolution_ms)
            .map_or(end_ms, |(_, newest)| *newest);
        let whole_seen = self.whole.contains(&key);
        let mut incomplete_seen = self.incomplete.iter().filter(|&&(resolution, end, _)| (resolution, end) == key);
        if incomplete {
            if whole_seen {
                PerTile::Skip(Verdict::Incomplete)
            } else if incomplete_seen.any(|&(_, _, seen)| seen != source) {
                // Another aggregator's incomplete copy (seed 61: a follower's larger copy
                // replaced the leader's; its gauges and sets went where the leader's were
                // stored, and each whole request was refused).
                PerTile::UnlessWritten(Verdict::Incomplete)
            } else {
                PerTile::AtEnd
            }
        } else if incomplete_seen.next().is_some() {
            // Once a newer tile was written, a correction would be out of order.
            if newest <= end_ms { PerTile::Correction } else { PerTile::UnlessWritten(Verdict::Late) }
        } else {
            PerTile::AtEnd
        }
    }

    /// Remembers a copy once its conversion is committed, with the series (hashes of their
    /// ids) whose gauge or set value it wrote at the tile's end.
    fn record(&mut self, copy: PendingCopy, written_at_end: &[u64]) {
        let PendingCopy { resolution_ms, end_ms, incomplete, source } = copy;
        let key = (resolution_ms, end_ms);
        match self.newest.iter_mut().find(|(resolution, _)| *resolution == resolution_ms) {
            Some((_, newest)) => *newest = (*newest).max(end_ms),
            None => self.newest.push(key),
        }
        if incomplete {
            remember(&mut self.incomplete, (resolution_ms, end_ms, source));
            if !self.written_at_end.iter().any(|(tile, _)| *tile == key) {
                self.written_at_end.push_back((key, HashSet::new()));
                if self.written_at_end.len() > WRITTEN_AT_END_KEPT {
                    self.written_at_end.pop_front();
                }
            }
            if let Some((_, written)) = self.written_at_end.iter_mut().find(|(tile, _)| *tile == key) {
                written.extend(written_at_end.iter().copied());
            }
        } else {
            remember(&mut self.whole, key);
        }
    }

    /// Whether an incomplete copy converted here wrote the value of `series` (a hash of its
    /// id) at the end of the tile `key`, as remembered (a tile no longer remembered: no).
    fn wrote_at_end(&self, key: (i64, i64), series: u64) -> bool {
        self.written_at_end.iter().find(|(tile, _)| *tile == key).is_some_and(|(_, written)| written.contains(&series))
    }

    /// Whether an incomplete copy wrote the value of `series` (a hash of its id) at the end
    /// of the tile `key`; a tile no longer remembered counts as written.
    fn written_at_end(&self, key: (i64, i64), series: u64) -> bool {
        self.written_at_end.iter().find(|(tile, _)| *tile == key).is_none_or(|(_, written)| written.contains(&series))
    }
}

/// The tile copy a conversion is of, remembered once it is committed.
#[derive(Debug, Clone, Copy)]
struct PendingCopy {
    resolution_ms: i64,
    end_ms: i64,
    incomplete: bool,
    source: u64,
}

/// Adds `copy` to the last [`TILE_COPIES_KEPT`] copies `seen`.
fn remember<T: PartialEq>(seen: &mut std::collections::VecDeque<T>, copy: T) {
    if !seen.contains(&copy) {
        seen.push_back(copy);
        if seen.len() > TILE_COPIES_KEPT {
            seen.pop_front();
        }
    }
}

/// What one tile turns into, before the labels are encoded.
struct Emit<'a> {
    suffix: &'a str,
    quantile: Option<&'a str>,
    value: f64,
    kind: SampleKind,
}

impl Converter {
    /// A converter writing distributions as summaries with `quantiles` and forgetting the
    /// running total of a series not written for `expire_after_ms`.
    pub fn new(quantiles: &[f64], expire_after_ms: i64) -> Converter {
        Converter {
            quantiles: quantiles.iter().map(|q| (*q, q.to_string())).collect(),
            label_scratch: String::new(),
            totals: Totals::default(),
            undo: Vec::new(),
            expire_after_ms,
            newest_tile_end_ms: i64::MIN,
            copies: TileCopies::default(),
            per_tile: PerTile::AtEnd,
            copy_pending: None,
            written_at_end_pending: Vec::new(),
            families: None,
            noted_kind: None,
            shedding: None,
            rejoined_seen: false,
            last_eviction: None,
            evicted_any: false,
            last_sweep_tile_end_ms: i64::MIN,
            tags: names::TagLabels::default(),
            external_labels: Vec::new(),
            name: String::new(),
            raw_name: Vec::new(),
            arena: Vec::new(),
            arena_bytes_per_tile: 0,
            spans: Vec::new(),
            histogram_mode: HistogramMode::Summary,
            resolution_label: true,
            max_buckets: usize::MAX,
            histograms: Histograms::default(),
            pending: Vec::new(),
            spare: Vec::new(),
            encoder: HistogramEncoder::default(),
            ownership: None,
            ownership_seen: 0,
            owned: Vec::new(),
            epochs: Vec::new(),
            tenures: Vec::new(),
            cutovers: Vec::new(),
            cutoffs: Vec::new(),
            view_version: 0,
            since: Vec::new(),
            tenure_from_ms: Vec::new(),
            restored_placement: None,
            gained_ahead_at: Vec::new(),
            first_epoch_held: Vec::new(),
            lost: Vec::new(),
            stale_open: Vec::new(),
            ownership_changed: false,
            adopted_marker: false,
            correction: None,
            adopted_pending: 0,
            adopted: None,
            earlier_tenure_pending: 0,
            earlier_tenure: None,
            earlier_owner_pending: 0,
            earlier_owner: None,
            lines: None,
        }
    }

    /// While `budget` sheds (the ingester near its memory limit), evicts the least
    /// recently written tenth of the running totals once a second, counted in `evicted`;
    /// a series whose total was evicted starts over with an explicit reset, as after a
    /// move, so that storage's `increase()` stays right.
    pub fn with_budget(
        mut self,
        budget: Arc<tessera_core::budget::MemoryBudget>,
        evicted: prometheus_client::metrics::counter::Counter,
    ) -> Converter {
        self.shedding = Some((budget, evicted));
        self
    }

    /// Evicts the least recently written [`EVICTED_SHARE`] of the totals (and their
    /// histograms) and gives the room back; returns how many.
    fn evict_least_recent(&mut self) -> usize {
        let count = ((self.totals.len() as f64) * EVICTED_SHARE).ceil() as usize;
        if count == 0 {
            return 0;
        }
        let mut ends: Vec<i64> = self.totals.values().map(|total| total.last_tile_end_ms).collect();
        let (_, cutoff, _) = ends.select_nth_unstable(count - 1);
        let cutoff = *cutoff;
        let mut evicted = 0;
        self.totals.retain(|_, total| {
            let keep = total.last_tile_end_ms > cutoff || evicted >= count;
            evicted += usize::from(!keep);
            keep
        });
        let totals = &self.totals;
        self.histograms.retain(|key, _| totals.contains_key(key));
        self.totals.shrink_to_fit();
        self.histograms.shrink_to_fit();
        self.evicted_any = true;
        evicted
    }

    /// Makes this converter one of an ingesters' placement: totals belong to the epoch
    /// of their shard's ownership, and a series whose shard this ingester gained starts
    /// over with an explicit reset (see the [module docs](self)); `metrics` counts them, and
    /// the tiles that went on an earlier tenure's total.
    pub fn with_ownership(mut self, ownership: Arc<Ownership>, metrics: &crate::tier::TierMetrics) -> Converter {
        self.ownership = Some(ownership);
        self.adopted = Some(metrics.series_adopted.clone());
        self.earlier_tenure = Some(metrics.tiles_of_earlier_tenure.clone());
        self.earlier_owner = Some(metrics.completions_of_earlier_owner.clone());
        self
    }

    /// Takes in a new ownership view, if there is one: a shard owned now and not
    /// before starts a new epoch, and so does one whose tenure changed
    /// ([`OwnershipView::tenure`](crate::tier::OwnershipView::tenure)): it was being given away and is owned again, and its
    /// receiver may have written it from an explicit reset meanwhile (found by the fault
    /// campaign, seed 3 at 5 minutes: the giver went on from its old total, which read as
    /// doubled). When the cutoff had not passed, the new epoch costs one explicit reset,
    /// which is exact. The first view counts as owned all along, so that a restart keeps
    /// the totals it restored.
    ///
    /// A shard gained by a tile ahead of the view ([`epoch_of`](Self::epoch_of)) that the
    /// view shows taken at a cutover after that tile's start was gained by a stale tile, not
    /// ahead: its tenure starts at the cutover, as a new epoch.
    ///
    /// The first view taken in is the first one published since start, whenever the
    /// converter first looks: a restarted joiner converts nothing until its cutover, and a
    /// failover meanwhile makes the current view show its shards as owned from the start,
    /// which would keep the totals it restored from a tenure that had ended (found by the
    /// fault campaign, seed 38 at 5 minutes: the restored totals went on after the failover,
    /// doubled on half the shards and lost on the other half). The current view then
    /// follows as a change. A view that says `rejoined` after a first that did not (the
    /// tier published before it had looked) makes every total so far stale.
    fn refresh_ownership(&mut self) {
        let Some(ownership) = self.ownership.clone() else { return };
        let Some(view) = ownership.changed_since(&mut self.ownership_seen) else { return };
        if self.owned.is_empty()
            && let Some(start) = ownership.first().filter(|start| !Arc::ptr_eq(start, &view))
        {
            self.take_in_view(&start);
        }
        self.take_in_view(&view);
    }

    /// [`refresh_ownership`](Self::refresh_ownership) of one view.
    fn take_in_view(&mut self, view: &crate::tier::OwnershipView) {
        if view.rejoined && !self.rejoined_seen && !self.owned.is_empty() {
            // Every total restored so far belongs to a tenure that ended while this
            // ingester was down: a new epoch for every shard.
            for epoch in &mut self.epochs {
                *epoch += 1;
            }
            self.first_epoch_held.clone_from(&self.epochs);
            self.ownership_changed = true;
        }
        self.rejoined_seen |= view.rejoined;
        self.view_version = view.version;
        if self.owned.len() != view.owned.len() {
            let first = self.owned.is_empty();
            self.owned = view.owned.clone();
            self.since = view.since.clone();
            self.tenure_from_ms = view.cutover_ms.clone();
            self.tenures = view.tenure.clone();
            self.cutovers = view.cutover_ms.clone();
            self.cutoffs = view.cutoff_ms.clone();
            self.gained_ahead_at = vec![i64::MAX; view.owned.len()];
            self.lost = vec![false; view.owned.len()];
            self.stale_open = vec![false; view.owned.len()];
            let epoch = if first { 0 } else { self.epochs.iter().copied().max().unwrap_or(0) + 1 };
            // A shard this ingester is joining (it takes it at a cutover) was not owned all
            // along, nor was any after a start that found it failed over (rejoined).
            self.epochs = view.joining.iter().map(|joining| epoch + u32::from(*joining || view.rejoined)).collect();
            if first {
                self.first_epoch_held = (0..view.owned.len())
                    .map(|shard| u32::from(!view.owned[shard] || view.joining[shard] || view.rejoined))
                    .collect();
                self.stale_restored_shards(view);
            }
            self.ownership_changed |= !first || view.rejoined || view.joining.iter().any(|joining| *joining);
            return;
        }
        for shard in 0..view.owned.len() {
            let (now, owned) = (view.owned[shard], self.owned[shard]);
            let tenure = self.tenures[shard];
            let gained_stale = tenure == GAINED_AHEAD && self.gained_ahead_at[shard] < view.cutover_ms[shard];
            let new_tenure = now && owned && (gained_stale || (tenure != GAINED_AHEAD && tenure != view.tenure[shard]));
            if (now && !owned) || new_tenure {
                self.epochs[shard] += 1;
            }
            self.ownership_changed |= now != owned || new_tenure;
            if owned && !now {
                self.lost[shard] = true;
            }
            if now {
                self.lost[shard] = false;
                self.stale_open[shard] = false;
            }
            // Where the tenure began (RELIABILITY.md, fix 24): the placement's `since`, exact
            // for a gain however late this view is read; for a new tenure the placement did
            // not stamp (a cutoff taken back otherwise than by a failover), the version of
            // the view that showed it. And the cutover it began at, kept after a finalize or
            // a failover sets it to 0: the tiles before it were the giver's.
            let begins = (now && !owned) || new_tenure;
            self.since[shard] = if begins && view.since[shard] == self.since[shard] && owned {
                view.since[shard].max(view.version)
            } else if begins {
                view.since[shard]
            } else {
                self.since[shard].max(view.since[shard])
            };
            self.tenure_from_ms[shard] =
                if begins { view.cutover_ms[shard] } else { self.tenure_from_ms[shard].max(view.cutover_ms[shard]) };
            self.owned[shard] = now;
            self.tenures[shard] = view.tenure[shard];
            self.cutovers[shard] = view.cutover_ms[shard];
            self.cutoffs[shard] = view.cutoff_ms[shard];
            self.gained_ahead_at[shard] = i64::MAX;
        }
    }

    /// At the first view: a shard owned all along by that view whose cutoff differs from the
    /// one the restored checkpoint recorded, or has none in either under another version of
    /// the placement, may have been given back or away again while this process was down:
    /// the totals restored for it may be of a tenure that ended, so its series start over, as
    /// a joined shard's do (found reading the code after the fault campaign's seed 65: fix
    /// 19 left out of a checkpoint the totals of a shard given away past its cutoff, but a
    /// checkpoint taken between the cutoff and the first tile converted after it still kept
    /// them). See the [`checkpoint`] docs, *Placement*.
    fn stale_restored_shards(&mut self, view: &crate::tier::OwnershipView) {
        let Some(restored) = self.restored_placement.take() else { return };
        let mut stale = 0;
        for shard in 0..view.owned.len() {
            let cutoff = view.cutoff_ms[shard];
            let changed = restored.cutoffs.len() != view.owned.len()
                || restored.cutoffs[shard] != cutoff
                || (cutoff == 0 && restored.version != view.version);
            if changed && view.owned[shard] && self.first_epoch_held[shard] == 0 {
                self.epochs[shard] += 1;
                self.first_epoch_held[shard] = self.epochs[shard];
                self.ownership_changed = true;
                stale += 1;
            }
        }
        if stale > 0 {
            tracing::warn!(
                shards = stale,
                "the placement moved shards since the checkpoint this ingester restored: their series start over \
                 with an explicit reset"
            );
        }
    }

    /// The ownership epoch of `series_id`'s tile starting at `tile_start_ms`. A tile for a
    /// shard the view does not give this ingester (an aggregator saw the change first)
    /// gains the shard now. A tile that starts before the cutover of its shard's tenure
    /// belongs to the tenure before: a batch taken in before the shard was lost (a pause
    /// past a failover) and converted after the shard came back at a later cutover. It
    /// goes on that tenure's total, which is what storage holds for that time; writing it
    /// as the new tenure would carry its delta into the real one (found by the fault
    /// campaign, seeds 10 and 15 at 5 minutes: a doubling at the cutover).
    /// Returns the epoch and the shard plus one (0, 0 without an ingesters' placement).
    fn epoch_of(&mut self, series_id: &[u8], tile_start_ms: i64) -> (u32, u32) {
        if self.owned.is_empty() {
            return (0, 0);
        }
        let shard = tessera_core::shard::shard_of(series_id, self.owned.len() as u32) as usize;
        if !self.owned[shard] && self.lost.get(shard).copied().unwrap_or(false) {
            // A tile of a tenure this converter saw end (found by the fault campaign, seed 31
            // at 5 minutes: a paused ingester converted a batch of a shard it had been failed
            // over from). A new total after a reset, on an epoch of its own; the shard stays
            // unowned, so the view that gives it back starts a new tenure whatever its cutover.
            // Taken for a gain ahead, it made the later failover that gave the shard back look
            // like the view catching up, and the next tile went on from the stale total.
            if !std::mem::replace(&mut self.stale_open[shard], true) {
                self.epochs[shard] += 1;
            }
            self.earlier_tenure_pending += 1;
            return (self.epochs[shard], shard as u32 + 1);
        }
        if !self.owned[shard] {
            self.owned[shard] = true;
            self.epochs[shard] += 1;
            self.tenures[shard] = GAINED_AHEAD;
            self.since[shard] = self.view_version.saturating_add(1);
            self.tenure_from_ms[shard] = 0;
            self.gained_ahead_at[shard] = tile_start_ms;
            self.cutovers[shard] = 0;
            self.cutoffs[shard] = 0;
            self.ownership_changed = true;
        } else if tile_start_ms < self.cutovers[shard]
            && self.epochs[shard] > self.first_epoch_held.get(shard).copied().unwrap_or(0)
        {
            // The tenure before is one this process held. A restarted joiner held none: its
            // epoch 0 is totals restored from a tenure that ended, and the tile starts its
            // series over instead.
            self.earlier_tenure_pending += 1;
            return (self.epochs[shard] - 1, shard as u32 + 1);
        }
        (self.epochs[shard], shard as u32 + 1)
    }

    /// Whether a completion of a leader's copy routed under `completes_version` (0: not a
    /// completion, or not known), of a tile starting at `tile_start_ms`, reached this
    /// ingester's shard `shard` (plus one; 0: no placement) from before the shard's tenure
    /// here: the tenure began at a later version, or at a cutover after the tile started.
    /// The leader's copy went to the owner before (RELIABILITY.md, fix 24).
    fn completes_before_tenure(&self, completes_version: u64, shard: u32, tile_start_ms: i64) -> bool {
        let Some(shard) = (shard as usize).checked_sub(1) else { return false };
        completes_version > 0
            && self.owned.get(shard).is_some_and(|owned| *owned)
            && (self.since.get(shard).is_some_and(|since| *since > completes_version)
                || self.tenure_from_ms.get(shard).is_some_and(|from| tile_start_ms < *from))
    }

    /// Whether this converter has taken in an ownership view that says `rejoined`: every
    /// total it restored is stale, and none is left in what it checkpoints.
    pub fn took_in_rejoined_view(&self) -> bool {
        self.rejoined_seen && !self.owned.is_empty()
    }

    /// Whether `total` belongs to the current ownership of its shard: a checkpoint
    /// keeps only those (a restart restores every total at epoch 0).
    fn total_is_current(&self, total: &Total) -> bool {
        if self.owned.is_empty() {
            return true;
        }
        match total.shard.checked_sub(1) {
            None => !self.ownership_changed,
            Some(shard) => {
                let shard = shard as usize;
                // Given away at a cutoff a converted tile has passed: the receiver writes the
                // shard from an explicit reset after it, so these totals never go on, though
                // the shard stays listed until the move is finalized. Kept, a restart within
                // the lease took them for current after the placement had given the shard
                // back (a failover of the receiver the converter never took in) and away
                // again: its first view showed the shard owned all along, and the next tile
                // went on over what the receiver had written (found by the fault campaign,
                // seed 65 at 5 minutes: 989 counters and timers doubled in one 10 s tile).
                let cutoff = self.cutoffs.get(shard).copied().unwrap_or(0);
                let ended = cutoff > 0 && cutoff < self.newest_tile_end_ms;
                !ended
                    && self.owned.get(shard).is_some_and(|owned| *owned)
                    && self.epochs.get(shard) == Some(&total.epoch)
            }
        }
    }

    /// Adds `labels` to every series (a tag of the series with the same name wins).
    pub fn with_external_labels(mut self, labels: &std::collections::BTreeMap<String, String>) -> Converter {
        self.external_labels = labels.iter().map(|(name, value)| (name.clone(), value.clone())).collect();
        self
    }

    /// Whether samples carry the `resolution` label: only a target that stores several
    /// resolutions needs it (one resolution per store is the default, with no label).
    pub fn with_resolution_label(mut self, resolution_label: bool) -> Converter {
        self.resolution_label = resolution_label;
        self
    }

    /// Notes the family, type and unit of every sample written into `families`, for
    /// remote write's metadata ([`crate::sink::metadata`]); timers' families get
    /// `timer_unit`.
    pub fn with_families(mut self, families: Families, timer_unit: &'static str) -> Converter {
        self.families = Some((FamilyNotes::new(families), timer_unit));
        self
    }

    /// Notes the families of the samples made since `spans_before` (a tile of `kind`).
    fn note_families(&mut self, kind: MetricKind, spans_before: usize) {
        let Some((notes, timer_unit)) = &mut self.families else { return };
        self.noted_kind = Some(kind);
        // A statsd name and kind noted before have the same families: one hash, no label walk.
        if !notes.first_time(xxhash_rust::xxh3::xxh3_64_with_seed(&self.raw_name, kind as u64)) {
            return;
        }
        let unit = if kind == MetricKind::Timer { *timer_unit } else { "" };
        for span in &self.spans[spans_before..] {
            let labels = &self.arena[span.labels.0..span.labels.1];
            let _ = crate::queue::series::visit_labels(labels, |label, name| {
                if label == "__name__" {
                    let (family, type_name) = crate::sink::openmetrics::family(name, span.kind);
                    notes.note(family, FamilyMeta { type_name, unit });
                }
            });
        }
    }

    /// Writes distributions as `mode` says, native histograms with at most `max_buckets`
    /// buckets (see the [module docs](self)).
    pub fn with_histograms(mut self, mode: HistogramMode, max_buckets: usize) -> Converter {
        self.histogram_mode = mode;
        self.max_buckets = max_buckets.max(1);
        self
    }

    /// Series with a running total in memory.
    pub fn cumulative_series(&self) -> usize {
        self.totals.len()
    }

    /// Converts `batch`. Running totals change at once; [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback) must follow before the next call.
    pub fn convert(&mut self, batch: &TileBatch, received_at_ms: i64) -> Result<Conversion, BatchError> {
        let Some(resolution) = names::resolution_label(&batch.storage_policy, batch.resolution_ms) else {
            return Err(BatchError::NoResolution { source_name: batch.source.clone() });
        };
        if batch.tile_end_ms <= 0 {
            return Err(BatchError::TileEnd { source_name: batch.source.clone(), tile_end_ms: batch.tile_end_ms });
        }
        self.undo.clear();
        self.discard_pending();
        self.adopted_pending = 0;
        self.earlier_tenure_pending = 0;
        self.earlier_owner_pending = 0;
        self.refresh_ownership();
        self.arena.clear();
        self.arena.reserve(batch.tiles.len() * self.arena_bytes_per_tile);
        self.spans.clear();
        let tile_end_ms = batch.tile_end_ms;
        let resolution_ms = i64::from(batch.resolution_ms);
        let source = xxhash_rust::xxh3::xxh3_64(batch.source.as_bytes());
        self.per_tile = self.copies.per_tile(resolution_ms, tile_end_ms, batch.incomplete, source);
        self.copy_pending =
            Some(PendingCopy { resolution_ms, end_ms: tile_end_ms, incomplete: batch.incomplete, source });
        if self.lines.is_some() {
            return Ok(self.convert_lines(batch, resolution, received_at_ms));
        }
        let mut skipped = SkippedTiles::default();
        let mut tiles = 0u32;
        for tile in &batch.tiles {
            let Ok(kind) = kind_from_proto(tile.r#type) else {
                skipped.add(SkipReason::UnknownType);
                continue;
            };
            let Some(aggregate) = tile.aggregate.as_ref().and_then(|aggregate| Aggregate::from_proto(aggregate).ok())
            else {
                skipped.add(SkipReason::InvalidAggregate);
                continue;
            };
            let (raw_name, raw_tags) = split_id(&tile.series_id);
            let mut new_name = false;
            if raw_name != self.raw_name.as_slice() || self.name.is_empty() {
                self.name.clear();
                names::metric_name(raw_name, &mut self.name);
                self.raw_name.clear();
                self.raw_name.extend_from_slice(raw_name);
                new_name = true;
            }
            names::tag_labels(raw_tags, &mut self.tags);
            if !self.external_labels.is_empty() {
                names::add_external(&mut self.tags, &self.external_labels);
            }
            let origin = xxhash_rust::xxh3::xxh3_64_with_seed(&tile.series_id, kind as u64);
            let (epoch, shard) = self.epoch_of(&tile.series_id, tile_end_ms - resolution_ms);
            let at = TileRef {
                end_ms: tile_end_ms,
                resolution_ms,
                origin,
                epoch,
                shard,
                incomplete: batch.incomplete,
                owner_refused: batch.owner_refused,
                before_tenure: self.completes_before_tenure(
                    batch.completes_version,
                    shard,
                    tile_end_ms - resolution_ms,
                ),
            };
            let spans_before = self.spans.len();
            let verdict = match (kind, &aggregate) {
                (MetricKind::Counter, Aggregate::Counter(delta)) => self.counter(*delta, &resolution, at),
                (MetricKind::Gauge, Aggregate::Gauge(gauge)) => {
                    self.tile_value(&resolution, at, gauge.resolve(Some(0.0)).unwrap_or(0.0))
                }
                (MetricKind::Set, Aggregate::Set(set)) => self.tile_value(&resolution, at, set.estimate()),
                (
                    MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution,
                    Aggregate::Distribution(summary),
                ) => self.distribution(summary, &resolution, at),
                _ => {
                    skipped.add(SkipReason::TypeMismatch);
                    continue;
                }
            };
            if self.families.is_some() && (new_name || self.noted_kind != Some(kind)) {
                self.note_families(kind, spans_before);
            }
            if let Some(needle) = traced_series()
                && tile.series_id.windows(needle.len()).any(|window| window == needle)
            {
                tracing::info!(
                    series = %String::from_utf8_lossy(&tile.series_id),
                    source = %batch.source,
                    policy = %batch.storage_policy,
                    tile_end_ms,
                    incomplete = batch.incomplete,
                    epoch,
                    shard,
                    counter = ?aggregate.counter(),
                    verdict = ?verdict,
                    samples = ?self.spans[spans_before..].iter().map(|span| (span.value, span.reset_before, span.timestamp_ms)).collect::<Vec<_>>(),
                    "traced series converted"
                );
            }
            match verdict {
                Verdict::Write(_) => tiles += 1,
                Verdict::Collision => {
                    skipped.count(verdict);
                    if COLLISION_LOG.allow() {
                        tracing::warn!(
                            series = %String::from_utf8_lossy(&tile.series_id),
                            name = %self.name,
                            "two statsd series map to one Prometheus series; the first one seen keeps it"
                        );
                    }
                }
                other => skipped.count(other),
            }
        }
        self.newest_tile_end_ms = self.newest_tile_end_ms.max(tile_end_ms);
        if !batch.tiles.is_empty() {
            self.arena_bytes_per_tile = self.arena.len().div_ceil(batch.tiles.len());
        }
        let arena = Bytes::from(std::mem::take(&mut self.arena));
        let samples = self
            .spans
            .iter()
            .map(|span| StoredSample {
                labels: arena.slice(span.labels.0..span.labels.1),
                value: span.value,
                kind: span.kind as i32,
                histogram: arena.slice(span.histogram.0..span.histogram.1),
                reset_before: span.reset_before,
                timestamp_ms: span.timestamp_ms,
                lines: Bytes::new(),
            })
            .collect();
        let record = Record {
            storage_policy: batch.storage_policy.clone(),
            resolution,
            tile_end_ms,
            received_at_ms,
            source: batch.source.clone(),
            batch_sequence: batch.sequence,
            tiles,
            samples,
            flushed_at_ms: batch.flushed_at_ms,
            incomplete: batch.incomplete,
        };
        Ok(Conversion { record, skipped })
    }

    /// Keeps the running totals of the last conversion (its record is durable), and
    /// forgets totals idle for longer than the expiry (checked at most once a minute of
    /// tile time).
    pub fn commit(&mut self) {
        self.undo.clear();
        self.commit_lines();
        if let Some(copy) = self.copy_pending.take() {
            self.copies.record(copy, &self.written_at_end_pending);
        }
        self.written_at_end_pending.clear();
        if let Some(adopted) = &self.adopted {
            adopted.inc_by(std::mem::take(&mut self.adopted_pending));
        }
        if let Some(earlier_tenure) = &self.earlier_tenure {
            earlier_tenure.inc_by(std::mem::take(&mut self.earlier_tenure_pending));
        }
        if let Some(earlier_owner) = &self.earlier_owner {
            earlier_owner.inc_by(std::mem::take(&mut self.earlier_owner_pending));
        }
        for (key, histogram) in self.pending.drain(..) {
            if let Some(previous) = self.histograms.insert(key, histogram) {
                self.spare.push(previous);
            }
        }
        self.spare.truncate(SPARE_HISTOGRAMS);
        if self.newest_tile_end_ms.saturating_sub(self.last_sweep_tile_end_ms) >= 60_000 {
            self.last_sweep_tile_end_ms = self.newest_tile_end_ms;
            let oldest_kept = self.newest_tile_end_ms.saturating_sub(self.expire_after_ms);
            self.totals.retain(|_, total| total.last_tile_end_ms >= oldest_kept);
            let totals = &self.totals;
            self.histograms.retain(|key, _| totals.contains_key(key));
        }
        let shedding = self.shedding.as_ref().is_some_and(|(budget, _)| budget.shedding());
        if shedding && self.last_eviction.is_none_or(|last| last.elapsed() >= std::time::Duration::from_secs(1)) {
            self.last_eviction = Some(std::time::Instant::now());
            let evicted = self.evict_least_recent();
            if let Some((_, counter)) = &self.shedding {
                counter.inc_by(evicted as u64);
            }
        }
    }

    /// Restores the running totals from before the last conversion (its record was not queued).
    pub fn rollback(&mut self) {
        self.rollback_lines();
        self.adopted_pending = 0;
        self.earlier_tenure_pending = 0;
        self.earlier_owner_pending = 0;
        while let Some((key, previous)) = self.undo.pop() {
            match previous {
                Some(total) => self.totals.insert(key, total),
                None => self.totals.remove(&key),
            };
        }
        self.discard_pending();
    }

    /// Native histograms kept in memory (each holds its buckets).
    pub fn cumulative_histograms(&self) -> usize {
        self.histograms.len()
    }

    fn discard_pending(&mut self) {
        self.copy_pending = None;
        self.written_at_end_pending.clear();
        let pending = self.pending.drain(..).map(|(_, histogram)| histogram);
        self.spare.extend(pending);
        self.spare.truncate(SPARE_HISTOGRAMS);
    }

    fn counter(&mut self, delta: f64, resolution: &str, at: TileRef) -> Verdict {
        let suffix = if self.name.ends_with("_total") { "" } else { "_total" };
        let span = self.encode(resolution, suffix, None);
        let key = xxhash_rust::xxh3::xxh3_128(&self.arena[span.0..span.1]);
        let verdict = self.add_to_total(key, delta, at, None);
        let reset_before = std::mem::take(&mut self.adopted_marker);
        let correction = self.correction.take();
        match (verdict, correction) {
            (Verdict::Write(value), _) => self.spans.push(Span {
                labels: span,
                reset_before,
                histogram: (0, 0),
                value,
                kind: SampleKind::Counter,
                timestamp_ms: 0,
            }),
            (Verdict::Late | Verdict::Replace(_), Some((value, timestamp_ms))) => self.spans.push(Span {
                labels: span,
                reset_before: false,
                histogram: (0, 0),
                value,
                kind: SampleKind::Counter,
                timestamp_ms,
            }),
            _ => self.arena.truncate(span.0),
        }
        verdict
    }

    fn distribution(
        &mut self,
        distribution: &tessera_core::aggregate::Distribution,
        resolution: &str,
        at: TileRef,
    ) -> Verdict {
        if let Some(buckets) = &distribution.buckets {
            return self.classic(distribution, buckets, resolution, at);
        }
        if distribution.quantiles.is_some() {
            // A mapping's summary: its quantiles, whatever the target's histogram mode.
            return self.summary(distribution, resolution, at);
        }
        let verdict = match self.histogram_mode {
            HistogramMode::Summary => self.summary(distribution, resolution, at),
            HistogramMode::Native => self.native(distribution, resolution, at, None),
            HistogramMode::Both => {
                let verdict = self.summary(distribution, resolution, at);
                self.native(distribution, resolution, at, Some(verdict));
                verdict
            }
        };
        let (min, max) = (distribution.min, distribution.max);
        if matches!(verdict, Verdict::Write(_)) && min.is_finite() && max.is_finite() && min <= max {
            self.emit(resolution, &Emit { suffix: "_min", quantile: None, value: min, kind: SampleKind::Gauge });
            self.emit(resolution, &Emit { suffix: "_max", quantile: None, value: max, kind: SampleKind::Gauge });
        }
        verdict
    }

    /// The classic histogram of a distribution with fixed buckets (a mapping's
    /// `observer_type: histogram`): cumulative `_bucket{le}` (over `le` and over time),
    /// `_sum` and `_count`, as statsd_exporter writes them, whatever the target's
    /// `histograms` setting. Every bucket moves in step with the count's verdict.
    fn classic(
        &mut self,
        distribution: &tessera_core::aggregate::Distribution,
        buckets: &tessera_core::aggregate::FixedBuckets,
        resolution: &str,
        at: TileRef,
    ) -> Verdict {
        let first_span = self.spans.len();
        let count =
            self.count_and_sum(distribution, resolution, at, SampleKind::HistogramCount, SampleKind::HistogramSum);
        if !matches!(count, Verdict::Write(_) | Verdict::Late | Verdict::Replace(_)) {
            return count;
        }
        // The count's spans were pushed: when it is a correction, so are the buckets'.
        let correction = self.spans.get(first_span).is_some_and(|span| span.timestamp_ms != 0);
        let mut cumulative = 0.0;
        let mut le = std::mem::take(&mut self.label_scratch);
        for (index, weight) in buckets.counts().iter().enumerate() {
            cumulative += weight;
            le.clear();
            match buckets.bounds().get(index) {
                Some(bound) => names::write_go_float(&mut le, *bound),
                None => le.push_str("+Inf"),
            }
            let span = self.encode(resolution, "_bucket", Some(("le", &le)));
            let key = xxhash_rust::xxh3::xxh3_128(&self.arena[span.0..span.1]);
            let verdict = self.add_to_total(key, cumulative, at, Some(count));
            let reset_before = std::mem::take(&mut self.adopted_marker);
            let fix = self.correction.take();
            let (value, timestamp_ms) = match (verdict, fix) {
                (Verdict::Write(total), _) => (total, 0),
                (Verdict::Late | Verdict::Replace(_), Some(fix)) if correction => fix,
                _ => {
                    self.arena.truncate(span.0);
                    continue;
                }
            };
            let reset_before = reset_before && timestamp_ms == 0;
            let kind = SampleKind::HistogramBucket;
            self.spans.push(Span { labels: span, reset_before, histogram: (0, 0), value, kind, timestamp_ms });
        }
        self.label_scratch = le;
        count
    }

    /// A distribution's cumulative `_count` and `_sum` samples (of `count_kind` and
    /// `sum_kind`), or their corrections for a late or replacing tile; returns the count's
    /// verdict, which the sum follows.
    fn count_and_sum(
        &mut self,
        summary: &tessera_core::aggregate::Distribution,
        resolution: &str,
        at: TileRef,
        count_kind: SampleKind,
        sum_kind: SampleKind,
    ) -> Verdict {
        let count_span = self.encode(resolution, "_count", None);
        let count_key = xxhash_rust::xxh3::xxh3_128(&self.arena[count_span.0..count_span.1]);
        let sum_span = self.encode(resolution, "_sum", None);
        let sum_key = xxhash_rust::xxh3::xxh3_128(&self.arena[sum_span.0..sum_span.1]);
        let count = self.add_to_total(count_key, summary.count, at, None);
        let count_reset = std::mem::take(&mut self.adopted_marker);
        let count_correction = self.correction.take();
        // The sum follows the count's verdict, so the two stay in step.
        let sum = self.add_to_total(sum_key, summary.sum, at, Some(count));
        let sum_reset = std::mem::take(&mut self.adopted_marker);
        let sum_correction = self.correction.take();
        if let (Verdict::Late | Verdict::Replace(_), Some(count_at), Some(sum_at)) =
            (count, count_correction, sum_correction)
        {
            // A late or replacing tile's correction: the new totals after the newest sample.
            for (labels, (value, timestamp_ms), kind) in
                [(count_span, count_at, count_kind), (sum_span, sum_at, sum_kind)]
            {
                self.spans.push(Span { labels, reset_before: false, histogram: (0, 0), value, kind, timestamp_ms });
            }
            return count;
        }
        let (Verdict::Write(count_total), Verdict::Write(sum_total)) = (count, sum) else {
            self.arena.truncate(count_span.0);
            return count;
        };
        for (labels, value, reset_before, kind) in
            [(count_span, count_total, count_reset, count_kind), (sum_span, sum_total, sum_reset, sum_kind)]
        {
            self.spans.push(Span { labels, reset_before, histogram: (0, 0), value, kind, timestamp_ms: 0 });
        }
        count
    }

    /// The summary of a distribution: quantiles of the tile (those a mapping gave the series,
    /// else the converter's), cumulative `_count` and `_sum`.
    fn summary(&mut self, summary: &tessera_core::aggregate::Distribution, resolution: &str, at: TileRef) -> Verdict {
        let count = self.count_and_sum(summary, resolution, at, SampleKind::SummaryCount, SampleKind::SummarySum);
        if !matches!(count, Verdict::Write(_)) {
            return count;
        }
        if let Some(quantiles) = &summary.quantiles {
            let mut label = std::mem::take(&mut self.label_scratch);
            for quantile in quantiles.iter() {
                label.clear();
                names::write_go_float(&mut label, *quantile);
                self.quantile_sample(summary, *quantile, &label, resolution);
            }
            self.label_scratch = label;
            return count;
        }
        for index in 0..self.quantiles.len() {
            let label = std::mem::take(&mut self.quantiles[index].1);
            self.quantile_sample(summary, self.quantiles[index].0, &label, resolution);
            self.quantiles[index].1 = label;
        }
        count
    }

    /// The `quantile` sample (labelled `label`) of a tile's distribution, clamped to its
    /// `[min, max]`; none for an empty one.
    fn quantile_sample(
        &mut self,
        summary: &tessera_core::aggregate::Distribution,
        quantile: f64,
        label: &str,
        resolution: &str,
    ) {
        let (min, max) = (summary.min, summary.max);
        if !(min.is_finite() && max.is_finite() && min <= max) {
            return;
        }
        let Some(value) = summary.sketch.quantile(quantile) else { return };
        let emit =
            Emit { suffix: "", quantile: Some(label), value: value.clamp(min, max), kind: SampleKind::SummaryQuantile };
        self.emit(resolution, &emit);
    }

    /// The cumulative native histogram of a distribution. Its count is judged like a
    /// counter's (or follows `follow`, the summary's verdict); a written or late tile adds
    /// its sketch to the series' histogram, kept at [`Converter::commit`].
    fn native(
        &mut self,
        distribution: &tessera_core::aggregate::Distribution,
        resolution: &str,
        at: TileRef,
        follow: Option<Verdict>,
    ) -> Verdict {
        let span = self.encode(resolution, "", None);
        let key = xxhash_rust::xxh3::xxh3_128(&self.arena[span.0..span.1]);
        // A complete copy replaces the newest tile only while the histogram from before it
        // is kept; otherwise the copy is taken for an incomplete one.
        // Only a copy of the newest written tile can replace it: the histogram lookup is
        // made for those alone, not for every new tile.
        let same_tile = self.totals.get(&key).is_some_and(|total| total.last_tile_end_ms == at.end_ms);
        let replaceable =
            !same_tile || self.histograms.get(&key).is_some_and(|histogram| histogram.before_last.is_some());
        let (at, follow) = match (replaceable, follow) {
            (true, follow) => (at, follow),
            (false, Some(Verdict::Replace(_))) => (at, Some(Verdict::Incomplete)),
            (false, follow) => (TileRef { incomplete: true, ..at }, follow),
        };
        let verdict = self.add_to_total(key, distribution.count, at, follow);
        // A fresh histogram carries the reset hint: no explicit reset needed.
        self.adopted_marker = false;
        let correction = self.correction.take();
        if !matches!(verdict, Verdict::Write(_) | Verdict::Late | Verdict::Replace(_)) {
            self.arena.truncate(span.0);
            return verdict;
        }
        let mut next = self.spare.pop().unwrap_or_default();
        next.before_last = None;
        match self.histograms.get(&key) {
            Some(previous) => {
                match (&previous.before_last, verdict) {
                    (Some(before), Verdict::Replace(_)) => {
                        next.sketch.clone_from(&before.0);
                        next.sum = before.1;
                        // An incomplete copy that replaced another can be replaced in turn.
                        if at.incomplete {
                            next.before_last = Some(before.clone());
                        }
                    }
                    _ => {
                        next.sketch.clone_from(&previous.sketch);
                        next.sum = previous.sum;
                    }
                }
                next.written = previous.written;
                if matches!(verdict, Verdict::Late) {
                    // A late tile is older than the incomplete one: the histogram before
                    // that one holds it too.
                    next.before_last.clone_from(&previous.before_last);
                    if let Some(before) = next.before_last.as_mut() {
                        before.0.merge(&distribution.sketch);
                        before.1 += distribution.sum;
                    }
                }
            }
            None => {
                next.sketch.clear_with_schema(distribution.sketch.schema());
                next.sum = 0.0;
                next.written = false;
            }
        }
        if matches!(verdict, Verdict::Write(_)) && at.incomplete {
            next.before_last = Some(Box::new((next.sketch.clone(), next.sum)));
        }
        next.sketch.merge(&distribution.sketch);
        next.sum += distribution.sum;
        while next.sketch.bucket_count() > self.max_buckets && next.sketch.schema() > MIN_SCHEMA {
            next.sketch.downscale(next.sketch.schema() - 1);
        }
        let written = match (verdict, correction) {
            (Verdict::Write(count), _) => Some((count, 0)),
            // A late or replacing tile's correction: the histogram with it, after the newest
            // sample.
            (Verdict::Late | Verdict::Replace(_), Some((count, timestamp_ms))) if next.written => {
                Some((count, timestamp_ms))
            }
            _ => None,
        };
        match written {
            Some((count, timestamp_ms)) => {
                let start = self.arena.len();
                self.encoder.encode(&mut self.arena, &next.sketch, next.sum, !next.written);
                next.written = true;
                self.spans.push(Span {
                    labels: span,
                    reset_before: false,
                    histogram: (start, self.arena.len()),
                    value: count,
                    kind: SampleKind::Histogram,
                    timestamp_ms,
                });
            }
            None => self.arena.truncate(span.0),
        }
        self.pending.push((key, next));
        verdict
    }

    /// Judges the tile against the series' running total (or takes `follow`, the verdict
    /// of the series it moves in step with) and applies it: a written tile adds and is
    /// due a sample, a late one adds and is due a correction ([`Converter::correction`]),
    /// the others change nothing.
    fn add_to_total(&mut self, key: u128, delta: f64, at: TileRef, follow: Option<Verdict>) -> Verdict {
        let previous = self.totals.get(&key).copied();
        let current = previous.filter(|total| total.epoch == at.epoch);
        if at.before_tenure && follow.is_none() && !current.is_some_and(|total| total.holds(at)) {
            // The leader's copy of this tile went to the series' owner before this one,
            // which wrote it: the completion would begin a second writer's total beside it.
            self.earlier_owner_pending += 1;
            return Verdict::Duplicate;
        }
        let Some(mut total) = current else {
            if matches!(follow, Some(Verdict::Duplicate | Verdict::Conflict | Verdict::Collision | Verdict::Incomplete))
            {
                return follow.expect("matched");
            }
            if previous.is_some() {
                // Stale: made before this ingester last gained the shard.
                if let Some(histogram) = self.histograms.remove(&key) {
                    self.spare.push(histogram);
                }
            }
            // A new total in an ingesters' placement starts with an explicit reset, whether
            // its shard was just gained (adopted, counted) or not: this ingester or another
            // may have written the series before, and a restart keeps no total of a shard's
            // tenure that had ended (found by the fault campaign, seed 10 at 5 minutes: given
            // a shard back by a failover, killed before writing it again, then restarted, an
            // ingester wrote the next tile's total from 0 with no reset; it equalled the last
            // one written and storage read no increase).
            if at.epoch > 0 || self.ownership.is_some() || self.evicted_any {
                self.adopted_marker = true;
                self.adopted_pending += u64::from(at.epoch > 0);
            }
            self.undo.push((key, previous));
            let total = Total {
                value: delta,
                last_tile_end_ms: at.end_ms,
                last_delta: delta,
                // A total adopted from another writer (a new epoch of its shard, begun with
                // an explicit reset) owns no tile before its first: those are the series'
                // samples before the reset, its earlier writer's, and a copy of one that
                // comes later is a duplicate, not late (found by the fault campaign, seed 62
                // at 5 minutes: the follower's completion of a tile whose leader copy a
                // paused, failed-over ingester had written reached the new owner after its
                // next tile and was added again: 989 series counted a tile twice).
                written: 1,
                adopted: at.epoch > 0,
                origin: at.origin,
                epoch: at.epoch,
                shard: at.shard,
                last_sample_ms: at.end_ms,
                last_incomplete: at.incomplete,
            };
            self.totals.insert(key, total);
            return Verdict::Write(delta);
        };
        if total.origin == UNKNOWN_ORIGIN {
            total.origin = at.origin;
        }
        if total.shard == 0 {
            total.shard = at.shard;
        }
        let verdict = match follow {
            Some(Verdict::Write(_)) if at.end_ms > total.last_tile_end_ms => Verdict::Write(total.value + delta),
            Some(Verdict::Write(_) | Verdict::Late) => Verdict::Late,
            Some(Verdict::Replace(_)) if at.end_ms == total.last_tile_end_ms => {
                Verdict::Replace(total.value - total.last_delta + delta)
            }
            Some(Verdict::Replace(_)) => Verdict::Incomplete,
            Some(other) => other,
            None => total.verdict(delta, at),
        };
        match verdict {
            Verdict::Write(value) => {
                let shift = (at.end_ms - total.last_tile_end_ms) / at.resolution_ms.max(1);
                // An adopted total's first tile sliding out of the 64 remembered: every tile
                // before the ones remembered is late from then on, as for any total.
                total.adopted &= i64::from(total.oldest_written_back()) + shift <= 63;
                total.written = if (0..64).contains(&shift) { total.written << shift } else { 0 } | 1;
                total.value = value;
                total.last_tile_end_ms = at.end_ms;
                total.last_delta = delta;
                total.last_sample_ms = at.end_ms;
                total.last_incomplete = at.incomplete;
            }
            Verdict::Replace(value) => {
                total.value = value;
                total.last_delta = delta;
                total.last_incomplete = at.incomplete;
                self.correction = total.correction_at(at.resolution_ms).map(|timestamp_ms| {
                    total.last_sample_ms = timestamp_ms;
                    (total.value, timestamp_ms)
                });
            }
            Verdict::Late => {
                if let Some(back) = total.tiles_back(at) {
                    let first_back = total.oldest_written_back();
                    total.written |= if total.adopted && back > first_back {
                        // A refused tile from before an adopted total's first: the tiles
                        // between stay the earlier writer's, now by their own bits.
                        (u64::MAX >> (63 - back)) & !(u64::MAX >> (63 - first_back))
                    } else {
                        1 << back
                    };
                }
                total.value += delta;
                self.correction = total.correction_at(at.resolution_ms).map(|timestamp_ms| {
                    total.last_sample_ms = timestamp_ms;
                    (total.value, timestamp_ms)
                });
            }
            Verdict::Duplicate | Verdict::Conflict | Verdict::Collision | Verdict::Incomplete => return verdict,
        }
        self.undo.push((key, previous));
        self.totals.insert(key, total);
        verdict
    }

    /// A gauge's or a set's value of the tile, where [`PerTile`] says.
    fn tile_value(&mut self, resolution: &str, at: TileRef, value: f64) -> Verdict {
        let key = (at.resolution_ms, at.end_ms);
        let timestamp_ms = match self.per_tile {
            PerTile::AtEnd => 0,
            PerTile::Correction => at.end_ms + 1,
            PerTile::Skip(verdict) => return verdict,
            PerTile::UnlessWritten(verdict) if self.copies.written_at_end(key, at.origin) => return verdict,
            PerTile::UnlessWritten(_) => 0,
        };
        if at.before_tenure && !self.copies.wrote_at_end(key, at.origin) {
            // As for a running total (add_to_total): the owner before wrote this tile.
            self.earlier_owner_pending += 1;
            return Verdict::Duplicate;
        }
        if at.incomplete && timestamp_ms == 0 {
            self.written_at_end_pending.push(at.origin);
        }
        let labels = self.encode(resolution, "", None);
        let kind = SampleKind::Gauge;
        self.spans.push(Span { labels, reset_before: false, histogram: (0, 0), value, kind, timestamp_ms });
        Verdict::Write(value)
    }

    fn emit(&mut self, resolution: &str, emit: &Emit<'_>) {
        let labels = self.encode(resolution, emit.suffix, emit.quantile.map(|quantile| ("quantile", quantile)));
        self.push_span(labels, emit.value, emit.kind);
    }

    fn push_span(&mut self, labels: (usize, usize), value: f64, kind: SampleKind) {
        self.spans.push(Span { labels, reset_before: false, histogram: (0, 0), value, kind, timestamp_ms: 0 });
    }

    /// Encodes the labels of `<name><suffix>`, with the `extra` label (`quantile` or `le`)
    /// if any, into the arena; returns their span.
    ///
    /// The labels tessera adds sort as `__name__` < `le`, `quantile` < `resolution`, and
    /// tags never carry those names ([`tessera_core::series::RESERVED_LABELS`]), so one merge of two
    /// sorted lists gives the sorted label set without a sort or an allocation.
    fn encode(&mut self, resolution: &str, suffix: &str, extra: Option<(&str, &str)>) -> (usize, usize) {
        let start = self.arena.len();
        let name = [self.name.as_str(), suffix];
        let extra_parts = extra.map(|(label, value)| (label, [value, ""]));
        let resolution_parts = [resolution, ""];
        let mut extras: [Option<(&str, &[&str; 2])>; 3] = [
            Some(("__name__", &name)),
            extra_parts.as_ref().map(|(label, parts)| (*label, parts)),
            self.resolution_label.then_some(("resolution", &resolution_parts)),
        ];
        let mut tags = self.tags.labels.iter().peekable();
        let mut extra_index = 0;
        loop {
            while extra_index < extras.len() && extras[extra_index].is_none() {
                extra_index += 1;
            }
            let extra = extras.get_mut(extra_index).and_then(Option::take);
            match (extra, tags.peek()) {
                (None, None) => break,
                (Some((label, parts)), Some((tag, _))) if tag.as_str() < label => {
                    extras[extra_index] = Some((label, parts));
                    let (tag, value) = tags.next().expect("peeked");
                    encode_label(&mut self.arena, tag, &[value]);
                }
                (Some((label, parts)), _) => {
                    encode_label(&mut self.arena, label, parts);
                    extra_index += 1;
                }
                (None, Some(_)) => {
                    let (tag, value) = tags.next().expect("peeked");
                    encode_label(&mut self.arena, tag, &[value]);
                }
            }
        }
        (start, self.arena.len())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ownership_tests;
