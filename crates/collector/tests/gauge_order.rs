//! One sender's gauge lines keep their order through the real collector,
//! whatever thread reads them: four UDP readers with the random reuseport
//! distribution, the TCP line thread, the Unix socket, and both gauge
//! semantics.
//!
//! Each round, in the middle of a 1 s tile, one client sends for each of
//! 1 000 gauges `gd.<i>:<70+r>|g`, `gd.<i>:+5|g`, `gd.<i>:-2|g`, and for
//! 1 000 more `gl.<i>:<r+1>|g`, `gl.<i>:<r+2>|g`, `gl.<i>:<r+3>|g`, every
//! line its own datagram. The collector's 200 ms windows reach a receiver
//! that merges them per tile as the aggregator does; every gauge of every
//! tile must be what applying its lines in order gives.

#[path = "support/receiver.rs"]
mod receiver;

use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};
use tessera_core::clock::now_ms;

use receiver::Receiver;
use tessera_collector::{Collector, Config, PlacementHandle};
use tessera_core::aggregate::{Aggregate, MergeOrder};
use tessera_core::parse::MetricKind;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::Placement;

const GAUGES: usize = 1_000;
const ROUNDS: i64 = 4;
const TILE_MS: i64 = 1_000;

#[derive(Clone, Copy, PartialEq)]
enum Listener {
    Udp,
    Tcp,
    Unix,
}

#[derive(Clone, Copy, PartialEq)]
enum Semantic {
    Statsd,
    Absolute,
}

fn config(semantic: Semantic, unix: std::path::PathBuf) -> Config {
    let semantic = match semantic {
        Semantic::Statsd => "statsd",
        Semantic::Absolute => "absolute",
    };
    let mut config: Config = toml::from_str(&format!(
        r#"
        [udp]
        listen = "127.0.0.1:0"
        reader_threads = 4
        distribute = "random"
        recv_buffer_bytes = 8388608
        gauge_deltas = "{semantic}"
        [tcp]
        listen = "127.0.0.1:0"
        gauge_deltas = "{semantic}"
        [unix]
        gauge_deltas = "{semantic}"
        [aggregation]
        interval_ms = 200
        flush_delay_ms = 100
        [forward]
        reconnect_min_ms = 20
        reconnect_max_ms = 200
        shutdown_grace_secs = 10
        [telemetry]
        "#
    ))
    .unwrap();
    config.telemetry.listen = None;
    config.unix.path = Some(unix);
    config
}

/// The three lines of gauge `i` of each family in round `round`.
fn round_lines(round: i64, i: usize) -> [String; 6] {
    [
        format!("gd.{i}:{}|g", 70 + round),
        format!("gd.{i}:+5|g"),
        format!("gd.{i}:-2|g"),
        format!("gl.{i}:{}|g", round + 1),
        format!("gl.{i}:{}|g", round + 2),
        format!("gl.{i}:{}|g", round + 3),
    ]
}

/// What the tile of `round` must hold for the gauge `name`.
fn due(semantic: Semantic, round: i64, name: &str) -> f64 {
    match (name.starts_with("gd."), semantic) {
        (true, Semantic::Statsd) => (70 + round + 5 - 2) as f64,
        // `-2` sets the gauge to -2.
        (true, Semantic::Absolute) => -2.0,
        (false, _) => (round + 3) as f64,
    }
}

/// Sleeps until 400 ms into the next tile, and returns that tile's start.
async fn middle_of_next_tile() -> i64 {
    let next_tile = now_ms().div_euclid(TILE_MS) * TILE_MS + TILE_MS;
    tokio::time::sleep(Duration::from_millis((next_tile + 400 - now_ms()).max(0) as u64)).await;
    next_tile
}

/// Sends every round through `listener` and checks every tile's gauges.
async fn gauges_keep_their_order(listener: Listener, semantic: Semantic) {
    let receiver = Receiver::start("127.0.0.1:0").await;
    let dir = tempfile::tempdir().unwrap();
    let unix_path = dir.path().join("statsd.sock");
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("collector", "test");
    let placement =
        PlacementHandle::fixed(Placement::init(&[("agg-1", &receiver.address.to_string())], 8, 1, 0).unwrap());
    let collector =
        Collector::start(config(semantic, unix_path.clone()), placement, telemetry.clone(), shutdown.clone())
            .await
            .unwrap();

    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let unix = UnixDatagram::unbound().unwrap();
    let mut tcp = TcpStream::connect(collector.tcp_addr().unwrap()).unwrap();
    let mut tiles = Vec::new();
    for round in 0..ROUNDS {
        tiles.push(middle_of_next_tile().await);
        let started = Instant::now();
        let mut text = String::new();
        for i in 0..GAUGES {
            for line in round_lines(round, i) {
                match listener {
                    Listener::Udp => {
                        udp.send_to(line.as_bytes(), collector.udp_addr().unwrap()).unwrap();
                    }
                    Listener::Unix => {
                        unix.send_to(line.as_bytes(), &unix_path).unwrap();
                    }
                    Listener::Tcp => {
                        text.push_str(&line);
                        text.push('\n');
                    }
                }
            }
        }
        if listener == Listener::Tcp {
            tcp.write_all(text.as_bytes()).unwrap();
            tcp.flush().unwrap();
        }
        assert!(started.elapsed() < Duration::from_millis(550), "a round must fit in its tile");
    }
    drop(tcp);

    // Wait until the last round's windows have arrived, then drain.
    let lines_sent = (ROUNDS as usize * GAUGES * 6) as f64;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let received: f64 = ["udp", "tcp", "unix"]
            .iter()
            .map(|name| metric(&telemetry, "tessera_collector_lines_received_total", &format!("listener=\"{name}\"")))
            .sum();
        if received >= lines_sent {
            break;
        }
        assert!(Instant::now() < deadline, "the collector read {received} of {lines_sent} lines");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.trigger();
    collector.wait().await;

    // Merge the windows of each tile as the aggregator does, in arrival order.
    let received = receiver.received.lock().unwrap();
    let mut by_tile: HashMap<(i64, Vec<u8>), Aggregate> = HashMap::new();
    let mut ambiguous = 0;
    for (window_start_ms, kind, id, aggregate) in &received.partials {
        assert_eq!(*kind, MetricKind::Gauge);
        let tile = window_start_ms.div_euclid(TILE_MS) * TILE_MS;
        match by_tile.get_mut(&(tile, id.clone())) {
            Some(held) => ambiguous += u32::from(held.merge(aggregate).unwrap() == MergeOrder::Ambiguous),
            None => {
                by_tile.insert((tile, id.clone()), aggregate.clone());
            }
        }
    }
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (round, tile) in tiles.iter().enumerate() {
        for i in 0..GAUGES {
            for name in [format!("gd.{i}"), format!("gl.{i}")] {
                let got = match by_tile.get(&(*tile, name.clone().into_bytes())) {
                    Some(Aggregate::Gauge(gauge)) => gauge.resolve(None),
                    _ => None,
                };
                let due = due(semantic, round as i64, &name);
                checked += 1;
                if got != Some(due) {
                    wrong.push(format!("{name} in round {round}: {got:?}, due {due}"));
                }
            }
        }
    }
    assert_eq!(checked, ROUNDS as usize * GAUGES * 2);
    assert!(
        wrong.is_empty(),
        "{} of {checked} tile values wrong, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(ambiguous, 0, "merging the windows of a tile was ambiguous");
    assert_eq!(metric(&telemetry, "tessera_collector_gauge_order_ambiguous_total", ""), 0.0);
}

fn metric(telemetry: &Telemetry, name: &str, labels: &str) -> f64 {
    let text = telemetry.encode().unwrap();
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines().find_map(|line| line.strip_prefix(&prefix)).map_or(0.0, |value| value.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_with_four_random_readers_keeps_each_senders_gauge_order() {
    gauges_keep_their_order(Listener::Udp, Semantic::Statsd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_with_the_absolute_semantic_keeps_each_senders_gauge_order() {
    gauges_keep_their_order(Listener::Udp, Semantic::Absolute).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_keeps_each_connections_gauge_order() {
    gauges_keep_their_order(Listener::Tcp, Semantic::Statsd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_keeps_each_senders_gauge_order() {
    gauges_keep_their_order(Listener::Unix, Semantic::Statsd).await;
}
