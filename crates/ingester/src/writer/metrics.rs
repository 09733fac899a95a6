//! The writer's metrics: tile batches received and acknowledged, what they gave the
//! queue, the running totals in memory, and each target's
//! checkpoints of those totals ([`CheckpointMetrics`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use tessera_core::clock::now_ms;
use tessera_proto::{AckReason, AckStatus};
use tessera_runtime::telemetry::labels::{ByReason, ByResolution, ByTarget};
use tessera_runtime::telemetry::{storage_histogram, zeroed_family};

use crate::admit::{SkipReason, SkippedTiles};

/// `{status, reason}`: an acknowledgement's status and reason (empty for a batch taken).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByStatusReason {
    status: &'static str,
    reason: &'static str,
}

/// `{target, reason}`: why a checkpoint failed ([`CheckpointFailure`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetReason {
    target: String,
    reason: &'static str,
}

tessera_runtime::metrics! {
    /// The writer thread's metrics.
    pub struct WriterMetrics {
        /// Empty tile batches acknowledged without queueing (aggregators keeping an idle connection open)
        pub heartbeats: Counter,
        /// Tile batches received
        pub batches_received: Counter,
        /// Frame bytes received after the handshake
        pub bytes_received: Counter,
        /// Tiles received
        pub tiles_received: Counter,
        /// Acknowledgements sent, per status and reason
        batch_acks: Family<ByStatusReason, Counter> = zeroed_family(WRITER_REFUSALS.map(|reason| by_ack(Some(reason)))),
        /// Tiles that gave no sample, per reason
        tiles_skipped: Family<ByReason, Counter> = zeroed_family(SkipReason::ALL.map(|reason| ByReason { reason: reason.as_str() })),
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
        /// Running totals evicted near the memory limit (the least recently written tenth, once a
        /// second); their series start over with an explicit reset
        pub totals_evicted: Counter,
        /// Checkpoints not written, or not read or refused at start (totals then start from the queued
        /// records), per target and reason
        checkpoint_errors: Family<ByTargetReason, Counter>;
        /// Each target's checkpoints
        checkpoints: CheckpointFamilies,
    }
}

/// The reasons the writer refuses a batch with, each exported in `batch_acks_total`
/// from the start at 0 (under the status [`AckReason::status`] gives it).
const WRITER_REFUSALS: [AckReason; 3] = [AckReason::QueueFull, AckReason::QueueIo, AckReason::InvalidBatch];

/// The labels of an acknowledgement: `None` for a batch taken (status `ok`, reason empty).
fn by_ack(reason: Option<AckReason>) -> ByStatusReason {
    let status = match reason.map_or(AckStatus::Ok, AckReason::status) {
        AckStatus::Ok => "ok",
        AckStatus::Retryable => "retryable",
        AckStatus::Permanent => "permanent",
        AckStatus::Unspecified => "unspecified",
    };
    ByStatusReason { status, reason: reason.map_or("", AckReason::as_str) }
}

impl WriterMetrics {
    /// Counts an acknowledgement: `None` for a batch taken, else the reason it answers
    /// with (its status follows from the reason).
    pub fn ack(&self, reason: Option<AckReason>) {
        self.batch_acks.get_or_create(&by_ack(reason)).inc();
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

    /// Handles of one target's checkpoints; every error reason is exported at 0.
    pub fn checkpoint(&self, target: &str) -> CheckpointMetrics {
        let errors = CheckpointFailure::ALL.map(|failure| {
            let by_target_reason = ByTargetReason { target: target.to_owned(), reason: failure.label() };
            self.checkpoint_errors.get_or_create(&by_target_reason).clone()
        });
        CheckpointMetrics { stats: self.checkpoints.handles(&ByTarget { target: target.to_owned() }), errors }
    }
}

/// The `reason` of `checkpoint_errors_total` (see [`super::checkpoint`]).
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

tessera_runtime::labelled_metrics! {
    /// The checkpoints' metrics, per target.
    pub struct CheckpointFamilies;
    /// One target's checkpoints: taken, their age, duration and size, and what was restored.
    #[derive(Debug)]
    pub struct CheckpointStats by ByTarget {
        /// Time since the last checkpoint of the running totals was made durable (or since start, without one),
        /// per target
        pub age: AgeGauge = checkpoint_age [seconds],
        /// Checkpoints of the running totals made durable, per target
        pub count: Counter = checkpoints,
        /// Time to take one checkpoint: encoding on the intake writer thread and the durable file write, per
        /// target
        pub duration: Histogram = checkpoint_duration [seconds] with storage_histogram,
        /// Running totals in the last checkpoint written, per target
        pub series: Gauge = checkpoint_series,
        /// Running totals restored at start (from the checkpoint and the queued records after it), per target
        pub restored_series: Gauge = checkpoint_restored_series,
    }
}

/// Handles of one target's checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointMetrics {
    /// Checkpoints taken, their age, duration and size, and the totals restored at start.
    pub stats: CheckpointStats,
    /// Errors, by [`CheckpointFailure`].
    errors: [Counter; 3],
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
