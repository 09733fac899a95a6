//! The ingester tier scaled out and failed over, through the real binaries:
//! a real etcd holding the ingesters' placement, three then four real
//! ingesters writing to one real Prometheus, one aggregator routing every
//! series to the ingester that owns its shard, one collector, 10 000 counter
//! series.
//!
//! 1. Three ingesters: each writes a share, and no series has two writers
//!    (`resets()` is 0 for every series).
//! 2. One ingester is killed (SIGKILL) mid-run: its shards fail over to the
//!    live ones once its lease expires (8 s, longer than a tile, so that the
//!    aggregator has queued batches for it meanwhile), and those batches go to
//!    the new owners.
//! 3. A fourth ingester starts and joins: shards move to it at a boundary.
//! 4. The killed one restarts on its data directory, writes what it had
//!    acknowledged and not written, and joins again.
//!
//! Then every counter's increase over the run, computed from the raw samples
//! as PromQL's `increase()` counts resets, is exactly what was sent; each
//! series has at most one reset per move of its shard (there are at most
//! three); the aggregator dropped nothing.
//!
//! Prometheus runs with an out-of-order window: the killed ingester's
//! acknowledged tiles are written when it returns, after the new owner has
//! written later samples of those series (README, *Scaling the ingester tier*).
//!
//! Run alone: `cargo nextest run -p tessera-tests --test ingester_tier --no-capture`.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tessera_core::clock::now_secs;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::{NO_SCRAPES, Prometheus};
use tessera_tests::{ingester_config, init_ingester_placement, loopback, start_daemon, static_placement, wait_until};
use tessera_topology::testing::EtcdServer;

const SERIES: usize = 10_000;
/// Longer than a tile (5 s) plus the keep-alive interval (TTL/3): at least one tile closes
/// between the kill and the failover, so the dead ingester has batches queued to re-route.
const TTL_SECS: u64 = 8;
const ENV: &str = "tier";

/// One increment of every series, in datagrams under 1400 bytes.
fn round_datagrams() -> Vec<Vec<u8>> {
    let mut datagrams = Vec::new();
    let mut current = String::new();
    for series in 0..SERIES {
        let line = format!("tier.hits:1|c|#series:s{series:05}\n");
        if current.len() + line.len() > 1400 {
            datagrams.push(std::mem::take(&mut current).into_bytes());
        }
        current.push_str(&line);
    }
    datagrams.push(current.into_bytes());
    datagrams
}

/// Sends a round every 500 ms from a thread until `stop`; counts the rounds.
struct Sender {
    rounds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sender {
    fn start(target: SocketAddr) -> Sender {
        let (rounds, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = std::thread::spawn({
            let (rounds, stop) = (rounds.clone(), stop.clone());
            move || {
                let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
                let datagrams = round_datagrams();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    // In bursts of 20 datagrams (28 KB): a round at once could outrun the
                    // collector's receive buffer where `net.core.rmem_max` is the default.
                    for burst in datagrams.chunks(20) {
                        for datagram in burst {
                            socket.send_to(datagram, target).unwrap();
                        }
                        std::thread::sleep(Duration::from_micros(500));
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(500).saturating_sub(started.elapsed()));
                }
            }
        });
        Sender { rounds, stop, thread: Some(thread) }
    }

    /// Stops sending; returns the rounds sent.
    fn finish(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.rounds.load(Ordering::Relaxed)
    }
}

struct Ingesters {
    etcd_endpoint: String,
    remote_write: String,
    dir: tempfile::TempDir,
    ports: HashMap<String, u16>,
}

impl Ingesters {
    fn config(&self, id: &str) -> String {
        // The store takes the aggregator's 5 s tiles, its one resolution: no `resolution` label.
        let settings = format!(
            "instance_id = \"{id}\"\nsink_policies = [\"5s\"]\n\
             [queue]\nfsync = \"always\"\n\
             [placement]\nliveness_ttl_secs = {TTL_SECS}\nnum_shards = 32\nmove_delay_secs = 2\n\
             move_boundary_secs = 10\nsettle_secs = 8\n\
             [placement.etcd]\nendpoints = [\"{}\"]\nenv = \"{ENV}\"\nrequest_timeout_ms = 1000\n",
            self.etcd_endpoint,
        );
        ingester_config(self.ports[id], &self.dir.path().join(id), &self.remote_write, &settings, "")
    }

    fn start(&self, id: &str) -> Daemon {
        start_daemon(id, "tessera-ingester", &self.config(id), free_port())
    }
}

/// Per series: (increase over the run as PromQL counts resets, resets).
fn increases(prometheus: &Prometheus, at: f64) -> HashMap<String, (f64, u32)> {
    let result = prometheus.query("tier_hits_total[30m]", at);
    let series = result.as_array().cloned().unwrap_or_default();
    series
        .iter()
        .map(|series| {
            let name = series["metric"]["series"].as_str().unwrap_or_default().to_owned();
            let values: Vec<f64> = series["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|point| point[1].as_str().unwrap().parse::<f64>().unwrap())
                .collect();
            // A statsd counter starts at 0: the first sample counts whole.
            let (mut increase, mut resets, mut previous) = (0.0, 0, 0.0);
            for value in values {
                if value < previous {
                    resets += 1;
                    increase += value;
                } else {
                    increase += value - previous;
                }
                previous = value;
            }
            (name, (increase, resets))
        })
        .collect()
}

fn samples_written(ingester: &Daemon) -> f64 {
    ingester.metric("tessera_ingester_samples_written_total", "")
}

#[test]
fn the_ingester_tier_scales_out_and_fails_over_with_exact_counters() {
    let etcd = EtcdServer::start().expect("etcd starts");
    let prometheus =
        Prometheus::start_with_config(&format!("{NO_SCRAPES}storage:\n  tsdb:\n    out_of_order_time_window: 30m\n"));
    let ingesters = Ingesters {
        etcd_endpoint: etcd.endpoint(),
        remote_write: prometheus.remote_write_url(),
        dir: tempfile::tempdir().unwrap(),
        ports: ["ing-1", "ing-2", "ing-3", "ing-4"].iter().map(|id| ((*id).to_owned(), free_port())).collect(),
    };
    let first: Vec<(&str, u16)> = ["ing-1", "ing-2", "ing-3"].iter().map(|id| (*id, ingesters.ports[*id])).collect();
    init_ingester_placement(&etcd.endpoint(), ENV, 32, &first);
    let mut running: HashMap<&str, Daemon> =
        ["ing-1", "ing-2", "ing-3"].iter().map(|id| (*id, ingesters.start(id))).collect();

    let aggregator_port = free_port();
    let placement = static_placement(ingesters.dir.path(), aggregator_port);
    let aggregator_text = format!(
        "instance_id = \"agg-1\"\nlisten = \"127.0.0.1:{aggregator_port}\"\npolicies = [\"5s:1h\"]\n\
         buffer_past_ms = 1000\nmax_buffer_past_ms = 4000\n{placement}\
         [ingester]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\nconnect_timeout_ms = 500\n\
         [ingester.placement]\nkind = \"etcd\"\nendpoints = [\"{}\"]\nenv = \"{ENV}\"\nrequest_timeout_ms = 1000\n",
        etcd.endpoint()
    );
    let aggregator = start_daemon("agg-1", "tessera-aggregator", &aggregator_text, free_port());
    let statsd = free_port();
    let collector_text = format!("instance_id = \"host-1\"\n[udp]\nlisten = \"127.0.0.1:{statsd}\"\n{placement}");
    let collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());
    let started = now_secs();
    let mut sender = Sender::start(loopback(statsd));
    let owned = |ingester: &Daemon| ingester.metric("tessera_ingester_owned_shards", "");

    // 1. Three ingesters, no kill: each writes a share, no series has two writers.
    std::thread::sleep(Duration::from_secs(12));
    wait_until("every ingester writes", Duration::from_secs(20), || {
        running.values().all(|ingester| samples_written(ingester) > 0.0)
    });
    let shares: Vec<f64> = ["ing-1", "ing-2", "ing-3"].iter().map(|id| samples_written(&running[id])).collect();
    let total: f64 = shares.iter().sum();
    println!("samples written per ingester with three: {shares:?}");
    assert!(shares.iter().all(|share| *share > total / 6.0), "each ingester writes a share: {shares:?}");
    let steady = increases(&prometheus, now_secs());
    assert!(steady.len() >= SERIES * 9 / 10, "{} series in Prometheus", steady.len());
    assert!(steady.values().all(|(_, resets)| *resets == 0), "a series with two writers shows a reset");

    // 2. Kill ing-2 mid-run; its shards fail over when its lease expires.
    running.get_mut("ing-2").unwrap().kill();
    let killed_at = Instant::now();
    wait_until("the dead ingester's shards fail over", Duration::from_secs(20), || {
        owned(&running["ing-1"]) + owned(&running["ing-3"]) == 32.0
    });
    let failover = killed_at.elapsed();
    let written =
        |running: &HashMap<&str, Daemon>| samples_written(&running["ing-1"]) + samples_written(&running["ing-3"]);
    let before = written(&running);
    wait_until("the survivors write the adopted series", Duration::from_secs(20), || {
        running.values().map(|ingester| ingester.metric("tessera_ingester_series_adopted_total", "")).sum::<f64>() > 0.0
    });
    println!(
        "failover: the survivors own every shard {failover:?} after the kill (TTL {TTL_SECS} s) and write adopted series {:?} after it ({before} samples written before)",
        killed_at.elapsed()
    );
    std::thread::sleep(Duration::from_secs(4));

    // 3. A fourth ingester joins and takes shards at a boundary.
    running.insert("ing-4", ingesters.start("ing-4"));
    wait_until("ing-4 owns shards and writes", Duration::from_secs(40), || {
        owned(&running["ing-4"]) > 0.0 && samples_written(&running["ing-4"]) > 0.0
    });

    // 4. The killed ingester comes back on its data and joins again.
    running.insert("ing-2", ingesters.start("ing-2"));
    wait_until("ing-2 owns shards again and writes", Duration::from_secs(60), || {
        owned(&running["ing-2"]) > 0.0 && samples_written(&running["ing-2"]) > 0.0
    });
    std::thread::sleep(Duration::from_secs(6));
    let sent = sender.finish();
    let ended = now_secs();
    println!("sent {sent} rounds of {SERIES} series over {:.0} s", ended - started);

    // Everything sent arrives exactly.
    let expected = sent as f64;
    let deadline = Instant::now() + Duration::from_secs(40);
    let last = loop {
        let last = increases(&prometheus, now_secs());
        let complete = last.len() == SERIES && last.values().all(|(increase, _)| *increase >= expected);
        if complete || Instant::now() > deadline {
            break last;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(last.len(), SERIES, "series in Prometheus");
    let kernel_drops = collector.metric("tessera_collector_kernel_drops_total", "");
    let collector_drops = collector.metric("tessera_collector_drops_total", "");
    assert_eq!((kernel_drops, collector_drops), (0.0, 0.0), "the collector lost lines: the test sends too fast");
    let wrong: Vec<_> = last.iter().filter(|(_, (increase, _))| *increase != expected).take(5).collect();
    assert!(wrong.is_empty(), "increase is not {expected} for {wrong:?}");
    let resets: Vec<u32> = last.values().map(|(_, resets)| *resets).collect();
    let moved = resets.iter().filter(|resets| **resets > 0).count();
    println!("series with resets: {moved} of {SERIES}; most resets of one series: {:?}", resets.iter().max());
    assert!(resets.iter().all(|resets| *resets <= 3), "a shard moves at most three times in this run");
    assert!(moved > SERIES / 10, "shards moved, so some series were adopted: {moved}");
    for reason in ["queue_full", "no_ingester", "unroutable", "rejected", "too_large", "shutdown"] {
        assert_eq!(
            aggregator.metric("tessera_aggregator_drops_total", &format!("reason=\"{reason}\"")),
            0.0,
            "{reason}"
        );
    }
    assert!(
        aggregator.metric("tessera_aggregator_rerouted_total", "unit=\"series\"") > 0.0,
        "the dead ingester's queue was re-routed"
    );
    let adopted: f64 =
        running.values().map(|ingester| ingester.metric("tessera_ingester_series_adopted_total", "")).sum();
    assert!(adopted > 0.0, "series were adopted");
}
