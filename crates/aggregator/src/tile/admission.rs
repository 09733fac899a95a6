//! Admission: the thread that admits or refuses each decoded batch whole,
//! dispatches its shares to the merge threads, and closes tiles.
//!
//! The admission thread alone owns the clock that closes tiles and checks
//! each batch once, against a shadow of the merge threads' tiles
//! ([`super::merge`]): a batch is merged whole or refused whole (`too_late`,
//! `too_early`, `buffer_full` when no ingester queue has room). It also
//! keeps every connection's watermark, and closes tiles on them
//! ([`super::watermark`]); connections announce themselves and their end
//! through the same channels as their frames (the decoder passes them on),
//! so admission sees a connection's batches between its `Opened` and its
//! `Closed`.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tessera_proto::{Ack, AckReason, AckStatus};
use tessera_runtime::RateLimitedLog;
use tessera_wire::CloseReason;
use tokio::sync::oneshot;

use super::merge::MergeTier;
use super::metrics::TileMetrics;
use super::tiler::{Partial, Tiler, WindowPartials};
use super::watermark::Watermarks;
use crate::outbound::Ingesters;
use tessera_core::clock::now_ms;

/// Longest admission sleeps without looking at the clock.
const MAX_ADMISSION_SLEEP: Duration = Duration::from_millis(100);

/// How often the watermark lag gauges are refreshed.
const LAG_EXPORT_INTERVAL_MS: i64 = 1_000;

/// One log rate for refused batches, whether the decoder or admission refused them.
pub static REFUSAL_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.batch_refused", 5);

/// What a connection sends back for one frame.
#[derive(Debug)]
pub enum Reply {
    /// Answer with this ack and read the next frame.
    Ack(Ack),
    /// Close the connection (the stream cannot be trusted).
    Close {
        /// Why, for the frame error counter.
        reason: CloseReason,
        /// Details for the log.
        message: String,
    },
}

impl Reply {
    /// Taken: acknowledged with no reason.
    pub fn taken(sequence: u64) -> Reply {
        Reply::Ack(Ack { sequence, status: AckStatus::Ok as i32, ..Ack::default() })
    }

    /// Refused for `reason`.
    pub fn refusal(sequence: u64, reason: AckReason, message: String) -> Reply {
        Reply::Ack(reason.ack(sequence, message))
    }
}

/// The partials of one window from one sender, one share per merge thread.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SplitBatch {
    /// Window start, unix milliseconds.
    pub window_start_ms: i64,
    /// Window length, milliseconds.
    pub window_ms: i64,
    /// `shares[i]`: the partials of the shards merge thread `i` owns.
    pub shares: Vec<Vec<Partial>>,
    /// The sender's watermark ([`super::watermark`]), if it sent one.
    pub watermark_ms: Option<i64>,
}

impl SplitBatch {
    /// Partials in every share.
    pub fn partials(&self) -> u64 {
        self.shares.iter().map(|share| share.len() as u64).sum()
    }
}

/// What the decoder hands admission.
pub enum AdmissionJob {
    /// See [`Inbound::Opened`](crate::intake::Inbound::Opened).
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
    /// See [`Inbound::Closed`](crate::intake::Inbound::Closed).
    Closed {
        /// The connection.
        connection: u64,
    },
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
    metrics: TileMetrics,
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
    metrics: TileMetrics,
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
            return Reply::taken(sequence);
        }
        self.close_due();
        if !self.ingesters.has_room() {
            self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
            self.metrics.refusals.rejected(AckReason::BufferFull, partials);
            return Reply::refusal(sequence, AckReason::BufferFull, "every ingester buffer is full".into());
        }
        // The shadow holds no series: applying the empty batch opens its
        // tiles, as the merge threads will.
        let window = WindowPartials {
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
                Reply::taken(sequence)
            }
            Err(refused) => {
                // What the decoder learned of the connection's dictionary
                // from this batch must hold on the merge threads too.
                self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
                let reason = refused.reason();
                self.metrics.refusals.rejected(reason, partials);
                if REFUSAL_LOG.allow() {
                    tracing::warn!(reason = reason.as_str(), partials, error = %refused, "partial batch refused");
                }
                Reply::refusal(sequence, reason, refused.to_string())
            }
        }
    }

    fn advance(&mut self, connection: u64, watermark_ms: Option<i64>) {
        self.watermarks.advance(connection, watermark_ms, now_ms());
    }
}
