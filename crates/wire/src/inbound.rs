//! The inbound side every listener shares; see the crate docs, *Inbound*.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto::Hello;
use tessera_proto::framing::{self, FrameError, HandshakeError};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use rustls::ServerConfig;
use tessera_runtime::Shutdown;
use tessera_runtime::logging::RateLimitedLog;

use crate::metrics::{CloseReason, ListenerMetrics};
use crate::stream::WireStream;
use crate::tls::{Reloading, failure_label};

/// What an accept loop reports; each listener maps it onto its own metrics.
pub trait InboundCounters: Clone + Send + Sync + 'static {
    /// `accept()` failed (out of file descriptors and the like).
    fn accept_error(&self);
    /// A connection over the cap was closed at once.
    fn refused(&self);
    /// A connection was taken: it now holds a slot.
    fn opened(&self);
    /// A connection ended and gave its slot back.
    fn closed(&self);
}

/// A wire listener counts into the wire's own metrics.
impl InboundCounters for ListenerMetrics {
    fn accept_error(&self) {
        self.accept_errors.inc();
    }
    fn refused(&self) {
        self.frame_error(CloseReason::TooManyConnections);
    }
    fn opened(&self) {
        self.connections_accepted.inc();
        self.connections.inc();
    }
    fn closed(&self) {
        self.connections.dec();
    }
}

/// Settings of a wire listener (an aggregator's for collectors, an ingester's for
/// aggregators): the handshake answer, the frame bound, the connection cap and the
/// connection deadlines.
#[derive(Debug, Clone)]
pub struct ListenerSettings {
    /// This instance's id, sent in the handshake answer.
    pub instance_id: String,
    /// Largest frame body accepted.
    pub max_frame_bytes: usize,
    /// Most connections at once; one more is closed at once and counted.
    pub max_connections: usize,
    /// Deadline for the client's handshake.
    pub handshake_timeout: std::time::Duration,
    /// After the handshake, the longest silence before a connection is closed.
    pub idle_timeout: std::time::Duration,
    /// TLS on the listener (its configuration reloaded when the files change); plain
    /// TCP when `None`.
    pub tls: Option<Arc<Reloading<ServerConfig>>>,
}

impl ListenerSettings {
    /// The connection deadlines.
    pub fn deadlines(&self) -> WireDeadlines {
        WireDeadlines { handshake: self.handshake_timeout, idle: self.idle_timeout }
    }
}

/// Settings of an accept loop.
#[derive(Debug, Clone, Copy)]
pub struct AcceptSettings {
    /// Most connections at once.
    pub max_connections: usize,
    /// What connects, for logs (`collector`, `aggregator`, `statsd client`).
    pub peer: &'static str,
}

/// Accepts connections until `shutdown`, running `serve` on each in its own task, with a
/// clone of `context`, while it holds one of `max_connections` slots; refuses and counts
/// the others.
pub async fn accept_loop<C, T, S, F>(
    listener: TcpListener,
    settings: AcceptSettings,
    counters: C,
    log: &'static RateLimitedLog,
    shutdown: Shutdown,
    context: T,
    serve: S,
) where
    C: InboundCounters,
    T: Clone,
    S: Fn(TcpStream, SocketAddr, T) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.wait() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                counters.accept_error();
                if log.allow() {
                    tracing::warn!(%error, "accepting a connection failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            counters.refused();
            if log.allow() {
                tracing::warn!(%peer, max = settings.max_connections, what = settings.peer, "too many connections; closing a new one");
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        counters.opened();
        let (counters, connection) = (counters.clone(), serve(stream, peer, context.clone()));
        tokio::spawn(async move {
            let _slot: OwnedSemaphorePermit = slot;
            connection.await;
            counters.closed();
        });
    }
}

/// Accepts wire connections until `shutdown` through [`accept_loop`] (under
/// `settings.max_connections`; `peer` names what connects, for logs), takes each one's TLS
/// and handshake ([`WireConnection::accept`]), then runs `serve` on the connection with a
/// clone of `context`. A connection that fails before `serve`, or that `serve` ends with
/// an error, is counted and logged by [`connection_ended`].
#[allow(clippy::too_many_arguments)]
pub async fn serve_wire<T, S, F>(
    listener: TcpListener,
    settings: ListenerSettings,
    peer: &'static str,
    metrics: ListenerMetrics,
    log: &'static RateLimitedLog,
    shutdown: Shutdown,
    context: T,
    serve: S,
) where
    T: Clone + Send + 'static,
    S: Fn(WireConnection, SocketAddr, T) -> F + Copy + Send + 'static,
    F: Future<Output = Result<(), WireError>> + Send + 'static,
{
    let accept = AcceptSettings { max_connections: settings.max_connections, peer };
    let each = (Arc::new(settings), metrics.clone(), shutdown.clone(), context);
    accept_loop(listener, accept, metrics, log, shutdown, each, move |stream, address, each| {
        let (settings, metrics, shutdown, context) = each;
        async move {
            let (source, ended) = match WireConnection::accept(stream, &settings, &shutdown).await {
                Ok(wire) => (wire.hello.instance_id.clone(), serve(wire, address, context).await),
                Err(error) => (String::new(), Err(error)),
            };
            if let Err(error) = ended {
                connection_ended(&metrics, log, address, &source, &error);
            }
        }
    })
    .await;
}

/// Counts (`frame_errors_total{reason}`) and logs, at `log`'s rate, why the wire
/// connection from `peer` (instance `source`, empty before its handshake) ended, unless
/// it ended cleanly. Every close a listener decides comes through here, whether the
/// wire found it (a deadline, a frame too large) or the daemon behind it did
/// ([`WireError::Closed`]: a frame that does not decode), so that the count and the log
/// line never drift apart.
pub fn connection_ended(
    metrics: &ListenerMetrics,
    log: &RateLimitedLog,
    peer: SocketAddr,
    source: &str,
    error: &WireError,
) {
    let Some(reason) = error.reason() else { return };
    metrics.frame_error(reason);
    if log.allow() {
        let error = tessera_runtime::logging::error_chain(error);
        tracing::warn!(%peer, source, reason = reason.as_str(), %error, "closing connection");
    }
}

/// Deadlines of a wire connection.
#[derive(Debug, Clone, Copy)]
pub struct WireDeadlines {
    /// Time allowed for the client's handshake.
    pub handshake: Duration,
    /// After the handshake, the longest silence before the connection is closed.
    pub idle: Duration,
}

/// Why a wire connection ended or must end.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// No handshake within the deadline.
    #[error("no handshake within {0:?}")]
    HandshakeTimeout(Duration),
    /// The handshake failed (not a hello, another protocol version, i/o).
    #[error("handshake failed")]
    Handshake(#[source] HandshakeError),
    /// The TLS handshake failed: no valid client certificate, not TLS at all, i/o.
    #[error("TLS handshake failed")]
    Tls(#[source] std::io::Error),
    /// No frame for the idle deadline.
    #[error("no frame for {0:?}")]
    Idle(Duration),
    /// Reading a frame failed; [`FrameError::Closed`] is a clean end.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The daemon behind the listener closed the connection: what it read cannot be
    /// trusted (not a frame, no body, a frame of the wrong kind).
    #[error("{message}")]
    Closed {
        /// Why, for `frame_errors_total`.
        reason: CloseReason,
        /// What was wrong, for the log.
        message: String,
    },
    /// The process is shutting down.
    #[error("shutting down")]
    Shutdown,
}

impl WireError {
    /// For a failed TLS handshake, why, as a short label for logs (see [`failure_label`]).
    pub fn tls_failure(&self) -> Option<&'static str> {
        match self {
            WireError::Tls(error) => Some(failure_label(error)),
            _ => None,
        }
    }

    /// The `reason` label of `frame_errors_total`, or `None` for a clean end
    /// (the peer closed between frames, or shutdown).
    pub fn reason(&self) -> Option<CloseReason> {
        match self {
            WireError::HandshakeTimeout(_) | WireError::Handshake(_) => Some(CloseReason::Handshake),
            WireError::Tls(_) => Some(CloseReason::Tls),
            WireError::Idle(_) => Some(CloseReason::IdleTimeout),
            WireError::Frame(FrameError::Closed) | WireError::Shutdown => None,
            WireError::Frame(FrameError::TooLarge { .. }) => Some(CloseReason::TooLarge),
            WireError::Frame(_) => Some(CloseReason::Io),
            WireError::Closed { reason, .. } => Some(*reason),
        }
    }
}

/// A wire connection after its handshake: reads length-prefixed frames under the idle
/// deadline, refusing a declared length over the maximum before reading the body.
pub struct WireConnection {
    /// The stream, for writing answers.
    pub stream: WireStream,
    /// Who connected, from its hello.
    pub hello: Hello,
    deadlines: WireDeadlines,
    max_frame_bytes: usize,
}

impl WireConnection {
    /// Takes the TLS handshake when `settings` say so, then answers the client's handshake
    /// as `settings.instance_id`, all within the handshake deadline.
    ///
    /// # Errors
    ///
    /// [`WireError::HandshakeTimeout`], [`WireError::Tls`], [`WireError::Handshake`], or
    /// [`WireError::Shutdown`] when `shutdown` fires first.
    pub async fn accept(
        stream: TcpStream,
        settings: &ListenerSettings,
        shutdown: &Shutdown,
    ) -> Result<WireConnection, WireError> {
        let deadlines = settings.deadlines();
        let handshakes = async {
            let mut stream = match &settings.tls {
                None => WireStream::Plain(stream),
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                    WireStream::Server(Box::new(acceptor.accept(stream).await.map_err(WireError::Tls)?))
                }
            };
            let hello =
                framing::server_handshake(&mut stream, &settings.instance_id).await.map_err(WireError::Handshake)?;
            Ok::<_, WireError>((stream, hello))
        };
        let (stream, hello) = tokio::select! {
            handshake = tokio::time::timeout(deadlines.handshake, handshakes) => match handshake {
                Ok(result) => result?,
                Err(_) => return Err(WireError::HandshakeTimeout(deadlines.handshake)),
            },
            () = shutdown.wait() => return Err(WireError::Shutdown),
        };
        Ok(WireConnection { stream, hello, deadlines, max_frame_bytes: settings.max_frame_bytes })
    }

    /// The next frame's body (without its length prefix).
    ///
    /// # Errors
    ///
    /// [`WireError::Idle`] after the idle deadline with no frame begun or finished,
    /// [`WireError::Frame`] (`Closed` when the peer ended between frames), or
    /// [`WireError::Shutdown`].
    pub async fn next_frame(&mut self, shutdown: &Shutdown) -> Result<Vec<u8>, WireError> {
        let idle = self.deadlines.idle;
        let reading = read_frame_bytes(&mut self.stream, self.max_frame_bytes);
        tokio::select! {
            read = tokio::time::timeout(idle, reading) => match read {
                Ok(frame) => Ok(frame?),
                Err(_) => Err(WireError::Idle(idle)),
            },
            () = shutdown.wait() => Err(WireError::Shutdown),
        }
    }
}

/// Reads one frame's body without decoding it; a declared length over `max_frame_bytes`
/// is refused before the body is read. [`FrameError::Closed`] when the stream ends
/// between frames.
pub async fn read_frame_bytes<R: AsyncRead + Unpin>(
    stream: &mut R,
    max_frame_bytes: usize,
) -> Result<Vec<u8>, FrameError> {
    let len = framing::read_length_prefix(stream, max_frame_bytes).await?;
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::framing::LENGTH_PREFIX_BYTES;
    use tessera_proto::{Ack, Frame, frame::Body};

    #[tokio::test]
    async fn frame_bodies_are_read_whole_and_oversized_ones_are_refused_early() {
        let ack = Frame { body: Some(Body::Ack(Ack { sequence: 4, ..Default::default() })) };
        let bytes = framing::encode_frame(&ack, 1024).unwrap();
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        for _ in 0..2 {
            tokio::io::AsyncWriteExt::write_all(&mut a, &bytes).await.unwrap();
        }
        tokio::io::AsyncWriteExt::write_all(&mut a, &(1_000_000u32).to_be_bytes()).await.unwrap();
        drop(a);
        for _ in 0..2 {
            assert_eq!(read_frame_bytes(&mut b, 1024).await.unwrap(), bytes[LENGTH_PREFIX_BYTES..]);
        }
        let too_large = read_frame_bytes(&mut b, 1024).await;
        assert!(matches!(too_large, Err(FrameError::TooLarge { len: 1_000_000, .. })));
        assert!(matches!(read_frame_bytes(&mut b, 1024).await, Err(FrameError::Closed)));
    }
}
