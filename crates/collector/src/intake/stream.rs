//! TCP intake: newline-delimited statsd over many connections.
//!
//! Each connection is a tokio task that cuts its byte stream at newlines
//! and hands chunks of whole lines to one line thread (a [`Reader`]) through
//! a bounded channel; when the channel is full the task stops reading, so a
//! fast client is slowed by TCP flow control instead of growing memory. A
//! line longer than the limit is skipped up to its newline and counted; the
//! last line of a connection is taken at close even without a newline.

use std::net::SocketAddr;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use tessera_core::parse::RejectReason;
use tessera_runtime::RateLimitedLog;
use tessera_runtime::shutdown::Shutdown;
use tessera_wire::AcceptSettings;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::metrics::{BatchCounts, ListenerMetrics};
use super::reader::Reader;
use super::udp::RECV_TIMEOUT;
use tessera_core::clock::{now_ms, now_ns};

/// Chunks of whole lines waiting for the line thread.
pub const CHANNEL_CHUNKS: usize = 1024;

/// Settings of the TCP listener.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// Longest line accepted.
    pub max_line_bytes: usize,
    /// Most concurrent connections; more are refused.
    pub max_connections: usize,
}

static CONNECTION_LOG: RateLimitedLog = RateLimitedLog::new("collector.tcp_connection", 5);

/// Accepts connections until `shutdown`, feeding `lines`; over `max_connections` a new
/// connection is closed at once and counted (`frame_errors_total{reason="too_many_connections"}`).
/// Statsd clients may keep a connection idle for long, so there is no idle deadline: a
/// connection is bounded by the cap and by the memory it may hold (`max_line_bytes`).
pub async fn accept_loop(
    listener: TcpListener,
    lines: Sender<Vec<u8>>,
    settings: StreamSettings,
    metrics: ListenerMetrics,
    shutdown: Shutdown,
) {
    let accept = AcceptSettings { max_connections: settings.max_connections, peer: "statsd client" };
    let context = (lines, settings, metrics.clone(), shutdown.clone());
    tessera_wire::accept_loop(listener, accept, metrics, &CONNECTION_LOG, shutdown, context, serve).await;
}

/// What every connection's task holds.
type Context = (Sender<Vec<u8>>, StreamSettings, ListenerMetrics, Shutdown);

/// Reads one connection's lines until it ends.
async fn serve(stream: TcpStream, peer: SocketAddr, (lines, settings, metrics, shutdown): Context) {
    if let Err(error) = read_connection(stream, &lines, &settings, &metrics, &shutdown).await {
        tracing::debug!(%peer, %error, "tcp connection ended with an error");
    }
}

async fn read_connection(
    mut stream: TcpStream,
    lines: &Sender<Vec<u8>>,
    settings: &StreamSettings,
    metrics: &ListenerMetrics,
    shutdown: &Shutdown,
) -> std::io::Result<()> {
    let mut buffer: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut skipping_long_line = false;
    loop {
        if buffer.capacity() - buffer.len() < 16 * 1024 {
            buffer.reserve(64 * 1024);
        }
        let read = tokio::select! {
            read = stream.read_buf(&mut buffer) => read?,
            () = shutdown.wait() => 0,
        };
        if read == 0 {
            // Connection closed: the last line counts even without a newline.
            if !buffer.is_empty() && !skipping_long_line {
                send_chunk(lines, std::mem::take(&mut buffer)).await;
            }
            return Ok(());
        }
        if skipping_long_line {
            match memchr::memchr(b'\n', &buffer) {
                Some(newline) => {
                    buffer.drain(..=newline);
                    skipping_long_line = false;
                }
                None => {
                    buffer.clear();
                    continue;
                }
            }
        }
        match memchr::memrchr(b'\n', &buffer) {
            Some(last_newline) => {
                let rest = buffer.split_off(last_newline + 1);
                let chunk = std::mem::replace(&mut buffer, rest);
                send_chunk(lines, chunk).await;
            }
            None if buffer.len() > settings.max_line_bytes => {
                let mut counts = BatchCounts { datagrams: 1, bytes: buffer.len() as u64, ..BatchCounts::default() };
                counts.rejected[RejectReason::LineTooLong.index()] = 1;
                metrics.add(&counts);
                buffer.clear();
                skipping_long_line = true;
            }
            None => {}
        }
    }
}

/// Hands a chunk to the line thread, waiting (and so not reading the
/// socket) while the channel is full.
async fn send_chunk(lines: &Sender<Vec<u8>>, mut chunk: Vec<u8>) {
    loop {
        match lines.try_send(chunk) {
            Ok(()) => return,
            Err(TrySendError::Full(back)) => {
                chunk = back;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

/// The line thread: parses chunks from every TCP connection into its reader.
pub fn line_loop(lines: Receiver<Vec<u8>>, mut reader: Reader, shutdown: Shutdown) {
    loop {
        match lines.recv_timeout(RECV_TIMEOUT) {
            Ok(chunk) => {
                // One thread reads every connection's chunks in order, so the
                // read time orders one connection's lines.
                reader.ingest(&chunk, now_ns());
                reader.publish_counts();
            }
            Err(RecvTimeoutError::Timeout) => {
                if shutdown.is_triggered() && lines.is_empty() {
                    reader.cut();
                    return;
                }
                reader.tick(now_ms());
            }
            Err(RecvTimeoutError::Disconnected) => {
                reader.cut();
                return;
            }
        }
    }
}

/// Binds the TCP listener.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}
