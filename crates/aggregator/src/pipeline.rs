//! The dedicated threads between the wire and the ingester client.
//!
//! ```text
//! connection tasks ──frame bytes──▶ decoder thread ──Batch──▶ tiler thread ──ClosedTile──▶ flusher thread
//!        ▲                              │ not_owner,                │ too_late, too_early,        │ frames,
//!        └──────────── ack ◀────────────┴ malformed ◀───────────────┴ buffer_full, ok            ▼ ingester queues
//! ```
//!
//! Decoding, merging and cutting never run on a tokio worker. Each
//! connection waits for the answer to one batch before reading the next,
//! so what sits in these channels is bounded by the number of connections
//! times one frame. The tiler alone owns the tiles and the clock that
//! closes them, so its admission check and its merge see the same state:
//! a batch is merged whole or refused whole.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tessera_proto::{Ack, AckStatus};
use tessera_runtime::RateLimitedLog;
use tokio::sync::oneshot;

use crate::decode::{Decoded, Decoder};
use crate::ingester::Ingesters;
use crate::metrics::{Metrics, Reason};
use crate::now_ms;
use crate::tiler::{Batch, ClosedTile, Tiler};

/// Longest the tiler sleeps without looking at the clock.
const MAX_TILER_SLEEP: Duration = Duration::from_millis(100);

static REFUSAL_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.batch_refused", 5);

/// What a connection sends back for one frame.
#[derive(Debug)]
pub enum Reply {
    /// Answer with this ack and read the next frame.
    Ack(Ack),
    /// Close the connection (the stream cannot be trusted).
    Close {
        /// Closed-set label for the frame error counter.
        reason: &'static str,
        /// Details for the log.
        message: String,
    },
}

/// A frame read by a connection, for the decoder.
pub struct FrameJob {
    /// The frame, length prefix included.
    pub frame: Vec<u8>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

/// A decoded batch, for the tiler.
pub struct BatchJob {
    sequence: u64,
    batch: Batch,
    reply: oneshot::Sender<Reply>,
}

fn ack(sequence: u64, status: AckStatus, reason: &str, message: String) -> Reply {
    Reply::Ack(Ack { sequence, status: status as i32, message, reason: reason.to_owned() })
}

fn refusal(sequence: u64, reason: Reason, message: String) -> Reply {
    let status = if reason.is_retryable() { AckStatus::Retryable } else { AckStatus::Permanent };
    ack(sequence, status, reason.as_str(), message)
}

/// The decoder thread: decodes and checks frames until every connection
/// and the accept loop have hung up, then returns (closing the tiler's input).
pub fn run_decoder(jobs: Receiver<FrameJob>, mut decoder: Decoder, tiler: Sender<BatchJob>, metrics: Metrics) {
    while let Ok(job) = jobs.recv() {
        metrics.batches_received.inc();
        metrics.bytes_received.inc_by(job.frame.len() as u64);
        let reply = match decoder.decode(&job.frame) {
            Decoded::Batch { sequence, batch } => {
                metrics.partials_received.inc_by(batch.partials.len() as u64);
                let job = BatchJob { sequence, batch, reply: job.reply };
                match tiler.send(job) {
                    Ok(()) => continue,
                    Err(crossbeam_channel::SendError(job)) => {
                        let partials = job.batch.partials.len() as u64;
                        metrics.rejected(Reason::ShuttingDown, partials);
                        let _ = job.reply.send(refusal(sequence, Reason::ShuttingDown, "shutting down".into()));
                        continue;
                    }
                }
            }
            Decoded::Refused { sequence, reason, message, partials } => {
                metrics.partials_received.inc_by(partials);
                metrics.rejected(reason, partials);
                if REFUSAL_LOG.allow() {
                    tracing::warn!(reason = reason.as_str(), partials, %message, "partial batch refused");
                }
                refusal(sequence, reason, message)
            }
            Decoded::Protocol { reason, message } => {
                metrics.frame_error(reason);
                Reply::Close { reason, message }
            }
        };
        // The connection may be gone already; nothing to do then.
        let _ = job.reply.send(reply);
    }
}

/// The tiler thread: merges batches, closes due tiles and hands them to
/// the flusher. When its input closes (shutdown), it closes every open
/// tile, due or not, and returns.
pub fn run_tiler(
    mut tiler: Tiler,
    jobs: Receiver<BatchJob>,
    closed: Sender<ClosedTile>,
    ingesters: Ingesters,
    metrics: Metrics,
) {
    let mut emit = |tile: ClosedTile| {
        // The flusher outlives the tiler; if it is gone, so is the process.
        let _ = closed.send(tile);
    };
    loop {
        let wait_ms = (tiler.next_close_ms() - now_ms()).clamp(1, MAX_TILER_SLEEP.as_millis() as i64);
        match jobs.recv_timeout(Duration::from_millis(wait_ms as u64)) {
            Ok(job) => {
                let started = Instant::now();
                let reply = merge(&mut tiler, job.sequence, &job.batch, &ingesters, &metrics, &mut emit);
                metrics.merge_duration.observe(started.elapsed().as_secs_f64());
                let _ = job.reply.send(reply);
            }
            Err(RecvTimeoutError::Timeout) => tiler.close_due(now_ms(), &mut emit),
            Err(RecvTimeoutError::Disconnected) => {
                tiler.close_due(now_ms(), &mut emit);
                tiler.close_all(&mut emit);
                return;
            }
        }
    }
}

fn merge(
    tiler: &mut Tiler,
    sequence: u64,
    batch: &Batch,
    ingesters: &Ingesters,
    metrics: &Metrics,
    emit: &mut dyn FnMut(ClosedTile),
) -> Reply {
    let now = now_ms();
    let partials = batch.partials.len() as u64;
    if !ingesters.has_room() {
        tiler.close_due(now, emit);
        metrics.rejected(Reason::BufferFull, partials);
        return refusal(sequence, Reason::BufferFull, "every ingester buffer is full".into());
    }
    match tiler.accept(batch, now, emit) {
        Ok(applied) => {
            metrics.partials_merged.inc_by(applied.partials);
            metrics.gauge_order_ambiguous.inc_by(applied.gauge_order_ambiguous);
            metrics.dropped("series_limit", "series", applied.series_limit);
            ack(sequence, AckStatus::Ok, "", String::new())
        }
        Err(refused) => {
            let reason = refused.reason();
            metrics.rejected(reason, partials);
            if REFUSAL_LOG.allow() {
                tracing::warn!(reason = reason.as_str(), partials, error = %refused, "partial batch refused");
            }
            refusal(sequence, reason, refused.to_string())
        }
    }
}
