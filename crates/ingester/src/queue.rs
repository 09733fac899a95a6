//! The durable queue: append-only segment files of checksummed records.
//!
//! What a record holds and how it is framed is [`record`]; the segment files and their done
//! logs are [`segment`].
//!
//! [`open`] replays a queue directory and returns three handles:
//!
//! - [`QueueWriter`] (one, owned by the writer thread) appends framed records to
//!   the active segment, fsyncs by the [`FsyncPolicy`], rotates segments by size, and
//!   refuses a record with [`AppendError::Full`] while the queue holds more than
//!   `max_queue_bytes` (backpressure: the batch is answered `Retryable`);
//! - [`QueueReader`] (one, owned by the dispatcher thread) reads records in order, from
//!   the oldest segment to the one being written, waiting for more at the end;
//! - [`Queue`] (cloneable) marks records done ([`Queue::complete`]) and sink requests done
//!   ([`Queue::request_done`]), from any worker, in any order.
//!
//! A segment is deleted once it is sealed (the writer moved on), the reader has read all
//! of it, every record in it is done, and (with [`QueueOptions::checkpointed`]) the newest
//! checkpoint of the running totals covers all of it ([`Queue::checkpointed`]): records
//! appended after that checkpoint stay on disk, delivered or not, so that a restart can roll
//! the totals forward through them ([`crate::admit::checkpoint`]). Records complete out
//! of order, so segments may be deleted out of order too. Sink requests that reached
//! storage are appended to the segment's done log, so that after a crash only the requests
//! that were in flight are sent again ([`segment`]).
//!
//! **Failed writes and fsyncs.** A record whose write or fsync failed is not counted (and
//! not acknowledged: the batch is answered `Retryable`) and is cut off the segment. After a
//! failed fsync the kernel may have dropped the segment's dirty pages, so nothing more is
//! appended to it: it is sealed at what was counted, and the next append starts a new
//! segment. With `fsync = "interval"` the records appended since the last good fsync were
//! already acknowledged; they stay queued and are delivered while the process lives, and are
//! counted as at risk (a power loss before their delivery loses them). Nothing waits for a
//! restart: once the disk takes writes again, so does the queue.
//!
//! **Replay.** On start every segment is scanned: whole records are counted, a torn or
//! corrupt tail (short header, impossible length, short payload, CRC mismatch) is counted
//! and truncated, a file with a bad header is renamed `.corrupt`. Nothing panics. All old
//! segments are sealed; writing continues in a new one.
//!
//! ```
//! use tessera_ingester::record::{self, Record};
//! use tessera_ingester::{FsyncPolicy, QueueOptions, open_queue};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let options = QueueOptions::new(dir.path().to_owned(), 1 << 30, 64 << 20, FsyncPolicy::Always);
//! let (queue, mut writer, mut reader, _replay) = open_queue(options, Default::default()).unwrap();
//! writer.append(&record::encode(&Record { tile_end_ms: 10_000, ..Default::default() })).unwrap();
//! let read = reader.next_record().unwrap().expect("a record");
//! assert_eq!(record::decode_payload(read.payload).unwrap().tile_end_ms, 10_000);
//! queue.complete(read.position);
//! assert_eq!(queue.pending_records(), 0);
//! ```

mod metrics;
mod reader;
pub mod record;
pub mod segment;
pub mod series;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_runtime::logging::RateLimitedLog;

pub use metrics::{QueueMetrics, TargetQueueMetrics};
pub use reader::QueueReader;
pub use segment::RequestKey;

/// When appended records are fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Before every acknowledgement: an acked batch survives a power loss.
    Always,
    /// At most this long after an append: an acked batch survives a crash of the process
    /// at once, and a power loss after the interval.
    Interval(Duration),
    /// Never explicitly (the kernel writes back on its own): survives a process crash only.
    Never,
}

/// How a queue is laid out and bounded.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Directory of the segment files (created if missing).
    pub dir: PathBuf,
    /// Above this many bytes on disk, appends are refused.
    pub max_queue_bytes: u64,
    /// A segment is sealed and a new one started once it passes this size.
    pub segment_max_bytes: u64,
    /// Largest record accepted; a longer length field marks a corrupt record.
    pub max_record_bytes: usize,
    /// When appends are fsynced.
    pub fsync: FsyncPolicy,
    /// `Some`: a segment is also kept until a checkpoint covers it, starting from this
    /// position (that of the checkpoint found at start, or the default for none) and moved
    /// on by [`Queue::checkpointed`]; new segments are numbered after it. `None`: a segment
    /// goes once it is done.
    pub checkpointed: Option<Position>,
}

impl QueueOptions {
    /// Options with `max_record_bytes` at 1 GiB and no checkpoint to wait for.
    pub fn new(dir: PathBuf, max_queue_bytes: u64, segment_max_bytes: u64, fsync: FsyncPolicy) -> Self {
        QueueOptions { dir, max_queue_bytes, segment_max_bytes, max_record_bytes: 1 << 30, fsync, checkpointed: None }
    }
}

/// Why the queue could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A file or directory operation failed.
    #[error("cannot open the queue in {dir}")]
    Io {
        /// The queue directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Why a record was not appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The queue is over its byte bound; try again later.
    #[error("queue full: {bytes} bytes queued, the bound is {max} bytes")]
    Full {
        /// Bytes on disk.
        bytes: u64,
        /// The bound.
        max: u64,
    },
    /// Writing, fsyncing or starting a segment failed; nothing of the record is counted.
    #[error("queue write failed")]
    Io(#[from] io::Error),
}

/// Where a record is: segment id and byte offset. Positions order as the records were
/// appended (segment ids only grow). As the end of what a checkpoint covers, every record
/// before the position is covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// Segment id.
    pub segment: u64,
    /// Offset of the record's frame header in the segment.
    pub offset: u64,
}

/// What the replay at start found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Segments kept.
    pub segments: u64,
    /// Whole records in them.
    pub records: u64,
    /// Torn or corrupt records cut off (or files set aside).
    pub corrupt: u64,
    /// Bytes cut off.
    pub truncated_bytes: u64,
}

/// A record read from the queue.
#[derive(Debug)]
pub struct ReadRecord {
    /// Where it is.
    pub position: Position,
    /// The checked payload (see [`record::decode_payload`]).
    pub payload: Bytes,
    /// Sink requests of this record that the done log says reached storage before a restart.
    pub already_done: Vec<RequestKey>,
}

/// The shared side of the queue: completion, and what the metrics show. Cheap to clone.
#[derive(Clone)]
pub struct Queue {
    shared: Arc<Shared>,
}

struct Shared {
    options: QueueOptions,
    state: Mutex<State>,
    wakeup: Condvar,
    metrics: TargetQueueMetrics,
}

#[derive(Default)]
struct State {
    segments: BTreeMap<u64, Segment>,
    bytes: u64,
    pending_records: u64,
    closed: bool,
    /// What the newest durable checkpoint covers (see [`QueueOptions::checkpointed`]).
    checkpointed: Option<Position>,
}

#[derive(Default)]
struct Segment {
    len: u64,
    records: u64,
    read: u64,
    done: u64,
    sealed: bool,
    read_all: bool,
    done_log: Option<File>,
    replayed_done: HashMap<u64, Vec<RequestKey>>,
}

/// The handles [`open`] returns.
pub type Opened = (Queue, QueueWriter, QueueReader, Replay);

/// Opens (replaying) the queue in `options.dir`.
pub fn open(options: QueueOptions, metrics: TargetQueueMetrics) -> Result<Opened, OpenError> {
    open_visiting(options, metrics, &mut |_, _| {})
}

/// Like [`open`], showing the position and payload of every record the replay keeps to
/// `visit`, in append order (to rebuild state that depends on what is queued).
pub fn open_visiting(
    options: QueueOptions,
    metrics: TargetQueueMetrics,
    visit: &mut dyn FnMut(Position, &[u8]),
) -> Result<Opened, OpenError> {
    let dir = options.dir.clone();
    let io_error = |source| OpenError::Io { dir: dir.clone(), source };
    std::fs::create_dir_all(&dir).map_err(io_error)?;
    let mut state = State { checkpointed: options.checkpointed, ..State::default() };
    let mut replay = Replay::default();
    let ids = segment::list_segments(&dir).map_err(io_error)?;
    for &id in &ids {
        let mut visit_in_segment = |offset, payload: &[u8]| visit(Position { segment: id, offset }, payload);
        let scan = segment::scan(&dir, id, options.max_record_bytes, &mut visit_in_segment).map_err(io_error)?;
        if scan.corrupt {
            replay.corrupt += 1;
            replay.truncated_bytes += scan.truncated_bytes;
            tracing::warn!(
                segment = id,
                truncated_bytes = scan.truncated_bytes,
                bad_header = scan.bad_header,
                "queue segment had a torn or corrupt tail; cut it off"
            );
        }
        if scan.bad_header {
            continue;
        }
        if scan.records == 0 {
            segment::remove(&dir, id).map_err(io_error)?;
            continue;
        }
        let replayed_done = segment::read_done(&dir, id).map_err(io_error)?;
        replay.segments += 1;
        replay.records += scan.records;
        state.bytes += scan.len;
        state.pending_records += scan.records;
        state.segments.insert(
            id,
            Segment { len: scan.len, records: scan.records, sealed: true, replayed_done, ..Segment::default() },
        );
    }
    // After every segment, and after what the checkpoint covers (its segments may be gone).
    let after_checkpoint = options.checkpointed.map_or(1, |covered| covered.segment + 1);
    let active = ids.last().map_or(1, |last| last + 1).max(after_checkpoint);
    let file = segment::create(&dir, active, options.fsync != FsyncPolicy::Never).map_err(io_error)?;
    let header = segment::MAGIC.len() as u64;
    state.bytes += header;
    state.segments.insert(active, Segment { len: header, ..Segment::default() });
    metrics.replayed_records.inc_by(replay.records);
    metrics.corrupt_records.inc_by(replay.corrupt);
    let shared = Arc::new(Shared { options, state: Mutex::new(state), wakeup: Condvar::new(), metrics });
    let queue = Queue { shared: shared.clone() };
    queue.publish(&queue.lock());
    let writer = QueueWriter {
        shared: shared.clone(),
        file,
        segment: active,
        len: header,
        unsynced: false,
        unsynced_records: 0,
        last_sync: Instant::now(),
        seal_pending: false,
    };
    let reader = QueueReader { shared, segment: None, file: None, offset: 0 };
    Ok((queue, writer, reader, replay))
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update under this lock is a few field writes; a panic cannot leave it half done.
        self.shared.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, state: &State) {
        let metrics = &self.shared.metrics;
        metrics.bytes.set(state.bytes as i64);
        metrics.records.set(state.pending_records as i64);
        metrics.segments.set(state.segments.len() as i64);
    }

    /// Marks the record at `position` done: every sample of it reached storage (or was
    /// rejected for good). Deletes its segment if that was the last one pending.
    pub fn complete(&self, position: Position) {
        let mut state = self.lock();
        let Some(segment) = state.segments.get_mut(&position.segment) else {
            tracing::error!(?position, "completed a record of a segment that is gone");
            return;
        };
        segment.done += 1;
        state.pending_records = state.pending_records.saturating_sub(1);
        self.maybe_delete(&mut state, position.segment);
        self.publish(&state);
    }

    /// Appends "request `key` of the record at `position` reached storage" to the done log.
    /// Best effort: a failure is logged and only means a resend after a restart.
    pub fn request_done(&self, position: Position, key: RequestKey) {
        let mut state = self.lock();
        let dir = self.shared.options.dir.clone();
        let Some(segment) = state.segments.get_mut(&position.segment) else { return };
        if segment.done_log.is_none() {
            match segment::open_done(&dir, position.segment) {
                Ok(file) => segment.done_log = Some(file),
                Err(error) => {
                    tracing::warn!(%error, segment = position.segment, "cannot open the done log");
                    return;
                }
            }
        }
        if let Some(file) = segment.done_log.as_mut()
            && let Err(error) = file.write_all(&segment::done_entry(position.offset, key))
        {
            tracing::warn!(%error, segment = position.segment, "cannot append to the done log");
        }
    }

    /// Records not yet done.
    pub fn pending_records(&self) -> u64 {
        self.lock().pending_records
    }

    /// Bytes of segment files on disk.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Segment files on disk.
    pub fn segments(&self) -> usize {
        self.lock().segments.len()
    }

    /// Wakes the reader and makes it return `None` from now on (shutdown).
    pub fn close(&self) {
        self.lock().closed = true;
        self.shared.wakeup.notify_all();
    }

    /// What the newest durable checkpoint covers, when the queue waits for checkpoints.
    pub fn checkpoint_covers(&self) -> Option<Position> {
        self.lock().checkpointed
    }

    /// A checkpoint covering every record before `covers` is durable: segments it covers
    /// that are done may go now. A position older than the one known is ignored.
    pub fn checkpointed(&self, covers: Position) {
        let mut state = self.lock();
        let Some(known) = state.checkpointed else { return };
        if covers <= known {
            return;
        }
        state.checkpointed = Some(covers);
        let covered: Vec<u64> = state.segments.range(..=covers.segment).map(|(id, _)| *id).collect();
        for id in covered {
            self.maybe_delete(&mut state, id);
        }
        self.publish(&state);
    }

    fn maybe_delete(&self, state: &mut State, id: u64) {
        let Some(segment) = state.segments.get(&id) else { return };
        if !(segment.sealed && segment.read_all && segment.done >= segment.records) {
            return;
        }
        let end = Position { segment: id, offset: segment.len };
        if state.checkpointed.is_some_and(|covered| end > covered) {
            // Records after the newest checkpoint: kept for the roll-forward at start.
            return;
        }
        let len = segment.len;
        state.segments.remove(&id);
        state.bytes = state.bytes.saturating_sub(len);
        if let Err(error) = segment::remove(&self.shared.options.dir, id) {
            tracing::error!(%error, segment = id, "cannot delete a finished queue segment");
        }
    }
}

/// Appends records; see the [module docs](self).
pub struct QueueWriter {
    shared: Arc<Shared>,
    file: File,
    segment: u64,
    /// Bytes of the active segment that are counted (records appended and, by the policy,
    /// made durable).
    len: u64,
    /// Bytes written since the last fsync.
    unsynced: bool,
    /// Counted records written since the last fsync.
    unsynced_records: u64,
    last_sync: Instant,
    /// The active segment takes no more appends (an fsync failed, or a failed write could
    /// not be cut off): the next append seals it and starts a new one.
    seal_pending: bool,
}

/// Failed fsyncs and cut-backs: a failing disk fails every retry, so a few are logged and
/// all are counted.
static QUEUE_DISK_LOG: RateLimitedLog = RateLimitedLog::new("ingester.queue_disk", 5);

impl QueueWriter {
    fn queue(&self) -> Queue {
        Queue { shared: self.shared.clone() }
    }

    /// Appends one framed record ([`record::encode`]) and makes it durable by the fsync
    /// policy. A record larger than the bound is still taken when nothing is pending, so
    /// that no batch is refused forever.
    pub fn append(&mut self, frame: &[u8]) -> Result<Position, AppendError> {
        let added = frame.len() as u64;
        {
            let queue = self.queue();
            let state = queue.lock();
            let max = self.shared.options.max_queue_bytes;
            if state.pending_records > 0 && state.bytes + added > max {
                return Err(AppendError::Full { bytes: state.bytes, max });
            }
        }
        let header = segment::MAGIC.len() as u64;
        if self.seal_pending || (self.len > header && self.len + added > self.shared.options.segment_max_bytes) {
            self.rotate()?;
        }
        let offset = self.len;
        let written = self.file.write_all(frame);
        if written.is_ok() {
            self.unsynced = true;
        }
        let durable = written.map_err(AppendError::Io).and_then(|()| match self.shared.options.fsync {
            FsyncPolicy::Always => self.sync(),
            _ => Ok(()),
        });
        if let Err(error) = durable {
            self.cut_off_uncounted();
            return Err(error);
        }
        self.len += added;
        if self.unsynced {
            self.unsynced_records += 1;
        }
        let queue = self.queue();
        let mut state = queue.lock();
        if let Some(segment) = state.segments.get_mut(&self.segment) {
            segment.len += added;
            segment.records += 1;
        }
        state.bytes += added;
        state.pending_records += 1;
        queue.publish(&state);
        drop(state);
        self.shared.wakeup.notify_all();
        Ok(Position { segment: self.segment, offset })
    }

    /// The position after the last record appended: a checkpoint taken now covers every
    /// record before it.
    pub fn appended_through(&self) -> Position {
        Position { segment: self.segment, offset: self.len }
    }

    /// Whether an append would be refused as full now (checked before converting a batch).
    pub fn is_full(&self) -> bool {
        let queue = self.queue();
        let state = queue.lock();
        state.pending_records > 0 && state.bytes >= self.shared.options.max_queue_bytes
    }

    /// Fsyncs the active segment if there are unsynced appends.
    pub fn sync(&mut self) -> Result<(), AppendError> {
        if !self.unsynced {
            return Ok(());
        }
        let synced = self.file.sync_data();
        self.unsynced = false;
        let at_risk = std::mem::take(&mut self.unsynced_records);
        if let Err(error) = synced {
            // After a failed fsync the kernel may have dropped the dirty pages, and a retry
            // would report success without writing them: this segment takes no more.
            let metrics = &self.shared.metrics;
            metrics.fsync_errors.inc();
            metrics.records_at_risk.inc_by(at_risk);
            if QUEUE_DISK_LOG.allow() {
                tracing::error!(%error, segment = self.segment, at_risk, "queue fsync failed; sealing the segment");
            }
            self.seal_pending = true;
            return Err(AppendError::Io(error));
        }
        self.shared.metrics.fsyncs.inc();
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Cuts the file back to its counted length after a failed write or fsync; if that
    /// fails too, the uncounted tail stays past the counted end (never read) and the
    /// segment is sealed at the next append.
    fn cut_off_uncounted(&mut self) {
        if let Err(error) = segment::cut_back(&mut self.file, self.len) {
            if QUEUE_DISK_LOG.allow() {
                tracing::error!(%error, segment = self.segment, "cannot cut a failed write off the queue segment");
            }
            self.seal_pending = true;
        }
    }

    /// Under [`FsyncPolicy::Interval`], fsyncs if the interval has passed since the last
    /// fsync; call it whenever the writer is idle. Returns how long until the next is due.
    pub fn sync_if_due(&mut self) -> Duration {
        let FsyncPolicy::Interval(interval) = self.shared.options.fsync else {
            return Duration::from_secs(1);
        };
        let elapsed = self.last_sync.elapsed();
        if self.unsynced && elapsed >= interval {
            let _ = self.sync();
            return interval;
        }
        interval.saturating_sub(elapsed).max(Duration::from_millis(1))
    }

    /// Seals the active segment and starts the next. A failed fsync of the old segment is
    /// counted and does not stop the rotation; a failure to start the new one is returned,
    /// and the next append tries again.
    fn rotate(&mut self) -> Result<(), AppendError> {
        let durable = self.shared.options.fsync != FsyncPolicy::Never;
        if durable && !self.seal_pending {
            let _ = self.sync();
        }
        if self.seal_pending {
            let _ = segment::cut_back(&mut self.file, self.len);
        }
        let next = self.segment + 1;
        let file = segment::create(&self.shared.options.dir, next, durable)?;
        self.seal_pending = false;
        let previous = self.segment;
        self.file = file;
        self.segment = next;
        self.len = segment::MAGIC.len() as u64;
        let queue = self.queue();
        let mut state = queue.lock();
        state.segments.insert(next, Segment { len: self.len, ..Segment::default() });
        state.bytes += self.len;
        if let Some(segment) = state.segments.get_mut(&previous) {
            segment.sealed = true;
        }
        queue.maybe_delete(&mut state, previous);
        queue.publish(&state);
        drop(state);
        self.shared.wakeup.notify_all();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
