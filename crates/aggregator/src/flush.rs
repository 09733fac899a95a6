//! Flushing closed tiles: split each by the ingester owning each series
//! ([`Ingesters::assign`]), cut each share into tile batches under the
//! frame bound, frame them, and hand them to the ingester queues in one burst.
//!
//! ```text
//! merge threads ──parts──▶ Gatherer ──tile──▶ held ──may flush?──▶ ingester queues (crate::outbound)
//!                                                        ▲
//!                                                   Leadership ◀── election task (etcd)
//! ```
//!
//! Runs on its own thread ([`run_flusher`]), fed by the merge threads
//! (their parts of each tile joined by a [`Gatherer`]), so
//! that encoding a large tile never holds up merging nor a tokio worker.
//! With replicas, it flushes only as the shard set's leader and otherwise
//! holds each tile until the leader's flush mark passes it
//! ([`leadership`]: the state the flusher and the etcd election share, and
//! the election task).

mod gatherer;
mod leadership;
mod metrics;

pub use gatherer::Gatherer;
pub use leadership::{ElectionSettings, Leadership, run_election};
pub use metrics::{FlushMetrics, PolicyMetrics};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::count_drops;

use crate::outbound::{Ingesters, TileHead};
use crate::tile::{ClosedTile, MergeOutput};
use tessera_core::clock::now_ms;

/// Settings of the flusher thread.
#[derive(Debug, Clone)]
pub struct FlushSettings {
    /// This aggregator's id, written in every tile batch.
    pub source: String,
    /// Largest frame sent to an ingester.
    pub max_frame_bytes: usize,
}

/// Longest the flusher waits for a tile part before it looks at the
/// leadership and the flush marks again.
const RELEASE_TICK: Duration = Duration::from_millis(50);

/// Most series values held unflushed (a follower, or a leader fenced off
/// from etcd); past it the oldest held tiles are let go and counted
/// (`tiles_discarded{reason="held_limit"}`).
pub const MAX_HELD_SERIES: usize = 20_000_000;

/// Receives the merge threads' parts of closed tiles until every merge
/// thread hangs up; flushes each whole tile when [`Leadership`] allows
/// (always, without replicas), holds it otherwise until the shard set
/// leader's flush mark passes it ([`leadership`]).
pub fn run_flusher(parts: Receiver<MergeOutput>, mut gatherer: Gatherer, flusher: Flusher) {
    let mut held = Held::default();
    loop {
        match parts.recv_timeout(RELEASE_TICK) {
            Ok(part) => gatherer.add(part, &mut |tile| held.push(tile, &flusher)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        held.release(&flusher, false);
    }
    held.release(&flusher, true);
}

/// What the flusher thread flushes with.
pub struct Flusher {
    /// The ingester queues.
    pub ingesters: Ingesters,
    /// Settings.
    pub settings: FlushSettings,
    /// The flush stage's metrics.
    pub metrics: FlushMetrics,
    /// Where series no ingester owns are counted.
    pub drops: Drops,
    /// Per-policy handles, indexed like the policies.
    pub policies: Vec<PolicyMetrics>,
    /// Whether to flush or hold.
    pub leadership: Leadership,
}

/// Closed tiles not flushed yet, oldest first.
#[derive(Default)]
struct Held {
    tiles: VecDeque<ClosedTile>,
}

impl Held {
    fn push(&mut self, tile: ClosedTile, flusher: &Flusher) {
        // Every policy holds the same series, and an expired series leaves
        // them all: the counts go to each policy, whichever tile carried them.
        for policy in &flusher.policies {
            policy.active_series.set(tile.series_held as i64);
            if tile.expired > 0 {
                policy.series_expired.inc_by(tile.expired as u64);
            }
        }
        // An unconfirmed tile with no series is kept too: a leader that received nothing of
        // a tile (every collector's link stalled across it) must still record it incomplete
        // with its marks, or its mark passes it and a follower that holds it whole lets it go
        // (found by the fault campaign, seed 34 at 5 minutes: 1 519 series lost a tile).
        // With replicas, any tile with no series is kept (fix 16): the stalled collectors may
        // have been silent so long that they no longer count, and the tile closed confirmed.
        if !tile.values.is_empty() || tile.unconfirmed || flusher.leadership.replicated() {
            self.tiles.push_back(tile);
        }
    }

    /// Lets go of what the leader flushed (or completes it, when the leader's
    /// copy was incomplete), then flushes what may be
    /// flushed; at shutdown, whatever is left is flushed or let go.
    fn release(&mut self, flusher: &Flusher, at_shutdown: bool) {
        let (leadership, metrics) = (&flusher.leadership, &flusher.metrics);
        let marks = leadership.marks();
        let mut discarded = 0;
        for tile in std::mem::take(&mut self.tiles) {
            if marks.get(tile.policy_index).is_none_or(|&mark| tile.tile_end_ms > mark) {
                self.tiles.push_back(tile);
            } else if let Some(routed_version) = leadership
                .leader_flushed_incomplete(tile.policy_index, tile.tile_end_ms)
                .filter(|_| !tile.values.is_empty())
            {
                // Any copy goes, marked incomplete where it may lack something (unconfirmed,
                // or begun before this process): each replica's copy sums whole batches it
                // admitted, and the ingesters keep the larger of two incomplete copies.
                // Found by the fault campaign: seed 34 at 5 minutes (two faults cost each
                // replica a different part of one 1 min tile, the follower let its larger,
                // unconfirmed copy go: 517 series lost 12 increments), and seed 61 (both
                // replicas started 1.2 s into a minute; the leader's copy of that 1 min tile
                // lacked a collector killed while its link into the leader stalled, and the
                // follower's, which held it, was let go because it began before the
                // follower started: 517 series lost 32 increments at 1 min).
                metrics.tiles_completed.inc();
                flush_tile(tile, flusher, Copy::Completion { routed_version });
            } else {
                discarded += 1;
            }
        }
        metrics.tiles_discarded("flushed_by_leader", discarded);
        let flush = leadership.may_flush() || (at_shutdown && leadership.may_flush_at_shutdown());
        if flush {
            while let Some(tile) = self.tiles.pop_front() {
                if leadership.counts_incomplete(tile.tile_start_ms) || tile.unconfirmed {
                    metrics.incomplete_tiles.inc();
                }
                flush_tile(tile, flusher, Copy::Leader);
            }
        } else if at_shutdown {
            metrics.tiles_discarded("shutdown", self.tiles.len() as u64);
            self.tiles.clear();
        }
        let mut series: usize = self.tiles.iter().map(|tile| tile.values.len()).sum();
        while series > MAX_HELD_SERIES && self.tiles.len() > 1 {
            let oldest = self.tiles.pop_front().expect("more than one tile held");
            series -= oldest.values.len();
            metrics.tiles_discarded("held_limit", 1);
        }
        metrics.held_tiles.set(self.tiles.len() as i64);
        metrics.held_series.set(series as i64);
        leadership.holding(self.tiles.front().map(|tile| tile.tile_start_ms));
    }
}

/// Why a replica flushes its copy of a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copy {
    /// As the shard set's leader (or alone): its flush moves the flush marks.
    Leader,
    /// As a replica, after the leader flushed an incomplete copy: a whole copy replaces
    /// that one at the ingesters, an incomplete one replaces it where it holds more; it
    /// moves no mark. It carries the placement version the leader routed its copy under:
    /// an ingester that took a shard after it skips the completion of a series whose copy
    /// went to the owner before (that owner wrote it; a second writer would begin a total
    /// beside it: RELIABILITY.md, fix 24).
    Completion { routed_version: u64 },
}

fn flush_tile(tile: ClosedTile, flusher: &Flusher, copy: Copy) {
    let Flusher { ingesters, settings, drops, policies, leadership, .. } = flusher;
    let Some(policy) = policies.get(tile.policy_index) else { return };
    let started = Instant::now();
    let ClosedTile {
        policy_index,
        policy: storage_policy,
        tile_start_ms,
        tile_end_ms,
        values,
        cut_duration,
        unconfirmed,
        ..
    } = tile;
    let series = values.len() as u64;
    let storage_policy = storage_policy.to_string();
    let head = TileHead {
        storage_policy: &storage_policy,
        resolution_ms: u32::try_from(tile_end_ms - tile_start_ms).unwrap_or(u32::MAX),
        tile_end_ms,
        flushed_at_ms: now_ms(),
        incomplete: unconfirmed || leadership.began_before_start(tile_start_ms),
        // Stamped with the routing's version where a placement routes it (send_tile).
        placement_version: 0,
        completes_version: match copy {
            Copy::Leader => 0,
            Copy::Completion { routed_version } => routed_version,
        },
        owner_refused: false,
    };
    let incomplete = head.incomplete;
    let unowned = ingesters.send_tile(
        &head,
        values,
        tile_start_ms,
        (&settings.source, settings.max_frame_bytes),
        |sent, version| {
            // A leader's incomplete tile is recorded even when nothing of it was sent, and a
            // tile it had no series of is recorded incomplete whatever its watermarks said: a
            // replica holding any of it completes it, and its copy is the only one (fixes 14
            // and 16).
            if copy == Copy::Leader && (!sent.is_empty() || incomplete || series == 0) {
                // A copy that reached no ingester went to no owner: a completion of it is the
                // tile's only copy wherever it goes, and asks no version (fix 24).
                let routed_version = if sent.is_empty() { 0 } else { version };
                leadership.flushed(policy_index, sent, tile_end_ms, incomplete || series == 0, routed_version);
            }
        },
    );
    count_drops(drops, "no_ingester", "series", unowned);
    policy.tiles_flushed.inc();
    policy.series_flushed.inc_by(series);
    policy.flush_duration.observe((cut_duration + started.elapsed()).as_secs_f64());
    policy.flush_lag.observe((now_ms() - tile_end_ms).max(0) as f64 / 1000.0);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tessera_core::aggregate::Aggregate;
    use tessera_proto::{Frame, MetricType, SeriesValue, frame::Body, framing};

    use super::*;
    use crate::outbound::encode_values;
    use tessera_wire::Batch;

    /// Splits a whole `tile` into framed batches ([`encode_values`], as for
    /// one ingester's share); also returns the values too large to send.
    fn encode_tile(
        tile: ClosedTile,
        source: &str,
        max_frame_bytes: usize,
        flushed_at_ms: i64,
        next_sequence: &mut dyn FnMut() -> u64,
    ) -> (Vec<Batch>, u64) {
        let storage_policy = tile.policy.to_string();
        let head = TileHead {
            storage_policy: &storage_policy,
            resolution_ms: u32::try_from(tile.policy.resolution_ms()).unwrap_or(u32::MAX),
            tile_end_ms: tile.tile_end_ms,
            flushed_at_ms,
            incomplete: false,
            placement_version: 0,
            completes_version: 0,
            owner_refused: false,
        };
        encode_values(&head, tile.values, source, max_frame_bytes, next_sequence)
    }

    fn tile(series: usize) -> ClosedTile {
        let values = (0..series)
            .map(|index| SeriesValue {
                r#ref: 0,
                series_id: format!("series.{index:06}|#host:h1").into_bytes(),
                r#type: MetricType::Counter as i32,
                aggregate: Some(Aggregate::Counter(index as f64).to_proto()),
            })
            .collect();
        ClosedTile {
            policy_index: 0,
            policy: "10s:2d".parse().unwrap(),
            tile_start_ms: 10_000,
            tile_end_ms: 20_000,
            values,
            expired: 0,
            series_held: series,
            cut_duration: Duration::ZERO,
            unconfirmed: false,
        }
    }

    #[test]
    fn a_large_tile_splits_under_the_frame_bound_and_keeps_every_value() {
        let mut sequence = 0;
        let (batches, too_large) = encode_tile(tile(10_000), "agg-1", 64 << 10, 5, &mut || {
            sequence += 1;
            sequence
        });
        assert_eq!(too_large, 0);
        assert!(batches.len() > 5, "{} batches", batches.len());
        let mut seen = 0;
        for (index, batch) in batches.iter().enumerate() {
            assert!(batch.frame.len() <= 64 << 10);
            assert_eq!(batch.sequence, index as u64 + 1);
            let Ok(Some((Frame { body: Some(Body::Tiles(tiles)) }, _))) = framing::decode_frame(&batch.frame, 64 << 10)
            else {
                panic!("not a tile batch")
            };
            assert_eq!(
                (tiles.storage_policy.as_str(), tiles.resolution_ms, tiles.tile_end_ms),
                ("10s:2d", 10_000, 20_000)
            );
            assert_eq!((tiles.source.as_str(), tiles.flushed_at_ms), ("agg-1", 5));
            assert_eq!(tiles.tiles.len() as u64, batch.items);
            seen += tiles.tiles.len();
        }
        assert_eq!(seen, 10_000);
    }

    #[test]
    fn a_value_over_the_bound_is_dropped_and_counted() {
        let mut huge = tile(2);
        huge.values[0].series_id = vec![b'x'; 4000];
        let (batches, too_large) = encode_tile(huge, "agg-1", 2048, 5, &mut || 1);
        assert_eq!((batches.len(), too_large), (1, 1));
    }
}
