//! A rollup across hosts, through the real binaries (issue 26): three collectors (three
//! hosts) with the same rule folding `user_id` away, two aggregators sharing 16 shards (a
//! static placement), one ingester writing to a real Prometheus.
//!
//! Every host sends a counter and a timer of 10 000 users (`user_id`), each user on one,
//! two or three hosts, tagged with one of three routes (`route`, kept). The collectors
//! fold every series into its route's rolled-up series before sharding, so each
//! rolled-up series has one shard and all three hosts' partials of it meet on one
//! aggregator. Then:
//!
//! - in Prometheus, each route's counter total, timer count, sum, min and max are exactly
//!   what was sent (computed here; the timer in seconds, its sum to the rounding of the
//!   divisions by 1000), and no series carries `user_id`;
//! - the aggregators hold only the rolled-up series (`active_series` summed over both
//!   is 3 routes x 2 metrics, not 10 000 or more): each rolled-up series on one of them;
//! - each collector counts one rollup per series it saw (one line per series and host)
//!   (`rule_partials_total{action="rolled_up"}`), and received every line sent (no
//!   kernel drop: datagrams are paced).
//!
//! Run alone: `cargo nextest run -p tessera-tests --test rollup --no-capture`.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_core::clock::now_secs;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{aggregator_config, collector_config, loopback, scalar, start_daemon, start_ingester, wait_until};

const USERS: usize = 10_000;
const HOSTS: usize = 3;
const ROUTES: [&str; 3] = ["/home", "/search", "/cart"];
const POLICY: &str = "5s:1h";
const RESOLUTION: &str = "5s";
/// The rollup every host is configured with: both metrics lose `user_id`.
const RULES: &str = "[[rules.rollup]]\nmatch = \"rollup.*\"\naggregate_without = [\"user_id\"]\n";
const RULE_LABEL: &str = "rule=\"rollup[0]:rollup.*\"";

/// The hosts that send `user`'s lines: `user % 3`, the next one for every fourth user,
/// all three for every tenth.
fn hosts_of(user: usize) -> Vec<usize> {
    let primary = user % HOSTS;
    if user.is_multiple_of(10) {
        return (0..HOSTS).collect();
    }
    if user.is_multiple_of(4) {
        return vec![primary, (primary + 1) % HOSTS];
    }
    vec![primary]
}

/// `user`'s route (not aligned with its hosts).
fn route_of(user: usize) -> usize {
    (user / 7) % ROUTES.len()
}

/// What `host` adds to `user`'s counter.
fn increment(user: usize, host: usize) -> u64 {
    1 + (user % 5) as u64 + host as u64
}

/// The timer value `host` sends for `user`, milliseconds.
fn latency_ms(user: usize, host: usize) -> u64 {
    ((user * 7 + host * 13) % 500 + 1) as u64
}

/// Per route: what Prometheus must show.
#[derive(Debug, Default, Clone, Copy)]
struct Expected {
    requests: u64,
    latency_count: u64,
    latency_sum: u64,
    latency_min: u64,
    latency_max: u64,
}

/// Every host's lines, and what each route must add up to.
fn workload() -> ([Vec<String>; HOSTS], [Expected; 3]) {
    let mut lines: [Vec<String>; HOSTS] = Default::default();
    let mut expected = [Expected { latency_min: u64::MAX, ..Expected::default() }; 3];
    for user in 0..USERS {
        let route = route_of(user);
        let tags = format!("route:{},user_id:u{user:05}", ROUTES[route]);
        for host in hosts_of(user) {
            let (count, latency) = (increment(user, host), latency_ms(user, host));
            lines[host].push(format!("rollup.requests:{count}|c|#{tags}"));
            lines[host].push(format!("rollup.latency:{latency}|ms|#{tags}"));
            let sums = &mut expected[route];
            sums.requests += count;
            sums.latency_count += 1;
            sums.latency_sum += latency;
            sums.latency_min = sums.latency_min.min(latency);
            sums.latency_max = sums.latency_max.max(latency);
        }
    }
    (lines, expected)
}

/// Sends `lines` in datagrams under 1 400 bytes, in bursts of 20 (28 KB) a little apart,
/// so that the collector's receive buffer never overflows.
fn send_paced(target: SocketAddr, lines: &[String]) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut datagrams = Vec::new();
    let mut current = String::new();
    for line in lines {
        if current.len() + line.len() + 1 > 1400 {
            datagrams.push(std::mem::take(&mut current));
        }
        current.push_str(line);
        current.push('\n');
    }
    datagrams.push(current);
    for burst in datagrams.chunks(20) {
        for datagram in burst {
            socket.send_to(datagram.as_bytes(), target).unwrap();
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// A static placement of 16 shards over `agg-1` and `agg-2`; the `[placement]` section.
fn two_aggregator_placement(dir: &Path, ports: [u16; 2]) -> String {
    let path = dir.join("placement.toml");
    let instances: String = ports
        .iter()
        .enumerate()
        .map(|(index, port)| format!("[[instances]]\nid = \"agg-{}\"\nendpoint = \"127.0.0.1:{port}\"\n", index + 1))
        .collect();
    std::fs::write(&path, format!("num_shards = 16\n{instances}")).unwrap();
    format!("[placement]\nkind = \"static\"\npath = {:?}\n", path.display().to_string())
}

/// The selector of `name` for `route` (the store holds the one resolution: no `resolution` label).
fn selector(name: &str, route: &str) -> String {
    format!("{name}{{route=\"{route}\"}}")
}

/// Each route's (counter total, timer count, sum, min, max) in Prometheus now; `None`
/// where a value is missing.
fn seen(prometheus: &Prometheus) -> Vec<[Option<f64>; 5]> {
    ROUTES
        .iter()
        .map(|route| {
            let latency = selector("rollup_latency", route);
            [
                scalar(prometheus, &selector("rollup_requests_total", route)),
                scalar(prometheus, &format!("histogram_count({latency})")),
                scalar(prometheus, &format!("histogram_sum({latency})")),
                scalar(prometheus, &format!("min_over_time({}[10m])", selector("rollup_latency_min", route))),
                scalar(prometheus, &format!("max_over_time({}[10m])", selector("rollup_latency_max", route))),
            ]
        })
        .collect()
}

/// What `seen` must show per route. The timer's `|ms` values are kept in seconds (each
/// divided by 1000): its sum, min and max too.
fn wanted(expected: &[Expected; 3]) -> Vec<[Option<f64>; 5]> {
    expected
        .iter()
        .map(|sums| {
            let seconds = |ms: u64| ms as f64 / 1000.0;
            [
                sums.requests as f64,
                sums.latency_count as f64,
                seconds(sums.latency_sum),
                seconds(sums.latency_min),
                seconds(sums.latency_max),
            ]
            .map(Some)
        })
        .collect()
}

/// The timer sum is one of values each divided by 1000, added in any order: exact to a
/// relative 1e-12, where everything else is exact.
const SUM_TOLERANCE: f64 = 1e-12;

/// Whether a route's values are what it wants.
fn route_matches(seen: &[Option<f64>; 5], wanted: &[Option<f64>; 5]) -> bool {
    let sum_matches = match (seen[2], wanted[2]) {
        (Some(seen), Some(wanted)) => (seen - wanted).abs() <= wanted.abs() * SUM_TOLERANCE,
        (seen, wanted) => seen == wanted,
    };
    sum_matches && seen[..2] == wanted[..2] && seen[3..] == wanted[3..]
}

fn active_series(aggregators: &[Daemon]) -> Vec<f64> {
    aggregators
        .iter()
        .map(|aggregator| aggregator.metric("tessera_aggregator_active_series", &format!("policy=\"{POLICY}\"")))
        .collect()
}

fn tile_closes(aggregators: &[Daemon]) -> Vec<f64> {
    aggregators.iter().map(|aggregator| aggregator.metric("tessera_aggregator_tile_closes_total", "")).collect()
}

#[test]
fn three_hosts_roll_up_ten_thousand_users_exactly_on_one_aggregator_per_series() {
    let prometheus = Prometheus::start();
    let dir = tempfile::tempdir().unwrap();
    // The store takes the one resolution of the aggregators' policy: no `resolution` label.
    let sink_policies = format!("sink_policies = [\"{RESOLUTION}\"]\n");
    let (_ingester, ingester_port) = start_ingester(dir.path(), &prometheus, &sink_policies);

    let aggregator_ports = [free_port(), free_port()];
    let placement = two_aggregator_placement(dir.path(), aggregator_ports);
    // One merge thread, so that `tile_closes_total` counts each tile once.
    let settings = format!("policies = [\"{POLICY}\"]\nbuffer_past_ms = 1000\nmerge_threads = 1\n");
    let aggregators: Vec<Daemon> = aggregator_ports
        .iter()
        .enumerate()
        .map(|(index, port)| {
            let id = format!("agg-{}", index + 1);
            let config = aggregator_config(&id, *port, &settings, &placement, ingester_port, "");
            start_daemon(&id, "tessera-aggregator", &config, free_port())
        })
        .collect();

    let statsd_ports: Vec<u16> = (0..HOSTS).map(|_| free_port()).collect();
    let collectors: Vec<Daemon> = statsd_ports
        .iter()
        .enumerate()
        .map(|(host, port)| {
            let id = format!("host-{}", host + 1);
            let config = format!("{}{RULES}", collector_config(&id, *port, &placement, ""));
            start_daemon(&id, "tessera-collector", &config, free_port())
        })
        .collect();

    let (lines, expected) = workload();
    std::thread::scope(|scope| {
        for (host, port) in statsd_ports.iter().enumerate() {
            let lines = &lines[host];
            scope.spawn(move || send_paced(loopback(*port), lines));
        }
    });
    for (host, collector) in collectors.iter().enumerate() {
        let sent = lines[host].len() as f64;
        wait_until(&format!("{} to receive its {sent} lines", collector.name), Duration::from_secs(20), || {
            collector.metric("tessera_collector_lines_received_total", "") == sent
        });
        assert_eq!(collector.metric("tessera_collector_kernel_drops_total", ""), 0.0, "{}", collector.name);
        assert_eq!(collector.metric("tessera_collector_parse_errors_total", ""), 0.0, "{}", collector.name);
    }

    // (a) Prometheus: each route's values exactly as sent, once all have arrived.
    let wanted = wanted(&expected);
    // Totals, counts and sums only grow as tiles arrive, the max too; the min only falls.
    let complete = |seen: &[[Option<f64>; 5]]| {
        seen.iter().zip(&wanted).all(|(seen, wanted)| {
            let min_reached = seen[3].is_some_and(|min| Some(min) <= wanted[3]);
            let sum_reached = seen[2].is_some_and(|sum| wanted[2].is_some_and(|w| sum >= w - w * SUM_TOLERANCE));
            seen[..2].iter().zip(&wanted[..2]).all(|(seen, wanted)| seen >= wanted)
                && sum_reached
                && min_reached
                && seen[4] >= wanted[4]
        })
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let last = loop {
        let last = seen(&prometheus);
        if complete(&last) || Instant::now() > deadline {
            break last;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        last.iter().zip(&wanted).all(|(seen, wanted)| route_matches(seen, wanted)),
        "per route: counter total, timer count, sum, min, max\n  seen: {last:?}\nwanted: {wanted:?}\n\
         series with a user_id label: {:?}",
        scalar(&prometheus, "count({user_id!=\"\"})")
    );
    let user_series = prometheus.query("{user_id!=\"\"}", now_secs());
    assert_eq!(user_series, serde_json::json!([]), "series with a user_id label reached Prometheus");
    let series = prometheus.query("{__name__=~\"rollup_.+\"}", now_secs());
    let names: BTreeSet<(String, String)> = series
        .as_array()
        .unwrap()
        .iter()
        .map(|series| {
            let metric = &series["metric"];
            let labels: BTreeSet<&str> = metric.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(labels, BTreeSet::from(["__name__", "route"]), "{series}");
            (metric["__name__"].as_str().unwrap().to_owned(), metric["route"].as_str().unwrap().to_owned())
        })
        .collect();
    let names_wanted: BTreeSet<(String, String)> =
        ["rollup_requests_total", "rollup_latency", "rollup_latency_min", "rollup_latency_max"]
            .iter()
            .flat_map(|name| ROUTES.iter().map(move |route| ((*name).to_owned(), (*route).to_owned())))
            .collect();
    assert_eq!(names, names_wanted, "the rolled-up series, one per metric and route");
    assert_eq!(series.as_array().unwrap().len(), names_wanted.len(), "one resolution each: {series}");

    // (b) The aggregators: the tiles holding the data have closed (they are in Prometheus),
    // and each set `active_series` when it closed. Only the rolled-up series are held, each
    // on one aggregator: the sum is 3 routes x 2 metrics.
    let held = active_series(&aggregators);
    println!("active series per aggregator: {held:?}");
    assert_eq!(held.iter().sum::<f64>(), (ROUTES.len() * 2) as f64, "series held by agg-1 and agg-2");
    assert!(held.iter().all(|series| *series > 0.0), "the rolled-up series spread over both aggregators: {held:?}");
    let partials: Vec<f64> = aggregators
        .iter()
        .map(|aggregator| aggregator.metric("tessera_aggregator_partials_received_total", ""))
        .collect();
    println!("partials received per aggregator: {partials:?}");
    assert!(partials.iter().all(|received| *received > 0.0), "each aggregator got its series' partials: {partials:?}");

    // (c) Each collector rolled up every series it saw: one partial per series, since each
    // series has one line per host (in one window of one reader).
    for (host, collector) in collectors.iter().enumerate() {
        let original_series = 2 * (0..USERS).filter(|user| hosts_of(*user).contains(&host)).count();
        let labels = format!("{RULE_LABEL},action=\"rolled_up\"");
        let mut rolled_up = 0.0;
        wait_until(&format!("{} to count its rollups", collector.name), Duration::from_secs(10), || {
            rolled_up = collector.metric("tessera_collector_rule_partials_total", &labels);
            rolled_up >= original_series as f64
        });
        assert_eq!(rolled_up, original_series as f64, "{}: partials rolled up", collector.name);
        assert_eq!(collector.metric("tessera_collector_drops_total", ""), 0.0, "{}", collector.name);
    }

    // Nothing arrives later: two more tiles close on each aggregator, and the values
    // have not moved.
    let closes = tile_closes(&aggregators);
    wait_until("two more tiles closed on each aggregator", Duration::from_secs(20), || {
        tile_closes(&aggregators).iter().zip(&closes).all(|(now, before)| *now >= before + 2.0)
    });
    assert_eq!(seen(&prometheus), last, "after two more tiles, the values read above");
    assert_eq!(active_series(&aggregators).iter().sum::<f64>(), (ROUTES.len() * 2) as f64);
}
