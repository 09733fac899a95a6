//! A wire sender standing in for collectors: routes each window's values
//! to the owners of their shards (with `Routing`, as the collector does),
//! sends one partial batch per destination and waits for its ack.

use std::collections::HashMap;
use std::net::SocketAddr;

use tessera_core::shard::shard_of;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, PartialBatch, Role, SeriesValue, ShardPartials, frame::Body};
use tessera_topology::PlacementHandle;
use tokio::net::TcpStream;

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
