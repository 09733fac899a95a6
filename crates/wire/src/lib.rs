//! Everything on a connection between tessera daemons, in one place:
//!
//! ```text
//!  collector ──outbound──▶ inbound── aggregator ──outbound──▶ inbound── ingester
//!            queue, sender,  cap, handshake,     queue, sender,  cap, handshake,
//!            client exchange idle deadline        client exchange idle deadline
//! ```
//!
//! - Inbound: [`accept_loop`] with its connection cap (refused and counted), and
//!   [`WireConnection`]: the versioned handshake under a deadline, then frames under
//!   an idle deadline; [`serve_wire`] runs a wire listener on them, with its
//!   [`ListenerSettings`], [`serve_batches`] answers each frame ([`Answer`]), [`take_batch`]
//!   decodes a handed-on body by the one bad-frame policy ([`BadFrame`]), and
//!   [`connection_ended`] counts why each connection ended ([`CloseReason`]).
//! - Outbound: one bounded [`OutboundQueue`] and one long-lived [`run_sender`] per
//!   destination: acknowledged, retried with the one jittered [`Backoff`](tessera_runtime::Backoff), oldest
//!   dropped first and counted; [`Destinations`] makes both the first time a
//!   destination is named and keeps them (the collector's aggregators, the aggregator's
//!   ingesters).
//! - The client side of one exchange: [`connect`], handshake, and [`exchange`]: one
//!   batch for one acknowledgement.
//! - Configuration: a sender's and a listener's keys, declared once by
//!   [`sender_config!`] and [`listener_config!`].
//! - TLS: certificates and rustls configurations, [`Reloading`] from disk;
//!   [`WireStream`] is a connection with or without TLS.
//! - Metrics: the listener's ([`ListenerMetrics`]) and the senders'
//!   ([`SenderMetrics`], [`DestinationMetrics`]), declared once for every daemon.
//!
//! The modules are private; everything is re-exported here. The messages themselves
//! (frames, acks and their reasons) are the wire contract in `tessera-proto`; what
//! each daemon does with a batch is its own.
//!
//! ## Inbound
//!
//! The inbound side every listener shares, the mirror of the outbound side:
//! the aggregator's and the ingester's wire listeners and the collector's statsd TCP
//! listener all accept through [`accept_loop`], and the two wire listeners read through
//! [`WireConnection`].
//!
//! - **Connection cap**: a new connection over `max_connections` is closed at once and
//!   counted ([`InboundCounters::refused`]), never left waiting in the backlog, so a
//!   flood of clients cannot stall the peers already connected. The cap is a semaphore:
//!   a slot is taken before the connection's task starts and given back when it ends,
//!   with no race between the check and the count.
//! - **TLS** (optional, [`ListenerSettings::tls`]): the TLS handshake comes first, under
//!   the same handshake deadline; a client without a valid certificate (when a client CA
//!   is set), or one that does not speak TLS, is refused there and counted
//!   (`frame_errors_total{reason="tls"}`, the detail logged).
//! - **Handshake deadline** ([`WireConnection::accept`]): a wire client that does not
//!   complete the handshake in time is closed and counted.
//! - **Idle deadline** ([`WireConnection::next_frame`]): after the handshake, a wire
//!   connection silent for `idle_timeout` is closed and counted. Senders keep healthy
//!   connections alive: a collector sends a batch every window, empty or not; an
//!   aggregator sends an empty tile batch (a heartbeat) when it has had nothing to send
//!   for a third of the ingester's idle timeout ([`SenderSettings::heartbeat`]).
//! - Statsd TCP connections may stay idle for long (a client library keeps one open),
//!   so they have no idle deadline; they are bounded by the cap and by the memory each
//!   may hold (a line longer than the limit is skipped and counted).
//! - Log lines about a peer go through a [`RateLimitedLog`](tessera_runtime::RateLimitedLog) per site, so a flood of bad
//!   clients cannot flood the log.
//!
//! ## Answering a batch
//!
//! Both wire listeners (the aggregator's for collectors, the ingester's for aggregators)
//! answer through [`serve_batches`]: read a frame, hand its body (without the length
//! prefix) to the daemon, await its [`Answer`], write the ack or close; one batch in
//! flight per connection. One policy for every frame that cannot be trusted, whichever
//! listener reads it:
//!
//! | frame | answer | `frame_errors_total{reason}` |
//! |---|---|---|
//! | declared longer than `max_frame_bytes` (refused before its body is read) | ack `Permanent`, `frame_too_large`, then closed | `too_large` |
//! | bytes that do not decode as a frame | ack `Permanent`, `malformed_frame`, then closed | `malformed_frame` |
//! | a frame without a body | ack `Permanent`, `malformed_frame`, then closed | `empty` |
//! | a frame of a kind this listener does not take (an ack, a tile batch at an aggregator, a partial batch at an ingester) | ack `Permanent`, `unexpected_frame`, then closed | `unexpected_frame` |
//!
//! The refusal's ack carries sequence 0 (the frame's own cannot be trusted) and is
//! written within a second, best effort. A frame that decodes but whose batch is
//! refused (not the owner, too late, queue full) is the daemon's answer, an ack with
//! its reason; the connection stays open.
//!
//! ## Configuration
//!
//! The wire's configuration keys, declared once for every daemon: a sender's
//! ([`sender_config!`]: the collector's `[forward]`, the
//! aggregator's `[ingester]`) and a listener's
//! ([`listener_config!`]: the aggregator's and the
//! ingester's top level).
//!
//! Each macro declares a daemon's config struct with the wire's keys in it, beside the
//! daemon's own, so that the keys stay where users write them (no extra table) and
//! unknown keys are still refused with their line (`deny_unknown_fields`; serde's
//! `flatten` would lose both). Every field is written once, with its doc and its
//! default; only the defaults that differ between daemons are given per daemon.
//!
//! ```
//! tessera_wire::sender_config! {
//!     /// `[forward]`
//!     pub struct ForwardConfig {
//!         /// Name each series once per connection.
//!         pub series_dictionary: bool = false,
//!     }
//!     defaults { max_queue_bytes: 256 << 20, max_frame_bytes: 16 << 20, ack_timeout_ms: 10_000, shutdown_grace_secs: 5 }
//! }
//!
//! let config: ForwardConfig = toml::from_str("max_buffer_bytes = 33554432\nseries_dictionary = true\n").unwrap();
//! assert_eq!((config.max_queue_bytes, config.ack_timeout_ms, config.series_dictionary), (32 << 20, 10_000, true));
//! assert!(config.validate_sender("forward").is_ok());
//! let error = toml::from_str::<ForwardConfig>("ack_timeout = 1\n").unwrap_err();
//! assert!(error.to_string().contains("unknown field `ack_timeout`"), "{error}");
//! ```
//!
//! ## Metrics
//!
//! The wire's metrics, declared once for every daemon: a listener's
//! ([`ListenerMetrics`]) and a sender's, per destination ([`SenderMetrics`],
//! whose [`DestinationMetrics`] are the [`OutboundMetrics`] of one queue).
//!
//! Both ends of a link export the same names below their daemon's prefix:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `connections`, `connections_accepted_total`, `accept_errors_total` | gauge, counters | |
//! | `frame_errors_total` | counter | `reason` (a refused connection is `too_many_connections`) |
//! | `batches_sent_total`, `bytes_sent_total`, `<unit>_sent_total` | counter | `destination` |
//! | `queue_batches`, `queue_bytes` | gauge | `destination` |
//! | `ack_latency_seconds` | histogram | `destination` |
//! | `connect_errors_total` | counter | `destination` |
//! | `tls_errors_total` | counter | `destination`, `reason` |
//! | `listener_tls_reload_errors_total`, `sender_tls_reload_errors_total` | counter | |
//! | `send_errors_total`, `rejected_batches_total` | counter | `destination`, `reason` |
//! | `dictionary_series`, `dictionary_generations_total`, `batches_expanded_total` | gauge, counters | `destination` (senders with series dictionaries) |
//!
//! Labels are typed (`ByDestination`, `ByDestinationReason`, ...), encoded in field order.
//! Drops on the way to a destination go to the daemon's own `drops_total{reason,unit}`
//! (`queue_full`, `rejected`, `expansion_failed`), handed to [`SenderMetrics::destination`].

mod answer;
mod client;
mod config;
mod destinations;
mod inbound;
mod metrics;
mod outbound;
mod stream;
mod tls;

pub use answer::{Answer, BadFrame, serve_batches, take_batch};
pub use client::{ClientError, ClientTls, connect, exchange};
pub use config::{DEFAULT_MAX_FRAME_BYTES, client_tls, server_tls};
pub use destinations::{DestinationEntry, DestinationQueue, Destinations};
pub use inbound::{
    AcceptSettings, InboundCounters, ListenerSettings, WireConnection, WireDeadlines, WireError, accept_loop,
    connection_ended, read_frame_bytes, serve_wire,
};
pub use metrics::{CloseReason, DestinationMetrics, Items, ListenerMetrics, SenderMetrics};
pub use outbound::{
    Batch, DropReason, Expand, GenerationEnd, Heartbeat, OutboundMetrics, OutboundQueue, Redirect, Refs,
    SenderSettings, run_sender,
};
pub use stream::WireStream;
pub use tls::{
    ClientTlsConfig, Reloading, ServerTlsConfig, TlsError, failure_label, load_certs, load_key, tls_failure,
};

/// What the config macros' expansions name; not an API.
#[doc(hidden)]
pub mod __config {
    pub use crate::config::{
        Counter, client_tls, millis, server_tls, validate_client_tls, validate_listener, validate_sender,
        validate_server_tls,
    };
}

#[doc(hidden)]
pub use tessera_proto as __proto;
#[doc(hidden)]
pub use tessera_runtime as __runtime;
