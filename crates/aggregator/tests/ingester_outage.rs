//! The ingester goes away and comes back: within the buffer bound nothing
//! is lost; past it, collectors are pushed back (`buffer_full`) and what
//! has to go is dropped oldest-first and counted.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::{
    RoutingSender, Sent, TileReceiver, WINDOW_MS, metric_value, send_windows, sleep_until_ms, test_config, wait_until,
};
use tessera_aggregator::{Aggregator, Config};
use tessera_core::aggregate::Aggregate;
use tessera_core::clock::now_ms;
use tessera_proto::AckReason;
use tessera_proto::SeriesValue;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::{Placement, PlacementHandle};

const POLICIES: [&str; 2] = ["200ms:1h", "1s:1h"];

fn window_values(series: usize) -> Vec<SeriesValue> {
    (0..series)
        .map(|route| SeriesValue {
            r#ref: 0,
            series_id: format!("jobs.done|#queue:q{route}").into_bytes(),
            r#type: tessera_proto::MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter((route % 3 + 1) as f64).to_proto()),
        })
        .collect()
}

async fn start(config: Config, telemetry: &Telemetry) -> (Aggregator, PlacementHandle, Shutdown) {
    let shutdown = Shutdown::new();
    let own = Placement::init(&[("agg-1", "127.0.0.1:1")], 8, 1, 0).unwrap();
    let aggregator =
        Aggregator::start_with_placement(config, PlacementHandle::fixed(own), telemetry.clone(), shutdown.clone())
            .await
            .unwrap();
    let routed = Placement::init(&[("agg-1", aggregator.listen_addr().to_string())], 8, 1, 0).unwrap();
    (aggregator, PlacementHandle::fixed(routed), shutdown)
}

/// Sends `windows` windows of `series` counters from `first`, each as it
/// ends, giving a `retryable` answer `attempts` tries.
async fn send(placement: PlacementHandle, first: i64, windows: i64, series: usize, attempts: u32) -> Sent {
    let mut wire = RoutingSender::new("sender", placement).with_attempts(attempts);
    send_windows(&mut wire, &POLICIES, first, windows, 0, |_| (window_values(series), HashMap::new())).await
}

async fn nothing_is_lost_while_the_ingester_is_away_within_the_buffer_bound(merge_threads: usize) {
    let receiver = TileReceiver::start().await;
    let telemetry = Telemetry::new("aggregator", "test");
    let config = test_config("agg-1", &receiver.address.to_string(), &POLICIES, merge_threads);
    let (aggregator, routed, shutdown) = start(config, &telemetry).await;

    let first = (now_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let sender = tokio::spawn(send(routed, first, 30, 200, 50));
    sleep_until_ms(first + 500).await;
    receiver.stop().await;
    sleep_until_ms(first + 2_000).await;
    let batches_while_down = receiver.batches();
    receiver.restart().await;
    let mut sent = sender.await.unwrap();
    sent.model.excuse_late(&aggregator.metrics().tile);
    assert!(sent.refused("too_late") <= 3, "{:?}", sent.refused);
    assert_eq!(sent.refused.keys().filter(|(_, reason)| reason != "too_late").count(), 0, "{:?}", sent.refused);

    sent.model.assert_received(&receiver).await;
    assert!(receiver.batches() > batches_while_down, "buffered tiles were delivered after the outage");
    let destination = format!("destination=\"{}\"", receiver.address);
    let connect_errors = metric_value(&telemetry, "tessera_aggregator_connect_errors_total", &destination).unwrap();
    assert!(connect_errors >= 1.0, "the outage was noticed");
    assert_eq!(aggregator.metrics().drops("queue_full", "series"), 0);
    shutdown.trigger();
    aggregator.wait().await;
}

async fn past_the_buffer_bound_senders_are_pushed_back_and_drops_are_counted(merge_threads: usize) {
    let receiver = TileReceiver::start().await;
    receiver.stop().await;
    let telemetry = Telemetry::new("aggregator", "test");
    let mut config = test_config("agg-1", &receiver.address.to_string(), &POLICIES, merge_threads);
    config.ingester.max_frame_bytes = 4096;
    config.ingester.max_queue_bytes = 8192;
    let (aggregator, routed, shutdown) = start(config, &telemetry).await;

    // 300 counters make a tile of about 10 kB: every tile overflows the buffer.
    let first = (now_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let sent = send(routed, first, 12, 300, 2).await;
    let metrics = aggregator.metrics();
    assert!(metrics.drops("queue_full", "series") > 0, "tiles pushed out of the full buffer are counted");
    assert!(metrics.tile.refusals.rejected_batches(AckReason::BufferFull) > 0, "collectors were pushed back");
    assert!(sent.refused("buffer_full") >= 5, "{:?}", sent.refused);
    let model = sent.model;

    receiver.restart().await;
    // The books balance: every tile value of an accepted partial is delivered or
    // counted as dropped, once the last tile has closed and the buffer has drained.
    let destination = format!("destination=\"{}\"", receiver.address);
    let buffered = || metric_value(&telemetry, "tessera_aggregator_queue_bytes", &destination);
    wait_until("every tile value delivered or counted as dropped", Duration::from_secs(15), || {
        receiver.values().len() as u64 + metrics.drops("queue_full", "series") >= model.tiles.len() as u64
            && buffered() == Some(0.0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (delivered, dropped) = (receiver.values().len() as u64, metrics.drops("queue_full", "series"));
    assert_eq!(delivered + dropped, model.tiles.len() as u64, "{delivered} delivered + {dropped} dropped");
    assert!(delivered > 0 && dropped > 0);
    assert_eq!(buffered(), Some(0.0), "the buffer drained");
    // What survived is exact: a series is in one batch of its tile, whole.
    for (key, flushed) in receiver.values() {
        let expected = model.tiles.get(&key).unwrap_or_else(|| panic!("unexpected {}", support::describe(&key)));
        let tessera_proto::aggregate::Value::Counter(sum) = flushed[0].value else { panic!("not a counter") };
        assert_eq!(Some(sum), expected.counter(), "{}", support::describe(&key));
    }
    shutdown.trigger();
    aggregator.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_while_the_ingester_is_away_within_the_buffer_bound_with_one_merge_thread() {
    nothing_is_lost_while_the_ingester_is_away_within_the_buffer_bound(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_while_the_ingester_is_away_within_the_buffer_bound_with_four_merge_threads() {
    nothing_is_lost_while_the_ingester_is_away_within_the_buffer_bound(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_buffer_bound_senders_are_pushed_back_and_drops_are_counted_with_one_merge_thread() {
    past_the_buffer_bound_senders_are_pushed_back_and_drops_are_counted(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_buffer_bound_senders_are_pushed_back_and_drops_are_counted_with_four_merge_threads() {
    past_the_buffer_bound_senders_are_pushed_back_and_drops_are_counted(4).await;
}
