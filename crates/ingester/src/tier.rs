//! The ingester tier: this ingester's place in the ingesters' placement
//! (`/tessera/<env>/ingesters/placement` in etcd), its liveness, failover
//! of dead ingesters, and which shards it owns.
//!
//! Every series has one owning ingester at a time: aggregators send each
//! series to the ingester owning `murmur3(series id) % num_shards` of this
//! placement, so one process writes its cumulative totals. [`run_tier`]
//! (one tokio task) keeps it that way:
//!
//! ```text
//!  every tick (1 s)                                     etcd
//!  ├─ no placement yet and join ──init (this one)─────▶ /ingesters/placement
//!  ├─ not in it and join ──add (shards move at the next boundary)──▶
//!  ├─ an instance that was alive has no alive key (its lease expired)
//!  │     ──fail_over: its shards go at once to the least loaded live ones──▶
//!  ├─ moves past their cutover by `settle` ──finalize──▶
//!  └─ watch ◀── the placement: owned shards → [`Ownership`] → the converter
//! ```
//!
//! Every change is a compare-and-swap on the placement's revision, so when
//! several live ingesters see the same dead one, one change lands and the
//! others re-read. An instance that was never seen alive (an operator added
//! it before it started) is failed over only once it has been missing for a
//! whole lease TTL.
//!
//! **An etcd outage is not a death.** When etcd is away (restarted, paused,
//! partitioned) for longer than the TTL, it expires every lease at once when it
//! is back, live ingesters' included, and each re-grants its own within a
//! keep-alive. So after this ingester's own lease had to be granted again, or
//! after etcd failed to answer, nobody is failed over until etcd has answered
//! again for a TTL plus the longest retry backoff (`retry_max_backoff_ms`): a
//! live peer re-registers meanwhile. Failing a
//! live ingester over would move its shards while it still writes them, and
//! tiles sent again to the new owner (a new aggregator leader flushes from
//! marks that etcd could not take during the outage) would count twice (found
//! by the fault campaign, `tessera-chaos`).
//!
//! **Ownership and totals.** [`Ownership`] publishes, for each shard, whether
//! this ingester owns it (any entry in the placement: available, moving in
//! or moving out). The converter ([`crate::admit`]) gives every running
//! total the *epoch* of its shard: an epoch goes up each time this ingester
//! gains the shard, so a total made before the shard went away and came back
//! is stale and starts over, with an explicit reset (see the admit docs).
//! The placement seen first after a start counts as owned all along, so a
//! restart within the lease TTL keeps its checkpointed totals; a start that finds
//! this ingester missing from the placement (failed over while it was down) marks
//! every view `rejoined`, and every total it restored starts over with an explicit
//! reset: its shards were another's meanwhile.
//!
//! **Shutdown** keeps the liveness lease: a restart within the TTL keeps the
//! shards (aggregators hold its tiles meanwhile); an ingester that does not
//! come back is failed over when its lease expires.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_core::clock::now_ms;
use tessera_runtime::Backoff;
use tessera_runtime::Shutdown;
use tessera_runtime::logging::error_chain;
use tessera_runtime::sleep_or_stop;
use tessera_topology::{EtcdConfig, MoveTiming, Placement, PlacementStore, Registration, StoreError, Tier, Watcher};

mod config;
pub mod fence;
mod metrics;
mod ownership;

pub use config::{PlacementConfig, TierSettings};
pub use fence::Fence;
pub use metrics::TierMetrics;
pub use ownership::{Ownership, OwnershipView};

/// How often the tier task looks at the placement and liveness.
pub const TICK: Duration = Duration::from_secs(1);

/// Runs until `shutdown`: registers this ingester's liveness, keeps the
/// placement (init, join, fail over, finalize) and publishes what it owns.
pub async fn run_tier(
    settings: TierSettings,
    ownership: Arc<Ownership>,
    fence: Arc<Fence>,
    metrics: TierMetrics,
    shutdown: Shutdown,
) {
    let etcd = settings.etcd.clone().for_tier(Tier::Ingesters);
    let Some(store) = retry(&shutdown, &metrics, "connect to etcd", || PlacementStore::connect(etcd.clone())).await
    else {
        return;
    };
    let Some(registration) = retry(&shutdown, &metrics, "register the liveness lease", || {
        store.register_instance(&settings.instance_id, settings.ttl)
    })
    .await
    else {
        return;
    };
    metrics.liveness_registered.set(1);
    fence.attach(registration.deadline());
    tracing::info!(instance_id = %settings.instance_id, key = registration.key(), "ingester registered");
    let lease_id = registration.lease_id();
    let mut keeper = Keeper {
        settings,
        store,
        metrics,
        ownership,
        fence,
        seen_alive: HashSet::new(),
        missing_since: HashMap::new(),
        registration,
        lease_id,
        unsettled_until: None,
        awaiting_answer: false,
        looked: false,
    };
    let mut watcher: Option<Watcher> = None;
    loop {
        keeper.tick().await;
        if watcher.is_none() {
            watcher = Watcher::start(EtcdConfig { start_timeout_ms: 1, ..etcd.clone() }).await.ok();
            if let Some(watcher) = &watcher {
                tokio::spawn(publish_changes(
                    watcher.clone(),
                    keeper.ownership.clone(),
                    keeper.fence.clone(),
                    keeper.metrics.clone(),
                    keeper.settings.instance_id.clone(),
                    shutdown.clone(),
                ));
            }
        }
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(TICK) => {}
        }
    }
    // Keep the lease on a clean stop: a restart within the TTL keeps this ingester's
    // shards; if it does not come back, the lease expires and the others fail it over.
    std::mem::forget(keeper.registration);
    keeper.metrics.liveness_registered.set(0);
}

/// Publishes what this ingester owns at every placement the watch sees, and has the fence
/// note it as held if it is open (what a batch in hand is checked against, should it fall).
async fn publish_changes(
    watcher: Watcher,
    ownership: Arc<Ownership>,
    fence: Arc<Fence>,
    metrics: TierMetrics,
    instance_id: String,
    shutdown: Shutdown,
) {
    let mut changes = watcher.subscribe();
    loop {
        let placement = changes.borrow_and_update().clone();
        publish(&ownership, &metrics, &placement, &instance_id);
        fence.allows();
        tokio::select! {
            () = shutdown.wait() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// Publishes `placement`'s view for `instance_id` and counts shards gained and lost.
fn publish(ownership: &Ownership, metrics: &TierMetrics, placement: &Placement, instance_id: &str) {
    let view = OwnershipView { rejoined: ownership.rejoined(), ..OwnershipView::of(placement, instance_id) };
    let (owned, version) = (view.owned_count(), view.version);
    // Kept out: the same view, or an older one than the watch or the tier task saw already.
    let Some(replaced) = ownership.publish(view) else { return };
    if let (Some(previous), Some(view)) = (replaced, ownership.current())
        && previous.num_shards == view.num_shards
    {
        let gained = view.owned.iter().zip(&previous.owned).filter(|(now, before)| **now && !**before).count();
        let lost = view.owned.iter().zip(&previous.owned).filter(|(now, before)| !**now && **before).count();
        metrics.moved("gained", gained);
        metrics.moved("lost", lost);
        if gained + lost > 0 {
            tracing::info!(version, gained, lost, owned, "ingester shards moved");
        }
    }
    metrics.owned_shards.set(owned as i64);
    metrics.tier_placement_version.set(version as i64);
}

struct Keeper {
    settings: TierSettings,
    store: PlacementStore,
    metrics: TierMetrics,
    ownership: Arc<Ownership>,
    /// Lifted once the placement is read under a live lease ([`Fence::approve`]).
    fence: Arc<Fence>,
    /// Instances seen with a live lease since this task started.
    seen_alive: HashSet<String>,
    /// Instances of the placement without a live lease, since when.
    missing_since: HashMap<String, Instant>,
    /// This ingester's liveness registration (kept alive while the task runs).
    registration: Registration,
    /// The lease id seen at the last tick: another one means it was granted again.
    lease_id: i64,
    /// Until then nobody is failed over: etcd was away, or this ingester's own lease
    /// had to be granted again (every lease expired), and live peers re-register.
    unsettled_until: Option<Instant>,
    /// etcd failed to answer: the hold starts at its next answer.
    awaiting_answer: bool,
    /// The placement was read once since start (whether this ingester was in it).
    looked: bool,
}

impl Keeper {
    async fn tick(&mut self) {
        let lease_id = self.registration.lease_id();
        if lease_id != self.lease_id {
            self.lease_id = lease_id;
            self.hold_failovers("this ingester's liveness lease was granted again");
        }
        // Looked at every tick, so that the fence's gauge and log follow the lease even
        // when no batch and no request looks.
        self.fence.allows();
        if let Err(error) = self.try_tick().await {
            self.awaiting_answer = true;
            self.missing_since.clear();
            self.metrics.tier_errors.inc();
            tracing::warn!(error = %error_chain(&error), "ingester tier: cannot read or change the placement; will retry");
        }
    }

    /// Holds failovers from now for a lease TTL plus the longest retry backoff (the time
    /// a live peer needs to grant its lease again), and forgets who was missing since when.
    fn hold_failovers(&mut self, why: &str) {
        let hold = self.settings.ttl + Duration::from_millis(self.settings.etcd.retry_max_backoff_ms);
        if self.unsettled_until.is_none_or(|until| until <= Instant::now()) {
            self.metrics.failover_holds.inc();
            tracing::info!(
                why,
                hold_ms = hold.as_millis() as u64,
                "holding failovers while live ingesters re-register"
            );
        }
        self.unsettled_until = Some(Instant::now() + hold);
        self.missing_since.clear();
    }

    async fn try_tick(&mut self) -> Result<(), StoreError> {
        // A read that starts while the lease is certainly alive shows which shards are
        // this ingester's under it: once that is published, the fence may lift.
        let lease_alive = self.fence.lease_alive();
        let (placement, revision) = match self.read_placement().await {
            Ok(found) => found,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        let result = self.keep_placement(&placement, revision).await;
        if let Some(lease) = lease_alive.filter(|_| self.looked) {
            publish(&self.ownership, &self.metrics, &placement, &self.settings.instance_id);
            self.fence.approve(lease);
        }
        result
    }

    /// The placement and its revision; a missing one is made (`init`) when this ingester
    /// joins, and read back.
    async fn read_placement(&mut self) -> Result<(Placement, i64), StoreError> {
        loop {
            match self.store.get().await {
                Err(StoreError::NotFound { .. }) if self.settings.join => {
                    let settings = &self.settings;
                    let first = Placement::init(
                        &[(&settings.instance_id, &settings.endpoint)],
                        settings.num_shards,
                        1,
                        now_ms(),
                    )
                    .map_err(|source| StoreError::Invalid { key: self.store.placement_key().to_owned(), source })?;
                    self.write(None, &first, "init").await?;
                }
                found => return found,
            }
        }
    }

    /// Fails over the dead, finalizes moves past their settling time, and joins.
    async fn keep_placement(&mut self, placement: &Placement, revision: i64) -> Result<(), StoreError> {
        let now = now_ms();
        let alive: HashSet<String> = self.store.alive_instances().await?.into_iter().collect();
        if std::mem::take(&mut self.awaiting_answer) {
            self.hold_failovers("etcd answers again");
        }
        let settings = &self.settings;
        self.seen_alive.extend(alive.iter().cloned());
        let ttl = settings.ttl;
        let mut dead = Vec::new();
        for instance in placement.instances() {
            if instance.id == settings.instance_id || alive.contains(&instance.id) {
                self.missing_since.remove(&instance.id);
                continue;
            }
            let since = *self.missing_since.entry(instance.id.clone()).or_insert_with(Instant::now);
            if self.seen_alive.contains(&instance.id) || since.elapsed() >= ttl {
                dead.push(instance.id.clone());
            }
        }
        if self.unsettled_until.is_some_and(|until| Instant::now() < until) {
            dead.clear();
        }
        if !dead.is_empty() {
            let next = placement
                .fail_over(&dead, now)
                .map_err(|source| StoreError::Invalid { key: self.store.placement_key().to_owned(), source })?;
            tracing::warn!(?dead, "ingesters lost their liveness lease: failing their shards over to live ingesters");
            for id in &dead {
                self.seen_alive.remove(id);
                self.missing_since.remove(id);
            }
            return self.write(Some(revision), &next, "fail_over").await;
        }
        if let Some(next) = placement.finalize(now - settings.settle_ms) {
            let mut next = next.into_proto();
            next.updated_at_ms = now;
            return self.write(Some(revision), &Placement::from_proto(next), "finalize").await;
        }
        if !self.looked
            && placement.instance(&settings.instance_id).is_none()
            && let Err(error) = self.ownership.persist_rejoined()
        {
            // Failed over while it was down (or new): what it restored is not current, and
            // a restart must know it too before this one joins again. Tried again next tick.
            tracing::error!(%error, "cannot record the rejoin in the data directory; not joining yet");
            self.metrics.tier_errors.inc();
            return Ok(());
        }
        self.looked = true;
        if settings.join && placement.instance(&settings.instance_id).is_none() && !placement.has_pending_moves() {
            let timing =
                MoveTiming::new(now).with_delay_ms(settings.move_delay_ms).with_boundary_ms(settings.move_boundary_ms);
            let next = placement
                .add_instance(&settings.instance_id, &settings.endpoint, timing)
                .map_err(|source| StoreError::Invalid { key: self.store.placement_key().to_owned(), source })?;
            return self.write(Some(revision), &next, "join").await;
        }
        Ok(())
    }

    /// Writes `next` if the placement is still at `revision`; a lost race is not an error.
    async fn write(&mut self, revision: Option<i64>, next: &Placement, change: &'static str) -> Result<(), StoreError> {
        match self.store.compare_and_swap(revision, next).await {
            Ok(_) => {
                self.metrics.changed(change);
                tracing::info!(change, version = next.version(), "ingesters' placement changed");
                Ok(())
            }
            Err(StoreError::Conflict { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// Runs `attempt` until it succeeds or `shutdown` fires, with backoff.
async fn retry<T, F, Fut>(shutdown: &Shutdown, metrics: &TierMetrics, what: &str, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match attempt().await {
            Ok(value) => return Some(value),
            Err(error) => {
                metrics.tier_errors.inc();
                tracing::warn!(error = %error_chain(&error), "ingester tier: cannot {what}; will retry");
            }
        }
        if !sleep_or_stop(backoff.next_delay(), shutdown).await {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_PLACEMENT: &str = r#"
        instance_id = "ing-1"
        listen = "127.0.0.1:7500"
        [placement]
        [placement.etcd]
        endpoints = ["http://127.0.0.1:2379"]
        env = "prod"
    "#;

    #[test]
    fn placement_config_defaults_and_settings() {
        let config: crate::Config = toml::from_str(WITH_PLACEMENT).unwrap();
        config.validate().unwrap();
        let placement = config.placement.as_ref().unwrap();
        assert_eq!((placement.liveness_ttl_secs, placement.num_shards, placement.join), (10, 64, true));
        let settings = placement.settings("ing-1", "127.0.0.1:7501".parse().unwrap());
        assert_eq!(settings.endpoint, "127.0.0.1:7501", "advertise defaults to the bound listener");
        assert_eq!((settings.move_delay_ms, settings.move_boundary_ms, settings.settle_ms), (30_000, 60_000, 90_000));
    }

    #[test]
    fn bad_placement_configs_name_the_key() {
        let cases = [
            (WITH_PLACEMENT.replace("instance_id = \"ing-1\"", ""), "instance_id"),
            (WITH_PLACEMENT.replace("127.0.0.1:7500", "0.0.0.0:7500"), "placement.advertise"),
            (WITH_PLACEMENT.replace("[placement]\n", "[placement]\nadvertise = \"nohost\"\n"), "placement.advertise"),
            (
                WITH_PLACEMENT.replace("[placement]\n", "[placement]\nliveness_ttl_secs = 0\n"),
                "placement.liveness_ttl_secs",
            ),
            (WITH_PLACEMENT.replace("[placement]\n", "[placement]\nnum_shards = 0\n"), "placement.num_shards"),
            (WITH_PLACEMENT.replace("env = \"prod\"", "env = \"\""), "placement.etcd"),
        ];
        for (text, key) in cases {
            let config: crate::Config = toml::from_str(&text).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.starts_with(&format!("invalid `{key}`")), "{key}: {err}");
        }
        let unknown = WITH_PLACEMENT.replace("[placement]\n", "[placement]\nshards = 3\n");
        assert!(toml::from_str::<crate::Config>(&unknown).unwrap_err().to_string().contains("shards"));
    }

    #[test]
    fn the_view_lists_every_entry_of_this_instance() {
        let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], 8, 1, 0).unwrap();
        let view = OwnershipView::of(&placement, "a");
        assert_eq!(view.num_shards, 8);
        assert_eq!(view.owned_count(), 4);
        let moved = placement.add_instance("c", "c:1", MoveTiming::new(0)).unwrap();
        let during = OwnershipView::of(&moved, "a");
        assert_eq!(during.owned_count(), 4, "a leaving shard is still owned until finalized");
        assert!(OwnershipView::of(&moved, "c").owned_count() > 0, "an initializing shard is owned");
        assert_eq!(OwnershipView::of(&moved, "zed").owned_count(), 0);
    }

    #[test]
    fn publishing_counts_gains_and_losses_and_bumps_the_generation() {
        let ownership = Ownership::default();
        let metrics = TierMetrics::default();
        let before = Placement::init(&[("a", "a:1"), ("b", "b:1")], 8, 1, 0).unwrap();
        publish(&ownership, &metrics, &before, "a");
        let mut seen = 0;
        assert_eq!(ownership.changed_since(&mut seen).unwrap().owned_count(), 4);
        assert!(ownership.changed_since(&mut seen).is_none(), "unchanged");
        publish(&ownership, &metrics, &before, "a");
        assert!(ownership.changed_since(&mut seen).is_none(), "the same view is not a change");
        let after = before.fail_over(&["b"], 1).unwrap();
        publish(&ownership, &metrics, &after, "a");
        assert_eq!(ownership.changed_since(&mut seen).unwrap().owned_count(), 8);
        assert_eq!((metrics.moves("gained"), metrics.moves("lost")), (4, 0));
        assert_eq!(metrics.owned_shards.get(), 8);
        // The watch and the tier task both publish: an older view coming second is kept out,
        // and counts no move.
        publish(&ownership, &metrics, &before, "a");
        assert!(ownership.changed_since(&mut seen).is_none(), "the older view is not taken in");
        assert_eq!(ownership.current().unwrap().version, after.version());
        assert_eq!((metrics.moves("gained"), metrics.moves("lost")), (4, 0));
        assert_eq!((metrics.owned_shards.get(), metrics.tier_placement_version.get()), (8, after.version() as i64));
    }
}
