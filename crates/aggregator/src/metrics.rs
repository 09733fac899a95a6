//! Every metric the aggregator exports: its drops, and the sets each stage declares in
//! its own folder ([`IntakeMetrics`], [`TileMetrics`], [`FlushMetrics`],
//! [`RoutingMetrics`]), registered under one prefix.
//!
//! Labels come from closed sets: `reason` (see [`AckReason`](tessera_proto::AckReason)),
//! `policy` and `destination` (both from the configuration), `unit`, `trigger`, and
//! `source`: the instance ids of connected collectors (bounded by `max_connections`,
//! removed when they disconnect). Hot paths hold cloned handles
//! ([`PolicyMetrics`](crate::flush::PolicyMetrics),
//! [`DestinationMetrics`](tessera_wire::DestinationMetrics)) and add once per
//! batch or tile, never once per series.

use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::labels::ByReasonUnit;
use tessera_runtime::telemetry::{Registry, zeroed_family};
use tessera_topology::{PlacementHandle, WatchStatsCollector};

use crate::flush::FlushMetrics;
use crate::intake::IntakeMetrics;
use crate::outbound::RoutingMetrics;
use crate::tile::TileMetrics;

/// Every aggregator metric's name starts with this.
pub const PREFIX: &str = "tessera_aggregator_";

tessera_runtime::metrics! {
    /// The aggregator's metrics.
    pub struct Metrics {
        /// Data dropped by the aggregator, per reason and unit
        pub drops: Drops = zeroed_family(DROP_REASONS.map(|(reason, unit)| ByReasonUnit { reason, unit }));
        /// The intake's metrics (batches from collectors, dictionaries, the wire listener)
        pub intake: IntakeMetrics,
        /// The tile stage's metrics (refusals, merges, closes, watermarks, shards)
        pub tile: TileMetrics,
        /// The flush stage's metrics (tiles flushed, leadership)
        pub flush: FlushMetrics,
        /// The outbound stage's metrics (ingesters, re-routing, senders)
        pub outbound: RoutingMetrics,
        /// The memory budget (`memory_limit`)
        pub memory: tessera_runtime::memory::MemoryMetrics,
    }
}

/// Every `(reason, unit)` of `drops_total`, each exported from the start at 0.
pub const DROP_REASONS: [(&str, &str); 14] = [
    ("no_ingester", "series"),
    ("unroutable", "series"),
    ("too_large", "series"),
    ("series_limit", "series"),
    ("memory_limit", "series"),
    ("unknown_series_ref", "series"),
    ("shutdown", "batches"),
    ("shutdown", "series"),
    ("queue_full", "batches"),
    ("queue_full", "series"),
    ("rejected", "batches"),
    ("rejected", "series"),
    ("expansion_failed", "batches"),
    ("expansion_failed", "series"),
];

impl Metrics {
    /// Registers the daemon's metrics under [`PREFIX`], and beside them its placement
    /// source's events and version (etcd errors, reconnects, cold starts from the cache
    /// file; `<prefix>placement_*`), read from `placement` at each scrape.
    pub fn register_with_placement(&self, registry: &mut Registry, placement: &PlacementHandle) {
        self.register(registry, PREFIX);
        WatchStatsCollector::register(registry, PREFIX, placement);
    }

    /// Dropped so far for `reason` in `unit`.
    pub fn drops(&self, reason: &'static str, unit: &'static str) -> u64 {
        self.drops.get_or_create(&ByReasonUnit { reason, unit }).get()
    }
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule_and_is_listed() {
        tessera_runtime::telemetry::naming::assert_exports(
            "aggregator",
            |registry| {
                let placement = tessera_topology::PlacementHandle::fixed(tessera_topology::Placement::default());
                super::Metrics::default().register_with_placement(registry, &placement);
            },
            include_str!("../../../docs/metrics/aggregator.txt"),
        );
    }
}
