//! The embedded default sink: OpenMetrics text files.
//!
//! Samples are appended to `current.journal` in the target directory (and fsynced, when
//! `fsync` is on, before the request is acknowledged), one journal line per sample
//! ([`super::openmetrics`]). The journal is closed when it passes `rotate_bytes` or has
//! been open for `rotate_after`, and at shutdown: its lines are grouped by family into
//! `tessera-<unix_ms>.om` (written as `.om.tmp`, fsynced, then renamed), ending in
//! `# EOF`. **Only closed `.om` files are importable**:
//!
//! ```text
//! promtool tsdb create-blocks-from openmetrics <dir>/tessera-1700000000000.om <tsdb-dir>
//! ```
//!
//! A journal left by a crash is closed into an `.om` file at the next start. Samples of a
//! request that was being written when the process died may be written again after the
//! restart (with the same values).
//!
//! All file work happens on one dedicated thread (`file-sink`); workers hand it requests
//! through a channel and wait for its answer, so no async worker blocks on disk.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::metrics::FileSinkMetrics;
use super::openmetrics::{Helps, close_journal, write_journal_line_encoded};
use super::{Sink, SinkError, SinkRequest};
use crate::queue::segment::{cut_back, sync_dir};
use crate::record::SampleKind;

/// Name of the open journal in a target directory.
pub const JOURNAL_NAME: &str = "current.journal";

/// Settings of a file target.
#[derive(Debug, Clone)]
pub struct FileSinkSettings {
    /// Directory of the files (created if missing).
    pub dir: PathBuf,
    /// Close the journal into an `.om` file once it passes this size.
    pub rotate_bytes: u64,
    /// Close the journal into an `.om` file once it has been open this long.
    pub rotate_after: Duration,
    /// Fsync the journal before acknowledging a request.
    pub fsync: bool,
    /// Each family's `# HELP`.
    pub helps: Helps,
}

/// An OpenMetrics file target; see the [module docs](self).
pub struct FileSink {
    jobs: SyncSender<Job>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

enum Job {
    Write { request: SinkRequest, reply: oneshot::Sender<Result<(), SinkError>> },
    Close,
}

impl FileSink {
    /// Opens the target directory, closes a journal left by a crash, and starts the
    /// writer thread. `max_waiting` bounds the requests queued for the thread (use the
    /// number of workers: each waits for its answer).
    pub fn open(settings: FileSinkSettings, metrics: FileSinkMetrics, max_waiting: usize) -> io::Result<FileSink> {
        std::fs::create_dir_all(&settings.dir)?;
        let mut writer = Writer { settings, metrics, journal: None };
        if writer.settings.dir.join(JOURNAL_NAME).exists() {
            tracing::info!(dir = %writer.settings.dir.display(), "closing a journal left by the last run");
            writer.close_journal()?;
        }
        let (jobs, receiver) = sync_channel(max_waiting.max(1));
        let thread = std::thread::Builder::new().name("file-sink".into()).spawn(move || writer.run(receiver))?;
        Ok(FileSink { jobs, thread: Mutex::new(Some(thread)) })
    }
}

impl Sink for FileSink {
    fn kind(&self) -> &'static str {
        "file"
    }

    async fn write(&self, request: &SinkRequest) -> Result<(), SinkError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Write { request: request.clone(), reply };
        let refused =
            |message: &str| SinkError::Retryable { reason: "io", message: message.to_owned(), overloaded: false };
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(refused("file sink thread is busy")),
            Err(TrySendError::Disconnected(_)) => return Err(refused("file sink thread has stopped")),
        }
        answer.await.unwrap_or_else(|_| Err(refused("file sink thread dropped the request")))
    }

    async fn close(&self) {
        let _ = self.jobs.send(Job::Close);
        let thread = self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

struct Journal {
    file: File,
    len: u64,
    opened: Instant,
}

struct Writer {
    settings: FileSinkSettings,
    metrics: FileSinkMetrics,
    journal: Option<Journal>,
}

impl Writer {
    fn run(mut self, jobs: Receiver<Job>) {
        loop {
            let wait = match &self.journal {
                Some(journal) => self.settings.rotate_after.saturating_sub(journal.opened.elapsed()),
                None => Duration::from_secs(3600),
            };
            match jobs.recv_timeout(wait) {
                Ok(Job::Write { request, reply }) => {
                    let result = self.append(&request);
                    let _ = reply.send(result);
                }
                Ok(Job::Close) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            let due = self.journal.as_ref().is_some_and(|journal| {
                journal.len >= self.settings.rotate_bytes || journal.opened.elapsed() >= self.settings.rotate_after
            });
            if due && let Err(error) = self.close_journal() {
                tracing::error!(%error, dir = %self.settings.dir.display(), "cannot close the OpenMetrics journal; will retry");
            }
        }
        if let Err(error) = self.close_journal() {
            tracing::error!(%error, dir = %self.settings.dir.display(), "cannot close the OpenMetrics journal at shutdown; it is closed at the next start");
        }
    }

    fn append(&mut self, request: &SinkRequest) -> Result<(), SinkError> {
        let mut text = String::with_capacity(request.samples.len() * 96);
        for sample in &request.samples {
            if sample.sample_kind() == SampleKind::Histogram {
                // OpenMetrics 1.0 text has no native histograms, and a file target's converter
                // writes summaries; only a queue kept from a remote-write target (the same
                // target name, reconfigured) can hold one. Its summary was not made: counted.
                self.metrics.histograms_skipped.inc();
                continue;
            }
            let undecodable =
                |error| SinkError::Permanent { status: 0, message: format!("undecodable labels: {error}") };
            let timestamp_ms = sample.at(request.record.tile_end_ms);
            if sample.reset_before {
                // The explicit reset of a series this ingester adopted, as remote write has it:
                // files from several ingesters are imported into one store, where the new
                // owner's first total must not read as a continuation of the old owner's.
                write_journal_line_encoded(&mut text, &sample.labels, sample.sample_kind(), 0.0, timestamp_ms - 1)
                    .map_err(undecodable)?;
            }
            write_journal_line_encoded(&mut text, &sample.labels, sample.sample_kind(), sample.value, timestamp_ms)
                .map_err(undecodable)?;
        }
        let io_error =
            |error: io::Error| SinkError::Retryable { reason: "io", message: error.to_string(), overloaded: false };
        if self.journal.is_none() {
            let path = self.settings.dir.join(JOURNAL_NAME);
            let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_error)?;
            let len = file.metadata().map_err(io_error)?.len();
            self.journal = Some(Journal { file, len, opened: Instant::now() });
        }
        let journal = self.journal.as_mut().expect("opened above");
        if let Err(error) = journal.file.write_all(text.as_bytes()) {
            if let Err(cut) = cut_back(&mut journal.file, journal.len) {
                tracing::error!(%cut, "cannot cut a failed write off the journal");
            }
            return Err(io_error(error));
        }
        if self.settings.fsync {
            journal.file.sync_data().map_err(io_error)?;
        }
        journal.len += text.len() as u64;
        Ok(())
    }

    /// Turns the journal into a closed `.om` file (nothing if there is no journal).
    fn close_journal(&mut self) -> io::Result<()> {
        self.journal = None;
        let dir = self.settings.dir.clone();
        let journal_path = dir.join(JOURNAL_NAME);
        let journal = match std::fs::read(&journal_path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if journal.is_empty() {
            return std::fs::remove_file(&journal_path);
        }
        let closed = close_journal(&String::from_utf8_lossy(&journal), &self.settings.helps);
        if closed.bad_lines > 0 {
            tracing::warn!(bad_lines = closed.bad_lines, "skipped unreadable journal lines (torn by a crash)");
            self.metrics.bad_journal_lines.inc_by(closed.bad_lines);
        }
        let final_path = unused_name(&dir);
        let temporary = final_path.with_extension("om.tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(closed.text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, &final_path)?;
        sync_dir(&dir)?;
        std::fs::remove_file(&journal_path)?;
        self.metrics.files_closed.inc();
        tracing::debug!(file = %final_path.display(), samples = closed.samples, "closed an OpenMetrics file");
        Ok(())
    }
}

fn unused_name(dir: &Path) -> PathBuf {
    let now_ms = tessera_core::clock::now_ms();
    let mut path = dir.join(format!("tessera-{now_ms}.om"));
    let mut n = 1;
    while path.exists() {
        path = dir.join(format!("tessera-{now_ms}-{n}.om"));
        n += 1;
    }
    path
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::queue::segment::RequestKey;
    use crate::queue::series::encode_labels;
    use crate::record::StoredSample;
    use crate::sink::RecordInfo;

    #[test]
    fn an_adopted_series_gets_its_explicit_reset_as_remote_write_does() {
        let dir = tempfile::tempdir().unwrap();
        let settings = FileSinkSettings {
            dir: dir.path().to_path_buf(),
            rotate_bytes: u64::MAX,
            rotate_after: Duration::from_secs(3600),
            fsync: false,
            helps: Helps::default(),
        };
        let mut writer = Writer { settings, metrics: FileSinkMetrics::default(), journal: None };
        let sample = |name: &str, value: f64, reset_before: bool| {
            let mut labels = Vec::new();
            encode_labels(&mut labels, &[("__name__", name), ("resolution", "10s")]);
            StoredSample {
                labels: Bytes::from(labels),
                value,
                kind: SampleKind::Counter as i32,
                reset_before,
                ..Default::default()
            }
        };
        let record = Arc::new(RecordInfo {
            storage_policy: "10s:2d".into(),
            resolution: "10s".into(),
            tile_end_ms: 1_700_000_010_000,
            received_at_ms: 1_700_000_011_000,
            tiles: 2,
            position: Default::default(),
        });
        let request = SinkRequest {
            record,
            samples: vec![sample("adopted_total", 7.0, true), sample("kept_total", 9.0, false)],
            key: RequestKey { shard: 0, chunk: 0, fingerprint: 0 },
        };
        writer.append(&request).unwrap();
        let journal = std::fs::read_to_string(dir.path().join(JOURNAL_NAME)).unwrap();
        let lines: Vec<&str> = journal.lines().collect();
        assert_eq!(lines.len(), 3, "{journal}");
        assert!(lines[0].contains("adopted_total") && lines[0].contains(" 1700000009999 0"), "{journal}");
        assert!(lines[1].contains("adopted_total") && lines[1].contains(" 1700000010000 7"), "{journal}");
        assert!(lines[2].contains("kept_total") && lines[2].contains(" 1700000010000 9"), "{journal}");
    }
}
