//! Test support shared by tessera's integration tests and benchmarks.
//!
//! - [`prometheus`]: Debian's `prometheus` as a child process on a free
//!   loopback port (remote-write receiver on, optional scrape config),
//!   polled until ready, killed on drop; instant queries.
//! - [`victoria`]: Debian's `victoria-metrics` the same way.
//! - [`graphite`]: Debian's `carbon-cache`, its whisper files read with `whisper-fetch`.
//! - [`influx`]: Debian's `influxd` (InfluxDB 1.x), queried over `/query`.
//! - [`daemons`]: the real tessera binaries as child processes, with a
//!   config file each, polled on `/readyz`, killed on drop.
//! - [`process`]: what those three share (a child with its files and log,
//!   polled until ready, killed on drop).
//! - [`tiles`]: tile values and batches as an aggregator sends them.
//! - [`tls`]: certificates made in the test (a CA, server, client, an untrusted CA).
//! - [`http_get`] and [`free_port`].
//! - [`in_process_collector_config`]: the config text of a collector that a test runs
//!   in its own process.
//!
//! A real etcd for tests lives in `tessera_topology::testing` (feature
//! `testing`).

pub mod daemons;
pub mod graphite;
pub mod influx;
pub mod process;
pub mod prometheus;
pub mod tiles;
pub mod tls;
pub mod victoria;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A loopback port that nobody listens on right now, on TCP and UDP.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), where the kernel
/// never puts the source port of an outgoing connection nor a `bind(0)`: a port from
/// inside that range could be taken by any test's client connection between this call
/// and the daemon's bind (seen as "Address already in use" under a parallel test run).
/// Each process walks the ports below the range from its own starting point (its pid),
/// so parallel test processes rarely try the same one; every port is checked by binding
/// it. Falls back to a port the kernel picks when the range starts too low.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const LOWEST: u32 = 10_000;
    if ephemeral_start <= LOWEST + 1_000 {
        return kernel_free_port();
    }
    let span = ephemeral_start - LOWEST;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = (LOWEST + offset) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    kernel_free_port()
}

/// A free loopback port the kernel picks (inside its ephemeral range).
fn kernel_free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("address").port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A minimal HTTP/1.0 GET (the server closes the connection after the
/// answer): status and body.
pub fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let (status, body) = http_get_bytes(address, path)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`http_get`] for binary bodies (a gzipped profile, say): status and raw body.
pub fn http_get_bytes(address: SocketAddr, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let split = response.windows(4).position(|window| window == b"\r\n\r\n");
    let (head, body) = match split {
        Some(at) => (&response[..at], response[at + 4..].to_vec()),
        None => (&response[..], Vec::new()),
    };
    let status =
        String::from_utf8_lossy(head).split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Ok((status, body))
}

/// The config text of a collector that a test runs in its own process: one UDP reader on an
/// ephemeral loopback port with a 4 MiB receive buffer, windows of `interval_ms` closed
/// `flush_delay_ms` after they end, reconnects after 20 ms to 200 ms. The test parses it
/// into `tessera_collector::Config`, turns the telemetry listener off and sets what else
/// it needs on the struct.
pub fn in_process_collector_config(interval_ms: u64, flush_delay_ms: u64) -> String {
    format!(
        "[udp]\nlisten = \"127.0.0.1:0\"\nreader_threads = 1\nrecv_buffer_bytes = 4194304\n\
         [aggregation]\ninterval_ms = {interval_ms}\nflush_delay_ms = {flush_delay_ms}\n\
         [forward]\nreconnect_min_ms = 20\nreconnect_max_ms = 200\n"
    )
}
