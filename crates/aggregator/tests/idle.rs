//! A collector connection that goes silent after its handshake (a stuck process, a
//! half-open connection) is closed after `idle_timeout_ms` and counted; one that sends its
//! batch every window, empty or not, stays open.

mod support;

use std::time::{Duration, Instant};

use support::{TileReceiver, connect_collector, empty_batch, metric_value, test_config};
use tessera_aggregator::Aggregator;
use tessera_proto::frame::Body;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::{Placement, PlacementHandle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_and_counted_and_a_heartbeating_one_stays() {
    let receiver = TileReceiver::start().await;
    let telemetry = Telemetry::new("aggregator", "test");
    let shutdown = Shutdown::new();
    let mut config = test_config("agg-1", &receiver.address.to_string(), &["1s:1h"], 1);
    config.idle_timeout_ms = 1_000;
    let own = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:1")], 8, 1, 0).unwrap());
    let aggregator = Aggregator::start_with_placement(config, own, telemetry.clone(), shutdown.clone()).await.unwrap();
    let address = aggregator.listen_addr();

    let mut silent = connect_collector(address, "stuck-host").await;
    let mut alive = connect_collector(address, "busy-host").await;
    let started = Instant::now();
    let mut scratch = Vec::new();
    // The live one sends an empty batch (what an idle collector sends every window)
    // every 300 ms for 2.5 s, and each is acknowledged.
    for sequence in 1..=8u64 {
        framing::write_frame(&mut alive, &empty_batch("busy-host", sequence), DEFAULT_MAX_FRAME_BYTES).await.unwrap();
        let answer = framing::read_frame(&mut alive, &mut scratch, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
        assert!(matches!(answer.body, Some(Body::Ack(ack)) if ack.sequence == sequence));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // By now the silent one has been closed by the aggregator: reading finds the end.
    let mut byte = [0u8; 1];
    let read =
        tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut silent, &mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the silent connection is still open: {read:?}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let text = telemetry.encode().unwrap();
    assert_eq!(
        metric_value(&telemetry, "tessera_aggregator_frame_errors_total", "reason=\"idle_timeout\""),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric_value(&telemetry, "tessera_aggregator_connections", ""), Some(1.0), "only the live one is open");
    shutdown.trigger();
    aggregator.wait().await;
}
