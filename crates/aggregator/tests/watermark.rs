//! Tiles close on the collectors' watermarks: real `tessera-collector` and
//! `tessera-aggregator` processes, frozen with SIGSTOP, in front of an
//! ingester stand-in that records when each tile was flushed.
//!
//! - A stopped collector keeps its connection open and its watermark stuck:
//!   it holds tiles back until it has been silent for `max_buffer_past`, no
//!   longer, and the other collector's data still arrives whole.
//! - An aggregator stopped for longer than `buffer_past` (but less than
//!   `max_buffer_past`) loses nothing: the partials that queued up in front
//!   of it carry watermarks that hold their tiles open. The same run with
//!   `max_buffer_past = buffer_past` (a fixed close, as before watermarks)
//!   refuses some of them as `too_late`, which shows the run is a real test.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use support::{TileReceiver, send_every_20ms, wait_until};
use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;

const POLICY: &str = "1s:1h";
const BUFFER_PAST_MS: i64 = 500;

fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

/// A static placement: one aggregator owning every shard.
fn write_placement(dir: &Path, aggregator: SocketAddr) -> String {
    let path = dir.join("placement.toml");
    std::fs::write(&path, format!("num_shards = 8\n[[instances]]\nid = \"agg-1\"\nendpoint = \"{aggregator}\"\n"))
        .unwrap();
    path.display().to_string()
}

/// An ingester stand-in, an aggregator process owning every shard, and the
/// placement file collectors route with.
struct Stack {
    receiver: TileReceiver,
    aggregator: Daemon,
    placement: String,
    _dir: tempfile::TempDir,
}

async fn start_stack(max_buffer_past_ms: i64) -> Stack {
    let receiver = TileReceiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let placement = write_placement(dir.path(), loopback(port));
    let aggregator = start_aggregator(&placement, port, receiver.address, max_buffer_past_ms);
    Stack { receiver, aggregator, placement, _dir: dir }
}

fn start_aggregator(placement: &str, port: u16, receiver: SocketAddr, max_buffer_past_ms: i64) -> Daemon {
    let telemetry = free_port();
    Daemon::start(
        "aggregator",
        "tessera-aggregator",
        &format!(
            "instance_id = \"agg-1\"\nlisten = \"127.0.0.1:{port}\"\npolicies = [\"{POLICY}\"]\n\
             buffer_past_ms = {BUFFER_PAST_MS}\nmax_buffer_past_ms = {max_buffer_past_ms}\nbuffer_future_ms = 1000\n\
             [placement]\nkind = \"static\"\npath = {placement:?}\n\
             [ingester]\nendpoints = [\"{receiver}\"]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n\
             [telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n"
        ),
        loopback(telemetry),
    )
}

/// A collector (two random-distribution readers) and its statsd address.
fn start_collector(name: &str, placement: &str) -> (Daemon, SocketAddr) {
    let (statsd, telemetry) = (free_port(), free_port());
    let collector = Daemon::start(
        name,
        "tessera-collector",
        &format!(
            "instance_id = \"{name}\"\n[udp]\nlisten = \"127.0.0.1:{statsd}\"\nreader_threads = 2\n\
             [placement]\nkind = \"static\"\npath = {placement:?}\n\
             [forward]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n\
             [telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n"
        ),
        loopback(telemetry),
    );
    (collector, loopback(statsd))
}

/// Every flushed tile of counter `id`: (tile end, value, flushed at).
fn tiles_of(receiver: &TileReceiver, id: &str) -> Vec<(i64, f64, i64)> {
    let mut tiles: Vec<(i64, f64, i64)> = receiver
        .counter_tiles(POLICY, id)
        .into_iter()
        .map(|(end, flushed)| (end, flushed[0].counter_sum(), flushed[0].flushed_at_ms))
        .collect();
    tiles.sort_by_key(|tile| tile.0);
    tiles
}

fn total_of(receiver: &TileReceiver, id: &str) -> f64 {
    tiles_of(receiver, id).iter().map(|tile| tile.1).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_collector_holds_a_tile_for_max_buffer_past_at_most() {
    const MAX_BUFFER_PAST_MS: i64 = 3_000;
    let Stack { receiver, aggregator, placement, _dir } = start_stack(MAX_BUFFER_PAST_MS).await;
    let (host_a, statsd_a) = start_collector("host-a", &placement);
    let (host_b, statsd_b) = start_collector("host-b", &placement);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();

    // Both current: tiles close as soon as both watermarks pass their end.
    let mut sent_a = send_every_20ms(&socket, statsd_a, "wm.a:1|c", Duration::from_millis(500)).await;
    let sent_b = send_every_20ms(&socket, statsd_b, "wm.b:1|c", Duration::from_millis(500)).await;
    let closes =
        |trigger: &str| aggregator.metric("tessera_aggregator_tile_closes_total", &format!("trigger=\"{trigger}\""));
    wait_until("host-b's lines in the tiles", Duration::from_secs(15), || total_of(&receiver, "wm.b") >= sent_b as f64)
        .await;
    assert!(closes("watermark") > 0.0, "tiles close on the watermarks while both collectors are current");
    let lag =
        |source: &str| aggregator.metric("tessera_aggregator_watermark_lag_seconds", &format!("source=\"{source}\""));
    wait_until("each collector's watermark lag exported", Duration::from_secs(5), || lag("host-b") > 0.0).await;

    // host-b freezes with its connection open; host-a goes on.
    host_b.signal("STOP");
    let stopped_ms = tessera_core::clock::now_ms();
    sent_a += send_every_20ms(&socket, statsd_a, "wm.a:1|c", Duration::from_secs(8)).await;
    let before_resume_ms = tessera_core::clock::now_ms();
    assert!(lag("host-b") * 1000.0 >= MAX_BUFFER_PAST_MS as f64, "host-b's lag: {} s", lag("host-b"));

    // Every tile of host-a that ended at least max_buffer_past (and a
    // second for the flush) before the resume was flushed while host-b was
    // still stopped, no later than max_buffer_past after its end (plus a
    // 1.5 s allowance for the admission thread's 100 ms tick and a loaded
    // machine; a tile held until host-b resumed would be 5 s late).
    let held: Vec<(i64, f64, i64)> = tiles_of(&receiver, "wm.a")
        .into_iter()
        .filter(|(end, _, _)| *end > stopped_ms + 1_000 && *end + MAX_BUFFER_PAST_MS + 1_000 <= before_resume_ms)
        .collect();
    assert!(held.len() >= 2, "tiles flushed while host-b was stopped: {held:?}");
    // The tile that ended first after the stop really waited for host-b: until
    // host-b had been silent for max_buffer_past (its last batch came at most
    // a window before the stop), not the ~0.2 s a current collector costs.
    let first =
        tiles_of(&receiver, "wm.a").into_iter().find(|(end, _, _)| *end > stopped_ms).expect("a tile after the stop");
    assert!(first.2 - first.0 >= 1_000, "the first tile after the stop was held only {} ms", first.2 - first.0);
    for (end, _, flushed_at) in &held {
        assert!(*flushed_at < before_resume_ms, "tile ending at {end} flushed at {flushed_at}, after the resume");
        assert!(
            flushed_at - end <= MAX_BUFFER_PAST_MS + 1_500,
            "tile ending at {end} was held {} ms (max_buffer_past {MAX_BUFFER_PAST_MS} ms)",
            flushed_at - end
        );
    }

    // host-a lost nothing to host-b's stop.
    host_b.signal("CONT");
    wait_until("every line of host-a in the tiles", Duration::from_secs(20), || {
        total_of(&receiver, "wm.a") >= sent_a as f64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(MAX_BUFFER_PAST_MS as u64)).await;
    assert_eq!(total_of(&receiver, "wm.a"), sent_a as f64);
    assert_eq!(aggregator.metric("tessera_aggregator_partials_rejected_total", "too_late"), 0.0);
    drop((host_a, host_b));
}

/// Sends steadily through one collector while the aggregator is stopped for
/// 3 s (longer than `buffer_past`); returns the lines sent, the stack and
/// the collector.
async fn stop_the_aggregator_mid_stream(max_buffer_past_ms: i64) -> (u64, Stack, Daemon) {
    let stack = start_stack(max_buffer_past_ms).await;
    let (collector, statsd) = start_collector("host-a", &stack.placement);
    let aggregator = &stack.aggregator;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();

    let mut sent = send_every_20ms(&socket, statsd, "slow.agg:1|c", Duration::from_secs(2)).await;
    aggregator.signal("STOP");
    sent += send_every_20ms(&socket, statsd, "slow.agg:1|c", Duration::from_secs(3)).await;
    aggregator.signal("CONT");
    sent += send_every_20ms(&socket, statsd, "slow.agg:1|c", Duration::from_secs(2)).await;
    (sent, stack, collector)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregator_stopped_for_less_than_max_buffer_past_loses_nothing() {
    let (sent, Stack { receiver, aggregator, .. }, _collector) = stop_the_aggregator_mid_stream(8_000).await;
    wait_until("every line in the tiles", Duration::from_secs(30), || total_of(&receiver, "slow.agg") >= sent as f64)
        .await;
    assert_eq!(total_of(&receiver, "slow.agg"), sent as f64);
    assert_eq!(aggregator.metric("tessera_aggregator_partials_rejected_total", "too_late"), 0.0);
    assert!(aggregator.metric("tessera_aggregator_tile_closes_total", "trigger=\"watermark\"") > 0.0);

    // The control: closing BUFFER_PAST_MS after each tile's end, whatever
    // the watermarks say, the backlog that waited for the stopped
    // aggregator is refused.
    let (sent, Stack { receiver, aggregator, .. }, _collector) = stop_the_aggregator_mid_stream(BUFFER_PAST_MS).await;
    let too_late = || aggregator.metric("tessera_aggregator_partials_rejected_total", "too_late");
    wait_until("the backlog to be refused as too late", Duration::from_secs(30), || too_late() > 0.0).await;
    assert!(total_of(&receiver, "slow.agg") < sent as f64);
}
