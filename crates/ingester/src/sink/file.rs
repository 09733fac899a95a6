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
//! Closing is off the write path. A due journal is renamed to `closing-<unix_ms>.journal`
//! (a rename and a directory fsync), and the next request goes to a new `current.journal`
//! at once. A second thread (`file-closer`) turns the renamed journals into `.om` files, one
//! after another in the order they were renamed. At 1 M samples a tile a close reads, sorts
//! and writes some 64 MB (about a second and a half of CPU), and every request arriving
//! meanwhile used to wait for it: the tail of the end-to-end latency. A close that fails is
//! logged, counted, and tried again ten seconds later; the journal stays on disk until then.
//!
//! Journals left by a crash (`current.journal`, and renamed ones not yet closed) are closed
//! into `.om` files at the next start, oldest first. Samples of a request that was being
//! written when the process died may be written again after the restart (with the same
//! values), and so may a journal closed just before the crash and not yet removed.
//!
//! Appending happens on one dedicated thread (`file-sink`); workers hand it requests
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

/// Prefix of a journal renamed for closing (`closing-<unix_ms>.journal`).
const CLOSING_PREFIX: &str = "closing-";

/// How long the closer waits before it tries a failed close again.
const CLOSE_RETRY: Duration = Duration::from_secs(10);

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
        let closer = Closer { dir: settings.dir.clone(), helps: settings.helps.clone(), metrics: metrics.clone() };
        let mut left = closing_journals(&settings.dir)?;
        if settings.dir.join(JOURNAL_NAME).exists() {
            left.push(settings.dir.join(JOURNAL_NAME));
        }
        for journal in &left {
            tracing::info!(journal = %journal.display(), "closing a journal left by the last run");
            closer.close(journal)?;
        }
        let (closing, closing_receiver) = std::sync::mpsc::channel();
        let closer =
            std::thread::Builder::new().name("file-closer".into()).spawn(move || closer.run(closing_receiver))?;
        let writer = Writer { settings, metrics, journal: None, closing, closer: Some(closer) };
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
    /// Renamed journals for the closer, in order.
    closing: std::sync::mpsc::Sender<PathBuf>,
    closer: Option<std::thread::JoinHandle<()>>,
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
            if due && let Err(error) = self.hand_over() {
                self.metrics.close_failures.inc();
                tracing::error!(%error, dir = %self.settings.dir.display(), "cannot rename the OpenMetrics journal for closing; will retry");
            }
        }
        if let Err(error) = self.hand_over() {
            self.metrics.close_failures.inc();
            tracing::error!(%error, dir = %self.settings.dir.display(), "cannot rename the OpenMetrics journal at shutdown; it is closed at the next start");
        }
        // The closer ends when its channel does, after the journals handed to it.
        let Writer { closing, closer, .. } = self;
        drop(closing);
        if let Some(closer) = closer {
            let _ = closer.join();
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

    /// Renames the journal for closing and hands it to the closer (nothing if there is no
    /// journal); the next request opens a new one.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.journal.take().is_none() {
            return Ok(());
        }
        let dir = &self.settings.dir;
        let renamed = unused_name(dir, CLOSING_PREFIX, "journal");
        std::fs::rename(dir.join(JOURNAL_NAME), &renamed)?;
        sync_dir(dir)?;
        self.metrics.journals_closing.inc();
        if let Err(std::sync::mpsc::SendError(renamed)) = self.closing.send(renamed) {
            // The closer is gone (it panicked): the journal waits for the next start.
            tracing::error!(journal = %renamed.display(), "the file closer has stopped; the journal is closed at the next start");
        }
        Ok(())
    }
}

/// Turns renamed journals into `.om` files, on its own thread; see the [module docs](self).
struct Closer {
    dir: PathBuf,
    helps: Helps,
    metrics: FileSinkMetrics,
}

impl Closer {
    fn run(self, journals: Receiver<PathBuf>) {
        let mut waiting = std::collections::VecDeque::new();
        loop {
            let next = if waiting.is_empty() {
                journals.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                journals.recv_timeout(CLOSE_RETRY)
            };
            match next {
                Ok(journal) => waiting.push_back(journal),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            waiting.extend(journals.try_iter());
            self.close_waiting(&mut waiting);
        }
        // Shutdown: one more try each; what still fails is closed at the next start.
        self.close_waiting(&mut waiting);
    }

    /// Closes the waiting journals in order, up to the first that fails.
    fn close_waiting(&self, waiting: &mut std::collections::VecDeque<PathBuf>) {
        while let Some(journal) = waiting.front() {
            if let Err(error) = self.close(journal) {
                self.metrics.close_failures.inc();
                tracing::error!(%error, journal = %journal.display(), "cannot close an OpenMetrics journal; will retry");
                return;
            }
            self.metrics.journals_closing.dec();
            waiting.pop_front();
        }
    }

    /// Turns one journal into a closed `.om` file and removes it (nothing if it is gone).
    fn close(&self, journal_path: &Path) -> io::Result<()> {
        let dir = &self.dir;
        let journal = match std::fs::read(journal_path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if journal.is_empty() {
            return std::fs::remove_file(journal_path);
        }
        let closed = close_journal(&String::from_utf8_lossy(&journal), &self.helps);
        if closed.bad_lines > 0 {
            tracing::warn!(bad_lines = closed.bad_lines, "skipped unreadable journal lines (torn by a crash)");
            self.metrics.bad_journal_lines.inc_by(closed.bad_lines);
        }
        let final_path = unused_name(dir, "tessera-", "om");
        let temporary = final_path.with_extension("om.tmp");
        let mut file = File::create(&temporary)?;
        file.write_all(closed.text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, &final_path)?;
        sync_dir(dir)?;
        std::fs::remove_file(journal_path)?;
        self.metrics.files_closed.inc();
        tracing::debug!(file = %final_path.display(), samples = closed.samples, "closed an OpenMetrics file");
        Ok(())
    }
}

/// Journals renamed for closing and left by the last run, oldest first.
fn closing_journals(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut journals: Vec<(i64, u32, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(stem) = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix(CLOSING_PREFIX).and_then(|rest| rest.strip_suffix(".journal")))
        else {
            continue;
        };
        let (ms, n) = stem.split_once('-').unwrap_or((stem, "0"));
        let (Ok(ms), Ok(n)) = (ms.parse(), n.parse()) else {
            continue;
        };
        journals.push((ms, n, path));
    }
    journals.sort();
    Ok(journals.into_iter().map(|(_, _, path)| path).collect())
}

/// `<prefix><unix_ms>.<extension>` in `dir`, or `<prefix><unix_ms>-<n>.<extension>` if that
/// is taken.
fn unused_name(dir: &Path, prefix: &str, extension: &str) -> PathBuf {
    let now_ms = tessera_core::clock::now_ms();
    let mut path = dir.join(format!("{prefix}{now_ms}.{extension}"));
    let mut n = 1;
    while path.exists() {
        path = dir.join(format!("{prefix}{now_ms}-{n}.{extension}"));
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

    fn settings(dir: &Path, rotate_bytes: u64) -> FileSinkSettings {
        FileSinkSettings {
            dir: dir.to_path_buf(),
            rotate_bytes,
            rotate_after: Duration::from_secs(3600),
            fsync: false,
            helps: Helps::default(),
        }
    }

    fn counter_request(name: &str, value: f64) -> SinkRequest {
        let mut labels = Vec::new();
        encode_labels(&mut labels, &[("__name__", name), ("resolution", "10s")]);
        let sample =
            StoredSample { labels: Bytes::from(labels), value, kind: SampleKind::Counter as i32, ..Default::default() };
        let record = Arc::new(RecordInfo {
            storage_policy: "10s:2d".into(),
            resolution: "10s".into(),
            tile_end_ms: 1_700_000_010_000,
            received_at_ms: 1_700_000_011_000,
            tiles: 1,
            position: Default::default(),
        });
        SinkRequest { record, samples: vec![sample], key: RequestKey { shard: 0, chunk: 0, fingerprint: 0 } }
    }

    /// Every `.om` file's text in the directory in the order they were closed (by the
    /// `<unix_ms>[-<n>]` of their names), and what else is there.
    fn files_in(dir: &Path) -> (Vec<String>, Vec<String>) {
        let names =
            std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned());
        let (mut closed, other): (Vec<String>, Vec<String>) = names.partition(|name| name.ends_with(".om"));
        let order = |name: &String| -> (i64, u32) {
            let stem = name.strip_prefix("tessera-").and_then(|rest| rest.strip_suffix(".om")).unwrap();
            let (ms, n) = stem.split_once('-').unwrap_or((stem, "0"));
            (ms.parse().unwrap(), n.parse().unwrap())
        };
        closed.sort_by_key(order);
        (closed.iter().map(|name| std::fs::read_to_string(dir.join(name)).unwrap()).collect(), other)
    }

    #[tokio::test]
    async fn rotated_journals_are_closed_off_the_write_path_in_order_and_none_is_left_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = FileSinkMetrics::default();
        // Every request passes the size: each one is rotated and closed on its own.
        let sink = FileSink::open(settings(dir.path(), 1), metrics.clone(), 2).unwrap();
        for (name, value) in [("a_total", 1.0), ("b_total", 2.0), ("c_total", 3.0)] {
            sink.write(&counter_request(name, value)).await.unwrap();
        }
        sink.close().await;
        let (closed, other) = files_in(dir.path());
        assert!(other.is_empty(), "journals left: {other:?}");
        assert_eq!(closed.len(), 3, "{closed:?}");
        for (text, name) in closed.iter().zip(["a_total", "b_total", "c_total"]) {
            assert!(text.contains(name) && text.ends_with("# EOF\n"), "{text}");
        }
        assert_eq!(metrics.files_closed.get(), 3);
        assert_eq!(metrics.journals_closing.get(), 0);
    }

    #[test]
    fn a_handed_over_journal_waits_for_the_closer_while_writes_go_on_to_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = FileSinkMetrics::default();
        // A closer that has not run yet: the test holds its channel.
        let (closing, waiting) = std::sync::mpsc::channel();
        let mut writer = Writer {
            settings: settings(dir.path(), u64::MAX),
            metrics: metrics.clone(),
            journal: None,
            closing,
            closer: None,
        };
        writer.append(&counter_request("a_total", 1.0)).unwrap();
        writer.hand_over().unwrap();
        writer.append(&counter_request("b_total", 2.0)).unwrap();
        writer.hand_over().unwrap();
        writer.append(&counter_request("c_total", 3.0)).unwrap();
        // Nothing closed: two renamed journals wait, in order, and the third is the open one.
        let handed: Vec<PathBuf> = waiting.try_iter().collect();
        assert_eq!(handed.len(), 2);
        let (closed, _) = files_in(dir.path());
        assert!(closed.is_empty(), "closed on the write path: {closed:?}");
        assert_eq!(metrics.journals_closing.get(), 2);
        let journal = |path: &Path| std::fs::read_to_string(path).unwrap();
        assert!(journal(&handed[0]).contains("a_total") && journal(&handed[1]).contains("b_total"));
        assert!(journal(&dir.path().join(JOURNAL_NAME)).contains("c_total"));
        // The closer catches up.
        let closer = Closer { dir: dir.path().to_path_buf(), helps: Helps::default(), metrics: metrics.clone() };
        let mut queue: std::collections::VecDeque<PathBuf> = handed.into();
        closer.close_waiting(&mut queue);
        let (closed, _) = files_in(dir.path());
        assert_eq!(closed.len(), 2);
        assert!(closed[0].contains("a_total") && closed[1].contains("b_total"), "{closed:?}");
        assert_eq!(metrics.journals_closing.get(), 0);
    }

    #[tokio::test]
    async fn journals_a_crash_left_are_closed_at_start_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let line = |name: &str, value: f64| {
            let mut text = String::new();
            let mut labels = Vec::new();
            encode_labels(&mut labels, &[("__name__", name)]);
            write_journal_line_encoded(&mut text, &labels, SampleKind::Counter, value, 1_700_000_010_000).unwrap();
            text
        };
        // Left by a crash: two renamed journals (named out of order on purpose) and the open one.
        std::fs::write(dir.path().join("closing-1700000000500.journal"), line("second_total", 2.0)).unwrap();
        std::fs::write(dir.path().join("closing-1700000000100-1.journal"), line("first_total", 1.0)).unwrap();
        std::fs::write(dir.path().join(JOURNAL_NAME), line("third_total", 3.0)).unwrap();
        let metrics = FileSinkMetrics::default();
        let sink = FileSink::open(settings(dir.path(), u64::MAX), metrics.clone(), 2).unwrap();
        let (closed, other) = files_in(dir.path());
        assert!(other.is_empty(), "journals left: {other:?}");
        let order: Vec<&str> = closed
            .iter()
            .map(|text| {
                ["first_total", "second_total", "third_total"].into_iter().find(|name| text.contains(name)).unwrap()
            })
            .collect();
        assert_eq!(order, ["first_total", "second_total", "third_total"]);
        sink.close().await;
        assert_eq!(metrics.files_closed.get(), 3);
    }

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
        let (closing, _closer) = std::sync::mpsc::channel();
        let mut writer = Writer { settings, metrics: FileSinkMetrics::default(), journal: None, closing, closer: None };
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
