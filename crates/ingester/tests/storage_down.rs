//! Storage down for a while: the queue grows up to its bound, then batches are answered
//! `Retryable` (`queue_full`) and held by the sender; when storage comes back the queue
//! drains and nothing is lost.

mod support {
    pub use tessera_testkit::prometheus;
    pub mod wire;
}

use std::time::Duration;

use support::prometheus::{Prometheus, free_port};
use support::wire::{Sender, batch, counter, metric_value, recent_tile_end_ms, start_ingester, wait_until};
use tessera_ingester::{Config, Ingester};
use tessera_proto::{AckStatus, TileBatch};
use tessera_runtime::{Shutdown, Telemetry};

const SERIES: usize = 40;
const MAX_QUEUE_BYTES: u64 = 16 << 10;

fn tiles_at(sequence: u64, t0: i64) -> TileBatch {
    let tiles = (0..SERIES).map(|n| counter(&format!("down.c{n}|#host:web-1"), 1.0)).collect();
    batch(sequence, "10s:2d", t0 + sequence as i64 * 10_000, tiles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_holds_within_its_bound_and_drains_when_storage_returns() {
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
        listen = "127.0.0.1:0"
        data_dir = "{dir}"
        [queue]
        max_queue_bytes = {MAX_QUEUE_BYTES}
        segment_max_bytes = 4096
        checkpoint_interval_secs = 1
        [pool]
        workers = 2
        max_samples_per_request = 25
        retry_initial_backoff_ms = 20
        retry_max_backoff_ms = 200
        [sink]
        kind = "remote_write"
        url = "http://127.0.0.1:{port}/api/v1/write"
        connect_timeout_ms = 500
        request_timeout_ms = 5000
        "#,
        dir = data.path().display()
    );
    let (ingester, telemetry, shutdown, mut sender) = start_ingester(&config).await;
    let t0 = recent_tile_end_ms(10);

    // Storage is down: batches are taken until the queue is at its bound.
    let mut sequence = 0;
    let refused = loop {
        let ack = sender.send(tiles_at(sequence, t0)).await;
        match AckStatus::try_from(ack.status) {
            Ok(AckStatus::Ok) => sequence += 1,
            Ok(AckStatus::Retryable) => {
                assert_eq!(ack.reason, "queue_full", "{ack:?}");
                break sequence;
            }
            _ => panic!("unexpected answer {ack:?}"),
        }
        assert!(sequence < 1000, "the queue never filled");
    };
    assert!(refused >= 3, "only {refused} batches fit");
    let queue = ingester.queue("default").unwrap();
    assert!(queue.bytes() <= MAX_QUEUE_BYTES, "{} bytes queued, bound {MAX_QUEUE_BYTES}", queue.bytes());
    assert_eq!(queue.pending_records(), refused);
    wait_until("workers to retry against the dead storage", Duration::from_secs(10), || {
        metric_value(&telemetry.encode().unwrap(), "tessera_ingester_sink_retries_total", r#"target="default""#) >= 2.0
    })
    .await;
    // Still full while storage is down: the sender holds its batch.
    let ack = sender.send(tiles_at(refused, t0)).await;
    assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Retryable as i32, "queue_full"));

    let prometheus = tokio::task::spawn_blocking(move || Prometheus::start_on(port)).await.unwrap();
    // Like an aggregator: send the held batch until it is taken, then a few more.
    let total = refused + 4;
    for sequence in refused..total {
        sender.send_until_ok(tiles_at(sequence, t0)).await;
    }
    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;

    let end = (t0 + (total as i64 - 1) * 10_000) as f64 / 1000.0;
    let result = prometheus.query(r#"{__name__=~"down_c[0-9]+_total"}[10m]"#, end);
    let series = result.as_array().unwrap();
    assert_eq!(series.len(), SERIES, "{result}");
    for one in series {
        let points: Vec<(f64, f64)> = one["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|point| (point[0].as_f64().unwrap(), point[1].as_str().unwrap().parse().unwrap()))
            .collect();
        let expected: Vec<(f64, f64)> =
            (0..total).map(|i| ((t0 + i as i64 * 10_000) as f64 / 1000.0, (i + 1) as f64)).collect();
        assert_eq!(points, expected, "{}", one["metric"]);
    }
    let text = telemetry.encode().unwrap();
    assert!(
        metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="retryable",reason="queue_full""#) >= 2.0
    );
    assert_eq!(
        metric_value(&text, "tessera_ingester_sink_rejected_samples_total", r#"target="default",status="400""#),
        0.0
    );
    assert!(!data.path().join("rejected-samples.log").exists());
    // Finished segments are deleted once a checkpoint covers them.
    wait_until("finished segments to be deleted", Duration::from_secs(10), || queue.segments() == 1).await;
    shutdown.trigger();
    ingester.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_storage_is_down_keeps_the_queue_for_the_next_start() {
    let port = free_port();
    let data = tempfile::tempdir().unwrap();
    let config = || -> Config {
        let mut config: Config = toml::from_str(&format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nshutdown_grace_secs = 5\n[pool]\nretry_initial_backoff_ms = 20\nretry_max_backoff_ms = 200\n[sink]\nkind = \"remote_write\"\nurl = \"http://127.0.0.1:{port}/api/v1/write\"\nconnect_timeout_ms = 200\n",
            data.path().display()
        ))
        .unwrap();
        config.telemetry.listen = None;
        config
    };
    let t0 = recent_tile_end_ms(10);
    let shutdown = Shutdown::new();
    let ingester = Ingester::start(config(), Telemetry::new("ingester", "test"), shutdown.clone()).await.unwrap();
    let mut sender = Sender::connect(ingester.listen_addr()).await;
    for sequence in 0..3 {
        let ack = sender.send(tiles_at(sequence, t0)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
    drop(sender);
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), ingester.wait())
        .await
        .expect("shutdown does not wait for dead storage");

    let prometheus = tokio::task::spawn_blocking(move || Prometheus::start_on(port)).await.unwrap();
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("ingester", "test");
    let ingester = Ingester::start(config(), telemetry.clone(), shutdown.clone()).await.unwrap();
    wait_until("the replayed queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    let text = telemetry.encode().unwrap();
    assert_eq!(metric_value(&text, "tessera_ingester_queue_replayed_records_total", r#"target="default""#), 3.0);
    let result = prometheus.query(r#"down_c0_total{host="web-1"}[1m]"#, (t0 + 20_000) as f64 / 1000.0);
    assert_eq!(result[0]["values"].as_array().map(Vec::len), Some(3), "{result}");
    shutdown.trigger();
    ingester.wait().await;
}
