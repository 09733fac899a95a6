//! The open tiles of one storage policy: a table per tile indexed by
//! series number, which tile each holds, what is closed, and the gauges'
//! last values.

use std::time::Instant;

use tessera_core::aggregate::{Aggregate, MergeOrder, kind_to_proto};
use tessera_core::parse::MetricKind;
use tessera_proto as proto;

use super::series::{Registry, SeriesNumber};
use super::{ClosedTile, TilerSettings, tables_per_policy};
use crate::tile::StoragePolicy;

/// Most empty tiles of one policy a close reports after a long pause (or a clock step):
/// as many incomplete tile ends as a leader keeps with its marks
/// (`flush::leadership::INCOMPLETE_KEPT`).
const EMPTY_TILES_REPORTED: i64 = 16;

/// One tile's aggregates, indexed by series number. A slot keeps its
/// allocations (a sketch, a set) from tile to tile.
#[derive(Default)]
pub(super) struct DenseTable {
    slots: Vec<Aggregate>,
    /// Series merged into this tile, in the order first merged.
    touched: Vec<SeriesNumber>,
    /// `touched` as bits, by series number.
    touched_bits: Vec<u64>,
    ambiguous_merges: u64,
    buckets_dropped: u64,
}

impl DenseTable {
    /// Merges `aggregate` (already checked to fit `kind`) into series `number`.
    #[inline]
    pub(super) fn merge(&mut self, number: SeriesNumber, kind: MetricKind, aggregate: &Aggregate) {
        let index = number as usize;
        if index >= self.slots.len() {
            self.slots.resize_with(index + 1, || Aggregate::Counter(0.0));
            self.touched_bits.resize(self.slots.len().div_ceil(64), 0);
        }
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        let slot = &mut self.slots[index];
        if self.touched_bits[word] & bit == 0 {
            self.touched_bits[word] |= bit;
            self.touched.push(number);
            // A number freed and reused by a series of another kind.
            if std::mem::discriminant(slot) != std::mem::discriminant(aggregate) {
                *slot = Aggregate::new(kind);
            }
        }
        // The variants agree (checked above and at decoding), so only the order can be in question.
        match slot.merge(aggregate) {
            Ok(MergeOrder::Ambiguous) => self.ambiguous_merges += 1,
            Ok(MergeOrder::BucketsDropped) => self.buckets_dropped += 1,
            _ => {}
        }
    }

    /// Hands every series merged since the last cut to `each` and resets it.
    fn cut(&mut self, mut each: impl FnMut(SeriesNumber, &Aggregate)) -> usize {
        let emitted = self.touched.len();
        for number in self.touched.drain(..) {
            let index = number as usize;
            self.touched_bits[index / 64] &= !(1u64 << (index % 64));
            let slot = &mut self.slots[index];
            each(number, slot);
            slot.reset();
        }
        emitted
    }

    /// Drops a freed series' allocations.
    fn free(&mut self, number: SeriesNumber) {
        if let Some(slot) = self.slots.get_mut(number as usize) {
            *slot = Aggregate::Counter(0.0);
        }
    }

    pub(super) fn take_ambiguous_merges(&mut self) -> u64 {
        std::mem::take(&mut self.ambiguous_merges)
    }

    pub(super) fn take_buckets_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.buckets_dropped)
    }
}

/// The open tiles of one policy.
pub(super) struct PolicyTiles {
    pub(super) policy: StoragePolicy,
    pub(super) resolution_ms: i64,
    /// `tables[i mod R]` holds tile `i` while it is open.
    pub(super) tables: Vec<DenseTable>,
    /// The tile start each table holds, if open.
    pub(super) open: Vec<Option<i64>>,
    open_count: usize,
    /// Every tile starting before this is closed.
    pub(super) closed_through_ms: i64,
    /// The last resolved value of each gauge series, by number (NaN: none;
    /// values are finite), for delta-only gauges. Grows to the highest
    /// gauge number; counters-only workloads keep it empty.
    gauges: Vec<f64>,
    /// Series idle for this many of the policy's tiles may be forgotten.
    pub(super) expire_after_tiles: Option<i64>,
    /// Series emitted by the last cut, to size the next one.
    emitted_hint: usize,
}

impl PolicyTiles {
    pub(super) fn new(policy: StoragePolicy, settings: &TilerSettings, now_ms: i64) -> PolicyTiles {
        let past_ms = settings.buffer_past_ms.max(settings.max_buffer_past_ms);
        let tables_count = tables_per_policy(&policy, past_ms, settings.buffer_future_ms);
        let expire_after_tiles = settings.expire_after_empty_tiles.map(i64::from);
        PolicyTiles {
            policy,
            resolution_ms: policy.resolution_ms(),
            tables: (0..tables_count).map(|_| DenseTable::default()).collect(),
            open: vec![None; tables_count],
            open_count: 0,
            closed_through_ms: policy.tile_start_ms(now_ms.saturating_sub(settings.buffer_past_ms)),
            gauges: Vec::new(),
            expire_after_tiles,
            emitted_hint: 0,
        }
    }

    pub(super) fn slot(&self, tile_start_ms: i64) -> usize {
        (tile_start_ms.div_euclid(self.resolution_ms)).rem_euclid(self.tables.len() as i64) as usize
    }

    /// Whether the tile starting at `tile_start_ms` has closed (or its table holds a newer
    /// tile): it takes nothing more.
    pub(super) fn closed_for(&self, tile_start_ms: i64) -> bool {
        let held_by_newer = self.open[self.slot(tile_start_ms)].is_some_and(|held| held > tile_start_ms);
        tile_start_ms < self.closed_through_ms || held_by_newer
    }

    /// The table for the tile starting at `tile_start_ms`, opening it.
    pub(super) fn open_tile(
        &mut self,
        tile_start_ms: i64,
        index: usize,
        registry: &Registry,
        emit: &mut dyn FnMut(ClosedTile),
    ) -> usize {
        let slot = self.slot(tile_start_ms);
        match self.open[slot] {
            Some(held) if held == tile_start_ms => return slot,
            // Unreachable with R tables (the older tile was due and closed
            // first); closing it keeps tiles apart if the clock misbehaves.
            Some(held) => self.close_tile(slot, held, index, registry, emit),
            None => {}
        }
        self.open[slot] = Some(tile_start_ms);
        self.open_count += 1;
        slot
    }

    /// Closes every tile starting before `target_ms`, in order. A tile that received
    /// nothing is reported as an empty tile (the expiry count and the series held ride on
    /// the round's last): a leader must record each one that closed unconfirmed, or its
    /// mark passes it while a follower holds it whole (RELIABILITY.md, fix 16). After a
    /// long pause (or a clock step), with nothing open, only the last
    /// [`EMPTY_TILES_REPORTED`] are reported.
    pub(super) fn close_until(
        &mut self,
        target_ms: i64,
        index: usize,
        registry: &Registry,
        emit: &mut dyn FnMut(ClosedTile),
    ) {
        // `target_ms` is a tile start (of this policy), so this is one too.
        let reported_from = target_ms.saturating_sub(EMPTY_TILES_REPORTED.saturating_mul(self.resolution_ms));
        while self.closed_through_ms < target_ms {
            if self.open_count == 0 && self.closed_through_ms < reported_from {
                self.closed_through_ms = reported_from;
                continue;
            }
            let start = self.closed_through_ms;
            let slot = self.slot(start);
            match self.open[slot] {
                Some(held) if held == start => self.close_tile(slot, start, index, registry, emit),
                None => emit(self.closed(index, start, Vec::new(), registry, Instant::now())),
                _ => {}
            }
            self.closed_through_ms = start.saturating_add(self.resolution_ms);
        }
    }

    pub(super) fn close_tile(
        &mut self,
        slot: usize,
        start: i64,
        index: usize,
        registry: &Registry,
        emit: &mut dyn FnMut(ClosedTile),
    ) {
        let started = Instant::now();
        let end = start.saturating_add(self.resolution_ms);
        let mut values = Vec::with_capacity(self.emitted_hint);
        let gauges = &mut self.gauges;
        let emitted = self.tables[slot].cut(|number, aggregate| {
            let (kind, id) = registry.series(number);
            values.push(tile_value(kind, id, number, aggregate, gauges, end));
        });
        self.open[slot] = None;
        self.open_count -= 1;
        self.emitted_hint = emitted;
        emit(self.closed(index, start, values, registry, started));
    }

    fn closed(
        &self,
        index: usize,
        start: i64,
        values: Vec<proto::SeriesValue>,
        registry: &Registry,
        started: Instant,
    ) -> ClosedTile {
        ClosedTile {
            policy_index: index,
            policy: self.policy,
            tile_start_ms: start,
            tile_end_ms: start.saturating_add(self.resolution_ms),
            values,
            expired: 0,
            series_held: registry.len(),
            cut_duration: started.elapsed(),
            unconfirmed: false,
        }
    }

    /// Forgets everything held for a freed series.
    pub(super) fn free(&mut self, number: SeriesNumber) {
        for table in &mut self.tables {
            table.free(number);
        }
        if let Some(last) = self.gauges.get_mut(number as usize) {
            *last = f64::NAN;
        }
    }

    /// Windows starting before this are idle long enough to be forgotten
    /// by this policy (and none of them is in an open tile).
    pub(super) fn idle_before_ms(&self) -> Option<i64> {
        let tiles = self.expire_after_tiles?;
        Some(self.closed_through_ms.saturating_sub(tiles.saturating_mul(self.resolution_ms)))
    }
}

/// The wire value of one series' tile; gauges are resolved against the
/// series' previous tile and remembered for the next.
fn tile_value(
    kind: MetricKind,
    id: &[u8],
    number: SeriesNumber,
    aggregate: &Aggregate,
    gauges: &mut Vec<f64>,
    tile_end_ms: i64,
) -> proto::SeriesValue {
    let wire = match aggregate {
        Aggregate::Gauge(gauge) => {
            let index = number as usize;
            if index >= gauges.len() {
                gauges.resize(index + 1, f64::NAN);
            }
            let previous = Some(gauges[index]).filter(|last| !last.is_nan());
            // No value, no delta and no history: a gauge starts at 0 (statsd).
            let value = gauge.resolve(previous).unwrap_or(0.0);
            gauges[index] = value;
            let timestamp_ns = if gauge.has_value { gauge.timestamp_ns } else { tile_end_ms.saturating_mul(1_000_000) };
            proto::Aggregate {
                value: Some(proto::aggregate::Value::Gauge(proto::Gauge {
                    has_value: true,
                    value,
                    timestamp_ns,
                    ..proto::Gauge::default()
                })),
            }
        }
        other => other.to_proto(),
    };
    proto::SeriesValue { series_id: id.to_vec(), r#type: kind_to_proto(kind) as i32, aggregate: Some(wire), r#ref: 0 }
}
