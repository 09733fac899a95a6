//! The flush stage's metrics: tiles flushed per storage policy and how late, and the
//! replicas' leadership (elections, fencing, flush marks, held tiles).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::labels::{ByReason, ByResult};
use tessera_runtime::telemetry::{Registry, lag_histogram, latency_histogram};

/// `{policy}`: a storage policy, by its name (`10s:2d`), from the configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByPolicy {
    policy: String,
}

/// `{shard_set}`: the shard set this replica is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByShardSet {
    shard_set: u32,
}

tessera_runtime::metrics! {
    /// The flush stage's metrics.
    pub struct FlushMetrics {
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
        /// Tiles flushed marked incomplete: by a replica that started after they began (the only
        /// replica left to flush them, or none of the replicas saw them whole), or closed before
        /// every collector confirmed their end (a link stalled, a collector paused or killed)
        pub incomplete_tiles: Counter,
        /// Tiles this replica flushed whole, not leading, because the leader flushed its copy
        /// incomplete (the ingesters let the whole copy replace the incomplete one)
        pub tiles_completed: Counter,
        /// Closed tiles held unflushed until the leader's flush mark passes them
        pub held_tiles: Gauge,
        /// Series values in the held tiles
        pub held_series: Gauge,
        /// Held tiles let go without flushing, by reason: flushed_by_leader (the normal case),
        /// held_limit, shutdown
        tiles_discarded: Family<ByReason, Counter>;
        /// The tiles flushed and series held of each storage policy
        policies: PolicyFamilies,
        /// Whether this replica leads its shard set
        leader: LeaderGauge,
    }
}

tessera_runtime::labelled_metrics! {
    /// The flush stage's metrics of each storage policy.
    struct PolicyFamilies;
    /// Handles of one storage policy.
    pub struct PolicyMetrics by ByPolicy {
        /// Series held per storage policy
        pub active_series: Gauge = active_series,
        /// Series forgotten after their empty tiles, per policy
        pub series_expired: Counter = series_expired,
        /// Tiles closed and handed to the ingester client, per policy
        pub tiles_flushed: Counter = tiles_flushed,
        /// Series values in flushed tiles, per policy
        pub series_flushed: Counter = series_flushed,
        /// Time to cut, encode and queue one closed tile, per policy
        pub flush_duration: Histogram = flush_duration [seconds] with latency_histogram,
        /// Time from a tile's end to its batches being queued, per policy
        pub flush_lag: Histogram = flush_lag [seconds] with lag_histogram,
    }
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

impl FlushMetrics {
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

    /// Handles for one storage policy (labelled by its name, e.g. `10s:2d`).
    pub fn policy(&self, policy: &str) -> PolicyMetrics {
        self.policies.handles(&ByPolicy { policy: policy.to_owned() })
    }
}
