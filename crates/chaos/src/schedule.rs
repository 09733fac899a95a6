//! The fault schedule: which fault, on which daemon or link, when and for how long,
//! drawn from one seed so that `--seed N` replays the same campaign.
//!
//! Faults are drawn one after another, a few seconds apart, between the warm-up and
//! the quiet tail of the run. Each fault belongs to a *group* (a collector, a shard
//! set of aggregators, the ingester tier, etcd, the store), and two faults of one
//! group never overlap: the campaign checks the guarantees tessera makes (one replica
//! of a shard set down at a time, one ingester at a time), not a double fault that
//! the design says it cannot survive. Faults of different groups overlap freely.
//!
//! ```
//! use std::time::Duration;
//! use tessera_chaos::schedule::{Shape, draw};
//!
//! let shape = Shape {
//!     collectors: 2,
//!     aggregators: 4,
//!     replication_factor: 2,
//!     ingesters: 2,
//!     shard_set_recovery: Duration::from_secs(72),
//!     partitions: true,
//! };
//! let faults = draw(7, Duration::from_secs(300), &shape);
//! assert_eq!(faults, draw(7, Duration::from_secs(300), &shape));
//! ```

use std::fmt;
use std::time::Duration;

/// A small, fixed pseudo-random generator (SplitMix64): the same seed gives the same
/// schedule on every machine and with every version of every dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x7e55_e7a0_c4a0_5eed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// A duration in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
    }
}

/// One of the campaign's daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Daemon {
    /// Collector `n` (0-based).
    Collector(usize),
    /// Aggregator `n` (0-based; shard set `n / replication_factor`).
    Aggregator(usize),
    /// Ingester `n` (0-based).
    Ingester(usize),
}

impl fmt::Display for Daemon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Daemon::Collector(n) => write!(f, "col-{}", n + 1),
            Daemon::Aggregator(n) => write!(f, "agg-{}", n + 1),
            Daemon::Ingester(n) => write!(f, "ing-{}", n + 1),
        }
    }
}

/// What a link's proxy does to the bytes and connections through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Every chunk arrives this much later.
    Delay(Duration),
    /// Nothing goes through; connections stay open.
    Stall,
    /// Every open connection is cut, and new ones are cut as they come.
    Reset,
}

/// What the store's proxy does to remote-write requests (and, with a Graphite policy, what
/// happens to carbon-cache: slowed the same, or SIGKILLed for a refusal and restarted after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    /// Every chunk of every request and answer arrives this much later.
    Slow(Duration),
    /// Every request is answered `503 Service Unavailable`.
    Refuse,
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then a restart on the same config and data when the fault ends.
    Kill(Daemon),
    /// SIGSTOP, then SIGCONT when the fault ends.
    Pause(Daemon),
    /// A CPU quota (cgroup v1 `cpu.cfs_quota_us`) of this many percent of one core.
    Starve(Daemon, u32),
    /// etcd SIGKILLed, restarted on its data when the fault ends.
    EtcdRestart,
    /// etcd SIGSTOPped, SIGCONTed when the fault ends.
    EtcdPause,
    /// The remote-write store is slow or refuses.
    Store(StoreFault),
    /// The wire link into a daemon (an aggregator or an ingester) misbehaves.
    Link(Daemon, LinkFault),
    /// The disk under an ingester's queue is full (a tmpfs filled by a file, which is
    /// removed when the fault ends).
    DiskFull(Daemon),
    /// The daemon's link to etcd stalls (its own proxy in front of etcd), while every
    /// other daemon still reaches etcd: a network partition around it.
    Partition(Daemon),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(daemon) => write!(f, "kill {daemon}"),
            Fault::Pause(daemon) => write!(f, "pause {daemon}"),
            Fault::Starve(daemon, percent) => write!(f, "starve {daemon} to {percent}% of a core"),
            Fault::EtcdRestart => write!(f, "kill etcd"),
            Fault::EtcdPause => write!(f, "pause etcd"),
            Fault::Store(StoreFault::Slow(delay)) => write!(f, "slow store (+{} ms)", delay.as_millis()),
            Fault::Store(StoreFault::Refuse) => write!(f, "store refuses (503)"),
            Fault::Link(daemon, LinkFault::Delay(delay)) => {
                write!(f, "delay link to {daemon} (+{} ms)", delay.as_millis())
            }
            Fault::Link(daemon, LinkFault::Stall) => write!(f, "stall link to {daemon}"),
            Fault::Link(daemon, LinkFault::Reset) => write!(f, "cut link to {daemon}"),
            Fault::DiskFull(daemon) => write!(f, "fill the disk of {daemon}"),
            Fault::Partition(daemon) => write!(f, "cut {daemon} off from etcd"),
        }
    }
}

/// A fault with its start (from the start of the run) and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// When it starts, from the start of sending.
    pub at: Duration,
    /// How long it lasts.
    pub lasts: Duration,
    /// What it is.
    pub fault: Fault,
}

impl Scheduled {
    /// When it ends.
    pub fn ends(&self) -> Duration {
        self.at + self.lasts
    }
}

impl fmt::Display for Scheduled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>7.1}s {:>5.1}s  {}", self.at.as_secs_f64(), self.lasts.as_secs_f64(), self.fault)
    }
}

/// The daemons of a campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Collectors.
    pub collectors: usize,
    /// Aggregators (a whole number of shard sets).
    pub aggregators: usize,
    /// Replicas per shard set.
    pub replication_factor: usize,
    /// Ingesters.
    pub ingesters: usize,
    /// How long a shard set needs after a fault before it survives another: a replica
    /// that was killed, paused or cut off is whole again only once every tile that was
    /// open meanwhile has closed (the longest tile plus `max_buffer_past`, plus a lease
    /// TTL for its election). Replication factor 2 survives one fault at a time.
    pub shard_set_recovery: Duration,
    /// Whether partitions ([`Fault::Partition`]) are drawn too. Off, a seed draws the
    /// schedule it drew before partitions existed.
    pub partitions: bool,
}

/// A shard set's recovery time ([`Shape::shard_set_recovery`]) with tiles up to `longest_tile`
/// and a lease TTL of `ttl`: the longest tile, the aggregators' default `max_buffer_past_ms`
/// (8 s) and the TTL.
pub fn shard_set_recovery(longest_tile: Duration, ttl: Duration) -> Duration {
    longest_tile + Duration::from_secs(8) + ttl
}

/// Faults of one group never overlap, and a shard set gets its recovery time between two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Collector(usize),
    ShardSet(usize),
    Ingesters,
    Etcd,
    Store,
}

/// The groups a fault touches. An etcd fault touches every shard set too: past a
/// lease TTL it ends every leadership, and the shard sets elect again.
fn groups(fault: &Fault, shape: &Shape) -> Vec<Group> {
    let of = |daemon: &Daemon| match daemon {
        Daemon::Collector(n) => Group::Collector(*n),
        Daemon::Aggregator(n) => Group::ShardSet(n / shape.replication_factor),
        Daemon::Ingester(_) => Group::Ingesters,
    };
    match fault {
        Fault::Kill(daemon)
        | Fault::Pause(daemon)
        | Fault::Starve(daemon, _)
        | Fault::Link(daemon, _)
        | Fault::DiskFull(daemon)
        | Fault::Partition(daemon) => vec![of(daemon)],
        Fault::EtcdRestart | Fault::EtcdPause => std::iter::once(Group::Etcd)
            .chain((0..shape.aggregators / shape.replication_factor.max(1)).map(Group::ShardSet))
            .collect(),
        Fault::Store(_) => vec![Group::Store],
    }
}

/// Whether two faults may not run at once, or `b` may not start yet after `a`.
fn clash(a: &Scheduled, b_at: Duration, b: &Fault, shape: &Shape) -> bool {
    let (touched, touching) = (groups(&a.fault, shape), groups(b, shape));
    touching.iter().any(|group| {
        let rest = match group {
            Group::ShardSet(_) => shape.shard_set_recovery,
            _ => Duration::from_secs(3),
        };
        touched.contains(group) && a.ends() + rest > b_at
    })
}

/// When faults may start: after the warm-up, and ending before the quiet tail.
pub const WARM_UP: Duration = Duration::from_secs(8);
/// The end of the run with no fault, so that every series ends on known values.
pub const QUIET_TAIL: Duration = Duration::from_secs(25);

/// The scripted replica-kill scenario, rounds of one tile of `tile` each, three tiles
/// apart (time for a failover after a lease TTL of a tile): in round `k` replica
/// `k % 2` of the first shard set is SIGKILLed mid-tile and restarted before the tile
/// ends, so that the leader dies at least once and every survivor but the first is a
/// replica restarted a round before. Offsets count from a tile boundary.
pub fn replica_kill(tile: Duration, rounds: u32) -> Vec<Scheduled> {
    (0..rounds)
        .map(|round| Scheduled {
            at: tile * (3 * round + 1) + tile / 2,
            lasts: tile * 2 / 5,
            fault: Fault::Kill(Daemon::Aggregator(round as usize % 2)),
        })
        .collect()
}

/// The scripted double-kill scenario (issue 50): replica 0 of the first shard set
/// SIGKILLed mid-tile and restarted 3 s later, replica 1 SIGKILLed 10 s after the first kill
/// (one lease TTL of the daemons' default) and restarted 3 s later. Never both down at once,
/// so every tile must be exact: a survivor that waited out its dead peer's lease would still
/// be waiting when the second kill takes the only replica holding the tile. Offsets count
/// from a tile boundary.
pub fn double_kill(tile: Duration) -> Vec<Scheduled> {
    let first = tile + tile / 2;
    let restart_after = Duration::from_secs(3);
    vec![
        Scheduled { at: first, lasts: restart_after, fault: Fault::Kill(Daemon::Aggregator(0)) },
        Scheduled {
            at: first + Duration::from_secs(10),
            lasts: restart_after,
            fault: Fault::Kill(Daemon::Aggregator(1)),
        },
    ]
}

/// The partition scenario's tile.
pub const PARTITION_TILE: Duration = Duration::from_secs(5);
/// The partition scenario's lease TTL: short, so that each cut outlasts a lease quickly. The
/// stale-leader scenario gives it to the ingesters, and the daemons' default (10 s) to the
/// aggregators.
pub const PARTITION_TTL_SECS: u64 = 3;

/// The scripted partition scenario (issue 50): rounds from a tile boundary, each cutting
/// daemons off from etcd for three lease TTLs of `ttl` (long enough for etcd to expire their
/// leases and the others to act on it) while every other daemon reaches etcd: the first
/// ingester (failed over while alive, then back and joining again), the shard set's
/// replicas one after the other (whichever leads is cut once: it fences itself off and the
/// other takes over), the collector (it routes on the placement it has), then a replica and
/// an ingester together, twice (both ends of a link, each alive). Each round ends at least
/// two tiles before the next begins.
pub fn partition(tile: Duration, ttl: Duration) -> Vec<Scheduled> {
    let cut = ttl * 3;
    let round = (cut + tile * 2).div_duration_f64(tile).ceil() as u32 * tile;
    let rounds: [&[Daemon]; 6] = [
        &[Daemon::Ingester(0)],
        &[Daemon::Aggregator(0)],
        &[Daemon::Aggregator(1)],
        &[Daemon::Collector(0)],
        // Both ends of a link at once: a replica and an ingester, each alive.
        &[Daemon::Aggregator(0), Daemon::Ingester(0)],
        &[Daemon::Aggregator(1), Daemon::Ingester(1)],
    ];
    rounds
        .into_iter()
        .enumerate()
        .flat_map(|(n, daemons)| {
            daemons.iter().map(move |daemon| Scheduled {
                at: tile + tile / 3 + round * n as u32,
                lasts: cut,
                fault: Fault::Partition(*daemon),
            })
        })
        .collect()
}

/// The scripted stale-leader scenario (issue 50): what the ingesters' fence is for. The
/// aggregators keep a longer lease (`aggregator_ttl`) than the ingesters, as a deployment
/// may. In each round a replica and an ingester are cut off from etcd together, just after
/// a tile was flushed (`tile` boundaries plus `after_flush`), for the aggregators' lease
/// and 3 s more: if that replica leads, it goes on flushing by the ingesters' placement it
/// had, to the cut-off ingester, well after the other ingesters failed that one over; the
/// other replica takes over when the leader's lease expires and flushes again from the last
/// marks the leader could record, to the new owner. Unfenced, the cut-off ingester writes
/// the tiles it gets meanwhile, and so does the new owner: two writers of every series of
/// its shards. Round 1 cuts replica 1 and ingester 1, round 2 replica 2 and ingester 2, a
/// shard set's recovery apart.
pub fn stale_leader(tile: Duration, aggregator_ttl: Duration, after_flush: Duration) -> Vec<Scheduled> {
    let cut = aggregator_ttl + Duration::from_secs(3);
    let recovery = shard_set_recovery(tile, aggregator_ttl);
    let rounds = (cut + recovery).div_duration_f64(tile).ceil() as u32;
    (0..2)
        .flat_map(|round| {
            let at = tile * (2 + rounds * round) + after_flush;
            [Daemon::Aggregator(round as usize), Daemon::Ingester(round as usize)].map(|daemon| Scheduled {
                at,
                lasts: cut,
                fault: Fault::Partition(daemon),
            })
        })
        .collect()
}

/// The scripted leader-link-stall scenario (seeds 14 and 23 of the campaign), and its long
/// rounds (fix 16). The first two rounds, three tiles of `tile` apart: in round `k` the links
/// from the collectors into replica `k % 2` of the first shard set stall from a fifth of a
/// tile before a tile's end, for 1.2 tiles (longer than the aggregators' default
/// `max_buffer_past`, 8 s, past the end for a 10 s tile), so that the replica closes that
/// tile at its deadline without the last windows and takes them, once the stall ends, into
/// the longer policy's tile still open. Whichever replica leads, one of two rounds stalls the leader. Run with
/// [`LINK_STALL_POLICIES`]: the windows too late for the 10 s tile go into the 30 s
/// tile they fall in, still open (seed 23 found that tile short of them when a window was
/// admitted or refused whole; RELIABILITY.md, fixes 11 and 22).
///
/// Rounds 2 and 3, four tiles apart, stall the links into each replica in turn from a tenth
/// into a tile for 2.2 tiles: the next tile begins more than `max_buffer_past` after the
/// stall did, so its collectors no longer count and it closes *confirmed* with no series on
/// the stalled replica, before the stall ends; a leader must still record it incomplete,
/// or its follower lets its whole copy go (fix 16). Offsets count from a tile boundary.
pub fn link_stall(tile: Duration, rounds: u32) -> Vec<Scheduled> {
    (0..rounds)
        .map(|round| {
            let replica = Daemon::Aggregator(round as usize % 2);
            let (at, lasts) = match round {
                0 | 1 => (tile * (3 * round + 2) - tile / 5, tile * 6 / 5),
                long => (tile * (7 + 4 * (long - 2)) + tile / 10, tile * 22 / 10),
            };
            Scheduled { at, lasts, fault: Fault::Link(replica, LinkFault::Stall) }
        })
        .collect()
}

/// The link-stall scenario's rounds, and how long it runs, in tiles: the four rounds of
/// [`link_stall`] and a quiet tail of more than two tiles.
pub const LINK_STALL_ROUNDS: u32 = 4;
/// See [`LINK_STALL_ROUNDS`].
pub const LINK_STALL_TILES: u32 = 16;

/// The policies of the link-stall scenario: 10 s tiles, and 30 s tiles that each stall
/// ends inside of.
pub const LINK_STALL_POLICIES: [&str; 2] = ["10s:1h", "30s:1h"];

/// Draws the schedule of a run of `duration` (from the start of sending) from `seed`.
pub fn draw(seed: u64, duration: Duration, shape: &Shape) -> Vec<Scheduled> {
    let mut rng = Rng::new(seed);
    let mut faults: Vec<Scheduled> = Vec::new();
    let Some(last_end) = duration.checked_sub(QUIET_TAIL) else {
        return faults;
    };
    let mut at = WARM_UP + rng.millis(0, 4_000);
    while at < last_end {
        let candidate = draw_fault(&mut rng, shape);
        let lasts = draw_length(&mut rng, &candidate);
        let busy = faults.iter().any(|other| clash(other, at, &candidate, shape));
        if !busy && at + lasts <= last_end {
            faults.push(Scheduled { at, lasts, fault: candidate });
        }
        at += rng.millis(2_000, 9_000);
    }
    faults
}

fn any_daemon(rng: &mut Rng, shape: &Shape) -> Daemon {
    let total = shape.collectors + shape.aggregators + shape.ingesters;
    let pick = rng.between(0, total as u64 - 1) as usize;
    if pick < shape.collectors {
        Daemon::Collector(pick)
    } else if pick < shape.collectors + shape.aggregators {
        Daemon::Aggregator(pick - shape.collectors)
    } else {
        Daemon::Ingester(pick - shape.collectors - shape.aggregators)
    }
}

fn draw_fault(rng: &mut Rng, shape: &Shape) -> Fault {
    // Drawn only with partitions on, so that a seed without them draws what it always did.
    if shape.partitions && rng.between(0, 99) < 20 {
        return Fault::Partition(any_daemon(rng, shape));
    }
    match rng.between(0, 99) {
        0..=24 => Fault::Kill(any_daemon(rng, shape)),
        25..=29 if shape.ingesters > 0 => {
            Fault::DiskFull(Daemon::Ingester(rng.between(0, shape.ingesters as u64 - 1) as usize))
        }
        25..=29 => Fault::Kill(any_daemon(rng, shape)),
        30..=44 => Fault::Pause(any_daemon(rng, shape)),
        45..=54 => Fault::Starve(any_daemon(rng, shape), rng.between(3, 15) as u32),
        55..=59 => Fault::EtcdRestart,
        60..=64 => Fault::EtcdPause,
        65..=69 => Fault::Store(StoreFault::Slow(rng.millis(500, 3_000))),
        70..=74 => Fault::Store(StoreFault::Refuse),
        draw => {
            let into = if rng.between(0, 1) == 0 || shape.ingesters == 0 {
                Daemon::Aggregator(rng.between(0, shape.aggregators as u64 - 1) as usize)
            } else {
                Daemon::Ingester(rng.between(0, shape.ingesters as u64 - 1) as usize)
            };
            let kind = match draw {
                75..=84 => LinkFault::Delay(rng.millis(100, 2_500)),
                85..=92 => LinkFault::Stall,
                _ => LinkFault::Reset,
            };
            Fault::Link(into, kind)
        }
    }
}

fn draw_length(rng: &mut Rng, fault: &Fault) -> Duration {
    match fault {
        Fault::Kill(_) => rng.millis(1_000, 15_000),
        Fault::Pause(_) => rng.millis(2_000, 14_000),
        Fault::Starve(..) => rng.millis(5_000, 25_000),
        Fault::EtcdRestart | Fault::EtcdPause => rng.millis(1_000, 12_000),
        Fault::Store(_) => rng.millis(3_000, 20_000),
        Fault::Link(_, LinkFault::Reset) => rng.millis(200, 5_000),
        Fault::DiskFull(_) => rng.millis(2_000, 15_000),
        Fault::Partition(_) => rng.millis(2_000, 20_000),
        Fault::Link(..) => rng.millis(2_000, 15_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        collectors: 2,
        aggregators: 4,
        replication_factor: 2,
        ingesters: 2,
        shard_set_recovery: Duration::from_secs(72),
        partitions: false,
    };

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_draws_another() {
        let five_minutes = Duration::from_secs(300);
        assert_eq!(draw(1, five_minutes, &SHAPE), draw(1, five_minutes, &SHAPE));
        assert_ne!(draw(1, five_minutes, &SHAPE), draw(2, five_minutes, &SHAPE));
        assert!(draw(1, five_minutes, &SHAPE).len() >= 15, "{:?}", draw(1, five_minutes, &SHAPE));
    }

    #[test]
    fn faults_of_one_group_never_overlap_a_shard_set_recovers_between_two_and_all_end_before_the_tail() {
        for seed in 0..200 {
            let duration = Duration::from_secs(300);
            let faults = draw(seed, duration, &SHAPE);
            for (i, a) in faults.iter().enumerate() {
                assert!(a.at >= WARM_UP && a.ends() <= duration - QUIET_TAIL, "seed {seed}: {a}");
                for b in &faults[i + 1..] {
                    let (a_groups, b_groups) = (groups(&a.fault, &SHAPE), groups(&b.fault, &SHAPE));
                    for group in b_groups.iter().filter(|group| a_groups.contains(group)) {
                        let rest = match group {
                            Group::ShardSet(_) => SHAPE.shard_set_recovery,
                            _ => Duration::from_secs(3),
                        };
                        assert!(b.at >= a.ends() + rest, "seed {seed}: {b} too soon after {a}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_link_stall_scenario_stalls_each_replica_in_turn_across_a_tile_end_past_max_buffer_past() {
        let tile = Duration::from_secs(10);
        let faults = link_stall(tile, LINK_STALL_ROUNDS);
        let stalled: Vec<Fault> = faults.iter().map(|fault| fault.fault).collect();
        let stall = |n| Fault::Link(Daemon::Aggregator(n), LinkFault::Stall);
        assert_eq!(stalled, [stall(0), stall(1), stall(0), stall(1)]);
        let (max_buffer_past, buffer_past) = (Duration::from_secs(8), Duration::from_secs(2));
        for (round, fault) in faults[..2].iter().enumerate() {
            let tile_end = tile * (3 * round as u32 + 2);
            assert!(fault.at < tile_end && fault.ends() > tile_end + max_buffer_past, "{fault}");
        }
        // The long rounds: a whole tile begins more than max_buffer_past into the stall and
        // closes (its end plus buffer_past) before the stall ends.
        for fault in &faults[2..] {
            let next_start = (fault.at.as_millis() / tile.as_millis() + 1) as u32 * tile;
            assert!(next_start - fault.at > max_buffer_past, "{fault}");
            assert!(next_start + tile + buffer_past < fault.ends(), "{fault}");
        }
        let last = faults.last().unwrap();
        assert!(last.ends() + tile * 2 < tile * LINK_STALL_TILES, "a quiet tail of more than two tiles");
    }

    #[test]
    fn the_replica_kill_scenario_kills_each_replica_in_turn_mid_tile() {
        let tile = Duration::from_secs(10);
        let faults = replica_kill(tile, 3);
        let killed: Vec<Fault> = faults.iter().map(|fault| fault.fault).collect();
        assert_eq!(
            killed,
            [Daemon::Aggregator(0), Daemon::Aggregator(1), Daemon::Aggregator(0)].map(Fault::Kill).to_vec()
        );
        for (round, fault) in faults.iter().enumerate() {
            let tile_start = tile * (3 * round as u32 + 1);
            assert!(fault.at > tile_start && fault.ends() < tile_start + tile, "{fault}");
        }
    }

    #[test]
    fn the_double_kill_scenario_kills_the_second_replica_a_ttl_after_the_first_never_both_at_once() {
        let tile = Duration::from_secs(10);
        let faults = double_kill(tile);
        let killed: Vec<Fault> = faults.iter().map(|fault| fault.fault).collect();
        assert_eq!(killed, [Daemon::Aggregator(0), Daemon::Aggregator(1)].map(Fault::Kill).to_vec());
        assert!(faults[0].at > tile && faults[0].at < tile * 2, "mid-tile: {}", faults[0]);
        assert_eq!(faults[1].at - faults[0].at, Duration::from_secs(10), "the daemons' default TTL apart");
        assert!(faults[0].ends() < faults[1].at, "the first is back before the second dies");
    }

    #[test]
    fn partitions_are_drawn_only_when_asked_and_leave_the_other_seeds_as_they_were() {
        let five_minutes = Duration::from_secs(300);
        let with = Shape { partitions: true, ..SHAPE };
        let partitioned = |shape: &Shape| {
            (0..50)
                .flat_map(|seed| draw(seed, five_minutes, shape))
                .filter(|fault| matches!(fault.fault, Fault::Partition(_)))
                .count()
        };
        assert_eq!(partitioned(&SHAPE), 0);
        assert!(partitioned(&with) > 50, "{}", partitioned(&with));
        let kinds = |daemon: fn(usize) -> Daemon| {
            (0..50)
                .flat_map(|seed| draw(seed, five_minutes, &with))
                .any(|fault| fault.fault == Fault::Partition(daemon(0)))
        };
        assert!(kinds(Daemon::Ingester) && kinds(Daemon::Aggregator) && kinds(Daemon::Collector));
        // Without partitions a seed's schedule is what it was before they existed.
        let seed_1: Vec<String> = draw(1, five_minutes, &SHAPE).iter().map(ToString::to_string).collect();
        assert_eq!(seed_1.first().map(String::as_str), Some("   11.0s  10.6s  kill ing-2"), "{seed_1:?}");
    }

    #[test]
    fn the_partition_scenario_cuts_each_daemon_past_its_lease_then_both_ends_of_a_link() {
        let (tile, ttl) = (Duration::from_secs(10), Duration::from_secs(4));
        let faults = partition(tile, ttl);
        let cut: Vec<Fault> = faults.iter().map(|fault| fault.fault).collect();
        let (ingester, aggregator) = (Daemon::Ingester, Daemon::Aggregator);
        assert_eq!(
            cut,
            [
                ingester(0),
                aggregator(0),
                aggregator(1),
                Daemon::Collector(0),
                aggregator(0),
                ingester(0),
                aggregator(1),
                ingester(1)
            ]
            .map(Fault::Partition)
            .to_vec()
        );
        for fault in &faults {
            assert!(fault.lasts > ttl * 2, "past the lease: {fault}");
        }
        let rounds: Vec<&[Scheduled]> = faults.chunk_by(|a, b| a.at == b.at).collect();
        assert_eq!(rounds.iter().map(|round| round.len()).collect::<Vec<_>>(), [1, 1, 1, 1, 2, 2]);
        for pair in rounds.windows(2) {
            assert!(pair[0][0].ends() + tile * 2 <= pair[1][0].at, "{} then {}", pair[0][0], pair[1][0]);
        }
    }

    #[test]
    fn the_stale_leader_scenario_cuts_a_replica_and_an_ingester_together_past_the_aggregators_lease() {
        let (tile, ttl) = (Duration::from_secs(5), Duration::from_secs(10));
        let faults = stale_leader(tile, ttl, Duration::from_millis(2_500));
        let cut: Vec<Fault> = faults.iter().map(|fault| fault.fault).collect();
        let (ingester, aggregator) = (Daemon::Ingester, Daemon::Aggregator);
        assert_eq!(cut, [aggregator(0), ingester(0), aggregator(1), ingester(1)].map(Fault::Partition).to_vec());
        assert_eq!((faults[0].at, faults[1].at), (faults[1].at, faults[0].at), "together");
        assert!(faults[0].lasts > ttl, "past the aggregators' lease");
        assert_eq!(faults[0].at.as_millis() % tile.as_millis(), 2_500, "just after a flush");
        assert!(faults[2].at >= faults[0].ends() + shard_set_recovery(tile, ttl), "a shard set's recovery apart");
    }

    #[test]
    fn every_kind_of_fault_is_drawn() {
        let faults: Vec<Fault> =
            (0..50).flat_map(|seed| draw(seed, Duration::from_secs(300), &SHAPE)).map(|s| s.fault).collect();
        let kinds = [
            faults.iter().any(|f| matches!(f, Fault::Kill(Daemon::Collector(_)))),
            faults.iter().any(|f| matches!(f, Fault::Kill(Daemon::Aggregator(_)))),
            faults.iter().any(|f| matches!(f, Fault::Kill(Daemon::Ingester(_)))),
            faults.iter().any(|f| matches!(f, Fault::Pause(_))),
            faults.iter().any(|f| matches!(f, Fault::Starve(..))),
            faults.iter().any(|f| matches!(f, Fault::EtcdRestart)),
            faults.iter().any(|f| matches!(f, Fault::EtcdPause)),
            faults.iter().any(|f| matches!(f, Fault::Store(StoreFault::Slow(_)))),
            faults.iter().any(|f| matches!(f, Fault::Store(StoreFault::Refuse))),
            faults.iter().any(|f| matches!(f, Fault::Link(_, LinkFault::Delay(_)))),
            faults.iter().any(|f| matches!(f, Fault::Link(_, LinkFault::Stall))),
            faults.iter().any(|f| matches!(f, Fault::Link(_, LinkFault::Reset))),
            faults.iter().any(|f| matches!(f, Fault::DiskFull(Daemon::Ingester(_)))),
        ];
        assert!(kinds.iter().all(|seen| *seen), "{kinds:?}");
    }
}
