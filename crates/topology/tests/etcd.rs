//! The etcd paths against a real etcd (Debian's `etcd`, spawned by
//! `tessera_topology::testing::EtcdServer` on free loopback ports).

use std::future::Future;
use std::time::Duration;

use tessera_topology::testing::EtcdServer;
use tessera_topology::{
    EtcdConfig, Leader, MoveTiming, Placement, PlacementSource, PlacementStore, StoreError, WatchError, WatchEvent,
    Watcher, etcd_client,
};

/// How long any expected change may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);

fn start_etcd() -> EtcdServer {
    tokio::task::block_in_place(EtcdServer::start).expect("starting etcd")
}

/// Polls `check` until it holds, failing the test after [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn placement(instances: usize, now_ms: i64) -> Placement {
    let pairs: Vec<(String, String)> =
        (0..instances).map(|index| (format!("agg-{index}"), format!("127.0.0.1:{}", 7400 + index))).collect();
    Placement::init(&pairs, 16, 1, now_ms).unwrap()
}

/// Writes `next` over whatever is stored, as a tool would: read, then compare-and-swap.
async fn publish(store: &PlacementStore, next: &Placement) {
    let (_, revision) = store.get().await.expect("reading the placement");
    store.compare_and_swap(Some(revision), next).await.expect("writing the placement");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_swap_lets_one_of_two_writers_win() {
    let etcd = start_etcd();
    let first_writer = PlacementStore::connect(etcd.config("cas")).await.unwrap();
    let second_writer = PlacementStore::connect(etcd.config("cas")).await.unwrap();
    assert!(matches!(first_writer.get().await, Err(StoreError::NotFound { .. })));

    // Both create: only one may.
    let initial = placement(2, 1_000);
    let created = first_writer.compare_and_swap(None, &initial).await.unwrap();
    let lost = second_writer.compare_and_swap(None, &placement(3, 1_000)).await.unwrap_err();
    assert!(matches!(lost, StoreError::Conflict { .. }), "{lost}");

    // Both read the same revision and write a change: only the first lands.
    let (read_first, revision_first) = first_writer.get().await.unwrap();
    let (read_second, revision_second) = second_writer.get().await.unwrap();
    assert_eq!((read_first.clone(), revision_first), (initial.clone(), created));
    assert_eq!((read_second, revision_second), (initial.clone(), created));
    let timing = MoveTiming::new(1_700_000_000_000);
    let added = read_first.add_instance("agg-9", "127.0.0.1:7409", timing).unwrap();
    let written = first_writer.compare_and_swap(Some(revision_first), &added).await.unwrap();
    assert!(written > created);
    let stale = initial.remove_instance("agg-1", timing).unwrap();
    let lost = second_writer.compare_and_swap(Some(revision_second), &stale).await.unwrap_err();
    assert!(matches!(lost, StoreError::Conflict { .. }), "{lost}");
    assert_eq!(second_writer.get().await.unwrap(), (added.clone(), written));

    // The loser reads again and retries on the new revision.
    let (current, revision) = second_writer.get().await.unwrap();
    let settled = current.finalize(current.pending_until_ms().unwrap()).unwrap();
    second_writer.compare_and_swap(Some(revision), &settled).await.unwrap();
    assert_eq!(first_writer.get().await.unwrap().0, settled);

    // Invalid placements are never written.
    let mut broken = settled.clone().into_proto();
    broken.replication_factor = 2;
    let refused = first_writer.compare_and_swap(None, &Placement::from_proto(broken)).await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid { .. }), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_updates_and_ignores_invalid_ones() {
    let etcd = start_etcd();
    let store = PlacementStore::connect(etcd.config("watch")).await.unwrap();
    store.compare_and_swap(None, &placement(1, 1_000)).await.unwrap();

    let source = PlacementSource::Etcd(etcd.config("watch"));
    let handle = source.start().await.unwrap();
    assert_eq!(*handle.current(), placement(1, 1_000));
    assert_eq!(handle.generation(), 1);
    let mut changes = handle.subscribe();

    let next = Placement::init(&[("agg-0", "127.0.0.1:7400"), ("agg-1", "127.0.0.1:7401")], 16, 1, 2_000).unwrap();
    let next = Placement::from_proto(tessera_proto::Placement { version: 2, ..next.into_proto() });
    publish(&store, &next).await;
    tokio::time::timeout(PATIENCE, changes.changed()).await.expect("the watcher sees the update").unwrap();
    assert_eq!(**changes.borrow_and_update(), next);
    assert_eq!(*handle.current(), next);
    assert_eq!((handle.version(), handle.generation()), (2, 2));
    assert_eq!(handle.routing().destinations().len(), 2);

    // Garbage in etcd is counted and ignored.
    let mut client = store.client().clone();
    client.put(store.placement_key(), b"not a placement".to_vec(), None).await.unwrap();
    let stats = handle.stats();
    eventually("the invalid placement is counted", || async { stats.get(WatchEvent::InvalidPlacements) == 1 }).await;
    assert_eq!(*handle.current(), next);
    assert_eq!(stats.get(WatchEvent::UpdatesApplied), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_etcd_outages_and_starts_from_its_cache() {
    let mut etcd = start_etcd();
    let cache_directory = tempfile::tempdir().unwrap();
    let cache_path = cache_directory.path().join("cache").join("placement.pb");
    let config = etcd.config("outage").with_cache_path(&cache_path);
    let store = PlacementStore::connect(config.clone()).await.unwrap();
    let first = placement(2, 1_000);
    store.compare_and_swap(None, &first).await.unwrap();

    let watcher = Watcher::start(config.clone()).await.unwrap();
    assert_eq!(*watcher.current(), first);
    assert_eq!(tessera_topology::read_cache(&cache_path).unwrap(), first, "the cache is written at start");

    // etcd dies: the watcher notices and keeps the placement.
    let stats = watcher.stats();
    tokio::task::block_in_place(|| etcd.stop());
    eventually("the watcher notices etcd is gone", || async { stats.get(WatchEvent::EtcdErrors) > 0 }).await;
    assert_eq!(*watcher.current(), first);

    // A new watcher starting while etcd is down runs on the cache file.
    let cold = Watcher::start(config.clone()).await.unwrap();
    assert_eq!(*cold.current(), first);
    assert_eq!(cold.stats().get(WatchEvent::LoadedFromCache), 1);

    // etcd comes back and the placement changes: both watchers catch up.
    tokio::task::block_in_place(|| etcd.restart()).expect("restarting etcd");
    let second = Placement::from_proto(tessera_proto::Placement { version: 2, ..placement(3, 2_000).into_proto() });
    publish(&store, &second).await;
    for (name, watching) in [("the first watcher", &watcher), ("the cold-started watcher", &cold)] {
        eventually(&format!("{name} sees version 2"), || async { watching.version() == 2 }).await;
        assert_eq!(*watching.current(), second);
        assert!(watching.stats().get(WatchEvent::Reconnects) > 0, "{name} reconnected");
    }
    eventually("the cache holds version 2", || async {
        tessera_topology::read_cache(&cache_path).is_ok_and(|cached| cached == second)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_start_fails_without_etcd_or_cache() {
    let unused_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = EtcdConfig {
        request_timeout_ms: 200,
        retry_initial_backoff_ms: 20,
        retry_max_backoff_ms: 100,
        start_timeout_ms: 600,
        ..EtcdConfig::new([format!("http://127.0.0.1:{unused_port}")], "nothing")
    };
    let error = Watcher::start(config).await.unwrap_err();
    assert!(matches!(error, WatchError::NoPlacement { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_registrations_come_and_go() {
    let etcd = start_etcd();
    let store = PlacementStore::connect(etcd.config("live")).await.unwrap();
    assert!(store.alive_instances().await.unwrap().is_empty());

    let registration = store.register_instance("agg-a", Duration::from_secs(1)).await.unwrap();
    assert_eq!(registration.key(), "/tessera/live/alive/agg-a");
    assert_eq!(store.alive_instances().await.unwrap(), ["agg-a"]);

    // An instance whose process dies: its runtime (and keep-alive task) goes away without revoking.
    let config = etcd.config("live");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let registration = runtime.block_on(async {
            let store = PlacementStore::connect(config).await.unwrap();
            store.register_instance("agg-b", Duration::from_secs(1)).await.unwrap()
        });
        drop(runtime);
        drop(registration);
    })
    .join()
    .unwrap();
    assert_eq!(store.alive_instances().await.unwrap(), ["agg-a", "agg-b"]);
    eventually("the dead instance's lease expires", || async { store.alive_instances().await.unwrap() == ["agg-a"] })
        .await;

    // agg-a outlived agg-b, registered after it with the same 1 s TTL: its keep-alive works.
    // (etcd reports the remaining TTL in whole seconds, so 0 is a live lease; -1 an expired one.)
    let lease = store.client().clone().lease_time_to_live(registration.lease_id(), None).await.unwrap();
    assert!(lease.ttl() >= 0, "agg-a's lease is alive");

    registration.revoke().await.unwrap();
    assert!(store.alive_instances().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_expired_while_etcd_was_frozen_is_granted_again() {
    let etcd = start_etcd();
    let store = PlacementStore::connect(etcd.config("frozen")).await.unwrap();
    let registration = store.register_instance("agg-a", Duration::from_secs(1)).await.unwrap();
    let (first_lease, deadline) = registration.deadline().get().expect("granted");
    assert_eq!(first_lease, registration.lease_id());
    assert!(registration.deadline().remaining(first_lease) > Duration::ZERO);

    // Frozen (a hung or partitioned etcd) for three TTLs: etcd expires the
    // lease when it runs again, and the keep-alive must notice and re-register.
    let pid = etcd.pid().expect("etcd runs").to_string();
    let signal =
        |signal: &str| assert!(std::process::Command::new("kill").args([signal, &pid]).status().unwrap().success());
    signal("-STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(registration.deadline().remaining(first_lease), Duration::ZERO, "{deadline:?} has passed");
    signal("-CONT");
    eventually("a new lease holds the key", || async {
        registration.lease_id() != first_lease && store.alive_instances().await.is_ok_and(|alive| alive == ["agg-a"])
    })
    .await;
    let second_lease = registration.lease_id();
    assert!(registration.deadline().remaining(second_lease) > Duration::ZERO);
    assert_eq!(registration.deadline().remaining(first_lease), Duration::ZERO, "nothing lives on the old lease");
}

/// etcd answering that a lease is gone (revoked here; expired after an outage in
/// production) is followed by a new grant at once, not after a retry backoff: every moment
/// without the key is a moment a peer may take this instance for dead. The backoff is set
/// far longer than the test's patience, so a grant that waits for it fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_etcd_says_is_gone_is_granted_again_without_a_backoff() {
    let etcd = start_etcd();
    let config = EtcdConfig {
        retry_initial_backoff_ms: 4 * PATIENCE.as_millis() as u64,
        retry_max_backoff_ms: 4 * PATIENCE.as_millis() as u64,
        ..etcd.config("gone")
    };
    let store = PlacementStore::connect(config).await.unwrap();
    let registration = store.register_instance("ing-a", Duration::from_secs(3)).await.unwrap();
    let first_lease = registration.lease_id();
    store.client().clone().lease_revoke(first_lease).await.expect("revoking the lease");
    // The key goes with the lease; a check that it is gone would race the new grant this
    // test asks to be immediate (it failed so in CI), so only the new lease is checked.
    eventually("a new lease holds the key", || async {
        registration.lease_id() != first_lease && store.alive_instances().await.is_ok_and(|alive| alive == ["ing-a"])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_frees_what_its_previous_incarnation_held_at_once() {
    let etcd = start_etcd();
    let store = PlacementStore::connect(etcd.config("restart")).await.unwrap();
    // agg-a's first life: registered with a 60 s TTL, leader of shard set 0, then killed: its
    // runtime goes away without revoking anything.
    let config = etcd.config("restart");
    let dead_lease = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (registration, lease) = runtime.block_on(async {
            let store = PlacementStore::connect(config).await.unwrap();
            let registration = store.register_instance("agg-a", Duration::from_secs(60)).await.unwrap();
            let lease = registration.lease_id();
            assert_eq!(store.election(0, "agg-a").campaign(lease).await.unwrap(), Leader::Us);
            (registration, lease)
        });
        drop(runtime);
        drop(registration);
        lease
    })
    .join()
    .unwrap();
    let leaders = store.leaders().await.unwrap();
    assert_eq!(leaders.get(&0).map(String::as_str), Some("agg-a"), "the dead incarnation still leads");
    let alive_key = "/tessera/restart/alive/agg-a";
    let created = |response: etcd_client::GetResponse| response.kvs().first().map(|kv| kv.create_revision());
    let first_created = created(store.client().clone().get(alive_key, None).await.unwrap());

    // Its second life: once registered, the old lease is revoked and the leader key with it,
    // 60 s before it would have expired; the alive key moved to the new lease and never went.
    let registration = store.register_instance("agg-a", Duration::from_secs(60)).await.unwrap();
    assert_ne!(registration.lease_id(), dead_lease);
    assert!(store.leaders().await.unwrap().is_empty(), "the dead incarnation's leader key is gone");
    let old = store.client().clone().lease_time_to_live(dead_lease, None).await.unwrap();
    assert_eq!(old.ttl(), -1, "the old lease is revoked");
    assert_eq!(store.alive_instances().await.unwrap(), ["agg-a"]);
    assert_eq!(created(store.client().clone().get(alive_key, None).await.unwrap()), first_created, "never deleted");

    // The other replica is elected now, not after the TTL.
    let survivor = store.register_instance("agg-b", Duration::from_secs(60)).await.unwrap();
    assert_eq!(store.election(0, "agg-b").campaign(survivor.lease_id()).await.unwrap(), Leader::Us);
    // A registration with nothing before it revokes nothing of anyone else's.
    let other = store.register_instance("agg-c", Duration::from_secs(60)).await.unwrap();
    assert_eq!(store.leaders().await.unwrap().get(&0).map(String::as_str), Some("agg-b"));
    for registration in [registration, survivor, other] {
        registration.revoke().await.unwrap();
    }
}
