//! Shared test support: an ingester stand-in, a routing wire sender, an
//! expectation model of what every tile should hold, and small helpers.

#![allow(dead_code)]

pub mod ingester;
pub mod sender;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use tessera_aggregator::{Config, StoragePolicy};
use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::sketch::{Sketch, relative_error};
use tessera_proto::{SeriesValue, aggregate::Value};
use tessera_runtime::Telemetry;

pub use ingester::{Flushed, TileKey, TileReceiver};
#[allow(unused_imports)]
pub use sender::{RoutingSender, Sent, Window, join_senders, send_windows, spawn_senders};

/// A raw connection to an aggregator after its handshake, as collector `name`.
pub async fn connect_collector(address: std::net::SocketAddr, name: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    tessera_proto::framing::client_handshake(&mut stream, tessera_proto::Role::Collector, name).await.unwrap();
    stream
}

/// The empty batch an idle collector `source` sends for the last whole second, as frame
/// `sequence`.
pub fn empty_batch(source: &str, sequence: u64) -> tessera_proto::Frame {
    let window_start_ms = tessera_core::clock::now_ms() / 1000 * 1000 - 1000;
    let batch = tessera_proto::PartialBatch {
        source: source.into(),
        sequence,
        window_start_ms,
        window_ms: 1000,
        watermark_ms: window_start_ms + 1000,
        ..tessera_proto::PartialBatch::default()
    };
    tessera_proto::Frame { body: Some(tessera_proto::frame::Body::Partials(batch)) }
}

/// Window length the test senders use.
pub const WINDOW_MS: i64 = 100;

/// A config for tests: small tiles, short buffers, fast retries, no
/// telemetry endpoint, `merge_threads` merge threads.
pub fn test_config(instance_id: &str, ingester: &str, policies: &[&str], merge_threads: usize) -> Config {
    let mut config: Config = toml::from_str(&format!(
        r#"
        instance_id = "{instance_id}"
        listen = "127.0.0.1:0"
        buffer_past_ms = 400
        max_buffer_past_ms = 1000
        buffer_future_ms = 300
        expire_after_empty_tiles = 20
        [ingester]
        endpoints = ["{ingester}"]
        connect_timeout_ms = 500
        ack_timeout_ms = 2000
        reconnect_min_ms = 20
        reconnect_max_ms = 200
        shutdown_grace_secs = 5
        "#
    ))
    .expect("test config parses");
    config.policies = policies.iter().map(|text| text.parse().expect("policy")).collect();
    config.telemetry.listen = None;
    config.merge_threads = Some(merge_threads);
    config
}

/// A real collector's config for tests: one UDP reader on an ephemeral
/// port, 100 ms windows, fast reconnects, no telemetry endpoint; the
/// placement is given to `Collector::start` directly.
pub fn collector_config() -> tessera_collector::Config {
    let mut config: tessera_collector::Config =
        toml::from_str(&tessera_testkit::in_process_collector_config(100, 30)).expect("test collector config parses");
    config.placement = Some(tessera_collector::PlacementSource::Static { path: "unused-in-tests".into() });
    config.forward.shutdown_grace_secs = 5;
    config.telemetry.listen = None;
    config
}

/// Polls `done` every 20 ms until it holds, failing after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `datagram` to `target` every 20 ms for `duration`; returns how many times.
pub async fn send_every_20ms(
    socket: &std::net::UdpSocket,
    target: std::net::SocketAddr,
    datagram: &str,
    duration: Duration,
) -> u64 {
    let deadline = Instant::now() + duration;
    let mut sent = 0;
    while Instant::now() < deadline {
        socket.send_to(datagram.as_bytes(), target).unwrap();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sent
}

/// Like [`wait_until`] with an async check.
pub async fn wait_until_async<F, Fut>(what: &str, timeout: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sleeps until the wall clock reaches `time_ms`.
pub async fn sleep_until_ms(time_ms: i64) {
    let wait = time_ms - tessera_core::clock::now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// A metric's value in the telemetry text (`labels` as in the exposition, without braces).
pub fn metric_value(telemetry: &Telemetry, name: &str, labels: &str) -> Option<f64> {
    let text = telemetry.encode().expect("metrics encode");
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines().find_map(|line| line.strip_prefix(&prefix)).map(|value| value.trim().parse().expect("a number"))
}

/// What every tile should hold: the accepted partials merged per tile
/// with the metric model's own merge, and the raw timer samples behind them.
#[derive(Default)]
pub struct Model {
    policies: Vec<StoragePolicy>,
    pub tiles: HashMap<TileKey, Aggregate>,
    pub samples: HashMap<TileKey, Vec<f64>>,
    /// Policies an aggregator took partials too late for (they went into the coarser
    /// policies' tiles, acknowledged): their tiles may lack what the model holds.
    late: HashSet<String>,
}

impl Model {
    pub fn new(policies: &[&str]) -> Model {
        Model { policies: policies.iter().map(|text| text.parse().unwrap()).collect(), ..Model::default() }
    }

    /// Records values an aggregator acknowledged for the window at `window_start_ms`.
    pub fn accept(&mut self, window_start_ms: i64, values: &[SeriesValue]) {
        for value in values {
            let kind = kind_from_proto(value.r#type).unwrap();
            let aggregate = Aggregate::from_proto(value.aggregate.as_ref().unwrap()).unwrap();
            for policy in &self.policies {
                let tile_end = policy.tile_start_ms(window_start_ms) + policy.resolution_ms();
                let key = (policy.to_string(), tile_end, kind, value.series_id.clone());
                match self.tiles.get_mut(&key) {
                    Some(existing) => {
                        let _ = existing.merge(&aggregate).unwrap();
                    }
                    None => {
                        self.tiles.insert(key, aggregate.clone());
                    }
                }
            }
        }
    }

    /// Records the raw samples behind a timer partial that was acknowledged.
    pub fn samples(&mut self, window_start_ms: i64, kind: tessera_core::parse::MetricKind, id: &[u8], samples: &[f64]) {
        for policy in &self.policies {
            let tile_end = policy.tile_start_ms(window_start_ms) + policy.resolution_ms();
            let key = (policy.to_string(), tile_end, kind, id.to_vec());
            self.samples.entry(key).or_default().extend_from_slice(samples);
        }
    }

    pub fn absorb(&mut self, other: Model) {
        for (key, aggregate) in other.tiles {
            match self.tiles.get_mut(&key) {
                Some(existing) => {
                    let _ = existing.merge(&aggregate).unwrap();
                }
                None => {
                    self.tiles.insert(key, aggregate);
                }
            }
        }
        for (key, samples) in other.samples {
            self.samples.entry(key).or_default().extend(samples);
        }
    }

    /// Takes the policies `metrics` counted late partials for: on a loaded machine a window
    /// can miss its finer tile and go into its coarser one only, acknowledged as taken.
    /// Their tiles are then checked for holding no more than the model, and flushed once;
    /// the other policies' stay exact.
    pub fn excuse_late(&mut self, metrics: &tessera_aggregator::TileMetrics) {
        for policy in &self.policies {
            if metrics.late_partials(policy) > 0 {
                self.late.insert(policy.to_string());
            }
        }
    }

    /// Tiles the model expects.
    pub fn len(&self) -> usize {
        self.tiles.len()
    }

    /// Waits until `receiver` has every tile the model expects, checks them
    /// (see [`Model::assert_matches`]) and returns what it received.
    pub async fn assert_received(&self, receiver: &TileReceiver) -> HashMap<TileKey, Vec<Flushed>> {
        wait_until("every expected tile", Duration::from_secs(10), || {
            let values = receiver.values();
            self.tiles.keys().filter(|key| !self.late.contains(&key.0)).all(|key| values.contains_key(key))
        })
        .await;
        let received = receiver.values();
        self.assert_matches(&received);
        received
    }

    /// Checks every received tile value against the model: nothing missing,
    /// nothing extra, nothing counted twice, every value exact (quantiles
    /// within the sketch's bound). Gauges are resolved tile after tile.
    pub fn assert_matches(&self, received: &HashMap<TileKey, Vec<Flushed>>) {
        for key in received.keys() {
            assert!(self.tiles.contains_key(key), "received a tile nobody sent: {}", describe(key));
        }
        let mut keys: Vec<&TileKey> = self.tiles.keys().collect();
        keys.sort_by(|a, b| (&a.0, &a.3, a.1).cmp(&(&b.0, &b.3, b.1)));
        let mut last_gauge: HashMap<(String, Vec<u8>), f64> = HashMap::new();
        for key in keys {
            let expected = &self.tiles[key];
            let late = self.late.contains(&key.0);
            let got = match received.get(key) {
                Some(got) => got,
                None if late => continue,
                None => panic!("tile missing: {}", describe(key)),
            };
            let sources: Vec<&str> = got.iter().map(|flushed| flushed.source.as_str()).collect();
            assert_eq!(got.len(), 1, "tile flushed {} times (by {sources:?}): {}", got.len(), describe(key));
            let got = &got[0].value;
            if late {
                if let (Aggregate::Counter(sum), Value::Counter(got)) = (expected, got) {
                    assert!(got <= sum, "counter {} holds {got}, more than the {sum} sent", describe(key));
                }
                continue;
            }
            match (expected, got) {
                (Aggregate::Counter(sum), Value::Counter(got)) => {
                    assert_eq!(got, sum, "counter {}", describe(key));
                }
                (Aggregate::Gauge(gauge), Value::Gauge(got)) => {
                    let series = (key.0.clone(), key.3.clone());
                    let value = gauge.resolve(last_gauge.get(&series).copied()).unwrap_or(0.0);
                    assert_eq!(got.value, value, "gauge {}", describe(key));
                    last_gauge.insert(series, value);
                }
                (Aggregate::Distribution(summary), Value::Distribution(got)) => {
                    let exact = (summary.count, summary.sum, summary.min, summary.max);
                    assert_eq!((got.count, got.sum, got.min, got.max), exact, "timer {}", describe(key));
                    let sketch = Sketch::from_proto(got.sketch.as_ref().expect("a sketch")).unwrap();
                    if let Some(samples) = self.samples.get(key) {
                        check_quantiles(&sketch, samples, key);
                    }
                }
                (Aggregate::Set(set), Value::Set(got)) => {
                    let got = tessera_core::hll::HyperLogLog::from_proto(got).unwrap();
                    assert_eq!(got.estimate(), set.estimate(), "set {}", describe(key));
                }
                (expected, got) => panic!("{}: expected {expected:?}, got {got:?}", describe(key)),
            }
        }
    }
}

fn check_quantiles(sketch: &Sketch, samples: &[f64], key: &TileKey) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let alpha = relative_error(sketch.schema());
    for q in [0.0, 0.5, 0.9, 0.99, 1.0] {
        // The nearest rank: the ceil(q·n)-th value, counting from 1 (the 1st for q = 0);
        // a hair below q·n so that a product rounded up (0.7 × 10) keeps its whole rank.
        let rank = (q * sorted.len() as f64 - 1e-9).ceil() as usize;
        let truth = sorted[rank.clamp(1, sorted.len()) - 1];
        let estimate = sketch.quantile(q).expect("a quantile");
        assert!(
            (estimate - truth).abs() <= alpha * truth.abs() + 1e-9,
            "q{q} of {}: {estimate} vs {truth} (bound {alpha})",
            describe(key)
        );
    }
}

pub fn describe(key: &TileKey) -> String {
    format!("{} tile ending {} {:?} `{}`", key.0, key.1, key.2, String::from_utf8_lossy(&key.3))
}
