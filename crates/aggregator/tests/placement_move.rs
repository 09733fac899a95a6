//! Two aggregators on a placement in a real etcd (Debian's `etcd`, spawned
//! by `tessera_topology::testing`): shards move from one to the other at a
//! tile boundary while senders keep sending, and summed over both every
//! tile equals what was sent, each tile flushed by exactly one of them.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{
    TileReceiver, WINDOW_MS, Window, join_senders, sleep_until_ms, spawn_senders, test_config, wait_until,
    wait_until_async,
};
use tessera_aggregator::Aggregator;
use tessera_core::aggregate::{Aggregate, Gauge};
use tessera_core::clock::now_ms;
use tessera_core::shard::shard_of;
use tessera_proto::AckReason;
use tessera_proto::SeriesValue;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::testing::EtcdServer;
use tessera_topology::{EtcdConfig, MoveTiming, Placement, PlacementSource, PlacementStore};

const POLICIES: [&str; 2] = ["200ms:1h", "1s:1h"];
const NUM_SHARDS: u32 = 8;

fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn window_values(sender: usize, start: i64) -> Window {
    let mut values = Vec::new();
    for route in 0..300 {
        let aggregate = Aggregate::Counter((route % 5 + 1 + sender) as f64);
        values.push(SeriesValue {
            r#ref: 0,
            series_id: format!("hits|#route:r{route}").into_bytes(),
            r#type: tessera_proto::MetricType::Counter as i32,
            aggregate: Some(aggregate.to_proto()),
        });
    }
    for n in 0..20 {
        let gauge = Gauge::with_value((start / WINDOW_MS % 997 + n) as f64, start * 1_000_000);
        values.push(SeriesValue {
            r#ref: 0,
            series_id: format!("load|#n:{n},sender:s{sender}").into_bytes(),
            r#type: tessera_proto::MetricType::Gauge as i32,
            aggregate: Some(Aggregate::Gauge(Box::new(gauge)).to_proto()),
        });
    }
    (values, HashMap::new())
}

async fn start_aggregator(
    id: &str,
    listen: &str,
    etcd: &EtcdConfig,
    ingester: &str,
    merge_threads: usize,
) -> (Aggregator, Shutdown, Telemetry) {
    let mut config = test_config(id, ingester, &POLICIES, merge_threads);
    config.listen = listen.parse().unwrap();
    config.placement = Some(PlacementSource::Etcd(etcd.clone()));
    config.liveness_ttl_secs = 2;
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("aggregator", "test");
    let aggregator = Aggregator::start(config, telemetry.clone(), shutdown.clone()).await.unwrap();
    (aggregator, shutdown, telemetry)
}

async fn shards_move_between_running_aggregators_without_loss_or_double_count(merge_threads: usize) {
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let etcd_config = etcd.config("move");
    let store = PlacementStore::connect(etcd_config.clone()).await.unwrap();
    let receiver = TileReceiver::start().await;
    let ingester = receiver.address.to_string();
    let (address_a, address_b) = (free_address(), free_address());
    let initial = Placement::init(&[("agg-a", address_a.as_str())], NUM_SHARDS, 1, now_ms()).unwrap();
    store.compare_and_swap(None, &initial).await.unwrap();

    let (aggregator_a, shutdown_a, _) =
        start_aggregator("agg-a", &address_a, &etcd_config, &ingester, merge_threads).await;
    // agg-b is not in the placement yet: it runs and owns nothing.
    let (aggregator_b, shutdown_b, telemetry_b) =
        start_aggregator("agg-b", &address_b, &etcd_config, &ingester, merge_threads).await;
    wait_until_async("both liveness leases", Duration::from_secs(10), || async {
        store.alive_instances().await.unwrap_or_default() == ["agg-a", "agg-b"]
    })
    .await;

    let routed = PlacementSource::Etcd(etcd_config.clone()).start().await.unwrap();
    let first = (now_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let senders = spawn_senders(2, &routed, &POLICIES, first, 40, window_values);

    // Half the shards move to agg-b at the first whole second at least 1 s from now.
    sleep_until_ms(first + 600).await;
    let timing = MoveTiming::new(now_ms()).with_delay_ms(1_000).with_boundary_ms(1_000);
    let cutover = timing.cutover_ms().unwrap();
    let (current, revision) = store.get().await.unwrap();
    let moved = current.add_instance("agg-b", &address_b, timing).unwrap();
    store.compare_and_swap(Some(revision), &moved).await.unwrap();
    let moved_shards: Vec<u32> = moved.owned_shards("agg-b", cutover).collect();
    assert_eq!(moved_shards.len(), 4);

    let mut sent = join_senders(senders, &POLICIES).await;
    sent.model.excuse_late(&aggregator_a.metrics().tile);
    sent.model.excuse_late(&aggregator_b.metrics().tile);
    assert!(first + 40 * WINDOW_MS > cutover + 1_000, "traffic flowed well past the cutover");
    // A sender that saw the move late would be refused `not_owner` (counted, never merged);
    // with a 1 s delay, nobody is.
    let not_owner = aggregator_a.metrics().tile.refusals.rejected_batches(AckReason::NotOwner)
        + aggregator_b.metrics().tile.refusals.rejected_batches(AckReason::NotOwner);
    assert_eq!(not_owner, 0, "refusals: {:?}", sent.refused);
    assert!(sent.refused.values().sum::<u64>() <= 8, "refusals: {:?}", sent.refused);

    let received = sent.model.assert_received(&receiver).await;

    // Moved shards: agg-a flushed every tile before the cutover, agg-b every tile from it.
    let mut flushed_by_b = 0;
    for ((policy, tile_end, _, id), flushed) in &received {
        let resolution_ms = if policy == "200ms:1h" { 200 } else { 1000 };
        let source = flushed[0].source.as_str();
        if !moved_shards.contains(&shard_of(id, NUM_SHARDS)) {
            assert_eq!(source, "agg-a");
        } else if *tile_end <= cutover {
            assert_eq!(source, "agg-a", "{policy} tile ending {tile_end} (cutover {cutover})");
        } else {
            assert!(tile_end - resolution_ms >= cutover);
            assert_eq!(source, "agg-b", "{policy} tile ending {tile_end} (cutover {cutover})");
            flushed_by_b += 1;
        }
    }
    assert!(flushed_by_b > 100, "agg-b flushed {flushed_by_b} tile values");

    // Settle the move once the last tile before it has closed; both see the new version.
    sleep_until_ms(cutover + 1_000 + 400).await;
    let (current, revision) = store.get().await.unwrap();
    let settled = current.finalize(now_ms()).expect("the move is due");
    store.compare_and_swap(Some(revision), &settled).await.unwrap();
    wait_until("both aggregators to see the settled placement", Duration::from_secs(5), || {
        aggregator_a.placement().version() == settled.version()
            && aggregator_b.placement().version() == settled.version()
    })
    .await;
    wait_until("shards owned to settle", Duration::from_secs(5), || {
        aggregator_a.metrics().tile.shards_owned.get() == 4 && aggregator_b.metrics().tile.shards_owned.get() == 4
    })
    .await;
    let exported = telemetry_b.encode().unwrap();
    let version = format!("tessera_aggregator_placement_version {}", settled.version());
    assert!(exported.lines().any(|line| line == version), "{version} not in\n{exported}");

    shutdown_a.trigger();
    shutdown_b.trigger();
    aggregator_a.wait().await;
    aggregator_b.wait().await;
    wait_until_async("leases revoked", Duration::from_secs(5), || async {
        store.alive_instances().await.map(|alive| alive.is_empty()).unwrap_or(false)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_move_between_running_aggregators_without_loss_or_double_count_with_one_merge_thread() {
    shards_move_between_running_aggregators_without_loss_or_double_count(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_move_between_running_aggregators_without_loss_or_double_count_with_four_merge_threads() {
    shards_move_between_running_aggregators_without_loss_or_double_count(4).await;
}
