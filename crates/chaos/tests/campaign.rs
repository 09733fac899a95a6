//! The fault campaign in the test suite: the real binaries (built by `cargo build
//! --workspace`, which `scripts/test.sh` runs first), a real etcd and a real Prometheus.
//!
//! - The scripted replica-kill scenario beside a busy neighbour: two aggregators as one
//!   shard set (RF 2), a replica SIGKILLed mid-tile and restarted, each in turn; every
//!   10 s tile exact.
//! - Short campaigns of drawn faults on two seeds: no series lost, doubled or wrong.
//!
//! Long campaigns are a benchmark (`tessera-chaos --seeds 1..=100 --duration 5m`):
//! RELIABILITY.md has what they ran and found.

use std::path::PathBuf;
use std::time::Duration;

use tessera_chaos::check::resolutions;
use tessera_chaos::run::{Campaign, run, summary};
use tessera_chaos::schedule::{Shape, draw, replica_kill, shard_set_recovery};

/// `target/<profile>`, where the workspace's binaries are.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps").to_path_buf();
    for binary in ["tessera", "tessera-collector", "tessera-aggregator", "tessera-ingester"] {
        assert!(dir.join(binary).exists(), "{binary} is not built: run `cargo build --workspace` first");
    }
    dir
}

fn run_and_report(campaign: &Campaign) {
    let outcome = run(campaign, &mut |line| eprintln!("[seed {}] {line}", campaign.seed)).expect("the campaign runs");
    let report = summary(campaign, &outcome);
    eprintln!("{report}");
    assert!(outcome.rounds > 0 && outcome.report.tiles_checked > 0, "nothing was checked:\n{report}");
    assert!(outcome.passed(), "{report}");
    let _ = std::fs::remove_dir_all(&campaign.dir);
}

#[test]
fn the_replica_kill_scenario_is_exact_beside_a_busy_neighbour() {
    let tile = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let campaign = Campaign {
        seed: 0,
        duration: tile * 9,
        shape: Shape {
            collectors: 1,
            aggregators: 2,
            replication_factor: 2,
            ingesters: 1,
            shard_set_recovery: Duration::ZERO,
        },
        policies: vec!["10s:1h".to_owned()],
        ttl_secs: 10,
        series_per_kind: 50,
        bin_dir: bin_dir(),
        dir: dir.path().join("replica-kill"),
        schedule: replica_kill(tile, 3),
        align_ms: Some(tile.as_millis() as i64),
        busy_neighbours: 1,
    };
    run_and_report(&campaign);
}

#[test]
fn short_campaigns_of_drawn_faults_lose_double_and_corrupt_nothing() {
    let policies = vec!["5s:1h".to_owned(), "20s:1h".to_owned()];
    let ttl_secs = 3;
    let longest = resolutions(&policies).unwrap().iter().map(|resolution| resolution.tile_ms).max().unwrap();
    let shape = Shape {
        collectors: 2,
        aggregators: 4,
        replication_factor: 2,
        ingesters: 2,
        shard_set_recovery: shard_set_recovery(Duration::from_millis(longest as u64), Duration::from_secs(ttl_secs)),
    };
    let duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().unwrap();
    for seed in [CI_SEEDS[0], CI_SEEDS[1]] {
        let schedule = draw(seed, duration, &shape);
        assert!(!schedule.is_empty(), "seed {seed} draws faults");
        let campaign = Campaign {
            seed,
            duration,
            shape,
            policies: policies.clone(),
            ttl_secs,
            series_per_kind: 100,
            bin_dir: bin_dir(),
            dir: dir.path().join(format!("seed-{seed}")),
            schedule,
            align_ms: None,
            busy_neighbours: 0,
        };
        run_and_report(&campaign);
    }
}

/// The seeds CI runs.
const CI_SEEDS: [u64; 2] = [1, 2];
