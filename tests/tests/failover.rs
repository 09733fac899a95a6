//! Aggregator failover through the whole real pipeline: a real etcd, a
//! real collector, two real aggregators as the replicas of one shard set
//! (64 shards, replication factor 2), the real ingester writing to a real
//! Prometheus. The leader is killed (SIGKILL) mid-tile while counters flow;
//! every counter's cumulative total in Prometheus must be exactly what was
//! sent, at both resolutions, with no tile the ingester had to refuse as a
//! conflict (a second copy with another value).
//!
//! It also prints what `BENCHMARKS.md` records of a failover: the takeover
//! time, the end-to-end latency (ingester write minus tile end) of the tiles
//! written after the kill, next to those written before it, and the rate of
//! flush-mark writes to etcd.
//!
//! Run alone: `cargo nextest run -p tessera-tests --test failover --no-capture`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_core::clock::now_ms;

use tessera_testkit::daemons::{Daemon, binary};
use tessera_testkit::prometheus::Prometheus;
use tessera_testkit::{free_port, http_get};
use tessera_tests::{aggregator_config, collector_config, loopback, scalar, start_daemon, start_ingester, wait_until};
use tessera_topology::testing::EtcdServer;

const SERIES: usize = 10;
const RESOLUTIONS: [&str; 2] = ["1s", "10s"];
const TTL_SECS: u64 = 2;

/// Sends one increment of every counter each 20 ms for `duration`; returns the rounds sent.
fn send_for(socket: &UdpSocket, target: SocketAddr, duration: Duration) -> u64 {
    let datagram: String = (0..SERIES).map(|series| format!("failover.hits:1|c|#series:s{series}\n")).collect();
    let deadline = Instant::now() + duration;
    let mut rounds = 0;
    while Instant::now() < deadline {
        socket.send_to(datagram.as_bytes(), target).unwrap();
        rounds += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    rounds
}

/// The ingester's end-to-end latency histogram for one resolution: upper
/// bound (seconds) to cumulative count.
fn latency_buckets(ingester: &Daemon, resolution: &str) -> BTreeMap<u64, f64> {
    let (_, text) = http_get(ingester.telemetry, "/metrics").expect("scrape the ingester");
    let wanted = format!("resolution=\"{resolution}\"");
    text.lines()
        .filter(|line| {
            line.starts_with("tessera_ingester_end_to_end_latency_seconds_bucket{") && line.contains(&wanted)
        })
        .filter_map(|line| {
            let le = line.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            let count = line.rsplit_once(' ')?.1.parse().ok()?;
            // Keyed by milliseconds so the map orders the bounds.
            Some(((bound * 1_000.0).min(u64::MAX as f64) as u64, count))
        })
        .collect()
}

/// The bucket bound (seconds) below which `quantile` of the tiles counted
/// between two snapshots fall, and how many tiles that is.
fn quantile_between(before: &BTreeMap<u64, f64>, after: &BTreeMap<u64, f64>, quantile: f64) -> (f64, f64) {
    let total = after.values().last().copied().unwrap_or(0.0) - before.values().last().copied().unwrap_or(0.0);
    let bound = after
        .iter()
        .find(|(le, count)| **count - before.get(le).copied().unwrap_or(0.0) >= quantile * total)
        .map_or(f64::INFINITY, |(le, _)| *le as f64 / 1_000.0);
    (bound, total)
}

#[test]
fn a_killed_leader_costs_no_tile_through_the_real_ingester() {
    let etcd = EtcdServer::start().expect("etcd starts");
    let prometheus = Prometheus::start();
    let dir = tempfile::tempdir().unwrap();
    // Both resolutions in the one store: the `resolution` label keeps them apart.
    let (ingester, ingester_port) = start_ingester(dir.path(), &prometheus, "sink_policies = [\"1s\", \"10s\"]\n");

    let ports = [free_port(), free_port()];
    let status = Command::new(binary("tessera"))
        .args(["placement", "--etcd", &etcd.endpoint(), "--environment", "failover", "init", "--shards", "64"])
        .args(["--replication-factor", "2"])
        .args(["--instance", &format!("agg-1=127.0.0.1:{}", ports[0])])
        .args(["--instance", &format!("agg-2=127.0.0.1:{}", ports[1])])
        .status()
        .unwrap();
    assert!(status.success(), "tessera placement init failed");
    let placement = format!(
        "[placement]\nkind = \"etcd\"\nendpoints = [\"{}\"]\nenv = \"failover\"\nrequest_timeout_ms = 1000\n",
        etcd.endpoint()
    );
    let mut aggregators: Vec<Daemon> = ["agg-1", "agg-2"]
        .iter()
        .zip(ports)
        .map(|(id, port)| {
            let settings = format!(
                "policies = [\"1s:1h\", \"10s:1h\"]\nbuffer_past_ms = 500\nmax_buffer_past_ms = 3000\n\
                 liveness_ttl_secs = {TTL_SECS}\n"
            );
            let config = aggregator_config(id, port, &settings, &placement, ingester_port, "");
            start_daemon(id, "tessera-aggregator", &config, free_port())
        })
        .collect();
    let statsd = free_port();
    let collector_text = collector_config("host-1", statsd, &placement, "");
    let _collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());
    let leads = |daemon: &Daemon| daemon.metric("tessera_aggregator_leader", "") == 1.0;
    wait_until("one leader", Duration::from_secs(15), || aggregators.iter().filter(|a| leads(a)).count() == 1);
    let leader = aggregators.iter().position(leads).unwrap();
    let follower = 1 - leader;

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let statsd = loopback(statsd);
    let started = Instant::now();
    let mut sent = send_for(&socket, statsd, Duration::from_secs(4));
    // Mid-second, so that the kill falls inside open tiles of both policies.
    std::thread::sleep(Duration::from_millis(((1_500 - now_ms().rem_euclid(1_000)) % 1_000) as u64));
    let before: Vec<_> = RESOLUTIONS.iter().map(|resolution| latency_buckets(&ingester, resolution)).collect();
    let marks_before = aggregators[leader].metric("tessera_aggregator_flush_marks_recorded_total", "");
    let led_for = started.elapsed();
    aggregators[leader].kill();
    let killed = Instant::now();
    let mut takeover = None;
    while killed.elapsed() < Duration::from_secs(TTL_SECS + 6) {
        sent += send_for(&socket, statsd, Duration::from_millis(200));
        if takeover.is_none() && leads(&aggregators[follower]) {
            takeover = Some(killed.elapsed());
        }
    }
    let takeover = takeover.expect("the follower took over");
    sent += send_for(&socket, statsd, Duration::from_secs(2));

    // Every counter, at both resolutions, adds up to exactly what was sent.
    for resolution in RESOLUTIONS {
        for series in 0..SERIES {
            let query = format!("failover_hits_total{{series=\"s{series}\",resolution=\"{resolution}\"}}");
            let mut last = None;
            let reached = || {
                last = scalar(&prometheus, &query);
                last.is_some_and(|value| value >= sent as f64)
            };
            wait_until(&format!("{query} to reach {sent}"), Duration::from_secs(40), reached);
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    for resolution in RESOLUTIONS {
        let query = format!("sum(failover_hits_total{{resolution=\"{resolution}\"}})");
        assert_eq!(scalar(&prometheus, &query), Some((sent * SERIES as u64) as f64), "{query}");
    }
    assert_eq!(ingester.metric("tessera_ingester_tiles_skipped_total", "reason=\"conflict\""), 0.0);
    let survivor = &aggregators[follower];
    assert!(survivor.metric("tessera_aggregator_elections_total", "result=\"won\"") >= 1.0);
    assert!(survivor.metric("tessera_aggregator_tiles_discarded_total", "reason=\"flushed_by_leader\"") > 0.0);

    let duplicates = ingester.metric("tessera_ingester_tiles_skipped_total", "reason=\"duplicate\"") as u64;
    eprintln!(
        "failover: leader killed after {led_for:?}; follower leads {takeover:?} later (lease TTL {TTL_SECS} s); \
         {} counter increments per series, exact at {RESOLUTIONS:?}; the ingester skipped {duplicates} duplicate \
         tile values (flushed by the old leader after its last recorded mark), 0 conflicts",
        sent
    );
    eprintln!(
        "flush marks: the leader wrote {marks_before} in {led_for:?} ({:.2}/s) for 64 shards, policies 1s and 10s",
        marks_before / led_for.as_secs_f64()
    );
    for (resolution, before) in RESOLUTIONS.iter().zip(&before) {
        let after = latency_buckets(&ingester, resolution);
        let summary = |from: &BTreeMap<u64, f64>, to: &BTreeMap<u64, f64>| {
            let (p50, count) = quantile_between(from, to, 0.5);
            let (p99, _) = quantile_between(from, to, 0.99);
            let (max, _) = quantile_between(from, to, 1.0);
            if count == 0.0 {
                "none".to_owned()
            } else {
                format!("{count}: p50 <= {p50} s, p99 <= {p99} s, max <= {max} s")
            }
        };
        eprintln!(
            "end-to-end latency (ingester write - tile end), {resolution} tile values written before the kill {}; after it {}",
            summary(&BTreeMap::new(), before),
            summary(before, &after)
        );
    }
}
