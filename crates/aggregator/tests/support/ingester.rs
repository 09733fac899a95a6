//! A minimal ingester standing in for the real one: accepts aggregators,
//! records every tile batch (once per source, policy, tile end and sequence, as
//! the ingester keys them: a batch resent after a lost ack is not counted twice, and
//! a restarted aggregator, whose sequences start over, is not taken for a resend), and acknowledges it.
//! It can be stopped (listener and connections closed) and started again
//! on the same address.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tessera_core::parse::MetricKind;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, aggregate::Value, frame::Body};
use tessera_runtime::Shutdown;
use tokio::net::TcpListener;

/// One recorded tile value: which aggregator sent it, and the value.
#[derive(Debug, Clone)]
pub struct Flushed {
    pub source: String,
    pub value: Value,
    /// When the aggregator flushed it (its clock), unix milliseconds.
    pub flushed_at_ms: i64,
    /// Whether its batch was marked incomplete (a copy that may lack partials).
    pub incomplete: bool,
}

impl Flushed {
    /// The counter sum this value holds; 0 for a value of another kind.
    pub fn counter_sum(&self) -> f64 {
        match self.value {
            Value::Counter(sum) => sum,
            _ => 0.0,
        }
    }
}

/// Key of a tile value: policy, tile end, kind, series id.
pub type TileKey = (String, i64, MetricKind, Vec<u8>);

#[derive(Default)]
pub struct Received {
    pub values: HashMap<TileKey, Vec<Flushed>>,
    pub batches: u64,
    pub duplicates: u64,
    seen: HashSet<(String, String, i64, u64)>,
}

/// The stop signal and accept task of a running receiver.
type Running = Arc<Mutex<Option<(Shutdown, tokio::task::JoinHandle<()>)>>>;

#[derive(Clone)]
pub struct TileReceiver {
    pub address: SocketAddr,
    pub received: Arc<Mutex<Received>>,
    running: Running,
}

impl TileReceiver {
    pub async fn start() -> TileReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let receiver =
            TileReceiver { address: listener.local_addr().unwrap(), received: Arc::default(), running: Arc::default() };
        receiver.serve(listener);
        receiver
    }

    /// Closes the listener and every connection, as if the ingester died.
    pub async fn stop(&self) {
        let running = self.running.lock().unwrap().take();
        if let Some((stop, task)) = running {
            stop.trigger();
            let _ = task.await;
        }
    }

    /// Listens again on the same address.
    pub async fn restart(&self) {
        let listener = TcpListener::bind(self.address).await.expect("rebind receiver");
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let stop = Shutdown::new();
        let received = self.received.clone();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                loop {
                    let accepted = tokio::select! {
                        accepted = listener.accept() => accepted,
                        () = stop.wait() => return,
                    };
                    let Ok((stream, _)) = accepted else { return };
                    tokio::spawn(connection(stream, received.clone(), stop.clone()));
                }
            }
        });
        *self.running.lock().unwrap() = Some((stop, task));
    }

    /// Tile values recorded so far.
    pub fn values(&self) -> HashMap<TileKey, Vec<Flushed>> {
        self.received.lock().unwrap().values.clone()
    }

    /// Every tile of counter `id` under `policy`: its tile end and each flush of it.
    pub fn counter_tiles(&self, policy: &str, id: &str) -> Vec<(i64, Vec<Flushed>)> {
        self.values()
            .into_iter()
            .filter(|((tile_policy, _, kind, series), _)| {
                tile_policy == policy && *kind == MetricKind::Counter && series == id.as_bytes()
            })
            .map(|((_, tile_end, ..), flushed)| (tile_end, flushed))
            .collect()
    }

    pub fn batches(&self) -> u64 {
        self.received.lock().unwrap().batches
    }
}

async fn connection(mut stream: tokio::net::TcpStream, received: Arc<Mutex<Received>>, stop: Shutdown) {
    let Ok(hello) = framing::server_handshake(&mut stream, "test-ingester").await else { return };
    assert_eq!(hello.role, tessera_proto::Role::Aggregator as i32);
    let mut scratch = Vec::new();
    loop {
        let frame = tokio::select! {
            frame = framing::read_frame(&mut stream, &mut scratch, DEFAULT_MAX_FRAME_BYTES) => frame,
            () = stop.wait() => return,
        };
        let Ok(frame) = frame else { return };
        let Some(Body::Tiles(batch)) = frame.body else { panic!("expected tile batches") };
        {
            let mut received = received.lock().unwrap();
            if received.seen.insert((
                batch.source.clone(),
                batch.storage_policy.clone(),
                batch.tile_end_ms,
                batch.sequence,
            )) {
                received.batches += 1;
                for value in batch.tiles {
                    let kind = tessera_core::aggregate::kind_from_proto(value.r#type).unwrap();
                    let key = (batch.storage_policy.clone(), batch.tile_end_ms, kind, value.series_id);
                    let value = value.aggregate.and_then(|aggregate| aggregate.value).expect("a value");
                    received.values.entry(key).or_default().push(Flushed {
                        source: batch.source.clone(),
                        value,
                        flushed_at_ms: batch.flushed_at_ms,
                        incomplete: batch.incomplete,
                    });
                }
            } else {
                received.duplicates += 1;
            }
        }
        let ack = Ack { sequence: batch.sequence, status: AckStatus::Ok as i32, ..Default::default() };
        if framing::write_frame(&mut stream, &Frame { body: Some(Body::Ack(ack)) }, DEFAULT_MAX_FRAME_BYTES)
            .await
            .is_err()
        {
            return;
        }
    }
}
