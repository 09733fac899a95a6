//! The pool's metrics: each target's workers, requests in flight and pace, and the
//! latency of every tile from its end to storage ([`WeightedHistogram`]s, one
//! observation per tile).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use tessera_runtime::telemetry::labels::{ByResolution, ByTarget};

use crate::sink::{SinkMetrics, TargetSinkMetrics};

/// `{target, worker}`: a worker of a target's pool, by index.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetWorker {
    target: String,
    worker: usize,
}

tessera_runtime::metrics! {
    /// The pool's metrics.
    pub struct PoolMetrics {
        /// Time each worker spent on requests (sending, pacing, backing off)
        worker_busy: Family<ByTargetWorker, Counter<f64, AtomicU64>> [seconds],
        /// Storage acknowledgement time minus tile end, one observation per tile, per resolution
        end_to_end_latency: Family<ByResolution, WeightedHistogram> [seconds] = Family::new_with_constructor(WeightedHistogram::end_to_end),
        /// Time from receipt to the first storage request of a tile's record, one observation per tile, per
        /// resolution
        queue_time: Family<ByResolution, WeightedHistogram> [seconds] = Family::new_with_constructor(WeightedHistogram::end_to_end);
        /// Each target's requests in flight and pace
        targets: WorkerFamilies,
    }
}

tessera_runtime::labelled_metrics! {
    /// The pool's metrics, per target.
    pub struct WorkerFamilies;
    /// A target's requests in flight and pace.
    pub struct WorkerGauges by ByTarget {
        /// Current adaptive limit on storage requests in flight, per target
        pub in_flight_limit: Gauge = in_flight_limit,
        /// Storage requests in flight, per target
        pub in_flight: Gauge = in_flight_requests,
        /// Samples written per second over the last second, per target
        pub pace: Gauge<f64, AtomicU64> = pace [samples_per_second],
    }
}

impl PoolMetrics {
    /// The end-to-end latency histogram of `resolution`.
    pub fn end_to_end(&self, resolution: &str) -> WeightedHistogram {
        self.end_to_end_latency.get_or_create(&ByResolution { resolution: resolution.to_owned() }).clone()
    }

    /// The queue-time histogram of `resolution`.
    pub fn queue_time(&self, resolution: &str) -> WeightedHistogram {
        self.queue_time.get_or_create(&ByResolution { resolution: resolution.to_owned() }).clone()
    }

    /// Handles of one target's workers, with its storage requests' from `sink`.
    pub fn target(&self, target: &str, sink: &SinkMetrics) -> TargetMetrics {
        TargetMetrics {
            target: target.to_owned(),
            sink: sink.target(target),
            worker_busy: self.worker_busy.clone(),
            gauges: self.targets.handles(&ByTarget { target: target.to_owned() }),
            pool: self.clone(),
        }
    }
}

/// Handles of one target's workers.
#[derive(Clone)]
pub struct TargetMetrics {
    target: String,
    /// Its storage requests.
    pub sink: TargetSinkMetrics,
    worker_busy: Family<ByTargetWorker, Counter<f64, AtomicU64>>,
    /// The adaptive limit, requests in flight, samples written over the last second.
    pub gauges: WorkerGauges,
    pool: PoolMetrics,
}

impl TargetMetrics {
    /// The busy-time counter of worker `index`.
    pub fn worker_busy(&self, index: usize) -> Counter<f64, AtomicU64> {
        self.worker_busy.get_or_create(&ByTargetWorker { target: self.target.clone(), worker: index }).clone()
    }

    /// The pool-wide metrics (latency histograms).
    pub fn pool(&self) -> &PoolMetrics {
        &self.pool
    }
}

/// Upper bounds of the end-to-end latency buckets, seconds.
pub const END_TO_END_BUCKETS: [f64; 24] = [
    0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.5, 10.0, 12.5, 15.0, 20.0, 30.0, 45.0,
    60.0, 90.0, 120.0,
];

/// A histogram that takes many equal observations at once ([`WeightedHistogram::observe_n`]),
/// so that "one observation per tile" costs one update per record.
#[derive(Clone, Debug)]
pub struct WeightedHistogram {
    inner: Arc<Mutex<WeightedInner>>,
}

#[derive(Debug)]
struct WeightedInner {
    sum: f64,
    count: u64,
    /// (upper bound, observations in this bucket only); the last bound is `f64::MAX`.
    buckets: Vec<(f64, u64)>,
}

impl WeightedHistogram {
    /// A histogram with the given upper bounds (and `+Inf`).
    pub fn new(bounds: &[f64]) -> WeightedHistogram {
        let buckets = bounds.iter().copied().chain(std::iter::once(f64::MAX)).map(|bound| (bound, 0)).collect();
        WeightedHistogram { inner: Arc::new(Mutex::new(WeightedInner { sum: 0.0, count: 0, buckets })) }
    }

    /// A histogram with the end-to-end buckets: 50 ms to 2 min, about 25 % apart from 1 s
    /// to 20 s, where the end-to-end latency of 10 s and 1 m tiles lives.
    pub fn end_to_end() -> WeightedHistogram {
        WeightedHistogram::new(&END_TO_END_BUCKETS)
    }

    /// Records `n` observations of `value`.
    pub fn observe_n(&self, value: f64, n: u64) {
        if n == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.sum += value * n as f64;
        inner.count += n;
        if let Some(bucket) = inner.buckets.iter_mut().find(|(bound, _)| *bound >= value) {
            bucket.1 += n;
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).count
    }

    /// The value under which a fraction `q` of observations fall, as the upper bound of
    /// the bucket holding it (for reports; `None` when empty).
    pub fn quantile_upper_bound(&self, q: f64) -> Option<f64> {
        let inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.count == 0 {
            return None;
        }
        let rank = (q * inner.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bound, n) in &inner.buckets {
            seen += n;
            if seen >= rank {
                return Some(*bound);
            }
        }
        None
    }
}

impl TypedMetric for WeightedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for WeightedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        encoder.encode_histogram::<NoLabelSet>(inner.sum, inner.count, &inner.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_histogram_counts_each_observation_and_encodes() {
        let storage_buckets: Vec<f64> = tessera_runtime::telemetry::storage_buckets().collect();
        let histogram = WeightedHistogram::new(&storage_buckets);
        histogram.observe_n(0.0015, 1000);
        histogram.observe_n(3.0, 10);
        histogram.observe_n(1.0, 0);
        assert_eq!(histogram.count(), 1010);
        assert_eq!(histogram.quantile_upper_bound(0.5), Some(0.002));
        assert_eq!(histogram.quantile_upper_bound(0.999), Some(4.096));
        let mut registry = tessera_runtime::telemetry::Registry::default();
        registry.register("h_seconds", "A test histogram", histogram);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("h_seconds_count 1010"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"0.002\"} 1000"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"+Inf\"} 1010"), "{text}");
    }
}
