//! A wire sender standing in for collectors: routes each window's values
//! to the owners of their shards (with `Routing`, as the collector does),
//! sends one partial batch per destination and waits for its ack. Senders
//! that send a run of windows, one as each ends, and model what was
//! acknowledged.

use std::collections::HashMap;
use std::net::SocketAddr;

use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, MetricType, PartialBatch, Role, SeriesValue, ShardPartials, frame::Body};
use tessera_topology::PlacementHandle;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{Model, WINDOW_MS, sleep_until_ms};

/// One connection to an aggregator.
pub struct WireClient {
    stream: TcpStream,
    source: String,
    sequence: u64,
    scratch: Vec<u8>,
}

impl WireClient {
    pub async fn connect(address: SocketAddr, source: &str) -> WireClient {
        let mut stream = TcpStream::connect(address).await.expect("connect to aggregator");
        framing::client_handshake(&mut stream, Role::Collector, source).await.expect("handshake");
        WireClient { stream, source: source.to_owned(), sequence: 0, scratch: Vec::new() }
    }

    /// Sends `batch` (its source and sequence are set here) and returns the ack.
    pub async fn send(&mut self, mut batch: PartialBatch) -> Ack {
        self.sequence += 1;
        batch.sequence = self.sequence;
        batch.source = self.source.clone();
        let frame = Frame { body: Some(Body::Partials(batch)) };
        framing::write_frame(&mut self.stream, &frame, DEFAULT_MAX_FRAME_BYTES).await.expect("send batch");
        let answer = framing::read_frame(&mut self.stream, &mut self.scratch, 1 << 20).await.expect("read ack");
        match answer.body {
            Some(Body::Ack(ack)) => {
                assert_eq!(ack.sequence, self.sequence, "ack for another batch");
                ack
            }
            other => panic!("expected an ack, got {other:?}"),
        }
    }
}

/// A partial batch of `values`, grouped by shard.
pub fn batch_of(window_start_ms: i64, window_ms: u32, num_shards: u32, values: Vec<SeriesValue>) -> PartialBatch {
    let mut shards: HashMap<u32, Vec<SeriesValue>> = HashMap::new();
    for value in values {
        shards.entry(shard_of(&value.series_id, num_shards)).or_default().push(value);
    }
    PartialBatch {
        window_start_ms,
        window_ms,
        shards: shards.into_iter().map(|(shard, series)| ShardPartials { shard, series }).collect(),
        ..Default::default()
    }
}

/// What one destination answered for one window.
pub struct Delivery {
    pub instance_id: String,
    pub values: Vec<SeriesValue>,
    pub ack: Ack,
}

impl Delivery {
    pub fn status(&self) -> AckStatus {
        AckStatus::try_from(self.ack.status).unwrap_or(AckStatus::Unspecified)
    }
}

/// Routes windows by the current placement, like a collector.
pub struct RoutingSender {
    source: String,
    placement: PlacementHandle,
    clients: HashMap<String, WireClient>,
    attempts: u32,
}

impl RoutingSender {
    pub fn new(source: &str, placement: PlacementHandle) -> RoutingSender {
        RoutingSender { source: source.to_owned(), placement, clients: HashMap::new(), attempts: 50 }
    }

    /// Sets how many times a batch is sent before a `retryable` answer is final.
    pub fn with_attempts(self, attempts: u32) -> RoutingSender {
        RoutingSender { attempts: attempts.max(1), ..self }
    }

    /// Sends one window; a `retryable` answer is retried (20 ms apart, see `with_attempts`).
    pub async fn send_window(&mut self, window_start_ms: i64, window_ms: u32, values: &[SeriesValue]) -> Vec<Delivery> {
        let routing = self.placement.routing();
        let mut per_destination: HashMap<usize, Vec<SeriesValue>> = HashMap::new();
        for value in values {
            let shard = shard_of(&value.series_id, routing.num_shards());
            for destination in routing.owners(shard, window_start_ms) {
                per_destination.entry(destination).or_default().push(value.clone());
            }
        }
        let mut deliveries = Vec::new();
        for (destination, values) in per_destination {
            let destination = &routing.destinations()[destination];
            if !self.clients.contains_key(&destination.endpoint) {
                let address = destination.endpoint.parse().expect("endpoint is an address");
                let client = WireClient::connect(address, &self.source).await;
                self.clients.insert(destination.endpoint.clone(), client);
            }
            let client = self.clients.get_mut(&destination.endpoint).expect("just inserted");
            let mut attempts = 0;
            let ack = loop {
                let batch = batch_of(window_start_ms, window_ms, routing.num_shards(), values.clone());
                let ack = client.send(batch).await;
                attempts += 1;
                if ack.status != AckStatus::Retryable as i32 || attempts >= self.attempts {
                    break ack;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            };
            deliveries.push(Delivery { instance_id: destination.instance_id.clone(), values, ack });
        }
        deliveries
    }
}

/// A window's values, and the raw samples behind its timers by series id.
pub type Window = (Vec<SeriesValue>, HashMap<Vec<u8>, Vec<f64>>);

/// What senders sent: the model of what was acknowledged, and the refused
/// deliveries counted by (aggregator, reason).
pub struct Sent {
    pub model: Model,
    pub refused: HashMap<(String, String), u64>,
}

impl Sent {
    pub fn new(policies: &[&str]) -> Sent {
        Sent { model: Model::new(policies), refused: HashMap::new() }
    }

    /// Refusals for `reason`, by every aggregator.
    pub fn refused(&self, reason: &str) -> u64 {
        self.refused.iter().filter(|((_, refused_for), _)| refused_for == reason).map(|(_, count)| count).sum()
    }

    /// Adds what another sender sent.
    pub fn absorb(&mut self, other: Sent) {
        self.model.absorb(other.model);
        for (key, count) in other.refused {
            *self.refused.entry(key).or_default() += count;
        }
    }
}

/// Sends `windows` consecutive windows of `WINDOW_MS` from `first` through
/// `wire`, each `delay_ms` after it ends; `values(start)` makes the window
/// at `start`.
pub async fn send_windows(
    wire: &mut RoutingSender,
    policies: &[&str],
    first: i64,
    windows: i64,
    delay_ms: i64,
    values: impl Fn(i64) -> Window,
) -> Sent {
    let mut sent = Sent::new(policies);
    for index in 0..windows {
        let start = first + index * WINDOW_MS;
        sleep_until_ms(start + WINDOW_MS + delay_ms).await;
        let (values, samples) = values(start);
        for delivery in wire.send_window(start, WINDOW_MS as u32, &values).await {
            if delivery.status() != AckStatus::Ok {
                *sent.refused.entry((delivery.instance_id, delivery.ack.reason)).or_default() += 1;
                continue;
            }
            sent.model.accept(start, &delivery.values);
            for value in delivery.values.iter().filter(|value| value.r#type == MetricType::Timer as i32) {
                sent.model.samples(start, MetricKind::Timer, &value.series_id, &samples[&value.series_id]);
            }
        }
    }
    sent
}

/// Starts `count` senders (`sender-0`, ...) routing by `placement`, each
/// sending `windows` windows from `first`, sender n n × 3 ms after each
/// window ends; `values(n, start)` makes sender n's window at `start`.
pub fn spawn_senders(
    count: usize,
    placement: &PlacementHandle,
    policies: &'static [&'static str],
    first: i64,
    windows: i64,
    values: fn(usize, i64) -> Window,
) -> Vec<JoinHandle<Sent>> {
    (0..count)
        .map(|sender| {
            let mut wire = RoutingSender::new(&format!("sender-{sender}"), placement.clone());
            tokio::spawn(async move {
                let delay_ms = 3 * sender as i64;
                send_windows(&mut wire, policies, first, windows, delay_ms, |start| values(sender, start)).await
            })
        })
        .collect()
}

/// Waits for `senders` and adds up what they sent.
pub async fn join_senders(senders: Vec<JoinHandle<Sent>>, policies: &[&str]) -> Sent {
    let mut sent = Sent::new(policies);
    for sender in senders {
        sent.absorb(sender.await.expect("sender task"));
    }
    sent
}
