//! The aggregator side of the wire, for ingester tests: connect, shake hands, send tile
//! batches and read their acknowledgements; and tile builders.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, Role, SeriesValue, TileBatch, frame::Body};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::tiles;
#[allow(unused_imports)] // each test uses some of them
pub use tessera_testkit::tiles::{counter, gauge, set, timer};
use tokio::net::TcpStream;

/// A connection to an ingester, past the handshake.
pub struct Sender {
    pub stream: TcpStream,
    scratch: Vec<u8>,
}

impl Sender {
    pub async fn connect(address: SocketAddr) -> Sender {
        let mut stream = TcpStream::connect(address).await.expect("connect to the ingester");
        framing::client_handshake(&mut stream, Role::Aggregator, "test-aggregator").await.expect("handshake");
        Sender { stream, scratch: Vec::new() }
    }

    /// Sends one frame and reads the answer.
    pub async fn exchange(&mut self, frame: &Frame) -> Ack {
        framing::write_frame(&mut self.stream, frame, DEFAULT_MAX_FRAME_BYTES).await.expect("write frame");
        self.read_ack().await.expect("an ack")
    }

    /// Reads the next ack; `None` when the connection closed.
    pub async fn read_ack(&mut self) -> Option<Ack> {
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            framing::read_frame(&mut self.stream, &mut self.scratch, DEFAULT_MAX_FRAME_BYTES),
        )
        .await
        .expect("an answer within 30 s");
        match read {
            Ok(Frame { body: Some(Body::Ack(ack)) }) => Some(ack),
            Ok(other) => panic!("expected an ack, got {other:?}"),
            Err(_) => None,
        }
    }

    /// Sends an already encoded frame (length prefix included) and reads the answer.
    pub async fn exchange_encoded(&mut self, frame: &[u8]) -> Ack {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(frame).await.expect("write frame");
        self.read_ack().await.expect("an ack")
    }

    pub async fn send(&mut self, batch: TileBatch) -> Ack {
        self.exchange(&Frame { body: Some(Body::Tiles(batch)) }).await
    }

    /// Sends until the batch is acknowledged Ok, retrying on `Retryable` like an aggregator.
    pub async fn send_until_ok(&mut self, batch: TileBatch) -> u32 {
        let mut refusals = 0;
        loop {
            let ack = self.send(batch.clone()).await;
            match AckStatus::try_from(ack.status) {
                Ok(AckStatus::Ok) => return refusals,
                Ok(AckStatus::Retryable) => {
                    refusals += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => panic!("batch refused for good: {ack:?}"),
            }
        }
    }
}

/// Starts an ingester from `config_text` (TOML, no telemetry listener) and connects to it.
pub async fn start_ingester(config_text: &str) -> (tessera_ingester::Ingester, Telemetry, Shutdown, Sender) {
    let (ingester, telemetry, shutdown) = start_unconnected_ingester(config_text).await;
    let sender = Sender::connect(ingester.listen_addr()).await;
    (ingester, telemetry, shutdown, sender)
}

/// Starts an ingester from `config_text` (TOML, no telemetry listener), with no connection yet.
pub async fn start_unconnected_ingester(config_text: &str) -> (tessera_ingester::Ingester, Telemetry, Shutdown) {
    let mut config: tessera_ingester::Config = toml::from_str(config_text).expect("test config parses");
    config.telemetry.listen = None;
    let telemetry = Telemetry::new("ingester", "test");
    let shutdown = Shutdown::new();
    let ingester =
        tessera_ingester::Ingester::start(config, telemetry.clone(), shutdown.clone()).await.expect("ingester starts");
    (ingester, telemetry, shutdown)
}

/// Unix milliseconds of a 10 s tile end a few minutes ago (Prometheus takes samples up
/// to about an hour older than its newest).
pub fn recent_tile_end_ms(minutes_ago: i64) -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as i64;
    (now - minutes_ago * 60_000) / 10_000 * 10_000
}

/// Batch `sequence` from `test-aggregator` of the tile of `policy` (10 s or 1 m) ending at
/// `tile_end_ms`, flushed 100 ms after it.
pub fn batch(sequence: u64, policy: &str, tile_end_ms: i64, tiles: Vec<SeriesValue>) -> TileBatch {
    let resolution_ms = if policy.starts_with("1m") { 60_000 } else { 10_000 };
    TileBatch {
        source: "test-aggregator".into(),
        sequence,
        storage_policy: policy.into(),
        resolution_ms,
        ..tiles::batch(tile_end_ms, tiles)
    }
}

/// Waits until `done` holds, polling; panics after `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The value of `name{labels}` in OpenMetrics text (0 when absent).
pub fn metric_value(text: &str, name: &str, labels: &str) -> f64 {
    let wanted = if labels.is_empty() { name.to_owned() } else { format!("{name}{{{labels}}}") };
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == wanted).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}
