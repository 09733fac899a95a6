//! Which shards this ingester owns: the tier task publishes an [`OwnershipView`] of
//! every placement it sees, and the converter reads the latest through [`Ownership`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessera_topology::Placement;

/// Which shards this ingester owns now, as the converter reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipView {
    /// The placement's shard count.
    pub num_shards: u32,
    /// Whether this ingester has an entry for each shard.
    pub owned: Vec<bool>,
    /// Whether it takes the shard at a cutover still to come or passed (joining: it was
    /// not its owner all along).
    pub joining: Vec<bool>,
    /// The cutoff of each shard it gives away (a move in progress), 0 when none.
    pub cutoff_ms: Vec<i64>,
    /// The cutover of each shard it takes (a move in progress or not yet finalized), 0 when
    /// it owns the shard from the start of its tenure (an init, a failover): a tile that
    /// starts before it belongs to an earlier tenure.
    pub cutover_ms: Vec<i64>,
    /// Per shard, a count that changes each time a new tenure of it begins, as the views
    /// published so far show ([`Ownership::publish`] keeps it): the shard owned after it was
    /// not, or kept with no cutoff (or another) after it was being given away: its
    /// receiver may have written it from an explicit reset after the cutoff, then died and
    /// been failed over, giving it back. Kept across views, so that a reader that skipped
    /// some (a paused converter) still sees that a tenure began.
    pub tenure: Vec<u32>,
    /// Per shard, the placement version whose change gave it to this ingester
    /// (`since_version`, 0 when not recorded or not owned): another value than in the view
    /// before is a new tenure, whatever versions this ingester did not see in between (cut
    /// off from etcd, it was failed over and given the shard back).
    pub since: Vec<u64>,
    /// Version of the placement this comes from.
    pub version: u64,
    /// This ingester was not in the placement when it started (failed over while it was
    /// down, or new): no total it restored from its checkpoint is current, since its
    /// shards were another's meanwhile.
    pub rejoined: bool,
}

impl OwnershipView {
    /// What `instance_id` owns in `placement`.
    pub fn of(placement: &Placement, instance_id: &str) -> OwnershipView {
        let num_shards = placement.num_shards();
        let mut owned = vec![false; num_shards as usize];
        let mut joining = vec![false; num_shards as usize];
        let mut cutoff_ms = vec![0; num_shards as usize];
        let mut cutover_ms = vec![0; num_shards as usize];
        let mut since = vec![0; num_shards as usize];
        for entry in placement.shards_of(instance_id) {
            if let Some(slot) = owned.get_mut(entry.id as usize) {
                *slot = true;
                since[entry.id as usize] = entry.since_version;
                joining[entry.id as usize] = entry.cutover_ms > 0;
                cutoff_ms[entry.id as usize] = entry.cutoff_ms;
                cutover_ms[entry.id as usize] = entry.cutover_ms;
            }
        }
        let tenure = vec![0; num_shards as usize];
        OwnershipView {
            num_shards,
            owned,
            joining,
            cutoff_ms,
            cutover_ms,
            tenure,
            since,
            version: placement.version(),
            rejoined: false,
        }
    }

    /// Shards owned.
    pub fn owned_count(&self) -> usize {
        self.owned.iter().filter(|owned| **owned).count()
    }
}

/// The latest [`OwnershipView`], shared between the tier task and the converter.
#[derive(Debug, Default)]
pub struct Ownership {
    generation: AtomicU64,
    view: Mutex<Option<Arc<OwnershipView>>>,
    /// The first view published: what the placement gave this process at its start.
    first: std::sync::OnceLock<Arc<OwnershipView>>,
    rejoined: std::sync::atomic::AtomicBool,
    /// Where [`persist_rejoined`](Self::persist_rejoined) records that the totals restored
    /// at start are stale, so that a restart before they are checkpointed away knows too.
    marker: Option<std::path::PathBuf>,
}

impl Ownership {
    /// An ownership whose rejoin is recorded at `marker` (a file in the data directory); a
    /// marker left by an earlier process makes this one rejoined from the start.
    pub fn with_rejoin_marker(marker: std::path::PathBuf) -> Ownership {
        let ownership = Ownership { marker: Some(marker), ..Ownership::default() };
        if ownership.marker.as_deref().is_some_and(std::path::Path::exists) {
            tracing::warn!(
                "an earlier process found this ingester failed over and its totals were not checkpointed away \
                 since: every total restored starts over with an explicit reset"
            );
            ownership.mark_rejoined();
        }
        ownership
    }

    /// [`mark_rejoined`](Self::mark_rejoined), recorded durably first in the marker file,
    /// if there is one: a restart before every target has a checkpoint without the stale
    /// totals (the writer removes the marker then) must not take them for current, even if
    /// it finds itself in the placement (this process joins again right after).
    pub fn persist_rejoined(&self) -> std::io::Result<()> {
        if let Some(marker) = &self.marker {
            let file = std::fs::File::create(marker)?;
            file.sync_all()?;
            if let Some(dir) = marker.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        self.mark_rejoined();
        Ok(())
    }

    /// The rejoin marker's path, if this ownership keeps one.
    pub fn rejoin_marker(&self) -> Option<&std::path::Path> {
        self.marker.as_deref()
    }

    /// This ingester found itself missing from the placement at start (see
    /// [`OwnershipView::rejoined`]); every view published from now on says so.
    pub fn mark_rejoined(&self) {
        self.rejoined.store(true, Ordering::Release);
    }

    /// Whether [`mark_rejoined`](Self::mark_rejoined) was called.
    pub fn rejoined(&self) -> bool {
        self.rejoined.load(Ordering::Acquire)
    }

    /// Publishes `view` (when it differs from the current one), its tenures carried on
    /// from the current one ([`OwnershipView::tenure`]).
    ///
    /// A view of an older placement than the current one is ignored: the tier task
    /// publishes what it reads and the watch what it sees, and either may be behind.
    ///
    /// Returns the view it replaced (`Some(None)` for the first), or `None` when it kept the
    /// current one: under one lock, so that two publishers count each change once.
    pub fn publish(&self, mut view: OwnershipView) -> Option<Option<Arc<OwnershipView>>> {
        let mut current = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_deref().is_some_and(|before| before.version > view.version) {
            return None;
        }
        if let Some(before) = current.as_deref().filter(|before| before.owned.len() == view.owned.len()) {
            for shard in 0..view.owned.len() {
                let gained = view.owned[shard] && !before.owned[shard];
                let given_back = view.owned[shard]
                    && before.owned[shard]
                    && before.cutoff_ms[shard] != 0
                    && view.cutoff_ms[shard] != before.cutoff_ms[shard];
                // Given away and back in versions this ingester never saw (found by the
                // partition scenario: cut off from etcd, failed over, back and joining again,
                // an ingester went on from its old totals after the other had written them
                // from an explicit reset).
                let regiven = view.owned[shard] && before.owned[shard] && view.since[shard] != before.since[shard];
                view.tenure[shard] = before.tenure[shard].wrapping_add(u32::from(gained || given_back || regiven));
            }
        }
        if current.as_deref() == Some(&view) {
            return None;
        }
        let view = Arc::new(view);
        let _ = self.first.set(Arc::clone(&view));
        let before = current.replace(view);
        self.generation.fetch_add(1, Ordering::Release);
        Some(before)
    }

    /// The first view published since start, if any: a converter takes it in before the
    /// current one, whenever it first looks (a joiner may convert nothing for a minute,
    /// and the placement may have changed meanwhile).
    pub fn first(&self) -> Option<Arc<OwnershipView>> {
        self.first.get().cloned()
    }

    /// The current view, if any.
    pub fn current(&self) -> Option<Arc<OwnershipView>> {
        self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The current view, if it changed since generation `seen` (which is updated).
    pub fn changed_since(&self, seen: &mut u64) -> Option<Arc<OwnershipView>> {
        let generation = self.generation.load(Ordering::Acquire);
        if generation == *seen {
            return None;
        }
        *seen = generation;
        self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}
