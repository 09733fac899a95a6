//! The outbound side: each window routed by shard to the aggregators that
//! own it, encoded, and sent through one bounded queue and one sender task
//! per destination aggregator (the shared sending side of
//! [`tessera_wire::run_sender`]).
//!
//! ```text
//!  flusher ──route_window(window, watermark)──▶ Router (route.rs)
//!                                                 │ shard ─▶ owners; encode once per owner,
//!                                                 │ by dictionary ref when on (dictionary.rs)
//!                          ┌──────────────────────┼──────────────────────┐
//!                          ▼                      ▼                      ▼
//!                 DestinationQueue ─▶ sender   queue ─▶ sender       queue ─▶ sender ──▶ aggregators
//!                          (bounded, oldest dropped first; all kept in Destinations)
//! ```
//!
//! The router encodes each destination's share of a window into framed
//! batches and pushes them onto that destination's [`DestinationQueue`].
//! When a queue is full the **oldest** batches are dropped and counted
//! (`drops_total{reason="queue_full",unit="partials"}`), so a dead
//! aggregator costs bounded memory and the freshest data goes first when it
//! returns; a batch the aggregator refuses for good is counted by reason
//! and dropped (`reason="rejected"`). The counting is the wire's
//! ([`tessera_wire::SenderMetrics`]), the same as the aggregator's towards ingesters.

mod dictionary;
mod route;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tessera_runtime::shutdown::Shutdown;
use tessera_wire::{DestinationMetrics, Drops, SenderMetrics};
use tessera_wire::{OutboundQueue, SenderSettings, run_sender};

pub use route::Router;

/// One destination aggregator's bounded queue.
pub type DestinationQueue = OutboundQueue<DestinationMetrics>;

/// Settings of the outbound side.
#[derive(Clone)]
pub struct OutboundSettings {
    /// Window length, stamped on every batch.
    pub window_ms: i64,
    /// Largest frame to build.
    pub max_frame_bytes: usize,
    /// Bound of each destination queue.
    pub max_queue_bytes: usize,
    /// Name series by per-destination dictionary refs (`dictionary.rs`).
    pub series_dictionary: bool,
    /// Sender settings.
    pub sender: SenderSettings,
}

/// `(instance id, endpoint)`.
type DestinationKey = (String, String);

/// Every destination the router has routed to, shared with the daemon so
/// that shutdown can wait for their queues to drain.
#[derive(Clone, Default)]
pub struct Destinations {
    inner: Arc<Mutex<HashMap<DestinationKey, Arc<DestinationQueue>>>>,
}

impl Destinations {
    /// Whether every queue is empty with nothing in flight.
    pub fn all_idle(&self) -> bool {
        self.inner.lock().expect("destinations lock poisoned").values().all(|queue| queue.is_idle())
    }

    /// Drops what is still queued, returning the partials dropped.
    pub fn abandon_all(&self) -> u64 {
        self.inner.lock().expect("destinations lock poisoned").values().map(|queue| queue.abandon().1).sum()
    }

    /// Every queue, for tests to read what was queued.
    #[cfg(test)]
    pub fn queues(&self) -> Vec<Arc<DestinationQueue>> {
        self.inner.lock().expect("destinations lock poisoned").values().cloned().collect()
    }
}

/// Starts each destination's queue and sender task the first time it is
/// routed to, and keeps them in [`Destinations`].
struct Senders {
    destinations: Destinations,
    max_queue_bytes: usize,
    sender: SenderSettings,
    runtime: tokio::runtime::Handle,
    /// Stops every sender task.
    stop: Shutdown,
    metrics: SenderMetrics,
    /// Where the queues count what they drop.
    drops: Drops,
}

impl Senders {
    /// The queue of `instance` at `endpoint`, with its sender task started on first use.
    fn queue(&self, instance: &str, endpoint: &str) -> Arc<DestinationQueue> {
        let mut known = self.destinations.inner.lock().expect("destinations lock poisoned");
        let key = (instance.to_owned(), endpoint.to_owned());
        if let Some(queue) = known.get(&key) {
            return queue.clone();
        }
        let queue = Arc::new(DestinationQueue::new(
            endpoint.to_owned(),
            self.max_queue_bytes,
            self.metrics.destination(instance, &self.drops),
        ));
        let sender = run_sender(queue.clone(), self.sender.clone(), self.stop.clone());
        self.runtime.spawn(sender);
        known.insert(key, queue.clone());
        queue
    }
}

#[cfg(test)]
mod tests {
    use tessera_wire::Batch;

    use super::*;
    use crate::metrics::Metrics;

    fn batch(sequence: u64, bytes: usize, partials: u64) -> Batch {
        Batch { sequence, frame: vec![0; bytes], items: partials, refs: None }
    }

    #[test]
    fn a_full_queue_drops_the_oldest_batches_first() {
        let queue = DestinationQueue::new("a:1".into(), 250, {
            let metrics = Metrics::default();
            metrics.senders.destination("a", &metrics.drops)
        });
        assert_eq!(queue.push(batch(1, 100, 10)), 0);
        assert_eq!(queue.push(batch(2, 100, 20)), 0);
        assert_eq!(queue.push(batch(3, 100, 30)), 10, "batch 1 dropped");
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        assert_eq!(queue.pop_front().unwrap().sequence, 3);
        assert!(queue.pop_front().is_none());
    }

    #[test]
    fn a_batch_larger_than_the_bound_is_still_kept_alone() {
        let queue = DestinationQueue::new("a:1".into(), 50, {
            let metrics = Metrics::default();
            metrics.senders.destination("a", &metrics.drops)
        });
        queue.push(batch(1, 100, 1));
        assert_eq!(queue.abandon().1, 1);
    }
}
