//! Intake: collectors' partial batches in, acks out.
//!
//! ```text
//! collector ──▶ connection task ──frame bytes──▶ decoder thread ──SplitBatch──▶ admission (crate::tile)
//!    ▲         (listener.rs)                     (decode.rs, dictionary.rs)         │
//!    │                ▲                             │ not_owner, malformed          │ too_late, too_early,
//!    └───── ack ◀─────┴─────────────────────────────┴───────────────────────────────┘ buffer_full, ok
//! ```
//!
//! - [`listener`]: the wire listener; one task per connection moves bytes:
//!   it reads a frame, hands it to the decoder thread, waits for the
//!   answer and writes the ack.
//! - [`decode`]: turns a frame into a batch split by merge thread, or into
//!   the refusal to send back (frame, ownership, aggregates).
//! - [`dictionary`]: each connection's series dictionary.
//!
//! The decoder thread ([`run_decoder`]) runs off the async runtime and
//! passes what it decoded (and every connection's opening and end) on to
//! admission (the tile stage), which answers each batch. The intake imports nothing
//! of the stages after it: what it hands on ([`AdmissionJob`]) is its own.

mod batch;
mod decode;
mod dictionary;
mod listener;
mod metrics;

#[cfg(test)]
pub use batch::thread_of;
pub use batch::{AdmissionJob, Partial, SplitBatch, Via};
pub use decode::{Decoded, Decoder};
pub use listener::accept_loop;
pub use metrics::{IntakeMetrics, REFUSAL_LOG, Refusals};

use crossbeam_channel::{Receiver, Sender};
use tessera_proto::AckReason;
use tessera_wire::Answer;
use tokio::sync::oneshot;

/// What a connection task hands the decoder.
pub enum Inbound {
    /// A collector finished its handshake.
    Opened {
        /// Unique per connection in this process.
        connection: u64,
        /// The collector's instance id.
        source: String,
        /// The collector's stream of batches to this aggregator (`Hello.stream`; 0: none).
        stream: u64,
    },
    /// A frame, to be answered.
    Frame(FrameJob),
    /// The connection is gone.
    Closed {
        /// The connection.
        connection: u64,
    },
}

/// A frame read by a connection, for the decoder.
pub struct FrameJob {
    /// The connection it came on.
    pub connection: u64,
    /// The frame's body (without its length prefix).
    pub frame: Vec<u8>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// The decoder thread: decodes and checks frames until every connection
/// and the accept loop have hung up, then returns (closing admission's input). A batch
/// refused here is counted in `refusals`, with admission's.
pub fn run_decoder(
    jobs: Receiver<Inbound>,
    mut decoder: Decoder,
    admission: Sender<AdmissionJob>,
    metrics: IntakeMetrics,
    refusals: Refusals,
) {
    while let Ok(job) = jobs.recv() {
        let job = match job {
            Inbound::Frame(job) => job,
            // Admission is gone only at shutdown, when nothing is left to close.
            Inbound::Opened { connection, source, stream } => {
                let _ = admission.send(AdmissionJob::Opened { connection, source, stream });
                continue;
            }
            Inbound::Closed { connection } => {
                decoder.closed(connection);
                metrics.dictionary_refs.set(decoder.dictionary_refs() as i64);
                let _ = admission.send(AdmissionJob::Closed { connection });
                continue;
            }
        };
        metrics.batches_received.inc();
        metrics.bytes_received.inc_by(job.frame.len() as u64);
        let connection = job.connection;
        let decoded = decoder.decode(connection, &job.frame);
        if let Some(connection) = decoder.take_forgotten() {
            metrics.dictionaries_restarted.inc();
            let _ = admission.send(AdmissionJob::Forget { connection });
        }
        metrics.dictionary_refs.set(decoder.dictionary_refs() as i64);
        let reply = match decoded {
            Decoded::Batch { sequence, batch } => {
                metrics.partials_received.inc_by(batch.partials());
                let job = AdmissionJob::Batch { connection, sequence, batch, reply: job.reply };
                match admission.send(job) {
                    Ok(()) => continue,
                    Err(crossbeam_channel::SendError(job)) => {
                        let AdmissionJob::Batch { batch, reply, .. } = job else { unreachable!("sent a batch") };
                        let partials = batch.partials();
                        refusals.rejected(AckReason::ShuttingDown, partials);
                        let _ = reply.send(Answer::refusal(sequence, AckReason::ShuttingDown, "shutting down".into()));
                        continue;
                    }
                }
            }
            Decoded::Refused { sequence, reason, message, partials, watermark_ms } => {
                metrics.partials_received.inc_by(partials);
                refusals.rejected(reason, partials);
                if REFUSAL_LOG.allow() {
                    tracing::warn!(reason = reason.as_str(), partials, %message, "partial batch refused");
                }
                if let Some(watermark_ms) = watermark_ms.filter(|_| !reason.is_retryable()) {
                    let _ = admission.send(AdmissionJob::Watermark { connection, watermark_ms });
                }
                Answer::refusal(sequence, reason, message)
            }
            Decoded::Protocol { reason, message } => Answer::Close { reason, message },
        };
        // The connection may be gone already; nothing to do then.
        let _ = job.reply.send(reply);
    }
}
