//! The ingester against a real Prometheus (Debian's `prometheus`, remote-write receiver and
//! native histograms on): tile batches in over the wire, exact values out of Prometheus'
//! query API, timers as both summaries and native histograms.

mod support {
    pub use tessera_testkit::prometheus;
    pub mod wire;
}

use std::time::Duration;

use serde_json::Value;
use support::prometheus::{Prometheus, single_series_points};
use support::wire::{
    Sender, batch, counter, gauge, metric_value, recent_tile_end_ms, set, start_ingester, timer, wait_until,
};
use tessera_ingester::{Config, Ingester};
use tessera_proto::AckStatus;
use tessera_runtime::{Shutdown, Telemetry};

fn config(data_dir: &std::path::Path, url: &str) -> Config {
    let mut config: Config = toml::from_str(&format!(
        r#"
        listen = "127.0.0.1:0"
        data_dir = "{dir}"
        [pool]
        workers = 4
        max_samples_per_request = 3
        retry_initial_backoff_ms = 20
        retry_max_backoff_ms = 500
        [sink]
        kind = "remote_write"
        url = "{url}"
        m3_headers = true
        histograms = "both"
        [policy_sinks."1m:40d"]
        kind = "file"
        rotate_secs = 3600
        "#,
        dir = data_dir.display()
    ))
    .expect("test config parses");
    config.telemetry.listen = None;
    config
}

/// `[[time, "value"], ...]` of the single series a range query returns.
fn points(result: &Value) -> Vec<(f64, String)> {
    single_series_points(result, "one series expected")
}

/// The value of the single series an instant query returns.
fn value(result: &Value) -> f64 {
    let series = result.as_array().expect("a result array");
    assert_eq!(series.len(), 1, "one series expected: {result}");
    series[0]["value"][1].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_reach_prometheus_with_exact_values() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let telemetry = Telemetry::new("ingester", "test");
    let shutdown = Shutdown::new();
    let ingester =
        Ingester::start(config(data.path(), &prometheus.remote_write_url()), telemetry.clone(), shutdown.clone())
            .await
            .expect("ingester starts");
    let mut sender = Sender::connect(ingester.listen_addr()).await;

    let t0 = recent_tile_end_ms(10);
    let lat_values: Vec<f64> = (1..=10).map(f64::from).collect();
    for i in 0..3u32 {
        let tiles = vec![
            counter("api.hits|#canary,env:prod", f64::from(i + 1)),
            gauge("temp|#room:1", 20.0 + f64::from(i)),
            timer("lat", &lat_values),
            set("users", &["a", "b", "c"]),
            timer("single", &[7.3]),
        ];
        let ack = sender.send(batch(u64::from(i), "10s:2d", t0 + i64::from(i) * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
        assert_eq!(ack.sequence, u64::from(i));
    }
    // Another policy, routed to its own (file) target.
    let ack = sender.send(batch(3, "1m:40d", t0 + 60_000, vec![counter("api.hits|#canary,env:prod", 7.0)])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");

    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;

    let at = |offset_ms: i64| (t0 + offset_ms) as f64 / 1000.0;
    let hits = prometheus.query(r#"api_hits_total{canary="true",env="prod"}[1m]"#, at(20_000));
    assert_eq!(
        points(&hits),
        vec![(at(0), "1".to_owned()), (at(10_000), "3".to_owned()), (at(20_000), "6".to_owned())],
        "counters are cumulative, one sample per tile at the tile end"
    );
    for i in 0..3 {
        assert_eq!(value(&prometheus.query(r#"temp{room="1"}"#, at(i * 10_000))), 20.0 + i as f64);
    }
    assert_eq!(value(&prometheus.query("users", at(20_000))), 3.0);
    assert_eq!(value(&prometheus.query("lat_count", at(20_000))), 30.0);
    assert_eq!(value(&prometheus.query("lat_sum", at(20_000))), 165.0);
    assert_eq!(value(&prometheus.query("lat_min", at(20_000))), 1.0);
    assert_eq!(value(&prometheus.query("lat_max", at(20_000))), 10.0);
    let median = value(&prometheus.query(r#"lat{quantile="0.5"}"#, at(20_000)));
    assert!((median - 5.0).abs() <= 5.0 * 0.011, "median {median} within the sketch's 1.09 %");
    let p99 = value(&prometheus.query(r#"lat{quantile="0.99"}"#, at(20_000)));
    // The nearest rank: ceil(0.99 x 10) = 10, the 10th value.
    assert!((p99 - 10.0).abs() <= 10.0 * 0.011, "p99 {p99}: nearest rank ceil(0.99 x 10) is the 10th value");
    assert_eq!(value(&prometheus.query(r#"single{quantile="0.9"}"#, at(20_000))), 7.3, "clamped to [min, max]");
    // histograms = "both": the native histogram beside the summary, cumulative like its _count.
    assert_eq!(value(&prometheus.query(r#"histogram_count(lat{quantile=""})"#, at(20_000))), 30.0);
    assert_eq!(value(&prometheus.query(r#"histogram_sum(lat{quantile=""})"#, at(20_000))), 165.0);
    let width = tessera_core::sketch::bucket_relative_width(5);
    for (q, exact) in [(0.5, 5.0), (0.9, 9.0)] {
        // Rank q x 30 of three tiles of 1..=10 falls on the value `exact`, in whose bucket
        // Prometheus interpolates.
        let native = value(&prometheus.query(&format!(r#"histogram_quantile({q}, lat{{quantile=""}})"#), at(20_000)));
        assert!((native - exact).abs() <= exact * width, "native q{q} {native}, exact {exact}");
    }
    let single = value(&prometheus.query(r#"histogram_quantile(0.9, single{quantile=""})"#, at(20_000)));
    assert!((single - 7.3).abs() <= 7.3 * width, "native single {single}");
    // No resolution label on either target: the 1 m sample (7 at t0 + 60 s) would be the only
    // one of api_hits_total in the 30 s before it.
    assert_eq!(
        prometheus.query("api_hits_total[30s]", at(60_000)),
        Value::Array(vec![]),
        "the 1m policy has its own target"
    );

    let text = telemetry.encode().unwrap();
    assert_eq!(metric_value(&text, "tessera_ingester_end_to_end_latency_seconds_count", r#"resolution="10s""#), 15.0);
    // 17 samples a tile (6 of them for two timers' summaries, 2 their histograms), 3 tiles.
    assert_eq!(metric_value(&text, "tessera_ingester_samples_written_total", r#"target="default""#), 57.0);
    assert_eq!(metric_value(&text, "tessera_ingester_samples_queued_total", ""), 58.0);
    assert_eq!(metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="ok",reason="""#), 4.0);
    assert!(
        metric_value(&text, "tessera_ingester_sink_requests_total", r#"target="default",outcome="ok""#) >= 6.0,
        "{text}"
    );
    assert_eq!(metric_value(&text, "tessera_ingester_sink_retries_total", r#"target="default""#), 0.0);
    assert!(metric_value(&text, "tessera_ingester_in_flight_limit", r#"target="default""#) >= 1.0);

    shutdown.trigger();
    ingester.wait().await;
    let files: Vec<_> = std::fs::read_dir(data.path().join("openmetrics/1m_40d"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "om"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let expected = format!(
        "# TYPE api_hits counter\n# HELP api_hits statsd counter (c), written by tessera\napi_hits_total{{canary=\"true\",env=\"prod\"}} 7.0 {}.000\n# EOF\n",
        (t0 + 60_000) / 1000
    );
    assert_eq!(text, expected);
}

/// A Prometheus without `--enable-feature=native-histograms` refuses every request holding a
/// native histogram, whole, with a 500 that retrying never mends. The histograms are refused
/// for good (counted, logged with the fix), and everything beside them is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_native_histograms_in_prometheus_the_histograms_are_refused_and_the_rest_written() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start_without_native_histograms).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, shutdown, mut sender) = start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[sink]\nkind = \"remote_write\"\nurl = \"{}\"\n",
        data.path().display(),
        prometheus.remote_write_url()
    ))
    .await;
    let t0 = recent_tile_end_ms(10);
    let tiles = vec![counter("jobs", 2.0), timer("lat", &[1.0, 3.0]), timer("only", &[5.0])];
    let ack = sender.send(batch(0, "10s:2d", t0, tiles)).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;

    let at = t0 as f64 / 1000.0;
    assert_eq!(value(&prometheus.query("jobs_total", at)), 2.0);
    assert_eq!(value(&prometheus.query("lat_max", at)), 3.0);
    assert_eq!(value(&prometheus.query("only_min", at)), 5.0);
    let text = telemetry.encode().unwrap();
    let refused =
        metric_value(&text, "tessera_ingester_sink_rejected_samples_total", r#"target="default",status="500""#);
    assert_eq!(refused, 2.0, "the two histograms: {text}");
    // jobs_total, and _min and _max of each timer.
    assert_eq!(metric_value(&text, "tessera_ingester_samples_written_total", r#"target="default""#), 5.0);
    let log = std::fs::read_to_string(data.path().join("rejected-samples.log")).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
    assert!(log.contains("--enable-feature=native-histograms"), "{log}");
    shutdown.trigger();
    ingester.wait().await;
}

/// Remote write's metadata requests (on by default, here once a second) are taken by a real
/// Prometheus: requests of metadata alone, answered like any write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_takes_the_metadata_requests() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, shutdown, mut sender) = start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[sink]\nkind = \"remote_write\"\nurl = \"{}\"\n\
         metadata_interval_secs = 1\n",
        data.path().display(),
        prometheus.remote_write_url()
    ))
    .await;
    let t0 = recent_tile_end_ms(10);
    let ack = sender.send(batch(0, "10s:2d", t0, vec![counter("jobs", 2.0), timer("lat", &[1.0, 3.0])])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    let sent = |name: &str| {
        let text = telemetry.encode().unwrap();
        metric_value(&text, name, r#"target="default""#)
    };
    wait_until("two rounds of metadata", Duration::from_secs(20), || {
        sent("tessera_ingester_metadata_requests_total") >= 2.0
    })
    .await;
    assert_eq!(sent("tessera_ingester_metadata_errors_total"), 0.0);
    assert_eq!(sent("tessera_ingester_metadata_families"), 4.0, "jobs, lat, lat_min, lat_max");
    assert_eq!(value(&prometheus.query("jobs_total", t0 as f64 / 1000.0)), 2.0);
    shutdown.trigger();
    ingester.wait().await;
}
