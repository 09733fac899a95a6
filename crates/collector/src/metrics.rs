//! Every metric the collector exports: its drops, and the sets each stage declares in
//! its own folder ([`IntakeMetrics`], [`WindowMetrics`]), the wire's senders'
//! ([`SenderMetrics`]) and the rules' ([`RuleMetrics`]), registered under one prefix.
//!
//! Hot paths hold cloned handles (a listener's, from [`IntakeMetrics::listener`],
//! a destination's, from [`SenderMetrics::destination`]) and add to them once per batch,
//! never once per line.

use tessera_rules::RuleMetrics;
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::labels::ByReasonUnit;
use tessera_runtime::telemetry::{Registry, zeroed_family};
use tessera_topology::{PlacementHandle, WatchStatsCollector};
use tessera_wire::{Items, SenderMetrics};

use crate::intake::IntakeMetrics;
use crate::window::WindowMetrics;

/// Every collector metric's name starts with this.
pub const PREFIX: &str = "tessera_collector_";

/// What the collector's batches hold: partials, refused by aggregators for the
/// aggregator's reasons, with series dictionaries.
const ITEMS: Items = Items {
    unit: "partials",
    count_batches: false,
    refusals: &tessera_proto::AckReason::FROM_AGGREGATOR,
    dictionaries: true,
};

tessera_runtime::metrics! {
    /// The collector's metrics.
    pub struct Metrics {
        /// Data dropped by the collector, per reason and unit
        pub drops: Drops = zeroed_family(PARTIAL_DROP_REASONS.map(|reason| ByReasonUnit { reason, unit: "partials" }));
        /// The intake's metrics (listeners, UDP sockets, reader tables)
        pub intake: IntakeMetrics,
        /// The window stage's metrics (merge, flush)
        pub window: WindowMetrics,
        /// The senders' metrics, per destination aggregator
        pub senders: SenderMetrics = SenderMetrics::new(ITEMS),
        /// The rules' metrics (mapping file, allow/deny, tag rules, rollups, limits)
        pub rules: RuleMetrics,
        /// The memory budget (`memory_limit`)
        pub memory: tessera_runtime::memory::MemoryMetrics,
        /// Origin detection (`[origin]`)
        pub origin: crate::intake::origin::OriginMetrics,
    }
}

/// Why the flusher or a destination queue drops partials (`drops_total{unit="partials"}`),
/// each exported from the start at 0.
pub const PARTIAL_DROP_REASONS: [&str; 5] = ["no_owner", "queue_full", "rejected", "expansion_failed", "shutdown"];

impl Metrics {
    /// Registers the daemon's metrics under [`PREFIX`], and beside them its placement
    /// source's events and version (etcd errors, reconnects, cold starts from the cache
    /// file; `<prefix>placement_*`), read from `placement` at each scrape.
    pub fn register_with_placement(&self, registry: &mut Registry, placement: &PlacementHandle) {
        self.register(registry, PREFIX);
        WatchStatsCollector::register(registry, PREFIX, placement);
    }

    /// Dictionary generations of `destination` ended for `reason` so far.
    pub fn dictionary_generations_ended(&self, destination: &str, reason: &str) -> u64 {
        self.senders.dictionary_generations_ended(destination, reason)
    }

    /// Batches of `destination` re-sent expanded (`ok`) or dropped unexpandable (`error`)
    /// so far.
    pub fn batches_expanded(&self, destination: &str, result: &'static str) -> u64 {
        self.senders.batches_expanded(destination, result)
    }
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule_and_is_listed() {
        tessera_runtime::telemetry::naming::assert_exports(
            "collector",
            |registry| {
                let placement = tessera_topology::PlacementHandle::fixed(tessera_topology::Placement::default());
                super::Metrics::default().register_with_placement(registry, &placement);
            },
            include_str!("../../../docs/metrics/collector.txt"),
        );
    }
}
