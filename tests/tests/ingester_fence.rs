//! The ingesters' fence, through the real binaries and a real etcd: ing-1 reaches etcd
//! through a proxy of its own, which the test stalls (a partition around ing-1 alone) while
//! ing-2 still reaches etcd. A client sends ing-1 a tile batch every 200 ms throughout, as
//! an aggregator would, each under the placement version it last knew.
//!
//! - Before the cut every batch is taken.
//! - After it ing-1 fences itself off before ing-2 can fail it over: the first `fenced`
//!   answer comes before the failover, and no batch is taken after it but one in hand (a
//!   tile from before the fence, under the version it holds: queued); nothing is written
//!   to its store while fenced (its written-samples count stands still), and the batch in
//!   hand is written once the fence lifts.
//! - ing-2 fails it over once its lease expired in etcd.
//! - When the link heals, ing-1 reads the placement again (it is no longer in it, and joins
//!   again): the fence lifts, and a batch routed under the version it was failed over from,
//!   holding a series of a shard it no longer owns, is refused `placement_stale`; one routed
//!   under a version it has not seen is refused `placement_ahead`.
//!
//! Run alone: `cargo nextest run -p tessera-tests --test ingester_fence --no-capture`.

use std::time::{Duration, Instant};

use tessera_chaos::proxy::{Mode, Proxy};
use tessera_proto::{Ack, AckReason, AckStatus, Frame, Role, TileBatch, frame::Body, framing};
use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::tiles::counter;
use tessera_tests::{init_ingester_placement, loopback, tier_ingester_config, wait_until};
use tessera_topology::testing::EtcdServer;

const TTL_SECS: u64 = 3;
const ENV: &str = "fence";

/// A connection to an ingester, as an aggregator's.
struct Sender {
    runtime: tokio::runtime::Runtime,
    stream: tessera_wire::WireStream,
    sequence: u64,
    scratch: Vec<u8>,
}

impl Sender {
    fn connect(endpoint: &str) -> Sender {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let connecting = tessera_wire::connect(endpoint, Role::Aggregator, "agg-test", 7, Duration::from_secs(5), None);
        let stream = runtime.block_on(connecting).expect("the ingester takes a connection");
        Sender { runtime, stream, sequence: 0, scratch: Vec::new() }
    }

    /// Sends one counter of `series` for the tile ending `tile_end_ms`, routed under
    /// `placement_version`; returns the answer.
    fn send(&mut self, series: &[String], tile_end_ms: i64, placement_version: u64) -> Ack {
        self.sequence += 1;
        let batch = TileBatch {
            source: "agg-test".into(),
            sequence: self.sequence,
            placement_version,
            ..tessera_testkit::tiles::batch(tile_end_ms, series.iter().map(|id| counter(id, 1.0)).collect())
        };
        let frame = framing::encode_frame(&Frame { body: Some(Body::Tiles(batch)) }, 1 << 20).unwrap();
        let exchanged =
            tessera_wire::exchange(&mut self.stream, &frame, self.sequence, &mut self.scratch, Duration::from_secs(5));
        self.runtime.block_on(exchanged).expect("the ingester answers")
    }
}

fn is_taken(ack: &Ack) -> bool {
    ack.status == AckStatus::Ok as i32
}

#[test]
fn an_ingester_cut_off_from_etcd_stops_writing_before_it_is_failed_over_and_refuses_what_it_no_longer_owns() {
    let etcd = EtcdServer::start().expect("etcd starts");
    let data = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    init_ingester_placement(&etcd.endpoint(), ENV, 16, &[("ing-1", ports[0]), ("ing-2", ports[1])]);
    let etcd_address = etcd.endpoint().trim_start_matches("http://").parse().unwrap();
    let link = Proxy::start(etcd_address).unwrap();
    let start = |id: &str, port: u16, etcd_endpoint: &str| {
        let telemetry = free_port();
        let config = tier_ingester_config(id, port, (etcd_endpoint, ENV, TTL_SECS), data.path(), telemetry, "");
        Daemon::start(id, "tessera-ingester", &config, loopback(telemetry))
    };
    let ing1 = start("ing-1", ports[0], &format!("http://{}", link.address()));
    let ing2 = start("ing-2", ports[1], &etcd.endpoint());
    let owned = |ingester: &Daemon| ingester.metric("tessera_ingester_owned_shards", "");
    let fenced = |ingester: &Daemon| ingester.metric("tessera_ingester_fence_closed", "");
    wait_until("both ingesters own their shards, unfenced", Duration::from_secs(20), || {
        [&ing1, &ing2].iter().all(|ingester| owned(ingester) == 8.0 && fenced(ingester) == 0.0)
    });
    let version = ing1.metric("tessera_ingester_tier_placement_version", "") as u64;
    // Series of ing-1's shards in the first placement (init gives set 1 the even shards).
    let series: Vec<String> = (0..400)
        .map(|n| format!("fence.hits|#n:{n}"))
        .filter(|id| tessera_core::shard::shard_of(id.as_bytes(), 16).is_multiple_of(2))
        .take(20)
        .collect();
    let mut sender = Sender::connect(&format!("127.0.0.1:{}", ports[0]));
    let mut tile_end_ms = tessera_core::clock::now_ms() / 1_000 * 1_000;
    let before_everything = tile_end_ms - 1_000;
    let mut next_tile = || {
        tile_end_ms += 1_000;
        tile_end_ms
    };
    for _ in 0..3 {
        let ack = sender.send(&series, next_tile(), version);
        assert!(is_taken(&ack), "before the cut: {ack:?}");
    }
    wait_until("what ing-1 took is written", Duration::from_secs(10), || {
        ing1.metric("tessera_ingester_samples_written_total", "") >= 60.0
    });

    link.set(Mode::Stall);
    let cut = Instant::now();
    let failed_over = || ing2.metric("tessera_ingester_placement_changes_total", "change=\"fail_over\"") >= 1.0;
    let mut answers: Vec<(Duration, Ack)> = Vec::new();
    let mut failover_seen = None;
    let mut written_when_fenced = None;
    while failover_seen.is_none_or(|seen: Duration| cut.elapsed() < seen + Duration::from_secs(2)) {
        assert!(cut.elapsed() < Duration::from_secs(30), "ing-2 never failed ing-1 over:\n{}", ing2.log());
        let ack = sender.send(&series, next_tile(), version);
        if ack.reason == AckReason::Fenced.as_str() && written_when_fenced.is_none() {
            // Anything in flight when the fence fell is cancelled, not finished.
            std::thread::sleep(Duration::from_millis(300));
            written_when_fenced = Some(ing1.metric("tessera_ingester_samples_written_total", ""));
        }
        answers.push((cut.elapsed(), ack));
        if failover_seen.is_none() && failed_over() {
            failover_seen = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let failover_seen = failover_seen.expect("the loop ends after the failover");
    let first_fenced = answers
        .iter()
        .find(|(_, ack)| ack.reason == AckReason::Fenced.as_str())
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("ing-1 never fenced itself off: {answers:?}\n{}", ing1.log()));
    assert!(
        first_fenced < failover_seen,
        "fenced at {first_fenced:?}, after ing-2 failed it over at {failover_seen:?}"
    );
    let last_taken = answers.iter().filter(|(_, ack)| is_taken(ack)).map(|(at, _)| *at).max();
    assert!(
        last_taken.is_none_or(|at| at < first_fenced),
        "ing-1 took a batch after it fenced itself off: {answers:?}"
    );
    for (_, ack) in answers.iter().filter(|(at, _)| *at >= first_fenced) {
        assert_eq!(ack.status, AckStatus::Retryable as i32, "{ack:?}");
        assert_eq!(ack.reason, AckReason::Fenced.as_str(), "{ack:?}");
    }
    // A batch in hand: routed under the version ing-1 still holds, for a tile that ended
    // before its fence fell (what an aggregator sent just before a pause past the lease):
    // queued all the same, and written only once the fence lifts.
    let in_hand = sender.send(&series, before_everything, version);
    assert!(is_taken(&in_hand), "a tile from before the fence, routed under ing-1's version: {in_hand:?}");
    std::thread::sleep(Duration::from_millis(300));
    let written = written_when_fenced.expect("a fenced answer was seen");
    assert_eq!(
        ing1.metric("tessera_ingester_samples_written_total", ""),
        written,
        "ing-1 wrote to its store while fenced off"
    );
    assert_eq!(owned(&ing2), 16.0, "ing-2 owns every shard after the failover");
    assert!(ing1.metric("tessera_ingester_batch_acks_total", "status=\"retryable\",reason=\"fenced\"") >= 1.0);

    link.set(Mode::Pass);
    wait_until("ing-1's fence lifts once it reads the placement again", Duration::from_secs(30), || {
        fenced(&ing1) == 0.0
    });
    assert_eq!(ing1.metric("tessera_ingester_fenced_total", ""), 1.0);
    wait_until("the batch in hand is written once the fence lifted", Duration::from_secs(10), || {
        ing1.metric("tessera_ingester_samples_written_total", "") >= written + 20.0
    });
    let seen = ing1.metric("tessera_ingester_tier_placement_version", "") as u64;
    assert!(seen > version, "ing-1 read the placement it was failed over in ({seen} > {version})");
    // One series of every shard: ing-1 owns fewer than all 16 in any placement after the
    // failover, whatever its join takes back.
    let every_shard: Vec<String> = (0..16u32)
        .map(|shard| {
            (0..10_000)
                .map(|n| format!("fence.other|#n:{n}"))
                .find(|id| tessera_core::shard::shard_of(id.as_bytes(), 16) == shard)
                .expect("a series in every shard")
        })
        .collect();
    let stale = sender.send(&every_shard, next_tile(), version);
    assert_eq!(
        (stale.status, stale.reason.as_str()),
        (AckStatus::Retryable as i32, AckReason::PlacementStale.as_str()),
        "{stale:?}"
    );
    let ahead = sender.send(&series, next_tile(), seen + 5);
    assert_eq!(ahead.reason, AckReason::PlacementAhead.as_str(), "{ahead:?}");
}
