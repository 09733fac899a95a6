//! Everything on a connection between tessera daemons, in one place:
//!
//! ```text
//!  collector ──outbound──▶ inbound── aggregator ──outbound──▶ inbound── ingester
//!            queue, sender,  cap, handshake,     queue, sender,  cap, handshake,
//!            client exchange idle deadline        client exchange idle deadline
//! ```
//!
//! - [`inbound`]: the accept loop with its connection cap (refused and
//!   counted), and [`inbound::WireConnection`]: the versioned handshake under
//!   a deadline, then frames under an idle deadline;
//!   [`inbound::ListenerSettings`] are a wire listener's settings.
//! - [`outbound`]: one bounded [`outbound::OutboundQueue`] and one long-lived
//!   [`outbound::run_sender`] per destination: acknowledged, retried with
//!   [`backoff`], oldest dropped first and counted.
//! - [`client`]: connect, handshake, and one batch for one acknowledgement.
//! - [`backoff`]: the one jittered exponential backoff.
//! - [`config`]: a sender's and a listener's configuration keys, declared once.
//! - [`tls`]: certificates and rustls configurations, reloaded from disk;
//!   [`stream::WireStream`] is a connection with or without TLS.
//! - [`metrics`]: the listener's and the senders' metrics, declared once for
//!   every daemon.
//!
//! The messages themselves (frames, acks and their reasons) are the wire
//! contract in `tessera-proto`; what each daemon does with a batch is its own.

pub mod backoff;
pub mod client;
pub mod config;
pub mod inbound;
pub mod metrics;
pub mod outbound;
pub mod stream;
pub mod tls;

#[doc(hidden)]
pub use tessera_proto as __proto;
#[doc(hidden)]
pub use tessera_runtime as __runtime;
