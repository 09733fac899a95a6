//! Timers as Prometheus native histograms, end to end on the real binaries: collectors (one
//! per host) → aggregator (1 s tiles) → ingester (remote write, `histograms = "native"`) → a
//! real Prometheus with `--enable-feature=native-histograms`. What an SRE asks of it:
//!
//! - **across hosts**: `histogram_quantile(q, sum(rate(x[1m])))` over three hosts' overlapping
//!   distributions is within a bucket's width of the exact quantile of their union, and
//!   `histogram_count` / `histogram_sum` are exact;
//! - **bucket limit**: ten decades of values with a small `max_buckets` stay under the limit,
//!   at a lower schema, and within that schema's (wider) bound;
//! - **restart**: the ingester restarts between tiles, with SIGTERM and then with SIGKILL;
//!   each time the histogram goes on from where it was (its checkpoint, and the queued
//!   records after it): the count never falls, `resets()` finds none, and rates across the
//!   restarts are those of every observation, once.
//!
//! Each series' first sample is a primer (one observation before the data): Prometheus' `rate`
//! is the difference between the first and the last sample in the window, so the primer is what
//! the data is measured from.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use tessera_core::clock::now_secs;

use tessera_core::sketch::bucket_relative_width;
use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    FAST_RECONNECT, ONE_SECOND_SINK, ONE_SECOND_TILES, collector_config, ingester_config, loopback, start_daemon,
    start_lone_aggregator, wait_until,
};

struct Stack {
    prometheus: Prometheus,
    ingester: Daemon,
    ingester_config: String,
    ingester_telemetry: u16,
    _aggregator: Daemon,
    /// (collector, its statsd address), one per host.
    collectors: Vec<(Daemon, SocketAddr)>,
    socket: UdpSocket,
    _dir: tempfile::TempDir,
}

impl Stack {
    fn start(hosts: usize, max_buckets: usize) -> Stack {
        let prometheus = Prometheus::start();
        let dir = tempfile::tempdir().unwrap();
        let (ingester_port, aggregator_port) = (free_port(), free_port());
        let ingester_telemetry = free_port();
        let ingester_text = ingester_config(
            ingester_port,
            &dir.path().join("ingester"),
            &prometheus.remote_write_url(),
            ONE_SECOND_SINK,
            &format!("histograms = \"native\"\nmax_buckets = {max_buckets}\n"),
        );
        let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, ingester_telemetry);
        let (aggregator, placement) =
            start_lone_aggregator(dir.path(), aggregator_port, ONE_SECOND_TILES, ingester_port, FAST_RECONNECT);
        let collectors = (1..=hosts)
            .map(|host| {
                let statsd_port = free_port();
                let config = collector_config(&format!("host-{host}"), statsd_port, &placement, "");
                let collector = start_daemon(&format!("collector-{host}"), "tessera-collector", &config, free_port());
                (collector, loopback(statsd_port))
            })
            .collect();
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        Stack {
            prometheus,
            ingester,
            ingester_config: ingester_text,
            ingester_telemetry,
            _aggregator: aggregator,
            collectors,
            socket,
            _dir: dir,
        }
    }

    /// Sends `name:value|ms|#host:h<host>` for every value to host `host`'s collector (from 1).
    fn send(&self, host: usize, name: &str, values: &[f64]) {
        let statsd = self.collectors[host - 1].1;
        let mut datagram = String::new();
        for value in values {
            datagram.push_str(&format!("{name}:{value}|ms|#host:h{host}\n"));
            if datagram.len() > 1_300 {
                self.socket.send_to(datagram.as_bytes(), statsd).unwrap();
                datagram.clear();
            }
        }
        if !datagram.is_empty() {
            self.socket.send_to(datagram.as_bytes(), statsd).unwrap();
        }
    }

    /// The single value of an instant query now, if there is exactly one series.
    fn scalar(&self, promql: &str) -> Option<f64> {
        tessera_tests::scalar(&self.prometheus, promql)
    }

    /// Waits until `promql` answers `expected`, then returns the time it did (unix seconds).
    fn wait_for(&self, promql: &str, expected: f64) -> f64 {
        let mut last = None;
        wait_until(&format!("{promql} == {expected}"), Duration::from_secs(40), || {
            last = self.scalar(promql);
            last == Some(expected)
        });
        now_secs()
    }

    /// Asserts that `histogram_quantile(q, over)` is within `width` (relative) of the exact
    /// quantile of `sorted`, for each of `quantiles`.
    fn assert_quantiles(&self, over: &str, sorted: &[f64], quantiles: &[f64], width: f64) {
        for q in quantiles {
            let query = format!("histogram_quantile({q}, {over})");
            let got = self.scalar(&query).unwrap_or_else(|| panic!("{query}: no answer"));
            assert_within(&query, got, exact_quantile(sorted, *q), width);
        }
    }

    /// Asserts that `histogram_sum(over) / histogram_count(over)` is `exact` (to rounding).
    fn assert_mean(&self, over: &str, exact: f64) {
        let mean = self.scalar(&format!("histogram_sum({over}) / histogram_count({over})"));
        assert!(mean.is_some_and(|mean| (mean - exact).abs() <= exact * 1e-9), "{mean:?} vs {exact}");
    }

    /// Restarts the ingester after a SIGTERM (`graceful`) or a SIGKILL.
    fn restart_ingester(&mut self, graceful: bool) {
        if graceful {
            assert_eq!(self.ingester.terminate(), Some(0), "ingester exits cleanly:\n{}", self.ingester.log());
        } else {
            self.ingester.kill();
        }
        self.ingester = start_daemon("ingester", "tessera-ingester", &self.ingester_config, self.ingester_telemetry);
    }
}

/// What the collector keeps of `|ms` values: each divided by 1000 (`timer_unit = "seconds"`,
/// the default), as it divides them.
fn seconds(milliseconds: &[f64]) -> Vec<f64> {
    milliseconds.iter().map(|ms| ms / 1000.0).collect()
}

/// The value Prometheus' `histogram_quantile(q, ...)` ranks to: the ceil(q × n)-th smallest.
fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank - 1]
}

fn assert_within(what: &str, got: f64, exact: f64, width: f64) {
    let error = (got - exact).abs() / exact;
    assert!(error <= width + 1e-9, "{what} = {got}, exact {exact}: relative error {error:.5} > {width:.5}");
    eprintln!("{what} = {got:.4}, exact {exact}, relative error {error:.5} (bound {width:.5})");
}

/// The buckets of the one native histogram an instant query returns: (lower, upper, count).
fn native_buckets(result: &serde_json::Value) -> Vec<(f64, f64, f64)> {
    let series = result.as_array().expect("a result array");
    assert_eq!(series.len(), 1, "one series: {result}");
    let number = |value: &serde_json::Value| value.as_str().unwrap().parse::<f64>().unwrap();
    series[0]["histogram"][1]["buckets"]
        .as_array()
        .unwrap_or_else(|| panic!("a native histogram: {result}"))
        .iter()
        .map(|bucket| (number(&bucket[1]), number(&bucket[2]), number(&bucket[3])))
        .collect()
}

#[test]
fn a_fleet_wide_quantile_of_three_hosts_is_within_a_bucket_of_the_exact_one() {
    let stack = Stack::start(3, 160);
    let x = "svc_latency";
    for host in 1..=3 {
        stack.send(host, "svc.latency", &[1.0]);
    }
    stack.wait_for(&format!("histogram_count(sum({x}))"), 3.0);

    // Overlapping distributions of integer milliseconds: 10..109, 50..249 and a long tail from
    // 5 to about 4 000, kept in seconds.
    let hosts: [Vec<f64>; 3] = [
        (0..2_000).map(|i| f64::from(10 + i / 20)).collect(),
        (0..2_000).map(|i| f64::from(50 + i / 10)).collect(),
        (0..2_000).map(|i| (5.0 * 1.0034f64.powi(i)).round()).collect(),
    ];
    for (host, values) in hosts.iter().enumerate() {
        stack.send(host + 1, "svc.latency", values);
    }
    let mut union = seconds(&hosts.concat());
    union.sort_by(f64::total_cmp);
    let primers = 3.0 * 0.001;
    let sum: f64 = union.iter().sum::<f64>() + primers;
    stack.wait_for(&format!("histogram_count(sum({x}))"), 6_003.0);
    // Exact but for the rounding of the divisions by 1000, which sums in any order keep tiny.
    let stored = stack.scalar(&format!("histogram_sum(sum({x}))")).expect("histogram_sum");
    assert!((stored - sum).abs() <= sum * 1e-12, "the sum is exact: {stored} vs {sum}");
    for host in 1..=3 {
        let one = format!(r#"histogram_count(svc_latency{{host="h{host}"}})"#);
        assert_eq!(stack.scalar(&one), Some(2_001.0), "{one}");
    }

    // The rate over the last minute is every observation since the primers: its quantiles are
    // the union's, within a bucket's relative width (Prometheus interpolates inside the bucket
    // the rank falls in).
    let rate = format!("sum(rate({x}[1m]))");
    stack.assert_quantiles(&rate, &union, &[0.5, 0.9, 0.99], bucket_relative_width(5));
    // The mean from the rates is the exact mean.
    stack.assert_mean(&rate, (sum - primers) / 6_000.0);
}

#[test]
fn ten_decades_under_a_small_bucket_limit_lower_the_schema_and_stay_within_its_bound() {
    let max_buckets = 20;
    let stack = Stack::start(1, max_buckets);
    let x = "wide_latency";
    // 200 values from 0.001 ms to 10^7 ms, 20 a decade; kept in seconds.
    let sent: Vec<f64> = (0..200)
        .map(|k| format!("{:.6e}", 10f64.powf(f64::from(k) / 20.0 - 3.0)))
        .map(|text| text.parse().unwrap())
        .collect();
    stack.send(1, "wide.latency", &sent);
    let mut values = seconds(&sent);
    stack.wait_for(&format!("histogram_count({x})"), 200.0);

    let buckets = native_buckets(&stack.prometheus.query(x, now_secs()));
    assert!(buckets.len() <= max_buckets, "{} buckets: {buckets:?}", buckets.len());
    assert_eq!(buckets.iter().map(|bucket| bucket.2).sum::<f64>(), 200.0);
    // Bucket bounds grow by base = 2^(2^-schema): read the schema back from them.
    let (lower, upper, _) = buckets[buckets.len() / 2];
    let schema = -(upper / lower).log2().log2().round() as i32;
    assert!(schema < 5, "the schema was lowered from 5, to {schema}");
    let finer = bucket_relative_width(schema + 1);
    let mut sketch = tessera_core::sketch::Sketch::with_schema(schema + 1);
    values.iter().for_each(|value| sketch.insert(*value, 1.0));
    assert!(sketch.bucket_count() > max_buckets, "no lower than needed: schema {} would not fit", schema + 1);

    values.sort_by(f64::total_cmp);
    let width = bucket_relative_width(schema);
    eprintln!("schema {schema}: {} buckets, bound {width:.4} (one finer: {finer:.4})", buckets.len());
    stack.assert_quantiles(x, &values, &[0.5, 0.9, 0.99], width);
}

#[test]
fn rates_across_an_ingester_restart_count_every_observation_once() {
    let mut stack = Stack::start(1, 160);
    let x = "restart_latency";
    stack.send(1, "restart.latency", &[1.0]);
    stack.wait_for(&format!("histogram_count({x})"), 1.0);
    // Before the restart: 1 000 observations from 100 ms to 199 ms (kept in seconds).
    let before: Vec<f64> = (0..1_000).map(|i| f64::from(100 + i % 100)).collect();
    stack.send(1, "restart.latency", &before);
    stack.wait_for(&format!("histogram_count({x})"), 1_001.0);

    stack.restart_ingester(true);
    // After a SIGTERM the histogram goes on: 300 observations from 1 000 ms to 1 299 ms.
    let after: Vec<f64> = (0..300).map(|i| f64::from(1_000 + i)).collect();
    stack.send(1, "restart.latency", &after);
    stack.wait_for(&format!("histogram_count({x})"), 1_301.0);
    assert_eq!(
        stack.ingester.metric("tessera_ingester_checkpoint_restored_series", r#"target="default""#),
        1.0,
        "the histogram's count total, from the checkpoint written at shutdown"
    );

    stack.restart_ingester(false);
    // After a SIGKILL too: 200 observations from 2 000 ms to 2 199 ms.
    let last: Vec<f64> = (0..200).map(|i| f64::from(2_000 + i)).collect();
    stack.send(1, "restart.latency", &last);
    stack.wait_for(&format!("histogram_count({x})"), 1_501.0);

    // The count never fell (Prometheus 2.42's `resets()` takes floats: the count is one),
    // and the rate over the minute counts every observation once.
    assert_eq!(stack.scalar(&format!("resets(histogram_count({x})[2m:200ms])")), Some(0.0));
    let mut all = seconds(&[before, after, last].concat());
    all.sort_by(f64::total_cmp);
    let rate = format!("rate({x}[1m])");
    stack.assert_quantiles(&rate, &all, &[0.5, 0.75, 0.9], bucket_relative_width(5));
    stack.assert_mean(&rate, all.iter().sum::<f64>() / all.len() as f64);
}
