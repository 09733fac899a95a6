//! The backpressure chain end to end, on the real binaries: storage slows
//! down and refuses (a small HTTP front before a real Prometheus answers 503,
//! then 429, then slowly), the ingester's queue fills and it answers
//! `queue_full`, the aggregator's buffer fills and it refuses collectors
//! (`buffer_full`) and pushes out its oldest tiles, and the collector's queue
//! fills and drops its oldest partials. Then storage recovers.
//!
//! Every series gets exactly one increment per collector window and per 1 s
//! tile, so each partial and each tile value is one increment and the books
//! can be balanced exactly, at every hop:
//!
//! - collector: lines read = partials acknowledged + partials dropped;
//! - aggregator: partials merged = partials the collector had acknowledged;
//!   series values flushed = values acknowledged by the ingester + values dropped;
//! - ingester: samples queued = values acknowledged = samples written;
//! - Prometheus: the counters' total = lines sent − every counted drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;
use tessera_core::clock::now_ms;

use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    ONE_SECOND_SINK, collector_config, ingester_config, loopback, start_daemon, start_lone_aggregator, wait_for_scalar,
    wait_until,
};

const SERIES: u64 = 1_500;

/// What the storage front answers.
const PASS: u8 = 0;
const UNAVAILABLE: u8 = 1;
const TOO_MANY: u8 = 2;
const SLOW: u8 = 3;

/// An HTTP/1.1 front that passes requests on to `upstream`, or answers 503 or
/// 429, or passes them on after 2 s, as `mode` says; counts what it refused.
struct StorageFront {
    address: SocketAddr,
    mode: Arc<AtomicU8>,
    refused: Arc<AtomicU64>,
}

impl StorageFront {
    fn start(upstream: SocketAddr) -> StorageFront {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (mode, refused) = (Arc::new(AtomicU8::new(PASS)), Arc::new(AtomicU64::new(0)));
        let (serving_mode, serving_refused) = (mode.clone(), refused.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (mode, refused) = (serving_mode.clone(), serving_refused.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, upstream, &mode, &refused);
                });
            }
        });
        StorageFront { address, mode, refused }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::Relaxed);
    }
}

/// Serves one keep-alive connection, request by request.
fn serve(stream: TcpStream, upstream: SocketAddr, mode: &AtomicU8, refused: &AtomicU64) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let end = line == "\r\n";
            head.push_str(&line);
            if end {
                break;
            }
        }
        let length = head
            .lines()
            .find_map(|line| {
                line.to_ascii_lowercase().strip_prefix("content-length:").map(|value| value.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let status = match mode.load(Ordering::Relaxed) {
            UNAVAILABLE => Some("503 Service Unavailable"),
            TOO_MANY => Some("429 Too Many Requests"),
            SLOW => {
                std::thread::sleep(Duration::from_secs(2));
                None
            }
            _ => None,
        };
        if let Some(status) = status {
            refused.fetch_add(1, Ordering::Relaxed);
            write!(writer, "HTTP/1.1 {status}\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy")?;
            continue;
        }
        // Pass it on, on a connection of its own, and relay the answer.
        let mut upstream = TcpStream::connect(upstream)?;
        let request_head: String = head
            .lines()
            .filter(|line| !line.to_ascii_lowercase().starts_with("connection:"))
            .map(|line| format!("{line}\r\n"))
            .collect::<String>()
            .trim_end()
            .to_owned();
        write!(upstream, "{request_head}\r\nConnection: close\r\n\r\n")?;
        upstream.write_all(&body)?;
        let mut answer = Vec::new();
        upstream.read_to_end(&mut answer)?;
        let split = answer.windows(4).position(|window| window == b"\r\n\r\n").map_or(answer.len(), |at| at + 4);
        let (answer_head, answer_body) = answer.split_at(split);
        let status_line =
            String::from_utf8_lossy(answer_head).lines().next().unwrap_or("HTTP/1.1 502 Bad Gateway").to_owned();
        write!(writer, "{status_line}\r\nContent-Length: {}\r\n\r\n", answer_body.len())?;
        writer.write_all(answer_body)?;
    }
}

#[test]
fn storage_trouble_backs_up_the_chain_and_every_loss_is_counted_where_it_happened() {
    let prometheus = Prometheus::start();
    let prometheus_address: SocketAddr =
        prometheus.remote_write_url().trim_start_matches("http://").split('/').next().unwrap().parse().unwrap();
    let front = StorageFront::start(prometheus_address);
    let dir = tempfile::tempdir().unwrap();
    let (ingester_port, aggregator_port, statsd_port) = (free_port(), free_port(), free_port());
    let ingester_text = ingester_config(
        ingester_port,
        &dir.path().join("ingester"),
        &format!("http://{}/api/v1/write", front.address),
        &format!(
            "{ONE_SECOND_SINK}[queue]\nmax_queue_bytes = 262144\nsegment_max_bytes = 65536\n\
             [pool]\nretry_initial_backoff_ms = 50\nretry_max_backoff_ms = 500\n"
        ),
        "",
    );
    let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, free_port());
    let (aggregator, placement) = start_lone_aggregator(
        dir.path(),
        aggregator_port,
        "policies = [\"1s:1h\"]\nmax_buffer_past_ms = 8000\n",
        ingester_port,
        "max_frame_bytes = 32768\nmax_buffer_bytes = 131072\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n",
    );
    let collector_text =
        collector_config("host-1", statsd_port, &placement, "max_frame_bytes = 32768\nmax_queue_bytes = 131072\n");
    let collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());

    // One increment of every series per second, sent mid-second: each lands
    // alone in its collector window and its 1 s tile.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let statsd = loopback(statsd_port);
    let mut rounds = 0u64;
    let mut send_round = || {
        std::thread::sleep(Duration::from_millis(1_500 - ((now_ms() as u64) + 1_000) % 1_000));
        let mut datagram = String::new();
        for series in 0..SERIES {
            datagram.push_str(&format!("chain.hits:1|c|#series:s{series}\n"));
            if datagram.len() > 1_300 {
                socket.send_to(datagram.as_bytes(), statsd).unwrap();
                datagram.clear();
            }
        }
        socket.send_to(datagram.as_bytes(), statsd).unwrap();
        rounds += 1;
    };
    for (mode, seconds) in [(PASS, 3), (UNAVAILABLE, 8), (TOO_MANY, 6), (SLOW, 4), (PASS, 3)] {
        front.set(mode);
        for _ in 0..seconds {
            send_round();
        }
    }
    let sent = rounds * SERIES;

    // Storage is back: everything still queued drains.
    let collector_drops = || collector.metric("tessera_collector_drops_total", "unit=\"partials\"");
    let acked_partials = || collector.metric("tessera_collector_partials_sent_total", "");
    wait_until("the collector's queue to drain", Duration::from_secs(60), || {
        acked_partials() + collector_drops() == sent as f64
    });
    let aggregator_drops = || aggregator.metric("tessera_aggregator_drops_total", "unit=\"series\"");
    let flushed = || aggregator.metric("tessera_aggregator_series_flushed_total", "");
    let delivered = || aggregator.metric("tessera_aggregator_series_sent_total", "");
    wait_until("the aggregator's buffer to drain", Duration::from_secs(60), || {
        let (merged, acked) = (aggregator.metric("tessera_aggregator_partials_merged_total", ""), acked_partials());
        merged == acked && flushed() == merged && delivered() + aggregator_drops() == flushed()
    });
    let written = || ingester.metric("tessera_ingester_samples_written_total", "");
    wait_until("the ingester's queue to drain", Duration::from_secs(60), || written() == delivered());
    let expected = sent as f64 - collector_drops() - aggregator_drops();
    wait_for_scalar(&prometheus, "sum(chain_hits_total)", expected, Duration::from_secs(30));

    // The chain really backed up, hop by hop, and every loss was counted.
    assert_eq!(
        collector.metric("tessera_collector_lines_received_total", ""),
        sent as f64,
        "no line lost before the collector"
    );
    assert!(front.refused.load(Ordering::Relaxed) > 0, "storage refused");
    assert!(
        ingester.metric("tessera_ingester_batch_acks_total", "reason=\"queue_full\"") > 0.0,
        "the ingester's queue filled"
    );
    assert!(
        aggregator.metric("tessera_aggregator_batches_rejected_total", "reason=\"buffer_full\"") > 0.0,
        "the aggregator pushed back"
    );
    assert!(collector_drops() > 0.0, "the collector dropped its oldest");
    assert_eq!(ingester.metric("tessera_ingester_samples_queued_total", ""), delivered());
    assert_eq!(
        ingester.metric("tessera_ingester_sink_rejected_samples_total", ""),
        0.0,
        "503 and 429 are retried, never dropped"
    );
    eprintln!(
        "sent {sent} increments; collector dropped {} partials, aggregator refused {} batches (buffer_full) and \
         dropped {} series values, ingester answered queue_full {} times, storage refused {} requests; \
         Prometheus holds {expected}",
        collector_drops(),
        aggregator.metric("tessera_aggregator_batches_rejected_total", "reason=\"buffer_full\""),
        aggregator_drops(),
        ingester.metric("tessera_ingester_batch_acks_total", "reason=\"queue_full\""),
        front.refused.load(Ordering::Relaxed)
    );
}
