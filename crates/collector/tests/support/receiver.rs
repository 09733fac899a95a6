//! A minimal receiver of the wire protocol standing in for an aggregator:
//! accepts collectors, merges every partial it receives per series, and
//! acknowledges (or refuses) each batch.
#![allow(dead_code)] // each test binary uses a different part of it

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, frame::Body};
use tokio::net::TcpListener;

/// What the receiver got, merged per (kind, series id), and per window.
#[derive(Default)]
pub struct Received {
    pub series: HashMap<(MetricKind, Vec<u8>), Aggregate>,
    /// Every partial as it came, with its batch's window start.
    pub partials: Vec<(i64, MetricKind, Vec<u8>, Aggregate)>,
    pub batches: u64,
    pub shards: HashMap<u32, u64>,
    pub sources: Vec<String>,
    /// Every batch in arrival order: (window start, partials, watermark).
    pub batch_log: Vec<(i64, u64, i64)>,
    /// Partials that named their series by a dictionary ref alone.
    pub by_ref: u64,
}

#[derive(Clone)]
pub struct Receiver {
    pub address: SocketAddr,
    pub received: Arc<Mutex<Received>>,
    /// When set, batches are answered with this status instead of OK.
    pub answer: Arc<Mutex<AckStatus>>,
}

impl Receiver {
    pub async fn start(address: &str) -> Receiver {
        let listener = TcpListener::bind(address).await.expect("bind receiver");
        let receiver = Receiver {
            address: listener.local_addr().unwrap(),
            received: Arc::default(),
            answer: Arc::new(Mutex::new(AckStatus::Ok)),
        };
        let state = receiver.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let state = state.clone();
                tokio::spawn(async move {
                    let Ok(hello) = framing::server_handshake(&mut stream, "test-receiver").await else { return };
                    state.received.lock().unwrap().sources.push(hello.instance_id);
                    let mut scratch = Vec::new();
                    // This connection's series dictionary: generation, ref → (type, id).
                    let mut dictionary: (u64, HashMap<u32, (i32, Vec<u8>)>) = (0, HashMap::new());
                    while let Ok(frame) = framing::read_frame(&mut stream, &mut scratch, DEFAULT_MAX_FRAME_BYTES).await
                    {
                        let Some(Body::Partials(batch)) = frame.body else { return };
                        let status = *state.answer.lock().unwrap();
                        if status == AckStatus::Ok {
                            let mut received = state.received.lock().unwrap();
                            received.batches += 1;
                            let partials = batch.shards.iter().map(|shard| shard.series.len() as u64).sum();
                            received.batch_log.push((batch.window_start_ms, partials, batch.watermark_ms));
                            if batch.dictionary != 0 && batch.dictionary != dictionary.0 {
                                dictionary = (batch.dictionary, HashMap::new());
                            }
                            for shard in batch.shards {
                                *received.shards.entry(shard.shard).or_default() += shard.series.len() as u64;
                                for mut value in shard.series {
                                    if value.r#ref != 0 && value.series_id.is_empty() {
                                        // An unknown ref leaves the partial out: the test's totals then fail.
                                        let Some((metric_type, id)) = dictionary.1.get(&value.r#ref) else { continue };
                                        (value.r#type, value.series_id) = (*metric_type, id.clone());
                                        received.by_ref += 1;
                                    } else if value.r#ref != 0 {
                                        dictionary.1.insert(value.r#ref, (value.r#type, value.series_id.clone()));
                                    }
                                    let kind = kind_from_proto(value.r#type).unwrap();
                                    let aggregate = Aggregate::from_proto(&value.aggregate.unwrap()).unwrap();
                                    let window = batch.window_start_ms;
                                    received.partials.push((window, kind, value.series_id.clone(), aggregate.clone()));
                                    match received.series.entry((kind, value.series_id)) {
                                        std::collections::hash_map::Entry::Occupied(mut slot) => {
                                            let _ = slot.get_mut().merge(&aggregate).unwrap();
                                        }
                                        std::collections::hash_map::Entry::Vacant(slot) => {
                                            slot.insert(aggregate);
                                        }
                                    }
                                }
                            }
                        }
                        let ack = Ack {
                            sequence: batch.sequence,
                            status: status as i32,
                            message: String::new(),
                            reason: if status == AckStatus::Permanent { "not_owner".into() } else { String::new() },
                        };
                        let frame = Frame { body: Some(Body::Ack(ack)) };
                        if framing::write_frame(&mut stream, &frame, DEFAULT_MAX_FRAME_BYTES).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        receiver
    }

    pub fn counter(&self, id: &str) -> Option<f64> {
        self.received
            .lock()
            .unwrap()
            .series
            .get(&(MetricKind::Counter, id.as_bytes().to_vec()))
            .and_then(Aggregate::counter)
    }

    pub fn get(&self, kind: MetricKind, id: &str) -> Option<Aggregate> {
        self.received.lock().unwrap().series.get(&(kind, id.as_bytes().to_vec())).cloned()
    }

    pub fn series_count(&self) -> usize {
        self.received.lock().unwrap().series.len()
    }
}
