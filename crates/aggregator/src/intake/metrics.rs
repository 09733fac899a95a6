//! The intake's metrics: partial batches received from collectors, the series
//! dictionaries of their connections, the wire listener's, and the refusals of batches
//! (which admission counts too).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_proto::AckReason;
use tessera_runtime::RateLimitedLog;
use tessera_runtime::telemetry::labels::ByReason;
use tessera_runtime::telemetry::zeroed_family;
use tessera_wire::ListenerMetrics;

/// One log rate for refused batches, whether the decoder or admission refused them.
pub static REFUSAL_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.batch_refused", 5);

tessera_runtime::metrics! {
    /// The intake's metrics.
    pub struct IntakeMetrics {
        /// Partial batch frames received from collectors
        pub batches_received: Counter,
        /// Bytes of partial batch frames received (their bodies, without the length prefix)
        pub bytes_received: Counter,
        /// Series partials in the partial batches that decoded
        pub partials_received: Counter,
        /// Series refs defined in the collectors' connection dictionaries
        pub dictionary_refs: Gauge,
        /// Connection dictionaries a collector replaced with a new one (after a dropped batch or a
        /// rotation)
        pub dictionaries_restarted: Counter;
        /// The wire listener's metrics (connections from collectors)
        pub listener: ListenerMetrics,
    }
}

tessera_runtime::metrics! {
    /// Partial batches refused: by admission (what does not fit the tiles) and by the
    /// intake (what does not decode, or comes at shutdown).
    pub struct Refusals {
        /// Partial batches refused, per reason
        batches_rejected: Family<ByReason, Counter> = refusals(),
        /// Series partials in refused batches, per reason
        partials_rejected: Family<ByReason, Counter> = refusals(),
    }
}

/// A family with every reason an aggregator refuses a batch for, each at 0.
fn refusals() -> Family<ByReason, Counter> {
    zeroed_family(AckReason::FROM_AGGREGATOR.map(|reason| ByReason { reason: reason.as_str() }))
}

impl Refusals {
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
}
