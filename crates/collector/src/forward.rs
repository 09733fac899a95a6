//! Forwarding: one bounded queue and one sender task per destination
//! aggregator, the shared sending side of [`tessera_wire::outbound`].
//!
//! The flusher encodes each destination's share of a window into framed
//! batches and pushes them onto that destination's [`DestinationQueue`].
//! When a queue is full the **oldest** batches are dropped and counted
//! (`drops_total{reason="queue_full",unit="partials"}`), so a dead
//! aggregator costs bounded memory and the freshest data goes first when it
//! returns; a batch the aggregator refuses for good is counted by reason
//! and dropped (`reason="rejected"`).

use std::time::Duration;

use tessera_wire::outbound::{Batch, DropReason, GenerationEnd, OutboundMetrics, OutboundQueue};

use crate::metrics::DestinationMetrics;

/// One destination aggregator's bounded queue.
pub type DestinationQueue = OutboundQueue<DestinationMetrics>;

impl OutboundMetrics for DestinationMetrics {
    fn queued(&self, batches: usize, bytes: usize) {
        self.queue_batches.set(batches as i64);
        self.queue_bytes.set(bytes as i64);
    }

    fn dropped(&self, reason: DropReason, _batches: u64, partials: u64) {
        let reason = match reason {
            DropReason::Overflow => "queue_full",
            DropReason::Rejected => "rejected",
            DropReason::Unexpandable => "expansion_failed",
        };
        self.dropped_partials(reason, partials);
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

    fn dictionary_ended(&self, why: GenerationEnd) {
        DestinationMetrics::dictionary_ended(self, why.as_str());
    }

    fn expanded(&self, result: Result<usize, ()>) {
        DestinationMetrics::expanded(self, if result.is_ok() { "ok" } else { "error" });
    }

    fn delivered(&self, batch: &Batch, latency: Duration) {
        self.ack_latency.observe(latency.as_secs_f64());
        self.batches_sent.inc();
        self.bytes_sent.inc_by(batch.frame.len() as u64);
        self.partials_sent.inc_by(batch.items);
    }
}

#[cfg(test)]
mod tests {
    use tessera_proto::AckReason;

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
    fn every_refusal_an_aggregator_answers_is_counted_under_its_own_reason() {
        let telemetry = tessera_runtime::Telemetry::new("collector", "test");
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register(registry));
        let destination = metrics.destination("agg-1");
        let count = |text: &str, reason: &str| {
            let labels = format!("reason=\"{reason}\"");
            text.lines()
                .filter(|line| line.starts_with("tessera_collector_rejected_batches_total") && line.contains(&labels))
                .find_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        };
        let permanent: Vec<AckReason> = AckReason::FROM_AGGREGATOR
            .into_iter()
            .filter(|reason| reason.status() == tessera_proto::AckStatus::Permanent)
            .collect();
        let text = telemetry.encode().unwrap();
        for reason in &permanent {
            assert_eq!(count(&text, reason.as_str()), Some(0.0), "{} exported at 0", reason.as_str());
        }
        for reason in &permanent {
            OutboundMetrics::rejected(&destination, AckReason::label(&reason.ack(1, String::new()).reason));
        }
        let text = telemetry.encode().unwrap();
        for reason in &permanent {
            assert_eq!(count(&text, reason.as_str()), Some(1.0), "{}", reason.as_str());
        }
        assert_eq!(count(&text, "other"), Some(0.0));
    }

    #[test]
    fn a_batch_larger_than_the_bound_is_still_kept_alone() {
        let queue = DestinationQueue::new("a:1".into(), 50, Metrics::default().destination("a"));
        queue.push(batch(1, 100, 1));
        assert_eq!(queue.abandon().1, 1);
    }
}
