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

use tessera_proto::{AckStatus, Role, client};
use tessera_runtime::Shutdown;
use tessera_runtime::backoff::{Backoff, sleep_or_stop};
use tessera_runtime::logging::error_chain;

use super::queue::OutboundQueue;

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

/// Runs the sender of `queue` until `stop` fires.
pub async fn run_sender(queue: Arc<OutboundQueue>, settings: SenderSettings, stop: Shutdown) {
    let endpoint = queue.endpoint().to_owned();
    let mut backoff = Backoff::new(settings.reconnect_min, settings.reconnect_max);
    loop {
        if !wait_for_work(&queue, &stop).await {
            return;
        }
        let connecting = client::connect(&endpoint, Role::Aggregator, &settings.source, settings.connect_timeout);
        let mut stream = match connecting.await {
            Ok(stream) => stream,
            Err(error) => {
                queue.metrics.connect_errors.inc();
                tracing::warn!(%endpoint, error = %error_chain(&error), "cannot reach ingester; will retry");
                if !sleep_or_stop(backoff.next_delay(), &stop).await {
                    return;
                }
                continue;
            }
        };
        tracing::info!(%endpoint, "connected to ingester");
        queue.set_connected(true);
        backoff.reset();
        let mut scratch = Vec::new();
        loop {
            if !wait_for_work(&queue, &stop).await {
                queue.set_connected(false);
                return;
            }
            let Some(batch) = queue.pop_front() else { continue };
            let started = Instant::now();
            let exchanged =
                client::exchange(&mut stream, &batch.frame, batch.sequence, &mut scratch, settings.ack_timeout);
            let ack = match exchanged.await {
                Ok(ack) => ack,
                Err(error) => {
                    queue.metrics.send_error(error.reason());
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
                    backoff.reset();
                }
                AckStatus::Retryable => {
                    tracing::debug!(%endpoint, reason = %ack.reason, "tile batch refused for now; retrying");
                    queue.push_front(batch);
                    if !sleep_or_stop(backoff.next_delay(), &stop).await {
                        queue.set_connected(false);
                        return;
                    }
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
