//! The listener's and the senders' metrics; see the crate docs, *Metrics*.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_proto::AckReason;
use tessera_runtime::telemetry::labels::ByReason;
use tessera_runtime::telemetry::{Drops, Registry, count_drops, latency_histogram, zeroed_family};

use crate::outbound::{Batch, DropReason, GenerationEnd, OutboundMetrics};

/// `{destination}`: the endpoint or instance a sender sends to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByDestination {
    destination: String,
}

/// `{destination, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByDestinationReason {
    destination: String,
    reason: String,
}

/// `{destination, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByDestinationResult {
    destination: String,
    result: &'static str,
}

/// Why a wire listener closed or refused a connection: the `reason` label of
/// `frame_errors_total`, one closed set for the aggregator's listener and the
/// ingester's, each exported at 0 from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Over `max_connections`: refused at once.
    TooManyConnections,
    /// No handshake within the deadline, or a failed one.
    Handshake,
    /// The TLS handshake failed.
    Tls,
    /// Silent for the idle deadline.
    IdleTimeout,
    /// A frame declared longer than `max_frame_bytes`.
    TooLarge,
    /// Reading or writing the stream failed.
    Io,
    /// Bytes that do not decode as a frame.
    MalformedFrame,
    /// A frame without a body.
    EmptyFrame,
    /// A frame of a kind this listener does not take.
    UnexpectedFrame,
}

impl CloseReason {
    /// Every reason, in the order they are exported.
    pub const ALL: [CloseReason; 9] = [
        CloseReason::TooManyConnections,
        CloseReason::Handshake,
        CloseReason::Tls,
        CloseReason::IdleTimeout,
        CloseReason::TooLarge,
        CloseReason::Io,
        CloseReason::MalformedFrame,
        CloseReason::EmptyFrame,
        CloseReason::UnexpectedFrame,
    ];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            CloseReason::TooManyConnections => "too_many_connections",
            CloseReason::Handshake => "handshake",
            CloseReason::Tls => "tls",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::TooLarge => "too_large",
            CloseReason::Io => "io",
            CloseReason::MalformedFrame => "malformed_frame",
            CloseReason::EmptyFrame => "empty",
            CloseReason::UnexpectedFrame => "unexpected_frame",
        }
    }
}

tessera_runtime::metrics! {
    /// A wire listener's metrics (an aggregator's for collectors, an ingester's for
    /// aggregators).
    pub struct ListenerMetrics {
        /// Open wire connections
        pub connections: Gauge,
        /// Wire connections accepted
        pub connections_accepted: Counter,
        /// Failed accept calls on the wire listener
        pub accept_errors: Counter,
        /// Wire connections closed for an error or refused, per reason (tls: the TLS handshake
        /// failed, e.g. no valid client certificate)
        frame_errors: Family<ByReason, Counter> = zeroed_family(CloseReason::ALL.map(|reason| ByReason { reason: reason.as_str() })),
        /// The listener's TLS files that changed on disk but did not load (the previous
        /// certificates stay in use)
        pub listener_tls_reload_errors: Counter,
    }
}

impl ListenerMetrics {
    /// Counts a connection closed (or refused) for `reason`.
    pub fn frame_error(&self, reason: CloseReason) {
        self.frame_errors.get_or_create(&ByReason { reason: reason.as_str() }).inc();
    }
}

tessera_runtime::metrics! {
    /// Every destination's sender metrics.
    struct SenderFamilies {
        /// Connections lost while sending or awaiting an ack, per destination and reason
        send_errors: Family<ByDestinationReason, Counter>,
        /// Batches a destination refused for good, per destination and reason
        rejected_batches: Family<ByDestinationReason, Counter>,
        /// TLS handshakes with a destination that failed, per destination and reason (unknown_ca,
        /// expired, name_mismatch, bad_certificate, no_certificate, tls)
        tls_errors: Family<ByDestinationReason, Counter>,
        /// The senders' TLS files that changed on disk but did not load (the previous
        /// certificates stay in use)
        sender_tls_reload_errors: Counter;
        /// Each destination's queue and acknowledgements
        destinations: DestinationFamilies,
    }
}

tessera_runtime::labelled_metrics! {
    /// The sender metrics of each destination.
    struct DestinationFamilies;
    /// One destination's queue and acknowledgements.
    struct DestinationHandles by ByDestination {
        /// Batches acknowledged, per destination
        batches_sent: Counter = batches_sent,
        /// Bytes of acknowledged batches, per destination
        bytes_sent: Counter = bytes_sent,
        /// Batches waiting, per destination
        queue_batches: Gauge = queue_batches,
        /// Bytes waiting, per destination
        queue_bytes: Gauge = queue_bytes,
        /// Time from sending a batch to its acknowledgement, per destination
        ack_latency: Histogram = ack_latency [seconds] with latency_histogram,
        /// Failed connection attempts, per destination
        connect_errors: Counter = connect_errors,
    }
}

tessera_runtime::metrics! {
    /// The series dictionary of each destination, for senders that keep one.
    struct DictionaryFamilies {
        /// Series named in the current series dictionary of each destination
        dictionary_series: Family<ByDestination, Gauge>,
        /// Series dictionaries ended per destination, by why: connect (a new connection), dropped (a batch
        /// of it was dropped), rotated (too many idle series, a full dictionary, or the destination left
        /// the placement)
        dictionary_generations: Family<ByDestinationReason, Counter>,
        /// Batches encoded for an ended dictionary, re-encoded with full series ids before sending
        /// (result=ok) or dropped (result=error)
        batches_expanded: Family<ByDestinationResult, Counter>,
    }
}

/// What one daemon's batches hold, and how it counts them.
#[derive(Clone, Copy, Debug)]
pub struct Items {
    /// What a batch holds (`partials`, `series`): names `<unit>_sent_total` and is the
    /// `unit` of the items' drops.
    pub unit: &'static str,
    /// Also count dropped batches, as `unit="batches"`.
    pub count_batches: bool,
    /// The refusals destinations answer with, exported at 0 per destination.
    pub refusals: &'static [AckReason],
    /// The sender keeps series dictionaries (collectors): export their metrics.
    pub dictionaries: bool,
}

/// A daemon's sender metrics; [`destination`](Self::destination) gives one queue's handles.
#[derive(Clone)]
pub struct SenderMetrics {
    families: SenderFamilies,
    dictionaries: DictionaryFamilies,
    items_sent: Family<ByDestination, Counter>,
    items: Items,
}

impl SenderMetrics {
    /// Sender metrics for batches of `items`.
    pub fn new(items: Items) -> SenderMetrics {
        SenderMetrics {
            families: SenderFamilies::default(),
            dictionaries: DictionaryFamilies::default(),
            items_sent: Family::default(),
            items,
        }
    }

    /// Registers every metric as `prefix` + its name.
    pub fn register(&self, registry: &mut Registry, prefix: &str) {
        self.families.register(registry, prefix);
        registry.register(
            format!("{prefix}{}_sent", self.items.unit),
            format!("Items acknowledged ({}), per destination", self.items.unit),
            self.items_sent.clone(),
        );
        if self.items.dictionaries {
            self.dictionaries.register(registry, prefix);
        }
    }

    /// Handles for the queue and sender of `destination`; its drops are counted in `drops`.
    pub fn destination(&self, destination: &str, drops: &Drops) -> DestinationMetrics {
        let by_destination = ByDestination { destination: destination.to_owned() };
        let families = &self.families;
        for reason in AckReason::refusal_labels(self.items.refusals) {
            let by = ByDestinationReason { destination: destination.to_owned(), reason: reason.to_owned() };
            let _ = families.rejected_batches.get_or_create(&by);
        }
        DestinationMetrics {
            handles: families.destinations.handles(&by_destination),
            items_sent: self.items_sent.get_or_create(&by_destination).clone(),
            dictionary_series: self.dictionaries.dictionary_series.get_or_create(&by_destination).clone(),
            families: self.families.clone(),
            dictionaries: self.dictionaries.clone(),
            drops: drops.clone(),
            items: self.items,
            destination: destination.to_owned(),
        }
    }

    /// The counter of TLS files that changed and did not load.
    pub fn tls_reload_errors(&self) -> Counter {
        self.families.sender_tls_reload_errors.clone()
    }

    /// Dictionary generations of `destination` ended for `reason` so far.
    pub fn dictionary_generations_ended(&self, destination: &str, reason: &str) -> u64 {
        let by = ByDestinationReason { destination: destination.to_owned(), reason: reason.to_owned() };
        self.dictionaries.dictionary_generations.get_or_create(&by).get()
    }

    /// Batches of `destination` expanded (`ok`) or dropped unexpandable (`error`) so far.
    pub fn batches_expanded(&self, destination: &str, result: &'static str) -> u64 {
        let by = ByDestinationResult { destination: destination.to_owned(), result };
        self.dictionaries.batches_expanded.get_or_create(&by).get()
    }
}

/// Handles of one destination's queue and sender.
#[derive(Clone)]
pub struct DestinationMetrics {
    handles: DestinationHandles,
    items_sent: Counter,
    /// Series in the destination's current dictionary.
    pub dictionary_series: Gauge,
    families: SenderFamilies,
    dictionaries: DictionaryFamilies,
    drops: Drops,
    items: Items,
    destination: String,
}

impl DestinationMetrics {
    fn count(&self, family: &Family<ByDestinationReason, Counter>, reason: &str) {
        family
            .get_or_create(&ByDestinationReason { destination: self.destination.clone(), reason: reason.to_owned() })
            .inc();
    }

    /// Counts `batches` batches of `items` items dropped for `reason`.
    pub fn dropped(&self, reason: &'static str, batches: u64, items: u64) {
        if self.items.count_batches && batches > 0 {
            count_drops(&self.drops, reason, "batches", batches);
        }
        if items > 0 || !self.items.count_batches {
            count_drops(&self.drops, reason, self.items.unit, items);
        }
    }
}

impl OutboundMetrics for DestinationMetrics {
    fn queued(&self, batches: usize, bytes: usize) {
        self.handles.queue_batches.set(batches as i64);
        self.handles.queue_bytes.set(bytes as i64);
    }

    fn dropped(&self, reason: DropReason, batches: u64, items: u64) {
        let reason = match reason {
            DropReason::Overflow => "queue_full",
            DropReason::Rejected => "rejected",
            DropReason::Unexpandable => "expansion_failed",
        };
        DestinationMetrics::dropped(self, reason, batches, items);
    }

    fn connect_error(&self) {
        self.handles.connect_errors.inc();
    }

    fn tls_error(&self, reason: &'static str) {
        self.count(&self.families.tls_errors, reason);
    }

    fn send_error(&self, reason: &'static str) {
        self.count(&self.families.send_errors, reason);
    }

    fn rejected(&self, reason: &'static str) {
        self.count(&self.families.rejected_batches, reason);
    }

    fn delivered(&self, batch: &Batch, latency: Duration) {
        self.handles.ack_latency.observe(latency.as_secs_f64());
        self.handles.batches_sent.inc();
        self.handles.bytes_sent.inc_by(batch.frame.len() as u64);
        self.items_sent.inc_by(batch.items);
    }

    fn dictionary_ended(&self, why: GenerationEnd) {
        self.count(&self.dictionaries.dictionary_generations, why.as_str());
    }

    fn expanded(&self, result: Result<usize, ()>) {
        let result = if result.is_ok() { "ok" } else { "error" };
        let by = ByDestinationResult { destination: self.destination.clone(), result };
        self.dictionaries.batches_expanded.get_or_create(&by).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::AckStatus;
    use tessera_runtime::Telemetry;

    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        text.lines()
            .filter(|line| line.starts_with(name) && line.contains(labels))
            .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
    }

    /// Every reason a listener closes a connection for is exported at 0 from the start
    /// and counted under its own label.
    #[test]
    fn every_close_reason_is_exported_and_counted_under_its_own_label() {
        let telemetry = Telemetry::new("x", "test");
        let listener = ListenerMetrics::default();
        telemetry.with_registry(|registry| listener.register(registry, "tessera_x_"));
        let before = telemetry.encode().unwrap();
        for (counted, reason) in CloseReason::ALL.into_iter().enumerate() {
            let labels = format!("{{reason=\"{}\"}}", reason.as_str());
            assert_eq!(sample(&before, "tessera_x_frame_errors_total", &labels), Some(0.0), "{labels}");
            for _ in 0..=counted {
                listener.frame_error(reason);
            }
        }
        let after = telemetry.encode().unwrap();
        for (counted, reason) in CloseReason::ALL.into_iter().enumerate() {
            let labels = format!("{{reason=\"{}\"}}", reason.as_str());
            assert_eq!(sample(&after, "tessera_x_frame_errors_total", &labels), Some(counted as f64 + 1.0), "{labels}");
        }
    }

    /// Every permanent refusal either end can send is counted under its own label on the
    /// other side, exported at 0 from the start.
    #[test]
    fn every_refusal_a_destination_answers_is_counted_under_its_own_reason() {
        for (refusals, unit) in
            [(&AckReason::FROM_AGGREGATOR[..], "partials"), (&AckReason::FROM_INGESTER[..], "series")]
        {
            let telemetry = Telemetry::new("x", "test");
            let senders = SenderMetrics::new(Items { unit, count_batches: false, refusals, dictionaries: false });
            telemetry.with_registry(|registry| senders.register(registry, "tessera_x_"));
            let destination = senders.destination("d-1", &Family::default());
            let text = telemetry.encode().unwrap();
            let permanent: Vec<AckReason> =
                refusals.iter().copied().filter(|reason| reason.status() == AckStatus::Permanent).collect();
            assert!(!permanent.is_empty());
            for reason in &permanent {
                let labels = format!("reason=\"{}\"", reason.as_str());
                assert_eq!(sample(&text, "tessera_x_rejected_batches_total", &labels), Some(0.0), "{labels}");
                OutboundMetrics::rejected(&destination, AckReason::label(&reason.ack(1, String::new()).reason));
            }
            OutboundMetrics::rejected(&destination, AckReason::label("from_a_newer_peer"));
            let text = telemetry.encode().unwrap();
            for reason in &permanent {
                let labels = format!("reason=\"{}\"", reason.as_str());
                assert_eq!(sample(&text, "tessera_x_rejected_batches_total", &labels), Some(1.0), "{labels}");
            }
            let other = sample(&text, "tessera_x_rejected_batches_total", "reason=\"other\"");
            assert_eq!(other, Some(1.0), "only the unknown reason is `other`");
        }
    }

    #[test]
    fn drops_are_counted_in_the_daemons_units() {
        let drops = Drops::default();
        let get = |reason, unit| {
            drops.get_or_create(&tessera_runtime::telemetry::labels::ByReasonUnit { reason, unit }).get()
        };
        let items = Items { unit: "series", count_batches: true, refusals: &[], dictionaries: false };
        let destination = SenderMetrics::new(items).destination("d", &drops);
        OutboundMetrics::dropped(&destination, DropReason::Overflow, 2, 10);
        assert_eq!((get("queue_full", "batches"), get("queue_full", "series")), (2, 10));
        let items = Items { unit: "partials", count_batches: false, refusals: &[], dictionaries: true };
        let destination = SenderMetrics::new(items).destination("d", &drops);
        OutboundMetrics::dropped(&destination, DropReason::Rejected, 1, 7);
        assert_eq!((get("rejected", "batches"), get("rejected", "partials")), (0, 7));
    }
}
