//! Garbage on every port of the real binaries, while good statsd flows:
//! the collector's statsd TCP listener, the aggregator's and the ingester's
//! wire ports, and the three telemetry HTTP ports get random bytes, an
//! absurd frame length, a half-sent frame and connections that close at
//! once. Every daemon stays up and ready, counts what it refused, and the
//! good counters arrive in a real Prometheus exactly, the TCP ones sent on
//! a connection that also carried garbage lines included.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use tessera_testkit::prometheus::Prometheus;
use tessera_testkit::{free_port, http_get};
use tessera_tests::{
    ONE_SECOND_SINK, ONE_SECOND_TILES, collector_config, loopback, scalar, start_daemon, start_ingester,
    start_lone_aggregator, wait_for_scalar,
};

/// How long the good counters may take to reach Prometheus.
const WAIT: Duration = Duration::from_secs(30);

/// Deterministic bytes (xorshift), newlines and all.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Sends `bytes` on a fresh connection, then reads until the peer closes or
/// a second passes; returns what the peer answered.
fn throw(address: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let Ok(mut stream) = TcpStream::connect(address) else { return Vec::new() };
    stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// What the wire ports get: noise, a frame header claiming 4 GB, half a
/// frame, and a connection closed at once.
fn wire_garbage(address: SocketAddr) {
    throw(address, &noise(1, 4096));
    throw(address, &[0xff, 0xff, 0xff, 0xff, 0x0a, 0x00]);
    let mut half = 64u32.to_be_bytes().to_vec();
    half.extend_from_slice(&noise(2, 10));
    throw(address, &half);
    drop(TcpStream::connect(address));
}

/// What the telemetry ports get: noise, a request line of 1 MB, a bogus
/// method, and a header block that never ends.
fn http_garbage(address: SocketAddr) {
    throw(address, &noise(3, 2048));
    let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(1 << 20));
    throw(address, long.as_bytes());
    throw(address, b"BREW /metrics HTCPCP/1.0\r\n\r\n");
    throw(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: ");
}

#[test]
fn garbage_on_every_port_is_refused_and_counted_and_good_data_beside_it_arrives() {
    let prometheus = Prometheus::start();
    let dir = tempfile::tempdir().unwrap();
    let (aggregator_port, statsd_port) = (free_port(), free_port());
    let (ingester, ingester_port) = start_ingester(dir.path(), &prometheus, ONE_SECOND_SINK);
    let (aggregator, placement) =
        start_lone_aggregator(dir.path(), aggregator_port, ONE_SECOND_TILES, ingester_port, "");
    let collector_text = collector_config("host-1", statsd_port, &placement, "");
    let tcp_listener = format!("[tcp]\nlisten = \"127.0.0.1:{statsd_port}\"\n");
    let collector = start_daemon("collector", "tessera-collector", &(collector_text + &tcp_listener), free_port());
    let telemetry = [ingester.telemetry, aggregator.telemetry, collector.telemetry];
    let statsd = loopback(statsd_port);

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_datagram: String = (0..10).map(|series| format!("garbage.udp:1|c|#series:s{series}\n")).collect();
    let mut tcp = TcpStream::connect(statsd).unwrap();
    let (mut udp_rounds, mut tcp_lines) = (0u64, 0u64);
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < Duration::from_secs(4) {
        socket.send_to(udp_datagram.as_bytes(), statsd).unwrap();
        udp_rounds += 1;
        // Good lines and garbage lines on one TCP connection: the good ones count.
        let mut chunk = b"garbage.tcp:1|c\n".to_vec();
        chunk.extend(noise(round + 10, 200).into_iter().filter(|byte| *byte != b'\n'));
        chunk.extend_from_slice(b"\n:|c\nno_value|c\ngarbage.tcp:1|c\n");
        tcp.write_all(&chunk).unwrap();
        tcp_lines += 2;
        match round % 4 {
            0 => wire_garbage(loopback(aggregator_port)),
            1 => wire_garbage(loopback(ingester_port)),
            2 => telemetry.into_iter().for_each(http_garbage),
            _ => {
                // Statsd TCP: noise, and a line far over the line limit, on their own connections.
                throw(statsd, &noise(round, 8192));
                let mut long = b"garbage.long:1|c|#k:".to_vec();
                long.extend(std::iter::repeat_n(b'v', 256 * 1024));
                long.push(b'\n');
                throw(statsd, &long);
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    tcp.shutdown(Shutdown::Write).unwrap();

    for daemon in [&ingester, &aggregator, &collector] {
        let (status, _) = http_get(daemon.telemetry, "/readyz").unwrap();
        assert_eq!(status, 200, "{} is up and ready after the garbage:\n{}", daemon.name, daemon.log());
    }
    wait_for_scalar(&prometheus, "sum(garbage_udp_total)", (udp_rounds * 10) as f64, WAIT);
    wait_for_scalar(&prometheus, "sum(garbage_tcp_total)", tcp_lines as f64, WAIT);
    assert!(collector.metric("tessera_collector_parse_errors_total", "") > 0.0, "garbage lines counted");
    assert!(aggregator.metric("tessera_aggregator_frame_errors_total", "") > 0.0, "garbage frames counted");
    assert!(ingester.metric("tessera_ingester_frame_errors_total", "") > 0.0, "garbage frames counted");
    assert_eq!(scalar(&prometheus, "count(garbage_long_total)"), None, "the over-long line was refused");
}
