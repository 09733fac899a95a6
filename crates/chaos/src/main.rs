//! `tessera-chaos`: runs fault campaigns against the real binaries (see the crate docs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use tessera_chaos::run::{Campaign, run, summary};
use tessera_chaos::schedule::{
    LINK_STALL_POLICIES, LINK_STALL_ROUNDS, LINK_STALL_TILES, PARTITION_TILE, PARTITION_TTL_SECS, Scheduled, Shape,
    double_kill, draw, link_stall, partition, replica_kill, stale_leader,
};

/// The scripted scenarios' tile.
const SCENARIO_TILE: Duration = Duration::from_secs(10);
/// The scripted scenarios' lease TTL (the daemons' default).
const SCENARIO_TTL: Duration = Duration::from_secs(10);
/// How long after a 5 s tile's boundary the stale-leader scenario cuts: after the tile's flush
/// (a collector's watermark confirms it within a second or so), and long enough before the
/// next one that a fenced ingester refuses it.
const STALE_LEADER_AFTER_FLUSH: Duration = Duration::from_millis(2_500);

/// Fault campaigns against the real tessera binaries, a real etcd and a real Prometheus:
/// faults drawn from a seed, every series checked. Exit 1 when a campaign finds a lost,
/// doubled or wrong series; 2 when a campaign cannot run.
#[derive(Debug, Parser)]
#[command(name = "tessera-chaos", version)]
struct Args {
    /// The seed of the fault schedule: the same seed replays the same faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run several seeds one after another, `FIRST..=LAST`; overrides `--seed`.
    #[arg(long, value_name = "FIRST..=LAST")]
    seeds: Option<String>,
    /// How long the workload is sent (`90s`, `5m`); faults end 25 s before.
    #[arg(long, default_value = "5m")]
    duration: String,
    /// Collectors.
    #[arg(long, default_value_t = 2)]
    collectors: usize,
    /// Aggregators: whole shard sets of `--replication-factor`.
    #[arg(long, default_value_t = 4)]
    aggregators: usize,
    /// Replicas per shard set.
    #[arg(long, default_value_t = 2)]
    replication_factor: usize,
    /// Ingesters (in their etcd placement).
    #[arg(long, default_value_t = 2)]
    ingesters: usize,
    /// The aggregators' storage policies.
    #[arg(long, value_delimiter = ',', default_value = "10s:1h,1m:1h")]
    policies: Vec<String>,
    /// One of `--policies` to write to a real carbon-cache (the Graphite target; Debian's
    /// `graphite-carbon`) instead of Prometheus, checked per tile from its whisper files.
    #[arg(long, value_name = "POLICY")]
    graphite_policy: Option<String>,
    /// Liveness lease TTL of aggregators and ingesters, seconds.
    #[arg(long, default_value_t = 4)]
    ttl_secs: u64,
    /// Series of each kind (counter, gauge, timer, set).
    #[arg(long, default_value_t = 1000)]
    series_per_kind: u64,
    /// Where the tessera binaries are (default: beside this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where each run keeps its configs, data and logs (default: the temp dir); a
    /// failed run's directory is kept.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the schedule of each seed and exit.
    #[arg(long)]
    dry_run: bool,
    /// Instead of a drawn schedule, the scripted replica-kill scenario: one collector,
    /// two aggregators as one shard set (RF 2), one ingester, 10 s tiles; in each of
    /// three rounds of one tile, a replica is SIGKILLed mid-tile and restarted, each in
    /// turn. `--runs N` repeats it. Overrides the shape, policies and duration.
    #[arg(long, conflicts_with_all = ["link_stall", "double_kill"])]
    replica_kill: bool,
    /// Instead of a drawn schedule, the scripted double-kill scenario: the shape of
    /// `--replica-kill`; replica 1 SIGKILLed mid-tile and restarted 3 s later, replica 2
    /// SIGKILLed 10 s after the first (the default lease TTL) and restarted 3 s later;
    /// every 10 s tile exact. `--runs N` repeats it.
    #[arg(long, conflicts_with = "link_stall")]
    double_kill: bool,
    /// Instead of a drawn schedule, the scripted leader-link-stall scenario: the shape of
    /// `--replica-kill`; in each of two rounds the links into one replica, each in turn,
    /// stall from 2 s before a 10 s tile's end for 12 s (past `max_buffer_past`), inside
    /// a 30 s tile still open; in two more, for 22 s from 1 s into a tile, so that the next
    /// tile closes with nothing from the collectors on the stalled replica. `--runs N`
    /// repeats it.
    #[arg(long)]
    link_stall: bool,
    /// Instead of a drawn schedule, the scripted partition scenario: the shape of
    /// `--replica-kill` with two ingesters, 5 s tiles, a lease TTL of 3 s; daemons are cut
    /// off from etcd for three TTLs while the others reach it: the first ingester (failed
    /// over while alive, then back), each replica in turn, the collector, then a replica and
    /// an ingester together, twice. The checker proves one writer per series at every
    /// moment. `--runs N` repeats it.
    #[arg(long, conflicts_with_all = ["replica_kill", "double_kill", "link_stall"])]
    partition: bool,
    /// Instead of a drawn schedule, the scripted stale-leader scenario: the shape of
    /// `--partition`, the aggregators on a 10 s lease and the ingesters on a 3 s one; a
    /// replica and an ingester are cut off from etcd together just after a flush, for 13 s,
    /// twice. A cut-off leader keeps sending to the cut-off ingester after the others failed
    /// it over; with the ingesters' fence off (`TESSERA_FAILPOINTS=ingester.no_fence=0`) that
    /// ingester writes those tiles beside their new owner: two writers.
    #[arg(long, conflicts_with_all = ["replica_kill", "double_kill", "link_stall", "partition"])]
    stale_leader: bool,
    /// Draw partitions too (a daemon cut off from etcd while the others reach it). Without
    /// it a seed draws the schedule it drew before partitions existed.
    #[arg(long)]
    partitions: bool,
    /// Repeat each campaign this many times.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Busy processes beside the cluster, each spinning on a core (`yes`).
    #[arg(long, default_value_t = 0)]
    busy_neighbours: usize,
}

fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: u64 = number.parse().with_context(|| format!("invalid duration `{text}`"))?;
    Ok(Duration::from_secs(match unit {
        "" | "s" => number,
        "m" => number * 60,
        "h" => number * 3_600,
        _ => bail!("invalid duration `{text}`: use s, m or h"),
    }))
}

/// [`tessera_chaos::schedule::shard_set_recovery`] for `policies`.
fn shard_set_recovery(policies: &[String], ttl_secs: u64) -> anyhow::Result<Duration> {
    let resolutions = tessera_chaos::check::resolutions(policies)?;
    let longest = resolutions.iter().map(|resolution| resolution.tile_ms).max().unwrap_or(0);
    Ok(tessera_chaos::schedule::shard_set_recovery(
        Duration::from_millis(longest as u64),
        Duration::from_secs(ttl_secs),
    ))
}

/// The longest tile of `policies`, in milliseconds.
fn longest_tile_ms(policies: &[String]) -> anyhow::Result<i64> {
    let resolutions = tessera_chaos::check::resolutions(policies)?;
    Ok(resolutions.iter().map(|resolution| resolution.tile_ms).max().unwrap_or(0))
}

fn seeds(args: &Args) -> anyhow::Result<Vec<u64>> {
    let Some(range) = &args.seeds else { return Ok(vec![args.seed]) };
    let (first, last) = range.split_once("..=").with_context(|| format!("invalid --seeds `{range}`: FIRST..=LAST"))?;
    Ok((first.parse()?..=last.parse()?).collect())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match campaigns(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("tessera-chaos: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn campaigns(args: &Args) -> anyhow::Result<bool> {
    let mut duration = parse_duration(&args.duration)?;
    let mut policies = args.policies.clone();
    let mut shape = Shape {
        collectors: args.collectors,
        aggregators: args.aggregators,
        replication_factor: args.replication_factor,
        ingesters: args.ingesters,
        shard_set_recovery: shard_set_recovery(&args.policies, args.ttl_secs)?,
        partitions: args.partitions,
    };
    // A scripted scenario: its flag, schedule, length and policies.
    let scripted: Option<(&str, Vec<Scheduled>, Duration, &[&str])> = if args.replica_kill {
        Some(("--replica-kill", replica_kill(SCENARIO_TILE, 3), SCENARIO_TILE * 9, &["10s:1h"]))
    } else if args.double_kill {
        Some(("--double-kill", double_kill(SCENARIO_TILE), SCENARIO_TILE * 6, &["10s:1h"]))
    } else if args.partition {
        let ttl = Duration::from_secs(PARTITION_TTL_SECS);
        let schedule = partition(PARTITION_TILE, ttl);
        let length = schedule.last().map_or(Duration::ZERO, Scheduled::ends) + PARTITION_TILE * 4;
        Some(("--partition", schedule, length, &["5s:1h"]))
    } else if args.stale_leader {
        let schedule = stale_leader(PARTITION_TILE, SCENARIO_TTL, STALE_LEADER_AFTER_FLUSH);
        let length = schedule.last().map_or(Duration::ZERO, Scheduled::ends) + PARTITION_TILE * 4;
        Some(("--stale-leader", schedule, length, &["5s:1h"]))
    } else if args.link_stall {
        Some((
            "--link-stall",
            link_stall(SCENARIO_TILE, LINK_STALL_ROUNDS),
            SCENARIO_TILE * LINK_STALL_TILES,
            &LINK_STALL_POLICIES,
        ))
    } else {
        None
    };
    if let Some((_, _, length, scenario_policies)) = &scripted {
        shape = Shape { collectors: 1, aggregators: 2, replication_factor: 2, ingesters: 1, ..shape };
        policies = scenario_policies.iter().map(|policy| (*policy).to_owned()).collect();
        duration = *length;
    }
    // The scenarios run on the daemons' default lease TTL; the partition scenario on a short
    // one, with two ingesters (one to fail over to).
    let ttl_secs = match &scripted {
        Some(_) if args.partition => PARTITION_TTL_SECS,
        Some(_) => SCENARIO_TTL.as_secs(),
        None => args.ttl_secs,
    };
    let ingester_ttl_secs = args.stale_leader.then_some(PARTITION_TTL_SECS);
    if args.partition || args.stale_leader {
        shape.ingesters = 2;
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?.parent().context("the binary's directory")?.to_path_buf(),
    };
    let mut all_passed = true;
    let (mut runs, mut failed) = (0, 0);
    let seeds: Vec<u64> =
        seeds(args)?.into_iter().flat_map(|seed| std::iter::repeat_n(seed, args.runs as usize)).collect();
    for seed in seeds {
        let schedule = match &scripted {
            Some((_, schedule, _, _)) => schedule.clone(),
            None => draw(seed, duration, &shape),
        };
        let dir = args
            .dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("tessera-chaos-{seed}-{}", std::process::id()));
        let campaign = Campaign {
            seed,
            duration,
            shape,
            policies: policies.clone(),
            graphite: args.graphite_policy.clone().filter(|_| scripted.is_none()),
            ttl_secs,
            ingester_ttl_secs,
            series_per_kind: args.series_per_kind,
            bin_dir: bin_dir.clone(),
            dir: dir.clone(),
            schedule,
            // A scenario starts on a boundary of its longest tile, where its offsets count from.
            align_ms: scripted.as_ref().map(|_| longest_tile_ms(&policies)).transpose()?,
            busy_neighbours: args.busy_neighbours,
        };
        if args.dry_run {
            println!("seed {seed}:");
            for fault in &campaign.schedule {
                println!("  {fault}");
            }
            continue;
        }
        let outcome = run(&campaign, &mut |line| eprintln!("[seed {seed}] {line}"))?;
        print!("{}", summary(&campaign, &outcome));
        runs += 1;
        if outcome.passed() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            all_passed = false;
            failed += 1;
            if let Some((flag, _, _, _)) = &scripted {
                println!("replay: tessera-chaos {flag} --busy-neighbours {}", args.busy_neighbours);
                continue;
            }
            println!(
                "replay: tessera-chaos --seed {seed} --duration {}s --collectors {} --aggregators {} --replication-factor {} \
                 --ingesters {} --policies {} --ttl-secs {} --series-per-kind {}{}{}",
                duration.as_secs(),
                shape.collectors,
                shape.aggregators,
                shape.replication_factor,
                shape.ingesters,
                policies.join(","),
                ttl_secs,
                args.series_per_kind,
                campaign.graphite.as_ref().map(|policy| format!(" --graphite-policy {policy}")).unwrap_or_default(),
                // Without it the seed draws another schedule: the one of before partitions.
                if args.partitions { " --partitions" } else { "" },
            );
        }
    }
    if runs > 1 {
        println!("{} of {runs} runs passed", runs - failed);
    }
    Ok(all_passed)
}
