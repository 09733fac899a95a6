//! The open tiles of one storage policy: its tables, which tile each
//! holds, what is closed, and the gauges' last values.

use std::collections::HashMap;
use std::time::Instant;

use tessera_core::aggregate::{Aggregate, kind_to_proto};
use tessera_core::parse::MetricKind;
use tessera_core::table::{Table, TableOptions};
use tessera_proto as proto;

use super::{ClosedTile, TilerSettings, tables_per_policy};
use crate::policy::StoragePolicy;

/// The last resolved value of a gauge series, for delta-only gauges.
#[derive(Debug, Clone, Copy)]
struct LastGauge {
    value: f64,
    tile_start_ms: i64,
}

/// The open tiles of one policy.
pub(super) struct PolicyTiles {
    pub(super) policy: StoragePolicy,
    pub(super) resolution_ms: i64,
    /// `tables[i mod R]` holds tile `i` while it is open.
    pub(super) tables: Vec<Table>,
    /// The tile start each table holds, if open.
    pub(super) open: Vec<Option<i64>>,
    open_count: usize,
    /// Every tile starting before this is closed.
    pub(super) closed_through_ms: i64,
    gauges: HashMap<Box<[u8]>, LastGauge, foldhash::fast::RandomState>,
    /// Gauge memories older than this many tiles are dropped.
    gauge_horizon_tiles: Option<i64>,
    /// Most empty cuts one `close_until` makes (enough to expire anything).
    max_empty_cuts: usize,
    /// Series emitted by the last cut, to size the next one.
    emitted_hint: usize,
}

impl PolicyTiles {
    pub(super) fn new(policy: StoragePolicy, settings: &TilerSettings, now_ms: i64) -> PolicyTiles {
        let past_ms = settings.buffer_past_ms.max(settings.max_buffer_past_ms);
        let tables_count = tables_per_policy(&policy, past_ms, settings.buffer_future_ms);
        // A table is cut once every R tiles: N empty tiles are ceil(N / R) idle cuts,
        // and the table drops a slot after `limit + 1` of them.
        let idle_cut_limit = settings
            .expire_after_empty_tiles
            .map(|tiles| (tiles as usize).div_ceil(tables_count).saturating_sub(1) as u32);
        let options = TableOptions {
            max_series: settings.max_series_per_policy,
            expire_after_idle_cuts: idle_cut_limit,
            ..TableOptions::default()
        };
        let max_empty_cuts = match idle_cut_limit {
            Some(limit) => tables_count * (limit as usize + 2),
            None => tables_count,
        };
        PolicyTiles {
            policy,
            resolution_ms: policy.resolution_ms(),
            tables: (0..tables_count).map(|_| Table::new(options)).collect(),
            open: vec![None; tables_count],
            open_count: 0,
            closed_through_ms: policy.tile_start_ms(now_ms.saturating_sub(settings.buffer_past_ms)),
            gauges: HashMap::default(),
            gauge_horizon_tiles: settings.expire_after_empty_tiles.map(|tiles| i64::from(tiles) + tables_count as i64),
            max_empty_cuts,
            emitted_hint: 0,
        }
    }

    pub(super) fn slot(&self, tile_start_ms: i64) -> usize {
        (tile_start_ms.div_euclid(self.resolution_ms)).rem_euclid(self.tables.len() as i64) as usize
    }

    /// The table for the tile starting at `tile_start_ms`, opening it.
    pub(super) fn open_tile(&mut self, tile_start_ms: i64, index: usize, emit: &mut dyn FnMut(ClosedTile)) -> usize {
        let slot = self.slot(tile_start_ms);
        match self.open[slot] {
            Some(held) if held == tile_start_ms => return slot,
            // Unreachable with R tables (the older tile was due and closed
            // first); closing it keeps tiles apart if the clock misbehaves.
            Some(held) => self.close_tile(slot, held, index, emit),
            None => {}
        }
        self.open[slot] = Some(tile_start_ms);
        self.open_count += 1;
        slot
    }

    /// Closes every tile starting before `target_ms`, in order.
    pub(super) fn close_until(&mut self, target_ms: i64, index: usize, emit: &mut dyn FnMut(ClosedTile)) {
        let mut empty_cuts = 0;
        while self.closed_through_ms < target_ms {
            let start = self.closed_through_ms;
            let slot = self.slot(start);
            match self.open[slot] {
                Some(held) if held == start => self.close_tile(slot, start, index, emit),
                None if empty_cuts < self.max_empty_cuts => {
                    empty_cuts += 1;
                    let started = Instant::now();
                    let stats = self.tables[slot].cut(|_, _, _| {});
                    emit(self.closed(index, start, Vec::new(), stats.expired, started));
                }
                _ => {}
            }
            self.closed_through_ms = start.saturating_add(self.resolution_ms);
            // After a long pause nothing is left to cut: jump ahead.
            if self.open_count == 0 && empty_cuts >= self.max_empty_cuts {
                self.closed_through_ms = self.closed_through_ms.max(target_ms);
            }
        }
    }

    pub(super) fn close_tile(&mut self, slot: usize, start: i64, index: usize, emit: &mut dyn FnMut(ClosedTile)) {
        let started = Instant::now();
        let end = start.saturating_add(self.resolution_ms);
        let mut values = Vec::with_capacity(self.emitted_hint);
        let gauges = &mut self.gauges;
        let stats = self.tables[slot].cut(|kind, id, aggregate| {
            values.push(tile_value(kind, id, aggregate, gauges, start, end));
        });
        self.open[slot] = None;
        self.open_count -= 1;
        self.emitted_hint = stats.emitted;
        if let Some(horizon_tiles) = self.gauge_horizon_tiles {
            let oldest_kept = start.saturating_sub(horizon_tiles.saturating_mul(self.resolution_ms));
            self.gauges.retain(|_, last| last.tile_start_ms >= oldest_kept);
        }
        emit(self.closed(index, start, values, stats.expired, started));
    }

    fn closed(
        &self,
        index: usize,
        start: i64,
        values: Vec<proto::SeriesValue>,
        expired: usize,
        started: Instant,
    ) -> ClosedTile {
        ClosedTile {
            policy_index: index,
            policy: self.policy,
            tile_start_ms: start,
            tile_end_ms: start.saturating_add(self.resolution_ms),
            values,
            expired,
            series_held: self.series_held(),
            cut_duration: started.elapsed(),
        }
    }

    pub(super) fn series_held(&self) -> usize {
        self.tables.iter().map(Table::len).max().unwrap_or(0)
    }
}

/// The wire value of one series' tile; gauges are resolved against the
/// series' previous tile and remembered for the next.
fn tile_value(
    kind: MetricKind,
    id: &[u8],
    aggregate: &Aggregate,
    gauges: &mut HashMap<Box<[u8]>, LastGauge, foldhash::fast::RandomState>,
    tile_start_ms: i64,
    tile_end_ms: i64,
) -> proto::SeriesValue {
    let wire = match aggregate {
        Aggregate::Gauge(gauge) => {
            let previous = gauges.get(id).map(|last| last.value);
            // No value, no delta and no history: a gauge starts at 0 (statsd).
            let value = gauge.resolve(previous).unwrap_or(0.0);
            match gauges.get_mut(id) {
                Some(last) => *last = LastGauge { value, tile_start_ms },
                None => {
                    gauges.insert(id.into(), LastGauge { value, tile_start_ms });
                }
            }
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
    proto::SeriesValue { series_id: id.to_vec(), r#type: kind_to_proto(kind) as i32, aggregate: Some(wire) }
}
