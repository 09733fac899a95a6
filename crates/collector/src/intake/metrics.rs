//! The intake's metrics: what each listener received and refused, the UDP sockets'
//! kernel drops and buffers, and the series the readers' tables forgot.
//!
//! A reader thread holds its listener's [`ListenerMetrics`] and adds its
//! [`BatchCounts`] to them once per batch, never once per line.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tessera_core::parse::RejectReason;
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::labels::ByReasonUnit;

/// `{listener}`: `udp`, `tcp` or `unix`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByListener {
    listener: &'static str,
}

/// `{listener, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByListenerReason {
    listener: &'static str,
    reason: &'static str,
}

/// `{listener, socket}`: one UDP reader socket.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByListenerSocket {
    listener: &'static str,
    socket: String,
}

tessera_runtime::metrics! {
    /// The intake's metrics.
    pub struct IntakeMetrics {
        /// Lines rejected by the parser, per listener and reason
        parse_errors: Family<ByListenerReason, Counter>,
        /// Statsd stream connections refused, per listener and reason (too_many_connections)
        frame_errors: Family<ByListenerReason, Counter>,
        /// Datagrams the kernel dropped because a socket's receive queue was full
        kernel_drops: Family<ByListenerSocket, Counter>,
        /// Idle series forgotten by reader tables
        pub series_expired: Counter,
        /// Receive buffer the kernel granted each UDP socket
        pub udp_recv_buffer_bytes: Gauge,
        /// 1 when the kernel stamps each UDP datagram with its receive time (gauge lines keep their
        /// order across reader threads), 0 when datagrams are stamped when read
        pub udp_receive_stamps: Gauge;
        /// What each listener received
        listeners: ListenerFamilies,
    }
}

tessera_runtime::labelled_metrics! {
    /// The intake's metrics, per listener.
    struct ListenerFamilies;
    /// What one listener received.
    struct ListenerCounts by ByListener {
        /// Datagrams (or stream reads) received, per listener
        datagrams: Counter = datagrams_received,
        /// Bytes received, per listener
        bytes: Counter = bytes_received,
        /// Metric lines accepted, per listener
        lines: Counter = lines_received,
        /// DogStatsD events and service checks recognised (not forwarded)
        events: Counter = events_received,
        /// Malformed tags written in metric names (InfluxDB, Librato, SignalFx styles), skipped; their
        /// lines are kept (statsd_exporter's tag errors)
        name_tag_errors: Counter = name_tag_errors,
        /// Receive (UDP, Unix) or accept (TCP) calls that failed, per listener
        receive_errors: Counter = receive_errors,
        /// Statsd TCP connections open, per listener
        connections: Gauge = connections,
    }
}

impl IntakeMetrics {
    /// Handles for one listener (`udp`, `tcp`, `unix`); its lines and datagrams lost go to
    /// `drops`.
    pub fn listener(&self, listener: &'static str, drops: &Drops) -> ListenerMetrics {
        let mut parse_errors = Vec::with_capacity(RejectReason::ALL.len());
        for reason in RejectReason::ALL {
            let by = ByListenerReason { listener, reason: reason.as_str() };
            parse_errors.push(self.parse_errors.get_or_create(&by).clone());
        }
        let drops = |reason, unit| drops.get_or_create(&ByReasonUnit { reason, unit }).clone();
        ListenerMetrics {
            counts: self.listeners.handles(&ByListener { listener }),
            parse_errors,
            series_limit: drops("series_limit", "lines"),
            memory_limit: drops("memory_limit", "lines"),
            truncated: drops("truncated", "datagrams"),
            refused_connections: self
                .frame_errors
                .get_or_create(&ByListenerReason { listener, reason: "too_many_connections" })
                .clone(),
        }
    }

    /// Sets the kernel drop counter of UDP socket `socket` to `total` (exported from the
    /// first poll, at 0 while nothing was dropped).
    pub fn record_kernel_drops(&self, socket: usize, previous: u64, total: u64) {
        let counter =
            self.kernel_drops.get_or_create(&ByListenerSocket { listener: "udp", socket: socket.to_string() });
        if total > previous {
            counter.inc_by(total - previous);
        }
    }
}

/// Handles a reader thread adds its batch counts to.
#[derive(Clone)]
pub struct ListenerMetrics {
    counts: ListenerCounts,
    parse_errors: Vec<Counter>,
    /// Lines of new series refused because a reader's table was full.
    series_limit: Counter,
    /// Lines of new series refused near the memory limit.
    memory_limit: Counter,
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
            self.counts.datagrams.inc_by(counts.datagrams);
        }
        self.counts.bytes.inc_by(counts.bytes);
        self.counts.lines.inc_by(counts.lines);
        if counts.events > 0 {
            self.counts.events.inc_by(counts.events);
        }
        if counts.name_tag_errors > 0 {
            self.counts.name_tag_errors.inc_by(counts.name_tag_errors);
        }
        for (counter, count) in self.parse_errors.iter().zip(counts.rejected) {
            if count > 0 {
                counter.inc_by(count);
            }
        }
        if counts.series_limit > 0 {
            self.series_limit.inc_by(counts.series_limit);
        }
        if counts.memory_limit > 0 {
            self.memory_limit.inc_by(counts.memory_limit);
        }
        if counts.truncated > 0 {
            self.truncated.inc_by(counts.truncated);
        }
    }

    /// Counts a failed receive (or accept) call.
    pub fn receive_error(&self) {
        self.counts.receive_errors.inc();
    }
}

/// A statsd stream listener counts its connections here.
impl tessera_wire::InboundCounters for ListenerMetrics {
    fn accept_error(&self) {
        self.counts.receive_errors.inc();
    }
    fn refused(&self) {
        self.refused_connections.inc();
    }
    fn opened(&self) {
        self.counts.connections.inc();
    }
    fn closed(&self) {
        self.counts.connections.dec();
    }
}

impl ListenerMetrics {
    /// Metric lines accepted so far (for tests and the status line).
    pub fn lines(&self) -> u64 {
        self.counts.lines.get()
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
    /// Malformed tags written in metric names, skipped.
    pub name_tag_errors: u64,
    /// Lines rejected, per reason.
    pub rejected: [u64; RejectReason::ALL.len()],
    /// Lines of new series refused because the table is full.
    pub series_limit: u64,
    /// Lines of new series refused near the memory limit.
    pub memory_limit: u64,
    /// Datagrams the kernel truncated.
    pub truncated: u64,
}
