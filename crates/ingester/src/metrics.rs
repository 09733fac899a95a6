//! Every metric the ingester exports, declared once.
//!
//! Hot paths hold cloned handles ([`TargetMetrics`], [`crate::queue::QueueMetrics`]) and
//! add to them once per batch or request. Labels come from closed sets: `target` (the
//! configured sink targets), `resolution` (the storage policies the aggregators use),
//! `reason`, `status`, `outcome`, `worker`.
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

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::queue::QueueMetrics;
use crate::sink::file::FileSinkMetrics;
use tessera_core::clock::now_ms;

type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| (*key, (*value).to_owned())).collect()
}

/// Bucket bounds for latencies: 1 ms .. ~65 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

fn latency_histogram() -> Histogram {
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

/// The ingester's metrics.
#[derive(Clone)]
pub struct Metrics {
    /// Connections accepted on the wire listener.
    pub connections_accepted: Counter,
    /// Failed `accept` calls on the wire listener (out of file descriptors and the like).
    pub accept_errors: Counter,
    /// Empty tile batches (aggregators' heartbeats) acknowledged.
    pub heartbeats: Counter,
    /// Connections open now.
    pub connections: Gauge,
    frame_errors: Family<Labels, Counter>,
    /// Tile batches received.
    pub batches_received: Counter,
    /// Frame bytes received.
    pub bytes_received: Counter,
    /// Tiles received.
    pub tiles_received: Counter,
    batch_acks: Family<Labels, Counter>,
    tiles_skipped: Family<Labels, Counter>,
    /// Samples made durable (batches acknowledged Ok).
    pub samples_queued: Counter,
    /// From a batch fully read to its acknowledgement (conversion, write, fsync).
    pub durable_duration: Histogram,
    intake_lag: Family<Labels, Histogram>,
    /// Series with a running total in memory.
    pub cumulative_series: Gauge,
    /// Native histograms kept in memory (each with its buckets).
    pub cumulative_histograms: Gauge,
    queue_bytes: Family<Labels, Gauge>,
    queue_max_bytes: Family<Labels, Gauge>,
    queue_records: Family<Labels, Gauge>,
    queue_segments: Family<Labels, Gauge>,
    queue_replayed: Family<Labels, Counter>,
    queue_corrupt: Family<Labels, Counter>,
    queue_fsyncs: Family<Labels, Counter>,
    queue_fsync_errors: Family<Labels, Counter>,
    queue_at_risk: Family<Labels, Counter>,
    sink_requests: Family<Labels, Counter>,
    sink_request_duration: Family<Labels, Histogram>,
    sink_retries: Family<Labels, Counter>,
    sink_rejected_samples: Family<Labels, Counter>,
    samples_written: Family<Labels, Counter>,
    records_written: Family<Labels, Counter>,
    worker_busy: Family<Labels, Counter<f64, AtomicU64>>,
    in_flight_limit: Family<Labels, Gauge>,
    in_flight: Family<Labels, Gauge>,
    pace: Family<Labels, Gauge<f64, AtomicU64>>,
    files_closed: Family<Labels, Counter>,
    bad_journal_lines: Family<Labels, Counter>,
    histograms_skipped: Family<Labels, Counter>,
    end_to_end: Family<Labels, WeightedHistogram>,
    queue_time: Family<Labels, WeightedHistogram>,
    checkpoint_age: Family<Labels, AgeGauge>,
    checkpoints: Family<Labels, Counter>,
    checkpoint_errors: Family<Labels, Counter>,
    checkpoint_duration: Family<Labels, Histogram>,
    checkpoint_series: Family<Labels, Gauge>,
    checkpoint_restored_series: Family<Labels, Gauge>,
}

/// Every `reason` of `frame_errors_total`: the inbound side's, and the writer's.
pub const FRAME_ERROR_REASONS: [&str; 8] =
    ["handshake", "idle_timeout", "too_large", "io", "too_many_connections", "malformed", "empty", "unexpected_frame"];

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

/// Every `reason` of `tiles_skipped_total` (see [`crate::mapping`]).
pub const SKIP_REASONS: [&str; 7] =
    ["unknown_type", "invalid_aggregate", "type_mismatch", "late", "duplicate", "conflict", "name_collision"];

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            connections_accepted: Counter::default(),
            accept_errors: Counter::default(),
            heartbeats: Counter::default(),
            connections: Gauge::default(),
            frame_errors: Family::default(),
            batches_received: Counter::default(),
            bytes_received: Counter::default(),
            tiles_received: Counter::default(),
            batch_acks: Family::default(),
            tiles_skipped: Family::default(),
            samples_queued: Counter::default(),
            durable_duration: latency_histogram(),
            intake_lag: Family::new_with_constructor(latency_histogram),
            cumulative_series: Gauge::default(),
            cumulative_histograms: Gauge::default(),
            queue_bytes: Family::default(),
            queue_max_bytes: Family::default(),
            queue_records: Family::default(),
            queue_segments: Family::default(),
            queue_replayed: Family::default(),
            queue_corrupt: Family::default(),
            queue_fsyncs: Family::default(),
            queue_fsync_errors: Family::default(),
            queue_at_risk: Family::default(),
            sink_requests: Family::default(),
            sink_request_duration: Family::new_with_constructor(latency_histogram),
            sink_retries: Family::default(),
            sink_rejected_samples: Family::default(),
            samples_written: Family::default(),
            records_written: Family::default(),
            worker_busy: Family::default(),
            in_flight_limit: Family::default(),
            in_flight: Family::default(),
            pace: Family::default(),
            files_closed: Family::default(),
            bad_journal_lines: Family::default(),
            histograms_skipped: Family::default(),
            end_to_end: Family::new_with_constructor(WeightedHistogram::end_to_end),
            queue_time: Family::new_with_constructor(WeightedHistogram::end_to_end),
            checkpoint_age: Family::default(),
            checkpoints: Family::default(),
            checkpoint_errors: Family::default(),
            checkpoint_duration: Family::new_with_constructor(latency_histogram),
            checkpoint_series: Family::default(),
            checkpoint_restored_series: Family::default(),
        };
        // Every closed-set reason is exported from the start, at 0: "nothing refused"
        // reads as 0, not as no data, so alerts and dashboards need no `or vector(0)`.
        for reason in FRAME_ERROR_REASONS {
            let _ = metrics.frame_errors.get_or_create(&labels(&[("reason", reason)]));
        }
        for (status, reason) in REFUSING_ACKS {
            let _ = metrics.batch_acks.get_or_create(&labels(&[("status", status), ("reason", reason)]));
        }
        for reason in SKIP_REASONS {
            let _ = metrics.tiles_skipped.get_or_create(&labels(&[("reason", reason)]));
        }
        metrics
    }
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "tessera_ingester_connections_accepted",
            "Wire connections accepted",
            self.connections_accepted.clone(),
        );
        r.register(
            "tessera_ingester_accept_errors",
            "Failed accept calls on the wire listener",
            self.accept_errors.clone(),
        );
        r.register(
            "tessera_ingester_heartbeats",
            "Empty tile batches acknowledged without queueing (aggregators keeping an idle connection open)",
            self.heartbeats.clone(),
        );
        r.register("tessera_ingester_connections", "Wire connections open", self.connections.clone());
        r.register(
            "tessera_ingester_frame_errors",
            "Frames refused, per reason; the connection is closed",
            self.frame_errors.clone(),
        );
        r.register("tessera_ingester_batches_received", "Tile batches received", self.batches_received.clone());
        r.register(
            "tessera_ingester_bytes_received",
            "Frame bytes received after the handshake",
            self.bytes_received.clone(),
        );
        r.register("tessera_ingester_tiles_received", "Tiles received", self.tiles_received.clone());
        r.register(
            "tessera_ingester_batch_acks",
            "Acknowledgements sent, per status and reason",
            self.batch_acks.clone(),
        );
        r.register(
            "tessera_ingester_tiles_skipped",
            "Tiles that gave no sample, per reason",
            self.tiles_skipped.clone(),
        );
        r.register("tessera_ingester_samples_queued", "Samples made durable in the queue", self.samples_queued.clone());
        r.register(
            "tessera_ingester_durable_duration_seconds",
            "Time from a batch read to its acknowledgement (convert, write, fsync)",
            self.durable_duration.clone(),
        );
        r.register(
            "tessera_ingester_intake_lag_seconds",
            "Time from the aggregator's flush to the batch's receipt, per resolution",
            self.intake_lag.clone(),
        );
        r.register(
            "tessera_ingester_cumulative_series",
            "Series with a running total (counters, sums, counts) in memory",
            self.cumulative_series.clone(),
        );
        r.register(
            "tessera_ingester_cumulative_histograms",
            "Native histograms (cumulative sketches) in memory",
            self.cumulative_histograms.clone(),
        );
        r.register(
            "tessera_ingester_queue_bytes",
            "Bytes of queue segment files, per target",
            self.queue_bytes.clone(),
        );
        r.register(
            "tessera_ingester_queue_max_bytes",
            "The queue's byte bound, per target",
            self.queue_max_bytes.clone(),
        );
        r.register(
            "tessera_ingester_queue_records",
            "Queued records not yet written to storage, per target",
            self.queue_records.clone(),
        );
        r.register("tessera_ingester_queue_segments", "Queue segment files, per target", self.queue_segments.clone());
        r.register(
            "tessera_ingester_queue_replayed_records",
            "Records found in the queue at start, per target",
            self.queue_replayed.clone(),
        );
        r.register(
            "tessera_ingester_queue_corrupt_records",
            "Torn or corrupt queue records cut off, per target",
            self.queue_corrupt.clone(),
        );
        r.register("tessera_ingester_queue_fsyncs", "Fsyncs of queue segments, per target", self.queue_fsyncs.clone());
        r.register(
            "tessera_ingester_queue_fsync_errors",
            "Failed fsyncs of queue segments (each seals its segment), per target",
            self.queue_fsync_errors.clone(),
        );
        r.register(
            "tessera_ingester_queue_records_at_risk",
            "Acknowledged records (fsync = interval) not known to be on disk when an fsync failed; still delivered, per target",
            self.queue_at_risk.clone(),
        );
        r.register(
            "tessera_ingester_sink_requests",
            "Storage requests, per target and outcome",
            self.sink_requests.clone(),
        );
        r.register(
            "tessera_ingester_sink_request_duration_seconds",
            "Duration of one storage request, per target",
            self.sink_request_duration.clone(),
        );
        r.register(
            "tessera_ingester_sink_retries",
            "Storage requests sent again after a retryable error, per target",
            self.sink_retries.clone(),
        );
        r.register(
            "tessera_ingester_sink_rejected_samples",
            "Samples storage refused for good, per target and status",
            self.sink_rejected_samples.clone(),
        );
        r.register(
            "tessera_ingester_samples_written",
            "Samples storage acknowledged, per target",
            self.samples_written.clone(),
        );
        r.register(
            "tessera_ingester_records_written",
            "Queue records fully written to storage, per target",
            self.records_written.clone(),
        );
        r.register(
            "tessera_ingester_worker_busy_seconds",
            "Time each worker spent on requests (sending, pacing, backing off)",
            self.worker_busy.clone(),
        );
        r.register(
            "tessera_ingester_in_flight_limit",
            "Current adaptive limit on storage requests in flight, per target",
            self.in_flight_limit.clone(),
        );
        r.register(
            "tessera_ingester_in_flight_requests",
            "Storage requests in flight, per target",
            self.in_flight.clone(),
        );
        r.register(
            "tessera_ingester_pace_samples_per_second",
            "Samples written per second over the last second, per target",
            self.pace.clone(),
        );
        r.register(
            "tessera_ingester_file_sink_files_closed",
            "OpenMetrics files closed, per target",
            self.files_closed.clone(),
        );
        r.register(
            "tessera_ingester_file_sink_bad_journal_lines",
            "Journal lines skipped when closing a file (torn by a crash), per target",
            self.bad_journal_lines.clone(),
        );
        r.register(
            "tessera_ingester_file_sink_histograms_skipped",
            "Native histogram samples in a file target's queue (kept from a remote-write configuration), not written",
            self.histograms_skipped.clone(),
        );
        r.register(
            "tessera_ingester_end_to_end_latency_seconds",
            "Storage acknowledgement time minus tile end, one observation per tile, per resolution",
            self.end_to_end.clone(),
        );
        r.register("tessera_ingester_queue_time_seconds", "Time from receipt to the first storage request of a tile's record, one observation per tile, per resolution", self.queue_time.clone());
        r.register(
            "tessera_ingester_checkpoint_age_seconds",
            "Time since the last checkpoint of the running totals was made durable (or since start, without one), per target",
            self.checkpoint_age.clone(),
        );
        r.register(
            "tessera_ingester_checkpoints",
            "Checkpoints of the running totals made durable, per target",
            self.checkpoints.clone(),
        );
        r.register(
            "tessera_ingester_checkpoint_errors",
            "Checkpoints not written, or not read or refused at start (totals then start from the queued records), per target and reason",
            self.checkpoint_errors.clone(),
        );
        r.register(
            "tessera_ingester_checkpoint_duration_seconds",
            "Time to take one checkpoint: encoding on the intake writer thread and the durable file write, per target",
            self.checkpoint_duration.clone(),
        );
        r.register(
            "tessera_ingester_checkpoint_series",
            "Running totals in the last checkpoint written, per target",
            self.checkpoint_series.clone(),
        );
        r.register(
            "tessera_ingester_checkpoint_restored_series",
            "Running totals restored at start (from the checkpoint and the queued records after it), per target",
            self.checkpoint_restored_series.clone(),
        );
    }

    /// Counts a refused frame.
    pub fn frame_error(&self, reason: &str) {
        self.frame_errors.get_or_create(&labels(&[("reason", reason)])).inc();
    }

    /// Counts an acknowledgement.
    pub fn ack(&self, status: &str, reason: &str) {
        self.batch_acks.get_or_create(&labels(&[("status", status), ("reason", reason)])).inc();
    }

    /// Counts skipped tiles.
    pub fn tiles_skipped(&self, reason: &str, tiles: u64) {
        if tiles > 0 {
            self.tiles_skipped.get_or_create(&labels(&[("reason", reason)])).inc_by(tiles);
        }
    }

    /// Records the lag from the aggregator's flush to receipt.
    pub fn intake_lag(&self, resolution: &str, seconds: f64) {
        self.intake_lag.get_or_create(&labels(&[("resolution", resolution)])).observe(seconds);
    }

    /// The end-to-end latency histogram of `resolution`.
    pub fn end_to_end(&self, resolution: &str) -> WeightedHistogram {
        self.end_to_end.get_or_create(&labels(&[("resolution", resolution)])).clone()
    }

    /// The queue-time histogram of `resolution`.
    pub fn queue_time(&self, resolution: &str) -> WeightedHistogram {
        self.queue_time.get_or_create(&labels(&[("resolution", resolution)])).clone()
    }

    /// Handles of one target's queue.
    pub fn queue(&self, target: &str, max_bytes: u64) -> QueueMetrics {
        let by_target = labels(&[("target", target)]);
        self.queue_max_bytes.get_or_create(&by_target).set(max_bytes as i64);
        QueueMetrics {
            bytes: self.queue_bytes.get_or_create(&by_target).clone(),
            records: self.queue_records.get_or_create(&by_target).clone(),
            segments: self.queue_segments.get_or_create(&by_target).clone(),
            replayed_records: self.queue_replayed.get_or_create(&by_target).clone(),
            corrupt_records: self.queue_corrupt.get_or_create(&by_target).clone(),
            fsyncs: self.queue_fsyncs.get_or_create(&by_target).clone(),
            fsync_errors: self.queue_fsync_errors.get_or_create(&by_target).clone(),
            records_at_risk: self.queue_at_risk.get_or_create(&by_target).clone(),
        }
    }

    /// Handles of one target's file sink.
    pub fn file_sink(&self, target: &str) -> FileSinkMetrics {
        let by_target = labels(&[("target", target)]);
        FileSinkMetrics {
            files_closed: self.files_closed.get_or_create(&by_target).clone(),
            bad_journal_lines: self.bad_journal_lines.get_or_create(&by_target).clone(),
            histograms_skipped: self.histograms_skipped.get_or_create(&by_target).clone(),
        }
    }

    /// Handles of one target's checkpoints; every error reason is exported at 0.
    pub fn checkpoint(&self, target: &str) -> CheckpointMetrics {
        let by_target = labels(&[("target", target)]);
        let errors = CheckpointFailure::ALL.map(|failure| {
            self.checkpoint_errors.get_or_create(&labels(&[("target", target), ("reason", failure.label())])).clone()
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
        let by_target = labels(&[("target", target)]);
        // Storage refuses samples for good with 400 (Prometheus: out of order, invalid);
        // exported at 0 from the start. Other 4xx statuses appear when they happen.
        let _ = self.sink_rejected_samples.get_or_create(&labels(&[("target", target), ("status", "400")]));
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
            in_flight: self.in_flight.get_or_create(&by_target).clone(),
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
    requests: Family<Labels, Counter>,
    /// Duration of one storage request.
    pub request_duration: Histogram,
    /// Requests sent again.
    pub retries: Counter,
    rejected_samples: Family<Labels, Counter>,
    /// Samples acknowledged by storage.
    pub samples_written: Counter,
    /// Records fully written.
    pub records_written: Counter,
    worker_busy: Family<Labels, Counter<f64, AtomicU64>>,
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

    /// Counts a request by outcome (`ok`, `rejected`, or a retryable reason).
    pub fn request(&self, outcome: &str) {
        self.requests.get_or_create(&labels(&[("target", &self.target), ("outcome", outcome)])).inc();
    }

    /// Counts samples refused for good with `status`.
    pub fn rejected(&self, status: u16, samples: u64) {
        let status = status.to_string();
        self.rejected_samples.get_or_create(&labels(&[("target", &self.target), ("status", &status)])).inc_by(samples);
    }

    /// The busy-time counter of worker `index`.
    pub fn worker_busy(&self, index: usize) -> Counter<f64, AtomicU64> {
        let worker = index.to_string();
        self.worker_busy.get_or_create(&labels(&[("target", &self.target), ("worker", &worker)])).clone()
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
        let mut registry = Registry::default();
        registry.register("h_seconds", "A test histogram", histogram);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("h_seconds_count 1010"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"0.002\"} 1000"), "{text}");
        assert!(text.contains("h_seconds_bucket{le=\"+Inf\"} 1010"), "{text}");
    }
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule() {
        let telemetry = tessera_runtime::Telemetry::new("ingester", "test");
        telemetry.with_registry(|registry| super::Metrics::default().register(registry));
        let tier = crate::tier::TierMetrics::new();
        telemetry.with_registry(|registry| tier.register(registry));
        let families = tessera_runtime::telemetry::naming::check_registry(&telemetry, "ingester");
        assert!(families.as_ref().is_ok_and(|count| *count >= 20), "{families:#?}");
    }
}
