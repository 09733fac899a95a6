//! Forwarding: one bounded queue and one sender task per destination
//! aggregator, the shared sending side of [`tessera_wire::outbound`].
//!
//! The flusher encodes each destination's share of a window into framed
//! batches and pushes them onto that destination's [`DestinationQueue`].
//! When a queue is full the **oldest** batches are dropped and counted
//! (`drops_total{reason="queue_full",unit="partials"}`), so a dead
//! aggregator costs bounded memory and the freshest data goes first when it
//! returns; a batch the aggregator refuses for good is counted by reason
//! and dropped (`reason="rejected"`). The counting is the wire's
//! ([`tessera_wire::metrics`]), the same as the aggregator's towards ingesters.

use tessera_wire::metrics::DestinationMetrics;
use tessera_wire::outbound::OutboundQueue;

pub mod dictionary;

/// One destination aggregator's bounded queue.
pub type DestinationQueue = OutboundQueue<DestinationMetrics>;

#[cfg(test)]
mod tests {
    use tessera_wire::outbound::Batch;

    use super::*;
    use crate::metrics::Metrics;

    fn batch(sequence: u64, bytes: usize, partials: u64) -> Batch {
        Batch { sequence, frame: vec![0; bytes], items: partials, refs: None }
    }

    #[test]
    fn a_full_queue_drops_the_oldest_batches_first() {
        let queue = DestinationQueue::new("a:1".into(), 250, Metrics::default().destination("a"));
        assert_eq!(queue.push(batch(1, 100, 10)), 0);
        assert_eq!(queue.push(batch(2, 100, 20)), 0);
        assert_eq!(queue.push(batch(3, 100, 30)), 10, "batch 1 dropped");
        assert_eq!(queue.pop_front().unwrap().sequence, 2);
        assert_eq!(queue.pop_front().unwrap().sequence, 3);
        assert!(queue.pop_front().is_none());
    }

    #[test]
    fn a_batch_larger_than_the_bound_is_still_kept_alone() {
        let queue = DestinationQueue::new("a:1".into(), 50, Metrics::default().destination("a"));
        queue.push(batch(1, 100, 1));
        assert_eq!(queue.abandon().1, 1);
    }
}
