//! The queue's metrics: each target's segment files, records, replay and fsyncs.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tessera_runtime::telemetry::labels::ByTarget;

tessera_runtime::labelled_metrics! {
    /// The queue's metrics, per target.
    pub struct QueueMetrics;
    /// Handles of one target's queue: its bound, set once, and what the queue keeps current.
    #[derive(Default)]
    pub struct TargetQueueMetrics by ByTarget {
        /// Bytes of queue segment files, per target
        pub bytes: Gauge = queue_bytes,
        /// The queue's byte bound, per target
        pub max_bytes: Gauge = queue_max_bytes,
        /// Queued records not yet written to storage, per target
        pub records: Gauge = queue_records,
        /// Queue segment files, per target
        pub segments: Gauge = queue_segments,
        /// Records found in the queue at start, per target
        pub replayed_records: Counter = queue_replayed_records,
        /// Torn or corrupt queue records cut off, per target
        pub corrupt_records: Counter = queue_corrupt_records,
        /// Fsyncs of queue segments, per target
        pub fsyncs: Counter = queue_fsyncs,
        /// Failed fsyncs of queue segments (each seals its segment), per target
        pub fsync_errors: Counter = queue_fsync_errors,
        /// Acknowledged records (fsync = interval) not known to be on disk when an fsync failed; still
        /// delivered, per target
        pub records_at_risk: Counter = queue_records_at_risk,
    }
}

impl QueueMetrics {
    /// Handles of one target's queue, whose byte bound is `max_bytes`.
    pub fn target(&self, target: &str, max_bytes: u64) -> TargetQueueMetrics {
        let handles = self.handles(&ByTarget { target: target.to_owned() });
        handles.max_bytes.set(max_bytes as i64);
        handles
    }
}
