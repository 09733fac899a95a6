//! Every metric the collector exports, declared once.
//!
//! Hot paths hold cloned handles ([`ListenerMetrics`], [`DestinationMetrics`])
//! and add to them once per batch, never once per line.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tessera_core::parse::RejectReason;

type Labels = Vec<(&'static str, String)>;

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| (*key, (*value).to_owned())).collect()
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~26 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// The collector's metrics.
#[derive(Clone)]
pub struct Metrics {
    datagrams_received: Family<Labels, Counter>,
    bytes_received: Family<Labels, Counter>,
    lines_received: Family<Labels, Counter>,
    events_received: Family<Labels, Counter>,
    parse_errors: Family<Labels, Counter>,
    receive_errors: Family<Labels, Counter>,
    connections: Family<Labels, Gauge>,
    /// Kernel receive-queue drops per UDP socket, read from `/proc/net/udp`.
    pub kernel_drops: Family<Labels, Counter>,
    drops: Family<Labels, Counter>,
    /// Series in the last window cut (merged over every reader).
    pub active_series: Gauge,
    /// Series dropped from reader tables after being idle.
    pub series_expired: Counter,
    /// Gauge merges of reader partials whose order was ambiguous.
    pub gauge_order_ambiguous: Counter,
    /// How long merging and routing one window took.
    pub flush_duration: Histogram,
    /// How late a window was handed to forwarding after its end.
    pub flush_lag: Histogram,
    batches_sent: Family<Labels, Counter>,
    bytes_sent: Family<Labels, Counter>,
    partials_sent: Family<Labels, Counter>,
    queue_batches: Family<Labels, Gauge>,
    queue_bytes: Family<Labels, Gauge>,
    ack_latency: Family<Labels, Histogram>,
    connect_errors: Family<Labels, Counter>,
    send_errors: Family<Labels, Counter>,
    rejected_batches: Family<Labels, Counter>,
    dictionary_series: Family<Labels, Gauge>,
    dictionary_generations: Family<Labels, Counter>,
    batches_expanded: Family<Labels, Counter>,
    /// Receive buffer the kernel granted each UDP socket.
    pub udp_recv_buffer_bytes: Gauge,
    /// 1 when the kernel stamps every UDP datagram with its receive time
    /// (gauge order across readers is exact), 0 when they are stamped on reading.
    pub udp_receive_stamps: Gauge,
}

/// Why the flusher or a destination queue drops partials (`drops_total{unit="partials"}`).
pub const PARTIAL_DROP_REASONS: [&str; 5] = ["no_owner", "queue_full", "rejected", "expansion_failed", "shutdown"];

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            datagrams_received: Family::default(),
            bytes_received: Family::default(),
            lines_received: Family::default(),
            events_received: Family::default(),
            parse_errors: Family::default(),
            receive_errors: Family::default(),
            connections: Family::default(),
            kernel_drops: Family::default(),
            drops: Family::default(),
            active_series: Gauge::default(),
            series_expired: Counter::default(),
            gauge_order_ambiguous: Counter::default(),
            flush_duration: latency_histogram(),
            flush_lag: latency_histogram(),
            batches_sent: Family::default(),
            bytes_sent: Family::default(),
            partials_sent: Family::default(),
            queue_batches: Family::default(),
            queue_bytes: Family::default(),
            ack_latency: Family::new_with_constructor(latency_histogram),
            connect_errors: Family::default(),
            send_errors: Family::default(),
            rejected_batches: Family::default(),
            dictionary_series: Family::default(),
            dictionary_generations: Family::default(),
            batches_expanded: Family::default(),
            udp_recv_buffer_bytes: Gauge::default(),
            udp_receive_stamps: Gauge::default(),
        };
        // Every drop reason is exported from the start, at 0: "nothing dropped" reads
        // as 0, not as no data, so alerts and dashboards need no `or vector(0)`.
        for reason in PARTIAL_DROP_REASONS {
            let _ = metrics.drops.get_or_create(&labels(&[("reason", reason), ("unit", "partials")]));
        }
        metrics
    }
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "tessera_collector_datagrams_received",
            "Datagrams (or stream reads) received, per listener",
            self.datagrams_received.clone(),
        );
        r.register("tessera_collector_bytes_received", "Bytes received, per listener", self.bytes_received.clone());
        r.register(
            "tessera_collector_lines_received",
            "Metric lines accepted, per listener",
            self.lines_received.clone(),
        );
        r.register(
            "tessera_collector_events_received",
            "DogStatsD events and service checks recognised (not forwarded)",
            self.events_received.clone(),
        );
        r.register(
            "tessera_collector_parse_errors",
            "Lines rejected by the parser, per listener and reason",
            self.parse_errors.clone(),
        );
        r.register(
            "tessera_collector_receive_errors",
            "Receive (UDP, Unix) or accept (TCP) calls that failed, per listener",
            self.receive_errors.clone(),
        );
        r.register(
            "tessera_collector_connections",
            "Statsd TCP connections open, per listener",
            self.connections.clone(),
        );
        r.register(
            "tessera_collector_kernel_drops",
            "Datagrams the kernel dropped because a socket's receive queue was full",
            self.kernel_drops.clone(),
        );
        r.register("tessera_collector_drops", "Data dropped by the collector, per reason and unit", self.drops.clone());
        r.register(
            "tessera_collector_active_series",
            "Series in the last window, merged over every reader",
            self.active_series.clone(),
        );
        r.register(
            "tessera_collector_series_expired",
            "Idle series forgotten by reader tables",
            self.series_expired.clone(),
        );
        r.register(
            "tessera_collector_gauge_order_ambiguous",
            "Gauge partials of several readers merged without knowing the order of every line \
             (more than 16 delta stamps per gauge, reader and window, or two sets with one stamp)",
            self.gauge_order_ambiguous.clone(),
        );
        r.register(
            "tessera_collector_flush_duration_seconds",
            "Time to merge and route one window",
            self.flush_duration.clone(),
        );
        r.register(
            "tessera_collector_flush_lag_seconds",
            "Time from a window's end to its batches being queued",
            self.flush_lag.clone(),
        );
        r.register(
            "tessera_collector_batches_sent",
            "Partial batches acknowledged, per destination",
            self.batches_sent.clone(),
        );
        r.register(
            "tessera_collector_bytes_sent",
            "Bytes of acknowledged batches, per destination",
            self.bytes_sent.clone(),
        );
        r.register(
            "tessera_collector_partials_sent",
            "Series partials acknowledged, per destination",
            self.partials_sent.clone(),
        );
        r.register("tessera_collector_queue_batches", "Batches waiting per destination", self.queue_batches.clone());
        r.register("tessera_collector_queue_bytes", "Bytes waiting per destination", self.queue_bytes.clone());
        r.register(
            "tessera_collector_ack_latency_seconds",
            "Time from sending a batch to its acknowledgement",
            self.ack_latency.clone(),
        );
        r.register(
            "tessera_collector_connect_errors",
            "Failed connection attempts, per destination",
            self.connect_errors.clone(),
        );
        r.register(
            "tessera_collector_send_errors",
            "Connections lost while sending or awaiting an ack, per destination and reason",
            self.send_errors.clone(),
        );
        r.register(
            "tessera_collector_rejected_batches",
            "Batches a destination refused, per destination and reason",
            self.rejected_batches.clone(),
        );
        r.register(
            "tessera_collector_dictionary_series",
            "Series named in the current series dictionary of each destination",
            self.dictionary_series.clone(),
        );
        r.register(
            "tessera_collector_dictionary_generations",
            "Series dictionaries ended per destination, by why: connect (a new connection), dropped (a batch of it was dropped), rotated (too many idle series, a full dictionary, or the destination left the placement)",
            self.dictionary_generations.clone(),
        );
        r.register(
            "tessera_collector_batches_expanded",
            "Batches encoded for an ended dictionary, re-encoded with full series ids before sending (result=ok) or dropped (result=error)",
            self.batches_expanded.clone(),
        );
        r.register(
            "tessera_collector_udp_recv_buffer_bytes",
            "Receive buffer the kernel granted each UDP socket",
            self.udp_recv_buffer_bytes.clone(),
        );
        r.register(
            "tessera_collector_udp_receive_stamps",
            "1 when the kernel stamps each UDP datagram with its receive time (gauge lines keep their order across \
             reader threads), 0 when datagrams are stamped when read",
            self.udp_receive_stamps.clone(),
        );
    }

    /// Handles for one listener (`udp`, `tcp`, `unix`).
    pub fn listener(&self, listener: &str) -> ListenerMetrics {
        let by_listener = labels(&[("listener", listener)]);
        let mut parse_errors = Vec::with_capacity(RejectReason::ALL.len());
        for reason in RejectReason::ALL {
            parse_errors.push(
                self.parse_errors
                    .get_or_create(&labels(&[("listener", listener), ("reason", reason.as_str())]))
                    .clone(),
            );
        }
        let drops =
            |reason: &str, unit: &str| self.drops.get_or_create(&labels(&[("reason", reason), ("unit", unit)])).clone();
        ListenerMetrics {
            datagrams: self.datagrams_received.get_or_create(&by_listener).clone(),
            bytes: self.bytes_received.get_or_create(&by_listener).clone(),
            lines: self.lines_received.get_or_create(&by_listener).clone(),
            events: self.events_received.get_or_create(&by_listener).clone(),
            parse_errors,
            receive_errors: self.receive_errors.get_or_create(&by_listener).clone(),
            connections: self.connections.get_or_create(&by_listener).clone(),
            series_limit: drops("series_limit", "lines"),
            truncated: drops("truncated", "datagrams"),
            refused_connections: drops("too_many_connections", "connections"),
        }
    }

    /// Handles for one destination instance.
    pub fn destination(&self, instance: &str) -> DestinationMetrics {
        let by_destination = labels(&[("destination", instance)]);
        for reason in tessera_proto::AckReason::refusal_labels(&tessera_proto::AckReason::FROM_AGGREGATOR) {
            let _ = self.rejected_batches.get_or_create(&labels(&[("destination", instance), ("reason", reason)]));
        }
        DestinationMetrics {
            batches_sent: self.batches_sent.get_or_create(&by_destination).clone(),
            bytes_sent: self.bytes_sent.get_or_create(&by_destination).clone(),
            partials_sent: self.partials_sent.get_or_create(&by_destination).clone(),
            queue_batches: self.queue_batches.get_or_create(&by_destination).clone(),
            queue_bytes: self.queue_bytes.get_or_create(&by_destination).clone(),
            ack_latency: self.ack_latency.get_or_create(&by_destination).clone(),
            connect_errors: self.connect_errors.get_or_create(&by_destination).clone(),
            send_errors: self.send_errors.clone(),
            rejected: self.rejected_batches.clone(),
            dictionary_series: self.dictionary_series.get_or_create(&by_destination).clone(),
            dictionary_generations: self.dictionary_generations.clone(),
            batches_expanded: self.batches_expanded.clone(),
            instance: instance.to_owned(),
            drops: self.drops.clone(),
        }
    }

    /// Dictionary generations of `destination` ended for `reason` so far.
    pub fn dictionary_generations_ended(&self, destination: &str, reason: &str) -> u64 {
        self.dictionary_generations.get_or_create(&labels(&[("destination", destination), ("reason", reason)])).get()
    }

    /// Counts series partials dropped for `reason`.
    pub fn drop_partials(&self, reason: &str, partials: u64) {
        self.drops.get_or_create(&labels(&[("reason", reason), ("unit", "partials")])).inc_by(partials);
    }

    /// Sets the kernel drop counter of UDP socket `socket` to `total` (exported from the
    /// first poll, at 0 while nothing was dropped).
    pub fn record_kernel_drops(&self, socket: usize, previous: u64, total: u64) {
        let socket = socket.to_string();
        let counter = self.kernel_drops.get_or_create(&labels(&[("listener", "udp"), ("socket", &socket)]));
        if total > previous {
            counter.inc_by(total - previous);
        }
    }
}

/// Handles a reader thread adds its batch counts to.
#[derive(Clone)]
pub struct ListenerMetrics {
    datagrams: Counter,
    bytes: Counter,
    lines: Counter,
    events: Counter,
    parse_errors: Vec<Counter>,
    receive_errors: Counter,
    /// Connections open (TCP).
    connections: Gauge,
    /// Lines of new series refused because a reader's table was full.
    series_limit: Counter,
    /// Datagrams the kernel cut at the buffer size (their last line is lost).
    truncated: Counter,
    /// TCP connections refused over `tcp.max_connections`.
    refused_connections: Counter,
}

impl ListenerMetrics {
    /// Adds one batch's counts.
    pub fn add(&self, counts: &BatchCounts) {
        // A window can turn between counting a truncated datagram and counting it
        // received: every field is added on its own, none hides behind another.
        if counts.datagrams > 0 {
            self.datagrams.inc_by(counts.datagrams);
        }
        self.bytes.inc_by(counts.bytes);
        self.lines.inc_by(counts.lines);
        if counts.events > 0 {
            self.events.inc_by(counts.events);
        }
        for (counter, count) in self.parse_errors.iter().zip(counts.rejected) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if counts.series_limit > 0 {
            self.series_limit.inc_by(counts.series_limit);
        }
        if counts.truncated > 0 {
            self.truncated.inc_by(counts.truncated);
        }
    }

    /// Counts a failed receive (or accept) call.
    pub fn receive_error(&self) {
        self.receive_errors.inc();
    }
}

impl tessera_wire::inbound::InboundCounters for ListenerMetrics {
    fn accept_error(&self) {
        self.receive_errors.inc();
    }
    fn refused(&self) {
        self.refused_connections.inc();
    }
    fn opened(&self) {
        self.connections.inc();
    }
    fn closed(&self) {
        self.connections.dec();
    }
}

impl ListenerMetrics {
    /// Metric lines accepted so far (for tests and the status line).
    pub fn lines(&self) -> u64 {
        self.lines.get()
    }
}

/// Handles of one destination's sender.
#[derive(Clone)]
pub struct DestinationMetrics {
    /// Batches acknowledged.
    pub batches_sent: Counter,
    /// Bytes acknowledged.
    pub bytes_sent: Counter,
    /// Partials acknowledged.
    pub partials_sent: Counter,
    /// Batches queued.
    pub queue_batches: Gauge,
    /// Bytes queued.
    pub queue_bytes: Gauge,
    /// Send-to-ack time.
    pub ack_latency: Histogram,
    /// Failed connects.
    pub connect_errors: Counter,
    send_errors: Family<Labels, Counter>,
    rejected: Family<Labels, Counter>,
    drops: Family<Labels, Counter>,
    /// Series in the destination's current dictionary.
    pub dictionary_series: Gauge,
    dictionary_generations: Family<Labels, Counter>,
    batches_expanded: Family<Labels, Counter>,
    instance: String,
}

impl DestinationMetrics {
    /// Counts a batch the destination refused for good.
    pub fn rejected(&self, reason: &str) {
        self.rejected.get_or_create(&labels(&[("destination", &self.instance), ("reason", reason)])).inc();
    }

    /// Counts a connection lost while sending a batch or awaiting its ack.
    pub fn send_error(&self, reason: &str) {
        self.send_errors.get_or_create(&labels(&[("destination", &self.instance), ("reason", reason)])).inc();
    }

    /// Counts the end of a dictionary generation.
    pub fn dictionary_ended(&self, why: &str) {
        self.dictionary_generations.get_or_create(&labels(&[("destination", &self.instance), ("reason", why)])).inc();
    }

    /// Counts a batch expanded for an ended dictionary.
    pub fn expanded(&self, result: &str) {
        self.batches_expanded.get_or_create(&labels(&[("destination", &self.instance), ("result", result)])).inc();
    }

    /// Counts partials dropped on the way to this destination.
    pub fn dropped_partials(&self, reason: &str, partials: u64) {
        self.drops.get_or_create(&labels(&[("reason", reason), ("unit", "partials")])).inc_by(partials);
    }
}
/// Counts kept in locals while a batch is processed, added to the shared
/// metrics once per batch.
#[derive(Debug, Default)]
pub struct BatchCounts {
    /// Datagrams (or stream chunks) received.
    pub datagrams: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Metric lines accepted.
    pub lines: u64,
    /// Events and service checks.
    pub events: u64,
    /// Lines rejected, per reason.
    pub rejected: [u64; RejectReason::ALL.len()],
    /// Lines of new series refused because the table is full.
    pub series_limit: u64,
    /// Datagrams the kernel truncated.
    pub truncated: u64,
}

#[cfg(test)]
mod naming {
    #[test]
    fn every_exported_metric_follows_the_naming_rule() {
        let telemetry = tessera_runtime::Telemetry::new("collector", "test");
        telemetry.with_registry(|registry| super::Metrics::default().register(registry));
        let families = tessera_runtime::telemetry::naming::check_registry(&telemetry, "collector");
        assert!(families.as_ref().is_ok_and(|count| *count >= 20), "{families:#?}");
    }
}
