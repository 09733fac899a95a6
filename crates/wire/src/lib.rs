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
//!   [`ListenerSettings`], and [`connection_ended`] counts why each connection ended
//!   ([`CloseReason`]).
//! - Outbound: one bounded [`OutboundQueue`] and one long-lived [`run_sender`] per
//!   destination: acknowledged, retried with the one jittered [`Backoff`], oldest
//!   dropped first and counted.
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

mod backoff;
mod client;
mod config;
mod inbound;
mod metrics;
mod outbound;
mod stream;
mod tls;

pub use backoff::{Backoff, sleep_or_stop};
pub use client::{ClientError, ClientTls, connect, exchange};
pub use config::{DEFAULT_MAX_FRAME_BYTES, client_tls, server_tls};
pub use inbound::{
    AcceptSettings, InboundCounters, ListenerSettings, WireConnection, WireDeadlines, WireError, accept_loop,
    connection_ended, read_frame_bytes, serve_wire,
};
pub use metrics::{
    ByReasonUnit, CloseReason, DestinationMetrics, Drops, Items, ListenerMetrics, SenderMetrics, count_drops,
};
pub use outbound::{
    Batch, DropReason, Expand, GenerationEnd, Heartbeat, OutboundMetrics, OutboundQueue, Refs, SenderSettings,
    run_sender,
};
pub use stream::WireStream;
pub use tls::{
    ClientTlsConfig, Reloading, ServerTlsConfig, TlsError, failure_label, file_stamp, load_certs, load_key, tls_failure,
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
