//! Every metric the ingester exports: the sets each stage declares in its own folder
//! ([`ListenerMetrics`], [`WriterMetrics`], [`QueueMetrics`], [`PoolMetrics`], [`SinkMetrics`]), registered
//! under one prefix (the ingester tier's, `crate::tier`, when it runs).
//!
//! Hot paths hold cloned handles (a target's queue, workers and requests) and add to them
//! once per batch or request. Labels are typed structs (`ByTarget`,
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
//! | `tessera_ingester_file_sink_files_closed_total`, `_file_sink_bad_journal_lines_total`, `_file_sink_histograms_skipped_total`, `_file_sink_close_failures_total` | counter | `target` |
//! | `tessera_ingester_file_sink_journals_closing` | gauge | `target` |
//! | `tessera_ingester_checkpoint_age_seconds` | gauge, computed when scraped | `target` |
//! | `tessera_ingester_checkpoints_total` | counter | `target` |
//! | `tessera_ingester_checkpoint_errors_total` | counter | `target`, `reason` (`write`, `read`, `corrupt`) |
//! | `tessera_ingester_checkpoint_duration_seconds` | histogram | `target` |
//! | `tessera_ingester_checkpoint_series`, `_checkpoint_restored_series` | gauge | `target` |
//! | `tessera_ingester_end_to_end_latency_seconds` | histogram, one observation per tile | `resolution` |
//! | `tessera_ingester_queue_time_seconds` | histogram, one observation per tile | `resolution` |

use crate::pool::PoolMetrics;
use crate::queue::QueueMetrics;
use crate::sink::SinkMetrics;
use crate::writer::WriterMetrics;
use tessera_wire::ListenerMetrics;

/// Every ingester metric's name starts with this.
pub const PREFIX: &str = "tessera_ingester_";

tessera_runtime::metrics! {
    /// The ingester's metrics.
    pub struct Metrics {
        ;
        /// The wire listener's metrics (connections from aggregators)
        pub listener: ListenerMetrics,
        /// The writer thread's metrics (batches, acknowledgements, running totals, checkpoints)
        pub writer: WriterMetrics,
        /// The queue's metrics, per target
        pub queue: QueueMetrics,
        /// The sink stage's metrics (storage requests), per target
        pub sink: SinkMetrics,
        /// The pool's metrics (workers, in flight, pace, latency)
        pub pool: PoolMetrics,
        /// The memory budget (`memory_limit`)
        pub memory: tessera_runtime::memory::MemoryMetrics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::CheckpointFailure;

    #[test]
    fn labels_encode_in_field_order_with_the_values_dashboards_read() {
        let telemetry = tessera_runtime::Telemetry::new("ingester", "test");
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register(registry, PREFIX));
        metrics.writer.ack(None);
        metrics.writer.intake_lag("10s", 0.5);
        metrics.writer.checkpoint("default").error(CheckpointFailure::Read);
        let target = metrics.pool.target("default", &metrics.sink);
        target.sink.request("status_5xx");
        target.sink.rejected(500, 3);
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
    fn every_exported_metric_follows_the_naming_rule_and_is_listed() {
        tessera_runtime::telemetry::naming::assert_exports(
            "ingester",
            |registry| {
                super::Metrics::default().register(registry, super::PREFIX);
                crate::tier::TierMetrics::default().register(registry, super::PREFIX);
            },
            include_str!("../../../docs/metrics/ingester.txt"),
        );
    }
}
