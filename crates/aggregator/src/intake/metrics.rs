//! The intake's metrics: partial batches received from collectors, the series
//! dictionaries of their connections, and the wire listener's.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tessera_wire::ListenerMetrics;

tessera_runtime::metrics! {
    /// The intake's metrics.
    pub struct IntakeMetrics {
        /// Partial batch frames received from collectors
        pub batches_received: Counter,
        /// Bytes of partial batch frames received
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
