//! Merging on every core: shards partitioned across merge threads.
//!
//! ```text
//!                                     ┌─▶ merge-0 (Tiler of shards s ≡ 0) ─┐
//! decoder ──SplitBatch──▶ admission ──┼─▶ merge-1 (Tiler of shards s ≡ 1) ─┼─▶ flusher (Gatherer: one tile
//!   (splits by shard)   (shadow Tiler: └─▶ merge-N-1 ...                  ─┘    from N parts per close round)
//!                        check, close)
//! ```
//!
//! Each merge thread owns a [`Tiler`] over the shards `s` with
//! `s mod N == thread`: the tables of those shards for every policy, and
//! their gauges' last values. Nothing on the merge path is shared.
//!
//! The admission thread alone decides what is admitted and when tiles
//! close, with a **shadow** tiler that holds no series but opens and closes
//! tiles exactly as the merge threads do. A batch is checked once against
//! it and then refused whole, or dispatched whole: its share goes to each
//! merge thread as [`MergeJob::Apply`]. When tiles fall due, every merge
//! thread is sent [`MergeJob::CloseThrough`] with the same horizon.
//! Each thread's jobs are a FIFO queue, so every admitted share is merged
//! before the close of its tile, and a share admitted after a close can
//! only be for a tile still open: all-or-nothing holds across threads.
//!
//! A close round ends with [`MergeOutput::RoundDone`] from every thread;
//! the flusher's [`Gatherer`](crate::flush::Gatherer) joins the parts of
//! each tile of the round into one [`ClosedTile`]. The queues are bounded:
//! a merge thread that falls behind blocks admission, so collectors wait
//! for their acks.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::tiler::{ClosedTile, Tiler, WindowPartials};
use super::watermark::{Trigger, Watermarks};
use crate::intake::{Partial, Via};
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::count_drops;

use super::metrics::TileMetrics;

/// Jobs queued on each merge thread before admission waits.
pub const MERGE_QUEUE_JOBS: usize = 64;

/// What a merge thread is asked to do.
#[derive(Debug)]
pub enum MergeJob {
    /// Merge this share of an admitted batch.
    Apply(WindowPartials),
    /// Bind the dictionary slots this share of a refused batch defines,
    /// merging nothing ([`Tiler::bind_definitions`]).
    Bind(WindowPartials),
    /// Close every tile ending at or before `horizon_ms`, then report
    /// `round` done.
    CloseThrough {
        /// Close round number, increasing.
        round: u64,
        /// The admission thread's horizon ([`super::watermark`]).
        horizon_ms: i64,
        /// The tiles of the round closed unconfirmed, `(policy index, tile end)`
        /// ([`Watermarks::confirms`]).
        unconfirmed: Arc<[(usize, i64)]>,
    },
    /// Close every open tile (shutdown), then report `round` done.
    CloseAll {
        /// Close round number.
        round: u64,
    },
    /// Forget a connection's dictionary slots (`intake/dictionary.rs`).
    Forget {
        /// The connection.
        connection: u64,
    },
}

/// What a merge thread hands the flusher.
#[derive(Debug)]
pub enum MergeOutput {
    /// This thread's part of a tile closed in `round`.
    Part {
        /// The close round.
        round: u64,
        /// The thread's share of the tile.
        tile: ClosedTile,
    },
    /// This thread has closed everything of `round`.
    RoundDone {
        /// The close round.
        round: u64,
    },
}

/// A merge thread: applies shares and closes tiles until admission hangs up.
pub fn run_merge_thread(
    mut tiler: Tiler,
    jobs: Receiver<MergeJob>,
    out: Sender<MergeOutput>,
    metrics: TileMetrics,
    drops: Drops,
) {
    let mut round = 0;
    // The flusher outlives the merge threads; if it is gone, so is the process.
    let out = &out;
    let part = |round: u64| move |tile: ClosedTile| drop(out.send(MergeOutput::Part { round, tile }));
    while let Ok(job) = jobs.recv() {
        match job {
            MergeJob::Apply(batch) => {
                let started = Instant::now();
                // Opening a tile closes nothing here unless the clock jumped;
                // such a part joins the last round.
                let applied = tiler.apply(&batch, &mut part(round));
                metrics.merge_duration.observe(started.elapsed().as_secs_f64());
                metrics.partials_merged.inc_by(applied.partials);
                metrics.gauge_order_ambiguous.inc_by(applied.gauge_order_ambiguous);
                metrics.buckets_dropped.inc_by(applied.buckets_dropped);
                count_drops(&drops, "series_limit", "series", applied.series_limit);
                count_drops(&drops, "memory_limit", "series", applied.memory_limit);
                count_drops(&drops, "unknown_series_ref", "series", applied.unknown_refs);
            }
            MergeJob::Bind(batch) => tiler.bind_definitions(&batch),
            MergeJob::Forget { connection } => tiler.forget_dictionary(connection),
            MergeJob::CloseThrough { round: next, horizon_ms, unconfirmed } => {
                round = next;
                let part = part(round);
                tiler.close_through(horizon_ms, &mut |mut tile| {
                    tile.unconfirmed = unconfirmed.contains(&(tile.policy_index, tile.tile_end_ms));
                    part(tile);
                });
                let _ = out.send(MergeOutput::RoundDone { round });
            }
            MergeJob::CloseAll { round: next } => {
                round = next;
                tiler.close_all(&mut part(round));
                let _ = out.send(MergeOutput::RoundDone { round });
            }
        }
    }
}

/// The admission thread's handle on the merge threads.
pub struct MergeTier {
    jobs: Vec<Sender<MergeJob>>,
    round: u64,
}

impl MergeTier {
    /// Sends to the merge threads behind `jobs`.
    pub fn new(jobs: Vec<Sender<MergeJob>>) -> MergeTier {
        MergeTier { jobs, round: 0 }
    }

    /// Closes every tile ending at or before `horizon_ms` in `shadow` and,
    /// if there was one, on every merge thread; counts them by `trigger`. A tile
    /// `watermarks` do not confirm closes unconfirmed.
    pub fn close_through(
        &mut self,
        shadow: &mut Tiler,
        (horizon_ms, trigger): (i64, Trigger),
        watermarks: &Watermarks,
        metrics: &TileMetrics,
    ) {
        if horizon_ms < shadow.next_tile_end_ms() {
            return;
        }
        let mut closed = 0;
        let mut unconfirmed = Vec::new();
        shadow.close_through(horizon_ms, &mut |tile| {
            closed += 1;
            if !watermarks.confirms(tile.tile_start_ms, tile.tile_end_ms) {
                unconfirmed.push((tile.policy_index, tile.tile_end_ms));
            }
        });
        metrics.tiles_closed(trigger.as_str(), closed);
        metrics.unconfirmed_tiles.inc_by(unconfirmed.len() as u64);
        let unconfirmed: Arc<[(usize, i64)]> = unconfirmed.into();
        self.round += 1;
        for jobs in &self.jobs {
            let unconfirmed = Arc::clone(&unconfirmed);
            let _ = jobs.send(MergeJob::CloseThrough { round: self.round, horizon_ms, unconfirmed });
        }
    }

    /// Closes every open tile everywhere (shutdown).
    pub fn close_all(&mut self, shadow: &mut Tiler, metrics: &TileMetrics) {
        let mut closed = 0;
        shadow.close_all(&mut |_| closed += 1);
        metrics.tiles_closed(Trigger::Shutdown.as_str(), closed);
        self.round += 1;
        for jobs in &self.jobs {
            let _ = jobs.send(MergeJob::CloseAll { round: self.round });
        }
    }

    /// Hands each thread its share of an admitted batch (`shares[i]` to
    /// thread `i`), waiting while a thread's queue is full.
    pub fn dispatch(&self, connection: u64, window_start_ms: i64, window_ms: i64, shares: Vec<Vec<Partial>>) {
        for (jobs, partials) in self.jobs.iter().zip(shares) {
            if !partials.is_empty() {
                let _ = jobs.send(MergeJob::Apply(WindowPartials { connection, window_start_ms, window_ms, partials }));
            }
        }
    }

    /// Hands each thread the dictionary definitions in its share of a
    /// refused batch, if it has any.
    pub fn bind(&self, connection: u64, window_start_ms: i64, window_ms: i64, shares: Vec<Vec<Partial>>) {
        for (jobs, mut partials) in self.jobs.iter().zip(shares) {
            partials.retain(|partial| matches!(partial.via, Via::Define { .. }));
            if !partials.is_empty() {
                let _ = jobs.send(MergeJob::Bind(WindowPartials { connection, window_start_ms, window_ms, partials }));
            }
        }
    }

    /// Has every merge thread forget `connection`'s dictionary.
    pub fn forget(&self, connection: u64) {
        for jobs in &self.jobs {
            let _ = jobs.send(MergeJob::Forget { connection });
        }
    }
}

#[cfg(test)]
mod tests;
