//! [`PlacementHandle`]: a live view of the placement that every source
//! (a static file, an etcd watch) publishes into, cheap to clone and to read.
//!
//! Reading the current placement is an atomic pointer load;
//! [`PlacementHandle::generation`] is a single atomic load that tells a hot
//! loop when to pick up a new [`Routing`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::placement::Placement;
use crate::routing::Routing;
use crate::stats::{WatchEvent, WatchStats};

/// A placement and its routing table, swapped in together.
#[derive(Debug)]
struct Snapshot {
    placement: Arc<Placement>,
    routing: Arc<Routing>,
}

/// The state shared by a source's background task and its handles.
#[derive(Debug)]
pub(crate) struct Published {
    snapshot: ArcSwap<Snapshot>,
    generation: AtomicU64,
    changes: watch::Sender<Arc<Placement>>,
    stats: Arc<WatchStats>,
}

impl Published {
    /// State holding a first placement (generation 1, counted as an update).
    pub(crate) fn new(placement: Placement, stats: Arc<WatchStats>) -> Self {
        let placement = Arc::new(placement);
        let routing = Arc::new(Routing::new(&placement));
        let (changes, _) = watch::channel(placement.clone());
        stats.bump(WatchEvent::UpdatesApplied);
        Self {
            snapshot: ArcSwap::from_pointee(Snapshot { placement, routing }),
            generation: AtomicU64::new(1),
            changes,
            stats,
        }
    }

    /// Swaps in a new placement and tells subscribers.
    pub(crate) fn publish(&self, placement: Placement) {
        let placement = Arc::new(placement);
        let routing = Arc::new(Routing::new(&placement));
        self.snapshot.store(Arc::new(Snapshot { placement: placement.clone(), routing }));
        self.generation.fetch_add(1, Ordering::Release);
        self.stats.bump(WatchEvent::UpdatesApplied);
        self.changes.send_replace(placement);
    }

    pub(crate) fn current(&self) -> Arc<Placement> {
        self.snapshot.load().placement.clone()
    }

    pub(crate) fn stats(&self) -> &Arc<WatchStats> {
        &self.stats
    }
}

/// Aborts a background task when the last handle goes away.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live view of the placement: cheap to clone and to read.
///
/// While any clone (or its [`Watcher`](crate::Watcher)) is alive, an etcd source keeps
/// watching.
#[derive(Debug, Clone)]
pub struct PlacementHandle {
    published: Arc<Published>,
    _task: Option<Arc<AbortOnDrop>>,
}

impl PlacementHandle {
    /// A handle on a placement that never changes (static files, tests).
    pub fn fixed(placement: Placement) -> Self {
        Self { published: Arc::new(Published::new(placement, Arc::default())), _task: None }
    }

    /// Swaps in `placement` as if a watch had seen it (a [`fixed`](Self::fixed) handle in
    /// tests and tools; an etcd watch overwrites it at its next change).
    pub fn replace(&self, placement: Placement) {
        self.published.publish(placement);
    }

    pub(crate) fn watched(published: Arc<Published>, task: Arc<AbortOnDrop>) -> Self {
        Self { published, _task: Some(task) }
    }

    /// The current placement.
    pub fn current(&self) -> Arc<Placement> {
        self.published.current()
    }

    /// The routing table of the current placement, built once per change.
    pub fn routing(&self) -> Arc<Routing> {
        self.published.snapshot.load().routing.clone()
    }

    /// The current placement's version.
    pub fn version(&self) -> u64 {
        self.published.snapshot.load().placement.version()
    }

    /// How many placements this handle has seen, starting at 1: a single
    /// atomic load, for hot loops to notice a change and fetch
    /// [`routing`](Self::routing) again.
    pub fn generation(&self) -> u64 {
        self.published.generation.load(Ordering::Acquire)
    }

    /// A receiver that is told of every new placement (`changed().await`).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Placement>> {
        self.published.changes.subscribe()
    }

    /// The source's counters (all zero but `updates_applied` for a fixed placement).
    pub fn stats(&self) -> Arc<WatchStats> {
        self.published.stats().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_handle_publishes_one_placement() {
        let placement = Placement::init(&[("a", "h:1")], 4, 1, 0).unwrap();
        let handle = PlacementHandle::fixed(placement.clone());
        assert_eq!(*handle.current(), placement);
        assert_eq!(handle.version(), 1);
        assert_eq!(handle.generation(), 1);
        assert_eq!(handle.routing().num_shards(), 4);
        assert_eq!(*handle.subscribe().borrow(), Arc::new(placement));
        assert_eq!(handle.stats().get(WatchEvent::UpdatesApplied), 1);
    }

    #[test]
    fn publishing_swaps_placement_and_routing_together() {
        let first = Placement::init(&[("a", "h:1")], 4, 1, 0).unwrap();
        let published = Published::new(first, Arc::default());
        let mut changes = published.changes.subscribe();
        let second = Placement::init(&[("a", "h:1"), ("b", "h:2")], 8, 1, 0).unwrap();
        published.publish(second.clone());
        assert_eq!(*published.current(), second);
        assert_eq!(published.snapshot.load().routing.num_shards(), 8);
        assert_eq!(published.generation.load(Ordering::Acquire), 2);
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), Arc::new(second));
    }
}
