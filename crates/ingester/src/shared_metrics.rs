//! What more than one stage's metrics share: the `{target}` and `{resolution}` label
//! sets and the storage latency buckets. A leaf module, so that each stage's
//! `metrics.rs` and the daemon's [`crate::metrics`] import it without a cycle.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Bucket bounds for latencies: 1 ms .. ~65 s.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// The ingester's latency histogram: storage requests and fsyncs are slower than the
/// wire's acknowledgements, so its buckets start at 1 ms.
pub fn storage_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// `{resolution}`: a storage policy's resolution (`10s`), as the tile batch names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByResolution {
    /// The resolution.
    pub resolution: String,
}

/// `{target}`: a configured sink target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByTarget {
    /// The target's name.
    pub target: String,
}
