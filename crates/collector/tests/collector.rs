//! The real collector, fed real UDP, TCP and Unix-socket traffic, checked
//! series by series at a wire-protocol receiver.

#[path = "support/receiver.rs"]
mod receiver;

use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use receiver::Receiver;
use tessera_collector::{Collector, Config, PlacementHandle};
use tessera_core::aggregate::Aggregate;
use tessera_core::parse::MetricKind;
use tessera_proto::AckStatus;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::in_process_collector_config;
use tessera_topology::Placement;

fn config(unix: Option<std::path::PathBuf>) -> Config {
    let mut config: Config = toml::from_str(&in_process_collector_config(200, 50)).unwrap();
    config.udp.reader_threads = Some(2);
    config.udp.recv_buffer_bytes = 8_388_608;
    config.udp.max_datagram_bytes = 1024;
    config.tcp.listen = Some("127.0.0.1:0".parse().unwrap());
    config.forward.shutdown_grace_secs = 10;
    config.telemetry.listen = None;
    config.unix.path = unix;
    config
}

/// A running collector routing to `endpoint` over `num_shards` shards, with its telemetry and
/// shutdown.
async fn start(config: Config, endpoint: &str, num_shards: u32) -> (Collector, Telemetry, Shutdown) {
    let shutdown = Shutdown::new();
    let telemetry = Telemetry::new("collector", "test");
    let placement = PlacementHandle::fixed(placement(endpoint, num_shards));
    let collector = Collector::start(config, placement, telemetry.clone(), shutdown.clone()).await.unwrap();
    (collector, telemetry, shutdown)
}

/// A receiver on an ephemeral port answering OK, and a collector routing to it over
/// `num_shards` shards.
async fn start_with_receiver(config: Config, num_shards: u32) -> (Receiver, Collector, Telemetry, Shutdown) {
    let receiver = Receiver::start("127.0.0.1:0").await;
    let (collector, telemetry, shutdown) = start(config, &receiver.address.to_string(), num_shards).await;
    (receiver, collector, telemetry, shutdown)
}

fn placement(endpoint: &str, num_shards: u32) -> Placement {
    Placement::init(&[("agg-1", endpoint)], num_shards, 1, 0).unwrap()
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric_value(telemetry: &Telemetry, name: &str, labels: &str) -> f64 {
    let text = telemetry.encode().unwrap();
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("{prefix} not found in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_delivers_exact_values_series_by_series() {
    every_listener_delivers_exact_values(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_delivers_exact_values_series_by_series_through_the_dictionary() {
    every_listener_delivers_exact_values(true).await;
}

async fn every_listener_delivers_exact_values(series_dictionary: bool) {
    let dir = tempfile::tempdir().unwrap();
    let unix_path = dir.path().join("statsd.sock");
    let mut config = config(Some(unix_path.clone()));
    config.forward.series_dictionary = series_dictionary;
    let (receiver, collector, telemetry, shutdown) = start_with_receiver(config, 8).await;

    // UDP: 40 counter series with sample rates, gauges, timers, sets; spread
    // over several windows and from several sender sockets.
    let udp_target = collector.udp_addr().unwrap();
    let senders: Vec<UdpSocket> = (0..4).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let mut udp_lines = 0u64;
    for round in 0..20u64 {
        let mut datagram = String::new();
        for series in 0..40u64 {
            datagram.push_str(&format!("hits.{series}:{}|c|@0.5|#env:test,round:{}\n", series + 1, round % 2));
            udp_lines += 1;
        }
        datagram.push_str(&format!("temp:{round}|g|#room:a\n"));
        datagram.push_str(&format!("latency:{}:{}|ms|#route:/x\n", round + 1, 100 + round));
        datagram.push_str(&format!("users:user{}|s\n", round % 7));
        udp_lines += 3; // the timer line packs two values but is one line
        for part in split_at_newlines(&datagram, 900) {
            senders[(round % 4) as usize].send_to(part.as_bytes(), udp_target).unwrap();
        }
        if round % 5 == 4 {
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    }

    // Readers may take datagrams sent within the same millisecond in either
    // order; a gauge set after a pause is the last value by any clock.
    tokio::time::sleep(Duration::from_millis(30)).await;
    senders[0].send_to(b"temp:99|g|#room:a", udp_target).unwrap();
    udp_lines += 1;

    // TCP: many lines, the last one without a newline, over two connections.
    let tcp_target = collector.tcp_addr().unwrap();
    for connection in 0..2 {
        let mut stream = TcpStream::connect(tcp_target).unwrap();
        let mut text = String::new();
        for i in 0..500 {
            text.push_str(&format!("tcp.count:1|c|#conn:{connection}\r\ntcp.dist:{}|d\n", i % 10));
        }
        text.push_str("tcp.last:7|c");
        stream.write_all(text.as_bytes()).unwrap();
    }

    // Unix datagram socket.
    let unix = UnixDatagram::unbound().unwrap();
    for _ in 0..25 {
        unix.send_to(b"uds.count:2|c\nuds.gauge:+1|g", &unix_path).unwrap();
    }

    wait_until("tcp and unix lines to be counted", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_lines_received_total", "listener=\"tcp\"") >= 2002.0
            && metric_value(&telemetry, "tessera_collector_lines_received_total", "listener=\"unix\"") >= 50.0
            && metric_value(&telemetry, "tessera_collector_lines_received_total", "listener=\"udp\"")
                >= udp_lines as f64
    })
    .await;
    shutdown.trigger();
    collector.wait().await;

    for series in 0..40u64 {
        for round in 0..2 {
            let id = format!("hits.{series}|#env:test,round:{round}");
            assert_eq!(receiver.counter(&id), Some(10.0 * 2.0 * (series + 1) as f64), "{id}");
        }
    }
    let Some(Aggregate::Gauge(gauge)) = receiver.get(MetricKind::Gauge, "temp|#room:a") else { panic!("no gauge") };
    assert_eq!(gauge.value, 99.0);
    let Some(Aggregate::Distribution(latency)) = receiver.get(MetricKind::Timer, "latency|#route:/x") else {
        panic!("no timer")
    };
    // `|ms` values are kept in seconds (each divided by 1000); the sum of 40 of them rounds.
    assert_eq!((latency.count, latency.min, latency.max), (40.0, 0.001, 0.119));
    let sum_ms = (1..=20).sum::<u64>() as f64 + (100..120).sum::<u64>() as f64;
    let sum = sum_ms / 1000.0;
    assert!((latency.sum - sum).abs() <= sum * 1e-12, "latency sum {} vs {sum}", latency.sum);
    let Some(Aggregate::Set(users)) = receiver.get(MetricKind::Set, "users") else { panic!("no set") };
    assert_eq!(users.estimate(), 7.0);

    assert_eq!(receiver.counter("tcp.count|#conn:0"), Some(500.0));
    assert_eq!(receiver.counter("tcp.count|#conn:1"), Some(500.0));
    assert_eq!(receiver.counter("tcp.last"), Some(14.0), "the last line without newline counts, once per connection");
    let Some(Aggregate::Distribution(dist)) = receiver.get(MetricKind::Distribution, "tcp.dist") else { panic!() };
    assert_eq!(dist.count, 1000.0);
    assert_eq!(receiver.counter("uds.count"), Some(50.0));
    let Some(Aggregate::Gauge(uds_gauge)) = receiver.get(MetricKind::Gauge, "uds.gauge") else { panic!() };
    assert_eq!(uds_gauge.resolve(Some(0.0)), Some(25.0), "statsd deltas sum across windows");
    assert!(receiver.received.lock().unwrap().sources.iter().all(|source| !source.is_empty()));
    let by_ref = receiver.received.lock().unwrap().by_ref;
    assert_eq!(by_ref > 0, series_dictionary, "{by_ref} partials named by ref");
}

fn split_at_newlines(text: &str, max: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let cut = rest[..max].rfind('\n').unwrap() + 1;
        parts.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if !rest.is_empty() {
        parts.push(rest);
    }
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_counted_and_never_hides_good_lines() {
    let (receiver, collector, telemetry, shutdown) = start_with_receiver(config(None), 4).await;
    let target = collector.udp_addr().unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Garbage bytes around a good line.
    socket.send_to(b"\x00\x01\x02garbage\ngood.a:1|c\n\xff\xfe|#:", target).unwrap();
    // A half line, a bad type, invalid UTF-8 in tags, then a good line.
    socket.send_to(b"half.line:1\nx:1|zz\ntagged:1|c|#k:\xc3\x28\ngood.b:2|c", target).unwrap();
    // Oversized: 2000 bytes into a 1024-byte buffer; complete lines are kept.
    let mut oversized = String::new();
    while oversized.len() < 2000 {
        oversized.push_str("good.c:1|c\n");
    }
    socket.send_to(oversized.as_bytes(), target).unwrap();
    let complete_lines_in_buffer = (1024 / "good.c:1|c\n".len()) as f64;
    // Events and service checks are recognised, not forwarded.
    socket.send_to(b"_e{5,4}:title|text\n_sc|db|0\ngood.d:1|c", target).unwrap();

    wait_until("every datagram to be read", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_datagrams_received_total", "listener=\"udp\"") >= 4.0
    })
    .await;
    shutdown.trigger();
    collector.wait().await;

    assert_eq!(receiver.counter("good.a"), Some(1.0));
    assert_eq!(receiver.counter("good.b"), Some(2.0));
    assert_eq!(receiver.counter("good.c"), Some(complete_lines_in_buffer));
    assert_eq!(receiver.counter("good.d"), Some(1.0));
    assert_eq!(receiver.series_count(), 4, "nothing but the good lines was forwarded");
    let errors = |reason: &str| {
        metric_value(
            &telemetry,
            "tessera_collector_parse_errors_total",
            &format!("listener=\"udp\",reason=\"{reason}\""),
        )
    };
    assert_eq!(errors("missing_value"), 1.0 + 1.0);
    assert_eq!(errors("missing_type"), 1.0);
    assert_eq!(errors("unknown_type"), 1.0);
    assert_eq!(errors("invalid_utf8"), 1.0);
    assert_eq!(
        metric_value(&telemetry, "tessera_collector_drops_total", "reason=\"truncated\",unit=\"datagrams\""),
        1.0
    );
    assert_eq!(metric_value(&telemetry, "tessera_collector_events_received_total", "listener=\"udp\""), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_written_in_names_join_the_series_of_their_tags() {
    let (receiver, collector, telemetry, shutdown) = start_with_receiver(config(None), 4).await;
    let target = collector.udp_addr().unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // One series written four ways (one name tag malformed), a container id, and a line
    // that mixes name tags with a tag field.
    socket
        .send_to(
            b"api.hits:1|c|#env:prod\napi.hits,env=prod:2|c\napi.hits#env=prod,bad:3|c\napi.[env=prod]hits:4|c\n\
              api.hits:1|c|c:f00d\nmixed,env=prod:1|c|#env:prod",
            target,
        )
        .unwrap();
    wait_until("the datagram to be read", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_datagrams_received_total", "listener=\"udp\"") >= 1.0
    })
    .await;
    shutdown.trigger();
    collector.wait().await;

    assert_eq!(receiver.counter("api.hits|#env:prod"), Some(10.0));
    assert_eq!(receiver.counter("api.hits|#container_id:f00d"), Some(1.0));
    assert_eq!(receiver.series_count(), 2);
    assert_eq!(metric_value(&telemetry, "tessera_collector_name_tag_errors_total", "listener=\"udp\""), 1.0);
    assert_eq!(
        metric_value(
            &telemetry,
            "tessera_collector_parse_errors_total",
            "listener=\"udp\",reason=\"mixed_tag_styles\""
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_over_the_cap_are_refused_and_counted() {
    let mut config = config(None);
    config.tcp.max_connections = 2;
    let (receiver, collector, telemetry, shutdown) = start_with_receiver(config, 4).await;
    let target = collector.tcp_addr().unwrap();
    let mut open: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(target).unwrap()).collect();
    // The two connections are accepted (a line from each arrives) before the third knocks.
    for (i, stream) in open.iter_mut().enumerate() {
        stream.write_all(format!("kept.{i}:1|c\n").as_bytes()).unwrap();
    }
    wait_until("both lines", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_lines_received_total", "listener=\"tcp\"") >= 2.0
    })
    .await;
    let mut refused = TcpStream::connect(target).unwrap();
    let refused_count = || {
        metric_value(
            &telemetry,
            "tessera_collector_frame_errors_total",
            "listener=\"tcp\",reason=\"too_many_connections\"",
        )
    };
    wait_until("the third connection to be refused", Duration::from_secs(10), || refused_count() >= 1.0).await;
    // The refused connection is closed: reading it ends (or fails) instead of blocking.
    refused.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buffer = [0u8; 1];
    let ended = matches!(std::io::Read::read(&mut refused, &mut buffer), Ok(0) | Err(_));
    assert!(ended, "the refused connection was closed");
    assert_eq!(refused_count(), 1.0);
    assert_eq!(metric_value(&telemetry, "tessera_collector_receive_errors_total", "listener=\"tcp\""), 0.0);
    drop(open);
    shutdown.trigger();
    collector.wait().await;
    assert_eq!(receiver.counter("kept.0"), Some(1.0));
    assert_eq!(receiver.counter("kept.1"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_destination_costs_bounded_memory_and_recovers() {
    // Reserve a port, then free it so that nothing listens there yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("127.0.0.1:{port}");
    let mut config = config(None);
    config.forward.max_frame_bytes = 4096;
    config.forward.max_queue_bytes = 16 * 1024;
    let (collector, telemetry, shutdown) = start(config, &endpoint, 4).await;
    let target = collector.udp_addr().unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Several windows of 200 distinct series each while the destination is down.
    for window in 0..8 {
        for chunk in 0..10 {
            let datagram: String = (0..20).map(|i| format!("down.{window}.{chunk}.{i}:1|c\n")).collect();
            socket.send_to(datagram.as_bytes(), target).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(210)).await;
    }
    wait_until("oldest batches to be dropped", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_drops_total", "reason=\"queue_full\",unit=\"partials\"") > 0.0
    })
    .await;
    let queued = metric_value(&telemetry, "tessera_collector_queue_bytes", "destination=\"agg-1\"");
    assert!(queued <= 16.0 * 1024.0, "queue holds {queued} bytes, over its bound");
    assert!(metric_value(&telemetry, "tessera_collector_connect_errors_total", "destination=\"agg-1\"") > 0.0);

    // The destination comes up: what is queued and what comes next arrive.
    let receiver = Receiver::start(&endpoint).await;
    socket.send_to(b"after.recovery:5|c", target).unwrap();
    wait_until("the queue to drain into the receiver", Duration::from_secs(15), || {
        receiver.counter("after.recovery") == Some(5.0)
    })
    .await;
    let dropped = metric_value(&telemetry, "tessera_collector_drops_total", "reason=\"queue_full\",unit=\"partials\"");
    let delivered = receiver.series_count() as f64;
    assert_eq!(delivered + dropped, 8.0 * 200.0 + 1.0, "every partial is either delivered or counted as dropped");
    // The newest windows survived (oldest-first dropping).
    assert_eq!(receiver.counter("down.7.9.19"), Some(1.0));
    shutdown.trigger();
    collector.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_rejections_are_dropped_and_counted() {
    let receiver = Receiver::start("127.0.0.1:0").await;
    *receiver.answer.lock().unwrap() = AckStatus::Permanent;
    let (collector, telemetry, shutdown) = start(config(None), &receiver.address.to_string(), 4).await;
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(b"refused:1|c\nrefused.too:1|c", collector.udp_addr().unwrap()).unwrap();
    // Every batch is refused, the collector's empty watermark batches too;
    // the two partials are counted as dropped, once.
    wait_until("the rejection to be counted", Duration::from_secs(10), || {
        telemetry.encode().unwrap().contains("tessera_collector_drops_total{reason=\"rejected\",unit=\"partials\"} 2")
    })
    .await;
    let refused = "destination=\"agg-1\",reason=\"not_owner\"";
    assert!(metric_value(&telemetry, "tessera_collector_rejected_batches_total", refused) >= 1.0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric_value(&telemetry, "tessera_collector_drops_total", "reason=\"rejected\",unit=\"partials\""), 2.0);
    shutdown.trigger();
    collector.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_moves_with_every_window_and_never_runs_ahead_of_the_data() {
    let (receiver, collector, _telemetry, shutdown) = start_with_receiver(config(None), 4).await;
    let target = collector.udp_addr().unwrap();
    let sockets: Vec<UdpSocket> = (0..4).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    // 1.5 s of traffic from four sockets over two readers, then 1.5 s idle.
    let busy_until = Instant::now() + Duration::from_millis(1500);
    let mut round = 0;
    while Instant::now() < busy_until {
        for (index, socket) in sockets.iter().enumerate() {
            socket.send_to(format!("wm.{index}.{}:1|c", round % 50).as_bytes(), target).unwrap();
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let idle_from_ms = tessera_core::clock::now_ms();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = receiver.received.lock().unwrap().batch_log.clone();
    shutdown.trigger();
    collector.wait().await;

    // Truthful: once a batch says everything ending at or before W was
    // sent, no later batch brings data for a window ending at or before W.
    let mut watermark = 0;
    for &(window, partials, mark) in &log {
        if partials > 0 {
            assert!(window + 200 > watermark, "data for the window at {window} after watermark {watermark}: {log:?}");
        }
        assert!(mark >= watermark, "the watermark went back from {watermark} to {mark}");
        assert!(mark <= window + 200, "a batch of the window at {window} claims {mark}");
        watermark = mark;
    }
    // Moving: the idle windows were announced with empty batches, and the
    // watermark followed the clock while nothing was sent.
    assert!(log.iter().any(|&(window, partials, _)| partials == 0 && window >= idle_from_ms), "{log:?}");
    assert!(watermark >= idle_from_ms + 1000, "watermark {watermark}, idle from {idle_from_ms}: {log:?}");
    assert!(log.iter().map(|entry| entry.1).sum::<u64>() > 0);
}

/// The memory budget: near `memory_limit` the collector refuses lines of new series and
/// counts them, while the series it knows go on exactly; back under it, new series are
/// taken again. The collector runs in this test's process, so a ballast the test allocates
/// is what pushes the resident memory to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_its_memory_limit_the_collector_sheds_new_series_and_known_ones_go_on() {
    use tessera_runtime::memory::{MemoryLimit, resident_bytes};
    let mut config = config(None);
    let limit = resident_bytes() + (256 << 20);
    config.memory_limit = Some(MemoryLimit::Bytes(limit));
    let (receiver, collector, telemetry, shutdown) = start_with_receiver(config, 4).await;
    let target = collector.udp_addr().unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let datagrams = || metric_value(&telemetry, "tessera_collector_datagrams_received_total", "listener=\"udp\"");
    let send = |lines: String| {
        socket.send_to(lines.as_bytes(), target).unwrap();
    };
    let lines = |prefix: &str| (0..10).map(|n| format!("{prefix}.{n}:1|c\n")).collect::<String>();
    // Known series are known per reader, and datagrams go to a random reader: twenty
    // rounds put every known series in both readers' tables (but for a chance of 2^-19).
    for _ in 0..20 {
        send(lines("known"));
    }
    wait_until("the first datagrams", Duration::from_secs(10), || datagrams() >= 20.0).await;
    assert_eq!(metric_value(&telemetry, "tessera_collector_memory_limit_bytes", ""), limit as f64);
    assert_eq!(metric_value(&telemetry, "tessera_collector_memory_shedding", ""), 0.0);

    // A ballast up to the limit: the guard sees it within 250 ms and sheds.
    let ballast = vec![1u8; usize::try_from(limit.saturating_sub(resident_bytes())).unwrap()];
    wait_until("shedding", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_memory_shedding", "") == 1.0
    })
    .await;
    send(lines("known") + &lines("new"));
    wait_until("the shed datagram", Duration::from_secs(10), || datagrams() >= 21.0).await;
    let shed = || metric_value(&telemetry, "tessera_collector_drops_total", "reason=\"memory_limit\",unit=\"lines\"");
    assert_eq!(shed(), 10.0, "the lines of the ten new series");
    // Shedding began at 90 % and lasts until under 80 %: what the process frees meanwhile
    // (seen once under a busy machine) may take it below 90 %, never below 80 % while it sheds.
    assert!(metric_value(&telemetry, "tessera_collector_memory_used_bytes", "") >= limit as f64 * 0.8);

    // Back under the limit: new series are taken again.
    drop(ballast);
    wait_until("the end of shedding", Duration::from_secs(10), || {
        metric_value(&telemetry, "tessera_collector_memory_shedding", "") == 0.0
    })
    .await;
    send("later:1|c\n".to_owned());
    wait_until("the last datagram", Duration::from_secs(10), || datagrams() >= 22.0).await;
    shutdown.trigger();
    collector.wait().await;
    for n in 0..10 {
        assert_eq!(receiver.counter(&format!("known.{n}")), Some(21.0), "known.{n} goes on exactly");
        assert_eq!(receiver.counter(&format!("new.{n}")), None, "new.{n} was shed");
    }
    assert_eq!(receiver.counter("later"), Some(1.0));
    assert_eq!(shed(), 10.0);
}
