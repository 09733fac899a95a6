//! The sink stage's metrics: storage requests and what storage took or refused, per
//! target, and the file target's own.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::labels::ByTarget;
use tessera_runtime::telemetry::storage_histogram;

/// `{target, outcome}`: how a storage request ended (`ok`, `rejected`,
/// `histograms_refused`, or a retryable reason).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetOutcome {
    target: Arc<String>,
    outcome: &'static str,
}

/// `{target, status}`: the HTTP status storage refused samples with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByTargetStatus {
    target: Arc<String>,
    status: u16,
}

tessera_runtime::metrics! {
    /// The sink stage's metrics.
    pub struct SinkMetrics {
        /// Storage requests, per target and outcome
        sink_requests: Family<ByTargetOutcome, Counter>,
        /// Remote-write TLS or bearer token files that changed on disk but did not load (the
        /// previous ones stay in use)
        pub sink_reload_errors: Counter,
        /// Samples storage refused for good, per target and status
        sink_rejected_samples: Family<ByTargetStatus, Counter>;
        /// Each target's requests and what storage took
        targets: TargetFamilies,
        /// The file targets' own
        file_sinks: FileSinkFamilies,
        /// The Graphite targets' connections
        carbon: super::carbon::CarbonFamilies,
        /// Names a per-tile target had to change
        names: NameChangeFamilies,
    }
}

tessera_runtime::labelled_metrics! {
    /// The sink stage's metrics, per target.
    pub struct TargetFamilies;
    /// One target's storage requests and what storage took.
    pub struct TargetWrites by ByTarget {
        /// Duration of one storage request, per target
        pub request_duration: Histogram = sink_request_duration [seconds] with storage_histogram,
        /// Storage requests sent again after a retryable error, per target
        pub retries: Counter = sink_retries,
        /// Samples storage acknowledged, per target
        pub samples_written: Counter = samples_written,
        /// Queue records fully written to storage, per target
        pub records_written: Counter = records_written,
        /// Metric families whose type, help and unit go out in metadata requests, per target
        pub metadata_families: Gauge = metadata_families,
        /// Metric families past the bound (100 000), sent without metadata, per target
        pub metadata_families_dropped: Counter = metadata_families_dropped,
        /// Metadata requests storage took, per target
        pub metadata_requests: Counter = metadata_requests,
        /// Rounds of metadata requests that failed (the next round sends them all again), per target
        pub metadata_errors: Counter = metadata_errors,
    }
}

tessera_runtime::labelled_metrics! {
    /// The file targets' metrics.
    pub struct FileSinkFamilies;
    /// Counters a file target keeps.
    #[derive(Default)]
    pub struct FileSinkMetrics by ByTarget {
        /// OpenMetrics files closed, per target
        pub files_closed: Counter = file_sink_files_closed,
        /// Journal lines skipped when closing a file (torn by a crash), per target
        pub bad_journal_lines: Counter = file_sink_bad_journal_lines,
        /// Journals renamed for closing and not yet closed into `.om` files, per target
        pub journals_closing: Gauge = file_sink_journals_closing,
        /// Attempts to close a journal that failed (its rename for closing, or its conversion into an
        /// `.om` file; tried again), per target
        pub close_failures: Counter = file_sink_close_failures,
        /// Native histogram samples in a file target's queue (kept from a remote-write configuration), not
        /// written
        pub histograms_skipped: Counter = file_sink_histograms_skipped,
    }
}

tessera_runtime::labelled_metrics! {
    /// What per-tile targets (Graphite, InfluxDB) had to change in names to write them.
    pub struct NameChangeFamilies;
    /// One per-tile target's name changes.
    #[derive(Default)]
    pub struct NameChangeMetrics by ByTarget {
        /// Keys sanitized for a Graphite path (statsd's keyNameSanitize: whitespace, `/` and characters outside
        /// `[A-Za-z0-9_.-]`), or empty measurement names not written to InfluxDB, per target
        pub keys_sanitized: Counter = names_keys_sanitized,
        /// Tags that lost characters carbon would misparse, per target
        pub tags_sanitized: Counter = names_tags_sanitized,
        /// Tags dropped (an empty name or value once sanitized; InfluxDB: a tag named `metric_type`), per target
        pub tags_dropped: Counter = names_tags_dropped,
    }
}

impl SinkMetrics {
    /// Handles of one target's Graphite connection.
    pub fn carbon(&self, target: &str) -> super::carbon::CarbonMetrics {
        self.carbon.handles(&ByTarget { target: target.to_owned() })
    }

    /// Handles of one per-tile target's name changes.
    pub fn name_changes(&self, target: &str) -> NameChangeMetrics {
        self.names.handles(&ByTarget { target: target.to_owned() })
    }

    /// Handles of one target's file sink.
    pub fn file_sink(&self, target: &str) -> FileSinkMetrics {
        self.file_sinks.handles(&ByTarget { target: target.to_owned() })
    }

    /// Handles of one target's storage requests; refusals with 400 (Prometheus: out of
    /// order, invalid) are exported at 0 from the start, other 4xx statuses when they
    /// happen.
    pub fn target(&self, target: &str) -> TargetSinkMetrics {
        let writes = self.targets.handles(&ByTarget { target: target.to_owned() });
        let target = Arc::new(target.to_owned());
        let _ = self.sink_rejected_samples.get_or_create(&ByTargetStatus { target: target.clone(), status: 400 });
        TargetSinkMetrics {
            target,
            requests: self.sink_requests.clone(),
            rejected_samples: self.sink_rejected_samples.clone(),
            writes,
        }
    }
}

/// Handles of one target's storage requests.
#[derive(Clone)]
pub struct TargetSinkMetrics {
    /// Shared by the label sets of each request, so that counting one allocates nothing.
    target: Arc<String>,
    requests: Family<ByTargetOutcome, Counter>,
    rejected_samples: Family<ByTargetStatus, Counter>,
    /// Request durations, retries, samples and records written.
    pub writes: TargetWrites,
}

impl TargetSinkMetrics {
    /// Counts a request by outcome (`ok`, `rejected`, `histograms_refused`, or a retryable
    /// reason).
    pub fn request(&self, outcome: &'static str) {
        self.requests.get_or_create(&ByTargetOutcome { target: self.target.clone(), outcome }).inc();
    }

    /// Counts samples refused for good with `status`.
    pub fn rejected(&self, status: u16, samples: u64) {
        self.rejected_samples.get_or_create(&ByTargetStatus { target: self.target.clone(), status }).inc_by(samples);
    }
}
