//! Aggregator high availability with real processes: two
//! `tessera-aggregator` replicas of one shard set (replication factor 2,
//! placement and election in a real etcd), a real `tessera-collector`
//! sending to both, and an ingester stand-in that records every tile copy
//! and who flushed it.
//!
//! - **Leader killed** (SIGKILL) mid-tile while traffic flows: the follower
//!   takes over from the leader's flush marks; per policy, every tile's
//!   copies agree and the tiles add up to exactly what was sent (none
//!   missing, none counted twice once the ingester skips second copies).
//! - **Leader paused** (SIGSTOP) past its lease: the follower takes over;
//!   after SIGCONT the old leader flushes nothing (its lease deadline has
//!   passed before it runs a single flush) and totals stay exact.
//! - **Restart then kill**: a follower restarted mid-tile never flushes a
//!   tile it saw only in part (the leader flushed it whole); when the leader
//!   is killed after that, it takes over from the next tile, exactly.
//! - **Restarted just before a tile ends, election held back** (a failpoint delays
//!   the restarted replica's lease registration by 6 s): it flushes no partial copy of
//!   the tile it saw in part; the survivor takes over and flushes it whole.
//! - **etcd away** (frozen with SIGSTOP for three lease TTLs): the leader
//!   fences itself off within the TTL, the follower cannot campaign, both
//!   hold their tiles; never two flushing replicas at once, and once etcd is
//!   back every tile is flushed, exactly once per value.

mod support;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use support::{TileReceiver, wait_until};
use tessera_core::clock::now_ms;
use tessera_core::parse::MetricKind;
use tessera_proto::aggregate::Value;
use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_topology::testing::EtcdServer;
use tessera_topology::{Placement, PlacementStore};

const POLICIES: [&str; 2] = ["1s:1h", "5s:1h"];
const SERIES: usize = 10;
const TTL_SECS: u64 = 2;

fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

struct Replica {
    id: &'static str,
    daemon: Option<Daemon>,
}

impl Replica {
    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("running")
    }

    fn is_leader(&self) -> bool {
        self.daemon.as_ref().is_some_and(|daemon| daemon.metric("tessera_aggregator_leader", "") == 1.0)
    }
}

fn etcd_section(etcd: &EtcdServer, env: &str) -> String {
    format!(
        "[placement]\nkind = \"etcd\"\nendpoints = [\"{}\"]\nenv = \"{env}\"\n\
         connect_timeout_ms = 500\nrequest_timeout_ms = 1000\n",
        etcd.endpoint()
    )
}

fn start_replica(id: &'static str, port: u16, placement: &str, receiver: SocketAddr) -> Daemon {
    start_replica_with(id, port, placement, receiver, &POLICIES)
}

fn start_replica_with(id: &'static str, port: u16, placement: &str, receiver: SocketAddr, policies: &[&str]) -> Daemon {
    start_replica_env(id, port, placement, receiver, policies, &[], TTL_SECS)
}

fn start_replica_env(
    id: &'static str,
    port: u16,
    placement: &str,
    receiver: SocketAddr,
    policies: &[&str],
    env: &[(&str, &str)],
    ttl_secs: u64,
) -> Daemon {
    let telemetry = free_port();
    let policies = policies.iter().map(|policy| format!("\"{policy}\"")).collect::<Vec<_>>().join(", ");
    Daemon::start_with_env(
        id,
        "tessera-aggregator",
        &format!(
            "instance_id = \"{id}\"\nlisten = \"127.0.0.1:{port}\"\npolicies = [{policies}]\n\
             buffer_past_ms = 500\nmax_buffer_past_ms = 3000\nbuffer_future_ms = 1000\nliveness_ttl_secs = {ttl_secs}\n\
             {placement}\
             [ingester]\nendpoints = [\"{receiver}\"]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n\
             [telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n"
        ),
        loopback(telemetry),
        env,
    )
}

fn start_collector(placement: &str) -> (Daemon, SocketAddr) {
    let (statsd, telemetry) = (free_port(), free_port());
    let collector = Daemon::start(
        "host-a",
        "tessera-collector",
        &format!(
            "instance_id = \"host-a\"\n[udp]\nlisten = \"127.0.0.1:{statsd}\"\nreader_threads = 2\n\
             {placement}\
             [forward]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n\
             [telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n"
        ),
        loopback(telemetry),
    );
    (collector, loopback(statsd))
}

/// Two replicas of one shard set, a collector, and the ingester stand-in.
struct Stack {
    receiver: TileReceiver,
    replicas: [Replica; 2],
    ports: [u16; 2],
    section: String,
    _collector: Daemon,
    statsd: SocketAddr,
    /// The socket the tests send statsd from.
    socket: UdpSocket,
    etcd: EtcdServer,
    /// The replicas' `liveness_ttl_secs`.
    ttl_secs: u64,
}

async fn start_stack(env: &str) -> Stack {
    start_stack_with_ttl(env, TTL_SECS).await
}

async fn start_stack_with_ttl(env: &str, ttl_secs: u64) -> Stack {
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let store = PlacementStore::connect(etcd.config(env)).await.unwrap();
    let ports = [free_port(), free_port()];
    let endpoints = ports.map(|port| loopback(port).to_string());
    let placement =
        Placement::init(&[("agg-1", endpoints[0].as_str()), ("agg-2", endpoints[1].as_str())], 8, 2, now_ms()).unwrap();
    assert_eq!(placement.shard_sets().len(), 1, "one shard set of two replicas");
    store.compare_and_swap(None, &placement).await.unwrap();
    let receiver = TileReceiver::start().await;
    let section = etcd_section(&etcd, env);
    let replicas = [("agg-1", ports[0]), ("agg-2", ports[1])].map(|(id, port)| {
        let daemon = start_replica_env(id, port, &section, receiver.address, &POLICIES, &[], ttl_secs);
        Replica { id, daemon: Some(daemon) }
    });
    let (collector, statsd) = start_collector(&section);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let stack = Stack { receiver, replicas, ports, section, _collector: collector, statsd, socket, etcd, ttl_secs };
    wait_until("one leader", Duration::from_secs(15), || stack.replicas.iter().filter(|r| r.is_leader()).count() == 1)
        .await;
    stack
}

impl Stack {
    /// Sends one increment of each counter every 20 ms for `duration`;
    /// returns the increments sent per counter.
    async fn send_for(&self, duration: Duration) -> u64 {
        let datagram: String = (0..SERIES).map(|series| format!("ha.hits:1|c|#series:s{series}\n")).collect();
        support::send_every_20ms(&self.socket, self.statsd, &datagram, duration).await
    }

    /// Sends to the collector until the clock reaches `until_ms`; returns the increments sent per counter.
    async fn send_until(&self, until_ms: i64) -> u64 {
        let remaining = until_ms.saturating_sub(now_ms()).max(0) as u64;
        self.send_for(Duration::from_millis(remaining)).await
    }

    fn leader(&self) -> usize {
        self.replicas.iter().position(Replica::is_leader).expect("a leader")
    }

    /// The indexes of the leader and of the other replica.
    fn leader_and_follower(&self) -> (usize, usize) {
        let leader = self.leader();
        (leader, 1 - leader)
    }

    /// Stops replica `index` with SIGTERM and starts it again (same id and port).
    fn restart(&mut self, index: usize) {
        let replica = &mut self.replicas[index];
        replica.daemon.as_mut().expect("running").terminate();
        replica.daemon = None;
        replica.daemon = Some(start_replica(replica.id, self.ports[index], &self.section, self.receiver.address));
    }

    /// Kills replica `index` (SIGKILL: its lease stays until the TTL) and starts it again
    /// (same id and port).
    fn kill_and_restart(&mut self, index: usize) {
        let replica = &mut self.replicas[index];
        replica.daemon.as_mut().expect("running").kill();
        replica.daemon = None;
        let daemon = start_replica_env(
            replica.id,
            self.ports[index],
            &self.section,
            self.receiver.address,
            &POLICIES,
            &[],
            self.ttl_secs,
        );
        replica.daemon = Some(daemon);
    }

    /// Every tile copy flushed, with its policy and tile end, in flush order.
    fn copies_in_flush_order(&self) -> Vec<(String, i64, support::Flushed)> {
        let mut copies: Vec<_> = self
            .receiver
            .values()
            .into_iter()
            .flat_map(|((policy, tile_end, ..), copies)| {
                copies.into_iter().map(move |copy| (policy.clone(), tile_end, copy))
            })
            .collect();
        copies.sort_by_key(|(.., copy)| copy.flushed_at_ms);
        copies
    }

    /// [`Stack::copies_in_flush_order`] without the completions: a replica's incomplete
    /// copy of a tile sent after another replica's (the leader's incomplete copy).
    fn leader_copies_in_flush_order(&self) -> Vec<(String, i64, support::Flushed)> {
        let copies = self.copies_in_flush_order();
        let mut first_source: HashMap<(String, i64), String> = HashMap::new();
        copies
            .into_iter()
            .filter(|(policy, tile_end, copy)| {
                let first = first_source.entry((policy.clone(), *tile_end)).or_insert_with(|| copy.source.clone());
                !(copy.incomplete && *first != copy.source)
            })
            .collect()
    }
}

/// Sleeps until the middle of a second (mid-tile for every policy).
async fn sleep_until_mid_tile() {
    sleep_until_mid(1_000).await;
}

/// Sleeps until the middle of the next (or current) tile of `resolution_ms`.
async fn sleep_until_mid(resolution_ms: i64) {
    let half = resolution_ms / 2;
    let wait = (resolution_ms + half - now_ms().rem_euclid(resolution_ms)) % resolution_ms;
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
}

fn resolution_ms(policy: &str) -> i64 {
    let seconds = policy.split_once("s:").and_then(|(seconds, _)| seconds.parse::<i64>().ok());
    seconds.expect("a policy of whole seconds") * 1_000
}

/// Per (policy, series): the total over distinct tiles, each tile read as the ingester
/// reads its copies (a whole copy replaces incomplete ones, the larger of two incomplete
/// copies replaces the other), after checking that every whole copy of a tile carries
/// the same value.
fn totals(receiver: &TileReceiver) -> HashMap<(String, Vec<u8>), f64> {
    let mut totals = HashMap::new();
    for ((policy, tile_end, kind, series), copies) in receiver.values() {
        assert_eq!(kind, MetricKind::Counter);
        let value = |copy: &support::Flushed| match copy.value {
            Value::Counter(sum) => sum,
            ref other => panic!("{other:?}"),
        };
        let whole: Vec<f64> = copies.iter().filter(|copy| !copy.incomplete).map(value).collect();
        let tile = match whole.first() {
            Some(&first) => {
                assert!(
                    whole.iter().all(|&copy| copy == first),
                    "whole copies of the {policy} tile ending {tile_end} disagree: {copies:?}"
                );
                first
            }
            None => copies.iter().map(value).fold(f64::MIN, f64::max),
        };
        *totals.entry((policy, series)).or_insert(0.0) += tile;
    }
    totals
}

async fn assert_exact(receiver: &TileReceiver, sent: u64) {
    assert_exact_in(receiver, sent, &POLICIES).await;
}

/// Every series' total over the distinct tiles of each of `policies` is `sent`.
async fn assert_exact_in(receiver: &TileReceiver, sent: u64, policies: &[&str]) {
    let expected = sent as f64;
    let complete = || {
        let totals = totals(receiver);
        (0..SERIES).all(|series| {
            let id = format!("ha.hits|#series:s{series}").into_bytes();
            policies.iter().all(|policy| totals.get(&((*policy).to_owned(), id.clone())) >= Some(&expected))
        })
    };
    wait_until("every increment in the tiles of both policies", Duration::from_secs(30), complete).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let totals = totals(receiver);
    for series in 0..SERIES {
        let id = format!("ha.hits|#series:s{series}").into_bytes();
        for policy in policies {
            assert_eq!(totals.get(&((*policy).to_owned(), id.clone())), Some(&expected), "{policy} s{series}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_every_tile_stays_exact() {
    let mut stack = start_stack("ha-kill").await;
    let (leader, follower) = stack.leader_and_follower();
    let mut sent = stack.send_for(Duration::from_millis(3_000)).await;
    sleep_until_mid_tile().await;
    stack.replicas[leader].daemon.as_mut().unwrap().kill();
    let killed_at = Instant::now();
    sent += stack.send_for(Duration::from_millis(2_000)).await;
    wait_until("the follower to take over", Duration::from_secs(15), || stack.replicas[follower].is_leader()).await;
    let failover = killed_at.elapsed();
    sent += stack.send_for(Duration::from_millis(2_000)).await;
    assert_exact(&stack.receiver, sent).await;

    let new_leader = stack.replicas[follower].daemon();
    assert!(new_leader.metric("tessera_aggregator_elections_total", "result=\"won\"") >= 1.0);
    assert!(new_leader.metric("tessera_aggregator_takeover_duration_seconds_count", "") >= 1.0);
    assert!(new_leader.metric("tessera_aggregator_flush_marks_recorded_total", "") >= 1.0);
    assert!(
        failover < Duration::from_secs(TTL_SECS + 5),
        "takeover within the lease TTL and a few ticks: {failover:?}"
    );
    // `tessera placement show` names the new leader.
    let shown = std::process::Command::new(tessera_testkit::daemons::binary("tessera"))
        .args(["placement", "show", "--etcd", &stack.etcd.endpoint(), "--environment", "ha-kill"])
        .output()
        .expect("run tessera placement show");
    let shown = String::from_utf8_lossy(&shown.stdout);
    let leader_line = format!("1    {}", stack.replicas[follower].id);
    assert!(shown.contains("SET  LEADER") && shown.contains(&leader_line), "{shown}");
    let discarded = new_leader.metric("tessera_aggregator_tiles_discarded_total", "reason=\"flushed_by_leader\"");
    assert!(discarded > 0.0, "as follower it let go of the tiles the leader flushed");
    let marks = new_leader.metric("tessera_aggregator_flush_marks_recorded_total", "");
    let led_for = killed_at.elapsed().saturating_sub(failover);
    eprintln!(
        "{} killed; {} leads after {failover:?}; it recorded flush marks {marks} times in {led_for:?}",
        stack.replicas[leader].id, stack.replicas[follower].id
    );
}

/// Issue 50's schedule: the leader is SIGKILLed mid-tile and restarted at once, with a
/// lease TTL far longer than the test. The restarted process revokes its dead
/// incarnation's lease as it registers, so the follower takes over on its next ticks,
/// not after the TTL, and flushes the tile the dead leader held: every tile exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_and_restarted_hands_over_without_waiting_out_its_lease() {
    const LONG_TTL_SECS: u64 = 60;
    let mut stack = start_stack_with_ttl("ha-restart-kill", LONG_TTL_SECS).await;
    let (leader, follower) = stack.leader_and_follower();
    let mut sent = stack.send_for(Duration::from_millis(2_000)).await;
    sleep_until_mid_tile().await;
    let killed_at = Instant::now();
    stack.kill_and_restart(leader);
    sent += stack.send_for(Duration::from_millis(1_000)).await;
    // Without the revocation the dead incarnation's key would hold for 60 s.
    wait_until("the follower to take over", Duration::from_secs(LONG_TTL_SECS / 2), || {
        stack.replicas[follower].is_leader()
    })
    .await;
    let takeover = killed_at.elapsed();
    sent += stack.send_for(Duration::from_millis(3_000)).await;
    assert_exact(&stack.receiver, sent).await;
    let new_leader = stack.replicas[follower].daemon();
    assert!(new_leader.metric("tessera_aggregator_elections_total", "result=\"won\"") >= 1.0);
    assert!(!stack.replicas[leader].is_leader(), "one leader: the restarted replica follows");
    eprintln!("leader killed and restarted; the follower leads after {takeover:?} (lease TTL {LONG_TTL_SECS} s)");
}

/// The race the fault campaign found: a replica restarted just before a tile ends, whose
/// election is slow to register its lease (etcd or the machine busy), must not flush its
/// partial copy of that tile. The failpoint holds the restarted replica's registration
/// back for 6 s, so the losing order happens every time: the old leader's lease still
/// lives when the tile closes, the survivor cannot flush yet, and the restarted replica
/// would (it did, before it held its tiles from its first moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_before_a_tile_ends_with_its_election_held_back_flushes_no_partial_copy() {
    let mut stack = start_stack("ha-slow-election").await;
    let (leader, follower) = stack.leader_and_follower();
    let mut sent = stack.send_for(Duration::from_millis(2_000)).await;
    // 1.5 s before a 5 s tile ends.
    let soonest = now_ms() + 2_000;
    let kill_at = soonest - soonest.rem_euclid(5_000) + 5_000 - 1_500;
    sent += stack.send_until(kill_at).await;
    let replica = &mut stack.replicas[leader];
    replica.daemon.as_mut().unwrap().kill();
    let restarted_at_ms = now_ms();
    replica.daemon = Some(start_replica_env(
        replica.id,
        stack.ports[leader],
        &stack.section,
        stack.receiver.address,
        &POLICIES,
        &[("TESSERA_FAILPOINTS", "aggregator.election.before_register=6000")],
        TTL_SECS,
    ));
    let partial_tile_end = restarted_at_ms - restarted_at_ms.rem_euclid(5_000) + 5_000;
    sent += stack.send_until(partial_tile_end + 3_000).await;
    wait_until("the survivor to take over", Duration::from_secs(15), || stack.replicas[follower].is_leader()).await;
    sent += stack.send_for(Duration::from_millis(2_000)).await;
    assert_exact(&stack.receiver, sent).await;

    let restarted_id = stack.replicas[leader].id;
    let partial: Vec<_> = stack
        .copies_in_flush_order()
        .into_iter()
        .filter(|(policy, tile_end, copy)| {
            // Copies it flushed as the leader before it was killed are whole.
            copy.source == restarted_id
                && copy.flushed_at_ms > restarted_at_ms
                && tile_end - resolution_ms(policy) < restarted_at_ms
        })
        .collect();
    assert!(partial.is_empty(), "the restarted replica flushed tiles it saw only in part: {partial:?}");
    let log = stack.replicas[leader].daemon().log();
    assert!(log.contains("failpoint: waiting"), "the failpoint held the election back:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_flushes_nothing_stale_when_it_wakes() {
    let stack = start_stack("ha-pause").await;
    let (leader, follower) = stack.leader_and_follower();
    let mut sent = stack.send_for(Duration::from_millis(2_000)).await;
    sleep_until_mid_tile().await;
    let paused_at_ms = now_ms();
    stack.replicas[leader].daemon().signal("STOP");
    sent += stack.send_for(Duration::from_millis(1_000)).await;
    // The follower cannot see the leader gone before its lease expires.
    let follower_leads = || {
        let daemon = stack.replicas[follower].daemon();
        daemon.metric("tessera_aggregator_leader", "") == 1.0
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !follower_leads() && Instant::now() < deadline {
        sent += stack.send_for(Duration::from_millis(200)).await;
    }
    assert!(follower_leads(), "the follower took over while the leader was stopped");
    sent += stack.send_for(Duration::from_millis(1_000)).await;
    stack.replicas[leader].daemon().signal("CONT");
    sent += stack.send_for(Duration::from_millis(3_000)).await;
    assert_exact(&stack.receiver, sent).await;

    // As a follower it may complete a tile the new leader flushed incomplete (its copy
    // marked incomplete: the ingesters keep the larger); it flushes nothing as a leader.
    let stale: Vec<_> = stack
        .leader_copies_in_flush_order()
        .into_iter()
        .filter(|(.., copy)| copy.source == stack.replicas[leader].id && copy.flushed_at_ms >= paused_at_ms)
        .collect();
    assert!(stale.is_empty(), "the paused leader flushed after waking: {stale:?}");
    assert!(!stack.replicas[leader].is_leader(), "the old leader follows");
    let old = stack.replicas[leader].daemon();
    assert!(old.metric("tessera_aggregator_tiles_discarded_total", "reason=\"flushed_by_leader\"") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_flushes_no_partial_tile_and_takes_over_from_the_next() {
    let mut stack = start_stack("ha-restart").await;
    let (leader, follower) = stack.leader_and_follower();
    let mut sent = stack.send_for(Duration::from_millis(2_000)).await;
    // Mid 5 s tile: the restarted follower sees only its second half.
    sleep_until_mid(5_000).await;
    stack.restart(follower);
    let restarted_at_ms = now_ms();
    let partial_tile_end = restarted_at_ms - restarted_at_ms.rem_euclid(5_000) + 5_000;
    // Past that tile's end, the watermark and the leader's flush mark.
    sent += stack.send_until(partial_tile_end + 2_500).await;
    assert!(stack.replicas[leader].is_leader(), "the leader kept its place");
    let restarted = stack.replicas[follower].daemon();
    wait_until("the restarted follower to let go of what the leader flushed", Duration::from_secs(10), || {
        restarted.metric("tessera_aggregator_tiles_discarded_total", "reason=\"flushed_by_leader\"") > 0.0
    })
    .await;
    sleep_until_mid_tile().await;
    stack.replicas[leader].daemon.as_mut().unwrap().kill();
    let killed_at_ms = now_ms();
    sent += stack.send_for(Duration::from_millis(2_000)).await;
    wait_until("the restarted follower to take over", Duration::from_secs(15), || stack.replicas[follower].is_leader())
        .await;
    sent += stack.send_for(Duration::from_millis(2_000)).await;
    assert_exact(&stack.receiver, sent).await;

    let restarted_id = stack.replicas[follower].id;
    let began_before_restart = |(policy, tile_end, copy): &&(String, i64, support::Flushed)| {
        copy.source == restarted_id && tile_end - resolution_ms(policy) < restarted_at_ms
    };
    // It may complete a tile the leader flushed incomplete (the stack's first tiles), with
    // its own copy marked incomplete: the ingesters keep the larger. Never as a whole copy.
    let all_copies = stack.copies_in_flush_order();
    let whole: Vec<_> = all_copies.iter().filter(began_before_restart).filter(|(.., copy)| !copy.incomplete).collect();
    assert!(whole.is_empty(), "the restarted follower flushed tiles that began before it started as whole: {whole:?}");
    let copies = stack.leader_copies_in_flush_order();
    let partial: Vec<_> = copies.iter().filter(began_before_restart).collect();
    assert!(partial.is_empty(), "the restarted follower flushed tiles that began before it started: {partial:?}");
    // It took over from the tile after the last one the leader flushed, for every policy.
    for policy in POLICIES {
        let last_by = |source: &str| {
            copies.iter().filter(|(p, _, copy)| p == policy && copy.source == source).map(|(_, end, _)| *end).max()
        };
        let first_by_restarted = copies
            .iter()
            .filter(|(p, _, copy)| p == policy && copy.source == restarted_id)
            .map(|(_, end, _)| *end)
            .min();
        let led_until = last_by(stack.replicas[leader].id).expect("the leader flushed tiles");
        let first = first_by_restarted.expect("the restarted follower flushed tiles after the takeover");
        assert!(first > partial_tile_end && led_until >= partial_tile_end, "{policy}: {led_until} then {first}");
        assert!(first <= led_until + resolution_ms(policy), "{policy}: no gap between {led_until} and {first}");
    }
    eprintln!("restarted at {restarted_at_ms}, leader killed at {killed_at_ms}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_away_one_replica_at_most_flushes_and_no_tile_is_lost() {
    let stack = start_stack("ha-etcd").await;
    let leader = stack.leader();
    let mut sent = stack.send_for(Duration::from_millis(2_000)).await;
    sleep_until_mid_tile().await;
    let etcd_pid = stack.etcd.pid().expect("etcd runs").to_string();
    let signal_etcd = |signal: &str| {
        let status = std::process::Command::new("kill").args([signal, &etcd_pid]).status().unwrap();
        assert!(status.success(), "kill {signal} etcd");
    };
    signal_etcd("-STOP");
    let frozen_at = Instant::now();
    let frozen_at_ms = now_ms();
    // Three lease TTLs without etcd: never two replicas flushing.
    let mut both_leading = 0;
    while frozen_at.elapsed() < Duration::from_secs(3 * TTL_SECS) {
        sent += stack.send_for(Duration::from_millis(100)).await;
        both_leading += u32::from(stack.replicas.iter().all(Replica::is_leader));
    }
    let old_leader = stack.replicas[leader].daemon();
    assert_eq!(old_leader.metric("tessera_aggregator_fenced_total", ""), 1.0, "the leader fenced itself off");
    assert!(stack.replicas.iter().all(|replica| !replica.is_leader()), "nobody flushes while etcd is away");
    let thawed_at_ms = now_ms();
    signal_etcd("-CONT");
    let frozen_for = frozen_at.elapsed();
    let thawed_at = Instant::now();
    wait_until("a leader once etcd is back", Duration::from_secs(15), || stack.replicas.iter().any(Replica::is_leader))
        .await;
    let leaderless_after_thaw = thawed_at.elapsed();
    sent += stack.send_for(Duration::from_millis(3_000)).await;
    assert_exact(&stack.receiver, sent).await;
    assert_eq!(both_leading, 0, "two replicas showed themselves leader at once");

    // In flush order, the flushing replica changes at most once (the old
    // leader, then whoever won after etcd came back), and nothing was
    // flushed from one TTL after etcd froze (the leader fenced itself off
    // before that) until it was back.
    let copies = stack.leader_copies_in_flush_order();
    let mut sources: Vec<&str> = copies.iter().map(|(.., copy)| copy.source.as_str()).collect();
    sources.dedup();
    assert!(sources.len() <= 2, "flushing replicas in turn: {sources:?}");
    let fenced = frozen_at_ms + TTL_SECS as i64 * 1_000..thawed_at_ms;
    let during: Vec<_> = copies.iter().filter(|(.., copy)| fenced.contains(&copy.flushed_at_ms)).collect();
    assert!(during.is_empty(), "flushed while etcd was away: {during:?}");
    let leaders: Vec<_> =
        stack.replicas.iter().filter(|replica| replica.is_leader()).map(|replica| replica.id).collect();
    eprintln!(
        "etcd frozen for {frozen_for:?}; a leader {leaderless_after_thaw:?} after it was back; \
         flushing replicas in turn: {sources:?}; leader now {leaders:?}"
    );
}

/// Both replicas alive, no leader, and data in a tile that began before either started
/// (replicas started together, mid-tile): neither saw that tile whole, so neither is
/// "complete". Once etcd has said "no leader" for the grace (the longest tile plus
/// max_buffer_past), one leads anyway, flushes that tile (counted incomplete) and every
/// tile after it, exactly. Before, both held it, and everything after it, for as long
/// as both lived. The test holds the leader key itself while the replicas start, so that
/// neither can win a race to campaign before the other is alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_saw_no_tile_whole_elect_a_leader_after_the_grace() {
    const FIRST_TILE_POLICIES: [&str; 2] = ["1s:1h", "10s:1h"];
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let store = PlacementStore::connect(etcd.config("ha-together")).await.unwrap();
    let ports = [free_port(), free_port()];
    let endpoints = ports.map(|port| loopback(port).to_string());
    let placement =
        Placement::init(&[("agg-1", endpoints[0].as_str()), ("agg-2", endpoints[1].as_str())], 8, 2, now_ms()).unwrap();
    store.compare_and_swap(None, &placement).await.unwrap();
    let shard_set = *placement.shard_sets().keys().next().expect("one shard set");
    let holder = store.register_instance("key-holder", Duration::from_secs(30)).await.unwrap();
    let campaign = store.election(shard_set, "key-holder").campaign(holder.lease_id()).await.unwrap();
    assert_eq!(campaign, tessera_topology::Leader::Us, "the test holds the leader key");
    let receiver = TileReceiver::start().await;
    let section = etcd_section(&etcd, "ha-together");
    // Just after a 10 s tile began: the replicas, the collector and the first datagrams all
    // fit in that tile, which began before the replicas did.
    sleep_until_mid(20_000).await;
    let started_ms = now_ms();
    let first_tile_end = started_ms - started_ms.rem_euclid(10_000) + 10_000;
    let replicas = [("agg-1", ports[0]), ("agg-2", ports[1])].map(|(id, port)| Replica {
        id,
        daemon: Some(start_replica_with(id, port, &section, receiver.address, &FIRST_TILE_POLICIES)),
    });
    let (_collector, statsd) = start_collector(&section);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let datagram: String = (0..SERIES).map(|series| format!("ha.hits:1|c|#series:s{series}\n")).collect();
    let mut sent = support::send_every_20ms(&socket, statsd, &datagram, Duration::from_millis(1_000)).await;
    assert!(now_ms() < first_tile_end, "the first datagrams went out before the replicas' first 10 s tile ended");
    wait_until("both replicas to hold the first 10 s tile, following the key holder", Duration::from_secs(30), || {
        replicas.iter().all(|replica| replica.daemon().metric("tessera_aggregator_held_tiles", "") >= 1.0)
    })
    .await;
    holder.revoke().await.unwrap();
    wait_until("one leader, after the grace", Duration::from_secs(40), || {
        replicas.iter().filter(|replica| replica.is_leader()).count() == 1
    })
    .await;
    sent += support::send_every_20ms(&socket, statsd, &datagram, Duration::from_millis(1_000)).await;
    assert_exact_in(&receiver, sent, &FIRST_TILE_POLICIES).await;
    let leader = replicas.iter().find(|replica| replica.is_leader()).expect("a leader");
    assert!(
        leader.daemon().metric("tessera_aggregator_incomplete_tiles_total", "") >= 1.0,
        "the first 10 s tile began before the leader started"
    );
}
