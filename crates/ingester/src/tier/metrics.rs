//! The tier task's metrics: shards owned and moved, the changes it wrote to the
//! ingesters' placement, its etcd errors and its liveness.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_runtime::telemetry::zeroed_family;

tessera_runtime::metrics! {
    /// The tier task's metrics.
    pub struct TierMetrics {
        /// Shards of the ingesters' placement this ingester owns
        pub owned_shards: Gauge,
        /// Version of the ingesters' placement this ingester saw last
        pub tier_placement_version: Gauge,
        /// Shards this ingester gained or lost in the ingesters' placement, by direction
        shard_moves: Family<ByDirection, Counter> = zeroed_family(DIRECTIONS.map(|direction| ByDirection { direction })),
        /// Changes this ingester wrote to the ingesters' placement: init, join, fail_over (a dead
        /// ingester's shards handed to live ones), finalize
        placement_changes: Family<ByChange, Counter> = zeroed_family(CHANGES.map(|change| ByChange { change })),
        /// etcd requests of the ingester tier task that failed, and rejoins it could not record
        /// in the data directory (it does not join again until it can)
        pub tier_errors: Counter,
        /// Times this ingester held every failover while live ingesters re-register (after etcd
        /// failed to answer, or after its own lease had to be granted again)
        pub failover_holds: Counter,
        /// Cumulative series that started over (with an explicit reset) because their shard came to
        /// this ingester
        pub series_adopted: Counter,
        /// Tiles that started before the cutover of their shard's tenure, written on the total of
        /// the tenure before (a batch taken in before a failover, converted after the shard came
        /// back)
        pub tiles_of_earlier_tenure: Counter,
        /// Series of a follower's completion skipped because the shard set's leader routed its
        /// incomplete copy of the tile to the shard's owner before this ingester, which wrote
        /// it (the completion's extra units are not written)
        pub completions_of_earlier_owner: Counter,
        /// 1 while this ingester holds its liveness lease in etcd
        pub liveness_registered: Gauge,
        /// 1 while this ingester is fenced off: its liveness lease may expire within the fence
        /// margin, or the placement was not read again since it could; it writes nothing to
        /// its stores and answers batches retryable (`fenced`)
        pub fence_closed: Gauge,
        /// Times this ingester was fenced off (see `fence_closed`)
        pub fenced: Counter,
    }
}

/// Every `change` of `tessera_ingester_placement_changes_total`.
pub const CHANGES: [&str; 4] = ["init", "join", "fail_over", "finalize"];

/// Every `direction` of `tessera_ingester_shard_moves_total`.
pub const DIRECTIONS: [&str; 2] = ["gained", "lost"];

/// `{direction}`: `gained` or `lost`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByDirection {
    direction: &'static str,
}

/// `{change}`: one of [`CHANGES`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByChange {
    change: &'static str,
}

impl TierMetrics {
    pub(super) fn moved(&self, direction: &'static str, count: usize) {
        if count > 0 {
            self.shard_moves.get_or_create(&ByDirection { direction }).inc_by(count as u64);
        }
    }

    /// Shards moved in `direction` (`gained` or `lost`) so far.
    #[cfg(test)]
    pub(super) fn moves(&self, direction: &'static str) -> u64 {
        self.shard_moves.get_or_create(&ByDirection { direction }).get()
    }

    pub(super) fn changed(&self, change: &'static str) {
        self.placement_changes.get_or_create(&ByChange { change }).inc();
    }
}
