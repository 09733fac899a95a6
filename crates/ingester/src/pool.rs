//! The fixed worker pool of one target: a dispatcher thread and `workers` long-lived tasks.
//!
//! ```text
//! queue reader ──▶ dispatcher thread ──┬─▶ channel 0 ──▶ worker 0 ─┐
//!   (records)      split by series     ├─▶ channel 1 ──▶ worker 1 ─┼─▶ sink (paced by
//!                  shard, in chunks of ├─▶ ...                     │   AdaptiveLimit + Pace)
//!                  max_samples_per_req └─▶ channel N ──▶ worker N ─┘
//! ```
//!
//! Everything is created once, at start; nothing is spawned per batch or per request.
//! The dispatcher reads records from the queue in order and gives every sample to worker
//! `hash(labels) % workers`, in requests of at most `max_samples_per_request`, round-robin
//! over the workers' bounded channels. Each worker sends its requests one at a time, in
//! order, so the samples of one series reach storage in time order (Prometheus refuses
//! an older sample after a newer one), while a slow request holds up only its own worker;
//! the dispatcher waits only when that worker's channel is full.
//!
//! A request that reached storage (or was refused for good) is appended to the queue's
//! done log, and the end-to-end latency (`now − tile end`) is recorded for the tiles it
//! carried: the record's tiles in proportion to the request's share of the record's
//! samples, the rest with the record's last request, so every tile is counted once. With
//! one sample per tile (counters, gauges, sets) that is exact; a timer tile's samples may
//! travel in several requests, so its latency is approximate (counted proportionally). When the
//! last request of a record is done the record is complete and its segment may be deleted. After a restart, requests the done log lists are skipped, so
//! only what was in flight at the crash is sent again, with the same values. The split is
//! fingerprinted (worker count, request size); after a change of either, replayed records
//! are sent whole.
//!
//! - [`pacing`]: the adaptive in-flight limit and the samples/s ceiling every worker
//!   obeys.
//! - [`worker`]: one worker's loop: pace, send, retry with backoff, complete.

mod metrics;
pub mod pacing;
pub mod worker;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use tessera_runtime::Shutdown;
use tessera_runtime::daemon::{ThreadError, spawn_thread};
use tokio::sync::mpsc;

use crate::queue::record::{self, StoredSample};
use crate::queue::{Queue, QueueReader, RequestKey};
use crate::sink::rejected::RejectedLog;
use crate::sink::{RecordInfo, Sink, SinkRequest};
pub use metrics::{PoolMetrics, TargetMetrics};
use pacing::{AdaptiveLimit, Pace};

/// How a pool splits and retries.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Long-lived workers (and channels).
    pub workers: usize,
    /// Requests each worker's channel holds.
    pub channel_requests: usize,
    /// Most samples in one request.
    pub max_samples_per_request: usize,
    /// First retry delay; doubles per attempt, with jitter.
    pub retry_initial_backoff: Duration,
    /// Longest retry delay.
    pub retry_max_backoff: Duration,
}

/// What a pool's workers share.
pub struct Target<S> {
    /// The target's name (`default` or a storage policy).
    pub name: String,
    /// Where samples go.
    pub sink: Arc<S>,
    /// The adaptive in-flight limit.
    pub limit: AdaptiveLimit,
    /// The samples/s ceiling.
    pub pace: Pace,
    /// Metric handles.
    pub metrics: TargetMetrics,
    /// Where refused samples are logged.
    pub rejected: Arc<RejectedLog>,
    /// Completion goes here.
    pub queue: Queue,
    /// Whether this ingester may write now (always, without a placement).
    pub fence: Arc<crate::tier::Fence>,
}

/// One request with the record it belongs to.
pub struct WorkItem {
    /// The request.
    pub request: SinkRequest,
    /// Shared by the record's requests: counts them down.
    pub ticket: Arc<Ticket>,
}

/// Completion state of one record, shared by its requests.
pub struct Ticket {
    outstanding: AtomicUsize,
    started: AtomicBool,
    /// Samples in the record's requests (those sent in this run).
    samples: usize,
    /// Tiles already counted in the end-to-end latency.
    tiles_reported: AtomicU64,
}

impl Ticket {
    /// A ticket for `requests` requests holding `samples` samples in all.
    pub fn new(requests: usize, samples: usize) -> Ticket {
        Ticket {
            outstanding: AtomicUsize::new(requests),
            started: AtomicBool::new(false),
            samples,
            tiles_reported: AtomicU64::new(0),
        }
    }
}

/// A running pool.
pub struct Pool {
    dispatcher: std::thread::JoinHandle<()>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

/// The fingerprint of a split, stored in the done log.
pub fn split_fingerprint(workers: usize, max_samples_per_request: usize) -> u32 {
    let mut bytes = [0u8; 17];
    bytes[0] = 1; // version of the split rule
    bytes[1..9].copy_from_slice(&(workers as u64).to_le_bytes());
    bytes[9..].copy_from_slice(&(max_samples_per_request as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes) as u32
}

/// The worker shard of a sample: by its series' labels, so that one series' samples go
/// out in order; a per-tile target's samples (no labels, each a series' tile as lines,
/// with no order to keep) by their text.
pub fn shard_of(sample: &StoredSample, workers: usize) -> usize {
    let key = if sample.labels.is_empty() { &sample.lines } else { &sample.labels };
    (xxhash_rust::xxh3::xxh3_64(key) % workers.max(1) as u64) as usize
}

/// Splits `samples` into requests: per shard, chunks of at most `max_per_request`, keyed
/// `(shard, chunk)`, in round-robin order over shards.
pub fn split(
    samples: Vec<StoredSample>,
    workers: usize,
    max_per_request: usize,
) -> Vec<(usize, u32, Vec<StoredSample>)> {
    let workers = workers.max(1);
    let max_per_request = max_per_request.max(1);
    let mut by_shard: Vec<Vec<StoredSample>> = vec![Vec::new(); workers];
    for sample in samples {
        by_shard[shard_of(&sample, workers)].push(sample);
    }
    let mut chunked: Vec<std::vec::IntoIter<Vec<StoredSample>>> = by_shard
        .into_iter()
        .map(|samples| {
            // Each chunk is allocated at its own size. (`split_off` would leave every chunk
            // holding the capacity of all the shard's samples after it: at a million
            // series, a record's chunks took eight times the memory of its samples.)
            let mut chunks = Vec::with_capacity(samples.len().div_ceil(max_per_request));
            let mut samples = samples.into_iter();
            while samples.len() > 0 {
                chunks.push(samples.by_ref().take(max_per_request).collect::<Vec<_>>());
            }
            chunks.into_iter()
        })
        .collect();
    let mut requests = Vec::new();
    let mut chunk = 0u32;
    loop {
        let before = requests.len();
        for (shard, chunks) in chunked.iter_mut().enumerate() {
            if let Some(samples) = chunks.next() {
                requests.push((shard, chunk, samples));
            }
        }
        if requests.len() == before {
            return requests;
        }
        chunk += 1;
    }
}

impl Pool {
    /// Starts the dispatcher thread and the workers of `target`. Must run inside a tokio
    /// runtime. The pool stops when `stop` fires and the queue is closed.
    pub fn start<S: Sink>(
        target: Target<S>,
        reader: QueueReader,
        settings: PoolSettings,
        stop: Shutdown,
    ) -> Result<Pool, ThreadError> {
        let target = Arc::new(target);
        let mut senders = Vec::with_capacity(settings.workers);
        let mut workers = Vec::with_capacity(settings.workers);
        for index in 0..settings.workers.max(1) {
            let (sender, receiver) = mpsc::channel(settings.channel_requests.max(1));
            senders.push(sender);
            workers.push(tokio::spawn(worker::run(index, target.clone(), receiver, settings.clone(), stop.clone())));
        }
        let name = format!("dispatch-{}", target.name);
        let dispatcher = spawn_thread(name, move || dispatch(reader, senders, target, settings))?;
        Ok(Pool { dispatcher, workers })
    }

    /// Waits for the dispatcher and the workers to stop; workers still busy after `grace`
    /// are abandoned (their records stay queued).
    pub async fn join(self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        for mut handle in self.workers {
            if tokio::time::timeout_at(deadline, &mut handle).await.is_err() {
                tracing::warn!("a worker was still busy after the shutdown grace period; its request stays queued");
                handle.abort();
            }
        }
        let dispatcher = self.dispatcher;
        let _ = tokio::task::spawn_blocking(move || dispatcher.join()).await;
    }
}

fn dispatch<S: Sink>(
    mut reader: QueueReader,
    senders: Vec<mpsc::Sender<WorkItem>>,
    target: Arc<Target<S>>,
    settings: PoolSettings,
) {
    let fingerprint = split_fingerprint(senders.len(), settings.max_samples_per_request);
    loop {
        let read = match reader.next_record() {
            Ok(Some(read)) => read,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(%error, target = target.name, "cannot read the queue; retrying in 1 s");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let position = read.position;
        let record = match record::decode_payload(read.payload) {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(%error, ?position, "queue record passed its checksum but does not decode; dropping it");
                target.queue.complete(position);
                continue;
            }
        };
        let (info, samples) = RecordInfo::split(record, position);
        let done: HashSet<(u32, u32)> = read
            .already_done
            .iter()
            .filter(|key| key.fingerprint == fingerprint)
            .map(|key| (key.shard, key.chunk))
            .collect();
        let requests: Vec<_> = split(samples, senders.len(), settings.max_samples_per_request)
            .into_iter()
            .filter(|(shard, chunk, _)| !done.contains(&(*shard as u32, *chunk)))
            .collect();
        if requests.is_empty() {
            // Nothing to send (no samples, or all done before a restart).
            target.queue.complete(position);
            continue;
        }
        let samples = requests.iter().map(|(_, _, samples)| samples.len()).sum();
        let ticket = Arc::new(Ticket::new(requests.len(), samples));
        for (shard, chunk, samples) in requests {
            let key = RequestKey { shard: shard as u32, chunk, fingerprint };
            let item = WorkItem { request: SinkRequest { record: info.clone(), samples, key }, ticket: ticket.clone() };
            if senders[shard].blocking_send(item).is_err() {
                // The workers have stopped (shutdown): the record stays queued.
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn sample(labels: &str, lines: &str) -> StoredSample {
        StoredSample {
            labels: Bytes::from(labels.to_owned()),
            lines: Bytes::from(lines.to_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn split_sends_each_sample_once_in_chunks_that_hold_only_their_own_samples() {
        let samples: Vec<StoredSample> = (0..10_000).map(|i| sample(&format!("series{i}"), "")).collect();
        let requests = split(samples.clone(), 4, 300);
        let mut seen: Vec<Bytes> = Vec::new();
        for (shard, _, chunk) in &requests {
            assert!(!chunk.is_empty() && chunk.len() <= 300, "{}", chunk.len());
            assert_eq!(chunk.capacity(), chunk.len(), "a chunk is allocated at its own size");
            assert!(chunk.iter().all(|sample| shard_of(sample, 4) == *shard));
            seen.extend(chunk.iter().map(|sample| sample.labels.clone()));
        }
        seen.sort();
        let mut expected: Vec<Bytes> = samples.iter().map(|sample| sample.labels.clone()).collect();
        expected.sort();
        assert_eq!(seen, expected);
        let first: Vec<(usize, u32)> = requests.iter().take(4).map(|(shard, chunk, _)| (*shard, *chunk)).collect();
        assert_eq!(first, vec![(0, 0), (1, 0), (2, 0), (3, 0)], "round robin over shards, chunk 0 first");
    }

    #[test]
    fn per_tile_samples_spread_over_the_workers_by_their_text() {
        let samples: Vec<StoredSample> = (0..1000).map(|i| sample("", &format!("stats.a{i} 1 10\n"))).collect();
        let mut per_shard = [0usize; 4];
        for sample in &samples {
            per_shard[shard_of(sample, 4)] += 1;
        }
        assert!(per_shard.iter().all(|&count| count > 150), "{per_shard:?}");
        assert_eq!(shard_of(&samples[7], 4), shard_of(&samples[7].clone(), 4), "the same text, the same worker");
    }
}
