//! One long-lived worker: takes requests from its channel, one at a time, and sends each
//! until storage takes it or refuses it for good.
//!
//! Per attempt: wait for a slot under the adaptive limit, wait for the samples/s ceiling,
//! send, report the outcome to the limit (which frees the slot). A retryable error waits
//! `initial × 2^attempt` (capped, with jitter between half and all of it: the one
//! `Backoff` of `tessera-runtime`) and tries
//! again, without a slot held. While the ingester is fenced off ([`crate::tier::fence`]) no
//! attempt starts, and one of a target of running totals in flight when the fence falls is
//! cancelled and tried again once it lifts. On shutdown a worker finishes the request it is sending
//! but starts no new attempt and takes no new request; what it did not finish stays in
//! the queue for the next start.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tessera_core::clock::now_ms;

use tessera_runtime::Backoff;
use tessera_runtime::{RateLimitedLog, Shutdown};
use tokio::sync::mpsc;

use super::pacing::Outcome;
use super::{PoolSettings, Target, WorkItem};
use crate::queue::record::StoredSample;
use crate::sink::{Sink, SinkError, SinkRequest};

static RETRY_LOG: RateLimitedLog = RateLimitedLog::new("ingester.sink_retry", 2);
static REJECT_LOG: RateLimitedLog = RateLimitedLog::new("ingester.sink_rejected", 2);

/// The worker loop; see the [module docs](self).
pub async fn run<S: Sink>(
    index: usize,
    target: Arc<Target<S>>,
    mut requests: mpsc::Receiver<WorkItem>,
    settings: PoolSettings,
    stop: Shutdown,
) {
    let busy = target.metrics.worker_busy(index);
    loop {
        let item = tokio::select! {
            biased;
            () = stop.wait() => break,
            item = requests.recv() => match item {
                Some(item) => item,
                None => break,
            },
        };
        let began = Instant::now();
        send(&target, &item, &settings, &stop).await;
        busy.inc_by(began.elapsed().as_secs_f64());
    }
}

async fn send<S: Sink>(target: &Target<S>, item: &WorkItem, settings: &PoolSettings, stop: &Shutdown) {
    let mut request = std::borrow::Cow::Borrowed(&item.request);
    let record = &item.request.record;
    let metrics = &target.metrics;
    if !item.ticket.started.swap(true, Ordering::AcqRel) {
        let waited = (now_ms() - record.received_at_ms).max(0) as f64 / 1000.0;
        metrics.pool().queue_time(&record.resolution).observe_n(waited, u64::from(record.tiles));
    }
    let mut attempt = 0u32;
    let mut backoff = Backoff::new(settings.retry_initial_backoff, settings.retry_max_backoff);
    loop {
        let samples = request.samples.len();
        if !target.fence.wait_open(stop).await {
            return;
        }
        let permit = tokio::select! {
            biased;
            () = stop.wait() => return,
            permit = target.limit.acquire() => permit,
        };
        tokio::select! {
            biased;
            () = stop.wait() => return,
            () = target.pace.wait(samples) => {}
        }
        // Fenced off (the liveness lease may expire) while it waited: nothing new goes out.
        if !target.fence.allows() {
            permit.finish(Outcome::Neutral);
            continue;
        }
        // A request of running totals in flight when the fence falls is cancelled.
        let started = Instant::now();
        let result = if target.sink.keeps_totals() {
            tokio::select! {
                result = target.sink.write(&request) => result,
                () = target.fence.fallen() => Err(SinkError::Retryable {
                    reason: "fenced",
                    message: "cancelled in flight: the ingester was fenced off".to_owned(),
                    overloaded: false,
                }),
            }
        } else {
            target.sink.write(&request).await
        };
        metrics.sink.writes.request_duration.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                permit.finish(Outcome::Success);
                metrics.sink.request("ok");
                metrics.sink.writes.samples_written.inc_by(samples as u64);
                complete(target, item);
                return;
            }
            Err(SinkError::Permanent { status, message }) => {
                permit.finish(Outcome::Neutral);
                metrics.sink.request("rejected");
                reject(target, &request, status, &message);
                complete(target, item);
                return;
            }
            Err(SinkError::HistogramsRefused { status, message }) => {
                // Refused for good, but only for the histograms: they are rejected, and the
                // rest goes again alone, at once.
                permit.finish(Outcome::Neutral);
                metrics.sink.request("histograms_refused");
                let is_histogram = |sample: &StoredSample| !sample.histogram.is_empty();
                let message = format!(
                    "{message} (start Prometheus with --enable-feature=native-histograms, or set histograms = \"summary\" for this target)"
                );
                reject(target, &request.only(is_histogram), status, &message);
                request = std::borrow::Cow::Owned(request.only(|sample| !is_histogram(sample)));
                if request.samples.is_empty() {
                    complete(target, item);
                    return;
                }
            }
            Err(error @ (SinkError::Retryable { .. } | SinkError::RetryAfter { .. })) => {
                let (reason, message, overloaded, at_least) = match error {
                    SinkError::Retryable { reason, message, overloaded } => (reason, message, overloaded, None),
                    SinkError::RetryAfter { reason, message, after } => (reason, message, true, Some(after)),
                    _ => unreachable!("matched above"),
                };
                permit.finish(if overloaded { Outcome::Overloaded } else { Outcome::Neutral });
                metrics.sink.request(reason);
                if stop.is_triggered() {
                    return;
                }
                metrics.sink.writes.retries.inc();
                let delay = backoff.next_delay().max(at_least.unwrap_or_default());
                attempt = attempt.saturating_add(1);
                if RETRY_LOG.allow() {
                    tracing::warn!(
                        target = target.name,
                        reason,
                        message,
                        attempt,
                        delay_ms = delay.as_millis() as u64,
                        "storage request failed; retrying"
                    );
                }
                tokio::select! {
                    biased;
                    () = stop.wait() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Counts `request`'s samples as refused for good with `status` and logs them (see the
/// rejected-samples log).
fn reject<S: Sink>(target: &Target<S>, request: &SinkRequest, status: u16, message: &str) {
    let samples = request.samples.len();
    target.metrics.sink.rejected(status, samples as u64);
    target.rejected.write(&target.name, request, status, message);
    if REJECT_LOG.allow() {
        tracing::warn!(target = target.name, status, samples, message, log = %target.rejected.path().display(), "storage refused samples for good; logged them");
    }
}

/// Marks the request done and records the end-to-end latency of its tiles (see the
/// [pool docs](super)); completes the record when it was the last one.
fn complete<S: Sink>(target: &Target<S>, item: &WorkItem) {
    let request = &item.request;
    let record = &request.record;
    let ticket = &item.ticket;
    target.queue.request_done(record.position, request.key);
    let tiles = u64::from(record.tiles);
    let share = tiles * request.samples.len() as u64 / ticket.samples.max(1) as u64;
    let reported = ticket.tiles_reported.fetch_add(share, Ordering::AcqRel) + share;
    let last = ticket.outstanding.fetch_sub(1, Ordering::AcqRel) == 1;
    let counted = if last { share + tiles.saturating_sub(reported) } else { share };
    let latency = (now_ms() - record.tile_end_ms).max(0) as f64 / 1000.0;
    if counted > 0 {
        target.metrics.pool().end_to_end(&record.resolution).observe_n(latency, counted);
    }
    if last {
        target.queue.complete(record.position);
        target.metrics.sink.writes.records_written.inc();
    }
}
