//! The collector routing by a placement kept in a real etcd: live changes
//! re-route at the next cut, an etcd outage keeps the last placement, and a
//! cold start with etcd down routes by the cache file.

#[path = "support/receiver.rs"]
mod receiver;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use receiver::Receiver;
use tessera_collector::{Collector, Config, PlacementSource};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::in_process_collector_config;
use tessera_topology::testing::EtcdServer;
use tessera_topology::{EtcdConfig, Placement, PlacementStore};

fn config(etcd: EtcdConfig) -> Config {
    let mut config: Config = toml::from_str(&in_process_collector_config(200, 50)).unwrap();
    config.telemetry.listen = None;
    config.placement = Some(PlacementSource::Etcd(etcd));
    config
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start(config: Config, telemetry: &Telemetry, shutdown: &Shutdown) -> Collector {
    let placement = tessera_collector::start_placement(&config).await.unwrap();
    Collector::start(config, placement, telemetry.clone(), shutdown.clone()).await.unwrap()
}

fn placement_version(telemetry: &Telemetry) -> u64 {
    let text = telemetry.encode().unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("tessera_collector_placement_version "))
        .map_or(0, |value| value.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_etcd_live_through_outages_and_from_the_cache() {
    let mut etcd = tokio::task::block_in_place(EtcdServer::start).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let etcd_config = etcd.config("collector-test").with_cache_path(dir.path().join("placement.cache"));
    let store = PlacementStore::connect(etcd_config.clone()).await.unwrap();
    let (first, second) = (Receiver::start("127.0.0.1:0").await, Receiver::start("127.0.0.1:0").await);
    let placement_a = Placement::init(&[("agg-a", &first.address.to_string())], 8, 1, 0).unwrap();
    let revision = store.compare_and_swap(None, &placement_a).await.unwrap();

    let telemetry = Telemetry::new("collector", "test");
    let shutdown = Shutdown::new();
    let collector = start(config(etcd_config.clone()), &telemetry, &shutdown).await;
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = collector.udp_addr().unwrap();
    sender.send_to(b"phase.one:1|c\nphase.one.b:1|c", target).unwrap();
    wait_until("phase one at the first aggregator", || first.counter("phase.one") == Some(1.0)).await;

    // A new placement: every shard now goes to the second aggregator.
    let mut placement_b = Placement::init(&[("agg-b", &second.address.to_string())], 8, 1, 0).unwrap().into_proto();
    placement_b.version = placement_a.version() + 1;
    store.compare_and_swap(Some(revision), &Placement::from_proto(placement_b)).await.unwrap();
    wait_until("the new placement to be routed", || placement_version(&telemetry) == placement_a.version() + 1).await;
    sender.send_to(b"phase.two:1|c", target).unwrap();
    wait_until("phase two at the second aggregator", || second.counter("phase.two") == Some(1.0)).await;
    assert_eq!(first.counter("phase.two"), None, "the old owner got nothing after the change");

    // etcd goes away: routing continues on the last placement.
    etcd.stop();
    sender.send_to(b"phase.three:1|c", target).unwrap();
    wait_until("phase three at the second aggregator", || second.counter("phase.three") == Some(1.0)).await;
    shutdown.trigger();
    collector.wait().await;

    // A cold start while etcd is still down routes by the cache file.
    let telemetry = Telemetry::new("collector", "test");
    let shutdown = Shutdown::new();
    let collector = start(config(etcd_config), &telemetry, &shutdown).await;
    sender.send_to(b"phase.four:1|c", collector.udp_addr().unwrap()).unwrap();
    wait_until("phase four at the second aggregator", || second.counter("phase.four") == Some(1.0)).await;
    assert!(
        telemetry.encode().unwrap().contains("tessera_collector_placement_events_total{event=\"loaded_from_cache\"} 1")
    );
    assert_eq!(first.counter("phase.four"), None);
    shutdown.trigger();
    collector.wait().await;
}
