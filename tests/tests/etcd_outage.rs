//! An etcd outage is not a death. etcd frozen (SIGSTOP) for three lease TTLs expires
//! every lease when it is back, the live ingesters' included; each grants its own again
//! within a keep-alive. No live ingester may be failed over for that: its shards would
//! move while it still writes them, and tiles a new aggregator leader flushes again
//! would count twice at the new owner (what the fault campaign found).
//!
//! A failpoint holds ing-2's new lease back for 1.5 s after it sees its lease gone, so
//! that ing-1 looks while ing-2's key is missing: before the fix, ing-1 failed it over at
//! that look. The hold is a TTL plus the longest retry backoff (3 s here): 5 s, which
//! covers a peer's retry and the failpoint as long as the failpoint is under a TTL.

use std::process::Command;
use std::time::Duration;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_tests::{init_ingester_placement, loopback, tier_ingester_config, wait_until};
use tessera_topology::testing::EtcdServer;

const TTL_SECS: u64 = 2;
const ENV: &str = "etcd-outage";

#[test]
fn an_etcd_outage_longer_than_the_lease_fails_no_live_ingester_over() {
    let etcd = EtcdServer::start().expect("etcd starts");
    let data = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    init_ingester_placement(&etcd.endpoint(), ENV, 16, &[("ing-1", ports[0]), ("ing-2", ports[1])]);
    let start = |id: &str, port: u16, env: &[(&str, &str)]| {
        let telemetry = free_port();
        let etcd_settings = "retry_max_backoff_ms = 3000\n";
        let config =
            tier_ingester_config(id, port, (&etcd.endpoint(), ENV, TTL_SECS), data.path(), telemetry, etcd_settings);
        Daemon::start_with_env(id, "tessera-ingester", &config, loopback(telemetry), env)
    };
    let ingesters = [
        start("ing-1", ports[0], &[]),
        start("ing-2", ports[1], &[("TESSERA_FAILPOINTS", "liveness.before_regrant=1500")]),
    ];
    let owned = |ingester: &Daemon| ingester.metric("tessera_ingester_owned_shards", "");
    wait_until("both ingesters own their shards", Duration::from_secs(20), || {
        ingesters.iter().all(|ingester| owned(ingester) == 8.0)
    });

    let pid = etcd.pid().expect("etcd runs");
    let signal = |name: &str| {
        assert!(Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().unwrap().success());
    };
    signal("STOP");
    std::thread::sleep(Duration::from_secs(3 * TTL_SECS));
    signal("CONT");
    wait_until("ing-2 granted its lease again, after the failpoint", Duration::from_secs(20), || {
        ingesters[1].log().contains("liveness lease granted again")
    });
    assert!(ingesters[1].log().contains("failpoint: waiting"), "{}", ingesters[1].log());
    // A TTL plus the longest retry backoff and two ticks: a failover would have happened
    // by then.
    std::thread::sleep(Duration::from_secs(TTL_SECS + 5));

    for ingester in &ingesters {
        let failovers = ingester.metric("tessera_ingester_placement_changes_total", "change=\"fail_over\"");
        assert_eq!(failovers, 0.0, "{} failed a live ingester over:\n{}", ingester.name, ingester.log());
        assert_eq!(owned(ingester), 8.0, "{} lost or gained shards:\n{}", ingester.name, ingester.log());
    }
    assert!(
        ingesters[0].log().contains("holding failovers while live ingesters re-register"),
        "{}",
        ingesters[0].log()
    );
    assert!(ingesters[0].metric("tessera_ingester_failover_holds_total", "") >= 1.0, "the hold is counted");
}
