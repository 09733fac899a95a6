//! What a statsd_exporter user meets, end to end on the real binaries into a real Prometheus:
//! the same lines give the series and values statsd_exporter's documentation and tests state,
//! and a query written for statsd_exporter gives the same number.
//!
//! - **Units**: statsd_exporter divides `|ms` by 1000 ("Prometheus presumes seconds"), keeps
//!   `|h` and `|d` as sent; its README's example, six timings of 1 200 ms, has a `_sum` of 7.2.
//! - **One resolution per store**: the aggregator tiles two policies (1 s and 2 s); the store
//!   holds the 1 s tiles alone with no `resolution` label, the 2 s tiles go to a second target
//!   (files), so `sum(rate(x[1m]))` with no `resolution` matcher counts each increment once.
//! - **Tags in the name**: InfluxDB (`name,k=v`), Librato (`name#k=v`) and SignalFx
//!   (`name.[k=v]rest`) tags become labels, as DogStatsD's `|#k:v` do, and DogStatsD's
//!   `|c:<id>` becomes `container_id` (statsd_exporter's `pkg/line` does each by default).
//! - **Classic histograms from the mapping file**: `observer_type: histogram` with `buckets`
//!   gives `_bucket{le}` with exact counts (the four timings 10, 12, 20 and 30 ms),
//!   `_sum` and `_count`, so `histogram_quantile()` over `_bucket` works as on
//!   statsd_exporter; the file target gets the same family, typed `histogram`.
//!   `observer_type: summary` with `quantiles` gives those quantiles alone, where the
//!   target writes native histograms beside its own quantiles for other timers.
//! - **HELP**: a mapping's `help` is the family's `# HELP` (the ingester reads the same file).

use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

use tessera_testkit::daemons::binary;
use tessera_testkit::free_port;
use tessera_testkit::process::Server;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    FAST_RECONNECT, collector_config, ingester_config, loopback, scalar, start_daemon, start_lone_aggregator,
    wait_until,
};

/// A classic histogram with a help, and a summary with quantiles of its own.
const MAPPING: &str = "mappings:
- match: api.*.latency
  name: api_latency
  observer_type: histogram
  help: Latency of the API.
  buckets: [0.01, 0.025, 0.1]
  labels:
    route: $1
- match: api.*.size
  name: api_size
  observer_type: summary
  quantiles:
  - quantile: 0.25
    error: 0.01
  - quantile: 0.99
    error: 0.001
  labels:
    route: $1
";

/// Whether `actual` is `expected` but for the rounding of a sum of values divided by 1000.
fn close(actual: Option<f64>, expected: f64) -> bool {
    actual.is_some_and(|actual| (actual - expected).abs() <= expected.abs() * 1e-12)
}

#[test]
fn the_same_lines_give_statsd_exporters_series_and_values() {
    let prometheus = Prometheus::start();
    let dir = tempfile::tempdir().unwrap();
    let (ingester_port, aggregator_port, statsd_port) = (free_port(), free_port(), free_port());
    // The store takes the 1 s tiles; the 2 s tiles have a target of their own (files).
    let files = dir.path().join("two-second-files");
    let ingester_text = ingester_config(
        ingester_port,
        &dir.path().join("ingester"),
        &prometheus.remote_write_url(),
        "sink_policies = [\"1s\"]\n",
        &format!(
            "histograms = \"both\"\n[policy_sinks.\"2s:1h\"]\nkind = \"file\"\ndir = {:?}\nrotate_secs = 1\n",
            files.display().to_string()
        ),
    );
    let mapping = dir.path().join("mapping.yml");
    std::fs::write(&mapping, MAPPING).unwrap();
    // The ingester reads the same file for the `help` of its mappings.
    let ingester_text = format!("{ingester_text}[mapping]\nfile = {:?}\n", mapping.display().to_string());
    let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, free_port());
    let (aggregator, placement) = start_lone_aggregator(
        dir.path(),
        aggregator_port,
        "policies = [\"1s:1h\", \"2s:1h\"]\n",
        ingester_port,
        FAST_RECONNECT,
    );
    let collector_text = format!(
        "{}[mapping]\nfile = {:?}\n",
        collector_config("host-1", statsd_port, &placement, ""),
        mapping.display().to_string()
    );
    let collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let lines = [
        // statsd_exporter's README: six timings of 1 200 ms.
        "test.timing:1200|ms\ntest.timing:1200|ms\ntest.timing:1200|ms",
        "test.timing:1200|ms\ntest.timing:1200|ms\ntest.timing:1200|ms",
        // A histogram and a distribution keep their values.
        "test.histogram:1200|h\ntest.distribution:0.25|d",
        // A counter with a sample rate, and tags in each style statsd_exporter reads.
        "test.counter:1|c|@0.1",
        "influx.hits,env=prod,host=a:1|c\nlibrato.hits#env=prod:2|c\nsignalfx.[env=prod]hits:3|c",
        "dog.hits:4|c|#env:prod\ncontainer.hits:5|c|c:4d2f9e1b",
        // A mapped classic histogram.
        "api.users.latency:10|ms\napi.users.latency:12|ms\napi.users.latency:20|ms\napi.users.latency:30|ms",
        // A mapped summary.
        "api.users.size:100|h\napi.users.size:200|h\napi.users.size:300|h\napi.users.size:400|h",
    ];
    for datagram in lines {
        socket.send_to(datagram.as_bytes(), loopback(statsd_port)).unwrap();
    }

    let query = |promql: &str| scalar(&prometheus, promql);
    wait_until("every series in Prometheus", Duration::from_secs(60), || {
        query("test_timing_count") == Some(6.0)
            && query("container_hits_total").is_some()
            && query("test_distribution_count").is_some()
            && query("api_latency_count") == Some(4.0)
            && query("api_size_count") == Some(4.0)
    });
    // Units: `_sum` in seconds for `|ms`, as sent for `|h` and `|d`; the native histogram too.
    assert!(close(query("test_timing_sum"), 7.2), "{:?}", query("test_timing_sum"));
    assert!(close(query("histogram_sum(test_timing{quantile=\"\"})"), 7.2));
    assert!(close(query("test_timing{quantile=\"0.99\"}"), 1.2), "{:?}", query("test_timing{quantile=\"0.99\"}"));
    assert_eq!(query("test_histogram_sum"), Some(1200.0));
    assert_eq!(query("test_distribution_sum"), Some(0.25));
    assert_eq!(query("test_counter_total"), Some(10.0));

    // The classic histogram: exact bucket counts, cumulative over `le` (Go's float form),
    // and the quantile a statsd_exporter dashboard computes from them.
    for (le, count) in [("0.01", 1.0), ("0.025", 3.0), ("0.1", 4.0), ("+Inf", 4.0)] {
        let promql = format!("api_latency_bucket{{route=\"users\",le=\"{le}\"}}");
        assert_eq!(query(&promql), Some(count), "{promql}");
    }
    assert!(close(query("api_latency_sum"), 0.072), "{:?}", query("api_latency_sum"));
    // Rank 0.99 × 4 = 3.96 falls in (0.025, 0.1], which holds the 4th value: interpolated.
    let p99 = query("histogram_quantile(0.99, sum by (le) (api_latency_bucket))");
    assert!(p99.is_some_and(|p99| (p99 - 0.097).abs() < 1e-9), "{p99:?}");
    assert_eq!(query("count(api_latency)"), None, "no native histogram or quantiles beside the buckets");

    // The summary: its own quantiles (nearest rank, within the sketch's 1.08 %), nothing else.
    let p99 = query("api_size{route=\"users\",quantile=\"0.99\"}");
    assert!(p99.is_some_and(|p99| (p99 - 400.0).abs() <= 400.0 * 0.011), "{p99:?}");
    let p25 = query("api_size{quantile=\"0.25\"}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(
        p25.is_some_and(|p25| (p25 - 100.0).abs() <= 100.0 * 0.011),
        "{p25:?} in {}",
        prometheus.query("api_size", now)
    );
    assert_eq!(query("count(api_size)"), Some(2.0), "two quantiles, no native histogram: {:?}", query("api_size"));
    assert_eq!(query("api_size_sum"), Some(1000.0));

    // Tags in the name, and the container id, as labels.
    assert_eq!(query("influx_hits_total{env=\"prod\",host=\"a\"}"), Some(1.0));
    assert_eq!(query("librato_hits_total{env=\"prod\"}"), Some(2.0));
    assert_eq!(query("signalfx_hits_total{env=\"prod\"}"), Some(3.0));
    assert_eq!(query("dog_hits_total{env=\"prod\"}"), Some(4.0));
    assert_eq!(query("container_hits_total{container_id=\"4d2f9e1b\"}"), Some(5.0));

    // One resolution in the store: one series per metric, no `resolution` label.
    assert_eq!(query("count({__name__=~\"(influx|librato|signalfx|dog|container)_hits_total\"})"), Some(5.0));
    assert_eq!(query("count({resolution!=\"\"})"), None, "no series carries a `resolution` label");

    // A query written for statsd_exporter: `sum(rate(x[1m]))` with no `resolution` matcher
    // is the rate of the one series, counted once.
    socket.send_to(b"dog.hits:6|c|#env:prod", loopback(statsd_port)).unwrap();
    wait_until("the second increment", Duration::from_secs(30), || query("dog_hits_total") == Some(10.0));
    // Both evaluated at one instant, so that their windows are the same.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let at_now = |promql: &str| -> f64 {
        let result = prometheus.query(promql, now);
        assert_eq!(result.as_array().map(Vec::len), Some(1), "{promql}: {result}");
        result[0]["value"][1].as_str().and_then(|value| value.parse().ok()).expect("a number")
    };
    let summed = at_now("sum(rate(dog_hits_total[1m]))");
    let single = at_now("rate(dog_hits_total{env=\"prod\"}[1m])");
    assert!(summed > 0.0 && summed == single, "sum {summed} vs the one series {single}");

    // The 2 s tiles went to their own target, not to the store; the histogram is typed so.
    let wanted = [
        "dog_hits_total{env=\"prod\"}",
        "# TYPE api_latency histogram",
        "api_latency_bucket{le=\"0.025\",route=\"users\"} 3",
    ];
    wait_until("the 2 s tiles in their files", Duration::from_secs(30), || {
        let text: String = std::fs::read_dir(&files)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "om"))
                    .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        wanted.iter().all(|line| text.contains(line))
    });
    drop((collector, aggregator, ingester));
}

/// The same mapping file and lines through `tessera local` (the one-process pipeline a new
/// user starts first) into a real Prometheus: classic histogram buckets, the mapping's
/// summary quantiles, timers in seconds, one series per metric.
#[test]
fn tessera_local_gives_statsd_exporters_series_to_a_real_prometheus() {
    let prometheus = Prometheus::start();
    let dir = Server::directory();
    let mapping = dir.path().join("mapping.yml");
    std::fs::write(&mapping, MAPPING).unwrap();
    let (statsd, telemetry) = (free_port(), free_port());
    let mut command = Command::new(binary("tessera"));
    command
        .args(["local", "--plain", "--policy", "1s:1h"])
        .args(["--statsd", &loopback(statsd).to_string(), "--telemetry", &loopback(telemetry).to_string()])
        .args(["--remote-write", &prometheus.remote_write_url()])
        .arg("--mapping-config")
        .arg(&mapping)
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let mut local = Server::spawn("tessera local", command, dir, "");
    local.wait_ready(loopback(telemetry), "/readyz", Duration::from_secs(30)).unwrap();

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for datagram in [
        "api.users.latency:10|ms\napi.users.latency:12|ms\napi.users.latency:20|ms\napi.users.latency:30|ms",
        "api.users.size:100|h\napi.users.size:200|h\napi.users.size:300|h\napi.users.size:400|h",
        "test.timing:1200|ms\ntest.timing:1200|ms\ntest.timing:1200|ms",
    ] {
        socket.send_to(datagram.as_bytes(), loopback(statsd)).unwrap();
    }
    let query = |promql: &str| scalar(&prometheus, promql);
    wait_until("the series in Prometheus", Duration::from_secs(60), || {
        query("api_latency_count") == Some(4.0) && query("api_size_count") == Some(4.0)
    });
    for (le, count) in [("0.01", 1.0), ("0.025", 3.0), ("0.1", 4.0), ("+Inf", 4.0)] {
        assert_eq!(query(&format!("api_latency_bucket{{route=\"users\",le=\"{le}\"}}")), Some(count), "le {le}");
    }
    let p99 = query("histogram_quantile(0.99, sum by (le) (api_latency_bucket))");
    assert!(p99.is_some_and(|p99| (p99 - 0.097).abs() < 1e-9), "{p99:?}");
    let p99 = query("api_size{quantile=\"0.99\"}");
    assert!(p99.is_some_and(|p99| (p99 - 400.0).abs() <= 400.0 * 0.011), "{p99:?}");
    // A timer no mapping names: remote write's default, a native histogram, in seconds.
    wait_until("the timer", Duration::from_secs(30), || query("histogram_count(test_timing)") == Some(3.0));
    assert!(close(query("histogram_sum(test_timing)"), 3.6), "{:?}", query("histogram_sum(test_timing)"));
    assert_eq!(query("count({resolution!=\"\"})"), None, "no series carries a `resolution` label");
    drop(local);
}
