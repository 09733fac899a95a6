//! Silent, slow and flooding clients on the wire ports of the real binaries,
//! while statsd flows collector → aggregator → ingester → a real Prometheus:
//!
//! - 1 000 clients complete the handshake with the aggregator and 1 000 with
//!   the ingester, then say nothing; a client on each port sends one byte a
//!   second and never finishes a frame; a flood of bare connections hits
//!   both ports;
//! - the ingester's cap (256) refuses what is over it and counts it, the
//!   aggregator's (here 600) too; every silent or slow connection that got
//!   in is closed at the idle deadline and counted;
//! - the real flow is not held up: its connections stay open (the
//!   aggregator heartbeats its idle ingester connection) and every counter
//!   arrives exactly.

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use tessera_proto::Role;
use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    ONE_SECOND_SINK, collector_config, loopback, start_daemon, start_ingester, start_lone_aggregator, wait_for_scalar,
};
use tessera_wire::WireStream;
use tokio::io::AsyncWriteExt;

const SILENT: usize = 1_000;
const FLOOD: usize = 500;
const IDLE_MS: u64 = 3_000;

/// `SILENT` handshaken connections to `address`, held open and silent;
/// those the server refused are left out.
async fn silent_clients(address: SocketAddr, role: Role) -> Vec<WireStream> {
    let endpoint = address.to_string();
    let mut connecting = tokio::task::JoinSet::new();
    for index in 0..SILENT {
        let endpoint = endpoint.clone();
        connecting.spawn(async move {
            tessera_wire::connect(&endpoint, role, &format!("silent-{index}"), 0, Duration::from_secs(5), None)
                .await
                .ok()
        });
    }
    connecting.join_all().await.into_iter().flatten().collect()
}

/// Handshakes, then sends a frame one byte a second (never finishing it);
/// returns how long the server kept the connection. It connects beside the silent
/// clients and the flood, so the server may be at its cap and refuse it at once (by
/// design): it tries again for up to 20 s.
async fn byte_a_second(address: SocketAddr, role: Role) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        match tessera_wire::connect(&address.to_string(), role, "slow", 0, Duration::from_secs(5), None).await {
            Ok(stream) => break stream,
            Err(error) if Instant::now() < deadline => {
                eprintln!("slow client refused ({error:?}); trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("the slow client never got in: {error:?}"),
        }
    };
    let started = Instant::now();
    let frame = 1_000u32.to_be_bytes().into_iter().chain(std::iter::repeat(0u8));
    for byte in frame.take(60) {
        if stream.write_all(&[byte]).await.is_err() || stream.flush().await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    started.elapsed()
}

/// Opens `FLOOD` bare connections at once and holds them for a second.
async fn flood(address: SocketAddr) {
    let mut opened = Vec::new();
    for _ in 0..FLOOD {
        if let Ok(stream) = tokio::net::TcpStream::connect(address).await {
            opened.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_slow_and_flooding_clients_do_not_hold_up_a_real_flow() {
    // Every connection is a descriptor, in this process and in the daemons it starts.
    let status =
        Command::new("prlimit").args(["--pid", &std::process::id().to_string(), "--nofile=16384:16384"]).status();
    assert!(status.is_ok_and(|status| status.success()), "raising the open-file limit (prlimit, util-linux)");

    let prometheus = Prometheus::start();
    let dir = tempfile::tempdir().unwrap();
    let (aggregator_port, statsd_port) = (free_port(), free_port());
    let idle_timeout = format!("idle_timeout_ms = {IDLE_MS}\n");
    let (ingester, ingester_port) =
        start_ingester(dir.path(), &prometheus, &format!("{ONE_SECOND_SINK}{idle_timeout}"));
    let (aggregator, placement) = start_lone_aggregator(
        dir.path(),
        aggregator_port,
        &format!("policies = [\"1s:1h\"]\nmax_connections = 600\n{idle_timeout}"),
        ingester_port,
        "heartbeat_ms = 500\nreconnect_max_ms = 500\n",
    );
    let collector_text = collector_config("host-1", statsd_port, &placement, "");
    let _collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());

    // Statsd all along, on a thread of its own.
    let sending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sender = {
        let sending = sending.clone();
        std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            let datagram: String = (0..10).map(|series| format!("steady.hits:1|c|#series:s{series}\n")).collect();
            let mut rounds = 0u64;
            while sending.load(std::sync::atomic::Ordering::Relaxed) {
                socket.send_to(datagram.as_bytes(), loopback(statsd_port)).unwrap();
                rounds += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            rounds
        })
    };
    // The flow is established before the crowd arrives.
    let flowing = || aggregator.metric("tessera_aggregator_series_flushed_total", "") > 0.0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !flowing() {
        assert!(Instant::now() < deadline, "no tiles flushed:\n{}", aggregator.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (aggregator_wire, ingester_wire) = (loopback(aggregator_port), loopback(ingester_port));
    let (held_by_aggregator, held_by_ingester, slow_aggregator, slow_ingester, (), ()) = tokio::join!(
        silent_clients(aggregator_wire, Role::Collector),
        silent_clients(ingester_wire, Role::Aggregator),
        byte_a_second(aggregator_wire, Role::Collector),
        byte_a_second(ingester_wire, Role::Aggregator),
        flood(aggregator_wire),
        flood(ingester_wire),
    );
    // Over the caps (600 and 256, one each taken by the real flow), the rest were refused.
    assert!(
        held_by_aggregator.len() < 600 && held_by_ingester.len() < 256,
        "{} {}",
        held_by_aggregator.len(),
        held_by_ingester.len()
    );
    for slow in [slow_aggregator, slow_ingester] {
        let idle = Duration::from_millis(IDLE_MS);
        assert!(slow >= idle - Duration::from_millis(500) && slow < idle * 3, "a byte a second was kept {slow:?}");
    }
    // Every silent connection is closed at the idle deadline; the real ones stay.
    let deadline = Instant::now() + Duration::from_secs(20);
    let settled = || {
        aggregator.metric("tessera_aggregator_connections", "") == 1.0
            && ingester.metric("tessera_ingester_connections", "") == 1.0
    };
    while !settled() {
        assert!(Instant::now() < deadline, "silent connections still open");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop((held_by_aggregator, held_by_ingester));

    sending.store(false, std::sync::atomic::Ordering::Relaxed);
    let rounds = sender.join().unwrap();
    let query = "sum(steady_hits_total)";
    tokio::task::block_in_place(|| {
        wait_for_scalar(&prometheus, query, (rounds * 10) as f64, Duration::from_secs(30));
    });

    let refused_by = |daemon: &Daemon, name: &str| daemon.metric(name, "reason=\"too_many_connections\"");
    let idle_closed = |daemon: &Daemon, name: &str| daemon.metric(name, "reason=\"idle_timeout\"");
    assert!(refused_by(&aggregator, "tessera_aggregator_frame_errors_total") > 0.0);
    assert!(refused_by(&ingester, "tessera_ingester_frame_errors_total") > 0.0);
    assert!(idle_closed(&aggregator, "tessera_aggregator_frame_errors_total") >= 500.0);
    assert!(idle_closed(&ingester, "tessera_ingester_frame_errors_total") >= 200.0);
    // With no statsd, the aggregator has nothing to send: its heartbeats keep the
    // connection to the ingester open past the idle deadline.
    let idle_before = idle_closed(&ingester, "tessera_ingester_frame_errors_total");
    tokio::time::sleep(Duration::from_millis(3 * IDLE_MS)).await;
    assert!(ingester.metric("tessera_ingester_heartbeats_total", "") > 0.0, "heartbeats sent");
    assert_eq!(ingester.metric("tessera_ingester_connections", ""), 1.0, "the aggregator stays connected");
    assert_eq!(idle_closed(&ingester, "tessera_ingester_frame_errors_total"), idle_before);
    eprintln!(
        "aggregator: refused {} connections, closed {} idle; ingester: refused {}, closed {} idle, {} heartbeats; \
         {} increments per series arrived exactly",
        refused_by(&aggregator, "tessera_aggregator_frame_errors_total"),
        idle_closed(&aggregator, "tessera_aggregator_frame_errors_total"),
        refused_by(&ingester, "tessera_ingester_frame_errors_total"),
        idle_closed(&ingester, "tessera_ingester_frame_errors_total"),
        ingester.metric("tessera_ingester_heartbeats_total", ""),
        rounds
    );
}
