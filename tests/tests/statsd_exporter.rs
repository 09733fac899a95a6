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

use std::net::UdpSocket;
use std::time::Duration;

use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    FAST_RECONNECT, collector_config, ingester_config, loopback, scalar, start_daemon, start_lone_aggregator,
    wait_until,
};

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
    let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, free_port());
    let (aggregator, placement) = start_lone_aggregator(
        dir.path(),
        aggregator_port,
        "policies = [\"1s:1h\", \"2s:1h\"]\n",
        ingester_port,
        FAST_RECONNECT,
    );
    let collector_text = collector_config("host-1", statsd_port, &placement, "");
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
    ];
    for datagram in lines {
        socket.send_to(datagram.as_bytes(), loopback(statsd_port)).unwrap();
    }

    let query = |promql: &str| scalar(&prometheus, promql);
    wait_until("every series in Prometheus", Duration::from_secs(60), || {
        query("test_timing_count") == Some(6.0)
            && query("container_hits_total").is_some()
            && query("test_distribution_count").is_some()
    });
    // Units: `_sum` in seconds for `|ms`, as sent for `|h` and `|d`; the native histogram too.
    assert!(close(query("test_timing_sum"), 7.2), "{:?}", query("test_timing_sum"));
    assert!(close(query("histogram_sum(test_timing{quantile=\"\"})"), 7.2));
    assert!(close(query("test_timing{quantile=\"0.99\"}"), 1.2), "{:?}", query("test_timing{quantile=\"0.99\"}"));
    assert_eq!(query("test_histogram_sum"), Some(1200.0));
    assert_eq!(query("test_distribution_sum"), Some(0.25));
    assert_eq!(query("test_counter_total"), Some(10.0));

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

    // The 2 s tiles went to their own target, not to the store.
    wait_until("the 2 s tiles in their files", Duration::from_secs(30), || {
        std::fs::read_dir(&files).is_ok_and(|entries| {
            entries.flatten().filter(|entry| entry.path().extension().is_some_and(|ext| ext == "om")).any(|entry| {
                std::fs::read_to_string(entry.path()).is_ok_and(|text| text.contains("dog_hits_total{env=\"prod\"}"))
            })
        })
    });
    drop((collector, aggregator, ingester));
}
