//! Where samples go: the [`Sink`] trait and its implementations.
//!
//! - [`remote_write::RemoteWriteSink`]: Prometheus remote write 1.0 over HTTP/1.1
//!   (Prometheus, VictoriaMetrics, the M3 coordinator, Mimir, Thanos receive).
//! - [`file::FileSink`]: the embedded default, OpenMetrics text files that
//!   `promtool tsdb create-blocks-from openmetrics` imports.
//! - [`carbon::CarbonSink`]: Graphite, each tile once, named by [`graphite`] as statsd,
//!   brubeck or tessera write it.
//! - [`influx::InfluxSink`]: InfluxDB line protocol, each tile once, named as Telegraf's
//!   statsd input writes it.
//!
//! [`prompb`] holds the remote-write messages and encodes a request body straight from the
//! queued samples; [`openmetrics`] writes the text format for the file sink and the
//! [`rejected::RejectedLog`]; [`metadata`] keeps each family's type, help and unit for
//! remote write's metadata requests.
//!
//! A sink writes one [`SinkRequest`] (at most `max_samples_per_request` samples of one
//! record) and answers `Ok` once storage has them, or a [`SinkError`]: retryable (the
//! worker backs off and sends it again) or permanent (counted by status, logged to the
//! [`rejected::RejectedLog`], not sent again). [`AnySink`] lets one pool type serve
//! any of them.

pub mod carbon;
pub mod file;
pub mod graphite;
pub mod influx;
pub mod metadata;
mod metrics;
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "`write_journal_line` is used by its tests alone; sink/ is under TLS edits")
)]
pub mod openmetrics;
pub mod prompb;
pub mod rejected;
pub mod remote_write;

use std::future::Future;
use std::sync::Arc;

use crate::queue::record::{Record, StoredSample};
use crate::queue::{Position, RequestKey};
pub use metrics::{NameChangeMetrics, SinkMetrics, TargetSinkMetrics, TargetWrites};

/// The record a request belongs to, shared by all of the record's requests.
#[derive(Debug)]
pub struct RecordInfo {
    /// Storage policy, e.g. `10s:2d`.
    pub storage_policy: String,
    /// `resolution` label value, e.g. `10s`.
    pub resolution: String,
    /// Timestamp of every sample, unix milliseconds.
    pub tile_end_ms: i64,
    /// When the ingester received the batch, unix milliseconds.
    pub received_at_ms: i64,
    /// Tiles in the record.
    pub tiles: u32,
    /// Where the record is in the queue.
    pub position: Position,
}

impl RecordInfo {
    /// Splits a decoded queue record into what every request of it shares
    /// and its samples.
    pub fn split(record: Record, position: Position) -> (Arc<RecordInfo>, Vec<StoredSample>) {
        let info = RecordInfo {
            storage_policy: record.storage_policy,
            resolution: record.resolution,
            tile_end_ms: record.tile_end_ms,
            received_at_ms: record.received_at_ms,
            tiles: record.tiles,
            position,
        };
        (Arc::new(info), record.samples)
    }
}

/// One write to storage.
#[derive(Debug, Clone)]
pub struct SinkRequest {
    /// The record the samples come from.
    pub record: Arc<RecordInfo>,
    /// The samples, all stamped `record.tile_end_ms`.
    pub samples: Vec<StoredSample>,
    /// Which request of the record this is (for the done log).
    pub key: RequestKey,
}

/// Why a write failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SinkError {
    /// Worth retrying: network error, timeout, 429, 5xx, a full disk.
    #[error("retryable {reason}: {message}")]
    Retryable {
        /// Closed-set reason for metrics: `network`, `timeout`, `status_429`, `status_5xx`, `io`,
        /// and `fenced` (cancelled in flight when the ingester's fence fell).
        reason: &'static str,
        /// Details for the log.
        message: String,
        /// Whether this says storage is overloaded (429, 5xx, timeout), for pacing.
        overloaded: bool,
    },
    /// Storage asked to be left alone for a while (429 or 503 with `Retry-After`):
    /// retryable and overloaded, not sent again before `after`.
    #[error("retryable {reason} (retry after {after:?}): {message}")]
    RetryAfter {
        /// Closed-set reason for metrics: `status_429`, `status_5xx`.
        reason: &'static str,
        /// Details for the log.
        message: String,
        /// The least wait storage asked for.
        after: std::time::Duration,
    },
    /// Will never succeed: a 4xx other than 429, or a request that cannot be built.
    #[error("rejected with status {status}: {message}")]
    Permanent {
        /// HTTP status (0 when not from HTTP).
        status: u16,
        /// The storage's explanation, shortened.
        message: String,
    },
    /// The storage takes no native histograms (a Prometheus without
    /// `--enable-feature=native-histograms` refuses the whole request, with a 500): the
    /// request's histogram samples will never be taken, the others are to be sent alone.
    #[error("native histograms refused with status {status}: {message}")]
    HistogramsRefused {
        /// HTTP status.
        status: u16,
        /// The storage's explanation, shortened.
        message: String,
    },
}

impl SinkRequest {
    /// The same request holding only the samples for which `keep` holds.
    pub fn only(&self, keep: impl Fn(&StoredSample) -> bool) -> SinkRequest {
        SinkRequest {
            record: self.record.clone(),
            samples: self.samples.iter().filter(|sample| keep(sample)).cloned().collect(),
            key: self.key,
        }
    }
}

/// A storage target.
pub trait Sink: Send + Sync + 'static {
    /// Short kind name for metric labels: `remote_write` or `file`.
    #[allow(dead_code, reason = "no caller since the module is private; its impls are in sink/, under TLS edits")]
    fn kind(&self) -> &'static str;

    /// Writes one request; resolves once storage acknowledged it.
    fn write(&self, request: &SinkRequest) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Flushes and closes whatever the sink holds open (shutdown).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Whether the sink writes running totals (remote write, the file sink), which a
    /// second writer of a series would corrupt: its requests in flight are cancelled when
    /// the ingester's fence falls ([`crate::tier::fence`]). A per-tile store's (Graphite,
    /// InfluxDB) write each tile's own values, and are left to finish.
    fn keeps_totals(&self) -> bool {
        true
    }
}

/// Any sink, so that one pool type serves every target.
pub enum AnySink {
    /// Prometheus remote write.
    RemoteWrite(Box<remote_write::RemoteWriteSink>),
    /// OpenMetrics files.
    File(file::FileSink),
    /// Graphite (carbon).
    Graphite(Box<carbon::CarbonSink>),
    /// InfluxDB.
    Influx(Box<influx::InfluxSink>),
}

impl Sink for AnySink {
    fn kind(&self) -> &'static str {
        match self {
            AnySink::RemoteWrite(sink) => sink.kind(),
            AnySink::File(sink) => sink.kind(),
            AnySink::Graphite(sink) => sink.kind(),
            AnySink::Influx(sink) => sink.kind(),
        }
    }

    async fn write(&self, request: &SinkRequest) -> Result<(), SinkError> {
        match self {
            AnySink::RemoteWrite(sink) => sink.write(request).await,
            AnySink::File(sink) => sink.write(request).await,
            AnySink::Graphite(sink) => sink.write(request).await,
            AnySink::Influx(sink) => sink.write(request).await,
        }
    }

    fn keeps_totals(&self) -> bool {
        matches!(self, AnySink::RemoteWrite(_) | AnySink::File(_))
    }

    async fn close(&self) {
        match self {
            AnySink::RemoteWrite(sink) => sink.close().await,
            AnySink::File(sink) => sink.close().await,
            AnySink::Graphite(sink) => sink.close().await,
            AnySink::Influx(sink) => sink.close().await,
        }
    }
}

/// Shortens a storage error message for logs and the rejected log.
pub(crate) fn shorten(message: &str, max_chars: usize) -> String {
    let mut short: String = message.trim().chars().take(max_chars).collect();
    if message.trim().chars().count() > max_chars {
        short.push('…');
    }
    short
}
