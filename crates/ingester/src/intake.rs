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
//! A frame that cannot be trusted ends its connection and only its connection: a
//! declared length over `max_frame_bytes` (refused before its body is read), bytes that
//! are not a frame, a frame without a body, a failed handshake. Each is counted in
//! `tessera_ingester_frame_errors_total{reason}`, logged at a limited rate, and answered,
//! when the stream still allows it, by an `Ack` with status `Permanent`, sequence 0 and
//! the reason (`frame_too_large`, `malformed_frame`) before the connection is closed.

pub mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_proto::framing::{self, FrameError};
use tessera_proto::{Ack, AckStatus, Frame, frame::Body};
use tessera_runtime::{RateLimitedLog, Shutdown};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::metrics::Metrics;
pub use writer::{Job, Verdict};

static FRAME_ERROR_LOG: RateLimitedLog = RateLimitedLog::new("ingester.frame_error", 5);

/// Settings of the listener.
#[derive(Debug, Clone)]
pub struct IntakeSettings {
    /// This ingester's id, sent in the handshake.
    pub instance_id: String,
    /// Largest frame body accepted.
    pub max_frame_bytes: usize,
    /// Most connections at once; a connection over the cap is closed at once and counted.
    pub max_connections: usize,
    /// Deadline for the client's handshake.
    pub handshake_timeout: Duration,
}

/// Accepts connections until `stop` fires.
pub async fn accept_loop(
    listener: TcpListener,
    jobs: mpsc::Sender<Job>,
    settings: IntakeSettings,
    metrics: Metrics,
    stop: Shutdown,
) {
    let slots = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.wait() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    metrics.accept_errors.inc();
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Over the cap, refuse rather than leave the connection waiting in the backlog: a
        // silent client holding slots must not stall the aggregators behind it.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.frame_error("too_many_connections");
            if FRAME_ERROR_LOG.allow() {
                tracing::warn!(%peer, max = settings.max_connections, "too many connections; closing a new one");
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        metrics.connections_accepted.inc();
        let (jobs, settings, metrics, stop) = (jobs.clone(), settings.clone(), metrics.clone(), stop.clone());
        tokio::spawn(async move {
            metrics.connections.inc();
            connection(stream, peer, jobs, &settings, &metrics, stop).await;
            metrics.connections.dec();
            drop(slot);
        });
    }
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    jobs: mpsc::Sender<Job>,
    settings: &IntakeSettings,
    metrics: &Metrics,
    stop: Shutdown,
) {
    let hello =
        tokio::time::timeout(settings.handshake_timeout, framing::server_handshake(&mut stream, &settings.instance_id))
            .await;
    let source = match hello {
        Ok(Ok(hello)) => hello.instance_id,
        Ok(Err(error)) => {
            frame_error(metrics, peer, "handshake", &error.to_string());
            return;
        }
        Err(_) => {
            frame_error(metrics, peer, "handshake", "no handshake within the timeout");
            return;
        }
    };
    tracing::debug!(%peer, source, "aggregator connected");
    loop {
        let read = tokio::select! {
            () = stop.wait() => return,
            read = read_body(&mut stream, settings.max_frame_bytes) => read,
        };
        let body = match read {
            Ok(body) => body,
            Err(FrameError::Closed) => return,
            Err(FrameError::TooLarge { len, max }) => {
                let message = format!("frame of {len} bytes exceeds the maximum of {max} bytes");
                frame_error(metrics, peer, "too_large", &message);
                refuse(&mut stream, "frame_too_large", message).await;
                return;
            }
            Err(error) => {
                frame_error(metrics, peer, "io", &error.to_string());
                return;
            }
        };
        let (reply, verdict) = oneshot::channel();
        let job = Job::Frame { body, read_at: Instant::now(), reply };
        if jobs.send(job).await.is_err() {
            return;
        }
        let Ok(verdict) = verdict.await else { return };
        match verdict {
            Verdict::Ack(ack) => {
                let frame = Frame { body: Some(Body::Ack(ack)) };
                if let Err(error) = framing::write_frame(&mut stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES).await {
                    tracing::debug!(%peer, %error, "cannot send an acknowledgement; closing");
                    return;
                }
            }
            Verdict::Close { reason, message } => {
                frame_error(metrics, peer, reason, &message);
                refuse(&mut stream, "malformed_frame", message).await;
                return;
            }
        }
    }
}

fn frame_error(metrics: &Metrics, peer: SocketAddr, reason: &'static str, message: &str) {
    metrics.frame_error(reason);
    if FRAME_ERROR_LOG.allow() {
        tracing::warn!(%peer, reason, message, "bad frame; closing the connection");
    }
}

/// Tells the peer why its connection is closed (best effort, bounded in time).
async fn refuse(stream: &mut TcpStream, reason: &str, message: String) {
    let ack = Ack { sequence: 0, status: AckStatus::Permanent as i32, message, reason: reason.to_owned() };
    let frame = Frame { body: Some(Body::Ack(ack)) };
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        framing::write_frame(stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}

/// Reads one frame's body, refusing a declared length over `max_frame_bytes` before
/// reading any of it. [`FrameError::Closed`] when the stream ends between frames.
pub async fn read_body<R: AsyncRead + Unpin>(reader: &mut R, max_frame_bytes: usize) -> Result<Vec<u8>, FrameError> {
    let len = framing::read_length_prefix(reader, max_frame_bytes).await?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await?;
    Ok(body)
}
