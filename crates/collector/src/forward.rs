//! Forwarding: one bounded queue and one sender task per destination.
//!
//! The flusher encodes each destination's share of a window into framed
//! batches and pushes them onto that destination's [`DestinationQueue`].
//! The queue is bounded in bytes; when it is full the **oldest** batches
//! are dropped and counted, so a dead aggregator costs bounded memory and
//! the freshest data goes first when it returns. Each destination has one
//! long-lived sender task that connects (with backoff and jitter), performs
//! the handshake, and sends one batch at a time, waiting for its
//! acknowledgement: `ok` forgets it, `retryable` sends it again after a
//! backoff, `permanent` drops it and counts the reason. A broken connection
//! puts the unacknowledged batch back at the head of the queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_proto::{AckStatus, Role, client};
use tessera_runtime::backoff::{Backoff, sleep_or_stop};
use tessera_runtime::logging::error_chain;
use tessera_runtime::shutdown::Shutdown;
use tokio::sync::Notify;

use crate::metrics::DestinationMetrics;

/// Settings shared by every sender.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// This collector's id, sent in the handshake.
    pub source: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Acknowledgement timeout.
    pub ack_timeout: Duration,
    /// First reconnect delay.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
}

/// A framed batch waiting to be sent.
#[derive(Debug)]
pub struct QueuedBatch {
    /// Sequence written in the batch; the ack must carry it.
    pub sequence: u64,
    /// The whole frame, length prefix included.
    pub frame: Vec<u8>,
    /// Series partials in the batch.
    pub partials: u64,
}

struct QueueState {
    batches: VecDeque<QueuedBatch>,
    bytes: usize,
}

/// One destination's bounded queue.
pub struct DestinationQueue {
    state: Mutex<QueueState>,
    notify: Notify,
    next_sequence: AtomicU64,
    in_flight: AtomicBool,
    max_bytes: usize,
    metrics: DestinationMetrics,
}

impl DestinationQueue {
    /// An empty queue bounded at `max_bytes`.
    pub fn new(max_bytes: usize, metrics: DestinationMetrics) -> DestinationQueue {
        DestinationQueue {
            state: Mutex::new(QueueState { batches: VecDeque::new(), bytes: 0 }),
            notify: Notify::new(),
            next_sequence: AtomicU64::new(1),
            in_flight: AtomicBool::new(false),
            max_bytes,
            metrics,
        }
    }

    /// The sequence number for the next batch.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends a batch, dropping the oldest batches while the queue would
    /// exceed its bound. Returns the partials dropped.
    pub fn push(&self, batch: QueuedBatch) -> u64 {
        let dropped = {
            let mut state = self.state.lock().expect("queue lock poisoned");
            state.bytes += batch.frame.len();
            state.batches.push_back(batch);
            let dropped = Self::enforce_bound(&mut state, self.max_bytes);
            self.publish(&state);
            dropped
        };
        if dropped > 0 {
            self.metrics.dropped_partials("queue_full", dropped);
        }
        self.notify.notify_one();
        dropped
    }

    /// Puts a batch that failed back at the head (it is the oldest).
    fn push_front(&self, batch: QueuedBatch) {
        let dropped = {
            let mut state = self.state.lock().expect("queue lock poisoned");
            state.bytes += batch.frame.len();
            state.batches.push_front(batch);
            let dropped = Self::enforce_bound(&mut state, self.max_bytes);
            self.publish(&state);
            dropped
        };
        if dropped > 0 {
            self.metrics.dropped_partials("queue_full", dropped);
        }
    }

    fn enforce_bound(state: &mut QueueState, max_bytes: usize) -> u64 {
        let mut dropped = 0;
        while state.bytes > max_bytes && state.batches.len() > 1 {
            let oldest = state.batches.pop_front().expect("more than one batch queued");
            state.bytes -= oldest.frame.len();
            dropped += oldest.partials;
        }
        dropped
    }

    fn pop_front(&self) -> Option<QueuedBatch> {
        let mut state = self.state.lock().expect("queue lock poisoned");
        let batch = state.batches.pop_front()?;
        state.bytes -= batch.frame.len();
        self.in_flight.store(true, Ordering::Release);
        self.publish(&state);
        Some(batch)
    }

    fn publish(&self, state: &QueueState) {
        self.metrics.queue_batches.set(state.batches.len() as i64);
        self.metrics.queue_bytes.set(state.bytes as i64);
    }

    /// Whether nothing is queued or in flight.
    pub fn is_idle(&self) -> bool {
        let state = self.state.lock().expect("queue lock poisoned");
        state.batches.is_empty() && !self.in_flight.load(Ordering::Acquire)
    }

    /// Batches and partials still queued (or in flight), dropped and
    /// counted when the daemon exits before delivering them.
    pub fn abandon(&self) -> u64 {
        let mut state = self.state.lock().expect("queue lock poisoned");
        let partials = state.batches.drain(..).map(|batch| batch.partials).sum();
        state.bytes = 0;
        self.publish(&state);
        partials
    }
}

/// The sender task of one destination; returns when `stop` fires.
pub async fn run_sender(endpoint: String, queue: Arc<DestinationQueue>, settings: SenderSettings, stop: Shutdown) {
    let mut backoff = Backoff::new(settings.reconnect_min, settings.reconnect_max);
    loop {
        if !wait_for_work(&queue, &stop).await {
            return;
        }
        let connecting = client::connect(&endpoint, Role::Collector, &settings.source, settings.connect_timeout);
        let mut stream = match connecting.await {
            Ok(stream) => stream,
            Err(error) => {
                queue.metrics.connect_errors.inc();
                tracing::warn!(%endpoint, error = %error_chain(&error), "cannot reach aggregator; will retry");
                if !sleep_or_stop(backoff.next_delay(), &stop).await {
                    return;
                }
                continue;
            }
        };
        tracing::info!(%endpoint, "connected to aggregator");
        backoff.reset();
        let mut scratch = Vec::new();
        loop {
            if !wait_for_work(&queue, &stop).await {
                return;
            }
            let Some(batch) = queue.pop_front() else { continue };
            let started = Instant::now();
            match client::exchange(&mut stream, &batch.frame, batch.sequence, &mut scratch, settings.ack_timeout).await
            {
                Ok(ack) => {
                    queue.in_flight.store(false, Ordering::Release);
                    match AckStatus::try_from(ack.status).unwrap_or(AckStatus::Unspecified) {
                        AckStatus::Ok => {
                            let metrics = &queue.metrics;
                            metrics.ack_latency.observe(started.elapsed().as_secs_f64());
                            metrics.batches_sent.inc();
                            metrics.bytes_sent.inc_by(batch.frame.len() as u64);
                            metrics.partials_sent.inc_by(batch.partials);
                            backoff.reset();
                        }
                        AckStatus::Retryable => {
                            tracing::debug!(%endpoint, reason = %ack.reason, "batch refused for now; retrying");
                            queue.push_front(batch);
                            if !sleep_or_stop(backoff.next_delay(), &stop).await {
                                return;
                            }
                        }
                        AckStatus::Permanent | AckStatus::Unspecified => {
                            let reason = if ack.reason.is_empty() { "unspecified" } else { ack.reason.as_str() };
                            tracing::warn!(%endpoint, reason, message = %ack.message, partials = batch.partials, "batch rejected");
                            queue.metrics.rejected(closed_reason(reason));
                            queue.metrics.dropped_partials("rejected", batch.partials);
                        }
                    }
                }
                Err(error) => {
                    queue.metrics.send_error(error.reason());
                    tracing::warn!(%endpoint, error = %error_chain(&error), "connection to aggregator lost; reconnecting");
                    queue.push_front(batch);
                    queue.in_flight.store(false, Ordering::Release);
                    break;
                }
            }
        }
    }
}

/// Keeps metric labels to a closed set whatever a peer answers.
fn closed_reason(reason: &str) -> &'static str {
    match reason {
        "not_owner" => "not_owner",
        "malformed" => "malformed",
        "too_late" => "too_late",
        "too_early" => "too_early",
        _ => "other",
    }
}

async fn wait_for_work(queue: &DestinationQueue, stop: &Shutdown) -> bool {
    loop {
        if stop.is_triggered() {
            return false;
        }
        if !queue.state.lock().expect("queue lock poisoned").batches.is_empty() {
            return true;
        }
        tokio::select! {
            () = queue.notify.notified() => {}
            () = stop.wait() => return false,
            // A notification can race the check above; look again now and then.
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn batch(sequence: u64, bytes: usize, partials: u64) -> QueuedBatch {
        QueuedBatch { sequence, frame: vec![0; bytes], partials }
    }

    #[test]
    fn a_full_queue_drops_the_oldest_batches_first() {
        let queue = DestinationQueue::new(250, Metrics::default().destination("a"));
        assert_eq!(queue.push(batch(1, 100, 10)), 0);
        assert_eq!(queue.push(batch(2, 100, 20)), 0);
        assert_eq!(queue.push(batch(3, 100, 30)), 10, "batch 1 dropped");
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        assert_eq!(queue.pop_front().unwrap().sequence, 3);
        assert!(queue.pop_front().is_none());
    }

    #[test]
    fn a_batch_larger_than_the_bound_is_still_kept_alone() {
        let queue = DestinationQueue::new(50, Metrics::default().destination("a"));
        queue.push(batch(1, 100, 1));
        assert_eq!(queue.abandon(), 1);
    }
}
