//! Taking each target's checkpoint of its running totals, and reading it back at start
//! (the format is [`crate::admit::checkpoint`]'s).
//!
//! | when | where | what |
//! |---|---|---|
//! | every `checkpoint_interval_secs` | writer thread, between two batches | encodes each target's converter in steps of about a millisecond ([`Checkpoints::step`]), covering the queue up to where it was at the first step: one step after each batch, and steps one after the other while no batch waits; a target with nothing queued since its last durable checkpoint is skipped (its totals have not changed) |
//! | once a target's is encoded | `checkpoint-files` thread | writes `<queue dir>/checkpoint` durably ([`write_atomically`]), then lets the queue delete the segments it covers ([`crate::queue::Queue::checkpointed`]) |
//! | at shutdown | writer thread | after the last batch and the queue fsync, waits for that thread and writes the final checkpoints itself, whole ([`Checkpoints::finish`]) |
//! | at start | [`load`] | restores the converter; then the caller rolls it forward through the records queued after the checkpoint |
//!
//! Nothing here stops the ingester. A checkpoint that cannot be written is logged at a
//! limited rate and counted (`checkpoint_errors_total{reason="write"}`): the previous one
//! stays, and so do the segments after it, and the next interval tries again. At start a
//! missing checkpoint means a first start (or one after an upgrade); one that cannot be read
//! (`reason="read"`) or is refused (`reason="corrupt"`, the file is set aside as
//! `checkpoint.corrupt`) is logged with the reason and counted, and the totals are rebuilt
//! from the records still queued (from zero for series with none).
//!
//! An acknowledgement waits for at most one step of about a millisecond (and the first,
//! which lists the series: 0.7 ms for 100 000). Measured with `examples/checkpoint_cost.rs`
//! on the development VM: 100 000 counters are 5.6 MB, encoded in 2 ms all at once (2
//! steps), written with their fsyncs in 7 ms; 100 000 native histograms of 20 buckets are
//! 31 MB, encoded in 78 ms all at once or in 71 steps of at most 1.3 ms, written in 30 ms.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tessera_runtime::RateLimitedLog;
use tessera_runtime::daemon::{ThreadError, spawn_thread};

use super::{CheckpointFailure, CheckpointMetrics};
use crate::admit::Converter;
use crate::admit::checkpoint::{CheckpointEncoder, CheckpointError, CheckpointMeta, EncodedCheckpoint, FILE_NAME};
use crate::queue::{Position, Queue, QueueWriter, segment};
use tessera_core::clock::now_ms;

/// The file a checkpoint is written to before it is renamed over [`FILE_NAME`].
pub const TEMPORARY_NAME: &str = "checkpoint.tmp";

/// Where a refused checkpoint is set aside.
pub const CORRUPT_NAME: &str = "checkpoint.corrupt";

static CHECKPOINT_LOG: RateLimitedLog = RateLimitedLog::new("ingester.checkpoint_write", 1);

/// Why a checkpoint file was not written or not used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointFileError {
    /// Writing, fsyncing or renaming failed.
    #[error("cannot write the checkpoint {path}")]
    Write {
        /// The checkpoint file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file exists but could not be read.
    #[error("cannot read the checkpoint {path}")]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file was read and refused.
    #[error("refused the checkpoint {path}")]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        #[source]
        source: CheckpointError,
    },
}

impl CheckpointFileError {
    /// The `reason` it is counted under.
    pub fn failure(&self) -> CheckpointFailure {
        match self {
            CheckpointFileError::Write { .. } => CheckpointFailure::Write,
            CheckpointFileError::Read { .. } => CheckpointFailure::Read,
            CheckpointFileError::Corrupt { .. } => CheckpointFailure::Corrupt,
        }
    }

    /// Counts it in `metrics` and logs it, so the two never drift: a failed write at a
    /// limited rate (a full disk fails every interval), a checkpoint not used at start always.
    fn emit(&self, target: &str, metrics: &CheckpointMetrics) {
        metrics.error(self.failure());
        let error = tessera_runtime::logging::error_chain(self);
        match self {
            CheckpointFileError::Write { .. } => {
                if CHECKPOINT_LOG.allow() {
                    tracing::error!(
                        target = target,
                        %error,
                        "checkpoint not written; the previous one stays, the next interval tries again"
                    );
                }
            }
            _ => tracing::error!(
                target = target,
                %error,
                "checkpoint not used; running totals start from the records still queued"
            ),
        }
    }
}

/// One target's checkpoint: where it goes, the queue it covers, its metrics.
#[derive(Clone)]
pub struct CheckpointTarget {
    /// The target's name (for logs).
    pub name: String,
    /// The target's queue directory, which holds the checkpoint.
    pub dir: PathBuf,
    /// The target's queue, told when a checkpoint is durable.
    pub queue: Queue,
    /// The target's checkpoint metrics.
    pub metrics: CheckpointMetrics,
}

/// Series saved per call between two looks at the clock.
const STEP_SERIES: usize = 256;

/// How long one step may encode before the writer takes the next batch.
const STEP_BUDGET: Duration = Duration::from_millis(1);

/// A target's checkpoint being encoded.
struct Round {
    target: usize,
    encoder: CheckpointEncoder,
    covers: Position,
    started: Instant,
    /// Taken after the converter took in a `rejoined` view: it holds no stale total.
    clean: bool,
}

impl Round {
    fn begin(target: usize, converter: &Converter, queue: &QueueWriter) -> Round {
        let covers = queue.appended_through();
        let encoder = converter.begin_checkpoint(CheckpointMeta { taken_at_ms: now_ms(), covers });
        Round { target, encoder, covers, started: Instant::now(), clean: converter.took_in_rejoined_view() }
    }
}

/// A checkpoint encoded by the writer thread, to write.
struct Encoded {
    target: usize,
    checkpoint: EncodedCheckpoint,
    covers: Position,
    started: Instant,
    clean: bool,
}

/// Takes the checkpoints of every target (by target index, as the writer's converters and
/// queues); see the [module docs](self).
pub struct Checkpoints {
    targets: Arc<[CheckpointTarget]>,
    /// Per target: its last checkpoint is with the file thread, not written yet.
    writing: Arc<[AtomicBool]>,
    interval: Duration,
    last_round: Instant,
    round: Option<Round>,
    files: Option<(SyncSender<Encoded>, JoinHandle<()>)>,
    /// Per target: a clean checkpoint ([`Round::clean`]) is durable.
    clean_written: Arc<[AtomicBool]>,
    /// An ingesters' placement's ownership, whose rejoin marker is removed once every
    /// target has a clean checkpoint ([`Checkpoints::clearing_rejoin`]).
    rejoin: Option<Arc<crate::tier::Ownership>>,
}

impl Checkpoints {
    /// Starts the `checkpoint-files` thread; the first checkpoints are due `interval` from now.
    pub fn start(targets: Vec<CheckpointTarget>, interval: Duration) -> Result<Checkpoints, ThreadError> {
        let targets: Arc<[CheckpointTarget]> = targets.into();
        // One checkpoint per target waits at most: if the thread is still writing the last
        // round, the next is dropped rather than piled up.
        let (sender, receiver) = sync_channel(targets.len().max(1));
        let writing: Arc<[AtomicBool]> = targets.iter().map(|_| AtomicBool::new(false)).collect();
        let clean_written: Arc<[AtomicBool]> = targets.iter().map(|_| AtomicBool::new(false)).collect();
        let (thread_targets, thread_writing, thread_clean) = (targets.clone(), writing.clone(), clean_written.clone());
        let thread = spawn_thread("checkpoint-files", move || {
            write_each(&thread_targets, &thread_writing, &thread_clean, &receiver)
        })?;
        Ok(Checkpoints {
            targets,
            writing,
            interval,
            last_round: Instant::now(),
            round: None,
            files: Some((sender, thread)),
            clean_written,
            rejoin: None,
        })
    }

    /// While `ownership` is rejoined with its marker on disk, a target whose converter has
    /// taken in the `rejoined` view gets a checkpoint each interval until one is durable,
    /// even with nothing appended (a joiner appends nothing before its cutover, and its old
    /// checkpoint holds the stale totals); once every target has one, the marker is removed.
    pub fn clearing_rejoin(mut self, ownership: Arc<crate::tier::Ownership>) -> Checkpoints {
        self.rejoin = Some(ownership);
        self
    }

    /// Whether clean checkpoints are still wanted for the rejoin marker.
    fn rejoin_pending(&self) -> bool {
        self.rejoin.as_ref().is_some_and(|ownership| ownership.rejoined() && ownership.rejoin_marker().is_some())
    }

    /// Removes the rejoin marker once every target has a clean checkpoint.
    fn clear_rejoin_when_clean(&mut self) {
        if !self.rejoin_pending() || !self.clean_written.iter().all(|clean| clean.load(Ordering::Acquire)) {
            return;
        }
        let Some(marker) = self.rejoin.take().and_then(|ownership| ownership.rejoin_marker().map(Path::to_owned))
        else {
            return;
        };
        let removed = match std::fs::remove_file(&marker) {
            Ok(()) => marker.parent().map_or(Ok(()), segment::sync_dir),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        };
        match removed {
            Ok(()) => tracing::info!("every target has a checkpoint without the stale totals: rejoin marker removed"),
            Err(error) => tracing::error!(%error, marker = %marker.display(), "cannot remove the rejoin marker"),
        }
    }

    /// Call it between batches: starts the targets' checkpoints when `interval` has passed
    /// since the last started, and encodes for about a millisecond; a target's finished
    /// checkpoint goes to the file thread. Returns whether there was anything to do.
    pub fn step(&mut self, converters: &[Converter], queues: &[QueueWriter]) -> bool {
        if self.round.is_none() {
            if self.files.is_none() || self.last_round.elapsed() < self.interval {
                return false;
            }
            self.clear_rejoin_when_clean();
            self.last_round = Instant::now();
            self.round = self.next_round(0, converters, queues);
            if self.round.is_none() {
                return false;
            }
        }
        let Some(round) = self.round.as_mut() else { return false };
        let Some(converter) = converters.get(round.target) else {
            self.round = None;
            return false;
        };
        let started = Instant::now();
        while !converter.continue_checkpoint(&mut round.encoder, STEP_SERIES) {
            if started.elapsed() >= STEP_BUDGET {
                return true;
            }
        }
        let Some(round) = self.round.take() else { return true };
        let next = round.target + 1;
        let encoded = Encoded {
            target: round.target,
            checkpoint: converter.finish_checkpoint(round.encoder),
            covers: round.covers,
            started: round.started,
            clean: round.clean,
        };
        self.send(encoded);
        self.round = self.next_round(next, converters, queues);
        true
    }

    /// The round of the first target from `first` on with records queued since its last
    /// durable checkpoint. Its totals change only with an append, so a target without one
    /// is skipped, and its checkpoint counts as fresh (the age is reset). A target whose
    /// last checkpoint is still being written is skipped too, until the next interval.
    fn next_round(&self, first: usize, converters: &[Converter], queues: &[QueueWriter]) -> Option<Round> {
        for (target, (converter, queue)) in converters.iter().zip(queues).enumerate().skip(first) {
            if self.writing.get(target).is_some_and(|writing| writing.load(Ordering::Acquire)) {
                continue;
            }
            let clean_wanted = self.rejoin_pending()
                && converter.took_in_rejoined_view()
                && !self.clean_written.get(target).is_some_and(|clean| clean.load(Ordering::Acquire));
            if !clean_wanted
                && let Some(files) = self.targets.get(target)
                && files.queue.checkpoint_covers() == Some(queue.appended_through())
            {
                files.metrics.stats.age.set(now_ms());
                continue;
            }
            return Some(Round::begin(target, converter, queue));
        }
        None
    }

    fn send(&mut self, encoded: Encoded) {
        let Some((sender, _)) = &self.files else { return };
        let target = encoded.target;
        let writing = self.writing.get(target);
        writing.inspect(|writing| writing.store(true, Ordering::Release));
        match sender.try_send(encoded) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                writing.inspect(|writing| writing.store(false, Ordering::Release));
                let name = self.targets.get(target).map_or("", |files| files.name.as_str());
                tracing::debug!(target = name, "the file thread is behind; dropping this checkpoint");
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::error!("the checkpoint thread is gone; no more checkpoints until a restart");
                self.files = None;
                self.round = None;
            }
        }
    }

    /// At shutdown, once no batch comes any more: waits for the checkpoints being written,
    /// then writes every target's final one, whole.
    pub fn finish(mut self, converters: &[Converter], queues: &[QueueWriter]) {
        if let Some((sender, thread)) = self.files.take() {
            drop(sender);
            if thread.join().is_err() {
                tracing::error!("the checkpoint thread panicked");
            }
        }
        let mut first = 0;
        while let Some(round) = self.next_round(first, converters, queues) {
            let target = round.target;
            let checkpoint = converters[target].finish_checkpoint(round.encoder);
            let encoded =
                Encoded { target, checkpoint, covers: round.covers, started: round.started, clean: round.clean };
            if write_one(&self.targets, encoded)
                && let Some(clean) = self.clean_written.get(target)
            {
                clean.store(round.clean, Ordering::Release);
            }
            first = target + 1;
        }
        self.clear_rejoin_when_clean();
    }
}

/// The file thread: writes each checkpoint it is given until the writer hangs up.
fn write_each(targets: &[CheckpointTarget], writing: &[AtomicBool], clean: &[AtomicBool], encoded: &Receiver<Encoded>) {
    for checkpoint in encoded {
        let (target, was_clean) = (checkpoint.target, checkpoint.clean);
        if write_one(targets, checkpoint)
            && was_clean
            && let Some(clean) = clean.get(target)
        {
            clean.store(true, Ordering::Release);
        }
        if let Some(writing) = writing.get(target) {
            writing.store(false, Ordering::Release);
        }
    }
}

/// Writes one checkpoint; returns whether it is durable.
fn write_one(targets: &[CheckpointTarget], mut encoded: Encoded) -> bool {
    let Some(target) = targets.get(encoded.target) else { return false };
    if let Err(error) = write_atomically(&target.dir, &encoded.checkpoint.parts()) {
        error.emit(&target.name, &target.metrics);
        return false;
    }
    target.queue.checkpointed(encoded.covers);
    let metrics = &target.metrics;
    let stats = &metrics.stats;
    stats.count.inc();
    stats.age.set(now_ms());
    stats.duration.observe(encoded.started.elapsed().as_secs_f64());
    stats.series.set(encoded.checkpoint.series() as i64);
    true
}

/// Writes `parts` one after the other as `dir/checkpoint` so that a crash at any point
/// leaves the old file or the new one, whole: to `checkpoint.tmp`, fsynced, renamed over
/// the old one, then the directory fsynced.
pub fn write_atomically(dir: &Path, parts: &[&[u8]]) -> Result<(), CheckpointFileError> {
    let path = dir.join(FILE_NAME);
    let temporary = dir.join(TEMPORARY_NAME);
    let written = File::create(&temporary).and_then(|file| {
        let mut out = io::BufWriter::with_capacity(1 << 20, file);
        for part in parts {
            out.write_all(part)?;
        }
        out.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()
    });
    let durable = written
        .and_then(|()| std::fs::rename(&temporary, &path))
        .and_then(|()| segment::sync_dir(dir))
        .map_err(|source| CheckpointFileError::Write { path, source });
    if durable.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    durable
}

/// Restores `converter` from the checkpoint in the queue directory `dir` of `target` and
/// returns the queue position it covers: the caller rolls the converter forward through
/// every record from there. Without a usable checkpoint the converter is left as it is and
/// the position is the start of the queue (see the [module docs](self)); this never fails.
pub fn load(dir: &Path, target: &str, metrics: &CheckpointMetrics, converter: &mut Converter) -> Position {
    let path = dir.join(FILE_NAME);
    let refused = |error: CheckpointFileError| {
        error.emit(target, metrics);
        Position::default()
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Position::default(),
        Err(source) => return refused(CheckpointFileError::Read { path, source }),
    };
    match converter.restore_checkpoint(&bytes) {
        Ok(meta) => {
            metrics.stats.age.set(meta.taken_at_ms);
            meta.covers
        }
        Err(source) => {
            // Kept for a look; the next checkpoint takes its place.
            let _ = std::fs::rename(&path, dir.join(CORRUPT_NAME));
            refused(CheckpointFileError::Corrupt { path, source })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{self, FsyncPolicy, QueueOptions};
    use crate::writer::WriterMetrics;

    fn target(dir: &Path) -> CheckpointTarget {
        let options = QueueOptions::new(dir.to_owned(), 1 << 20, 1 << 16, FsyncPolicy::Never);
        let (queue, ..) = queue::open(options, Default::default()).unwrap();
        CheckpointTarget {
            name: "default".into(),
            dir: dir.to_owned(),
            queue,
            metrics: WriterMetrics::default().checkpoint("default"),
        }
    }

    #[test]
    fn rounds_write_each_changed_target_and_skip_an_unchanged_one() {
        let dir = tempfile::tempdir().unwrap();
        let options = QueueOptions {
            checkpointed: Some(Position::default()),
            ..QueueOptions::new(dir.path().to_owned(), 1 << 20, 1 << 16, FsyncPolicy::Never)
        };
        let (queue, mut writer, ..) = queue::open(options, Default::default()).unwrap();
        let metrics = WriterMetrics::default().checkpoint("default");
        let target = CheckpointTarget { name: "default".into(), dir: dir.path().to_owned(), queue, metrics };
        let mut checkpoints = Checkpoints::start(vec![target.clone()], Duration::ZERO).unwrap();
        let converters = [Converter::new(&[0.5], 3_600_000)];
        let written = |count: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while target.metrics.stats.count.get() < count {
                assert!(Instant::now() < deadline, "checkpoint {count} not written");
                std::thread::sleep(Duration::from_millis(5));
            }
        };

        // The queue moved on since the start (its new segment): a round, then its file.
        while checkpoints.step(&converters, std::slice::from_ref(&writer)) {}
        written(1);
        assert_eq!(target.queue.checkpoint_covers(), Some(writer.appended_through()));
        // Nothing queued since: no round, nothing written.
        assert!(!checkpoints.step(&converters, std::slice::from_ref(&writer)));
        // A record queued: the next round covers it.
        writer.append(&crate::queue::record::encode(&crate::queue::record::Record::default())).unwrap();
        while checkpoints.step(&converters, std::slice::from_ref(&writer)) {}
        written(2);
        assert_eq!(target.queue.checkpoint_covers(), Some(writer.appended_through()));
        checkpoints.finish(&converters, std::slice::from_ref(&writer));
        assert_eq!(target.metrics.stats.count.get(), 2, "nothing new to write at shutdown");
        assert!(dir.path().join(FILE_NAME).exists() && !dir.path().join(TEMPORARY_NAME).exists());
    }

    /// A restart that found itself failed over records it (the rejoin marker) before it joins
    /// again; the marker goes once every target has a checkpoint taken after its converter
    /// saw the `rejoined` view, even with nothing appended meanwhile (a joiner appends
    /// nothing before its cutover, and its old checkpoint holds the stale totals). Until
    /// then a restart, in the placement or not, is rejoined too.
    #[test]
    fn the_rejoin_marker_goes_once_every_target_has_a_clean_checkpoint() {
        use crate::tier::{Ownership, OwnershipView};
        use tessera_topology::Placement;
        let data = tempfile::tempdir().unwrap();
        let marker = data.path().join("rejoined");
        let dir = data.path().join("queue");
        std::fs::create_dir(&dir).unwrap();
        let options = QueueOptions {
            checkpointed: Some(Position::default()),
            ..QueueOptions::new(dir.clone(), 1 << 20, 1 << 16, FsyncPolicy::Never)
        };
        let (queue, writer, ..) = queue::open(options, Default::default()).unwrap();
        let metrics = WriterMetrics::default().checkpoint("default");
        let target = CheckpointTarget { name: "default".into(), dir, queue, metrics };
        let written = |count: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while target.metrics.stats.count.get() < count {
                assert!(Instant::now() < deadline, "checkpoint {count} not written");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let ownership = Arc::new(Ownership::with_rejoin_marker(marker.clone()));
        assert!(!ownership.rejoined(), "no marker: not rejoined");
        ownership.persist_rejoined().unwrap();
        assert!(marker.exists() && ownership.rejoined());
        assert!(Ownership::with_rejoin_marker(marker.clone()).rejoined(), "a restart now is rejoined too");

        let tier_metrics = crate::tier::TierMetrics::default();
        let mut converters = [Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &tier_metrics)];
        let queues = std::slice::from_ref(&writer);
        let mut checkpoints =
            Checkpoints::start(vec![target.clone()], Duration::ZERO).unwrap().clearing_rejoin(ownership.clone());
        // The queue moved on since its start: a round, but the converter has seen no view.
        while checkpoints.step(&converters, queues) {}
        written(1);
        assert!(!checkpoints.step(&converters, queues), "nothing appended, and no clean checkpoint possible yet");
        assert!(marker.exists(), "no clean checkpoint yet");
        // The converter takes in the rejoined view (with its first batch): a round is due
        // although nothing was appended.
        let placement = Placement::init(&[("a", "a:1")], 4, 1, 0).unwrap();
        ownership.publish(OwnershipView { rejoined: ownership.rejoined(), ..OwnershipView::of(&placement, "a") });
        converters[0].convert(&tessera_testkit::tiles::batch(10_000, Vec::new()), 0).unwrap();
        converters[0].commit();
        assert!(converters[0].took_in_rejoined_view());
        while checkpoints.step(&converters, queues) {}
        written(2);
        // The next interval's step removes the marker.
        checkpoints.step(&converters, queues);
        assert!(!marker.exists(), "every target has a clean checkpoint");
        assert!(!Ownership::with_rejoin_marker(marker).rejoined(), "a restart now keeps what it restores");
        checkpoints.finish(&converters, queues);
    }

    #[test]
    fn a_missing_file_starts_from_zero_and_counts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = target(dir.path());
        let mut converter = Converter::new(&[0.5], 3_600_000);
        assert_eq!(load(&target.dir, &target.name, &target.metrics, &mut converter), Position::default());
        for failure in CheckpointFailure::ALL {
            assert_eq!(target.metrics.errors(failure), 0);
        }
    }

    #[test]
    fn a_corrupt_file_is_counted_set_aside_and_does_not_stop_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let target = target(dir.path());
        let mut converter = Converter::new(&[0.5], 3_600_000);
        let covers = Position { segment: 3, offset: 100 };
        let mut bytes = converter.encode_checkpoint(CheckpointMeta { taken_at_ms: 1, covers }).into_bytes();
        write_atomically(dir.path(), &[&bytes]).unwrap();
        assert_eq!(load(&target.dir, &target.name, &target.metrics, &mut converter), covers, "a good file is used");

        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        write_atomically(dir.path(), &[&bytes[..3], &bytes[3..]]).unwrap();
        assert_eq!(load(&target.dir, &target.name, &target.metrics, &mut converter), Position::default());
        assert_eq!(target.metrics.errors(CheckpointFailure::Corrupt), 1);
        assert!(dir.path().join(CORRUPT_NAME).exists() && !dir.path().join(FILE_NAME).exists());
        assert!(!dir.path().join(TEMPORARY_NAME).exists());
    }

    #[test]
    fn an_unreadable_file_is_counted_as_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = target(dir.path());
        // A directory in the file's place: it exists, and reading it fails.
        std::fs::create_dir(dir.path().join(FILE_NAME)).unwrap();
        let mut converter = Converter::new(&[0.5], 3_600_000);
        assert_eq!(load(&target.dir, &target.name, &target.metrics, &mut converter), Position::default());
        assert_eq!(target.metrics.errors(CheckpointFailure::Read), 1);
        // Writing over it fails too, and is counted, not fatal.
        let error = write_atomically(dir.path(), &[b"x"]).unwrap_err();
        assert_eq!(error.failure(), CheckpointFailure::Write);
        assert!(!dir.path().join(TEMPORARY_NAME).exists());
    }
}
