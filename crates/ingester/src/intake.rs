//! The wire listener: aggregators connect, shake hands, then send tile batches, each
//! answered by an acknowledgement.
//!
//! One task per connection (not per batch) reads length-prefixed frames
//! ([`tessera_proto::framing`]) and hands each body to the [`writer`] thread, which
//! decodes, converts and queues it and decides the [`tessera_proto::Ack`]: `Ok` only once
//! the batch is durable, `Retryable` (`queue_full`) while the queue is over its bound, so
//! that aggregators hold their tiles and send them again: backpressure, never a silent
//! drop.
//!
//! Connections are accepted through [`tessera_wire::serve_wire`]: over `max_connections`
//! a new one is closed at once, the handshake has a deadline, and after it a connection
//! silent for `idle_timeout_ms` is closed (`reason="idle_timeout"`). An empty tile batch
//! is an aggregator's heartbeat: acknowledged, nothing queued.
//!
//! A frame that cannot be trusted ends its connection and only its connection: a
//! declared length over `max_frame_bytes` (refused before its body is read), bytes that
//! are not a frame, a frame without a body, a failed handshake. Each is counted in
//! `tessera_ingester_frame_errors_total{reason}`, logged at a limited rate, and answered,
//! when the stream still allows it, by an `Ack` with status `Permanent`, sequence 0 and
//! the reason (`frame_too_large`, `malformed_frame`) before the connection is closed.

pub mod checkpoint;
mod metrics;
pub mod writer;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tessera_proto::framing::{self, FrameError};
use tessera_proto::{AckReason, Frame, frame::Body};
use tessera_runtime::{RateLimitedLog, Shutdown};
use tessera_wire::ListenerMetrics;
use tessera_wire::{ListenerSettings, WireConnection, WireError};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

pub use metrics::{CheckpointFailure, CheckpointMetrics, IntakeMetrics};
pub use writer::{Job, Verdict};

static FRAME_ERROR_LOG: RateLimitedLog = RateLimitedLog::new("ingester.frame_error", 5);

/// Accepts connections until `stop` fires. Over the cap, a connection is refused rather
/// than left waiting in the backlog: a silent client holding slots must not stall the
/// aggregators behind it.
pub async fn accept_loop(
    listener: TcpListener,
    jobs: mpsc::Sender<Job>,
    settings: ListenerSettings,
    counters: ListenerMetrics,
    stop: Shutdown,
) {
    let context = (jobs, stop.clone());
    tessera_wire::serve_wire(listener, settings, "aggregator", counters, &FRAME_ERROR_LOG, stop, context, connection)
        .await;
}

/// Serves one aggregator after its handshake: a frame at a time, each answered.
async fn connection(
    mut wire: WireConnection,
    peer: SocketAddr,
    (jobs, stop): (mpsc::Sender<Job>, Shutdown),
) -> Result<(), WireError> {
    tracing::debug!(%peer, source = %wire.hello.instance_id, "aggregator connected");
    loop {
        let body = match wire.next_frame(false, &stop).await {
            Ok(body) => body,
            Err(error) => {
                if let WireError::Frame(FrameError::TooLarge { len, max }) = error {
                    let message = format!("frame of {len} bytes exceeds the maximum of {max} bytes");
                    refuse(&mut wire.stream, AckReason::FrameTooLarge, message).await;
                }
                return Err(error);
            }
        };
        let (reply, verdict) = oneshot::channel();
        let job = Job::Frame { body, read_at: Instant::now(), reply };
        if jobs.send(job).await.is_err() {
            return Ok(());
        }
        let Ok(verdict) = verdict.await else { return Ok(()) };
        match verdict {
            Verdict::Ack(ack) => {
                let frame = Frame { body: Some(Body::Ack(ack)) };
                framing::write_frame(&mut wire.stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES).await?;
            }
            Verdict::Close { reason, message } => {
                refuse(&mut wire.stream, AckReason::MalformedFrame, message.clone()).await;
                return Err(WireError::Closed { reason, message });
            }
        }
    }
}

/// Tells the peer why its connection is closed (best effort, bounded in time).
async fn refuse(stream: &mut (impl AsyncWrite + Unpin), reason: AckReason, message: String) {
    let frame = Frame { body: Some(Body::Ack(reason.ack(0, message))) };
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        framing::write_frame(stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}
