//! The tile stage's metrics: batches refused (the intake's [`Refusals`](crate::intake::Refusals), counted here too), partials merged, tiles closed and
//! what closed them, each collector's watermark lag, and the shards owned.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::latency_histogram;

/// `{trigger}`: what closed a tile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTrigger {
    trigger: &'static str,
}

/// `{policy}`: a storage policy (`10s:2d`), one of the configured few.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByPolicy {
    policy: String,
}

/// `{source}`: a connected collector's instance id (bounded by `max_connections`,
/// removed when it disconnects).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BySource {
    source: String,
}

tessera_runtime::metrics! {
    /// The tile stage's metrics.
    pub struct TileMetrics {
        /// Series partials merged into tiles
        pub partials_merged: Counter,
        /// Gauge partials merged without knowing the order of every line (deltas of one window
        /// spanning another window's or collector's set, or two sets with one stamp)
        pub gauge_order_ambiguous: Counter,
        /// Timer, histogram and distribution merges whose partials disagreed on their fixed buckets
        /// (one counted buckets and the other did not, or other bounds: a mapping reload that
        /// reached some collectors first); the tile has no `_bucket` series, its count, sum and
        /// sketch stay exact
        pub buckets_dropped: Counter,
        /// Time for the tiler to check and merge one partial batch
        pub merge_duration: Histogram [seconds] = latency_histogram(),
        /// Tiles closed (per policy, empty ones included), by what closed them: every collector's
        /// watermark, max_buffer_past, buffer_past (no watermark known) or shutdown
        tile_closes: Family<ByTrigger, Counter>,
        /// Tiles closed before every collector seen around them confirmed their end with its
        /// watermark (a link stalled, a collector paused or killed): flushed marked incomplete,
        /// so that a replica holding them whole completes them
        pub unconfirmed_tiles: Counter,
        /// Partials that came after their window's tile of a policy had closed, by that policy:
        /// missing from that tile, and merged into the other policies' tiles of the window, still
        /// open (a window too late for its 10 s tile still counts in its 1 min tile)
        partials_late_for_policy: Family<ByPolicy, Counter>,
        /// Per connected collector: now minus the end of the newest window it has sent in full
        watermark_lag: Family<BySource, Gauge<f64, AtomicU64>> [seconds],
        /// Collector batches that came again on a new connection (their ack was late) after their
        /// first copy was admitted: answered as taken, not merged again
        pub resent_batches: Counter,
        /// Partials in those batches
        pub resent_partials: Counter,
        /// Shards this instance owns now
        pub shards_owned: Gauge;
        /// Batches refused (the intake counts here too)
        pub refusals: crate::intake::Refusals,
    }
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

    /// Counts `partials` that came too late for `policy`'s tile of their window.
    pub fn late_for_policy(&self, policy: &super::StoragePolicy, partials: u64) {
        self.partials_late_for_policy.get_or_create(&ByPolicy { policy: policy.to_string() }).inc_by(partials);
    }

    /// Partials counted late for `policy` so far.
    pub fn late_partials(&self, policy: &super::StoragePolicy) -> u64 {
        self.partials_late_for_policy.get_or_create(&ByPolicy { policy: policy.to_string() }).get()
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
