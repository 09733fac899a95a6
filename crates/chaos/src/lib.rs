//! tessera's fault campaign: the real binaries (collectors, aggregator replicas,
//! ingesters in their placement), a real etcd and a real Prometheus, a workload whose
//! exact outcome is known, faults drawn from a seed, and a checker that reads every
//! series back from the store.
//!
//! ```text
//! tessera-chaos --seed 7 --duration 5m          # one campaign; exit 1 on a violation
//! tessera-chaos --seeds 1..=20 --duration 5m    # twenty, one after another
//! tessera-chaos --replica-kill --runs 50 --busy-neighbours 2
//! ```
//!
//! - [`schedule`]: the faults (kill, pause, CPU starvation, etcd killed or paused, a
//!   slow or refusing store, links delayed, stalled or cut, an ingester's disk full),
//!   drawn from the seed, and the scripted replica-kill scenario;
//! - [`proxy`]: the TCP proxy on every link into an aggregator, an ingester and the
//!   store, which the link faults act on;
//! - [`cluster`]: the processes, their configs and placements;
//! - [`workload`]: the sender and its ledger of what was sent when;
//! - [`check`]: per series, per resolution and per tile: lost, doubled, wrong, late;
//! - [`run`]: one campaign from start to report.
//!
//! It is a binary of its own, not a `tessera` subcommand: it starts and kills etcd and
//! Prometheus and puts processes in cgroups, and the daemons operators ship carry none
//! of that. The replica-kill scenario and two short seeds run in the test suite
//! (`tests/campaign.rs`); RELIABILITY.md has the long campaigns and what they found.

pub mod check;
pub mod cluster;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod workload;
