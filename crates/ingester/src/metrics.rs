//! Every metric the ingester exports, declared once.
//!
//! Hot paths hold cloned handles ([`TargetMetrics`], [`crate::queue::QueueMetrics`]) and
//! add to them once per batch or request. Labels are typed structs (`ByTarget`,
//! `ByTargetOutcome`, ...; prometheus-client's `EncodeLabelSet`), encoded in field order,
//! with values from closed sets: `target` (the configured sink targets), `resolution` (the
//! storage policies the aggregators use), `reason`, `status`, `outcome`, `worker`.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_ingester_connections_accepted_total` | counter | |
//! | `tessera_ingester_accept_errors_total` | counter | |
//! | `tessera_ingester_heartbeats_total` | counter | |
//! | `tessera_ingester_connections` | gauge | |
//! | `tessera_ingester_frame_errors_total` | counter | `reason` |
//! | `tessera_ingester_batches_received_total`, `_bytes_received_total`, `_tiles_received_total` | counter | |
//! | `tessera_ingester_batch_acks_total` | counter | `status`, `reason` |
//! | `tessera_ingester_tiles_skipped_total` | counter | `reason` |
//! | `tessera_ingester_samples_queued_total` | counter | |
//! | `tessera_ingester_durable_duration_seconds` | histogram | |
//! | `tessera_ingester_intake_lag_seconds` | histogram | `resolution` |
//! | `tessera_ingester_cumulative_series`, `_cumulative_histograms` | gauge | |
//! | `tessera_ingester_queue_bytes`, `_queue_max_bytes`, `_queue_records`, `_queue_segments` | gauge | `target` |
//! | `tessera_ingester_queue_replayed_records_total`, `_queue_corrupt_records_total`, `_queue_fsyncs_total` | counter | `target` |
//! | `tessera_ingester_queue_fsync_errors_total`, `_queue_records_at_risk_total` | counter | `target` |
//! | `tessera_ingester_sink_requests_total` | counter | `target`, `outcome` |
//! | `tessera_ingester_sink_request_duration_seconds` | histogram | `target` |
//! | `tessera_ingester_sink_retries_total` | counter | `target` |
//! | `tessera_ingester_sink_rejected_samples_total` | counter | `target`, `status` |
//! | `tessera_ingester_samples_written_total`, `_records_written_total` | counter | `target` |
//! | `tessera_ingester_worker_busy_seconds_total` | counter | `target`, `worker` |
//! | `tessera_ingester_in_flight_limit`, `_in_flight_requests` | gauge | `target` |
//! | `tessera_ingester_pace_samples_per_second` | gauge | `target` |
//! | `tessera_ingester_file_sink_files_closed_total`, `_file_sink_bad_journal_lines_total`, `_file_sink_histograms_skipped_total` | counter | `target` |
//! | `tessera_ingester_checkpoint_age_seconds` | gauge, computed when scraped | `target` |
//! | `tessera_ingester_checkpoints_total` | counter | `target` |
//! | `tessera_ingester_checkpoint_errors_total` | counter | `target`, `reason` (`write`, `read`, `corrupt`) |
//! | `tessera_ingester_checkpoint_duration_seconds` | histogram | `target` |
//! | `tessera_ingester_checkpoint_series`, `_checkpoint_restored_series` | gauge | `target` |
//! | `tessera_ingester_end_to_end_latency_seconds` | histogram, one observation per tile | `resolution` |
//! | `tessera_ingester_queue_time_seconds` | histogram, one observation per tile | `resolution` |

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use tessera_wire::metrics::ListenerMetrics;

use crate::admit::{SkipReason, SkippedTiles};
use crate::queue::QueueMetrics;
use crate::sink::file::FileSinkMetrics;
use tessera_core::clock::now_ms;

/// Bucket bounds for latencies: 1 ms .. ~65 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// The ingester's latency histogram: storage requests and fsyncs are slower than the
/// wire's acknowledgements, so its buckets start at 1 ms.
fn storage_histogram() -> Histogram {
    Histogram::new(latency_buckets())
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

    /// A histogram with the latency buckets (1 ms .. ~65 s, doubling).
    pub fn latency() -> WeightedHistogram {
        WeightedHistogram::new(&latency_buckets().collect::<Vec<_>>())
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

/// A gauge of the seconds since a moment, computed when scraped (so it grows between
/// updates): the age of the last checkpoint. Starts at its creation.
#[derive(Clone, Debug)]
pub struct AgeGauge {
    since_ms: Arc<AtomicI64>,
}

impl Default for AgeGauge {
    fn default() -> Self {
        AgeGauge { since_ms: Arc::new(AtomicI64::new(now_ms())) }
    }
}

impl AgeGauge {
    /// Counts the age from `unix_ms`.
    pub fn set(&self, unix_ms: i64) {
        self.since_ms.store(unix_ms, Ordering::Relaxed);
    }

    /// Seconds since then (0 for a moment in the future).
    pub fn seconds(&self) -> f64 {
        (now_ms() - self.since_ms.load(Ordering::Relaxed)).max(0) as f64 / 1000.0
    }
}

impl TypedMetric for AgeGauge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for AgeGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.seconds())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// `{reason}`: why tiles gave no sample.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReason {
    reason: &'static str,
}

/// `{status, reason}`: an acknowledgement's status and reason (empty for a batch taken).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByStatusReason {
    status: &'static str,
    reason: &'static str,
}

/// `{resolution}`: a storage policy's resolution (`10s`), as the tile batch names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByResolution {
    resolution: String,
}

/// `{target}`: a configured sink target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTarget {
    target: String,
}

/// `{target, outcome}`: how a storage request ended (`ok`, `rejected`,
/// `histograms_refused`, or a retryable reason).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetOutcome {
    target: String,
    outcome: &'static str,
}

/// `{target, status}`: the HTTP status storage refused samples with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetStatus {
    target: String,
    status: u16,
}

/// `{target, worker}`: a worker of a target's pool, by index.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetWorker {
    target: String,
    worker: usize,
}

/// `{target, reason}`: why a checkpoint failed ([`CheckpointFailure`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetReason {
    target: String,
    reason: &'static str,
}

/// Every ingester metric's name starts with this.
pub const PREFIX: &str = "tessera_ingester_";

tessera_runtime::metrics! {
    /// The ingester's metrics.
    pub struct Metrics {
        /// Empty tile batches acknowledged without queueing (aggregators keeping an idle connection open)
        pub heartbeats: Counter,
        /// Tile batches received
        pub batches_received: Counter,
        /// Frame bytes received after the handshake
        pub bytes_received: Counter,
        /// Tiles received
        pub tiles_received: Counter,
        /// Acknowledgements sent, per status and reason
        batch_acks: Family<ByStatusReason, Counter> = refusing_acks(),
        /// Tiles that gave no sample, per reason
        tiles_skipped: Family<ByReason, Counter> = skip_reasons(),
        /// Samples made durable in the queue
        pub samples_queued: Counter,
        /// Time from a batch read to its acknowledgement (convert, write, fsync)
        pub durable_duration: Histogram [seconds] = storage_histogram(),
        /// Time from the aggregator's flush to the batch's receipt, per resolution
        intake_lag: Family<ByResolution, Histogram> [seconds] = Family::new_with_constructor(storage_histogram),
        /// Series with a running total (counters, sums, counts) in memory
        pub cumulative_series: Gauge,
        /// Native histograms (cumulative sketches) in memory
        pub cumulative_histograms: Gauge,
        /// Bytes of queue segment files, per target
        queue_bytes: Family<ByTarget, Gauge>,
        /// The queue's byte bound, per target
        queue_max_bytes: Family<ByTarget, Gauge>,
        /// Queued records not yet written to storage, per target
        queue_records: Family<ByTarget, Gauge>,
        /// Queue segment files, per target
        queue_segments: Family<ByTarget, Gauge>,
        /// Records found in the queue at start, per target
        queue_replayed_records: Family<ByTarget, Counter>,
        /// Torn or corrupt queue records cut off, per target
        queue_corrupt_records: Family<ByTarget, Counter>,
        /// Fsyncs of queue segments, per target
        queue_fsyncs: Family<ByTarget, Counter>,
        /// Failed fsyncs of queue segments (each seals its segment), per target
        queue_fsync_errors: Family<ByTarget, Counter>,
        /// Acknowledged records (fsync = interval) not known to be on disk when an fsync failed; still
        /// delivered, per target
        queue_records_at_risk: Family<ByTarget, Counter>,
        /// Storage requests, per target and outcome
        sink_requests: Family<ByTargetOutcome, Counter>,
        /// Duration of one storage request, per target
        sink_request_duration: Family<ByTarget, Histogram> [seconds] = Family::new_with_constructor(storage_histogram),
        /// Storage requests sent again after a retryable error, per target
        sink_retries: Family<ByTarget, Counter>,
        /// Remote-write TLS or bearer token files that changed on disk but did not load (the
        /// previous ones stay in use)
        pub sink_reload_errors: Counter,
        /// Samples storage refused for good, per target and status
        sink_rejected_samples: Family<ByTargetStatus, Counter>,
        /// Samples storage acknowledged, per target
        samples_written: Family<ByTarget, Counter>,
        /// Queue records fully written to storage, per target
        records_written: Family<ByTarget, Counter>,
        /// Time each worker spent on requests (sending, pacing, backing off)
        worker_busy: Family<ByTargetWorker, Counter<f64, AtomicU64>> [seconds],
        /// Current adaptive limit on storage requests in flight, per target
        in_flight_limit: Family<ByTarget, Gauge>,
        /// Storage requests in flight, per target
        in_flight_requests: Family<ByTarget, Gauge>,
        /// Samples written per second over the last second, per target
        pace: Family<ByTarget, Gauge<f64, AtomicU64>> [samples_per_second],
        /// OpenMetrics files closed, per target
        file_sink_files_closed: Family<ByTarget, Counter>,
        /// Journal lines skipped when closing a file (torn by a crash), per target
        file_sink_bad_journal_lines: Family<ByTarget, Counter>,
        /// Native histogram samples in a file target's queue (kept from a remote-write configuration), not
        /// written
        file_sink_histograms_skipped: Family<ByTarget, Counter>,
        /// Storage acknowledgement time minus tile end, one observation per tile, per resolution
        end_to_end_latency: Family<ByResolution, WeightedHistogram> [seconds] = Family::new_with_constructor(WeightedHistogram::end_to_end),
        /// Time from receipt to the first storage request of a tile's record, one observation per tile, per
        /// resolution
        queue_time: Family<ByResolution, WeightedHistogram> [seconds] = Family::new_with_constructor(WeightedHistogram::end_to_end),
        /// Time since the last checkpoint of the running totals was made durable (or since start, without one),
        /// per target
        checkpoint_age: Family<ByTarget, AgeGauge> [seconds],
        /// Checkpoints of the running totals made durable, per target
        checkpoints: Family<ByTarget, Counter>,
        /// Checkpoints not written, or not read or refused at start (totals then start from the queued
        /// records), per target and reason
        checkpoint_errors: Family<ByTargetReason, Counter>,
        /// Time to take one checkpoint: encoding on the intake writer thread and the durable file write, per
        /// target
        checkpoint_duration: Family<ByTarget, Histogram> [seconds] = Family::new_with_constructor(storage_histogram),
        /// Running totals in the last checkpoint written, per target
        checkpoint_series: Family<ByTarget, Gauge>,
        /// Running totals restored at start (from the checkpoint and the queued records after it), per target
        checkpoint_restored_series: Family<ByTarget, Gauge>,;
        /// The wire listener's metrics (connections from aggregators)
        pub listener: ListenerMetrics = ListenerMetrics::default().with_frame_error_reasons(&FRAME_ERROR_REASONS),
    }
}

/// Every `reason` of `frame_errors_total`: the inbound side's, and the writer's.
pub const FRAME_ERROR_REASONS: [&str; 9] = [
    "handshake",
    "idle_timeout",
    "too_large",
    "io",
    "too_many_connections",
    "malformed",
    "empty",
    "unexpected_frame",
    "tls",
];

/// Every `(status, reason)` of `batch_acks_total` other than `ok`.
pub const REFUSING_ACKS: [(&str, &str); 4] = [
    ("retryable", "queue_full"),
    ("retryable", "queue_io"),
    ("permanent", "invalid_batch"),
    ("permanent", "unexpected_frame"),
];

/// The `reason` of `checkpoint_errors_total` (see [`crate::intake::checkpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointFailure {
    /// A checkpoint could not be written (the previous one stays).
    Write = 0,
    /// The checkpoint found at start could not be read.
    Read = 1,
    /// The checkpoint found at start was read and refused.
    Corrupt = 2,
}

impl CheckpointFailure {
    /// Every reason, in label order.
    pub const ALL: [CheckpointFailure; 3] =
        [CheckpointFailure::Write, CheckpointFailure::Read, CheckpointFailure::Corrupt];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            CheckpointFailure::Write => "write",
            CheckpointFailure::Read => "read",
            CheckpointFailure::Corrupt => "corrupt",
        }
    }
}

/// Acknowledgements, with every refusal exported from the start at 0: "nothing
/// refused" reads as 0, not as no data, so alerts and dashboards need no `or vector(0)`.
fn refusing_acks() -> Family<ByStatusReason, Counter> {
    let acks = Family::<ByStatusReason, Counter>::default();
    for (status, reason) in REFUSING_ACKS {
        let _ = acks.get_or_create(&ByStatusReason { status, reason });
    }
    acks
}

/// Skipped tiles, with every reason exported from the start at 0.
fn skip_reasons() -> Family<ByReason, Counter> {
    let skipped = Family::<ByReason, Counter>::default();
    for reason in SkipReason::ALL {
        let _ = skipped.get_or_create(&ByReason { reason: reason.as_str() });
    }
    skipped
}

impl Metrics {
    /// Counts an acknowledgement (`reason` empty for a batch taken).
    pub fn ack(&self, status: &'static str, reason: &'static str) {
        self.batch_acks.get_or_create(&ByStatusReason { status, reason }).inc();
    }

    /// Counts the tiles of one batch skipped, per reason.
    pub fn tiles_skipped(&self, skipped: &SkippedTiles) {
        for (reason, tiles) in skipped.by_reason() {
            if tiles > 0 {
                self.tiles_skipped.get_or_create(&ByReason { reason: reason.as_str() }).inc_by(tiles);
            }
        }
    }

    /// Records the lag from the aggregator's flush to receipt.
    pub fn intake_lag(&self, resolution: &str, seconds: f64) {
        self.intake_lag.get_or_create(&ByResolution { resolution: resolution.to_owned() }).observe(seconds);
    }

    /// The end-to-end latency histogram of `resolution`.
    pub fn end_to_end(&self, resolution: &str) -> WeightedHistogram {
        self.end_to_end_latency.get_or_create(&ByResolution { resolution: resolution.to_owned() }).clone()
    }

    /// The queue-time histogram of `resolution`.
    pub fn queue_time(&self, resolution: &str) -> WeightedHistogram {
        self.queue_time.get_or_create(&ByResolution { resolution: resolution.to_owned() }).clone()
    }

    /// Handles of one target's queue.
    pub fn queue(&self, target: &str, max_bytes: u64) -> QueueMetrics {
        let by_target = ByTarget { target: target.to_owned() };
        self.queue_max_bytes.get_or_create(&by_target).set(max_bytes as i64);
        QueueMetrics {
            bytes: self.queue_bytes.get_or_create(&by_target).clone(),
            records: self.queue_records.get_or_create(&by_target).clone(),
            segments: self.queue_segments.get_or_create(&by_target).clone(),
            replayed_records: self.queue_replayed_records.get_or_create(&by_target).clone(),
            corrupt_records: self.queue_corrupt_records.get_or_create(&by_target).clone(),
            fsyncs: self.queue_fsyncs.get_or_create(&by_target).clone(),
            fsync_errors: self.queue_fsync_errors.get_or_create(&by_target).clone(),
            records_at_risk: self.queue_records_at_risk.get_or_create(&by_target).clone(),
        }
    }

    /// Handles of one target's file sink.
    pub fn file_sink(&self, target: &str) -> FileSinkMetrics {
        let by_target = ByTarget { target: target.to_owned() };
        FileSinkMetrics {
            files_closed: self.file_sink_files_closed.get_or_create(&by_target).clone(),
            bad_journal_lines: self.file_sink_bad_journal_lines.get_or_create(&by_target).clone(),
            histograms_skipped: self.file_sink_histograms_skipped.get_or_create(&by_target).clone(),
        }
    }

    /// Handles of one target's checkpoints; every error reason is exported at 0.
    pub fn checkpoint(&self, target: &str) -> CheckpointMetrics {
        let by_target = ByTarget { target: target.to_owned() };
        let errors = CheckpointFailure::ALL.map(|failure| {
            let by_target_reason = ByTargetReason { target: target.to_owned(), reason: failure.label() };
            self.checkpoint_errors.get_or_create(&by_target_reason).clone()
        });
        CheckpointMetrics {
            age: self.checkpoint_age.get_or_create(&by_target).clone(),
            taken: self.checkpoints.get_or_create(&by_target).clone(),
            errors,
            duration: self.checkpoint_duration.get_or_create(&by_target).clone(),
            series: self.checkpoint_series.get_or_create(&by_target).clone(),
            restored_series: self.checkpoint_restored_series.get_or_create(&by_target).clone(),
        }
    }

    /// Handles of one target's workers.
    pub fn target(&self, target: &str) -> TargetMetrics {
        let by_target = ByTarget { target: target.to_owned() };
        // Storage refuses samples for good with 400 (Prometheus: out of order, invalid);
        // exported at 0 from the start. Other 4xx statuses appear when they happen.
        let _ = self.sink_rejected_samples.get_or_create(&ByTargetStatus { target: target.to_owned(), status: 400 });
        TargetMetrics {
            target: target.to_owned(),
            requests: self.sink_requests.clone(),
            request_duration: self.sink_request_duration.get_or_create(&by_target).clone(),
            retries: self.sink_retries.get_or_create(&by_target).clone(),
            rejected_samples: self.sink_rejected_samples.clone(),
            samples_written: self.samples_written.get_or_create(&by_target).clone(),
            records_written: self.records_written.get_or_create(&by_target).clone(),
            worker_busy: self.worker_busy.clone(),
            in_flight_limit: self.in_flight_limit.get_or_create(&by_target).clone(),
            in_flight: self.in_flight_requests.get_or_create(&by_target).clone(),
            pace: self.pace.get_or_create(&by_target).clone(),
            metrics: self.clone(),
        }
    }
}

/// Handles of one target's checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointMetrics {
    /// Time since the last durable checkpoint.
    pub age: AgeGauge,
    /// Checkpoints made durable.
    pub taken: Counter,
    /// Errors, by [`CheckpointFailure`].
    errors: [Counter; 3],
    /// Encoding plus writing one checkpoint.
    pub duration: Histogram,
    /// Running totals in the last checkpoint written.
    pub series: Gauge,
    /// Running totals restored at start.
    pub restored_series: Gauge,
}

impl CheckpointMetrics {
    /// Counts an error.
    pub fn error(&self, failure: CheckpointFailure) {
        self.errors[failure as usize].inc();
    }

    /// Errors counted for `failure`.
    pub fn errors(&self, failure: CheckpointFailure) -> u64 {
        self.errors[failure as usize].get()
    }
}

/// Handles of one target's workers.
#[derive(Clone)]
pub struct TargetMetrics {
    target: String,
    requests: Family<ByTargetOutcome, Counter>,
    /// Duration of one storage request.
    pub request_duration: Histogram,
    /// Requests sent again.
    pub retries: Counter,
    rejected_samples: Family<ByTargetStatus, Counter>,
    /// Samples acknowledged by storage.
    pub samples_written: Counter,
    /// Records fully written.
    pub records_written: Counter,
    worker_busy: Family<ByTargetWorker, Counter<f64, AtomicU64>>,
    /// The adaptive limit.
    pub in_flight_limit: Gauge,
    /// Requests in flight.
    pub in_flight: Gauge,
    /// Samples written over the last second.
    pub pace: Gauge<f64, AtomicU64>,
    metrics: Metrics,
}

impl TargetMetrics {
    /// The target's name.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Counts a request by outcome (`ok`, `rejected`, `histograms_refused`, or a retryable
    /// reason).
    pub fn request(&self, outcome: &'static str) {
        self.requests.get_or_create(&ByTargetOutcome { target: self.target.clone(), outcome }).inc();
    }

    /// Counts samples refused for good with `status`.
    pub fn rejected(&self, status: u16, samples: u64) {
        self.rejected_samples.get_or_create(&ByTargetStatus { target: self.target.clone(), status }).inc_by(samples);
    }

    /// The busy-time counter of worker `index`.
    pub fn worker_busy(&self, index: usize) -> Counter<f64, AtomicU64> {
        self.worker_busy.get_or_create(&ByTargetWorker { target: self.target.clone(), worker: index }).clone()
    }

    /// The ingester-wide metrics (latency histograms).
    pub fn all(&self) -> &Metrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_histogram_counts_each_observation_and_encodes() {
        let histogram = WeightedHistogram::latency();
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

    #[test]
    fn labels_encode_in_field_order_with_the_values_dashboards_read() {
        let telemetry = tessera_runtime::Telemetry::new("ingester", "test");
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register(registry, PREFIX));
        metrics.ack("ok", "");
        metrics.intake_lag("10s", 0.5);
        metrics.checkpoint("default").error(CheckpointFailure::Read);
        let target = metrics.target("default");
        target.request("status_5xx");
        target.rejected(500, 3);
        target.worker_busy(2).inc_by(1.5);
        let text = telemetry.encode().unwrap();
        for line in [
            r#"tessera_ingester_batch_acks_total{status="ok",reason=""} 1"#,
            r#"tessera_ingester_batch_acks_total{status="retryable",reason="queue_full"} 0"#,
            r#"tessera_ingester_intake_lag_seconds_count{resolution="10s"} 1"#,
            r#"tessera_ingester_checkpoint_errors_total{target="default",reason="read"} 1"#,
            r#"tessera_ingester_sink_requests_total{target="default",outcome="status_5xx"} 1"#,
            r#"tessera_ingester_sink_rejected_samples_total{target="default",status="400"} 0"#,
            r#"tessera_ingester_sink_rejected_samples_total{target="default",status="500"} 3"#,
            r#"tessera_ingester_worker_busy_seconds_total{target="default",worker="2"} 1.5"#,
            r#"tessera_ingester_samples_written_total{target="default"} 0"#,
        ] {
            assert!(text.lines().any(|exported| exported == line), "{line} not in\n{text}");
        }
    }
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule() {
        let telemetry = tessera_runtime::Telemetry::new("ingester", "test");
        telemetry.with_registry(|registry| super::Metrics::default().register(registry, super::PREFIX));
        let tier = crate::tier::TierMetrics::default();
        telemetry.with_registry(|registry| tier.register(registry, super::PREFIX));
        let families = tessera_runtime::telemetry::naming::check_registry(&telemetry, "ingester");
        assert!(families.as_ref().is_ok_and(|count| *count >= 20), "{families:#?}");
    }
}
