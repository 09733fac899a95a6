//! The ingester client: one bounded [`OutboundQueue`] and one long-lived
//! sender task ([`sender::run_sender`]) per configured endpoint.
//!
//! Every batch of one closed tile goes to the same endpoint, chosen when
//! the tile is flushed: the connected endpoint with the fewest bytes
//! queued (any endpoint when none is connected). The tile goes out in one
//! burst; pacing writes to storage is the ingester's job.
//!
//! Backpressure: [`Ingesters::has_room`] is false once every queue is at
//! its bound, and the tiler then refuses collectors' batches as
//! `retryable` (`buffer_full`) instead of accepting data it could not
//! deliver. A tile that closes into a full queue still goes in, pushing out
//! the oldest batches (dropped and counted).
//!
//! The queue and sender are the shared sending side
//! ([`tessera_runtime::outbound`]), as in the collector's forwarding.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tessera_runtime::Shutdown;
use tessera_runtime::outbound::{self, Batch, DropReason, OutboundMetrics, SenderSettings};

use crate::metrics::{DestinationMetrics, Metrics};

/// One ingester endpoint's bounded buffer of framed tile batches.
pub type OutboundQueue = outbound::OutboundQueue<DestinationMetrics>;

/// A heartbeat for an idle ingester connection: an empty tile batch, sequence 0. The
/// ingester acknowledges it without queueing anything.
pub fn heartbeat_frame() -> Vec<u8> {
    let frame =
        tessera_proto::Frame { body: Some(tessera_proto::frame::Body::Tiles(tessera_proto::TileBatch::default())) };
    tessera_proto::framing::encode_frame(&frame, tessera_proto::framing::DEFAULT_MAX_FRAME_BYTES)
        .expect("an empty tile batch is far under the frame limit")
}

/// Keeps metric labels to a closed set whatever an ingester answers.
pub fn rejection_label(reason: &str) -> &'static str {
    match reason {
        "" => "unspecified",
        _ => REJECTION_LABELS.iter().find(|label| **label == reason).copied().unwrap_or("other"),
    }
}

/// Every `reason` of `ingester_rejected_batches_total`, exported at 0 for each destination.
pub const REJECTION_LABELS: [&str; 5] = ["malformed", "too_old", "too_large", "unspecified", "other"];

impl OutboundMetrics for DestinationMetrics {
    fn queued(&self, batches: usize, bytes: usize) {
        self.buffer_batches.set(batches as i64);
        self.buffer_bytes.set(bytes as i64);
    }

    fn dropped(&self, reason: DropReason, batches: u64, series: u64) {
        let reason = match reason {
            DropReason::Overflow => "buffer_full",
            DropReason::Rejected => "rejected",
            DropReason::Unexpandable => "expansion_failed",
        };
        DestinationMetrics::dropped(self, reason, batches, series);
    }

    fn connect_error(&self) {
        self.connect_errors.inc();
    }

    fn send_error(&self, reason: &'static str) {
        DestinationMetrics::send_error(self, reason);
    }

    fn rejected(&self, reason: &'static str) {
        DestinationMetrics::rejected(self, reason);
    }

    fn delivered(&self, batch: &Batch, latency: Duration) {
        self.ack_latency.observe(latency.as_secs_f64());
        self.batches_sent.inc();
        self.bytes_sent.inc_by(batch.frame.len() as u64);
        self.series_sent.inc_by(batch.items);
    }
}

/// The queues of every ingester endpoint.
#[derive(Clone)]
pub struct Ingesters {
    queues: Arc<[Arc<OutboundQueue>]>,
    next: Arc<AtomicUsize>,
    /// Room a queue must have left to count as having room (one frame).
    headroom: usize,
}

impl Ingesters {
    /// One queue per endpoint, each bounded at `max_buffer_bytes`.
    pub fn new(endpoints: &[String], max_buffer_bytes: usize, metrics: &Metrics) -> Ingesters {
        let queues = endpoints
            .iter()
            .map(|endpoint| {
                Arc::new(OutboundQueue::new(endpoint.clone(), max_buffer_bytes, metrics.destination(endpoint)))
            })
            .collect();
        Ingesters { queues, next: Arc::default(), headroom: 0 }
    }

    /// A queue has room only while one more batch of `bytes` fits under its bound.
    /// Without it a queue kept just under its bound by dropping its oldest batches
    /// would never look full, and collectors would never be pushed back.
    pub fn reserving(mut self, bytes: usize) -> Ingesters {
        self.headroom = bytes;
        self
    }

    /// Spawns one sender per endpoint on the current runtime; they stop when `stop` fires.
    pub fn spawn_senders(&self, settings: &SenderSettings, stop: &Shutdown) {
        for queue in self.queues.iter() {
            tokio::spawn(outbound::run_sender(queue.clone(), settings.clone(), stop.clone()));
        }
    }

    /// Every queue.
    pub fn queues(&self) -> &[Arc<OutboundQueue>] {
        &self.queues
    }

    /// Whether some queue has room for one more batch under its bound.
    pub fn has_room(&self) -> bool {
        self.queues.iter().any(|queue| queue.has_room_for(self.headroom))
    }

    /// The queue the next tile goes to: connected first, then fewest bytes,
    /// ties taken in turn.
    pub fn pick(&self) -> &Arc<OutboundQueue> {
        &self.queues[self.pick_index()]
    }

    /// The index in [`queues`](Self::queues) of the queue [`pick`](Self::pick) would give.
    pub fn pick_index(&self) -> usize {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.queues.len();
        (0..count)
            .map(|offset| (start + offset) % count)
            .min_by_key(|&index| (!self.queues[index].is_connected(), self.queues[index].queued_bytes()))
            .expect("config validation requires at least one ingester endpoint")
    }

    /// Whether every queue is empty with nothing in flight.
    pub fn all_idle(&self) -> bool {
        self.queues.iter().all(|queue| queue.is_idle())
    }

    /// Drops what is still queued; returns the batches and series dropped.
    pub fn abandon_all(&self) -> (u64, u64) {
        self.queues.iter().map(|queue| queue.abandon()).fold((0, 0), |sum, one| (sum.0 + one.0, sum.1 + one.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sequence: u64, bytes: usize, series: u64) -> Batch {
        Batch { sequence, frame: vec![0; bytes], items: series, refs: None }
    }

    #[test]
    fn overflow_drops_the_oldest_batches_and_counts_them() {
        let metrics = Metrics::default();
        let queue = OutboundQueue::new("i:1".into(), 250, metrics.destination("i:1"));
        assert_eq!(queue.push_all(vec![batch(1, 100, 10), batch(2, 100, 20)]), 0);
        assert!(!queue.is_full());
        assert_eq!(queue.push_all(vec![batch(3, 100, 30)]), 10, "batch 1 dropped");
        assert_eq!((metrics.drops("buffer_full", "batches"), metrics.drops("buffer_full", "series")), (1, 10));
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        assert!(!queue.is_idle(), "a batch is in flight");
        queue.push_front(batch(2, 100, 20));
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        queue.finish_in_flight();
        assert_eq!(queue.pop_front().unwrap().sequence, 3);
        queue.finish_in_flight();
        assert!(queue.is_idle());
    }

    #[test]
    fn a_tile_bigger_than_the_bound_is_kept_whole() {
        let queue = OutboundQueue::new("i:1".into(), 150, Metrics::default().destination("i:1"));
        queue.push_all(vec![batch(1, 100, 1)]);
        assert_eq!(queue.push_all(vec![batch(2, 100, 2), batch(3, 100, 3)]), 1);
        assert!(queue.is_full());
        assert_eq!(queue.abandon(), (2, 5));
        assert_eq!(queue.queued_bytes(), 0);
    }

    #[test]
    fn tiles_go_to_the_connected_endpoint_with_the_least_queued() {
        let ingesters = Ingesters::new(&["a:1".into(), "b:1".into()], 1000, &Metrics::default());
        let [a, b] = [&ingesters.queues()[0], &ingesters.queues()[1]];
        a.set_connected(true);
        assert_eq!(ingesters.pick().endpoint(), "a:1");
        a.push_all(vec![batch(1, 600, 1)]);
        assert_eq!(ingesters.pick().endpoint(), "a:1", "b is not connected");
        b.set_connected(true);
        assert_eq!(ingesters.pick().endpoint(), "b:1");
        assert!(ingesters.has_room());
        a.push_all(vec![batch(2, 1000, 1)]);
        b.push_all(vec![batch(1, 1000, 1)]);
        assert!(!ingesters.has_room());
        assert_eq!(ingesters.abandon_all(), (2, 2));
    }
}
