//! The long-lived sender task of one ingester endpoint.
//!
//! It connects (with backoff and jitter), performs the handshake as
//! [`Role::Aggregator`], then sends one batch at a time and waits for its
//! acknowledgement: `ok` forgets the batch, `retryable` puts it back at the
//! head and waits a backoff, `permanent` drops it and counts the reason. A
//! broken connection or a missing ack puts the batch back at the head and
//! reconnects, so nothing within the buffer bound is lost while an
//! ingester is away.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_proto::framing::{self, FrameError};
use tessera_proto::{Ack, AckStatus, Role, frame::Body};
use tessera_runtime::Shutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::queue::{OutboundQueue, Outgoing};
use crate::decode::error_chain;

/// Settings shared by every sender.
#[derive(Debug, Clone)]
pub struct SenderSettings {
    /// This aggregator's id, sent in the handshake.
    pub source: String,
    /// Connect and handshake timeout.
    pub connect_timeout: Duration,
    /// Acknowledgement timeout.
    pub ack_timeout: Duration,
    /// First retry delay.
    pub reconnect_min: Duration,
    /// Longest retry delay.
    pub reconnect_max: Duration,
}

/// Why one exchange failed.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("connect to {endpoint} failed")]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("handshake failed")]
    Handshake(#[from] framing::HandshakeError),
    #[error("frame exchange failed")]
    Frame(#[from] FrameError),
    #[error("write failed")]
    Io(#[from] std::io::Error),
    #[error("unexpected answer `{0}` (wanted an ack)")]
    Unexpected(&'static str),
    #[error("ack for sequence {got}, expected {expected}")]
    Sequence { got: u64, expected: u64 },
}

/// Runs the sender of `queue` until `stop` fires.
pub async fn run_sender(queue: Arc<OutboundQueue>, settings: SenderSettings, stop: Shutdown) {
    let endpoint = queue.endpoint().to_owned();
    let mut rng = SmallRng::from_os_rng();
    let mut backoff = settings.reconnect_min;
    loop {
        if !wait_for_work(&queue, &stop).await {
            return;
        }
        let mut stream = match connect(&endpoint, &settings).await {
            Ok(stream) => stream,
            Err(error) => {
                queue.metrics.connect_errors.inc();
                tracing::warn!(%endpoint, error = %error_chain(&error), "cannot reach ingester; will retry");
                if !sleep_or_stop(jitter(&mut rng, backoff), &stop).await {
                    return;
                }
                backoff = (backoff * 2).min(settings.reconnect_max);
                continue;
            }
        };
        tracing::info!(%endpoint, "connected to ingester");
        queue.set_connected(true);
        backoff = settings.reconnect_min;
        let mut scratch = Vec::new();
        loop {
            if !wait_for_work(&queue, &stop).await {
                queue.set_connected(false);
                return;
            }
            let Some(batch) = queue.pop_front() else { continue };
            let started = Instant::now();
            let ack = match exchange(&mut stream, &batch, &mut scratch, settings.ack_timeout).await {
                Ok(ack) => ack,
                Err(error) => {
                    tracing::warn!(%endpoint, error = %error_chain(&error), "connection to ingester lost; reconnecting");
                    queue.push_front(batch);
                    queue.set_connected(false);
                    break;
                }
            };
            match AckStatus::try_from(ack.status).unwrap_or(AckStatus::Unspecified) {
                AckStatus::Ok => {
                    let metrics = &queue.metrics;
                    metrics.ack_latency.observe(started.elapsed().as_secs_f64());
                    metrics.batches_sent.inc();
                    metrics.bytes_sent.inc_by(batch.frame.len() as u64);
                    metrics.series_sent.inc_by(batch.series);
                    queue.finish_in_flight();
                    backoff = settings.reconnect_min;
                }
                AckStatus::Retryable => {
                    tracing::debug!(%endpoint, reason = %ack.reason, "tile batch refused for now; retrying");
                    queue.push_front(batch);
                    if !sleep_or_stop(jitter(&mut rng, backoff), &stop).await {
                        queue.set_connected(false);
                        return;
                    }
                    backoff = (backoff * 2).min(settings.reconnect_max);
                }
                AckStatus::Permanent | AckStatus::Unspecified => {
                    let reason = closed_reason(&ack.reason);
                    tracing::warn!(%endpoint, reason, message = %ack.message, series = batch.series, "tile batch rejected");
                    queue.metrics.rejected(reason);
                    queue.metrics.dropped("rejected", 1, batch.series);
                    queue.finish_in_flight();
                }
            }
        }
    }
}

/// Keeps metric labels to a closed set whatever a peer answers.
fn closed_reason(reason: &str) -> &'static str {
    match reason {
        "malformed" => "malformed",
        "too_old" => "too_old",
        "too_large" => "too_large",
        "" => "unspecified",
        _ => "other",
    }
}

async fn wait_for_work(queue: &OutboundQueue, stop: &Shutdown) -> bool {
    loop {
        if stop.is_triggered() {
            return false;
        }
        if queue.has_batches() {
            return true;
        }
        tokio::select! {
            () = queue.notified() => {}
            () = stop.wait() => return false,
            // A notification can race the check above; look again now and then.
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

async fn sleep_or_stop(duration: Duration, stop: &Shutdown) -> bool {
    tokio::select! {
        () = tokio::time::sleep(duration) => true,
        () = stop.wait() => false,
    }
}

/// A wait in `[base / 2, base]`.
fn jitter(rng: &mut SmallRng, base: Duration) -> Duration {
    let millis = base.as_millis() as u64;
    Duration::from_millis(millis / 2 + rng.random_range(0..=millis / 2))
}

async fn connect(endpoint: &str, settings: &SenderSettings) -> Result<TcpStream, SendError> {
    let connecting = async {
        let mut stream = TcpStream::connect(endpoint)
            .await
            .map_err(|source| SendError::Connect { endpoint: endpoint.to_owned(), source })?;
        stream.set_nodelay(true)?;
        framing::client_handshake(&mut stream, Role::Aggregator, &settings.source).await?;
        Ok(stream)
    };
    tokio::time::timeout(settings.connect_timeout, connecting)
        .await
        .map_err(|_| SendError::Timeout(settings.connect_timeout))?
}

async fn exchange(
    stream: &mut TcpStream,
    batch: &Outgoing,
    scratch: &mut Vec<u8>,
    ack_timeout: Duration,
) -> Result<Ack, SendError> {
    let round_trip = async {
        stream.write_all(&batch.frame).await?;
        let answer = framing::read_frame(stream, scratch, 1 << 20).await?;
        match answer.body {
            Some(Body::Ack(ack)) if ack.sequence == batch.sequence => Ok(ack),
            Some(Body::Ack(ack)) => Err(SendError::Sequence { got: ack.sequence, expected: batch.sequence }),
            _ => Err(SendError::Unexpected(framing::body_kind(&answer))),
        }
    };
    tokio::time::timeout(ack_timeout, round_trip).await.map_err(|_| SendError::Timeout(ack_timeout))?
}
