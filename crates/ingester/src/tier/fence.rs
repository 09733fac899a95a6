//! The ingester's fence: an ingester of a placement writes to its stores only while
//! its liveness lease is certainly alive in etcd, so that one it has been failed over
//! from has stopped before the new owner of its shards starts.
//!
//! ```text
//!  keep-alive confirmed ──▶ deadline (sent + TTL, monotonic clock)
//!  now < deadline − FENCE_MARGIN, and the placement read under this lease ──▶ open
//!  otherwise ──▶ fenced: no new storage request, in-flight ones of running totals
//!                cancelled, batches answered `Retryable` (`fenced`), the queue kept
//! ```
//!
//! **Why the margin is enough.** The deadline is when the last successful keep-alive was
//! *sent* plus the TTL etcd answered with; etcd counts the TTL from when it *received*
//! it, so the lease cannot expire in etcd before the deadline. The other ingesters fail
//! this one over only once its key is gone, which is after the lease expired. A fence
//! that falls [`FENCE_MARGIN`] before the deadline has therefore fallen before any other
//! ingester can own its shards, whatever held it up: etcd unreachable (a partition), a
//! slow network, or the process paused (it finds the deadline passed the moment it runs
//! again, before it writes anything). What this assumes of clocks: that this host's
//! monotonic clock does not run slower than etcd's by more than the margin over one TTL
//! (etcd's own lease documentation makes the same assumption), and no more.
//!
//! **Back in touch.** A fence lifts only once the placement has been read from etcd
//! under a lease that is certainly alive ([`Fence::approve`], by the tier task): a lease
//! that lapsed in etcd is granted again under a new id, and until the placement read
//! after that shows which shards are still this ingester's, every total it holds may be
//! of a tenure that ended. The tier task publishes that placement before approving, so
//! the converter gives up the totals of every shard that moved (an explicit reset each,
//! as a move does) before anything is written again.
//!
//! **A batch in hand.** When the fence falls it records when ([`Fell::at_ms`]: the approved
//! lease's deadline less the margin, on the wall clock) and the placement view it held while
//! it was last open ([`Fell::view`]). A tile batch for a tile that ended by then, routed under
//! that view's version or an older one that the view does not contradict, is queued even
//! while fenced (and written once the fence lifts), and after the fence lifted too, whatever
//! the placement says now: it is what an aggregator sent before a pause past the lease (the
//! batch waits in the socket), which its successor takes for written, its own first tile
//! being a later one. The record outlives the new placement and the lease granted again on
//! waking (seed 22 with partitions: read from the current view and lease, the exception
//! missed the batch nearly always, RELIABILITY.md fix 23). Anything else is answered
//! `Retryable` (`fenced`).
//!
//! **What is not covered.** A storage request already sent when the fence falls is
//! cancelled on this side, but a store that received it whole may still apply it; the
//! stores tessera writes apply a request as they read it, well within the margin. The
//! per-tile targets (Graphite, InfluxDB) write each tile's own values, which a second
//! writer cannot corrupt (a resent tile replaces itself), so their requests in flight
//! are left to finish; they start no new one while fenced either.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tessera_runtime::Shutdown;
use tessera_topology::{FENCE_MARGIN, LeaseDeadline};

use super::{Ownership, OwnershipView};

/// How often a fenced worker looks again, and how often a request in flight checks that
/// the fence still stands.
pub const FENCE_POLL: Duration = Duration::from_millis(100);

/// The failpoint that turns the fence off (`TESSERA_FAILPOINTS="ingester.no_fence=0"`),
/// for the partition demo that shows what it prevents. Never set it in production.
pub const NO_FENCE_FAILPOINT: &str = "ingester.no_fence";

/// Whether this ingester may write now; shared by the tier task, the intake writer
/// and the workers. See the [module docs](self).
#[derive(Debug, Default)]
pub struct Fence {
    /// `None`: no placement (a fixed list, `tessera local`), or the fence turned off.
    inner: Option<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The liveness lease's deadline, once registered.
    deadline: OnceLock<LeaseDeadline>,
    /// The lease under which the placement was last read (0: none since the fence fell).
    approved: AtomicI64,
    /// Fenced at the last look (for the gauge, the count and the log).
    fenced: AtomicBool,
    /// What this ingester owns, to record the view held while open.
    ownership: Option<Arc<Ownership>>,
    /// While open: until when (unix ms) the approved lease keeps it open at the least, and
    /// the view current then. Taken into `fell` when the fence falls.
    open_until_ms: AtomicI64,
    /// The view, and the ownership generation it was taken at (looked up only when the
    /// generation moved: a look costs two atomic loads, not a lock).
    held: Mutex<Option<Arc<OwnershipView>>>,
    held_generation: AtomicU64,
    fell: Mutex<Option<Fell>>,
    metrics: FenceMetrics,
}

/// When the fence last fell and what this ingester held then ([module docs](self), *A batch
/// in hand*).
#[derive(Debug, Clone)]
pub struct Fell {
    /// Unix ms: a tile that ended by then closed while this ingester certainly owned what
    /// the view gave it.
    pub at_ms: i64,
    /// The newest placement view current while the fence was open.
    pub view: Option<Arc<OwnershipView>>,
}

/// The fence's metrics (the tier's `fence_closed` and `fenced`).
#[derive(Debug, Clone, Default)]
pub struct FenceMetrics {
    /// 1 while fenced.
    pub fenced: Gauge,
    /// Times the fence fell.
    pub fenced_total: Counter,
}

impl From<&super::TierMetrics> for FenceMetrics {
    fn from(metrics: &super::TierMetrics) -> FenceMetrics {
        FenceMetrics { fenced: metrics.fence_closed.clone(), fenced_total: metrics.fenced.clone() }
    }
}

impl Fence {
    /// A fence that is always open: an ingester with no placement.
    pub fn none() -> Fence {
        Fence::default()
    }

    /// The fence of an ingester of a placement, which owns what `ownership` says: closed
    /// until the lease is registered and the placement read ([`attach`](Self::attach),
    /// [`approve`](Self::approve)). Open for good when the [`NO_FENCE_FAILPOINT`] is set.
    pub fn of_placement(metrics: FenceMetrics, ownership: Arc<Ownership>) -> Fence {
        if tessera_runtime::failpoint::configured(NO_FENCE_FAILPOINT).is_some() {
            tracing::warn!("failpoint: the ingester's fence is off; a partition can give a series two writers");
            return Fence::none();
        }
        metrics.fenced.set(1);
        let inner = Inner { fenced: AtomicBool::new(true), ownership: Some(ownership), metrics, ..Inner::default() };
        Fence { inner: Some(inner) }
    }

    /// Follows the liveness lease of `deadline` from now on (the first call counts).
    pub fn attach(&self, deadline: LeaseDeadline) {
        if let Some(inner) = &self.inner {
            let _ = inner.deadline.set(deadline);
        }
    }

    /// The lease that is certainly alive for more than [`FENCE_MARGIN`] now, if any: a
    /// placement read that starts now may [`approve`](Self::approve) it.
    pub fn lease_alive(&self) -> Option<i64> {
        let inner = self.inner.as_ref()?;
        let (lease, deadline) = inner.deadline.get()?.get()?;
        (deadline.saturating_duration_since(std::time::Instant::now()) > FENCE_MARGIN).then_some(lease)
    }

    /// The placement was read (and published) under `lease`, which was alive when the
    /// read started: the fence may lift while that lease stays alive.
    pub fn approve(&self, lease: i64) {
        if let Some(inner) = &self.inner {
            inner.approved.store(lease, Ordering::Release);
        }
        self.allows();
    }

    /// Whether this ingester may write now. A fence that falls forgets its approval, so
    /// that it lifts only after the placement is read again.
    pub fn allows(&self) -> bool {
        let Some(inner) = &self.inner else { return true };
        let approved = inner.approved.load(Ordering::Acquire);
        let open = approved != 0 && self.lease_alive() == Some(approved);
        if !open && approved != 0 {
            let _ = inner.approved.compare_exchange(approved, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        if open {
            if let Some(until) = self.open_until_ms() {
                inner.open_until_ms.store(until, Ordering::Release);
            }
            if let Some(ownership) = &inner.ownership {
                let mut seen = inner.held_generation.load(Ordering::Acquire);
                let taken_at = seen;
                if let Some(view) = ownership.changed_since(&mut seen) {
                    let mut held = lock(&inner.held);
                    // Two looks racing: the one that saw the newer generation wins.
                    if inner
                        .held_generation
                        .compare_exchange(taken_at, seen, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        *held = Some(view);
                    }
                }
            }
        }
        let was_fenced = inner.fenced.swap(!open, Ordering::AcqRel);
        if was_fenced == open {
            inner.metrics.fenced.set(i64::from(!open));
            if open {
                tracing::info!("ingester fence lifted: the lease is alive and the placement read again");
            } else {
                // The approved lease's last deadline, which keep-alives may have moved since
                // the last look recorded it (found by the fault campaign, seed 16 with
                // partitions: a tile ending 150 ms after the recorded time, inside the
                // lease, was refused on waking and lost).
                let last = self.until_ms(|deadline| deadline.last_of(approved)).unwrap_or(i64::MIN);
                let at_ms = inner.open_until_ms.load(Ordering::Acquire).max(last);
                let fell = Fell { at_ms, view: lock(&inner.held).clone() };
                *lock(&inner.fell) = Some(fell);
                inner.metrics.fenced_total.inc();
                tracing::warn!(
                    margin_ms = FENCE_MARGIN.as_millis() as u64,
                    "ingester fenced off: the liveness lease may expire within the margin; writing nothing \
                     and answering batches retryable until etcd confirms it and the placement is read again"
                );
            }
        }
        open
    }

    /// When the fence last fell and the view it held, if it has fallen since it first
    /// opened.
    pub fn fell(&self) -> Option<Fell> {
        lock(&self.inner.as_ref()?.fell).clone()
    }

    /// The current lease's deadline less the margin, on the wall clock (unix ms).
    fn open_until_ms(&self) -> Option<i64> {
        self.until_ms(|deadline| deadline.get().map(|(_, at)| at))
    }

    /// A deadline `of` the lease's, less the margin, on the wall clock (unix ms).
    fn until_ms(&self, of: impl FnOnce(&LeaseDeadline) -> Option<std::time::Instant>) -> Option<i64> {
        let deadline = of(self.inner.as_ref()?.deadline.get()?)?;
        let until = deadline.checked_sub(FENCE_MARGIN)?;
        let now = std::time::Instant::now();
        let ahead = until.saturating_duration_since(now).as_millis() as i64;
        let behind = now.saturating_duration_since(until).as_millis() as i64;
        Some(tessera_core::clock::now_ms() + ahead - behind)
    }

    /// Waits until the fence allows writing; `false` if `stop` fired first.
    pub async fn wait_open(&self, stop: &Shutdown) -> bool {
        while !self.allows() {
            tokio::select! {
                biased;
                () = stop.wait() => return false,
                () = tokio::time::sleep(FENCE_POLL) => {}
            }
        }
        true
    }

    /// Resolves once the fence has fallen (never, for an ingester with no fence).
    pub async fn fallen(&self) {
        if self.inner.is_none() {
            return std::future::pending().await;
        }
        while self.allows() {
            tokio::time::sleep(FENCE_POLL).await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn fence() -> (Fence, LeaseDeadline) {
        let (fence, deadline, _) = fence_of();
        (fence, deadline)
    }

    fn fence_of() -> (Fence, LeaseDeadline, Arc<Ownership>) {
        let ownership = Arc::new(Ownership::default());
        let fence = Fence::of_placement(FenceMetrics::default(), Arc::clone(&ownership));
        let deadline = LeaseDeadline::default();
        fence.attach(deadline.clone());
        (fence, deadline, ownership)
    }

    fn view(version: u64) -> OwnershipView {
        let placement = tessera_topology::Placement::init(&[("a", "a:1")], 8, 1, 0).unwrap();
        OwnershipView { version, ..OwnershipView::of(&placement, "a") }
    }

    #[test]
    fn no_placement_never_fences() {
        assert!(Fence::none().allows());
    }

    #[test]
    fn closed_until_the_lease_is_alive_and_the_placement_read_under_it() {
        let (fence, deadline) = fence();
        assert!(!fence.allows(), "no lease yet");
        assert_eq!(fence.lease_alive(), None);
        deadline.set(7, Instant::now() + FENCE_MARGIN * 5);
        assert!(!fence.allows(), "a live lease, but the placement not read under it");
        fence.approve(7);
        assert!(fence.allows());
        let metrics = &fence.inner.as_ref().unwrap().metrics;
        assert_eq!((metrics.fenced.get(), metrics.fenced_total.get()), (0, 0), "the first opening is not a fall");
    }

    #[test]
    fn falls_within_the_margin_and_lifts_only_after_a_new_read() {
        let (fence, deadline) = fence();
        deadline.set(7, Instant::now() + FENCE_MARGIN * 5);
        fence.approve(7);
        assert!(fence.allows());
        deadline.set(7, Instant::now() + FENCE_MARGIN / 2);
        assert!(!fence.allows(), "the lease may expire within the margin");
        let metrics = &fence.inner.as_ref().unwrap().metrics;
        assert_eq!((metrics.fenced.get(), metrics.fenced_total.get()), (1, 1));
        deadline.set(7, Instant::now() + FENCE_MARGIN * 5);
        assert!(!fence.allows(), "the keep-alive came back, but the placement was not read again");
        fence.approve(7);
        assert!(fence.allows());
        assert_eq!(metrics.fenced.get(), 0);
    }

    #[test]
    fn a_lease_granted_again_is_not_the_approved_one() {
        let (fence, deadline) = fence();
        deadline.set(7, Instant::now() + FENCE_MARGIN * 5);
        fence.approve(7);
        deadline.set(8, Instant::now() + FENCE_MARGIN * 5);
        assert!(!fence.allows(), "lease 7 lapsed in etcd: the placement may have moved its shards");
        assert_eq!(fence.lease_alive(), Some(8));
        fence.approve(8);
        assert!(fence.allows());
    }

    /// Fault campaign seed 22 with partitions (fix 23): a pause past the lease, and on
    /// waking the watch publishes the failover's view before anyone looks at the fence, and
    /// the lease is granted again. What the fence held when it fell must outlive both.
    #[test]
    fn it_records_when_it_fell_and_the_view_it_held_past_a_new_view_and_lease() {
        let (fence, deadline, ownership) = fence_of();
        ownership.publish(view(9));
        deadline.set(7, Instant::now() + FENCE_MARGIN * 5);
        fence.approve(7);
        assert!(fence.allows());
        let open_until = tessera_core::clock::now_ms() + 4 * FENCE_MARGIN.as_millis() as i64;
        assert!(fence.fell().is_none(), "not fallen yet");
        // Paused: the deadline passed while nothing ran. On waking, the watch is first.
        deadline.set(7, Instant::now() - Duration::from_secs(2));
        ownership.publish(view(10));
        assert!(!fence.allows());
        let fell = fence.fell().expect("fallen");
        assert_eq!(fell.view.as_ref().map(|view| view.version), Some(9), "the view held while open");
        assert!((fell.at_ms - open_until).abs() < 200, "{} vs {open_until}", fell.at_ms);
        // The lease granted again, the placement read under it: the fence lifts, the record stays.
        deadline.set(8, Instant::now() + FENCE_MARGIN * 5);
        ownership.publish(view(11));
        fence.approve(8);
        assert!(fence.allows());
        let kept = fence.fell().expect("kept");
        assert_eq!((kept.at_ms, kept.view.map(|view| view.version)), (fell.at_ms, Some(9)));
        assert!(Fence::none().fell().is_none());
    }

    /// Found by the fault campaign, seed 16 with partitions: keep-alives moved the lease's
    /// deadline on after the last look recorded it; paused, the ingester fell and refused a
    /// batch of a tile that ended inside the lease. The fall takes the approved lease's last
    /// deadline: when it nears (`sleep` past the margin), and when a new lease was granted
    /// before the fence looked (seed 22's order).
    #[test]
    fn it_falls_at_the_approved_leases_last_deadline_not_the_last_look() {
        for granted_again_first in [false, true] {
            let (fence, deadline, ownership) = fence_of();
            ownership.publish(view(9));
            let start = tessera_core::clock::now_ms();
            deadline.set(7, Instant::now() + FENCE_MARGIN + Duration::from_millis(50));
            fence.approve(7);
            assert!(fence.allows(), "open until 50 ms from now");
            // A keep-alive with no look after it: the lease lives 750 ms longer.
            deadline.set(7, Instant::now() + FENCE_MARGIN + Duration::from_millis(800));
            if granted_again_first {
                deadline.set(8, Instant::now() + FENCE_MARGIN * 5);
            } else {
                std::thread::sleep(Duration::from_millis(900));
            }
            assert!(!fence.allows());
            let fell = fence.fell().expect("fallen");
            let expected = start + 800;
            assert!(
                (fell.at_ms - expected).abs() < 150,
                "granted again first {granted_again_first}: fell at {} ms, expected 800",
                fell.at_ms - start
            );
        }
    }

    #[tokio::test]
    async fn fallen_resolves_when_the_deadline_nears() {
        let (fence, deadline) = fence();
        deadline.set(3, Instant::now() + FENCE_MARGIN * 5);
        fence.approve(3);
        let deadline_passes = async {
            deadline.set(3, Instant::now());
        };
        tokio::join!(fence.fallen(), deadline_passes);
        assert!(!fence.allows());
    }
}
