//! High availability: one leader per shard set flushes; the other replicas
//! hold their copy of each closed tile until the leader's flush of it is
//! recorded, and take over from that record if the leader goes.
//!
//! This module is the state the flusher and the election share ([`Leadership`]);
//! the etcd side, the election task, is [`election`].
//!
//! With a replication factor above 1 (and a placement in etcd), the
//! replicas of a shard set receive the same partials from every collector
//! and merge the same tiles. [`run_election`] (a tokio task, one tick every
//! [`TICK`]) keeps this instance's liveness lease, campaigns for the shard
//! set's leader key on that lease
//! ([`tessera_topology::Election`]), and, as leader, records the
//! flush marks: per policy, the end of the last tile every batch of which
//! the ingester acknowledged (with every tile before it). As follower it
//! reads them. The flusher ([`super`]) asks [`Leadership`] before
//! each flush:
//!
//! - **leader**, lease certainly alive for more than [`FENCE_MARGIN`]:
//!   flush every held tile after the marks, oldest first;
//! - **otherwise** (follower, or a leader that lost etcd or was paused past
//!   its lease): hold the tile; drop held tiles once the marks pass them.
//!
//! # Timing (fencing)
//!
//! The lease deadline is the moment the last successful keep-alive was
//! *sent* plus the TTL ([`LeaseDeadline`]); keep-alives go every TTL/3.
//! etcd expires the lease no sooner than TTL after it *received* that
//! keep-alive, and only then can another replica take the key. A leader
//! stops flushing [`FENCE_MARGIN`] before its deadline, so it has stopped
//! before anyone else can start, whatever held it up (etcd away, the
//! process paused: a paused process finds its deadline passed the moment it
//! runs again, before it flushes anything). A tile already queued for the
//! ingester may still go out after that; the ingester treats a second copy
//! of a written tile as a duplicate. Failover after a crash takes the TTL
//! (10 s by default) plus a tick; the tiles that closed meanwhile are held
//! by the new leader and flushed at once.
//!
//! # Incomplete tiles
//!
//! A replica that started after a tile began did not see all of it. It does
//! not campaign while another replica of its shard set is alive and one of
//! its own unflushed or open tiles began before it started: a replica that
//! saw the tile whole leads. It leads anyway when it is the only one left, or
//! when etcd has answered that the shard set has no leader for longer than
//! the longest tile plus `max_buffer_past` ([`Leadership::leaderless_grace`]):
//! a replica that saw its tiles whole would have campaigned within a tick, so
//! none did (replicas started together, with data in their first tile, would
//! otherwise hold it, and every tile after it, for as long as both live). A
//! leader flushes such a tile, which holds what reached it, and counts it in
//! `tessera_aggregator_incomplete_tiles_total`.
//!
//! A replica that saw a tile begin can still miss part of it: when the links
//! from collectors into it stall (or a collector is paused or killed) past the
//! tile's end, it closes the tile at its deadline without their last partials,
//! and takes them into the longer policies' tiles still open when they come
//! (`too_late` once the longest has closed). Such a tile closed
//! *unconfirmed* (a collector seen around it had not reported a watermark past
//! its end: [`Watermarks::confirms`](crate::Watermarks::confirms)) is flushed
//! marked incomplete too. (A window too late for a shorter policy's tile still
//! goes into a longer policy's tile that is open, so that tile lacks nothing
//! for it: RELIABILITY.md, fix 22.) The leader records the ends of the incomplete tiles it
//! flushed with its flush marks (the last [`INCOMPLETE_KEPT`] per policy); a
//! follower flushes its own copy of such a tile instead of letting it go
//! (`tessera_aggregator_tiles_completed_total`), marked incomplete where it may
//! lack something too, and the ingesters let a whole copy replace the incomplete
//! one, and the larger of two incomplete copies replace the smaller
//! (`tessera-ingester`'s admission). Found by the fault campaign (seeds 14 and 23): before, the leader's
//! short copy was the only one written. The whole copy must reach an ingester
//! before the next tile of its series does (it follows the leader's flush by a
//! tick or two, the next tile by a resolution): after that it is a duplicate.
//!
//! A replica of a replicated shard set in etcd holds from its first moment
//! ([`Leadership::hold_until_elected`]), not from its election's first tick: a
//! replica restarted just before a tile ends, with etcd or the machine slow to
//! grant its lease, would otherwise flush its partial copy of that tile before
//! it knew another replica leads (found by the fault campaign, `tessera-chaos`).
//!
//! # Shutdown
//!
//! A leader stopped with SIGTERM while another replica is alive stops
//! flushing, resigns (the other takes over within a tick) and leaves its
//! open tiles to it; alone, it flushes everything, as without replicas.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tessera_topology::{FlushMarks, IncompleteTile, LeaseDeadline};

use crate::outbound::Ingesters;
use crate::tile::StoragePolicy;
use tessera_core::clock::now_ms;

mod election;

pub use election::{ElectionSettings, run_election};

/// How often the election task looks at the leader key and the marks.
pub const TICK: Duration = Duration::from_millis(200);

/// A leader stops flushing this long before its lease could expire (one margin for every
/// fence, shared with the ingesters').
pub use tessera_topology::FENCE_MARGIN;

/// What the flusher and the election task share.
#[derive(Clone)]
pub struct Leadership {
    inner: Arc<Inner>,
}

struct Inner {
    /// Storage policies, indexed as the tiler indexes them.
    policies: Vec<StoragePolicy>,
    /// When this process started, unix ms: tiles that began before are incomplete.
    started_ms: i64,
    /// Replicated shard set with an election running; when false, flush freely.
    replicated: AtomicBool,
    /// The lease this replica leads on (0: it follows). Leadership is tied
    /// to the lease the leader key was put on: if that lease expired and a
    /// new one was granted, the key is gone with the old one.
    leader_lease: AtomicI64,
    /// Another replica of the shard set holds a live lease.
    others_alive: AtomicBool,
    /// The liveness lease's deadline, once registered.
    deadline: OnceLock<LeaseDeadline>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per policy: the marks the shard set's leader recorded.
    marks: Vec<i64>,
    /// Per policy: tiles this replica flushed, oldest first, until acknowledged.
    ledger: Vec<VecDeque<Flushed>>,
    /// Per policy: the end of the last tile acknowledged with all before it.
    acknowledged: Vec<i64>,
    /// Per policy: the latest tiles acknowledged that were flushed incomplete, oldest
    /// first (at most [`INCOMPLETE_KEPT`]), with the version they were routed under:
    /// recorded with the marks, as the leader; read from them, as a follower.
    incomplete: Vec<VecDeque<IncompleteTile>>,
    /// Oldest tile start held unflushed (the flusher says), if any.
    oldest_held_start_ms: Option<i64>,
}

/// One flushed tile awaiting its acknowledgement: the last batch on each
/// ingester queue it went to.
#[derive(Debug, Clone)]
struct Flushed {
    sent: Vec<(usize, u64)>,
    tile_end_ms: i64,
    /// Flushed marked incomplete.
    incomplete: bool,
    /// The ingesters' placement version it was routed under (0: a fixed list). A share
    /// re-routed later keeps the first: the completion's rule at the ingesters looks for
    /// the copy itself where the owner changed since ([`IncompleteTile::routed_version`]).
    routed_version: u64,
}

/// Incomplete tile ends kept per policy with the flush marks: enough for a follower
/// that reads the marks a few ticks late (the marks move a tile or two per tick).
pub const INCOMPLETE_KEPT: usize = 16;

impl Leadership {
    /// Flushes everything until an election says otherwise.
    pub fn new(policies: Vec<StoragePolicy>, started_ms: i64) -> Leadership {
        let count = policies.len();
        let state = State {
            marks: vec![i64::MIN; count],
            ledger: vec![VecDeque::new(); count],
            acknowledged: vec![i64::MIN; count],
            incomplete: vec![VecDeque::new(); count],
            oldest_held_start_ms: None,
        };
        Leadership {
            inner: Arc::new(Inner {
                policies,
                started_ms,
                replicated: AtomicBool::new(false),
                leader_lease: AtomicI64::new(0),
                others_alive: AtomicBool::new(false),
                deadline: OnceLock::new(),
                state: Mutex::new(state),
            }),
        }
    }

    /// Holds every tile until the election says this replica leads: for a replica of a
    /// replicated shard set in etcd, from its first moment. Until its election task has
    /// registered its lease and looked at the leader key (a lease grant and a few etcd
    /// requests, seconds when etcd or the machine is slow) it cannot know whether another
    /// replica leads, and a replica restarted mid-tile would otherwise flush its partial
    /// copy of that tile, which the ingester could take before the leader's whole one.
    pub fn hold_until_elected(&self) {
        self.inner.replicated.store(true, Ordering::Release);
    }

    /// Whether this replica may flush now.
    pub fn may_flush(&self) -> bool {
        if !self.replicated() {
            return true;
        }
        self.leads() && self.lease_remaining() > FENCE_MARGIN
    }

    pub(super) fn replicated(&self) -> bool {
        self.inner.replicated.load(Ordering::Acquire)
    }

    /// Whether this replica holds the leader key (it may be fenced off).
    fn leads(&self) -> bool {
        self.inner.leader_lease.load(Ordering::Acquire) != 0
    }

    /// At shutdown: whether to flush what is left (every open tile, closed
    /// early). Not when another replica is alive to flush it whole.
    pub fn may_flush_at_shutdown(&self) -> bool {
        !self.replicated() || !self.inner.others_alive.load(Ordering::Acquire)
    }

    /// The shard set leader's marks, per policy: tiles ending at or before
    /// a policy's mark were flushed (`i64::MIN`: none recorded).
    pub fn marks(&self) -> Vec<i64> {
        self.state().marks.clone()
    }

    /// Whether a tile that began at `tile_start_ms` began before this process: its
    /// copy may lack partials (sent as `incomplete`, so that an ingester lets a
    /// complete copy replace it).
    pub fn began_before_start(&self, tile_start_ms: i64) -> bool {
        tile_start_ms < self.inner.started_ms
    }

    /// Whether a tile that began at `tile_start_ms` began before this
    /// process, in a replicated shard set (where another replica may have
    /// seen it whole).
    pub fn counts_incomplete(&self, tile_start_ms: i64) -> bool {
        self.replicated() && tile_start_ms < self.inner.started_ms
    }

    /// The flusher flushed a tile of policy `index` ending at `tile_end_ms`
    /// (marked `incomplete` or not), routed under placement version `routed_version`,
    /// whose last batch on each ingester queue it went to is `sent` (queue, sequence).
    pub fn flushed(
        &self,
        index: usize,
        sent: Vec<(usize, u64)>,
        tile_end_ms: i64,
        incomplete: bool,
        routed_version: u64,
    ) {
        if !self.replicated() {
            return;
        }
        if let Some(ledger) = self.state().ledger.get_mut(index) {
            ledger.push_back(Flushed { sent, tile_end_ms, incomplete, routed_version });
        }
    }

    /// Whether the shard set's leader flushed the tile of policy `index` ending at
    /// `tile_end_ms` marked incomplete (a replica holding it whole flushes its copy too):
    /// the placement version the leader routed its copy under, if so.
    pub fn leader_flushed_incomplete(&self, index: usize, tile_end_ms: i64) -> Option<u64> {
        let state = self.state();
        let tiles = state.incomplete.get(index)?;
        tiles.iter().find(|tile| tile.end_ms == tile_end_ms).map(|tile| tile.routed_version)
    }

    /// Batches of the tile of `storage_policy` ending at `tile_end_ms` were
    /// re-routed to queue `queue`, the last with `last_sequence`: the tile is
    /// acknowledged only once they are too.
    pub fn rerouted(&self, storage_policy: &str, tile_end_ms: i64, queue: usize, last_sequence: u64) {
        if !self.replicated() {
            return;
        }
        let Some(index) = self.inner.policies.iter().position(|policy| policy.to_string() == storage_policy) else {
            return;
        };
        let mut state = self.state();
        let Some(ledger) = state.ledger.get_mut(index) else { return };
        if let Some(flushed) = ledger.iter_mut().find(|flushed| flushed.tile_end_ms == tile_end_ms) {
            flushed.sent.push((queue, last_sequence));
        }
    }

    /// The flusher holds tiles, the oldest of which began at `start_ms`.
    pub fn holding(&self, start_ms: Option<i64>) {
        self.state().oldest_held_start_ms = start_ms;
    }

    /// How long the lease the leader key is on certainly lives (zero when following).
    fn lease_remaining(&self) -> Duration {
        let lease = self.inner.leader_lease.load(Ordering::Acquire);
        self.inner.deadline.get().map_or(Duration::ZERO, |deadline| deadline.remaining(lease))
    }

    /// How long the shard set may answer "no leader" before an incomplete replica
    /// campaigns: the longest tile plus `max_buffer_past_ms`, by which time a replica
    /// that saw every tile whole would have campaigned.
    pub fn leaderless_grace(&self, max_buffer_past_ms: i64) -> Duration {
        let longest = self.inner.policies.iter().map(StoragePolicy::resolution_ms).max().unwrap_or(0);
        Duration::from_millis((longest + max_buffer_past_ms).max(0) as u64)
    }

    /// Whether every tile this replica may still flush began after it started.
    fn complete(&self, max_buffer_past_ms: i64) -> bool {
        let started_ms = self.inner.started_ms;
        let now = now_ms();
        let held_complete = self.state().oldest_held_start_ms.is_none_or(|start| start >= started_ms);
        held_complete
            && self.inner.policies.iter().all(|policy| policy.tile_start_ms(now - max_buffer_past_ms) >= started_ms)
    }

    /// Moves the acknowledged marks on from the ingester queues; returns them.
    fn acknowledge(&self, ingesters: &Ingesters) -> Vec<i64> {
        let mut state = self.state();
        let State { ledger, acknowledged, incomplete, .. } = &mut *state;
        for ((flushed, mark), incomplete) in ledger.iter_mut().zip(acknowledged.iter_mut()).zip(incomplete.iter_mut()) {
            while let Some(oldest) = flushed.front() {
                let resolved = oldest.sent.iter().all(|&(queue, last_sequence)| {
                    ingesters.queue(queue).is_none_or(|queue| queue.resolved_through() >= last_sequence)
                });
                if !resolved {
                    break;
                }
                *mark = (*mark).max(oldest.tile_end_ms);
                if oldest.incomplete {
                    incomplete.push_back(IncompleteTile {
                        end_ms: oldest.tile_end_ms,
                        routed_version: oldest.routed_version,
                    });
                    if incomplete.len() > INCOMPLETE_KEPT {
                        incomplete.pop_front();
                    }
                }
                flushed.pop_front();
            }
        }
        state.acknowledged.clone()
    }

    /// This replica, leading, recorded `acknowledged` as the marks.
    fn recorded(&self, acknowledged: &[i64]) {
        for (mark, &end) in self.state().marks.iter_mut().zip(acknowledged) {
            *mark = (*mark).max(end);
        }
    }

    fn set_marks(&self, marks: &FlushMarks) {
        let mut state = self.state();
        for (index, policy) in self.inner.policies.iter().enumerate() {
            let name = policy.to_string();
            if let Some(&end) = marks.flushed.get(&name) {
                state.marks[index] = state.marks[index].max(end);
                state.acknowledged[index] = state.acknowledged[index].max(end);
            }
            // The leader's list is the whole truth: it replaces what an earlier read said.
            state.incomplete[index] =
                marks.incomplete.get(&name).map(|tiles| tiles.iter().copied().collect()).unwrap_or_default();
        }
    }

    fn marks_text(&self, acknowledged: &[i64]) -> FlushMarks {
        let state = self.state();
        let mut marks = FlushMarks::default();
        for ((policy, &end), incomplete) in self.inner.policies.iter().zip(acknowledged).zip(&state.incomplete) {
            if end == i64::MIN {
                continue;
            }
            marks.flushed.insert(policy.to_string(), end);
            if !incomplete.is_empty() {
                marks.incomplete.insert(policy.to_string(), incomplete.iter().copied().collect());
            }
        }
        marks
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent, so a poisoned lock is usable.
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::time::Instant;

    fn policies() -> Vec<StoragePolicy> {
        vec!["10s:2d".parse().unwrap(), "1m:40d".parse().unwrap()]
    }

    #[test]
    fn without_replicas_everything_flushes() {
        let leadership = Leadership::new(policies(), 0);
        assert!(leadership.may_flush() && leadership.may_flush_at_shutdown());
        assert_eq!(leadership.marks()[0], i64::MIN);
    }

    #[test]
    fn a_replica_flushes_only_as_leader_with_a_live_lease() {
        let leadership = Leadership::new(policies(), 0);
        leadership.inner.replicated.store(true, Ordering::Release);
        assert!(!leadership.may_flush(), "a follower holds");
        leadership.inner.leader_lease.store(7, Ordering::Release);
        assert!(!leadership.may_flush(), "a leader without a lease deadline holds");
        let deadline = LeaseDeadline::default();
        leadership.inner.deadline.set(deadline.clone()).unwrap();
        deadline.set(7, Instant::now() + FENCE_MARGIN / 2);
        assert!(!leadership.may_flush(), "nor one whose lease may expire within the fence margin");
        deadline.set(7, Instant::now() + FENCE_MARGIN * 3);
        assert!(leadership.may_flush(), "a leader with a live lease flushes");
        deadline.set(8, Instant::now() + FENCE_MARGIN * 3);
        assert!(!leadership.may_flush(), "the key was on lease 7: a lease granted again does not lead");
        leadership.inner.others_alive.store(true, Ordering::Release);
        assert!(!leadership.may_flush_at_shutdown(), "another replica finishes the open tiles");
    }

    #[test]
    fn marks_move_on_only_for_tiles_acknowledged_with_every_tile_before() {
        let metrics = Metrics::default();
        let ingesters = Ingesters::new(&["i:1".to_owned()], 1 << 20, &metrics.outbound, &metrics.drops);
        let queues = ingesters.queues();
        let queue = &queues[0];
        let leadership = Leadership::new(policies(), 0);
        leadership.inner.replicated.store(true, Ordering::Release);
        let push = |end: i64| {
            let sequence = queue.next_sequence();
            queue.push(tessera_wire::Batch { sequence, frame: vec![0; 8], items: 1, refs: None, owner_refused: false });
            leadership.flushed(0, vec![(0, sequence)], end, false, 1);
        };
        push(10_000);
        push(20_000);
        assert_eq!(leadership.acknowledge(&ingesters), vec![i64::MIN, i64::MIN]);
        queue.pop_front().unwrap();
        queue.finish_in_flight();
        assert_eq!(leadership.acknowledge(&ingesters), vec![10_000, i64::MIN]);
        assert_eq!(leadership.acknowledge(&ingesters), vec![10_000, i64::MIN], "until a write of them succeeds");
        assert_eq!(leadership.marks_text(&[10_000, i64::MIN]).encode(), "10s:2d 10000\n");
        leadership.set_marks(&FlushMarks::flushed([("1m:40d".to_owned(), 60_000)].into()));
        assert_eq!(leadership.marks(), [i64::MIN, 60_000], "marks move only once written");
        leadership.recorded(&[10_000, i64::MIN]);
        assert_eq!(leadership.marks(), [10_000, 60_000]);
    }

    #[test]
    fn the_leader_records_its_incomplete_tiles_with_the_marks_and_a_follower_reads_them() {
        let metrics = Metrics::default();
        let ingesters = Ingesters::new(&["i:1".to_owned()], 1 << 20, &metrics.outbound, &metrics.drops);
        let queue = &ingesters.queues()[0];
        let leader = Leadership::new(policies(), 0);
        leader.inner.replicated.store(true, Ordering::Release);
        for (end, incomplete) in [(10_000, false), (20_000, true), (30_000, false)] {
            let sequence = queue.next_sequence();
            queue.push(tessera_wire::Batch { sequence, frame: vec![0; 8], items: 1, refs: None, owner_refused: false });
            leader.flushed(0, vec![(0, sequence)], end, incomplete, 7);
        }
        for _ in 0..2 {
            queue.pop_front().unwrap();
            queue.finish_in_flight();
        }
        let acknowledged = leader.acknowledge(&ingesters);
        let marks = leader.marks_text(&acknowledged);
        assert_eq!(
            marks.encode(),
            "10s:2d 20000\nincomplete 10s:2d 20000\nincomplete-routed 10s:2d 7\n",
            "only once acknowledged, with the version it was routed under"
        );
        let follower = Leadership::new(policies(), 0);
        follower.set_marks(&tessera_topology::FlushMarks::decode(&marks.encode()));
        assert_eq!(follower.leader_flushed_incomplete(0, 20_000), Some(7));
        assert_eq!(follower.leader_flushed_incomplete(0, 10_000), None);
        assert_eq!(follower.leader_flushed_incomplete(1, 20_000), None);
        // The leader's list is the whole truth: what it no longer lists is forgotten.
        follower.set_marks(&FlushMarks::flushed([("10s:2d".to_owned(), 30_000)].into()));
        assert_eq!(follower.leader_flushed_incomplete(0, 20_000), None);
    }

    /// A closed 10 s tile ending `end` of `series` counters of `value` each.
    fn closed_tile(end: i64, series: usize, unconfirmed: bool, value: f64) -> crate::tile::ClosedTile {
        use tessera_core::aggregate::Aggregate;
        use tessera_proto::{MetricType, SeriesValue};
        crate::tile::ClosedTile {
            policy_index: 0,
            policy: "10s:2d".parse().unwrap(),
            tile_start_ms: end - 10_000,
            tile_end_ms: end,
            values: (0..series)
                .map(|index| SeriesValue {
                    r#ref: 0,
                    series_id: format!("chaos.counter|#series:{index}").into_bytes(),
                    r#type: MetricType::Counter as i32,
                    aggregate: Some(Aggregate::Counter(value).to_proto()),
                })
                .collect(),
            expired: 0,
            series_held: series,
            cut_duration: Duration::ZERO,
            unconfirmed,
        }
    }

    /// A flusher to one ingester (`i:1`) for `leadership`.
    fn test_flusher(metrics: &Metrics, leadership: &Leadership) -> super::super::Flusher {
        use super::super::{FlushSettings, Flusher};
        Flusher {
            ingesters: Ingesters::new(&["i:1".to_owned()], 1 << 20, &metrics.outbound, &metrics.drops),
            settings: FlushSettings { source: "agg".to_owned(), max_frame_bytes: 1 << 20 },
            metrics: metrics.flush.clone(),
            drops: metrics.drops.clone(),
            policies: policies().iter().map(|policy| metrics.flush.policy(&policy.to_string())).collect(),
            leadership: leadership.clone(),
        }
    }

    /// The ingester acknowledges everything queued.
    fn deliver(flusher: &super::super::Flusher) {
        let queue = flusher.ingesters.queue(0).unwrap();
        while queue.pop_front().is_some() {
            queue.finish_in_flight();
        }
    }

    /// A leader of a replicated shard set, on a live lease.
    fn live_leader() -> Leadership {
        let leader = Leadership::new(policies(), 0);
        leader.inner.replicated.store(true, Ordering::Release);
        leader.inner.leader_lease.store(7, Ordering::Release);
        let deadline = LeaseDeadline::default();
        leader.inner.deadline.set(deadline.clone()).unwrap();
        deadline.set(7, Instant::now() + FENCE_MARGIN * 60);
        leader
    }

    /// A follower of a replicated shard set holding `copies`, which reads the leader's
    /// `marks` and lets go of (or completes) what they cover.
    fn follower_after(marks: &FlushMarks, copies: Vec<crate::tile::ClosedTile>) -> (Metrics, super::super::Flusher) {
        let (metrics, follower) = (Metrics::default(), Leadership::new(policies(), 0));
        follower.inner.replicated.store(true, Ordering::Release);
        let following = test_flusher(&metrics, &follower);
        let mut held = super::super::Held::default();
        for copy in copies {
            held.push(copy, &following);
        }
        follower.set_marks(&FlushMarks::decode(&marks.encode()));
        held.release(&following, false);
        (metrics, following)
    }

    /// The one tile batch queued to the ingester.
    fn queued_batch(flusher: &super::super::Flusher) -> tessera_proto::TileBatch {
        use tessera_proto::{Frame, frame::Body, framing};
        let batch = flusher.ingesters.queue(0).unwrap().pop_front().expect("a batch is queued");
        let Ok(Some((Frame { body: Some(Body::Tiles(tiles)) }, _))) = framing::decode_frame(&batch.frame, 1 << 20)
        else {
            panic!("not a tile batch")
        };
        tiles
    }

    /// The one tile batch queued to the ingester: its end, whether incomplete, and its values.
    fn queued_tiles(flusher: &super::super::Flusher) -> (i64, bool, Vec<tessera_core::aggregate::Aggregate>) {
        let tiles = queued_batch(flusher);
        let values = tiles
            .tiles
            .iter()
            .map(|tile| tessera_core::aggregate::Aggregate::from_proto(tile.aggregate.as_ref().unwrap()).unwrap())
            .collect();
        (tiles.tile_end_ms, tiles.incomplete, values)
    }

    /// A follower's completion says which placement version the leader's incomplete copy
    /// was routed under (the marks say): an ingester that took the shard after it knows the
    /// copy went to the owner before (fix 24). A leader's own copy says 0.
    #[test]
    fn a_completion_carries_the_version_its_leader_copy_was_routed_under() {
        let mut marks = FlushMarks::flushed([("10s:2d".to_owned(), 20_000)].into());
        marks.incomplete.insert("10s:2d".to_owned(), vec![IncompleteTile { end_ms: 20_000, routed_version: 7 }]);
        let (metrics, following) = follower_after(&marks, vec![closed_tile(20_000, 3, false, 40.0)]);
        assert_eq!(metrics.flush.tiles_completed.get(), 1);
        let completion = queued_batch(&following);
        assert_eq!((completion.tile_end_ms, completion.completes_version), (20_000, 7));

        let (leader_metrics, leader) = (Metrics::default(), live_leader());
        let leading = test_flusher(&leader_metrics, &leader);
        let mut held = super::super::Held::default();
        held.push(closed_tile(20_000, 3, true, 40.0), &leading);
        held.release(&leading, false);
        assert_eq!(queued_batch(&leading).completes_version, 0, "the leader's copy completes nothing");
    }

    /// The leader records the placement version it routed each incomplete tile under, and
    /// 0 for one it sent nothing of (a completion of that is the only copy anywhere).
    #[test]
    fn the_leader_records_the_version_it_routed_an_incomplete_tile_under() {
        let placement = tessera_topology::Placement::init(&[("ing-1", "i:1")], 4, 1, 0).unwrap();
        let (metrics, leader) = (Metrics::default(), live_leader());
        let mut leading = test_flusher(&metrics, &leader);
        leading.ingesters = Ingesters::placed(
            tessera_topology::PlacementHandle::fixed(placement.clone()),
            1 << 20,
            &metrics.outbound,
            &metrics.drops,
        );
        let mut held = super::super::Held::default();
        held.push(closed_tile(10_000, 3, true, 40.0), &leading);
        held.push(closed_tile(20_000, 0, true, 40.0), &leading);
        held.release(&leading, false);
        deliver(&leading);
        let marks = leader.marks_text(&leader.acknowledge(&leading.ingesters));
        let tile = |end_ms, routed_version| IncompleteTile { end_ms, routed_version };
        assert_eq!(marks.incomplete["10s:2d"], [tile(10_000, placement.version()), tile(20_000, 0)]);
    }

    /// Found by the fault campaign (seed 34 at 5 minutes, c35fec0): both collectors' links
    /// into the leader stalled from before a 10 s tile began until after it closed, so the
    /// leader closed that tile with no series, unconfirmed. Held by nobody (a tile without
    /// values was not kept) and so never recorded incomplete, it was passed by the mark of
    /// the next tile, and the follower, which held it whole and confirmed, let it go: 1 519
    /// series lost the tile.
    #[test]
    fn a_leaders_empty_unconfirmed_tile_is_recorded_incomplete_and_a_whole_follower_completes_it() {
        use super::super::Held;
        let tile = |end, series, unconfirmed| closed_tile(end, series, unconfirmed, 40.0);

        let (leader_metrics, leader) = (Metrics::default(), live_leader());
        let leading = test_flusher(&leader_metrics, &leader);
        let mut held = Held::default();
        held.push(tile(10_000, 3, false), &leading);
        held.release(&leading, false);
        deliver(&leading);
        // Every collector's link stalled across the tile ending 20 000: it closed with no series.
        held.push(tile(20_000, 0, true), &leading);
        held.release(&leading, false);
        let acknowledged = leader.acknowledge(&leading.ingesters);
        assert_eq!(
            leader.marks_text(&acknowledged).encode(),
            "10s:2d 20000\nincomplete 10s:2d 20000\n",
            "the tile the leader had nothing of is recorded incomplete once it closes"
        );
        // The stall over, the next tile is whole.
        held.push(tile(30_000, 3, false), &leading);
        held.release(&leading, false);
        deliver(&leading);
        let marks = leader.marks_text(&leader.acknowledge(&leading.ingesters));

        // The follower holds every tile whole and confirmed.
        let copies = [10_000, 20_000, 30_000].map(|end| tile(end, 3, false)).into();
        let (follower_metrics, following) = follower_after(&marks, copies);
        assert_eq!(follower_metrics.flush.tiles_completed.get(), 1, "its whole copy goes out");
        let (end, incomplete, values) = queued_tiles(&following);
        assert_eq!((end, incomplete, values.len()), (20_000, false, 3));
    }

    /// Fix 16: the links of every collector into the leader stalled from more than
    /// `max_buffer_past` before a tile began until after it closed: the stalled collectors
    /// were last seen too long before the tile to count, so it closed *confirmed*, with no
    /// series. A tile the leader had nothing of is recorded incomplete all the same;
    /// otherwise its mark passes it with the next tile and the follower, which holds it
    /// whole, lets it go.
    #[test]
    fn a_leaders_empty_tile_that_closed_confirmed_is_recorded_incomplete_and_a_whole_follower_completes_it() {
        use super::super::Held;
        let tile = |end, series, unconfirmed| closed_tile(end, series, unconfirmed, 40.0);

        let (leader_metrics, leader) = (Metrics::default(), live_leader());
        let leading = test_flusher(&leader_metrics, &leader);
        let mut held = Held::default();
        held.push(tile(10_000, 3, false), &leading);
        held.release(&leading, false);
        deliver(&leading);
        // The stall's first tile: the stalled collectors still count, it closes unconfirmed.
        held.push(tile(20_000, 0, true), &leading);
        held.release(&leading, false);
        // Its second: they no longer count, it closes confirmed, still with nothing in it.
        held.push(tile(30_000, 0, false), &leading);
        held.release(&leading, false);
        // The stall over, the next tile is whole.
        held.push(tile(40_000, 3, false), &leading);
        held.release(&leading, false);
        deliver(&leading);
        let marks = leader.marks_text(&leader.acknowledge(&leading.ingesters));
        assert_eq!(marks.encode(), "10s:2d 40000\nincomplete 10s:2d 20000,30000\n");

        let copies = [10_000, 20_000, 30_000, 40_000].map(|end| tile(end, 3, false)).into();
        let (follower_metrics, following) = follower_after(&marks, copies);
        assert_eq!(follower_metrics.flush.tiles_completed.get(), 2, "both tiles the leader had nothing of");
        assert_eq!(queued_tiles(&following).0, 20_000);
        assert_eq!(queued_tiles(&following).0, 30_000);
    }

    /// Fault campaign seed 34 (5 minutes): in one 1 min tile, a collector's pause cost the
    /// follower a few windows (refused too late, its copy unconfirmed) and a stall of every
    /// link into the leader cost the leader more (its copy incomplete). The follower let its
    /// copy go because it was unconfirmed too, and the leader's short copy was the only one
    /// written: 517 series lost 12 increments (and 483 more lost 24, hidden by excused
    /// rounds). An unconfirmed copy still goes out, marked incomplete: the ingester keeps the
    /// larger of two incomplete copies.
    #[test]
    fn a_follower_whose_copy_is_unconfirmed_too_sends_it_after_the_leaders_incomplete_one() {
        use super::super::Held;

        let (leader_metrics, leader) = (Metrics::default(), live_leader());
        let leading = test_flusher(&leader_metrics, &leader);
        let mut held = Held::default();
        held.push(closed_tile(10_000, 3, false, 40.0), &leading);
        held.release(&leading, false);
        deliver(&leading);
        held.push(closed_tile(20_000, 3, true, 24.0), &leading);
        held.release(&leading, false);
        deliver(&leading);
        let marks = leader.marks_text(&leader.acknowledge(&leading.ingesters));
        assert_eq!(marks.encode(), "10s:2d 20000\nincomplete 10s:2d 20000\n");

        let copies = vec![closed_tile(10_000, 3, false, 40.0), closed_tile(20_000, 3, true, 36.0)];
        let (follower_metrics, following) = follower_after(&marks, copies);
        assert_eq!(follower_metrics.flush.tiles_completed.get(), 1, "its copy goes out");
        let (end, incomplete, values) = queued_tiles(&following);
        assert_eq!((end, incomplete), (20_000, true), "marked incomplete, as it is");
        assert_eq!(values, vec![tessera_core::aggregate::Aggregate::Counter(36.0); 3]);
        assert!(following.ingesters.queue(0).unwrap().pop_front().is_none(), "the 10 000 copy is let go");
    }

    /// Fault campaign seed 61 (5 minutes): the cluster started 1.2 s into a minute, so both
    /// replicas' copies of the first 1 min tile began before their process. The leader's
    /// copy lacked a collector killed while its link into the leader stalled, and went out
    /// incomplete; the follower's, which held it, was let go because it began before the
    /// follower started: 517 series short at 1 min while their 10 s tile was completed.
    #[test]
    fn a_follower_whose_copy_began_before_it_started_still_sends_it_after_the_leaders_incomplete_one() {
        use super::super::Held;
        // Both replicas started 5 s into the tile ending 20 000.
        let started_ms = 15_000;
        let leader = Leadership::new(policies(), started_ms);
        leader.inner.replicated.store(true, Ordering::Release);
        leader.inner.leader_lease.store(7, Ordering::Release);
        let deadline = LeaseDeadline::default();
        leader.inner.deadline.set(deadline.clone()).unwrap();
        deadline.set(7, Instant::now() + FENCE_MARGIN * 60);
        let leader_metrics = Metrics::default();
        let leading = test_flusher(&leader_metrics, &leader);
        let mut held = Held::default();
        // Closed confirmed, and short: incomplete because it began before the leader started.
        held.push(closed_tile(20_000, 3, false, 32.0), &leading);
        held.release(&leading, false);
        deliver(&leading);
        let marks = leader.marks_text(&leader.acknowledge(&leading.ingesters));
        assert_eq!(marks.encode(), "10s:2d 20000\nincomplete 10s:2d 20000\n");

        let (metrics, follower) = (Metrics::default(), Leadership::new(policies(), started_ms));
        follower.inner.replicated.store(true, Ordering::Release);
        let following = test_flusher(&metrics, &follower);
        let mut held = Held::default();
        held.push(closed_tile(20_000, 3, false, 40.0), &following);
        follower.set_marks(&FlushMarks::decode(&marks.encode()));
        held.release(&following, false);
        assert_eq!(metrics.flush.tiles_completed.get(), 1, "its larger copy goes out");
        let (end, incomplete, values) = queued_tiles(&following);
        assert_eq!((end, incomplete), (20_000, true), "marked incomplete: it began before the follower started");
        assert_eq!(values, vec![tessera_core::aggregate::Aggregate::Counter(40.0); 3]);
    }

    #[test]
    fn a_tile_sent_to_several_ingesters_is_acknowledged_once_every_share_is() {
        let metrics = Metrics::default();
        let ingesters =
            Ingesters::new(&["i:1".to_owned(), "i:2".to_owned()], 1 << 20, &metrics.outbound, &metrics.drops);
        let queues = ingesters.queues();
        let leadership = Leadership::new(policies(), 0);
        leadership.inner.replicated.store(true, Ordering::Release);
        let push = |index: usize| {
            let sequence = queues[index].next_sequence();
            queues[index].push(tessera_wire::Batch {
                sequence,
                frame: vec![0; 8],
                items: 1,
                refs: None,
                owner_refused: false,
            });
            sequence
        };
        let deliver = |index: usize| {
            queues[index].pop_front().unwrap();
            queues[index].finish_in_flight();
        };
        let (first, second) = (push(0), push(1));
        leadership.flushed(0, vec![(0, first), (1, second)], 10_000, false, 1);
        deliver(0);
        assert_eq!(leadership.acknowledge(&ingesters), vec![i64::MIN, i64::MIN], "one share is still queued");
        // Re-routed: the second share's batch moved to queue 0.
        let moved = push(0);
        leadership.rerouted("10s:2d", 10_000, 0, moved);
        deliver(1);
        assert_eq!(leadership.acknowledge(&ingesters), vec![i64::MIN, i64::MIN], "the re-routed copy is queued");
        deliver(0);
        assert_eq!(leadership.acknowledge(&ingesters), vec![10_000, i64::MIN]);
    }

    #[test]
    fn tiles_that_began_before_the_process_are_incomplete() {
        let leadership = Leadership::new(policies(), 15_000);
        assert!(!leadership.counts_incomplete(10_000), "nobody else could have seen it");
        leadership.inner.replicated.store(true, Ordering::Release);
        assert!(leadership.counts_incomplete(10_000) && !leadership.counts_incomplete(20_000));
        leadership.holding(Some(10_000));
        assert!(!leadership.complete(0));
        assert_eq!(leadership.leaderless_grace(8_000), Duration::from_secs(68), "the 1m tile plus 8 s");
    }
}
