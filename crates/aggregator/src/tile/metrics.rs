//! The tile stage's metrics: admission (watermarks, what closed each tile), the
//! merge threads (partials merged, gauge order, merge time), the tiles' series
//! per storage policy, and the shards this instance owns.
//!
//! Registered by the daemon's [`Metrics`](crate::Metrics) under its prefix, as
//! its `tile` set. Labels: `policy` (from the configuration), `trigger`, and
//! `source`: the instance ids of connected collectors (bounded by
//! `max_connections`, removed when they disconnect).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::latency_histogram;

use crate::metrics::ByPolicy;

tessera_runtime::metrics! {
    /// The tile stage's metrics.
    pub struct TileMetrics {
        /// Series partials merged into tiles
        pub partials_merged: Counter,
        /// Gauge partials merged without knowing the order of every line (deltas of one window
        /// spanning another window's or collector's set, or two sets with one stamp)
        pub gauge_order_ambiguous: Counter,
        /// Time for the tiler to check and merge one partial batch
        pub merge_duration: Histogram [seconds] = latency_histogram(),
        /// Series held per storage policy
        pub(crate) active_series: Family<ByPolicy, Gauge>,
        /// Series forgotten after their empty tiles, per policy
        pub(crate) series_expired: Family<ByPolicy, Counter>,
        /// Tiles closed (per policy, empty ones included), by what closed them: every collector's
        /// watermark, max_buffer_past, buffer_past (no watermark known) or shutdown
        tile_closes: Family<ByTrigger, Counter>,
        /// Per connected collector: now minus the end of the newest window it has sent in full
        watermark_lag: Family<BySource, Gauge<f64, AtomicU64>> [seconds],
        /// Shards this instance owns now
        pub shards_owned: Gauge,
        /// Version of the placement in use
        pub placement_version: Gauge,
    }
}

/// `{trigger}`: what closed a tile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTrigger {
    trigger: &'static str,
}

/// `{source}`: a connected collector's instance id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BySource {
    source: String,
}

impl TileMetrics {
    /// Counts `tiles` closed by `trigger` (`watermark`, `max_buffer_past`, `buffer_past`, `shutdown`).
    pub fn tiles_closed(&self, trigger: &'static str, tiles: u64) {
        if tiles > 0 {
            self.tile_closes.get_or_create(&ByTrigger { trigger }).inc_by(tiles);
        }
    }

    /// Tiles closed so far by `trigger`.
    pub fn tile_closes(&self, trigger: &'static str) -> u64 {
        self.tile_closes.get_or_create(&ByTrigger { trigger }).get()
    }

    /// Sets the watermark lag of every connected collector, and removes the
    /// series of those in `gone` (connected at the last call, not now).
    pub fn set_watermark_lags(&self, lags: &[(&str, i64)], gone: &[String]) {
        for source in gone {
            self.watermark_lag.remove(&BySource { source: source.clone() });
        }
        for (source, lag_ms) in lags {
            self.watermark_lag.get_or_create(&BySource { source: (*source).to_owned() }).set(*lag_ms as f64 / 1000.0);
        }
    }
}
