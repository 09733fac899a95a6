//! One ingester endpoint's bounded buffer of framed tile batches.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::metrics::DestinationMetrics;

/// A framed batch waiting to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Sequence written in the batch; the ack must carry it.
    pub sequence: u64,
    /// The whole frame, length prefix included.
    pub frame: Vec<u8>,
    /// Series values in the batch.
    pub series: u64,
}

#[derive(Default)]
struct State {
    batches: VecDeque<Outgoing>,
    bytes: usize,
}

/// A FIFO of batches bounded in bytes. A push that overflows it drops the
/// **oldest** batches (never the one pushed), counted as `buffer_full`.
pub struct OutboundQueue {
    endpoint: String,
    state: Mutex<State>,
    /// Bytes queued, readable without the lock (for admission checks).
    bytes: AtomicUsize,
    notify: Notify,
    next_sequence: AtomicU64,
    in_flight: AtomicBool,
    connected: AtomicBool,
    max_bytes: usize,
    pub(crate) metrics: DestinationMetrics,
}

impl OutboundQueue {
    /// An empty queue for `endpoint` bounded at `max_bytes`.
    pub fn new(endpoint: String, max_bytes: usize, metrics: DestinationMetrics) -> OutboundQueue {
        OutboundQueue {
            endpoint,
            state: Mutex::new(State::default()),
            bytes: AtomicUsize::new(0),
            notify: Notify::new(),
            next_sequence: AtomicU64::new(1),
            in_flight: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            max_bytes,
            metrics,
        }
    }

    /// The endpoint this queue sends to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The sequence number for the next batch.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// Bytes queued now.
    pub fn queued_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Whether the queue is at or over its bound.
    pub fn is_full(&self) -> bool {
        self.queued_bytes() >= self.max_bytes
    }

    /// Whether the sender holds a working connection.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// Appends `batches`, then drops the oldest batches while over the
    /// bound (never one of those just pushed). Returns the series dropped.
    pub fn push_all(&self, batches: Vec<Outgoing>) -> u64 {
        let (dropped_batches, dropped_series) = {
            let mut state = self.lock();
            let keep = batches.len();
            for batch in batches {
                state.bytes += batch.frame.len();
                state.batches.push_back(batch);
            }
            let dropped = Self::enforce_bound(&mut state, self.max_bytes, keep);
            self.publish(&state);
            dropped
        };
        self.metrics.dropped("buffer_full", dropped_batches, dropped_series);
        self.notify.notify_one();
        dropped_series
    }

    /// Puts a batch that could not be delivered back at the head.
    pub(crate) fn push_front(&self, batch: Outgoing) {
        let (dropped_batches, dropped_series) = {
            let mut state = self.lock();
            state.bytes += batch.frame.len();
            state.batches.push_front(batch);
            let dropped = Self::enforce_bound(&mut state, self.max_bytes, 1);
            self.publish(&state);
            dropped
        };
        self.in_flight.store(false, Ordering::Release);
        self.metrics.dropped("buffer_full", dropped_batches, dropped_series);
    }

    /// Drops the oldest batches until the queue fits `max_bytes`, keeping at
    /// least `keep` batches (the newest).
    fn enforce_bound(state: &mut State, max_bytes: usize, keep: usize) -> (u64, u64) {
        let (mut batches, mut series) = (0, 0);
        while state.bytes > max_bytes && state.batches.len() > keep.max(1) {
            let Some(oldest) = state.batches.pop_front() else { break };
            state.bytes -= oldest.frame.len();
            batches += 1;
            series += oldest.series;
        }
        (batches, series)
    }

    /// Takes the oldest batch and marks it in flight.
    pub(crate) fn pop_front(&self) -> Option<Outgoing> {
        let mut state = self.lock();
        let batch = state.batches.pop_front()?;
        state.bytes -= batch.frame.len();
        self.in_flight.store(true, Ordering::Release);
        self.publish(&state);
        Some(batch)
    }

    /// The batch in flight is done with (acknowledged or dropped).
    pub(crate) fn finish_in_flight(&self) {
        self.in_flight.store(false, Ordering::Release);
    }

    /// Whether any batch is waiting.
    pub(crate) fn has_batches(&self) -> bool {
        !self.lock().batches.is_empty()
    }

    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Whether nothing is queued or in flight.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.batches.is_empty() && !self.in_flight.load(Ordering::Acquire)
    }

    /// Empties the queue (at shutdown); returns the batches and series dropped.
    pub fn abandon(&self) -> (u64, u64) {
        let mut state = self.lock();
        let batches = state.batches.len() as u64;
        let series = state.batches.drain(..).map(|batch| batch.series).sum();
        state.bytes = 0;
        self.publish(&state);
        (batches, series)
    }

    fn publish(&self, state: &State) {
        self.bytes.store(state.bytes, Ordering::Relaxed);
        self.metrics.buffer_batches.set(state.batches.len() as i64);
        self.metrics.buffer_bytes.set(state.bytes as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section leaves the state consistent, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn batch(sequence: u64, bytes: usize, series: u64) -> Outgoing {
        Outgoing { sequence, frame: vec![0; bytes], series }
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
}
