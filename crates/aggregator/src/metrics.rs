//! Every metric the aggregator exports, declared once.
//!
//! Labels come from closed sets: `reason` (see [`AckReason`]), `policy` and
//! `destination` (both from the configuration), `unit`, `trigger`, and
//! `source`: the instance ids of connected collectors (bounded by
//! `max_connections`, removed when they disconnect). Hot paths hold
//! cloned handles ([`PolicyMetrics`], [`DestinationMetrics`]) and add once
//! per batch or tile, never once per series.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use tessera_proto::AckReason;

use crate::watermark::Trigger;

type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| (*key, (*value).to_owned())).collect()
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~26 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

fn lag_histogram() -> Histogram {
    // 10 ms .. ~164 s
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// The aggregator's metrics.
#[derive(Clone)]
pub struct Metrics {
    /// Partial batches that arrived (decoded or not).
    pub batches_received: Counter,
    /// Bytes of partial batch frames that arrived.
    pub bytes_received: Counter,
    /// Series partials in the batches that decoded.
    pub partials_received: Counter,
    /// Series partials merged into tiles.
    pub partials_merged: Counter,
    /// Gauge merges whose order was ambiguous.
    pub gauge_order_ambiguous: Counter,
    /// Series refs defined in the collectors' connection dictionaries.
    pub dictionary_refs: Gauge,
    /// Connection dictionaries a collector replaced with a new one.
    pub dictionaries_restarted: Counter,
    batches_rejected: Family<Labels, Counter>,
    partials_rejected: Family<Labels, Counter>,
    frame_errors: Family<Labels, Counter>,
    /// Open collector connections.
    pub connections: Gauge,
    /// Failed `accept` calls on the wire listener (out of file descriptors and the like).
    pub accept_errors: Counter,
    /// Time for the tiler to check and merge one batch.
    pub merge_duration: Histogram,
    active_series: Family<Labels, Gauge>,
    series_expired: Family<Labels, Counter>,
    tiles_flushed: Family<Labels, Counter>,
    series_flushed: Family<Labels, Counter>,
    flush_duration: Family<Labels, Histogram>,
    flush_lag: Family<Labels, Histogram>,
    batches_sent: Family<Labels, Counter>,
    bytes_sent: Family<Labels, Counter>,
    series_sent: Family<Labels, Counter>,
    ack_latency: Family<Labels, Histogram>,
    buffer_bytes: Family<Labels, Gauge>,
    buffer_batches: Family<Labels, Gauge>,
    connect_errors: Family<Labels, Counter>,
    send_errors: Family<Labels, Counter>,
    ingester_rejected_batches: Family<Labels, Counter>,
    drops: Family<Labels, Counter>,
    tile_closes: Family<Labels, Counter>,
    watermark_lag: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Shards this instance owns now.
    pub shards_owned: Gauge,
    /// Version of the placement in use.
    pub placement_version: Gauge,
    leader: Family<Labels, Gauge>,
    leader_shard_set: std::sync::Arc<std::sync::Mutex<Option<u32>>>,
    elections: Family<Labels, Counter>,
    /// etcd requests of the election that failed.
    pub election_errors: Counter,
    /// From first seeing the shard set leaderless to winning its election.
    pub takeover_duration: Histogram,
    /// Flush marks written to etcd.
    pub flush_marks_recorded: Counter,
    /// Times this replica, leading, stopped flushing because its lease could expire.
    pub fenced: Counter,
    flush_mark_lag: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Tiles this replica flushed although it did not see them whole.
    pub incomplete_tiles: Counter,
    /// Closed tiles held unflushed (follower, or a leader fenced off).
    pub held_tiles: Gauge,
    /// Series values in the held tiles.
    pub held_series: Gauge,
    tiles_discarded: Family<Labels, Counter>,
    /// Version of the ingesters' placement in use (0 with a fixed endpoint list).
    pub ingester_placement_version: Gauge,
    /// Ingesters in the ingesters' placement that tiles go to.
    pub ingester_destinations: Gauge,
    rerouted: Family<Labels, Counter>,
}

/// Every `reason` of `frame_errors_total`: the inbound side's, and the decoder's.
pub const FRAME_ERROR_REASONS: [&str; 7] =
    ["handshake", "idle_timeout", "too_large", "io", "too_many_connections", "malformed_frame", "unexpected_frame"];

/// Every `(reason, unit)` of `drops_total`.
pub const DROP_REASONS: [(&str, &str); 13] = [
    ("no_ingester", "series"),
    ("unroutable", "series"),
    ("too_large", "series"),
    ("series_limit", "series"),
    ("unknown_series_ref", "series"),
    ("shutdown", "batches"),
    ("shutdown", "series"),
    ("buffer_full", "batches"),
    ("buffer_full", "series"),
    ("rejected", "batches"),
    ("rejected", "series"),
    ("expansion_failed", "batches"),
    ("expansion_failed", "series"),
];

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            batches_received: Counter::default(),
            bytes_received: Counter::default(),
            partials_received: Counter::default(),
            partials_merged: Counter::default(),
            gauge_order_ambiguous: Counter::default(),
            dictionary_refs: Gauge::default(),
            dictionaries_restarted: Counter::default(),
            batches_rejected: Family::default(),
            partials_rejected: Family::default(),
            frame_errors: Family::default(),
            connections: Gauge::default(),
            accept_errors: Counter::default(),
            merge_duration: latency_histogram(),
            active_series: Family::default(),
            series_expired: Family::default(),
            tiles_flushed: Family::default(),
            series_flushed: Family::default(),
            flush_duration: Family::new_with_constructor(latency_histogram),
            flush_lag: Family::new_with_constructor(lag_histogram),
            batches_sent: Family::default(),
            bytes_sent: Family::default(),
            series_sent: Family::default(),
            ack_latency: Family::new_with_constructor(latency_histogram),
            buffer_bytes: Family::default(),
            buffer_batches: Family::default(),
            connect_errors: Family::default(),
            send_errors: Family::default(),
            ingester_rejected_batches: Family::default(),
            drops: Family::default(),
            tile_closes: Family::default(),
            watermark_lag: Family::default(),
            shards_owned: Gauge::default(),
            placement_version: Gauge::default(),
            leader: Family::default(),
            leader_shard_set: std::sync::Arc::default(),
            elections: Family::default(),
            election_errors: Counter::default(),
            takeover_duration: lag_histogram(),
            flush_marks_recorded: Counter::default(),
            fenced: Counter::default(),
            flush_mark_lag: Family::default(),
            incomplete_tiles: Counter::default(),
            held_tiles: Gauge::default(),
            held_series: Gauge::default(),
            tiles_discarded: Family::default(),
            ingester_placement_version: Gauge::default(),
            ingester_destinations: Gauge::default(),
            rerouted: Family::default(),
        };
        // Every closed-set reason is exported from the start, at 0: "nothing refused"
        // reads as 0, not as no data, so alerts and dashboards need no `or vector(0)`.
        for reason in AckReason::FROM_AGGREGATOR {
            let by_reason = labels(&[("reason", reason.as_str())]);
            let _ = metrics.batches_rejected.get_or_create(&by_reason);
            let _ = metrics.partials_rejected.get_or_create(&by_reason);
        }
        for reason in FRAME_ERROR_REASONS {
            let _ = metrics.frame_errors.get_or_create(&labels(&[("reason", reason)]));
        }
        for (reason, unit) in DROP_REASONS {
            let _ = metrics.drops.get_or_create(&labels(&[("reason", reason), ("unit", unit)]));
        }
        for unit in ["batches", "series"] {
            let _ = metrics.rerouted.get_or_create(&labels(&[("unit", unit)]));
        }
        metrics
    }
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        let p = "tessera_aggregator_";
        r.register(
            format!("{p}batches_received"),
            "Partial batch frames received from collectors",
            self.batches_received.clone(),
        );
        r.register(format!("{p}bytes_received"), "Bytes of partial batch frames received", self.bytes_received.clone());
        r.register(
            format!("{p}partials_received"),
            "Series partials in the partial batches that decoded",
            self.partials_received.clone(),
        );
        r.register(format!("{p}partials_merged"), "Series partials merged into tiles", self.partials_merged.clone());
        r.register(
            format!("{p}gauge_order_ambiguous"),
            "Gauge partials merged without knowing the order of every line (deltas of one window spanning \
             another window's or collector's set, or two sets with one stamp)",
            self.gauge_order_ambiguous.clone(),
        );
        r.register(
            format!("{p}batches_rejected"),
            "Partial batches refused, per reason",
            self.batches_rejected.clone(),
        );
        r.register(
            format!("{p}partials_rejected"),
            "Series partials in refused batches, per reason",
            self.partials_rejected.clone(),
        );
        r.register(
            format!("{p}frame_errors"),
            "Connections closed on a framing or handshake error, per reason",
            self.frame_errors.clone(),
        );
        r.register(format!("{p}connections"), "Open collector connections", self.connections.clone());
        r.register(format!("{p}accept_errors"), "Failed accept calls on the wire listener", self.accept_errors.clone());
        r.register(
            format!("{p}merge_duration_seconds"),
            "Time for the tiler to check and merge one partial batch",
            self.merge_duration.clone(),
        );
        r.register(format!("{p}active_series"), "Series held per storage policy", self.active_series.clone());
        r.register(
            format!("{p}series_expired"),
            "Series forgotten after their empty tiles, per policy",
            self.series_expired.clone(),
        );
        r.register(
            format!("{p}tiles_flushed"),
            "Tiles closed and handed to the ingester client, per policy",
            self.tiles_flushed.clone(),
        );
        r.register(
            format!("{p}series_flushed"),
            "Series values in flushed tiles, per policy",
            self.series_flushed.clone(),
        );
        r.register(
            format!("{p}flush_duration_seconds"),
            "Time to cut, encode and queue one closed tile, per policy",
            self.flush_duration.clone(),
        );
        r.register(
            format!("{p}flush_lag_seconds"),
            "Time from a tile's end to its batches being queued, per policy",
            self.flush_lag.clone(),
        );
        r.register(
            format!("{p}batches_sent"),
            "Tile batches acknowledged by an ingester, per destination",
            self.batches_sent.clone(),
        );
        r.register(
            format!("{p}bytes_sent"),
            "Bytes of acknowledged tile batches, per destination",
            self.bytes_sent.clone(),
        );
        r.register(
            format!("{p}series_sent"),
            "Series values in acknowledged tile batches, per destination",
            self.series_sent.clone(),
        );
        r.register(
            format!("{p}ack_latency_seconds"),
            "Time from sending a tile batch to its acknowledgement, per destination",
            self.ack_latency.clone(),
        );
        r.register(
            format!("{p}buffer_bytes"),
            "Bytes of tile batches waiting per ingester destination",
            self.buffer_bytes.clone(),
        );
        r.register(
            format!("{p}buffer_batches"),
            "Tile batches waiting per ingester destination",
            self.buffer_batches.clone(),
        );
        r.register(
            format!("{p}connect_errors"),
            "Failed connection attempts to an ingester, per destination",
            self.connect_errors.clone(),
        );
        r.register(
            format!("{p}send_errors"),
            "Connections to an ingester lost while sending or awaiting an ack, per destination and reason",
            self.send_errors.clone(),
        );
        r.register(
            format!("{p}ingester_rejected_batches"),
            "Tile batches an ingester refused for good, per destination and reason",
            self.ingester_rejected_batches.clone(),
        );
        r.register(format!("{p}drops"), "Data dropped by the aggregator, per reason and unit", self.drops.clone());
        r.register(
            format!("{p}ingester_placement_version"),
            "Version of the ingesters' placement in use (0 with a fixed endpoint list)",
            self.ingester_placement_version.clone(),
        );
        r.register(
            format!("{p}ingester_destinations"),
            "Ingesters of the ingesters' placement that tiles go to",
            self.ingester_destinations.clone(),
        );
        r.register(
            format!("{p}rerouted"),
            "Tile batches (and their series) queued for an ingester that left the placement, sent to the new \
             owners of their series instead, per unit",
            self.rerouted.clone(),
        );
        r.register(
            format!("{p}tile_closes"),
            "Tiles closed (per policy, empty ones included), by what closed them: every collector's watermark, \
             max_buffer_past, buffer_past (no watermark known) or shutdown",
            self.tile_closes.clone(),
        );
        r.register(
            format!("{p}watermark_lag_seconds"),
            "Per connected collector: now minus the end of the newest window it has sent in full",
            self.watermark_lag.clone(),
        );
        r.register(
            format!("{p}dictionary_refs"),
            "Series refs defined in the collectors' connection dictionaries",
            self.dictionary_refs.clone(),
        );
        r.register(
            format!("{p}dictionaries_restarted"),
            "Connection dictionaries a collector replaced with a new one (after a dropped batch or a rotation)",
            self.dictionaries_restarted.clone(),
        );
        r.register(format!("{p}shards_owned"), "Shards this instance owns now", self.shards_owned.clone());
        r.register(
            format!("{p}leader"),
            "1 while this replica leads its shard set with a live lease (and flushes), 0 while it follows or is \
             fenced off; absent without replicas",
            self.leader.clone(),
        );
        r.register(
            format!("{p}elections"),
            "Campaigns for the shard set's leader key, by result (won, lost)",
            self.elections.clone(),
        );
        r.register(
            format!("{p}election_errors"),
            "etcd requests of the election that failed",
            self.election_errors.clone(),
        );
        r.register(
            format!("{p}takeover_duration_seconds"),
            "From first seeing the shard set without a leader to winning its election",
            self.takeover_duration.clone(),
        );
        r.register(
            format!("{p}fenced"),
            "Times this replica, leading, stopped flushing because etcd had not confirmed its lease for \
             TTL minus the fence margin (etcd away, or the process paused)",
            self.fenced.clone(),
        );
        r.register(
            format!("{p}flush_marks_recorded"),
            "Flush marks written to etcd by the leader",
            self.flush_marks_recorded.clone(),
        );
        r.register(
            format!("{p}flush_mark_lag_seconds"),
            "Now minus the shard set leader's flush mark (end of the last tile acknowledged), per policy",
            self.flush_mark_lag.clone(),
        );
        r.register(
            format!("{p}incomplete_tiles"),
            "Tiles flushed by a replica that started after they began (the only replica left to flush them)",
            self.incomplete_tiles.clone(),
        );
        r.register(
            format!("{p}held_tiles"),
            "Closed tiles held unflushed until the leader's flush mark passes them",
            self.held_tiles.clone(),
        );
        r.register(format!("{p}held_series"), "Series values in the held tiles", self.held_series.clone());
        r.register(
            format!("{p}tiles_discarded"),
            "Held tiles let go without flushing, by reason: flushed_by_leader (the normal case), held_limit, shutdown",
            self.tiles_discarded.clone(),
        );
        r.register(format!("{p}placement_version"), "Version of the placement in use", self.placement_version.clone());
    }

    /// Exports whether this replica leads `shard_set` (`None`: not replicated).
    pub fn set_leader(&self, state: Option<(u32, bool)>) {
        let mut shown = self.leader_shard_set.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(previous) = *shown
            && state.is_none_or(|(shard_set, _)| shard_set != previous)
        {
            self.leader.remove(&labels(&[("shard_set", &previous.to_string())]));
        }
        *shown = state.map(|(shard_set, _)| shard_set);
        if let Some((shard_set, leads)) = state {
            self.leader.get_or_create(&labels(&[("shard_set", &shard_set.to_string())])).set(i64::from(leads));
        }
    }

    /// Counts a campaign by `result` (`won`, `lost`).
    pub fn election(&self, result: &'static str) {
        self.elections.get_or_create(&labels(&[("result", result)])).inc();
    }

    /// Exports the flush mark lag of each policy that has a mark.
    pub fn set_flush_mark_lags(&self, lags: &[(String, f64)]) {
        for (policy, lag) in lags {
            self.flush_mark_lag.get_or_create(&labels(&[("policy", policy)])).set(*lag);
        }
    }

    /// Counts `tiles` held tiles let go unflushed for `reason`.
    pub fn tiles_discarded(&self, reason: &'static str, tiles: u64) {
        if tiles > 0 {
            self.tiles_discarded.get_or_create(&labels(&[("reason", reason)])).inc_by(tiles);
        }
    }

    /// Counts a refused batch of `partials` series partials.
    pub fn rejected(&self, reason: AckReason, partials: u64) {
        let by_reason = labels(&[("reason", reason.as_str())]);
        self.batches_rejected.get_or_create(&by_reason).inc();
        self.partials_rejected.get_or_create(&by_reason).inc_by(partials);
    }

    /// Batches refused so far for `reason` (for tests and status lines).
    pub fn rejected_batches(&self, reason: AckReason) -> u64 {
        self.batches_rejected.get_or_create(&labels(&[("reason", reason.as_str())])).get()
    }

    /// Partials in batches refused so far for `reason`.
    pub fn rejected_partials(&self, reason: AckReason) -> u64 {
        self.partials_rejected.get_or_create(&labels(&[("reason", reason.as_str())])).get()
    }

    /// Counts a connection closed for `reason` (`too_large`, `malformed`, `handshake`, ...).
    pub fn frame_error(&self, reason: &'static str) {
        self.frame_errors.get_or_create(&labels(&[("reason", reason)])).inc();
    }

    /// Counts `count` of `unit` (`series`, `batches`) dropped for `reason`.
    pub fn dropped(&self, reason: &'static str, unit: &'static str, count: u64) {
        if count > 0 {
            self.drops.get_or_create(&labels(&[("reason", reason), ("unit", unit)])).inc_by(count);
        }
    }

    /// Dropped so far for `reason` in `unit`.
    pub fn drops(&self, reason: &'static str, unit: &'static str) -> u64 {
        self.drops.get_or_create(&labels(&[("reason", reason), ("unit", unit)])).get()
    }

    /// Counts `count` re-routed `unit`s (`batches` or `series`).
    pub fn rerouted(&self, unit: &'static str, count: u64) {
        if count > 0 {
            self.rerouted.get_or_create(&labels(&[("unit", unit)])).inc_by(count);
        }
    }

    /// Re-routed `unit`s so far.
    pub fn rerouted_count(&self, unit: &'static str) -> u64 {
        self.rerouted.get_or_create(&labels(&[("unit", unit)])).get()
    }

    /// Counts `tiles` closed by `trigger`.
    pub fn tiles_closed(&self, trigger: Trigger, tiles: u64) {
        if tiles > 0 {
            self.tile_closes.get_or_create(&labels(&[("trigger", trigger.as_str())])).inc_by(tiles);
        }
    }

    /// Tiles closed so far by `trigger`.
    pub fn tile_closes(&self, trigger: Trigger) -> u64 {
        self.tile_closes.get_or_create(&labels(&[("trigger", trigger.as_str())])).get()
    }

    /// Sets the watermark lag of every connected collector, and removes the
    /// series of those in `gone` (connected at the last call, not now).
    pub fn set_watermark_lags(&self, lags: &[(&str, i64)], gone: &[String]) {
        for source in gone {
            self.watermark_lag.remove(&labels(&[("source", source)]));
        }
        for (source, lag_ms) in lags {
            self.watermark_lag.get_or_create(&labels(&[("source", source)])).set(*lag_ms as f64 / 1000.0);
        }
    }

    /// Handles for one storage policy (labelled by its name, e.g. `10s:2d`).
    pub fn policy(&self, policy: &str) -> PolicyMetrics {
        let by_policy = labels(&[("policy", policy)]);
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
        let by_destination = labels(&[("destination", endpoint)]);
        for reason in AckReason::refusal_labels(&AckReason::FROM_INGESTER) {
            let _ =
                self.ingester_rejected_batches.get_or_create(&labels(&[("destination", endpoint), ("reason", reason)]));
        }
        DestinationMetrics {
            batches_sent: self.batches_sent.get_or_create(&by_destination).clone(),
            bytes_sent: self.bytes_sent.get_or_create(&by_destination).clone(),
            series_sent: self.series_sent.get_or_create(&by_destination).clone(),
            ack_latency: self.ack_latency.get_or_create(&by_destination).clone(),
            buffer_bytes: self.buffer_bytes.get_or_create(&by_destination).clone(),
            buffer_batches: self.buffer_batches.get_or_create(&by_destination).clone(),
            connect_errors: self.connect_errors.get_or_create(&by_destination).clone(),
            rejected: self.ingester_rejected_batches.clone(),
            send_errors: self.send_errors.clone(),
            drops: self.drops.clone(),
            endpoint: endpoint.to_owned(),
        }
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

/// Handles of one ingester destination.
#[derive(Clone)]
pub struct DestinationMetrics {
    /// Batches acknowledged.
    pub batches_sent: Counter,
    /// Bytes acknowledged.
    pub bytes_sent: Counter,
    /// Series values acknowledged.
    pub series_sent: Counter,
    /// Send-to-ack time.
    pub ack_latency: Histogram,
    /// Bytes buffered.
    pub buffer_bytes: Gauge,
    /// Batches buffered.
    pub buffer_batches: Gauge,
    /// Failed connects.
    pub connect_errors: Counter,
    rejected: Family<Labels, Counter>,
    send_errors: Family<Labels, Counter>,
    drops: Family<Labels, Counter>,
    endpoint: String,
}

impl DestinationMetrics {
    /// Counts a connection lost while sending a batch or awaiting its ack.
    pub fn send_error(&self, reason: &'static str) {
        self.send_errors.get_or_create(&labels(&[("destination", &self.endpoint), ("reason", reason)])).inc();
    }

    /// Counts a batch the ingester refused for good.
    pub fn rejected(&self, reason: &'static str) {
        self.rejected.get_or_create(&labels(&[("destination", &self.endpoint), ("reason", reason)])).inc();
    }

    /// Counts tile batches and their series dropped on the way to this destination.
    pub fn dropped(&self, reason: &'static str, batches: u64, series: u64) {
        if batches > 0 {
            self.drops.get_or_create(&labels(&[("reason", reason), ("unit", "batches")])).inc_by(batches);
            self.drops.get_or_create(&labels(&[("reason", reason), ("unit", "series")])).inc_by(series);
        }
    }
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule() {
        let telemetry = tessera_runtime::Telemetry::new("aggregator", "test");
        telemetry.with_registry(|registry| super::Metrics::default().register(registry));
        let families = tessera_runtime::telemetry::naming::check_registry(&telemetry, "aggregator");
        assert!(families.as_ref().is_ok_and(|count| *count >= 20), "{families:#?}");
    }
}
