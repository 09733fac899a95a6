//! The sending side of a connection between daemons: connect and
//! handshake under a timeout, then exchange one framed batch for its
//! acknowledgement.
//!
//! Collectors (to aggregators) and aggregators (to ingesters) both send
//! one batch at a time over a long-lived connection; this module is that
//! shared exchange, so each sender only decides what to do with the
//! [`tessera_proto::Ack`].

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::stream::WireStream;
use crate::tls::{ClientTlsConfig, Reloading, failure_label, tls_failure};

use tessera_proto::framing::{self, FrameError, HandshakeError};
use tessera_proto::{Ack, Role, frame::Body};

/// Largest acknowledgement frame accepted.
const MAX_ACK_FRAME_BYTES: usize = 1 << 20;

/// Why connecting or one exchange failed. Every variant means the
/// connection can no longer be used: reconnect and send the batch again.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection could not be made.
    #[error("connect to {endpoint} failed")]
    Connect {
        /// Where to.
        endpoint: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (an unknown or expired certificate, a name mismatch, no
    /// client certificate where one is required).
    #[error("TLS handshake with {endpoint} failed")]
    Tls {
        /// Where to.
        endpoint: String,
        /// rustls's reason, inside an io::Error.
        #[source]
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The handshake failed.
    #[error("handshake failed")]
    Handshake(#[from] HandshakeError),
    /// The answer could not be read.
    #[error("frame exchange failed")]
    Frame(#[from] FrameError),
    /// Writing failed.
    #[error("write failed")]
    Io(#[from] std::io::Error),
    /// The peer answered with something other than an ack.
    #[error("unexpected answer `{0}` (wanted an ack)")]
    Unexpected(&'static str),
    /// The ack is for another batch.
    #[error("ack for sequence {got}, expected {expected}")]
    Sequence {
        /// The ack's sequence.
        got: u64,
        /// The batch's.
        expected: u64,
    },
}

impl ClientError {
    /// A stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ClientError::Connect { .. } => "connect",
            ClientError::Tls { .. } => "tls",
            ClientError::Timeout(_) => "timeout",
            ClientError::Handshake(_) => "handshake",
            ClientError::Frame(_) | ClientError::Io(_) => "io",
            ClientError::Unexpected(_) | ClientError::Sequence { .. } => "protocol",
        }
    }
}

/// TLS towards destinations: the client configuration, rebuilt when its files change,
/// and the settings it came from (the server name to expect).
pub struct ClientTls {
    /// The rustls configuration of the next connection.
    pub config: Reloading<ClientConfig>,
    /// What it was built from.
    pub settings: ClientTlsConfig,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl ClientError {
    /// For a failed TLS handshake, why, as a metric label (see [`failure_label`]). Under
    /// TLS 1.3 a server refuses a client's certificate (or its absence) after the client
    /// has finished its side of the handshake: the client reads the server's alert in the
    /// wire handshake that follows, so a rustls error anywhere in the chain counts too.
    pub fn tls_failure(&self) -> Option<&'static str> {
        match self {
            ClientError::Tls { source, .. } => Some(failure_label(source)),
            other => tls_failure(other),
        }
    }
}

/// The host of `host:port` (`[v6]:port` too), to check a server certificate against.
fn host_of(endpoint: &str) -> &str {
    let host = endpoint.rsplit_once(':').map_or(endpoint, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Connects to `endpoint`, under TLS when `tls` is given (the server's certificate checked
/// against the endpoint's host), and performs the handshake as `role` for the sender's
/// stream of batches `sender_stream` (`Hello.stream`, 0 for none), all within `timeout`.
pub async fn connect(
    endpoint: &str,
    role: Role,
    instance_id: &str,
    sender_stream: u64,
    timeout: Duration,
    tls: Option<&Arc<ClientTls>>,
) -> Result<WireStream, ClientError> {
    let connecting = async {
        let tcp = TcpStream::connect(endpoint)
            .await
            .map_err(|source| ClientError::Connect { endpoint: endpoint.to_owned(), source })?;
        tcp.set_nodelay(true)?;
        let mut stream = match tls {
            None => WireStream::Plain(tcp),
            Some(tls) => {
                let tls_error = |source| ClientError::Tls { endpoint: endpoint.to_owned(), source };
                let name = tls
                    .settings
                    .server_name(host_of(endpoint))
                    .map_err(|error| tls_error(std::io::Error::other(error)))?;
                let connector = tokio_rustls::TlsConnector::from(tls.config.current());
                WireStream::Client(Box::new(connector.connect(name, tcp).await.map_err(tls_error)?))
            }
        };
        framing::client_handshake_for(&mut stream, role, instance_id, sender_stream).await?;
        Ok(stream)
    };
    tokio::time::timeout(timeout, connecting).await.map_err(|_| ClientError::Timeout(timeout))?
}

/// Writes `frame` (a whole frame, length prefix included) and waits up to
/// `ack_timeout` for the ack of batch `sequence`.
pub async fn exchange(
    stream: &mut WireStream,
    frame: &[u8],
    sequence: u64,
    scratch: &mut Vec<u8>,
    ack_timeout: Duration,
) -> Result<Ack, ClientError> {
    let round_trip = async {
        stream.write_all(frame).await?;
        // Under TLS, `write_all` can return with the last records still in the session's
        // buffer (the socket was full): without a flush they would wait for the next
        // write, and the ack for them, until the ack timeout.
        stream.flush().await?;
        let answer = framing::read_frame(stream, scratch, MAX_ACK_FRAME_BYTES).await?;
        match answer.body {
            Some(Body::Ack(ack)) if ack.sequence == sequence => Ok(ack),
            Some(Body::Ack(ack)) => Err(ClientError::Sequence { got: ack.sequence, expected: sequence }),
            _ => Err(ClientError::Unexpected(framing::body_kind(&answer))),
        }
    };
    tokio::time::timeout(ack_timeout, round_trip).await.map_err(|_| ClientError::Timeout(ack_timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::{AckStatus, Frame};

    async fn server(answer: Option<u64>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            framing::server_handshake(&mut stream, "server").await.unwrap();
            let mut scratch = Vec::new();
            framing::read_frame(&mut stream, &mut scratch, 1 << 20).await.unwrap();
            // `None`: hang up without answering.
            if let Some(sequence) = answer {
                let ack = Ack { sequence, status: AckStatus::Ok as i32, ..Default::default() };
                framing::write_frame(&mut stream, &Frame { body: Some(Body::Ack(ack)) }, 1 << 20).await.unwrap();
            }
        });
        address
    }

    fn frame(sequence: u64) -> Vec<u8> {
        let ack = Ack { sequence, ..Default::default() };
        framing::encode_frame(&Frame { body: Some(Body::Ack(ack)) }, 1 << 20).unwrap()
    }

    #[tokio::test]
    async fn an_exchange_returns_the_ack_of_its_batch() {
        let address = server(Some(7)).await;
        let mut stream = connect(&address, Role::Tool, "t", 0, Duration::from_secs(5), None).await.unwrap();
        let ack = exchange(&mut stream, &frame(7), 7, &mut Vec::new(), Duration::from_secs(5)).await.unwrap();
        assert_eq!(ack.sequence, 7);
    }

    #[tokio::test]
    async fn failures_are_told_apart_by_reason() {
        let address = server(Some(8)).await;
        let mut stream = connect(&address, Role::Tool, "t", 0, Duration::from_secs(5), None).await.unwrap();
        let error = exchange(&mut stream, &frame(7), 7, &mut Vec::new(), Duration::from_secs(5)).await.unwrap_err();
        assert_eq!((error.reason(), error.to_string().as_str()), ("protocol", "ack for sequence 8, expected 7"));

        let address = server(None).await;
        let mut stream = connect(&address, Role::Tool, "t", 0, Duration::from_secs(5), None).await.unwrap();
        let error = exchange(&mut stream, &frame(1), 1, &mut Vec::new(), Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(error.reason(), "io", "{error}");

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
        let error = connect(&closed, Role::Tool, "t", 0, Duration::from_secs(5), None).await.unwrap_err();
        assert_eq!(error.reason(), "connect", "{error}");
    }
}
