//! The real collector in front of the aggregator: statsd over UDP in,
//! tiles out. Windows follow the collector's clock, so the check is on
//! totals: every policy's tiles add up to exactly what was sent.

mod support;

use std::net::UdpSocket;
use std::time::Duration;

use support::{TileReceiver, collector_config, test_config, wait_until};
use tessera_aggregator::Aggregator;
use tessera_collector::Collector;
use tessera_proto::AckReason;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::{Placement, PlacementHandle};

const POLICIES: [&str; 2] = ["500ms:1h", "1s:1h"];

/// Sum of every tile value of `policy` for counter `id` (the first flush of each tile).
fn totals(receiver: &TileReceiver, policy: &str, id: &str) -> f64 {
    receiver.counter_tiles(policy, id).iter().map(|(_, flushed)| flushed[0].counter_sum()).sum()
}

async fn a_real_collector_feeds_exact_totals_through_the_aggregator(merge_threads: usize) {
    let receiver = TileReceiver::start().await;
    let shutdown = Shutdown::new();
    let mut config = test_config("agg-1", &receiver.address.to_string(), &POLICIES, merge_threads);
    config.buffer_past_ms = 500;
    let own = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:1")], 8, 1, 0).unwrap());
    let aggregator =
        Aggregator::start_with_placement(config, own, Telemetry::new("aggregator", "test"), shutdown.clone())
            .await
            .unwrap();
    let routed = Placement::init(&[("agg-1", aggregator.listen_addr().to_string())], 8, 1, 0).unwrap();
    let collector_shutdown = Shutdown::new();
    let collector = Collector::start(
        collector_config(),
        PlacementHandle::fixed(routed),
        Telemetry::new("collector", "test"),
        collector_shutdown.clone(),
    )
    .await
    .unwrap();

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = collector.udp_addr().unwrap();
    // 40 datagrams over about a second: 10 lines each, over 5 series, sampled or not.
    for round in 0..40 {
        let mut datagram = String::new();
        for line in 0..10 {
            let series = (round + line) % 5;
            if line % 2 == 0 {
                datagram.push_str(&format!("e2e.hits:1|c|#series:s{series}\n"));
            } else {
                datagram.push_str(&format!("e2e.hits:1|c|@0.5|#series:s{series}\n"));
            }
        }
        socket.send_to(datagram.as_bytes(), target).unwrap();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Every round gives each series one plain line (1) and one at rate 0.5 (2): 40 × 3.
    let expected = 120.0;
    wait_until("every line in the tiles of both policies", Duration::from_secs(10), || {
        (0..5).all(|series| {
            let id = format!("e2e.hits|#series:s{series}");
            POLICIES.iter().all(|policy| totals(&receiver, policy, &id) >= expected)
        })
    })
    .await;
    collector_shutdown.trigger();
    collector.wait().await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for series in 0..5 {
        let id = format!("e2e.hits|#series:s{series}");
        for policy in POLICIES {
            assert_eq!(totals(&receiver, policy, &id), expected, "{policy} {id}");
        }
    }
    let metrics = aggregator.metrics();
    for reason in [AckReason::TooLate, AckReason::NotOwner, AckReason::Malformed, AckReason::TooEarly] {
        assert_eq!(metrics.tile.refusals.rejected_batches(reason), 0, "{reason:?}");
    }
    shutdown.trigger();
    aggregator.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_collector_feeds_exact_totals_through_the_aggregator_with_one_merge_thread() {
    a_real_collector_feeds_exact_totals_through_the_aggregator(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_collector_feeds_exact_totals_through_the_aggregator_with_four_merge_threads() {
    a_real_collector_feeds_exact_totals_through_the_aggregator(4).await;
}
