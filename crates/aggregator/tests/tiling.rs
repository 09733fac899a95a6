//! A running aggregator fed over the wire by several senders: every tile
//! is exact, tiles are epoch-aligned, and refused batches are refused
//! whole and counted.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use support::sender::WireClient;
use support::{TileReceiver, WINDOW_MS, Window, join_senders, metric_value, spawn_senders, test_config, wait_until};
use tessera_aggregator::Aggregator;
use tessera_core::aggregate::{Aggregate, Distribution};
use tessera_core::clock::now_ms;
use tessera_core::hll::HyperLogLog;
use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_proto::AckReason;
use tessera_proto::{AckStatus, SeriesValue};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::{Placement, PlacementHandle, PlacementSource};

const POLICIES: [&str; 2] = ["200ms:1h", "1s:1h"];
const NUM_SHARDS: u32 = 16;

fn value(id: String, kind: MetricKind, aggregate: &Aggregate) -> SeriesValue {
    SeriesValue {
        r#ref: 0,
        series_id: id.into_bytes(),
        r#type: tessera_core::aggregate::kind_to_proto(kind) as i32,
        aggregate: Some(aggregate.to_proto()),
    }
}

/// Sender `sender`'s values for the window at `start`, and the raw samples behind its timers.
fn window_values(sender: usize, start: i64) -> Window {
    let window = start / WINDOW_MS;
    let mut values = Vec::new();
    let mut samples = HashMap::new();
    for route in 0..200 {
        let count = (route % 7 + 1 + sender) as f64;
        values.push(value(format!("requests|#route:r{route}"), MetricKind::Counter, &Aggregate::Counter(count)));
    }
    for n in 0..20 {
        let gauge = tessera_core::aggregate::Gauge::with_value(((window % 1000) + n) as f64, (start + 50) * 1_000_000);
        let gauge = Aggregate::Gauge(Box::new(gauge));
        values.push(value(format!("temperature|#n:{n},sender:s{sender}"), MetricKind::Gauge, &gauge));
    }
    for n in 0..10 {
        let delta = tessera_core::aggregate::Gauge::with_delta(1.0, (start + 60 + sender as i64) * 1_000_000);
        values.push(value(format!("queue.depth|#n:{n}"), MetricKind::Gauge, &Aggregate::Gauge(Box::new(delta))));
    }
    for n in 0..20 {
        let mut timer = Distribution::default();
        let drawn: Vec<f64> =
            (0..5).map(|k| ((window * 7 + sender as i64 * 13 + k * 31 + n) % 500 + 1) as f64).collect();
        for sample in &drawn {
            timer.insert(*sample, 1.0);
        }
        let id = format!("latency|#n:{n}");
        samples.insert(id.clone().into_bytes(), drawn);
        values.push(value(id, MetricKind::Timer, &Aggregate::Distribution(Box::new(timer))));
    }
    for n in 0..10 {
        let mut set = HyperLogLog::new();
        for k in 0..4 {
            set.insert(format!("user{}", (window + sender as i64 * 3 + k) % 40).as_bytes());
        }
        values.push(value(format!("users|#n:{n}"), MetricKind::Set, &Aggregate::Set(Box::new(set))));
    }
    (values, samples)
}

async fn tiles_are_exact_across_many_series_tiles_and_senders(merge_threads: usize) {
    let receiver = TileReceiver::start().await;
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("aggregator", "test");
    let config = test_config("agg-1", &receiver.address.to_string(), &POLICIES, merge_threads);
    // The aggregator never reads its own endpoint; senders get the bound one below.
    let own = Placement::init(&[("agg-1", "127.0.0.1:1")], NUM_SHARDS, 1, 0).unwrap();
    let aggregator =
        Aggregator::start_with_placement(config, PlacementHandle::fixed(own), telemetry.clone(), shutdown.clone())
            .await
            .unwrap();
    let routed = Placement::init(&[("agg-1", aggregator.listen_addr().to_string())], NUM_SHARDS, 1, 0).unwrap();
    let routed = PlacementHandle::fixed(routed);

    let first = (now_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let senders = spawn_senders(3, &routed, &POLICIES, first, 25, window_values);
    let mut sent = join_senders(senders, &POLICIES).await;
    // On a loaded machine a window can miss its tile; what is refused is counted, the rest is
    // exact (one that missed only its finer tile is counted late for that policy).
    sent.model.excuse_late(&aggregator.metrics().tile);
    let late = sent.refused("too_late");
    assert_eq!(sent.refused.len(), usize::from(late > 0), "unexpected refusals: {:?}", sent.refused);
    assert!(late <= 7, "{late} of 75 windows too late");
    assert_eq!(aggregator.metrics().tile.refusals.rejected_batches(AckReason::TooLate), late);

    let received = sent.model.assert_received(&receiver).await;
    assert!(sent.model.len() > 4_000, "{} tile values", sent.model.len());
    for (policy, tile_end, _, _) in received.keys() {
        let resolution = policy.split(':').next().unwrap();
        let resolution_ms = if resolution == "200ms" { 200 } else { 1000 };
        assert_eq!(tile_end % resolution_ms, 0, "{policy} tile ending {tile_end} is not epoch-aligned");
    }

    let merged = aggregator.metrics().tile.partials_merged.get();
    assert_eq!(
        merged,
        aggregator.metrics().intake.partials_received.get()
            - aggregator.metrics().tile.refusals.rejected_partials(AckReason::TooLate)
    );
    assert!(metric_value(&telemetry, "tessera_aggregator_tiles_flushed_total", "policy=\"200ms:1h\"").unwrap() >= 10.0);
    assert!(metric_value(&telemetry, "tessera_aggregator_flush_lag_seconds_count", "policy=\"1s:1h\"").unwrap() >= 2.0);
    assert_eq!(metric_value(&telemetry, "tessera_aggregator_active_series", "policy=\"1s:1h\""), Some(300.0));
    shutdown.trigger();
    aggregator.wait().await;
}

fn id_in_shard(prefix: &str, shard: u32) -> String {
    (0..).map(|n| format!("{prefix}{n}")).find(|id| shard_of(id.as_bytes(), 8) == shard).unwrap()
}

fn counter_batch(window_start_ms: i64, ids: &[&str], value: f64) -> tessera_proto::PartialBatch {
    let values =
        ids.iter().map(|id| self::value((*id).to_owned(), MetricKind::Counter, &Aggregate::Counter(value))).collect();
    support::sender::batch_of(window_start_ms, WINDOW_MS as u32, 8, values)
}

async fn refused_batches_are_refused_whole_and_counted_by_reason(merge_threads: usize) {
    let receiver = TileReceiver::start().await;
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("placement.toml");
    let file = "num_shards = 8\n[[instances]]\nid = \"agg-a\"\nendpoint = \"127.0.0.1:1\"\n[[instances]]\nid = \"agg-b\"\nendpoint = \"127.0.0.1:2\"\n";
    std::fs::write(&path, file).unwrap();
    let mut config = test_config("agg-a", &receiver.address.to_string(), &POLICIES, merge_threads);
    config.placement = Some(PlacementSource::Static { path });
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("aggregator", "test");
    let aggregator = Aggregator::start(config, telemetry.clone(), shutdown.clone()).await.unwrap();
    // agg-a owns the even shards, agg-b the odd ones (Placement::init deals them in turn).
    let (mine, theirs, good) = (id_in_shard("mine", 0), id_in_shard("theirs", 1), id_in_shard("good", 2));
    let mut client = WireClient::connect(aggregator.listen_addr(), "tester").await;
    let window = (now_ms() / WINDOW_MS) * WINDOW_MS;

    let cases = [
        (counter_batch(window - 10_000, &[&good], 1.0), "too_late"),
        (counter_batch(window + 10_000, &[&good], 1.0), "too_early"),
        (counter_batch(window, &[&mine, &theirs], 1.0), "not_owner"),
        (counter_batch(window, &[&mine], f64::NAN), "malformed"),
        (tessera_proto::PartialBatch { window_ms: 0, ..counter_batch(window, &[&mine], 1.0) }, "malformed"),
    ];
    for (batch, reason) in cases {
        let ack = client.send(batch).await;
        assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Permanent as i32, reason), "{}", ack.message);
    }
    let ack = client.send(counter_batch(window, &[&good], 2.0)).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{}", ack.message);

    wait_until("the good tiles", Duration::from_secs(5), || receiver.values().len() == 2).await;
    for ((policy, tile_end, _, id), flushed) in receiver.values() {
        assert_eq!(String::from_utf8(id).unwrap(), good, "only the accepted batch reached a tile");
        let resolution_ms = if policy == "200ms:1h" { 200 } else { 1000 };
        assert_eq!(tile_end, (window / resolution_ms + 1) * resolution_ms, "{policy}");
        assert!(matches!(flushed[0].value, tessera_proto::aggregate::Value::Counter(sum) if sum == 2.0));
    }
    let metrics = aggregator.metrics();
    for (reason, batches) in
        [(AckReason::TooLate, 1), (AckReason::TooEarly, 1), (AckReason::NotOwner, 1), (AckReason::Malformed, 2)]
    {
        assert_eq!(metrics.tile.refusals.rejected_batches(reason), batches, "{reason:?}");
    }
    assert_eq!(metrics.tile.refusals.rejected_partials(AckReason::NotOwner), 2);
    let exported = metric_value(&telemetry, "tessera_aggregator_partials_rejected_total", "reason=\"not_owner\"");
    assert_eq!(exported, Some(2.0));
    assert_eq!(metric_value(&telemetry, "tessera_aggregator_shards_owned", ""), Some(4.0));
    shutdown.trigger();
    aggregator.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiles_are_exact_across_many_series_tiles_and_senders_with_one_merge_thread() {
    tiles_are_exact_across_many_series_tiles_and_senders(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiles_are_exact_across_many_series_tiles_and_senders_with_four_merge_threads() {
    tiles_are_exact_across_many_series_tiles_and_senders(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_batches_are_refused_whole_and_counted_by_reason_with_one_merge_thread() {
    refused_batches_are_refused_whole_and_counted_by_reason(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_batches_are_refused_whole_and_counted_by_reason_with_four_merge_threads() {
    refused_batches_are_refused_whole_and_counted_by_reason(4).await;
}
