//! End to end, no containers: a real etcd, a real Prometheus, and the three
//! real binaries as separate processes (one collector, two aggregators,
//! one ingester). A known mix of statsd goes in over UDP; every value is
//! read back from Prometheus.

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_core::clock::now_secs;

use tessera_testkit::daemons::{Daemon, binary};
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{aggregator_config, ingester_config, loopback, scalar, start_daemon};
use tessera_topology::testing::EtcdServer;

/// Polls `check` until it returns `Some`, or fails with `what` after `timeout`.
fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Stack {
    prometheus: Prometheus,
    _etcd: EtcdServer,
    ingester: Daemon,
    aggregators: Vec<Daemon>,
    collector: Daemon,
    statsd: SocketAddr,
}

fn start_stack() -> Stack {
    let etcd = EtcdServer::start().expect("etcd starts");
    let dir = tempfile::tempdir().unwrap();
    let telemetry_ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let scrape_targets: Vec<String> = telemetry_ports.iter().map(|port| format!("'127.0.0.1:{port}'")).collect();
    let prometheus = Prometheus::start_with_config(&format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tessera\n    static_configs:\n      - targets: [{}]\n",
        scrape_targets.join(", ")
    ));

    let ingester_port = free_port();
    let ingester_text =
        ingester_config(ingester_port, &dir.path().join("ingester"), &prometheus.remote_write_url(), "", "");
    let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, telemetry_ports[0]);

    let aggregator_ports = [free_port(), free_port()];
    let status = Command::new(binary("tessera"))
        .args(["placement", "--etcd", &etcd.endpoint(), "--environment", "e2e", "init", "--shards", "16"])
        .args(["--instance", &format!("agg-1=127.0.0.1:{}", aggregator_ports[0])])
        .args(["--instance", &format!("agg-2=127.0.0.1:{}", aggregator_ports[1])])
        .status()
        .unwrap();
    assert!(status.success(), "tessera placement init failed");
    let placement = |name: &str| {
        format!(
            "[placement]\nkind = \"etcd\"\nendpoints = [\"{}\"]\nenv = \"e2e\"\ncache_path = {:?}\n",
            etcd.endpoint(),
            dir.path().join(format!("{name}.placement")).display().to_string()
        )
    };
    let aggregators = (0..2)
        .map(|i| {
            let name = format!("agg-{}", i + 1);
            let settings = "policies = [\"10s:2d\"]\nbuffer_past_ms = 1000\n";
            let config = aggregator_config(&name, aggregator_ports[i], settings, &placement(&name), ingester_port, "");
            start_daemon(&name, "tessera-aggregator", &config, telemetry_ports[1 + i])
        })
        .collect();

    let statsd_port = free_port();
    let collector_text = format!(
        "instance_id = \"host-1\"\n[udp]\nlisten = \"127.0.0.1:{statsd_port}\"\nreader_threads = 2\n{}\
         [forward]\nreconnect_min_ms = 50\nreconnect_max_ms = 500\n",
        placement("collector")
    );
    let collector = start_daemon("collector", "tessera-collector", &collector_text, telemetry_ports[3]);
    // Keep the directory (configs, queue, caches) for the daemons' lifetime.
    std::mem::forget(dir);
    Stack { prometheus, _etcd: etcd, ingester, aggregators, collector, statsd: loopback(statsd_port) }
}

/// Sleeps until `offset` seconds past the next 10 s boundary, so that a
/// burst of lines lands in one tile.
fn align_to_tile(offset: f64) {
    let now = now_secs();
    let next = (now / 10.0).floor() * 10.0 + 10.0 + offset;
    std::thread::sleep(Duration::from_secs_f64(next - now));
}

#[test]
fn a_known_mix_arrives_in_prometheus_exactly_and_dashboards_evaluate() {
    let mut stack = start_stack();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = |text: &str| {
        socket.send_to(text.as_bytes(), stack.statsd).unwrap();
    };

    // One 10 s tile's worth of a known mix.
    align_to_tile(1.0);
    let series = 40;
    for round in 0..25 {
        let mut datagram = String::new();
        for i in 0..series {
            datagram.push_str(&format!("e2e.requests:1|c|@0.5|#route:/r{i},env:test\n"));
        }
        datagram.push_str(&format!("e2e.queue_depth:{round}|g|#queue:mail\n"));
        datagram.push_str(&format!("e2e.latency:{}|ms|#route:/all\n", 10 * (round + 1)));
        datagram.push_str(&format!("e2e.users:user-{}|s\n", round % 9));
        send(&datagram);
    }
    std::thread::sleep(Duration::from_millis(50));
    send("e2e.queue_depth:99|g|#queue:mail");
    // A timer for the application-timers dashboard, sent again in a later tile below (a
    // rate needs two samples).
    let app_timer = |host: &str| format!("e2e.app.latency:12|ms|#host:{host}\ne2e.app.latency:48|ms|#host:{host}");
    send(&app_timer("a"));
    let app_timer_sent = Instant::now();

    // Counters: every route's cumulative total is exactly 25 lines / 0.5.
    for i in [0, 7, 39] {
        let query = format!("e2e_requests_total{{route=\"/r{i}\",env=\"test\"}}");
        let value = eventually(&query, Duration::from_secs(40), || scalar(&stack.prometheus, &query));
        assert_eq!(value, 50.0, "{query}");
    }
    let routes = eventually("all 40 routes", Duration::from_secs(10), || {
        scalar(&stack.prometheus, "count(e2e_requests_total)").filter(|count| *count == 40.0)
    });
    assert_eq!(routes, 40.0);
    let gauge = scalar(&stack.prometheus, "e2e_queue_depth{queue=\"mail\"}");
    assert_eq!(gauge, Some(99.0));
    assert_eq!(scalar(&stack.prometheus, "e2e_users"), Some(9.0));
    // The timer is a native histogram (the remote-write default): exact count and sum,
    // quantiles in the bucket of the exact value. `|ms` values are kept in seconds: 10 ms to
    // 250 ms are 0.01 s to 0.25 s, their sum 3.25 s (rounded by the divisions).
    let latency = "e2e_latency{route=\"/all\"}";
    assert_eq!(scalar(&stack.prometheus, &format!("histogram_count({latency})")), Some(25.0));
    let sum = scalar(&stack.prometheus, &format!("histogram_sum({latency})")).expect("histogram_sum");
    assert!((sum - 3.25).abs() <= 3.25 * 1e-12, "histogram_sum {sum}, exact 3.25");
    assert_eq!(scalar(&stack.prometheus, "e2e_latency_min{route=\"/all\"}"), Some(0.01));
    assert_eq!(scalar(&stack.prometheus, "e2e_latency_max{route=\"/all\"}"), Some(0.25));
    // Prometheus ranks at q x count and interpolates inside that bucket: within a bucket's
    // relative width of the value at rank ceil(q x 25) of 0.01, 0.02, ... 0.25.
    let width = tessera_core::sketch::bucket_relative_width(tessera_core::sketch::DEFAULT_SCHEMA) + 1e-9;
    for q in [0.5, 0.9, 0.99] {
        let exact = 10.0 * (q * 25.0_f64).ceil() / 1000.0;
        let query = format!("histogram_quantile({q}, {latency})");
        let value = scalar(&stack.prometheus, &query).unwrap_or_else(|| panic!("{query} missing"));
        assert!((value - exact).abs() <= exact * width, "{query} = {value}, exact {exact}, relative width {width}");
    }

    // The end-to-end latency histogram is exported and plausible.
    let (count, sum) = eventually("end-to-end latency scraped", Duration::from_secs(20), || {
        let count = scalar(&stack.prometheus, "sum(tessera_ingester_end_to_end_latency_seconds_count)")?;
        let sum = scalar(&stack.prometheus, "sum(tessera_ingester_end_to_end_latency_seconds_sum)")?;
        (count > 0.0).then_some((count, sum))
    });
    let mean = sum / count;
    assert!(mean > 0.0 && mean < 30.0, "mean end-to-end latency {mean} s is implausible");

    // Every expression of every shipped dashboard evaluates to something.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(app_timer_sent.elapsed()));
    send(&app_timer("a"));
    send(&app_timer("b"));
    check_dashboards(&stack.prometheus, "e2e_app_latency");

    // `tessera loadgen --verify` measures the deployment's loss from the sink.
    let output = Command::new(binary("tessera"))
        .args(["loadgen", "--target", &stack.statsd.to_string(), "--total-lines", "6000", "--series", "60"])
        .args(["--mix", "counter=100", "--sample-rate", "0.5", "--rate-lines-per-sec", "20000"])
        .args(["--verify", &format!("prometheus=http://{}", stack.prometheus.address), "--verify-timeout-secs", "60"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "loadgen --verify failed:\n{report}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("verify: expected counter increase 12000, seen 12000, lost 0"), "{report}");

    // Kill one aggregator: its shards' partials queue at the collector, are
    // counted as drops once the queue is full or at shutdown; the other
    // aggregator's shards keep flowing.
    stack.aggregators[1].kill();
    align_to_tile(1.0);
    for _ in 0..10 {
        let datagram: String = (0..series).map(|i| format!("e2e.after_kill:1|c|#route:/r{i}\n")).collect();
        send(&datagram);
    }
    // The ingester writes a tile's series in several requests at once: the count is read
    // once it has stopped moving (the same in two reads a second apart), not at its first value.
    let mut last_count = 0.0;
    let survivors = eventually("the surviving aggregator's series", Duration::from_secs(40), || {
        std::thread::sleep(Duration::from_millis(800));
        let count = scalar(&stack.prometheus, "count(e2e_after_kill_total)")?;
        let settled = count > 0.0 && count == last_count;
        last_count = count;
        settled.then_some(count)
    });
    assert!(survivors < 40.0, "some routes belong to the dead aggregator's shards");
    eventually("connect errors to the dead aggregator", Duration::from_secs(20), || {
        (stack.collector.metric("tessera_collector_connect_errors_total", "destination=\"agg-2\"") > 0.0).then_some(())
    });
    let dropped_while_running = stack.collector.metric("tessera_collector_drops_total", "unit=\"partials\"");
    assert_eq!(stack.collector.terminate(), Some(0), "the collector drains and exits 0");
    let lost_partials = dropped_while_running + stack.abandoned_at_shutdown();
    assert_eq!(survivors + lost_partials, 40.0, "every partial is delivered or counted as dropped");
    assert_eq!(stack.aggregators[0].terminate(), Some(0));
    assert_eq!(stack.ingester.terminate(), Some(0));
}

impl Stack {
    /// Partials the collector gave up on when its shutdown grace ran out
    /// (it has exited, so the count comes from its log).
    fn abandoned_at_shutdown(&self) -> f64 {
        let log = self.collector.log();
        log.lines()
            .filter(|line| line.contains("undelivered"))
            .filter_map(|line| line.split("partials=").nth(1)?.split_whitespace().next()?.parse::<f64>().ok())
            .sum()
    }
}

/// Evaluates every expression of every shipped dashboard, with its template variables at
/// their defaults (the application-timers dashboard's `timer` set to `timer`).
fn check_dashboards(prometheus: &Prometheus, timer: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/dashboards");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    let mut expressions = Vec::new();
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut found = Vec::new();
        collect_expressions(&json["panels"], &mut found);
        let variables = json["templating"]["list"].as_array().cloned().unwrap_or_default();
        for mut expr in found {
            for variable in &variables {
                let name = variable["name"].as_str().unwrap();
                let value = if name == "timer" { timer } else { variable["current"]["value"].as_str().unwrap() };
                expr = expr.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
            }
            expressions.push(expr);
        }
    }
    assert!(!expressions.is_empty(), "no dashboard expressions found in {}", dir.display());
    for expr in expressions {
        assert!(!expr.contains("vector(0)"), "a fallback would hide a missing metric: {expr}");
        let expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("[$__range]", "[5m]");
        let result = eventually(&format!("dashboard expression `{expr}`"), Duration::from_secs(30), || {
            let result = prometheus.query(&expr, now_secs());
            result.as_array().filter(|series| !series.is_empty()).cloned()
        });
        assert!(!result.is_empty());
    }
}

fn collect_expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                out.push(expr.clone());
            }
            map.values().for_each(|child| collect_expressions(child, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|child| collect_expressions(child, out)),
        _ => {}
    }
}
