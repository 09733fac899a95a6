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
//! It also keeps every connection's watermark, and closes tiles on them
//! ([`crate::watermark`]); connections announce themselves and their end
//! through the same channels as their frames, so admission sees a
//! connection's batches between its `Opened` and its `Closed`.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tessera_proto::{Ack, AckReason, AckStatus};
use tessera_runtime::RateLimitedLog;
use tokio::sync::oneshot;

use crate::decode::{Decoded, Decoder, SplitBatch};
use crate::ingester::Ingesters;
use crate::merge::MergeTier;
use crate::metrics::Metrics;
use crate::tiler::{Batch, Tiler};
use crate::watermark::Watermarks;
use tessera_core::clock::now_ms;

/// Longest admission sleeps without looking at the clock.
const MAX_ADMISSION_SLEEP: Duration = Duration::from_millis(100);

/// How often the watermark lag gauges are refreshed.
const LAG_EXPORT_INTERVAL_MS: i64 = 1_000;

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

/// What a connection task hands the decoder.
pub enum Inbound {
    /// A collector finished its handshake.
    Opened {
        /// Unique per connection in this process.
        connection: u64,
        /// The collector's instance id.
        source: String,
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
    /// The frame, length prefix included.
    pub frame: Vec<u8>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

/// What the decoder hands admission.
pub enum AdmissionJob {
    /// See [`Inbound::Opened`].
    Opened {
        /// The connection.
        connection: u64,
        /// The collector's instance id.
        source: String,
    },
    /// A decoded batch to admit or refuse.
    Batch {
        /// The connection it came on.
        connection: u64,
        /// The sender's sequence.
        sequence: u64,
        /// The batch.
        batch: SplitBatch,
        /// Where the answer goes.
        reply: oneshot::Sender<Reply>,
    },
    /// The merge threads forget the connection's dictionary (its sender
    /// started a new one).
    Forget {
        /// The connection.
        connection: u64,
    },
    /// A batch the decoder refused for good still moves its sender's watermark.
    Watermark {
        /// The connection.
        connection: u64,
        /// The batch's watermark.
        watermark_ms: i64,
    },
    /// See [`Inbound::Closed`].
    Closed {
        /// The connection.
        connection: u64,
    },
}

/// Taken: acknowledged with no reason.
fn taken(sequence: u64) -> Reply {
    Reply::Ack(Ack { sequence, status: AckStatus::Ok as i32, ..Ack::default() })
}

fn refusal(sequence: u64, reason: AckReason, message: String) -> Reply {
    Reply::Ack(reason.ack(sequence, message))
}

/// The decoder thread: decodes and checks frames until every connection
/// and the accept loop have hung up, then returns (closing admission's input).
pub fn run_decoder(jobs: Receiver<Inbound>, mut decoder: Decoder, admission: Sender<AdmissionJob>, metrics: Metrics) {
    while let Ok(job) = jobs.recv() {
        let job = match job {
            Inbound::Frame(job) => job,
            // Admission is gone only at shutdown, when nothing is left to close.
            Inbound::Opened { connection, source } => {
                let _ = admission.send(AdmissionJob::Opened { connection, source });
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
                        metrics.rejected(AckReason::ShuttingDown, partials);
                        let _ = reply.send(refusal(sequence, AckReason::ShuttingDown, "shutting down".into()));
                        continue;
                    }
                }
            }
            Decoded::Refused { sequence, reason, message, partials, watermark_ms } => {
                metrics.partials_received.inc_by(partials);
                metrics.rejected(reason, partials);
                if REFUSAL_LOG.allow() {
                    tracing::warn!(reason = reason.as_str(), partials, %message, "partial batch refused");
                }
                if let Some(watermark_ms) = watermark_ms.filter(|_| !reason.is_retryable()) {
                    let _ = admission.send(AdmissionJob::Watermark { connection, watermark_ms });
                }
                refusal(sequence, reason, message)
            }
            Decoded::Protocol { reason, message } => {
                metrics.listener.frame_error(reason);
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
    shadow: Tiler,
    tier: MergeTier,
    watermarks: Watermarks,
    jobs: Receiver<AdmissionJob>,
    ingesters: Ingesters,
    metrics: Metrics,
) {
    let mut admission =
        Admission { shadow, tier, watermarks, ingesters, metrics, lags_exported_ms: 0, lag_sources: Vec::new() };
    loop {
        // Sleep until the next tile could close on the clock alone (the
        // latest it may: watermarks that arrive close it sooner).
        let next_close = admission.watermarks.next_clock_close_ms(admission.shadow.next_tile_end_ms());
        let wait_ms = (next_close - now_ms()).clamp(1, MAX_ADMISSION_SLEEP.as_millis() as i64);
        match jobs.recv_timeout(Duration::from_millis(wait_ms as u64)) {
            Ok(AdmissionJob::Batch { connection, sequence, batch, reply }) => {
                let answer = admission.admit(connection, sequence, batch);
                let _ = reply.send(answer);
            }
            Ok(AdmissionJob::Opened { connection, source }) => {
                admission.watermarks.opened(connection, &source, now_ms());
            }
            Ok(AdmissionJob::Watermark { connection, watermark_ms }) => {
                admission.watermarks.advance(connection, Some(watermark_ms), now_ms());
            }
            Ok(AdmissionJob::Forget { connection }) => admission.tier.forget(connection),
            Ok(AdmissionJob::Closed { connection }) => {
                admission.watermarks.closed(connection, now_ms());
                admission.tier.forget(connection);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                admission.close_due();
                admission.tier.close_all(&mut admission.shadow, &admission.metrics);
                return;
            }
        }
        admission.close_due();
    }
}

/// The admission thread's state.
struct Admission {
    shadow: Tiler,
    tier: MergeTier,
    watermarks: Watermarks,
    ingesters: Ingesters,
    metrics: Metrics,
    lags_exported_ms: i64,
    /// Collectors whose watermark lag was exported last time.
    lag_sources: Vec<String>,
}

impl Admission {
    /// Closes every tile the watermarks (or the clock) allow.
    fn close_due(&mut self) {
        let now = now_ms();
        let (horizon, trigger) = self.watermarks.horizon(now);
        self.tier.close_through(&mut self.shadow, horizon, trigger, &self.metrics);
        if now - self.lags_exported_ms >= LAG_EXPORT_INTERVAL_MS {
            self.lags_exported_ms = now;
            let lags = self.watermarks.lags_ms(now);
            let mut gone = std::mem::take(&mut self.lag_sources);
            gone.retain(|source| lags.iter().all(|(connected, _)| connected != source));
            self.metrics.set_watermark_lags(&lags, &gone);
            self.lag_sources = lags.iter().map(|(source, _)| (*source).to_owned()).collect();
        }
    }

    fn admit(&mut self, connection: u64, sequence: u64, batch: SplitBatch) -> Reply {
        let partials = batch.partials();
        // A batch with nothing in it (a heartbeat) only moves the watermark.
        if partials == 0 {
            self.advance(connection, batch.watermark_ms);
            return taken(sequence);
        }
        self.close_due();
        if !self.ingesters.has_room() {
            self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
            self.metrics.rejected(AckReason::BufferFull, partials);
            return refusal(sequence, AckReason::BufferFull, "every ingester buffer is full".into());
        }
        // The shadow holds no series: applying the empty batch opens its
        // tiles, as the merge threads will.
        let window = Batch {
            connection,
            window_start_ms: batch.window_start_ms,
            window_ms: batch.window_ms,
            partials: Vec::new(),
        };
        let checked = self.shadow.check(batch.window_start_ms, batch.window_ms, now_ms());
        self.advance(connection, batch.watermark_ms);
        match checked {
            Ok(()) => {
                self.shadow.apply(&window, &mut |_| {});
                self.tier.dispatch(connection, batch.window_start_ms, batch.window_ms, batch.shares);
                taken(sequence)
            }
            Err(refused) => {
                // What the decoder learned of the connection's dictionary
                // from this batch must hold on the merge threads too.
                self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
                let reason = refused.reason();
                self.metrics.rejected(reason, partials);
                if REFUSAL_LOG.allow() {
                    tracing::warn!(reason = reason.as_str(), partials, error = %refused, "partial batch refused");
                }
                refusal(sequence, reason, refused.to_string())
            }
        }
    }

    fn advance(&mut self, connection: u64, watermark_ms: Option<i64>) {
        self.watermarks.advance(connection, watermark_ms, now_ms());
    }
}
