//! The wire listener: aggregators connect, shake hands, then send tile batches, each
//! answered by an acknowledgement.
//!
//! One task per connection (not per batch) reads length-prefixed frames
//! ([`tessera_proto::framing`]) through [`tessera_wire::serve_batches`] and hands each
//! body to the writer thread ([`crate::writer`]), which decodes, converts and queues it
//! and decides the [`tessera_proto::Ack`]: `Ok` only once the batch is durable,
//! `Retryable` (`queue_full`) while the queue is over its bound, so that aggregators hold
//! their tiles and send them again: backpressure, never a silent drop. The intake knows
//! nothing of the writer: what it hands on ([`FrameJob`]) is its own.
//!
//! Connections are accepted through [`tessera_wire::serve_wire`]: over `max_connections`
//! a new one is closed at once, the handshake has a deadline, and after it a connection
//! silent for `idle_timeout_ms` is closed (`reason="idle_timeout"`). An empty tile batch
//! is an aggregator's heartbeat: acknowledged, nothing queued.
//!
//! A frame that cannot be trusted ends its connection and only its connection, by the
//! wire's one policy (`tessera_wire`, *Answering a batch*): a declared length over
//! `max_frame_bytes` (refused before its body is read), bytes that are not a frame, a
//! frame without a body, a frame that is not a tile batch. Each is counted in
//! `tessera_ingester_frame_errors_total{reason}`, logged at a limited rate, and answered,
//! when the stream still allows it, by an `Ack` with status `Permanent`, sequence 0 and
//! the reason (`frame_too_large`, `malformed_frame`, `unexpected_frame`) before the
//! connection is closed.

use std::net::SocketAddr;
use std::time::Instant;

use tessera_runtime::{RateLimitedLog, Shutdown};
use tessera_wire::{Answer, ListenerMetrics, ListenerSettings, WireConnection, WireError};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

static FRAME_ERROR_LOG: RateLimitedLog = RateLimitedLog::new("ingester.frame_error", 5);

/// A frame body read from a connection, to be answered.
pub struct FrameJob {
    /// The body (without its length prefix).
    pub body: Vec<u8>,
    /// When reading it finished.
    pub read_at: Instant,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Accepts connections until `stop` fires, handing each frame on to `jobs`. Over the cap,
/// a connection is refused rather than left waiting in the backlog: a silent client
/// holding slots must not stall the aggregators behind it.
pub async fn accept_loop<J>(
    listener: TcpListener,
    jobs: mpsc::Sender<J>,
    settings: ListenerSettings,
    counters: ListenerMetrics,
    stop: Shutdown,
) where
    J: From<FrameJob> + Send + 'static,
{
    let context = (jobs, stop.clone());
    tessera_wire::serve_wire(listener, settings, "aggregator", counters, &FRAME_ERROR_LOG, stop, context, connection)
        .await;
}

/// Serves one aggregator after its handshake: a frame at a time, each answered.
async fn connection<J: From<FrameJob>>(
    mut wire: WireConnection,
    peer: SocketAddr,
    (jobs, stop): (mpsc::Sender<J>, Shutdown),
) -> Result<(), WireError> {
    tracing::debug!(%peer, source = %wire.hello.instance_id, "aggregator connected");
    tessera_wire::serve_batches(&mut wire, &stop, |body| {
        let jobs = &jobs;
        async move {
            let (reply, answer) = oneshot::channel();
            jobs.send(J::from(FrameJob { body, read_at: Instant::now(), reply })).await.ok()?;
            answer.await.ok()
        }
    })
    .await
}
