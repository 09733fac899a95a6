//! Joining the merge threads' parts of each closed tile, on the flusher
//! thread: every merge thread closes its share of the same tiles in a close
//! round ([`MergeOutput`]), and a tile is whole once every thread has
//! reported the round done.

use std::collections::BTreeMap;

use crate::tile::{ClosedTile, MergeOutput};

/// Joins the merge threads' parts of each tile, round by round.
pub struct Gatherer {
    threads: usize,
    rounds: BTreeMap<u64, Round>,
}

#[derive(Default)]
struct Round {
    done: usize,
    /// Tiles of the round by (end, policy index), joined from their parts.
    tiles: BTreeMap<(i64, usize), ClosedTile>,
}

impl Gatherer {
    /// A gatherer for `threads` merge threads.
    pub fn new(threads: usize) -> Gatherer {
        Gatherer { threads: threads.max(1), rounds: BTreeMap::new() }
    }

    /// Takes one output of a merge thread; hands every tile of a round to
    /// `ready` once each thread has finished that round, oldest tile first.
    pub fn add(&mut self, output: MergeOutput, ready: &mut dyn FnMut(ClosedTile)) {
        match output {
            MergeOutput::Part { round, tile } => {
                let tiles = &mut self.rounds.entry(round).or_default().tiles;
                match tiles.get_mut(&(tile.tile_end_ms, tile.policy_index)) {
                    Some(joined) => {
                        joined.values.extend(tile.values);
                        joined.expired += tile.expired;
                        joined.series_held += tile.series_held;
                        joined.cut_duration = joined.cut_duration.max(tile.cut_duration);
                        joined.unconfirmed |= tile.unconfirmed;
                    }
                    None => {
                        tiles.insert((tile.tile_end_ms, tile.policy_index), tile);
                    }
                }
            }
            MergeOutput::RoundDone { round } => {
                let entry = self.rounds.entry(round).or_default();
                entry.done += 1;
                if entry.done < self.threads {
                    return;
                }
                // Every thread sends its rounds in order, so older rounds are complete too.
                while let Some(entry) = self.rounds.first_entry() {
                    if *entry.key() > round {
                        break;
                    }
                    for (_, tile) in entry.remove().tiles {
                        ready(tile);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gatherer_joins_a_tile_only_once_every_thread_finished_its_round() {
        let tile = |values: usize, series_held: usize| ClosedTile {
            policy_index: 0,
            policy: "10s:1h".parse().unwrap(),
            tile_start_ms: 0,
            tile_end_ms: 10_000,
            values: (0..values)
                .map(|n| tessera_proto::SeriesValue { series_id: vec![b'a' + n as u8], ..Default::default() })
                .collect(),
            expired: 1,
            series_held,
            cut_duration: std::time::Duration::from_millis(series_held as u64),
            unconfirmed: false,
        };
        let mut gatherer = Gatherer::new(2);
        let mut ready = Vec::new();
        gatherer.add(MergeOutput::Part { round: 1, tile: tile(2, 5) }, &mut |tile| ready.push(tile));
        gatherer.add(MergeOutput::RoundDone { round: 1 }, &mut |tile| ready.push(tile));
        // The faster thread is already a round ahead.
        gatherer.add(MergeOutput::RoundDone { round: 2 }, &mut |tile| ready.push(tile));
        assert!(ready.is_empty(), "the other thread has not finished round 1");
        gatherer.add(MergeOutput::Part { round: 1, tile: tile(3, 7) }, &mut |tile| ready.push(tile));
        gatherer.add(MergeOutput::RoundDone { round: 1 }, &mut |tile| ready.push(tile));
        assert_eq!(ready.len(), 1);
        let joined = &ready[0];
        assert_eq!((joined.values.len(), joined.expired, joined.series_held), (5, 2, 12));
        assert_eq!(joined.cut_duration, std::time::Duration::from_millis(7));
        gatherer.add(MergeOutput::RoundDone { round: 2 }, &mut |tile| ready.push(tile));
        assert_eq!(ready.len(), 1, "round 2 closed nothing");
    }
}
