//! The intake writer thread: decodes each frame, converts its tiles, appends the record
//! to its target's queue and decides the acknowledgement.
//!
//! One thread does this for every connection, so records are converted and appended in
//! one order: running totals advance in queue order, and a batch's conversion is undone
//! if its record could not be queued. The thread owns the [`Converter`] and every
//! [`QueueWriter`]; connections hand it [`Job`]s through a bounded channel and wait for
//! the [`Answer`]. Between two jobs it takes the converters' checkpoints when they are
//! due, and the final ones at shutdown ([`checkpoint`]).
//!
//! | situation | answer |
//! |---|---|
//! | record durable (by the fsync policy) | `Ok` |
//! | the same batch (source, policy, tile end, sequence) was queued recently (asked first, fenced or not: every refusal below means the batch was not taken) | `Ok`, reason `duplicate`, not queued twice |
//! | the ingester is fenced off: its liveness lease may expire ([`crate::tier::fence`]), unless the batch was in hand when the fence fell: a tile that ended by then, routed under the view held then or an older version it does not contradict (queued whatever the fence and the placement say now, written once the fence lifts) | `Retryable`, reason `fenced` |
//! | routed under a newer placement version than the ingester has seen | `Retryable`, reason `placement_ahead` (taken once it catches up) |
//! | routed under an older version, with a series of a shard the ingester does not own in its own | `Retryable`, reason `placement_stale` (the sender routes it again) |
//! | the target's queue is over `max_queue_bytes` | `Retryable`, reason `queue_full` |
//! | writing or fsyncing the queue failed | `Retryable`, reason `queue_io` |
//! | no storage policy and no resolution, or no tile end | `Permanent`, reason `invalid_batch` |
//! | a valid frame that is not a tile batch, a frame without a body, bytes that are not a frame | `Permanent` (`unexpected_frame`, `malformed_frame`), then the connection is closed |

use std::collections::{HashMap, HashSet, VecDeque};

use tessera_proto::frame::Body;
use tessera_proto::{AckReason, TileBatch};
use tessera_runtime::RateLimitedLog;
use tessera_wire::{Answer, take_batch};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

pub mod checkpoint;
mod metrics;

pub use metrics::{CheckpointFailure, CheckpointMetrics, WriterMetrics};

use std::sync::Arc;

use tessera_core::shard::shard_of;

use crate::admit::Converter;
use crate::admit::names::resolution_label;
use crate::intake::FrameJob;
use crate::tier::fence::Fell;
use crate::tier::{Fence, Ownership, OwnershipView};
use checkpoint::Checkpoints;
use tessera_core::clock::now_ms;

static QUEUE_IO_LOG: RateLimitedLog = RateLimitedLog::new("ingester.queue_io", 5);
static NO_TARGET_LOG: RateLimitedLog = RateLimitedLog::new("ingester.no_target", 1);
use crate::queue::record::{self, batch_key};
use crate::queue::{AppendError, QueueWriter};

/// Work for the writer thread.
pub enum Job {
    /// A frame read by a connection.
    Frame(FrameJob),
    /// Time passed: fsync if the interval policy says so, checkpoint if one is due.
    Tick,
}

impl From<FrameJob> for Job {
    fn from(frame: FrameJob) -> Job {
        Job::Frame(frame)
    }
}

/// Remembers the keys of recently queued batches, oldest forgotten first.
pub struct RecentBatches {
    keys: HashSet<u128>,
    order: VecDeque<u128>,
    capacity: usize,
}

impl RecentBatches {
    /// Remembers up to `capacity` batches.
    pub fn new(capacity: usize) -> RecentBatches {
        RecentBatches { keys: HashSet::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// Whether `key` was queued recently.
    pub fn contains(&self, key: u128) -> bool {
        self.keys.contains(&key)
    }

    /// Remembers `key`.
    pub fn insert(&mut self, key: u128) {
        if !self.keys.insert(key) {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
    }
}

/// Everything the writer thread owns.
pub struct Writer {
    /// Converts batches to records, one per target (by target index): each keeps the
    /// running totals of the series routed to it.
    pub converters: Vec<Converter>,
    /// One queue writer per target, by target index.
    pub queues: Vec<QueueWriter>,
    /// Which target stores each storage policy.
    pub routes: Routes,
    /// Batches queued recently (rebuilt from the queue at start).
    pub recent: RecentBatches,
    /// Metric handles.
    pub metrics: WriterMetrics,
    /// Takes the converters' checkpoints (`None`: none, as in benchmarks).
    pub checkpoints: Option<Checkpoints>,
    /// Whether this ingester may take batches now ([`crate::tier::fence`]).
    pub fence: Arc<Fence>,
    /// Which shards this ingester owns, with a placement: a batch routed under another
    /// version of it is checked against it.
    pub ownership: Option<Arc<Ownership>>,
}

/// Which target stores a batch: by its storage policy (`10s:2d`), else by its resolution
/// (`10s`), as the targets' `takes` say; a policy named whole wins over its resolution.
#[derive(Debug, Default)]
pub struct Routes {
    /// Storage policies named whole, with their target's index.
    policies: HashMap<String, usize>,
    /// Resolutions, with their target's index.
    resolutions: HashMap<String, usize>,
}

impl Routes {
    /// Routes `takes` (resolutions, or policies when they hold a `:`) to target `index`;
    /// the first target to name an entry keeps it.
    pub fn add(&mut self, takes: &[String], index: usize) {
        for entry in takes {
            let table = if entry.contains(':') { &mut self.policies } else { &mut self.resolutions };
            table.entry(entry.trim().to_owned()).or_insert(index);
        }
    }

    /// The target of a batch of `storage_policy` whose resolution label is `resolution`.
    pub fn target_of(&self, storage_policy: &str, resolution: &str) -> Option<usize> {
        self.policies.get(storage_policy.trim()).or_else(|| self.resolutions.get(resolution)).copied()
    }
}

/// Answers `sequence` with `reason`, counted in `batch_acks_total` under its status and
/// reason.
fn answer(metrics: &WriterMetrics, reason: AckReason, sequence: u64, message: String) -> Answer {
    metrics.ack(Some(reason));
    Answer::refusal(sequence, reason, message)
}

/// Takes `sequence`: acknowledged with no reason, counted.
fn taken(metrics: &WriterMetrics, sequence: u64) -> Answer {
    metrics.ack(None);
    Answer::taken(sequence)
}

impl Writer {
    /// Runs until every sender of `jobs` is gone, then fsyncs every queue and writes the
    /// final checkpoints.
    pub fn run(mut self, mut jobs: mpsc::Receiver<Job>) {
        loop {
            let job = match jobs.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Disconnected) => break,
                // Nothing waits: a checkpoint being encoded goes on, else wait for a job.
                Err(TryRecvError::Empty) if self.checkpoint_step() => continue,
                Err(TryRecvError::Empty) => match jobs.blocking_recv() {
                    Some(job) => job,
                    None => break,
                },
            };
            match job {
                Job::Tick => {
                    for queue in &mut self.queues {
                        queue.sync_if_due();
                    }
                }
                Job::Frame(FrameJob { body, read_at, reply }) => {
                    let answer = self.handle(&body);
                    if let Answer::Ack(_) = &answer {
                        self.metrics.durable_duration.observe(read_at.elapsed().as_secs_f64());
                    }
                    let _ = reply.send(answer);
                }
            }
            // One step after every job too, so that a checkpoint progresses under a steady
            // flow (when ticks may not get through), a batch waiting at most one step.
            self.checkpoint_step();
        }
        for queue in &mut self.queues {
            if let Err(error) = queue.sync() {
                tracing::error!(%error, "final queue fsync failed");
            }
        }
        if let Some(checkpoints) = self.checkpoints.take() {
            checkpoints.finish(&self.converters, &self.queues);
        }
    }

    /// Starts or continues the checkpoints, if any are due; returns whether it did.
    fn checkpoint_step(&mut self) -> bool {
        match &mut self.checkpoints {
            Some(checkpoints) => checkpoints.step(&self.converters, &self.queues),
            None => false,
        }
    }

    /// Decides what to do with one frame body.
    pub fn handle(&mut self, body: &[u8]) -> Answer {
        self.metrics.bytes_received.inc_by(body.len() as u64);
        let taken = take_batch(body, "an ingester takes tile batches", |body| match body {
            Body::Tiles(batch) => Ok(batch),
            other => Err(other),
        });
        match taken {
            Ok(batch) => self.batch(&batch),
            Err(bad) => bad.into(),
        }
    }

    fn batch(&mut self, batch: &TileBatch) -> Answer {
        if batch.tiles.is_empty() {
            // A heartbeat (an aggregator keeping an idle connection open), or a batch
            // with nothing to store: acknowledged, nothing queued.
            self.metrics.heartbeats.inc();
            return taken(&self.metrics, batch.sequence);
        }
        // A batch queued already is answered so before any refusal: a refusal then always
        // means this ingester did not take the batch, which the next owner relies on when
        // the batch is routed to it again (`owner_refused`).
        let key = batch_key(&batch.source, &batch.storage_policy, batch.tile_end_ms, batch.sequence);
        if self.recent.contains(key) {
            self.metrics.batches_received.inc();
            return answer(&self.metrics, AckReason::Duplicate, batch.sequence, "batch already queued".to_owned());
        }
        let refusal = if self.fence.allows() {
            let view = self.ownership.as_ref().and_then(|ownership| ownership.current());
            view.and_then(|view| placement_refusal(&view, batch))
        } else {
            let message = "the ingester is fenced off (its liveness lease may expire); send again later".to_owned();
            Some((AckReason::Fenced, message))
        };
        // A batch in hand when the fence last fell is taken whatever the fence and the view say
        // now; asked only of a batch they would refuse.
        if let Some((reason, message)) = refusal
            && !self.fence.fell().is_some_and(|fell| in_hand_when_fenced(&fell, batch))
        {
            return answer(&self.metrics, reason, batch.sequence, message);
        }
        let received_at_ms = now_ms();
        self.metrics.batches_received.inc();
        self.metrics.tiles_received.inc_by(batch.tiles.len() as u64);
        let sequence = batch.sequence;
        let Some(resolution) = resolution_label(&batch.storage_policy, batch.resolution_ms) else {
            let message = format!("batch from `{}` has no storage policy and no resolution", batch.source);
            return answer(&self.metrics, AckReason::InvalidBatch, sequence, message);
        };
        let Some(target) = self.routes.target_of(&batch.storage_policy, &resolution) else {
            if NO_TARGET_LOG.allow() {
                tracing::warn!(
                    policy = batch.storage_policy,
                    resolution,
                    "tiles of a storage policy no target stores are acknowledged and not stored; \
                     list it in sink_policies or give it [policy_sinks.\"<policy>\"] to store it"
                );
            }
            return answer(
                &self.metrics,
                AckReason::NoTarget,
                sequence,
                "no target stores this storage policy".to_owned(),
            );
        };
        let (Some(queue), Some(converter)) = (self.queues.get_mut(target), self.converters.get_mut(target)) else {
            return answer(&self.metrics, AckReason::QueueIo, sequence, "no queue for the target".to_owned());
        };
        if queue.is_full() {
            return answer(&self.metrics, AckReason::QueueFull, sequence, "ingester queue is full".to_owned());
        }
        let conversion = match converter.convert(batch, received_at_ms) {
            Ok(conversion) => conversion,
            Err(error) => return answer(&self.metrics, AckReason::InvalidBatch, sequence, error.to_string()),
        };
        let frame = record::encode(&conversion.record);
        match queue.append(&frame) {
            Ok(_) => {
                converter.commit();
                self.recent.insert(key);
                self.metrics.tiles_skipped(&conversion.skipped);
                self.metrics.samples_queued.inc_by(conversion.record.samples.len() as u64);
                let series: usize = self.converters.iter().map(Converter::cumulative_series).sum();
                self.metrics.cumulative_series.set(series as i64);
                let histograms: usize = self.converters.iter().map(Converter::cumulative_histograms).sum();
                self.metrics.cumulative_histograms.set(histograms as i64);
                if batch.flushed_at_ms > 0 {
                    let lag = (received_at_ms - batch.flushed_at_ms).max(0) as f64 / 1000.0;
                    self.metrics.intake_lag(&conversion.record.resolution, lag);
                }
                taken(&self.metrics, sequence)
            }
            Err(error) => {
                converter.rollback();
                let reason = match error {
                    AppendError::Full { .. } => AckReason::QueueFull,
                    AppendError::Io(_) => {
                        // A full disk fails every retry: log a few, count them all (batch_acks_total).
                        if QUEUE_IO_LOG.allow() {
                            tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "cannot append to the queue");
                        }
                        AckReason::QueueIo
                    }
                };
                answer(&self.metrics, reason, sequence, format!("batch not queued: {}", reason.as_str()))
            }
        }
    }
}

/// Whether `batch` was in hand when the fence last `fell`, and is queued whatever the fence
/// and the placement say now (written once the fence lifts): a tile that ended by then,
/// routed under the view held then or an older version that view does not contradict (a
/// batch sent before a pause past the lease, read from the socket after it; see
/// [`crate::tier::fence`]).
fn in_hand_when_fenced(fell: &Fell, batch: &TileBatch) -> bool {
    let Some(view) = &fell.view else { return false };
    batch.tile_end_ms <= fell.at_ms
        && batch.placement_version != 0
        && batch.placement_version <= view.version
        && placement_refusal(view, batch).is_none()
}

/// Why a batch routed under another version of the ingesters' placement than `view`'s is
/// refused, if it is: routed under a newer one, it waits until this ingester has caught up
/// (`placement_ahead`); under an older one, it is refused only if it holds a series of a
/// shard this ingester does not own in `view` (`placement_stale`), which the sender routes
/// again. A batch without a version (a fixed list of ingesters) is not checked.
fn placement_refusal(view: &OwnershipView, batch: &TileBatch) -> Option<(AckReason, String)> {
    let sent_under = batch.placement_version;
    if sent_under == 0 || sent_under == view.version {
        return None;
    }
    if sent_under > view.version {
        let message = format!("routed under placement version {sent_under}, this ingester has seen {}", view.version);
        return Some((AckReason::PlacementAhead, message));
    }
    let owned = |id: &[u8]| view.owned.get(shard_of(id, view.num_shards) as usize).copied().unwrap_or(false);
    let not_owned = batch.tiles.iter().filter(|value| !owned(&value.series_id)).count();
    (not_owned > 0).then(|| {
        let message = format!(
            "routed under placement version {sent_under}; in version {} this ingester does not own the shards of \
             {not_owned} of its series",
            view.version
        );
        (AckReason::PlacementStale, message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_named_whole_wins_over_its_resolution_and_others_have_no_target() {
        let mut routes = Routes::default();
        routes.add(&["10s".to_owned()], 0);
        routes.add(&["1m:40d".to_owned()], 1);
        routes.add(&["10s:7d".to_owned(), "10s".to_owned()], 2);
        assert_eq!(routes.target_of("10s:2d", "10s"), Some(0), "by resolution");
        assert_eq!(routes.target_of("10s:7d", "10s"), Some(2), "a policy named whole wins");
        assert_eq!(routes.target_of(" 1m:40d ", "1m"), Some(1));
        assert_eq!(routes.target_of("1m:1h", "1m"), None, "1 m tiles of another policy have no target");
        assert_eq!(routes.target_of("", "5s"), None);
    }

    #[test]
    fn recent_batches_forget_the_oldest() {
        let mut recent = RecentBatches::new(2);
        recent.insert(1);
        recent.insert(2);
        recent.insert(2);
        assert!(recent.contains(1));
        recent.insert(3);
        assert!(!recent.contains(1));
        assert!(recent.contains(2) && recent.contains(3));
    }

    /// Fault campaign seed 22 with partitions (fix 23): an aggregator sent a tile to this
    /// ingester under version 9, which then sat paused past its lease with the batch in its
    /// socket. On waking it took in the failover's view (10: owning nothing) and a lease
    /// granted again before it read the batch. The batch is in hand: taken while fenced and
    /// after the fence lifted (here: it passes both checks and meets no target), never
    /// `fenced` nor `placement_stale`; a batch of a later tile, or under the failover's
    /// version, is not.
    #[test]
    fn a_batch_in_hand_when_the_fence_fell_is_taken_past_a_new_view_and_lease() {
        use std::time::{Duration, Instant};
        use tessera_proto::SeriesValue;
        use tessera_topology::{LeaseDeadline, Placement};

        let placement = Placement::init(&[("a", "a:1")], 8, 1, 0).unwrap();
        let ownership = Arc::new(Ownership::default());
        let fence = Arc::new(Fence::of_placement(Default::default(), Arc::clone(&ownership)));
        let deadline = LeaseDeadline::default();
        fence.attach(deadline.clone());
        let mut writer = Writer {
            converters: Vec::new(),
            queues: Vec::new(),
            routes: Routes::default(),
            recent: RecentBatches::new(16),
            metrics: WriterMetrics::default(),
            checkpoints: None,
            fence: Arc::clone(&fence),
            ownership: Some(Arc::clone(&ownership)),
        };
        ownership.publish(OwnershipView { version: 9, ..OwnershipView::of(&placement, "a") });
        deadline.set(7, Instant::now() + Duration::from_secs(5));
        fence.approve(7);
        assert!(fence.allows());
        let tile_end_ms = now_ms() - 5_000;
        let batch = |sequence, version, tile_end_ms| TileBatch {
            sequence,
            placement_version: version,
            tile_end_ms,
            resolution_ms: 10_000,
            storage_policy: "10s:1h".into(),
            tiles: vec![SeriesValue { series_id: b"s".to_vec(), ..SeriesValue::default() }],
            ..TileBatch::default()
        };
        let reason = |writer: &mut Writer, batch: &TileBatch| match writer.batch(batch) {
            Answer::Ack(ack) => ack.reason,
            other => panic!("{other:?}"),
        };
        // Paused past the lease; on waking the failover's view comes first, then a new lease.
        deadline.set(7, Instant::now() - Duration::from_secs(1));
        let gone = Placement::init(&[("b", "b:1")], 8, 1, 0).unwrap();
        ownership.publish(OwnershipView { version: 10, ..OwnershipView::of(&gone, "a") });
        assert!(!fence.allows());
        deadline.set(8, Instant::now() + Duration::from_secs(5));
        let no_target = AckReason::NoTarget.as_str();
        assert_eq!(reason(&mut writer, &batch(1, 9, tile_end_ms)), no_target, "in hand while fenced");
        assert_eq!(reason(&mut writer, &batch(2, 9, now_ms() + 60_000)), AckReason::Fenced.as_str(), "a later tile");
        assert_eq!(reason(&mut writer, &batch(3, 10, tile_end_ms)), AckReason::Fenced.as_str(), "not the view held");
        // The placement read under the new lease: the fence lifts. The batch sent again is in
        // hand still, where the current view would call it stale.
        ownership.publish(OwnershipView { version: 11, ..OwnershipView::of(&gone, "a") });
        fence.approve(8);
        assert!(fence.allows());
        assert_eq!(reason(&mut writer, &batch(4, 9, tile_end_ms)), no_target, "in hand after the lift");
        let stale = AckReason::PlacementStale.as_str();
        assert_eq!(reason(&mut writer, &batch(5, 9, now_ms() + 60_000)), stale, "a later tile under the old view");
        // A batch queued already (its ack lost, sent again) is answered so, fenced or not: a
        // `fenced` answer always means not taken, which the next owner relies on.
        deadline.set(8, Instant::now() - Duration::from_secs(1));
        assert!(!fence.allows());
        let resent = batch(6, 9, now_ms() + 60_000);
        writer.recent.insert(batch_key(&resent.source, &resent.storage_policy, resent.tile_end_ms, resent.sequence));
        assert_eq!(reason(&mut writer, &resent), AckReason::Duplicate.as_str(), "queued already");
    }

    #[test]
    fn a_batch_routed_under_another_placement_is_refused_when_this_ingester_cannot_take_it() {
        use tessera_proto::SeriesValue;
        use tessera_topology::Placement;

        let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], 8, 1, 0).unwrap();
        let view = OwnershipView { version: 5, ..OwnershipView::of(&placement, "a") };
        let (mine, theirs): (Vec<String>, Vec<String>) =
            (0..64).map(|n| format!("s{n}")).partition(|id| view.owned[shard_of(id.as_bytes(), 8) as usize]);
        let value = |id: &String| SeriesValue { series_id: id.clone().into_bytes(), ..SeriesValue::default() };
        let batch = |version, ids: &[String]| TileBatch {
            placement_version: version,
            tiles: ids.iter().map(value).collect(),
            ..TileBatch::default()
        };
        let reason = |batch: &TileBatch| placement_refusal(&view, batch).map(|(reason, _)| reason);
        assert_eq!(reason(&batch(0, &theirs)), None, "no version: a fixed list, not checked");
        assert_eq!(reason(&batch(5, &theirs)), None, "the same version: the converter takes what it routed");
        assert_eq!(reason(&batch(6, &mine)), Some(AckReason::PlacementAhead), "newer: wait to catch up");
        assert_eq!(reason(&batch(4, &mine)), None, "older, but every series still this ingester's");
        let mixed = [mine[0].clone(), theirs[0].clone()];
        assert_eq!(reason(&batch(4, &mixed)), Some(AckReason::PlacementStale), "older, with a series moved away");
        assert!(AckReason::PlacementStale.is_retryable() && AckReason::PlacementAhead.is_retryable());
    }
}
