//! Admission: the thread that admits or refuses each decoded batch whole,
//! dispatches its shares to the merge threads, and closes tiles.
//!
//! The admission thread alone owns the clock that closes tiles and checks
//! each batch once, against a shadow of the merge threads' tiles
//! ([`super::merge`]): a batch is merged whole into every tile of its window still open
//! (a window too late for its 10 s tile still goes into its 1 min one), or refused whole
//! (`too_late` for every policy's tile, `too_early`, `buffer_full` when no ingester queue
//! has room). It also
//! keeps every connection's watermark, and closes tiles on them
//! ([`super::watermark`]); connections announce themselves and their end
//! through the same channels as their frames (the decoder passes them on),
//! so admission sees a connection's batches between its `Opened` and its
//! `Closed`.

use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tessera_proto::AckReason;
use tessera_wire::Answer;

use super::merge::MergeTier;
use super::metrics::TileMetrics;
use super::resends::{Resends, Sent};
use super::tiler::{Tiler, WindowPartials};
use super::watermark::Watermarks;
use crate::intake::{AdmissionJob, REFUSAL_LOG, SplitBatch};
use crate::outbound::Ingesters;
use tessera_core::clock::now_ms;

/// Longest admission sleeps without looking at the clock.
const MAX_ADMISSION_SLEEP: Duration = Duration::from_millis(100);

/// How often the watermark lag gauges are refreshed.
const LAG_EXPORT_INTERVAL_MS: i64 = 1_000;

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
    let resends = Resends::new(watermarks.departed_kept_ms());
    let mut admission = Admission {
        shadow,
        tier,
        watermarks,
        ingesters,
        metrics,
        lags_exported_ms: 0,
        lag_sources: Vec::new(),
        resends,
    };
    loop {
        // Sleep until the next tile could close on the clock alone (the
        // latest it may: watermarks that arrive close it sooner).
        let next_close = admission.watermarks.next_clock_close_ms(admission.shadow.next_tile_end_ms(), now_ms());
        let wait_ms = (next_close - now_ms()).clamp(1, MAX_ADMISSION_SLEEP.as_millis() as i64);
        match jobs.recv_timeout(Duration::from_millis(wait_ms as u64)) {
            Ok(AdmissionJob::Batch { connection, sequence, batch, reply }) => {
                let answer = admission.admit(connection, sequence, batch);
                let _ = reply.send(answer);
            }
            Ok(AdmissionJob::Opened { connection, source, stream }) => {
                admission.watermarks.opened(connection, &source, stream, now_ms());
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
    /// What each collector's stream had admitted ([`super::resends`]).
    resends: Resends,
}

impl Admission {
    /// Closes every tile the watermarks (or the clock) allow.
    fn close_due(&mut self) {
        let now = now_ms();
        let horizon = self.watermarks.horizon(now);
        self.tier.close_through(&mut self.shadow, horizon, &self.watermarks, &self.metrics);
        if now - self.lags_exported_ms >= LAG_EXPORT_INTERVAL_MS {
            self.lags_exported_ms = now;
            let lags = self.watermarks.lags_ms(now);
            let mut gone = std::mem::take(&mut self.lag_sources);
            gone.retain(|source| lags.iter().all(|(connected, _)| connected != source));
            self.metrics.set_watermark_lags(&lags, &gone);
            self.lag_sources = lags.iter().map(|(source, _)| (*source).to_owned()).collect();
        }
    }

    fn admit(&mut self, connection: u64, sequence: u64, batch: SplitBatch) -> Answer {
        let partials = batch.partials();
        // A batch with nothing in it (a heartbeat) only moves the watermark.
        if partials == 0 {
            self.advance(connection, batch.watermark_ms);
            return Answer::taken(sequence);
        }
        let sent = Sent { sequence, expanded_from: batch.expanded_from };
        let stream = self.watermarks.stream_of(connection);
        if self.resends.already_admitted(stream, sent) {
            // Its first copy went in on an earlier connection: answered as taken, merged
            // once. What the decoder learned of the connection's dictionary still holds.
            self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
            self.advance(connection, batch.watermark_ms);
            self.metrics.resent_batches.inc();
            self.metrics.resent_partials.inc_by(partials);
            tracing::debug!(
                connection,
                sequence,
                expanded_from = sent.expanded_from,
                partials,
                "a re-sent batch was admitted before; not merged again"
            );
            return Answer::taken(sequence);
        }
        self.close_due();
        if !self.ingesters.has_room() {
            self.tier.bind(connection, batch.window_start_ms, batch.window_ms, batch.shares);
            self.metrics.refusals.rejected(AckReason::BufferFull, partials);
            return Answer::refusal(sequence, AckReason::BufferFull, "every ingester buffer is full".into());
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
            Ok(admitted) => {
                for policy in &admitted.late {
                    self.metrics.late_for_policy(policy, partials);
                }
                self.resends.admitted(stream, sent, now_ms());
                self.shadow.apply(&window, &mut |_| {});
                self.tier.dispatch(connection, batch.window_start_ms, batch.window_ms, batch.shares);
                Answer::taken(sequence)
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
                Answer::refusal(sequence, reason, refused.to_string())
            }
        }
    }

    fn advance(&mut self, connection: u64, watermark_ms: Option<i64>) {
        self.watermarks.advance(connection, watermark_ms, now_ms());
    }
}
