//! The outbound side: each window routed by shard to the aggregators that
//! own it, encoded, and sent through one bounded queue and one sender task
//! per destination aggregator (the shared sending side of
//! [`tessera_wire::run_sender`]).
//!
//! ```text
//!  flusher ──open / route_series / close_window──▶ Router (route.rs)
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

use tessera_wire::SenderSettings;

pub use route::Router;
pub use tessera_wire::DestinationQueue;

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

/// Every aggregator the router has routed to, each with its queue and sender
/// ([`tessera_wire::Destinations`]), shared with the daemon so that shutdown can wait for
/// their queues to drain.
pub type Destinations = tessera_wire::Destinations<DestinationKey>;

#[cfg(test)]
mod tests {
    use tessera_wire::Batch;

    use super::*;
    use crate::metrics::Metrics;

    fn batch(sequence: u64, bytes: usize, partials: u64) -> Batch {
        Batch { sequence, frame: vec![0; bytes], items: partials, refs: None, owner_refused: false }
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
