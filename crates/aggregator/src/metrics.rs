//! Every metric the aggregator exports, declared once.
//!
//! Labels come from closed sets: `reason` (see [`AckReason`]), `policy` and
//! `destination` (both from the configuration), `unit`, `trigger`, and
//! `source`: the instance ids of connected collectors (bounded by
//! `max_connections`, removed when they disconnect). Hot paths hold
//! cloned handles ([`PolicyMetrics`], [`DestinationMetrics`]) and add once
//! per batch or tile, never once per series.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_proto::AckReason;
use tessera_runtime::telemetry::{Registry, lag_histogram, latency_histogram};
use tessera_wire::metrics::{ByReasonUnit, DestinationMetrics, Drops, Items, ListenerMetrics, SenderMetrics};

/// Every aggregator metric's name starts with this.
pub const PREFIX: &str = "tessera_aggregator_";

/// What the aggregator's batches towards ingesters hold: series values, refused for
/// the ingester's reasons; drops are counted in batches and series.
const ITEMS: Items =
    Items { unit: "series", count_batches: true, refusals: &AckReason::FROM_INGESTER, dictionaries: false };

tessera_runtime::metrics! {
    /// The aggregator's metrics.
    pub struct Metrics {
        /// Partial batch frames received from collectors
        pub batches_received: Counter,
        /// Bytes of partial batch frames received
        pub bytes_received: Counter,
        /// Series partials in the partial batches that decoded
        pub partials_received: Counter,
        /// Series partials merged into tiles
        pub partials_merged: Counter,
        /// Gauge partials merged without knowing the order of every line (deltas of one window
        /// spanning another window's or collector's set, or two sets with one stamp)
        pub gauge_order_ambiguous: Counter,
        /// Partial batches refused, per reason
        batches_rejected: Family<ByReason, Counter> = by_refusal(),
        /// Series partials in refused batches, per reason
        partials_rejected: Family<ByReason, Counter> = by_refusal(),
        /// Time for the tiler to check and merge one partial batch
        pub merge_duration: Histogram [seconds] = latency_histogram(),
        /// Series held per storage policy
        active_series: Family<ByPolicy, Gauge>,
        /// Series forgotten after their empty tiles, per policy
        series_expired: Family<ByPolicy, Counter>,
        /// Tiles closed and handed to the ingester client, per policy
        tiles_flushed: Family<ByPolicy, Counter>,
        /// Series values in flushed tiles, per policy
        series_flushed: Family<ByPolicy, Counter>,
        /// Time to cut, encode and queue one closed tile, per policy
        flush_duration: Family<ByPolicy, Histogram> [seconds] = Family::new_with_constructor(latency_histogram),
        /// Time from a tile's end to its batches being queued, per policy
        flush_lag: Family<ByPolicy, Histogram> [seconds] = Family::new_with_constructor(lag_histogram),
        /// Data dropped by the aggregator, per reason and unit
        drops: Drops = every_drop(),
        /// Version of the ingesters' placement in use (0 with a fixed endpoint list)
        pub ingester_placement_version: Gauge,
        /// Ingesters of the ingesters' placement that tiles go to
        pub ingester_destinations: Gauge,
        /// Tile batches (and their series) queued for an ingester that left the placement, sent to the
        /// new owners of their series instead, per unit
        rerouted: Family<ByUnit, Counter> = every_unit(&["batches", "series"]),
        /// Tiles closed (per policy, empty ones included), by what closed them: every collector's
        /// watermark, max_buffer_past, buffer_past (no watermark known) or shutdown
        tile_closes: Family<ByTrigger, Counter>,
        /// Per connected collector: now minus the end of the newest window it has sent in full
        watermark_lag: Family<BySource, Gauge<f64, AtomicU64>> [seconds],
        /// Series refs defined in the collectors' connection dictionaries
        pub dictionary_refs: Gauge,
        /// Connection dictionaries a collector replaced with a new one (after a dropped batch or a
        /// rotation)
        pub dictionaries_restarted: Counter,
        /// Shards this instance owns now
        pub shards_owned: Gauge,
        /// Campaigns for the shard set's leader key, by result (won, lost)
        elections: Family<ByResult, Counter>,
        /// etcd requests of the election that failed
        pub election_errors: Counter,
        /// From first seeing the shard set without a leader to winning its election
        pub takeover_duration: Histogram [seconds] = lag_histogram(),
        /// Times this replica, leading, stopped flushing because etcd had not confirmed its lease for
        /// TTL minus the fence margin (etcd away, or the process paused)
        pub fenced: Counter,
        /// Flush marks written to etcd by the leader
        pub flush_marks_recorded: Counter,
        /// Now minus the shard set leader's flush mark (end of the last tile acknowledged), per policy
        flush_mark_lag: Family<ByPolicy, Gauge<f64, AtomicU64>> [seconds],
        /// Tiles flushed by a replica that started after they began (the only replica left to flush
        /// them)
        pub incomplete_tiles: Counter,
        /// Closed tiles held unflushed until the leader's flush mark passes them
        pub held_tiles: Gauge,
        /// Series values in the held tiles
        pub held_series: Gauge,
        /// Held tiles let go without flushing, by reason: flushed_by_leader (the normal case),
        /// held_limit, shutdown
        tiles_discarded: Family<ByReason, Counter>,
        /// Version of the placement in use
        pub placement_version: Gauge;
        /// The wire listener's metrics (connections from collectors)
        pub listener: ListenerMetrics = ListenerMetrics::default().with_frame_error_reasons(&FRAME_ERROR_REASONS),
        /// The senders' metrics, per ingester destination
        pub senders: SenderMetrics = SenderMetrics::new(ITEMS),
        /// Whether this replica leads its shard set
        leader: LeaderGauge,
    }
}

/// `{reason}`: why batches were refused or held tiles let go.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReason {
    reason: &'static str,
}

/// `{policy}`: a storage policy, by its name (`10s:2d`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByPolicy {
    policy: String,
}

/// `{unit}`: what was counted (`batches`, `series`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByUnit {
    unit: &'static str,
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

/// `{result}`: how a campaign ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByResult {
    result: &'static str,
}

/// `{shard_set}`: the shard set this replica is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByShardSet {
    shard_set: u32,
}

/// Every `reason` of `frame_errors_total`: the inbound side's, and the decoder's.
pub const FRAME_ERROR_REASONS: [&str; 8] = [
    "handshake",
    "idle_timeout",
    "too_large",
    "io",
    "too_many_connections",
    "malformed_frame",
    "unexpected_frame",
    "tls",
];

/// Every `(reason, unit)` of `drops_total`.
pub const DROP_REASONS: [(&str, &str); 13] = [
    ("no_ingester", "series"),
    ("unroutable", "series"),
    ("too_large", "series"),
    ("series_limit", "series"),
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

/// The drops family with every reason of [`DROP_REASONS`] exported from the start, at 0:
/// "nothing dropped" reads as 0, not as no data, so alerts and dashboards need no
/// `or vector(0)`.
fn every_drop() -> Drops {
    let family = Drops::default();
    for (reason, unit) in DROP_REASONS {
        let _ = family.get_or_create(&ByReasonUnit { reason, unit });
    }
    family
}

/// A family per refusal reason, each exported from the start at 0.
fn by_refusal() -> Family<ByReason, Counter> {
    let family = Family::<ByReason, Counter>::default();
    for reason in AckReason::FROM_AGGREGATOR {
        let _ = family.get_or_create(&ByReason { reason: reason.as_str() });
    }
    family
}

/// A family per unit of `units`, each exported from the start at 0.
fn every_unit(units: &[&'static str]) -> Family<ByUnit, Counter> {
    let family = Family::<ByUnit, Counter>::default();
    for &unit in units {
        let _ = family.get_or_create(&ByUnit { unit });
    }
    family
}

/// `tessera_aggregator_leader{shard_set}`: one series, for the shard set this replica
/// is in; the previous one is removed when the shard set changes.
#[derive(Clone, Debug, Default)]
struct LeaderGauge {
    family: Family<ByShardSet, Gauge>,
    shown: Arc<Mutex<Option<u32>>>,
}

impl LeaderGauge {
    fn register(&self, registry: &mut Registry, prefix: &str) {
        registry.register(
            format!("{prefix}leader"),
            "1 while this replica leads its shard set with a live lease (and flushes), 0 while it follows or is \
             fenced off; absent without replicas",
            self.family.clone(),
        );
    }

    fn set(&self, state: Option<(u32, bool)>) {
        let mut shown = self.shown.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(previous) = *shown
            && state.is_none_or(|(shard_set, _)| shard_set != previous)
        {
            self.family.remove(&ByShardSet { shard_set: previous });
        }
        *shown = state.map(|(shard_set, _)| shard_set);
        if let Some((shard_set, leads)) = state {
            self.family.get_or_create(&ByShardSet { shard_set }).set(i64::from(leads));
        }
    }
}

impl Metrics {
    /// Exports whether this replica leads `shard_set` (`None`: not replicated).
    pub fn set_leader(&self, state: Option<(u32, bool)>) {
        self.leader.set(state);
    }

    /// Counts a campaign by `result` (`won`, `lost`).
    pub fn election(&self, result: &'static str) {
        self.elections.get_or_create(&ByResult { result }).inc();
    }

    /// Exports the flush mark lag of each policy that has a mark.
    pub fn set_flush_mark_lags(&self, lags: &[(String, f64)]) {
        for (policy, lag) in lags {
            self.flush_mark_lag.get_or_create(&ByPolicy { policy: policy.clone() }).set(*lag);
        }
    }

    /// Counts `tiles` held tiles let go unflushed for `reason`.
    pub fn tiles_discarded(&self, reason: &'static str, tiles: u64) {
        if tiles > 0 {
            self.tiles_discarded.get_or_create(&ByReason { reason }).inc_by(tiles);
        }
    }

    /// Counts a refused batch of `partials` series partials.
    pub fn rejected(&self, reason: AckReason, partials: u64) {
        let by_reason = ByReason { reason: reason.as_str() };
        self.batches_rejected.get_or_create(&by_reason).inc();
        self.partials_rejected.get_or_create(&by_reason).inc_by(partials);
    }

    /// Batches refused so far for `reason` (for tests and status lines).
    pub fn rejected_batches(&self, reason: AckReason) -> u64 {
        self.batches_rejected.get_or_create(&ByReason { reason: reason.as_str() }).get()
    }

    /// Partials in batches refused so far for `reason`.
    pub fn rejected_partials(&self, reason: AckReason) -> u64 {
        self.partials_rejected.get_or_create(&ByReason { reason: reason.as_str() }).get()
    }

    /// Counts `count` of `unit` (`series`, `batches`) dropped for `reason`.
    pub fn dropped(&self, reason: &'static str, unit: &'static str, count: u64) {
        if count > 0 {
            self.drops.get_or_create(&ByReasonUnit { reason, unit }).inc_by(count);
        }
    }

    /// Dropped so far for `reason` in `unit`.
    pub fn drops(&self, reason: &'static str, unit: &'static str) -> u64 {
        self.drops.get_or_create(&ByReasonUnit { reason, unit }).get()
    }

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

    /// Handles for one storage policy (labelled by its name, e.g. `10s:2d`).
    pub fn policy(&self, policy: &str) -> PolicyMetrics {
        let by_policy = ByPolicy { policy: policy.to_owned() };
        PolicyMetrics {
            active_series: self.active_series.get_or_create(&by_policy).clone(),
            series_expired: self.series_expired.get_or_create(&by_policy).clone(),
            tiles_flushed: self.tiles_flushed.get_or_create(&by_policy).clone(),
            series_flushed: self.series_flushed.get_or_create(&by_policy).clone(),
            flush_duration: self.flush_duration.get_or_create(&by_policy).clone(),
            flush_lag: self.flush_lag.get_or_create(&by_policy).clone(),
        }
    }

    /// Handles for one ingester destination (labelled by its endpoint).
    pub fn destination(&self, endpoint: &str) -> DestinationMetrics {
        self.senders.destination(endpoint, &self.drops)
    }
}

/// Handles of one storage policy.
#[derive(Clone)]
pub struct PolicyMetrics {
    /// Series held.
    pub active_series: Gauge,
    /// Series forgotten.
    pub series_expired: Counter,
    /// Tiles flushed.
    pub tiles_flushed: Counter,
    /// Series values flushed.
    pub series_flushed: Counter,
    /// Cut + encode + queue time of one tile.
    pub flush_duration: Histogram,
    /// Tile end to queued.
    pub flush_lag: Histogram,
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule() {
        let telemetry = tessera_runtime::Telemetry::new("aggregator", "test");
        telemetry.with_registry(|registry| super::Metrics::default().register(registry, super::PREFIX));
        let families = tessera_runtime::telemetry::naming::check_registry(&telemetry, "aggregator");
        assert!(families.as_ref().is_ok_and(|count| *count >= 20), "{families:#?}");
    }
}
