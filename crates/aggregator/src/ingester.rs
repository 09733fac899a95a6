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
//! The queue and sender mirror the collector's forwarding
//! (`tessera_collector::forward`) with a different payload and role; both
//! are written so that one generic "bounded queue + sender" module could
//! serve them.

pub mod queue;
pub mod sender;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_runtime::Shutdown;

use crate::metrics::Metrics;
pub use queue::{OutboundQueue, Outgoing};
pub use sender::SenderSettings;

/// The queues of every ingester endpoint.
#[derive(Clone)]
pub struct Ingesters {
    queues: Arc<[Arc<OutboundQueue>]>,
    next: Arc<AtomicUsize>,
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
        Ingesters { queues, next: Arc::default() }
    }

    /// Spawns one sender per endpoint on the current runtime; they stop when `stop` fires.
    pub fn spawn_senders(&self, settings: &SenderSettings, stop: &Shutdown) {
        for queue in self.queues.iter() {
            tokio::spawn(sender::run_sender(queue.clone(), settings.clone(), stop.clone()));
        }
    }

    /// Every queue.
    pub fn queues(&self) -> &[Arc<OutboundQueue>] {
        &self.queues
    }

    /// Whether some queue is below its bound.
    pub fn has_room(&self) -> bool {
        self.queues.iter().any(|queue| !queue.is_full())
    }

    /// The queue the next tile goes to: connected first, then fewest bytes,
    /// ties taken in turn.
    pub fn pick(&self) -> &Arc<OutboundQueue> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.queues.len();
        (0..count)
            .map(|offset| &self.queues[(start + offset) % count])
            .min_by_key(|queue| (!queue.is_connected(), queue.queued_bytes()))
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

    #[test]
    fn tiles_go_to_the_connected_endpoint_with_the_least_queued() {
        let ingesters = Ingesters::new(&["a:1".into(), "b:1".into()], 1000, &Metrics::default());
        let [a, b] = [&ingesters.queues()[0], &ingesters.queues()[1]];
        a.set_connected(true);
        assert_eq!(ingesters.pick().endpoint(), "a:1");
        a.push_all(vec![Outgoing { sequence: 1, frame: vec![0; 600], series: 1 }]);
        assert_eq!(ingesters.pick().endpoint(), "a:1", "b is not connected");
        b.set_connected(true);
        assert_eq!(ingesters.pick().endpoint(), "b:1");
        assert!(ingesters.has_room());
        a.push_all(vec![Outgoing { sequence: 2, frame: vec![0; 1000], series: 1 }]);
        b.push_all(vec![Outgoing { sequence: 1, frame: vec![0; 1000], series: 1 }]);
        assert!(!ingesters.has_room());
        assert_eq!(ingesters.abandon_all(), (2, 2));
    }
}
