//! The dedicated threads between the wire and the ingester client.
//!
//! ```text
//! connection tasks ──frame bytes──▶ decoder ──SplitBatch──▶ admission ──shares──▶ merge threads ──parts──▶ flusher
//!        ▲                             │ not_owner,             │ too_late, too_early,                      │ frames,
//!        └──────────── ack ◀───────────┴ malformed ◀────────────┴ buffer_full, ok                           ▼ ingester queues
//! ```
//!
//! Decoding, merging and cutting never run on a tokio worker. Each
//! connection waits for the answer to one batch before reading the next,
//! so what sits in the decoder's and admission's channels is bounded by
//! the number of connections times one frame, and the merge threads'
//! queues are bounded. The admission thread alone owns the clock that
//! closes tiles and checks each batch once, against a shadow of the merge
//! threads' tiles ([`crate::merge`]): a batch is merged whole or refused whole.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tessera_proto::{Ack, AckStatus};
use tessera_runtime::RateLimitedLog;
use tokio::sync::oneshot;

use crate::decode::{Decoded, Decoder, SplitBatch};
use crate::ingester::Ingesters;
use crate::merge::MergeTier;
use crate::metrics::{Metrics, Reason};
use crate::now_ms;
use crate::tiler::{Batch, Tiler};

/// Longest admission sleeps without looking at the clock.
const MAX_ADMISSION_SLEEP: Duration = Duration::from_millis(100);

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

/// A decoded batch, for admission.
pub struct BatchJob {
    sequence: u64,
    batch: SplitBatch,
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
/// and the accept loop have hung up, then returns (closing admission's input).
pub fn run_decoder(jobs: Receiver<FrameJob>, mut decoder: Decoder, admission: Sender<BatchJob>, metrics: Metrics) {
    while let Ok(job) = jobs.recv() {
        metrics.batches_received.inc();
        metrics.bytes_received.inc_by(job.frame.len() as u64);
        let reply = match decoder.decode(&job.frame) {
            Decoded::Batch { sequence, batch } => {
                metrics.partials_received.inc_by(batch.partials());
                let job = BatchJob { sequence, batch, reply: job.reply };
                match admission.send(job) {
                    Ok(()) => continue,
                    Err(crossbeam_channel::SendError(job)) => {
                        let partials = job.batch.partials();
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

/// The admission thread: admits or refuses batches, dispatches their
/// shares to the merge threads, and tells them when tiles close. When its
/// input closes (shutdown), it has every open tile closed, due or not, and
/// returns (closing the merge threads' input).
pub fn run_admission(
    mut shadow: Tiler,
    mut tier: MergeTier,
    jobs: Receiver<BatchJob>,
    ingesters: Ingesters,
    metrics: Metrics,
) {
    loop {
        let wait_ms = (shadow.next_close_ms() - now_ms()).clamp(1, MAX_ADMISSION_SLEEP.as_millis() as i64);
        match jobs.recv_timeout(Duration::from_millis(wait_ms as u64)) {
            Ok(job) => {
                let reply = admit(&mut shadow, &mut tier, job.sequence, job.batch, &ingesters, &metrics);
                let _ = job.reply.send(reply);
            }
            Err(RecvTimeoutError::Timeout) => tier.close_due(&mut shadow, now_ms()),
            Err(RecvTimeoutError::Disconnected) => {
                tier.close_due(&mut shadow, now_ms());
                tier.close_all(&mut shadow);
                return;
            }
        }
    }
}

fn admit(
    shadow: &mut Tiler,
    tier: &mut MergeTier,
    sequence: u64,
    batch: SplitBatch,
    ingesters: &Ingesters,
    metrics: &Metrics,
) -> Reply {
    let now = now_ms();
    let partials = batch.partials();
    tier.close_due(shadow, now);
    if !ingesters.has_room() {
        metrics.rejected(Reason::BufferFull, partials);
        return refusal(sequence, Reason::BufferFull, "every ingester buffer is full".into());
    }
    // The shadow holds no series: accepting the empty batch checks the
    // window and opens its tiles, as the merge threads will.
    let window = Batch { window_start_ms: batch.window_start_ms, window_ms: batch.window_ms, partials: Vec::new() };
    match shadow.accept(&window, now, &mut |_| {}) {
        Ok(_) => {
            tier.dispatch(batch.window_start_ms, batch.window_ms, batch.shares);
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
