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
//! **Ownership and totals.** [`Ownership`] publishes, for each shard, whether
//! this ingester owns it (any entry in the placement: available, moving in
//! or moving out). The converter ([`crate::admit`]) gives every running
//! total the *epoch* of its shard: an epoch goes up each time this ingester
//! gains the shard, so a total made before the shard went away and came back
//! is stale and starts over, with an explicit reset (see the admit docs).
//! The placement seen first after a start counts as owned all along, so a
//! restart within the lease TTL keeps its checkpointed totals.
//!
//! **Shutdown** keeps the liveness lease: a restart within the TTL keeps the
//! shards (aggregators hold its tiles meanwhile); an ingester that does not
//! come back is failed over when its lease expires.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_core::clock::now_ms;
use tessera_runtime::Shutdown;
use tessera_runtime::logging::error_chain;
use tessera_runtime::telemetry::zeroed_family;
use tessera_topology::{EtcdConfig, MoveTiming, Placement, PlacementStore, StoreError, Tier, Watcher};
use tessera_wire::backoff::{Backoff, sleep_or_stop};

/// How often the tier task looks at the placement and liveness.
pub const TICK: Duration = Duration::from_secs(1);

/// `[placement]`: this ingester's place in the ingesters' placement (optional;
/// without it the ingester takes whatever aggregators send it, as a single
/// ingester or one of a fixed `endpoints` list).
///
/// ```toml
/// [placement]
/// advertise = "10.0.1.1:7500"    # where aggregators reach this ingester (default: listen)
/// liveness_ttl_secs = 10         # failover comes this long after a crash
/// num_shards = 64                # shards of a placement this ingester creates
/// join = true                    # add itself when it is not in the placement
/// move_delay_secs = 30           # a join's shards move at least this long from now,
/// move_boundary_secs = 60        #   on a multiple of this
/// settle_secs = 90               # moves are finalized this long after their cutover
/// [placement.etcd]
/// endpoints = ["http://127.0.0.1:2379"]
/// env = "prod"
/// ```
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// etcd; the placement is `/tessera/<env>/ingesters/placement`.
    pub etcd: EtcdConfig,
    /// `host:port` aggregators reach this ingester at; default: `listen` (which must
    /// then not be a wildcard address).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Liveness lease TTL: a crashed ingester's shards move this long after its last keep-alive.
    #[serde(default = "default_liveness_ttl_secs")]
    pub liveness_ttl_secs: u64,
    /// Shards of the placement this ingester creates when there is none.
    #[serde(default = "default_num_shards")]
    pub num_shards: u32,
    /// Add this ingester to the placement when it is not in it (at start, or after it
    /// was failed over).
    #[serde(default = "default_join")]
    pub join: bool,
    /// A join's shards move at least this long from now ...
    #[serde(default = "default_move_delay_secs")]
    pub move_delay_secs: u64,
    /// ... on a multiple of this (a multiple of every storage policy's resolution).
    #[serde(default = "default_move_boundary_secs")]
    pub move_boundary_secs: u64,
    /// Moves are finalized this long after their cutover (the largest tile plus the
    /// aggregators' buffer, so the old owner has written the last tile before it).
    #[serde(default = "default_settle_secs")]
    pub settle_secs: u64,
}

fn default_liveness_ttl_secs() -> u64 {
    10
}
fn default_num_shards() -> u32 {
    64
}
fn default_join() -> bool {
    true
}
fn default_move_delay_secs() -> u64 {
    30
}
fn default_move_boundary_secs() -> u64 {
    60
}
fn default_settle_secs() -> u64 {
    90
}

impl PlacementConfig {
    /// Checks values that parse but cannot work; `listen` is the wire listener.
    pub fn validate(&self, listen: std::net::SocketAddr) -> Result<(), tessera_runtime::config::InvalidSetting> {
        let invalid = |key: &str, reason: &str| Err(tessera_runtime::config::InvalidSetting::new(key, reason));
        if let Err(error) = self.etcd.validate() {
            return invalid("placement.etcd", &error.to_string());
        }
        if self.liveness_ttl_secs == 0 {
            return invalid("placement.liveness_ttl_secs", "must be at least 1");
        }
        if self.num_shards == 0 {
            return invalid("placement.num_shards", "must be at least 1");
        }
        if self.move_boundary_secs == 0 {
            return invalid("placement.move_boundary_secs", "must be at least 1");
        }
        match &self.advertise {
            Some(endpoint) => {
                let port_ok = endpoint
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !port_ok {
                    return invalid("placement.advertise", "must be `host:port`");
                }
            }
            None if listen.ip().is_unspecified() => {
                return invalid(
                    "placement.advertise",
                    "must be set when `listen` is a wildcard address: aggregators need an address to reach",
                );
            }
            None => {}
        }
        Ok(())
    }

    /// The tier task's settings for instance `instance_id` listening on `listen`.
    pub fn settings(&self, instance_id: &str, listen: std::net::SocketAddr) -> TierSettings {
        TierSettings {
            etcd: self.etcd.clone(),
            instance_id: instance_id.to_owned(),
            endpoint: self.advertise.clone().unwrap_or_else(|| listen.to_string()),
            ttl: Duration::from_secs(self.liveness_ttl_secs),
            num_shards: self.num_shards,
            join: self.join,
            move_delay_ms: (self.move_delay_secs as i64).saturating_mul(1000),
            move_boundary_ms: (self.move_boundary_secs as i64).saturating_mul(1000),
            settle_ms: (self.settle_secs as i64).saturating_mul(1000),
        }
    }
}

/// What [`run_tier`] needs.
#[derive(Debug, Clone)]
pub struct TierSettings {
    /// etcd (the ingesters' key is used whatever `tier` says).
    pub etcd: EtcdConfig,
    /// This ingester's id in the placement.
    pub instance_id: String,
    /// Where aggregators reach this ingester, `host:port`.
    pub endpoint: String,
    /// Liveness lease TTL.
    pub ttl: Duration,
    /// Shards of a placement this ingester creates (when there is none).
    pub num_shards: u32,
    /// Add this ingester to the placement when it is not in it.
    pub join: bool,
    /// When a join moves shards (delay and boundary).
    pub move_delay_ms: i64,
    /// Moves take effect on multiples of this.
    pub move_boundary_ms: i64,
    /// How long after a move's cutover it is finalized.
    pub settle_ms: i64,
}

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
    /// Version of the placement this comes from.
    pub version: u64,
}

impl OwnershipView {
    /// What `instance_id` owns in `placement`.
    pub fn of(placement: &Placement, instance_id: &str) -> OwnershipView {
        let num_shards = placement.num_shards();
        let mut owned = vec![false; num_shards as usize];
        let mut joining = vec![false; num_shards as usize];
        for entry in placement.shards_of(instance_id) {
            if let Some(slot) = owned.get_mut(entry.id as usize) {
                *slot = true;
                joining[entry.id as usize] = entry.cutover_ms > 0;
            }
        }
        OwnershipView { num_shards, owned, joining, version: placement.version() }
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
}

impl Ownership {
    /// Publishes `view` (when it differs from the current one).
    pub fn publish(&self, view: OwnershipView) {
        let mut current = self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_deref() == Some(&view) {
            return;
        }
        *current = Some(Arc::new(view));
        self.generation.fetch_add(1, Ordering::Release);
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

tessera_runtime::metrics! {
    /// The tier task's metrics.
    pub struct TierMetrics {
        /// Shards of the ingesters' placement this ingester owns
        pub owned_shards: Gauge,
        /// Version of the ingesters' placement this ingester saw last
        pub tier_placement_version: Gauge,
        /// Shards this ingester gained or lost in the ingesters' placement, by direction
        shard_moves: Family<ByDirection, Counter> = zeroed_family(DIRECTIONS.map(|direction| ByDirection { direction })),
        /// Changes this ingester wrote to the ingesters' placement: init, join, fail_over (a dead
        /// ingester's shards handed to live ones), finalize
        placement_changes: Family<ByChange, Counter> = zeroed_family(CHANGES.map(|change| ByChange { change })),
        /// etcd requests of the ingester tier task that failed
        pub tier_errors: Counter,
        /// Cumulative series that started over (with an explicit reset) because their shard came to
        /// this ingester
        pub series_adopted: Counter,
        /// 1 while this ingester holds its liveness lease in etcd
        pub liveness_registered: Gauge,
    }
}

/// Every `change` of `tessera_ingester_placement_changes_total`.
pub const CHANGES: [&str; 4] = ["init", "join", "fail_over", "finalize"];

/// Every `direction` of `tessera_ingester_shard_moves_total`.
pub const DIRECTIONS: [&str; 2] = ["gained", "lost"];

/// `{direction}`: `gained` or `lost`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByDirection {
    direction: &'static str,
}

/// `{change}`: one of [`CHANGES`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByChange {
    change: &'static str,
}

impl TierMetrics {
    fn moved(&self, direction: &'static str, count: usize) {
        if count > 0 {
            self.shard_moves.get_or_create(&ByDirection { direction }).inc_by(count as u64);
        }
    }

    /// Shards moved in `direction` (`gained` or `lost`) so far.
    #[cfg(test)]
    fn moves(&self, direction: &'static str) -> u64 {
        self.shard_moves.get_or_create(&ByDirection { direction }).get()
    }

    fn changed(&self, change: &'static str) {
        self.placement_changes.get_or_create(&ByChange { change }).inc();
    }
}

/// Runs until `shutdown`: registers this ingester's liveness, keeps the
/// placement (init, join, fail over, finalize) and publishes what it owns.
pub async fn run_tier(settings: TierSettings, ownership: Arc<Ownership>, metrics: TierMetrics, shutdown: Shutdown) {
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
    tracing::info!(instance_id = %settings.instance_id, key = registration.key(), "ingester registered");
    let mut keeper =
        Keeper { settings, store, metrics, ownership, seen_alive: HashSet::new(), missing_since: HashMap::new() };
    let mut watcher: Option<Watcher> = None;
    loop {
        keeper.tick().await;
        if watcher.is_none() {
            watcher = Watcher::start(EtcdConfig { start_timeout_ms: 1, ..etcd.clone() }).await.ok();
            if let Some(watcher) = &watcher {
                tokio::spawn(publish_changes(
                    watcher.clone(),
                    keeper.ownership.clone(),
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
    std::mem::forget(registration);
    keeper.metrics.liveness_registered.set(0);
}

/// Publishes what this ingester owns at every placement the watch sees.
async fn publish_changes(
    watcher: Watcher,
    ownership: Arc<Ownership>,
    metrics: TierMetrics,
    instance_id: String,
    shutdown: Shutdown,
) {
    let mut changes = watcher.subscribe();
    loop {
        let placement = changes.borrow_and_update().clone();
        publish(&ownership, &metrics, &placement, &instance_id);
        tokio::select! {
            () = shutdown.wait() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

/// Publishes `placement`'s view for `instance_id` and counts shards gained and lost.
fn publish(ownership: &Ownership, metrics: &TierMetrics, placement: &Placement, instance_id: &str) {
    let view = OwnershipView::of(placement, instance_id);
    if let Some(previous) = ownership.current().filter(|previous| previous.num_shards == view.num_shards) {
        let gained = view.owned.iter().zip(&previous.owned).filter(|(now, before)| **now && !**before).count();
        let lost = view.owned.iter().zip(&previous.owned).filter(|(now, before)| !**now && **before).count();
        metrics.moved("gained", gained);
        metrics.moved("lost", lost);
        if gained + lost > 0 {
            tracing::info!(version = view.version, gained, lost, owned = view.owned_count(), "ingester shards moved");
        }
    }
    metrics.owned_shards.set(view.owned_count() as i64);
    metrics.tier_placement_version.set(view.version as i64);
    ownership.publish(view);
}

struct Keeper {
    settings: TierSettings,
    store: PlacementStore,
    metrics: TierMetrics,
    ownership: Arc<Ownership>,
    /// Instances seen with a live lease since this task started.
    seen_alive: HashSet<String>,
    /// Instances of the placement without a live lease, since when.
    missing_since: HashMap<String, Instant>,
}

impl Keeper {
    async fn tick(&mut self) {
        if let Err(error) = self.try_tick().await {
            self.metrics.tier_errors.inc();
            tracing::warn!(error = %error_chain(&error), "ingester tier: cannot read or change the placement; will retry");
        }
    }

    async fn try_tick(&mut self) -> Result<(), StoreError> {
        let settings = &self.settings;
        let now = now_ms();
        let (placement, revision) = match self.store.get().await {
            Ok(found) => found,
            Err(StoreError::NotFound { .. }) if settings.join => {
                let first =
                    Placement::init(&[(&settings.instance_id, &settings.endpoint)], settings.num_shards, 1, now)
                        .map_err(|source| StoreError::Invalid { key: self.store.placement_key().to_owned(), source })?;
                return self.write(None, &first, "init").await;
            }
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        let alive: HashSet<String> = self.store.alive_instances().await?.into_iter().collect();
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
    }
}
