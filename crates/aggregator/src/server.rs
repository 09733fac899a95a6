//! The wire listener: collectors connect, shake hands, then send partial
//! batch frames, each answered by an ack.
//!
//! A connection task only moves bytes: it reads one frame (refusing one
//! over `max_frame_bytes` from its length prefix alone), hands the bytes to
//! the decoder thread, waits for the answer, writes the ack, and reads the
//! next frame. One batch in flight per connection is the backpressure: a
//! sender waiting for its ack sends nothing more.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;
use tessera_proto::framing::{self, FrameError, LENGTH_PREFIX_BYTES};
use tessera_proto::{Frame, frame::Body};
use tessera_runtime::{RateLimitedLog, Shutdown};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::metrics::Metrics;
use crate::pipeline::{FrameJob, Inbound, Reply};
use tessera_runtime::logging::error_chain;

static CONNECTION_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.connection", 5);

/// Connection numbers, unique in the process (watermarks are kept per connection).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Settings of the listener.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// This instance's id, sent in the handshake answer.
    pub instance_id: String,
    /// Largest frame accepted.
    pub max_frame_bytes: usize,
    /// Most open connections.
    pub max_connections: usize,
    /// Time allowed for the handshake.
    pub handshake_timeout: Duration,
    /// A connection with no frame for this long is closed.
    pub idle_timeout: Duration,
}

/// Accepts connections until `shutdown` fires.
pub async fn accept_loop(
    listener: TcpListener,
    jobs: Sender<Inbound>,
    settings: ServerSettings,
    metrics: Metrics,
    shutdown: Shutdown,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.wait() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                metrics.accept_errors.inc();
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if metrics.connections.get() >= settings.max_connections as i64 {
            metrics.frame_error("too_many_connections");
            if CONNECTION_LOG.allow() {
                tracing::warn!(%peer, max = settings.max_connections, "too many connections; closing a new one");
            }
            continue;
        }
        let _ = stream.set_nodelay(true);
        metrics.connections.inc();
        let (jobs, settings, metrics, shutdown) = (jobs.clone(), settings.clone(), metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            serve_connection(stream, peer, &jobs, &settings, &metrics, &shutdown).await;
            metrics.connections.dec();
        });
    }
}

async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    jobs: &Sender<Inbound>,
    settings: &ServerSettings,
    metrics: &Metrics,
    shutdown: &Shutdown,
) {
    let handshake =
        tokio::time::timeout(settings.handshake_timeout, framing::server_handshake(&mut stream, &settings.instance_id));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        () = shutdown.wait() => return,
    };
    let hello = match handshake {
        Ok(Ok(hello)) => hello,
        Ok(Err(error)) => {
            metrics.frame_error("handshake");
            if CONNECTION_LOG.allow() {
                tracing::warn!(%peer, error = %error_chain(&error), "handshake failed");
            }
            return;
        }
        Err(_) => {
            metrics.frame_error("handshake");
            return;
        }
    };
    tracing::debug!(%peer, source = %hello.instance_id, "collector connected");
    let connection = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    if jobs.send(Inbound::Opened { connection, source: hello.instance_id.clone() }).is_err() {
        return;
    }
    serve_frames(&mut stream, peer, connection, &hello.instance_id, jobs, settings, metrics, shutdown).await;
    // Whatever ended the connection, it holds no tile back any more.
    let _ = jobs.send(Inbound::Closed { connection });
}

/// Reads frames and writes their answers until the connection ends.
#[allow(clippy::too_many_arguments)]
async fn serve_frames(
    stream: &mut TcpStream,
    peer: SocketAddr,
    connection: u64,
    source: &str,
    jobs: &Sender<Inbound>,
    settings: &ServerSettings,
    metrics: &Metrics,
    shutdown: &Shutdown,
) {
    loop {
        let read = tokio::select! {
            read = tokio::time::timeout(settings.idle_timeout, read_raw_frame(stream, settings.max_frame_bytes)) => read,
            () = shutdown.wait() => return,
        };
        let Ok(read) = read else {
            metrics.frame_error("idle_timeout");
            if CONNECTION_LOG.allow() {
                tracing::warn!(%peer, source, idle = ?settings.idle_timeout, "closing a silent connection");
            }
            return;
        };
        let frame = match read {
            Ok(frame) => frame,
            Err(FrameError::Closed) => return,
            Err(error) => {
                let reason = if matches!(error, FrameError::TooLarge { .. }) { "too_large" } else { "io" };
                metrics.frame_error(reason);
                if CONNECTION_LOG.allow() {
                    tracing::warn!(%peer, source, error = %error_chain(&error), "closing connection");
                }
                return;
            }
        };
        let (reply, answer) = oneshot::channel();
        if jobs.send(Inbound::Frame(FrameJob { connection, frame, reply })).is_err() {
            return;
        }
        let Ok(reply) = answer.await else { return };
        match reply {
            Reply::Ack(ack) => {
                let frame = Frame { body: Some(Body::Ack(ack)) };
                if framing::write_frame(stream, &frame, 1 << 20).await.is_err() {
                    return;
                }
            }
            Reply::Close { reason, message } => {
                if CONNECTION_LOG.allow() {
                    tracing::warn!(%peer, source, reason, %message, "closing connection");
                }
                return;
            }
        }
    }
}

/// Reads one frame's bytes (length prefix included) without decoding it.
pub async fn read_raw_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Vec<u8>, FrameError> {
    let len = framing::read_length_prefix(reader, max_frame_bytes).await?;
    let mut frame = vec![0; LENGTH_PREFIX_BYTES + len];
    frame[..LENGTH_PREFIX_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    reader.read_exact(&mut frame[LENGTH_PREFIX_BYTES..]).await?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raw_frames_keep_their_prefix_and_oversized_ones_are_refused_early() {
        let ack = Frame { body: Some(Body::Ack(tessera_proto::Ack { sequence: 4, ..Default::default() })) };
        let bytes = framing::encode_frame(&ack, 1024).unwrap();
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        tokio::io::AsyncWriteExt::write_all(&mut a, &bytes).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut a, &(1_000_000u32).to_be_bytes()).await.unwrap();
        drop(a);
        let raw = read_raw_frame(&mut b, 1024).await.unwrap();
        assert_eq!(raw, bytes);
        assert_eq!(framing::decode_frame(&raw, 1024).unwrap().unwrap().0, ack);
        assert!(matches!(read_raw_frame(&mut b, 1024).await, Err(FrameError::TooLarge { len: 1_000_000, .. })));
        assert!(matches!(read_raw_frame(&mut b, 1024).await, Err(FrameError::Closed)));
    }
}
