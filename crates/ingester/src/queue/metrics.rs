//! The queue's metrics: each target's segment files, records, replay and fsyncs.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_runtime::telemetry::labels::ByTarget;

tessera_runtime::metrics! {
    /// The queue's metrics.
    pub struct QueueMetrics {
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
    }
}

impl QueueMetrics {
    /// Handles of one target's queue.
    pub fn target(&self, target: &str, max_bytes: u64) -> TargetQueueMetrics {
        let by_target = ByTarget { target: target.to_owned() };
        self.queue_max_bytes.get_or_create(&by_target).set(max_bytes as i64);
        TargetQueueMetrics {
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
}

/// Handles of one target's queue, which the queue keeps current.
#[derive(Clone, Default)]
pub struct TargetQueueMetrics {
    /// Bytes of segment files.
    pub bytes: Gauge,
    /// Records not yet done.
    pub records: Gauge,
    /// Segment files.
    pub segments: Gauge,
    /// Records found by the replay at start.
    pub replayed_records: Counter,
    /// Torn or corrupt records found (and cut off).
    pub corrupt_records: Counter,
    /// Fsyncs of segment files.
    pub fsyncs: Counter,
    /// Fsyncs that failed (each seals its segment).
    pub fsync_errors: Counter,
    /// Acknowledged records (`fsync = "interval"`) written since the last good fsync when an
    /// fsync failed: still delivered, but not known to be on disk.
    pub records_at_risk: Counter,
}
