//! The one entry point daemons use: a [`PlacementSource`] from their config
//! becomes a [`PlacementHandle`] that always has a current placement.
//!
//! ```toml
//! [placement]
//! kind = "static"
//! path = "/etc/tessera/placement.toml"
//! ```
//!
//! or
//!
//! ```toml
//! [placement]
//! kind = "etcd"
//! endpoints = ["http://127.0.0.1:2379"]
//! env = "prod"
//! cache_path = "/var/lib/tessera/placement.pb"
//! ```
//!
//! Reading the current placement is cheap enough for hot paths (an atomic
//! pointer load); [`PlacementHandle::generation`] is a single atomic load
//! that tells a hot loop when to pick up a new [`Routing`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use serde::Deserialize;
use tokio::sync::watch;

use crate::error::SourceError;
use crate::etcd::{EtcdConfig, Watcher};
use crate::placement::Placement;
use crate::routing::Routing;
use crate::stats::{WatchStats, bump};

/// Where a daemon gets its placement from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlacementSource {
    /// A static TOML placement file, read once at start (see
    /// [`static_file`](crate::static_file)).
    Static {
        /// The placement file.
        path: PathBuf,
    },
    /// The placement in etcd, watched (see [`EtcdConfig`] for the keys).
    Etcd(EtcdConfig),
}

impl PlacementSource {
    /// Loads the first placement and, for etcd, starts watching.
    pub async fn start(&self) -> Result<PlacementHandle, SourceError> {
        match self {
            PlacementSource::Static { path } => {
                let placement = crate::static_file::load_static(path)?;
                Ok(PlacementHandle::fixed(placement))
            }
            PlacementSource::Etcd(config) => Ok(Watcher::start(config.clone()).await?.handle()),
        }
    }
}

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
        bump(&stats.updates_applied);
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
        bump(&self.stats.updates_applied);
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
/// While any clone (or its [`Watcher`]) is alive, an etcd source keeps
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
    fn sources_parse_from_toml() {
        let source: PlacementSource = toml::from_str("kind = \"static\"\npath = \"p.toml\"\n").unwrap();
        assert_eq!(source, PlacementSource::Static { path: "p.toml".into() });

        let source: PlacementSource =
            toml::from_str("kind = \"etcd\"\nendpoints = [\"http://e:2379\"]\nenv = \"prod\"\ncache_path = \"c.pb\"\n")
                .unwrap();
        assert_eq!(source, PlacementSource::Etcd(EtcdConfig::new(["http://e:2379"], "prod").with_cache_path("c.pb")));
    }

    #[test]
    fn unknown_source_keys_are_rejected() {
        let err = toml::from_str::<PlacementSource>("kind = \"static\"\npath = \"p\"\nreload = true\n").unwrap_err();
        assert!(err.to_string().contains("reload"), "{err}");
        let err = toml::from_str::<PlacementSource>("kind = \"etcd\"\nendpoints = []\nenv = \"e\"\nkey = \"k\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("key"), "{err}");
        let err = toml::from_str::<PlacementSource>("kind = \"consul\"\n").unwrap_err();
        assert!(err.to_string().contains("consul"), "{err}");
    }

    #[test]
    fn fixed_handle_publishes_one_placement() {
        let placement = Placement::init(&[("a", "h:1")], 4, 1, 0).unwrap();
        let handle = PlacementHandle::fixed(placement.clone());
        assert_eq!(*handle.current(), placement);
        assert_eq!(handle.version(), 1);
        assert_eq!(handle.generation(), 1);
        assert_eq!(handle.routing().num_shards(), 4);
        assert_eq!(*handle.subscribe().borrow(), Arc::new(placement));
        assert_eq!(handle.stats().snapshot().updates_applied, 1);
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
