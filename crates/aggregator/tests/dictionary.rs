//! The series dictionary between a real collector and a real aggregator:
//! series go by ref once named, and every tile stays exact when the
//! connection breaks mid-stream (queued batches of the old dictionary are
//! re-sent with full ids), when the aggregator restarts, and when shards
//! move to another aggregator (placement in a real etcd) while the
//! dictionaries are live.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use support::{TileReceiver, collector_config, test_config, wait_until};
use tessera_aggregator::Aggregator;
use tessera_collector::Collector;
use tessera_core::clock::now_ms;
use tessera_proto::AckReason;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::testing::EtcdServer;
use tessera_topology::{MoveTiming, Placement, PlacementHandle, PlacementSource, PlacementStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const POLICIES: [&str; 2] = ["500ms:1h", "1s:1h"];
const SERIES: usize = 200;

/// A TCP relay whose connections can all be cut at once.
struct Relay {
    address: SocketAddr,
    cut: Arc<Notify>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let cut = Arc::new(Notify::new());
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let cut = cuts.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = cut.notified() => {}
                    }
                });
            }
        });
        Relay { address, cut }
    }

    /// Drops every connection open now.
    fn cut(&self) {
        self.cut.notify_waiters();
    }
}

/// Sum of every tile value of `policy` for counter `id`, every flush of it, over every receiver.
fn totals(receivers: &[&TileReceiver], policy: &str, id: &str) -> f64 {
    receivers
        .iter()
        .flat_map(|receiver| receiver.counter_tiles(policy, id))
        .flat_map(|(_, flushed)| flushed)
        .map(|flushed| flushed.counter_sum())
        .sum()
}

/// No batch was refused as too late, malformed or naming an unknown ref, nor for any of `more`.
fn assert_none_refused(metrics: &tessera_aggregator::Metrics, more: &[AckReason]) {
    for &reason in [AckReason::TooLate, AckReason::Malformed, AckReason::UnknownSeriesRef].iter().chain(more) {
        assert_eq!(metrics.tile.refusals.rejected_batches(reason), 0, "{reason:?}");
    }
}

async fn start_aggregator(receiver: &TileReceiver, listen: &str, shutdown: &Shutdown) -> Aggregator {
    let own = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:1")], 8, 1, 0).unwrap());
    start_aggregator_on("agg-1", own, receiver, listen, shutdown).await
}

async fn start_aggregator_on(
    id: &str,
    placement: PlacementHandle,
    receiver: &TileReceiver,
    listen: &str,
    shutdown: &Shutdown,
) -> Aggregator {
    let mut config = test_config(id, &receiver.address.to_string(), &POLICIES, 4);
    config.listen = listen.parse().unwrap();
    config.buffer_past_ms = 500;
    config.max_buffer_past_ms = Some(3_000);
    Aggregator::start_with_placement(config, placement, Telemetry::new("aggregator", "test"), shutdown.clone())
        .await
        .unwrap()
}

async fn start_collector(endpoint: String) -> (Collector, Shutdown) {
    start_collector_on(PlacementHandle::fixed(Placement::init(&[("agg-1", endpoint)], 8, 1, 0).unwrap())).await
}

async fn start_collector_on(routed: PlacementHandle) -> (Collector, Shutdown) {
    let shutdown = Shutdown::new();
    let mut config = collector_config();
    config.forward.series_dictionary = true;
    let collector =
        Collector::start(config, routed, Telemetry::new("collector", "test"), shutdown.clone()).await.unwrap();
    (collector, shutdown)
}

/// Stops the collector, then the aggregators.
async fn stop(
    collector: Collector,
    collector_shutdown: &Shutdown,
    aggregators: impl IntoIterator<Item = Aggregator>,
    shutdown: &Shutdown,
) {
    collector_shutdown.trigger();
    collector.wait().await;
    shutdown.trigger();
    for aggregator in aggregators {
        aggregator.wait().await;
    }
}

/// Sends one line to each of `SERIES` counters per round, `rounds` rounds
/// 20 ms apart, calling `between(round)` after each.
async fn send_rounds(collector: &Collector, rounds: usize, mut between: impl AsyncFnMut(usize)) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = collector.udp_addr().unwrap();
    for round in 0..rounds {
        for chunk in (0..SERIES).collect::<Vec<_>>().chunks(20) {
            let datagram: String = chunk.iter().map(|series| format!("dict.hits:1|c|#series:s{series}\n")).collect();
            socket.send_to(datagram.as_bytes(), target).unwrap();
        }
        between(round).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_exact(receiver: &[&TileReceiver], rounds: usize) {
    let expected = rounds as f64;
    let complete = || {
        (0..SERIES).all(|series| {
            let id = format!("dict.hits|#series:s{series}");
            POLICIES.iter().all(|policy| totals(receiver, policy, &id) >= expected)
        })
    };
    wait_until("every line in the tiles of both policies", Duration::from_secs(20), complete).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for series in 0..SERIES {
        let id = format!("dict.hits|#series:s{series}");
        for policy in POLICIES {
            assert_eq!(totals(receiver, policy, &id), expected, "{policy} {id}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiles_stay_exact_when_the_connection_breaks_mid_stream() {
    let receiver = TileReceiver::start().await;
    let shutdown = Shutdown::new();
    let aggregator = start_aggregator(&receiver, "127.0.0.1:0", &shutdown).await;
    let relay = Relay::start(aggregator.listen_addr()).await;
    let (collector, collector_shutdown) = start_collector(relay.address.to_string()).await;
    let metrics = aggregator.metrics().clone();
    let mut refs_seen = 0;
    let rounds = 120;
    send_rounds(&collector, rounds, async |round| {
        refs_seen = refs_seen.max(metrics.intake.dictionary_refs.get());
        // Three breaks, each while batches of the old dictionary may be queued or in flight.
        if round % 30 == 29 {
            relay.cut();
        }
    })
    .await;
    assert_exact(&[&receiver], rounds).await;
    assert!(refs_seen >= SERIES as i64, "the aggregator's dictionary named {refs_seen} series");
    assert_none_refused(&metrics, &[]);
    let connects = collector.metrics().dictionary_generations_ended("agg-1", "connect");
    assert!(connects >= 4, "a new dictionary per connection: {connects}");
    stop(collector, &collector_shutdown, [aggregator], &shutdown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiles_stay_exact_across_an_aggregator_restart() {
    // The restarted aggregator numbers its tile batches from 1 again: it
    // flushes to a receiver of its own, which would otherwise take them
    // for duplicates.
    let (receiver, after_restart) = (TileReceiver::start().await, TileReceiver::start().await);
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let mut shutdown = Shutdown::new();
    let mut aggregator = Some(start_aggregator(&receiver, &listen, &shutdown).await);
    let (collector, collector_shutdown) = start_collector(listen.clone()).await;
    let rounds = 100;
    let mut restarted = None;
    send_rounds(&collector, rounds, async |round| {
        if round == 50 {
            let refs = aggregator.as_ref().unwrap().metrics().intake.dictionary_refs.get();
            assert!(refs >= SERIES as i64, "series went by ref before the restart ({refs})");
            shutdown.trigger();
            aggregator.take().unwrap().wait().await;
            shutdown = Shutdown::new();
            aggregator = Some(start_aggregator(&after_restart, &listen, &shutdown).await);
        }
        if round == rounds - 1 {
            restarted = Some(aggregator.as_ref().unwrap().metrics().intake.dictionary_refs.get());
        }
    })
    .await;
    assert_exact(&[&receiver, &after_restart], rounds).await;
    let aggregator = aggregator.unwrap();
    assert!(restarted >= Some(SERIES as i64), "a new dictionary on the new connection: {restarted:?}");
    assert_none_refused(aggregator.metrics(), &[]);
    stop(collector, &collector_shutdown, [aggregator], &shutdown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiles_stay_exact_when_shards_move_while_dictionaries_are_live() {
    let etcd = tokio::task::block_in_place(EtcdServer::start).expect("starting etcd");
    let etcd_config = etcd.config("dictionary-move");
    let store = PlacementStore::connect(etcd_config.clone()).await.unwrap();
    let free_address = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (address_1, address_2) = (free_address(), free_address());
    let initial = Placement::init(&[("agg-1", address_1.as_str())], 8, 1, now_ms()).unwrap();
    store.compare_and_swap(None, &initial).await.unwrap();
    let watched = || async { PlacementSource::Etcd(etcd_config.clone()).start().await.unwrap() };
    let receiver = TileReceiver::start().await;
    let shutdown = Shutdown::new();
    let aggregator_1 = start_aggregator_on("agg-1", watched().await, &receiver, &address_1, &shutdown).await;
    // agg-2 runs from the start and owns nothing until the move.
    let aggregator_2 = start_aggregator_on("agg-2", watched().await, &receiver, &address_2, &shutdown).await;
    let (collector, collector_shutdown) = start_collector_on(watched().await).await;

    let rounds = 200;
    let mut moved_at = None;
    let mut refs_before_move = 0;
    send_rounds(&collector, rounds, async |round| {
        // Half the shards move while every series already goes by ref to agg-1.
        if round == 40 {
            refs_before_move = aggregator_1.metrics().intake.dictionary_refs.get();
            let timing = MoveTiming::new(now_ms()).with_delay_ms(1_000).with_boundary_ms(1_000);
            let (current, revision) = store.get().await.unwrap();
            let moved = current.add_instance("agg-2", &address_2, timing).unwrap();
            store.compare_and_swap(Some(revision), &moved).await.unwrap();
            moved_at = Some(timing.cutover_ms().unwrap());
        }
    })
    .await;
    let cutover = moved_at.expect("the move was made");
    assert!(now_ms() > cutover + 1_000, "traffic flowed past the cutover");
    assert!(refs_before_move >= SERIES as i64, "series went by ref before the move ({refs_before_move})");
    assert_exact(&[&receiver], rounds).await;

    let flushed_by_2 = receiver
        .values()
        .values()
        .flat_map(|flushed| flushed.iter())
        .filter(|flushed| flushed.source == "agg-2")
        .count();
    assert!(flushed_by_2 > 100, "agg-2 flushed {flushed_by_2} tile values after the move");
    let refs_2 = aggregator_2.metrics().intake.dictionary_refs.get();
    assert!(refs_2 > 0, "the collector named series to agg-2 by ref ({refs_2})");
    for aggregator in [&aggregator_1, &aggregator_2] {
        assert_none_refused(aggregator.metrics(), &[AckReason::NotOwner]);
    }
    stop(collector, &collector_shutdown, [aggregator_1, aggregator_2], &shutdown).await;
}
