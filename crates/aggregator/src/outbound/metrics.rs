//! The outbound stage's metrics: which ingesters tiles go to, what was re-routed when
//! one left, and the senders' own ([`SenderMetrics`], per ingester).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_proto::AckReason;
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::labels::ByUnit;
use tessera_runtime::telemetry::zeroed_family;
use tessera_wire::{DestinationMetrics, Items, SenderMetrics};

/// What the aggregator's batches towards ingesters hold: series values, refused for
/// the ingester's reasons; drops are counted in batches and series.
const ITEMS: Items =
    Items { unit: "series", count_batches: true, refusals: &AckReason::FROM_INGESTER, dictionaries: false };

tessera_runtime::metrics! {
    /// The outbound stage's metrics.
    pub struct RoutingMetrics {
        /// Version of the ingesters' placement in use (0 with a fixed endpoint list)
        pub ingester_placement_version: Gauge,
        /// Ingesters of the ingesters' placement that tiles go to
        pub ingester_destinations: Gauge,
        /// Tile batches an ingester refused as routed under a placement that no longer gives it
        /// some of their series (`placement_stale`), routed again by the current placement (also
        /// counted in `rerouted`)
        pub redirected_batches: Counter,
        /// Tile batches (and their series) queued for an ingester that left the placement, sent to the
        /// new owners of their series instead, per unit
        rerouted: Family<ByUnit, Counter> = zeroed_family(["batches", "series"].map(|unit| ByUnit { unit }));
        /// The senders' metrics, per ingester destination
        pub senders: SenderMetrics = SenderMetrics::new(ITEMS),
    }
}

impl RoutingMetrics {
    /// Counts `count` re-routed `unit`s (`batches` or `series`).
    pub fn rerouted(&self, unit: &'static str, count: u64) {
        if count > 0 {
            self.rerouted.get_or_create(&ByUnit { unit }).inc_by(count);
        }
    }

    /// Re-routed `unit`s so far.
    pub fn rerouted_count(&self, unit: &'static str) -> u64 {
        self.rerouted.get_or_create(&ByUnit { unit }).get()
    }

    /// Handles for one ingester destination (labelled by its endpoint); its drops go to
    /// `drops`.
    pub fn destination(&self, endpoint: &str, drops: &Drops) -> DestinationMetrics {
        self.senders.destination(endpoint, drops)
    }
}
