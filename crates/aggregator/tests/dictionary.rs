//! The series dictionary between a real collector and a real aggregator:
//! series go by ref once named, and every tile stays exact when the
//! connection breaks mid-stream (queued batches of the old dictionary are
//! re-sent with full ids), when the aggregator restarts, and when shards
//! move to another aggregator (placement in a real etcd) while the
//! dictionaries are live.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::{TileReceiver, collector_config, test_config, wait_until};
use tessera_aggregator::Aggregator;
use tessera_collector::Collector;
use tessera_core::clock::now_ms;
use tessera_proto::AckReason;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::testing::EtcdServer;
use tessera_topology::{MoveTiming, Placement, PlacementHandle, PlacementSource, PlacementStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const POLICIES: [&str; 2] = ["500ms:1h", "1s:1h"];
const SERIES: usize = 200;

/// A TCP relay whose connections can all be cut at once, and whose newest
/// connection can be made to swallow the aggregator's answers, and to hold back
/// what the collector sends until after it left.
struct Relay {
    address: SocketAddr,
    cut: Arc<Notify>,
    /// Connections opened so far (numbered from 1).
    opened: Arc<AtomicU64>,
    /// The connection whose answers go nowhere (0: none).
    silenced: Arc<AtomicU64>,
    /// The connection whose batches reach the aggregator only after the collector left it.
    held: Arc<AtomicU64>,
}

/// How long after the collector left a held connection its batches reach the aggregator:
/// after the collector sent them again on its next connection.
const HELD_FOR: Duration = Duration::from_millis(700);

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let cut = Arc::new(Notify::new());
        let (opened, silenced, held) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (cuts, opens, silence, hold) = (cut.clone(), opened.clone(), silenced.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (cut, silenced, held) = (cuts.clone(), silence.clone(), hold.clone());
                let number = opens.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let ((mut from_client, mut to_client), (mut from_server, mut to_server)) =
                        (inbound.into_split(), outbound.into_split());
                    let answers = async {
                        let mut buffer = vec![0; 64 << 10];
                        loop {
                            let read = from_server.read(&mut buffer).await;
                            let Ok(read @ 1..) = read else { return };
                            if silenced.load(Ordering::SeqCst) != number
                                && to_client.write_all(&buffer[..read]).await.is_err()
                            {
                                return;
                            }
                        }
                    };
                    let batches = async {
                        let mut buffer = vec![0; 64 << 10];
                        let mut kept = Vec::new();
                        loop {
                            let read = from_client.read(&mut buffer).await;
                            let Ok(read @ 1..) = read else { break };
                            if held.load(Ordering::SeqCst) == number {
                                kept.extend_from_slice(&buffer[..read]);
                            } else if to_server.write_all(&buffer[..read]).await.is_err() {
                                return;
                            }
                        }
                        if !kept.is_empty() {
                            tokio::time::sleep(HELD_FOR).await;
                            let _ = to_server.write_all(&kept).await;
                        }
                    };
                    tokio::select! {
                        () = batches => {}
                        () = answers => {}
                        () = cut.notified() => {}
                    }
                });
            }
        });
        Relay { address, cut, opened, silenced, held }
    }

    /// Drops every connection open now.
    fn cut(&self) {
        self.cut.notify_waiters();
    }

    /// From now on the newest connection passes no answer back, so the collector's ack
    /// timeout ends it. What the collector sends on it reaches the aggregator at once, or
    /// with `hold_back`, [`HELD_FOR`] after the collector left it.
    fn silence_answers(&self, hold_back: bool) {
        let newest = self.opened.load(Ordering::SeqCst);
        if hold_back {
            self.held.store(newest, Ordering::SeqCst);
        }
        self.silenced.store(newest, Ordering::SeqCst);
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

/// No batch was refused as too late, malformed or naming an unknown ref, nor for any of `more`,
/// and none came too late for any policy's tile.
fn assert_none_refused(metrics: &tessera_aggregator::Metrics, more: &[AckReason]) {
    for &reason in [AckReason::TooLate, AckReason::Malformed, AckReason::UnknownSeriesRef].iter().chain(more) {
        assert_eq!(metrics.tile.refusals.rejected_batches(reason), 0, "{reason:?}");
    }
    for policy in POLICIES {
        assert_eq!(metrics.tile.late_partials(&policy.parse().unwrap()), 0, "late for {policy}");
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

/// The placement of a collector that sends to `endpoint` only.
fn only_to(endpoint: String) -> PlacementHandle {
    PlacementHandle::fixed(Placement::init(&[("agg-1", endpoint)], 8, 1, 0).unwrap())
}

async fn start_collector(endpoint: String) -> (Collector, Shutdown) {
    start_collector_configured(only_to(endpoint), true, None).await
}

async fn start_collector_on(routed: PlacementHandle) -> (Collector, Shutdown) {
    start_collector_configured(routed, true, None).await
}

/// A collector routing by `routed`, with or without its series dictionary, and with
/// `ack_timeout_ms` if given.
async fn start_collector_configured(
    routed: PlacementHandle,
    series_dictionary: bool,
    ack_timeout_ms: Option<u64>,
) -> (Collector, Shutdown) {
    let shutdown = Shutdown::new();
    let mut config = collector_config();
    config.forward.series_dictionary = series_dictionary;
    if let Some(ack_timeout_ms) = ack_timeout_ms {
        config.forward.ack_timeout_ms = ack_timeout_ms;
    }
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

/// The collector's acks stop coming on a connection (three times): its ack timeout ends the
/// connection and it sends the batch again on a new one, by the same sequence or (its refs
/// died with the connection) expanded from it. The first copy reaches the aggregator before
/// the second, or with `hold_back` after it, as the frame in a paused aggregator's socket
/// buffer did in seed 62. Either way the aggregator takes each batch once.
async fn a_batch_sent_again_after_its_ack_timed_out_goes_in_once(series_dictionary: bool, hold_back: bool) {
    let receiver = TileReceiver::start().await;
    let shutdown = Shutdown::new();
    let aggregator = start_aggregator(&receiver, "127.0.0.1:0", &shutdown).await;
    let relay = Relay::start(aggregator.listen_addr()).await;
    let (collector, collector_shutdown) =
        start_collector_configured(only_to(relay.address.to_string()), series_dictionary, Some(300)).await;
    let metrics = aggregator.metrics().clone();
    let rounds = 120;
    send_rounds(&collector, rounds, async |round| {
        if round % 30 == 10 {
            relay.silence_answers(hold_back);
        }
    })
    .await;
    assert_exact(&[&receiver], rounds).await;
    assert_none_refused(&metrics, &[]);
    let resent = metrics.tile.resent_batches.get();
    assert!(resent >= 3, "each silenced connection's last batch came again: {resent} re-sent batches taken");
    assert!(relay.opened.load(Ordering::SeqCst) >= 4, "the collector reconnected after each silence");
    let expanded = collector.metrics().batches_expanded("agg-1", "ok");
    if series_dictionary {
        assert!(expanded >= 3, "the batches in flight went by refs and were sent again expanded: {expanded}");
    } else {
        assert_eq!(expanded, 0);
    }
    stop(collector, &collector_shutdown, [aggregator], &shutdown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_by_its_sequence_after_its_ack_timed_out_goes_in_once() {
    a_batch_sent_again_after_its_ack_timed_out_goes_in_once(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_again_expanded_goes_in_once_when_its_first_copy_arrives_after_the_pieces() {
    a_batch_sent_again_after_its_ack_timed_out_goes_in_once(true, true).await;
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
