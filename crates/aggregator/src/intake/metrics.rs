//! The intake's metrics: partial batches received from collectors, refused, and
//! the connection dictionaries they define; plus the wire listener's own
//! ([`ListenerMetrics`]).
//!
//! Registered by the daemon's [`Metrics`](crate::Metrics) under its prefix, as
//! its `intake` set. The decoder adds once per batch, never once per series.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_proto::AckReason;
use tessera_wire::metrics::ListenerMetrics;

use crate::metrics::ByReason;

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

tessera_runtime::metrics! {
    /// The intake's metrics.
    pub struct IntakeMetrics {
        /// Partial batch frames received from collectors
        pub batches_received: Counter,
        /// Bytes of partial batch frames received
        pub bytes_received: Counter,
        /// Series partials in the partial batches that decoded
        pub partials_received: Counter,
        /// Partial batches refused, per reason
        batches_rejected: Family<ByReason, Counter> = by_refusal(),
        /// Series partials in refused batches, per reason
        partials_rejected: Family<ByReason, Counter> = by_refusal(),
        /// Series refs defined in the collectors' connection dictionaries
        pub dictionary_refs: Gauge,
        /// Connection dictionaries a collector replaced with a new one (after a dropped batch or a
        /// rotation)
        pub dictionaries_restarted: Counter;
        /// The wire listener's metrics (connections from collectors)
        pub listener: ListenerMetrics = ListenerMetrics::default().with_frame_error_reasons(&FRAME_ERROR_REASONS),
    }
}

/// A family per refusal reason, each exported from the start at 0.
fn by_refusal() -> Family<ByReason, Counter> {
    let family = Family::<ByReason, Counter>::default();
    for reason in AckReason::FROM_AGGREGATOR {
        let _ = family.get_or_create(&ByReason { reason: reason.as_str() });
    }
    family
}

impl IntakeMetrics {
    /// Counts a refused batch of `partials` series partials (by the decoder or admission).
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
}
