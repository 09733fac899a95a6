//! The aggregator's metrics: one [`Metrics`] that registers every stage's set
//! under [`PREFIX`], each set declared in its stage's folder:
//!
//! | set | declared in | what |
//! |---|---|---|
//! | `intake` | `intake/metrics.rs` | partial batches received and refused, dictionaries, the wire listener |
//! | `tile` | `tile/metrics.rs` | admission, watermarks, merging, series per policy, owned shards |
//! | `flush` | `flush/metrics.rs` | tiles flushed, leadership (elections, fencing, flush marks, held tiles) |
//! | `outbound` | `outbound/metrics.rs` | ingester senders, the ingesters' placement, re-routing |
//!
//! What every stage shares stays here: `drops_total` (any stage drops data) and the
//! `reason` and `policy` label sets.
//!
//! Labels come from closed sets: `reason` (see [`AckReason`](tessera_proto::AckReason)),
//! `policy` and `destination` (both from the configuration), `unit`, `trigger`, `result`,
//! `shard_set`, and `source`: the instance ids of connected collectors (bounded by
//! `max_connections`, removed when they disconnect). Hot paths hold cloned handles
//! ([`PolicyMetrics`], [`DestinationMetrics`]) and add once per batch or tile, never once
//! per series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_wire::metrics::{ByReasonUnit, DestinationMetrics, Drops};

use crate::flush::FlushMetrics;
use crate::intake::IntakeMetrics;
use crate::outbound::OutboundMetrics;
use crate::tile::TileMetrics;

/// Every aggregator metric's name starts with this.
pub const PREFIX: &str = "tessera_aggregator_";

tessera_runtime::metrics! {
    /// The aggregator's metrics.
    pub struct Metrics {
        /// Data dropped by the aggregator, per reason and unit
        drops: Drops = every_drop();
        /// The intake's metrics (collectors' partial batches, the wire listener)
        pub intake: IntakeMetrics,
        /// The tile stage's metrics (admission, merging, owned shards)
        pub tile: TileMetrics,
        /// The flush stage's metrics (tiles flushed, leadership)
        pub flush: FlushMetrics,
        /// The outbound stage's metrics (senders towards ingesters, re-routing)
        pub outbound: OutboundMetrics,
    }
}

/// `{reason}`: why batches were refused or held tiles let go.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ByReason {
    pub(crate) reason: &'static str,
}

/// `{policy}`: a storage policy, by its name (`10s:2d`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ByPolicy {
    pub(crate) policy: String,
}

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

impl Metrics {
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

    /// Handles for one storage policy (labelled by its name, e.g. `10s:2d`).
    pub fn policy(&self, policy: &str) -> PolicyMetrics {
        let by_policy = ByPolicy { policy: policy.to_owned() };
        PolicyMetrics {
            active_series: self.tile.active_series.get_or_create(&by_policy).clone(),
            series_expired: self.tile.series_expired.get_or_create(&by_policy).clone(),
            tiles_flushed: self.flush.tiles_flushed.get_or_create(&by_policy).clone(),
            series_flushed: self.flush.series_flushed.get_or_create(&by_policy).clone(),
            flush_duration: self.flush.flush_duration.get_or_create(&by_policy).clone(),
            flush_lag: self.flush.flush_lag.get_or_create(&by_policy).clone(),
        }
    }

    /// Handles for one ingester destination (labelled by its endpoint); its queue's
    /// drops are counted in `drops_total`.
    pub fn destination(&self, endpoint: &str) -> DestinationMetrics {
        self.outbound.senders.destination(endpoint, &self.drops)
    }
}

/// Handles of one storage policy, for the flusher: the tile stage's series counts and
/// the flush stage's own.
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
