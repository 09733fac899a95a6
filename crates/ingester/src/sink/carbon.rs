//! The Graphite target's transport: carbon's plaintext or pickle protocol over one
//! persistent TCP connection, with a resend window.
//!
//! A request's samples each hold one series' lines, rendered at ingest time
//! ([`crate::admit::lines`]); the sink writes them to carbon (`path value timestamp\n`,
//! or as pickle frames of at most [`PICKLE_POINTS_PER_FRAME`] points when `protocol =
//! "pickle"`). Writes are serialized on one connection, in the order the pool hands them
//! over.
//!
//! **Nothing lost when carbon restarts.** Carbon's protocols have no acknowledgement:
//! what the kernel took may still die in carbon-cache's memory, before it reaches a whisper
//! file. So the sink keeps what it wrote in the last `resend_window` (at most
//! `resend_window_bytes`), and after any break — a write that failed, or a connection the
//! peer closed, seen before the next write — it opens a new connection and sends the whole
//! window again before anything new. Whisper keeps one value per (path, slot) and a later
//! write replaces it, so a resent line writes the value already there, or the one that
//! was lost. A window evicted by size before its time is counted
//! (`tessera_ingester_carbon_window_evicted_bytes_total`): a break then may lose what left
//! it. A refused connection or a failed write answers the request retryable: it stays
//! queued, and the pool backs off and sends it again, as for any store outage.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::{Sink, SinkError, SinkRequest};

/// Points in one pickle frame (carbon's relays send 500; its receiver takes frames up to
/// `PICKLE_RECEIVER_MAX_LENGTH`, 1 MiB by default).
pub const PICKLE_POINTS_PER_FRAME: usize = 500;

/// Carbon's two receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// `path value timestamp\n` (carbon's `LINE_RECEIVER_PORT`, 2003).
    #[default]
    Plaintext,
    /// Length-prefixed pickled lists of `(path, (timestamp, value))` (`PICKLE_RECEIVER_PORT`, 2004).
    Pickle,
}

/// Settings of a Graphite target's connection.
#[derive(Debug, Clone)]
pub struct CarbonSettings {
    /// `host:port` of carbon's receiver.
    pub address: String,
    /// Plaintext or pickle.
    pub protocol: Protocol,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// How long one write may take.
    pub write_timeout: Duration,
    /// What was written this recently is sent again after a break.
    pub resend_window: Duration,
    /// The window's most bytes (the oldest go first).
    pub resend_window_bytes: usize,
}

tessera_runtime::labelled_metrics! {
    /// The Graphite targets' metrics.
    pub struct CarbonFamilies;
    /// One Graphite target's connection.
    #[derive(Default)]
    pub struct CarbonMetrics by tessera_runtime::telemetry::labels::ByTarget {
        /// Lines written to carbon (resent ones included), per target
        pub lines: Counter = carbon_lines,
        /// Connections to carbon opened, per target
        pub connections: Counter = carbon_connections,
        /// Connection attempts and writes that failed (the request stays queued), per target
        pub errors: Counter = carbon_errors,
        /// Times the resend window was sent again after a break, per target
        pub resends: Counter = carbon_resends,
        /// Lines sent again after a break, per target
        pub resent_lines: Counter = carbon_resent_lines,
        /// Bytes in the resend window, per target
        pub window_bytes: Gauge = carbon_window_bytes,
        /// Bytes that left the resend window by its size before its time (a break then may lose them), per
        /// target
        pub window_evicted_bytes: Counter = carbon_window_evicted_bytes,
    }
}

/// A Graphite target; see the [module docs](self).
pub struct CarbonSink {
    settings: CarbonSettings,
    metrics: CarbonMetrics,
    state: Mutex<State>,
}

/// One write: what was sent, when, and how many lines it held.
struct Sent {
    at: Instant,
    bytes: Vec<u8>,
    lines: u64,
}

#[derive(Default)]
struct State {
    stream: Option<TcpStream>,
    /// A connection was open before: the next one follows a break and resends the window.
    connected_before: bool,
    window: VecDeque<Sent>,
    window_bytes: usize,
}

impl CarbonSink {
    /// A sink writing to `settings.address`; connects at the first write.
    pub fn new(settings: CarbonSettings, metrics: CarbonMetrics) -> CarbonSink {
        CarbonSink { settings, metrics, state: Mutex::new(State::default()) }
    }

    /// The bytes of `request` in the target's protocol, and its line count.
    fn encode(&self, request: &SinkRequest) -> (Vec<u8>, u64) {
        let size = request.samples.iter().map(|sample| sample.lines.len()).sum();
        let mut text = Vec::with_capacity(size);
        for sample in &request.samples {
            text.extend_from_slice(&sample.lines);
        }
        let lines = text.iter().filter(|byte| **byte == b'\n').count() as u64;
        match self.settings.protocol {
            Protocol::Plaintext => (text, lines),
            Protocol::Pickle => (pickle::frames(&text), lines),
        }
    }

    /// Opens a connection, resending the window when one was open before.
    async fn connect(&self, state: &mut State) -> Result<(), SinkError> {
        let address = &self.settings.address;
        let stream = match tokio::time::timeout(self.settings.connect_timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(self.failed("network", format!("cannot connect to carbon at {address}: {error}")));
            }
            Err(_) => return Err(self.failed("timeout", format!("connecting to carbon at {address} timed out"))),
        };
        let _ = stream.set_nodelay(true);
        self.metrics.connections.inc();
        let mut stream = stream;
        if state.connected_before && !state.window.is_empty() {
            let lines: u64 = state.window.iter().map(|sent| sent.lines).sum();
            tracing::info!(carbon = %address, lines, bytes = state.window_bytes, "reconnected to carbon; sending the resend window again");
            for sent in &state.window {
                self.write_all(&mut stream, &sent.bytes).await?;
            }
            self.metrics.resends.inc();
            self.metrics.resent_lines.inc_by(lines);
            self.metrics.lines.inc_by(lines);
        }
        state.connected_before = true;
        state.stream = Some(stream);
        Ok(())
    }

    async fn write_all(&self, stream: &mut TcpStream, bytes: &[u8]) -> Result<(), SinkError> {
        match tokio::time::timeout(self.settings.write_timeout, stream.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                Err(self.failed("network", format!("writing to carbon at {} failed: {error}", self.settings.address)))
            }
            Err(_) => Err(self.failed("timeout", format!("writing to carbon at {} timed out", self.settings.address))),
        }
    }

    fn failed(&self, reason: &'static str, message: String) -> SinkError {
        self.metrics.errors.inc();
        SinkError::Retryable { reason, message, overloaded: reason == "timeout" }
    }

    /// Forgets what is older than the window, and the oldest past its size.
    fn trim(&self, state: &mut State, now: Instant) {
        while let Some(oldest) = state.window.front() {
            let expired = now.duration_since(oldest.at) > self.settings.resend_window;
            let oversized = state.window_bytes > self.settings.resend_window_bytes;
            if !expired && !oversized {
                break;
            }
            if !expired {
                self.metrics.window_evicted_bytes.inc_by(oldest.bytes.len() as u64);
            }
            state.window_bytes -= oldest.bytes.len();
            state.window.pop_front();
        }
        self.metrics.window_bytes.set(state.window_bytes as i64);
    }
}

/// Whether carbon closed `stream` (it never sends anything, so readable means closed).
fn closed_by_peer(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(_) => true,
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    }
}

impl Sink for CarbonSink {
    fn kind(&self) -> &'static str {
        "graphite"
    }

    async fn write(&self, request: &SinkRequest) -> Result<(), SinkError> {
        let (bytes, lines) = self.encode(request);
        if bytes.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().await;
        let now = Instant::now();
        self.trim(&mut state, now);
        if state.stream.as_ref().is_some_and(closed_by_peer) {
            tracing::warn!(carbon = %self.settings.address, "carbon closed the connection; reconnecting");
            state.stream = None;
        }
        if state.stream.is_none() {
            self.connect(&mut state).await.inspect_err(|_| state.stream = None)?;
        }
        let Some(stream) = state.stream.as_mut() else { unreachable!("connected above") };
        let written = self.write_all(stream, &bytes).await;
        if written.is_err() {
            state.stream = None;
            return written;
        }
        self.metrics.lines.inc_by(lines);
        state.window_bytes += bytes.len();
        state.window.push_back(Sent { at: now, bytes, lines });
        self.trim(&mut state, now);
        Ok(())
    }

    async fn close(&self) {
        let mut state = self.state.lock().await;
        if let Some(mut stream) = state.stream.take() {
            let _ = stream.shutdown().await;
        }
    }
}

/// Carbon's pickle frames: a 4-byte big-endian length, then a pickled list of
/// `(path, (timestamp, value))` tuples (protocol 2, the opcodes carbon's safe unpickler
/// takes: no globals).
mod pickle {
    use super::PICKLE_POINTS_PER_FRAME;

    /// The frames of plaintext `text` (`path value timestamp` lines; others skipped).
    pub fn frames(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len() + text.len() / 4);
        let points: Vec<(&[u8], f64, i64)> = text.split(|byte| *byte == b'\n').filter_map(parse_line).collect();
        for chunk in points.chunks(PICKLE_POINTS_PER_FRAME) {
            let start = out.len();
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&[0x80, 2, b']', b'(']); // PROTO 2, EMPTY_LIST, MARK
            for &(path, value, timestamp) in chunk {
                out.push(b'X'); // BINUNICODE
                out.extend_from_slice(&(path.len() as u32).to_le_bytes());
                out.extend_from_slice(path);
                match i32::try_from(timestamp) {
                    Ok(timestamp) => {
                        out.push(b'J'); // BININT
                        out.extend_from_slice(&timestamp.to_le_bytes());
                    }
                    Err(_) => {
                        out.push(b'G'); // BINFLOAT
                        out.extend_from_slice(&(timestamp as f64).to_be_bytes());
                    }
                }
                out.push(b'G');
                out.extend_from_slice(&value.to_be_bytes());
                out.extend_from_slice(&[0x86, 0x86]); // TUPLE2 (timestamp, value), TUPLE2 (path, …)
            }
            out.extend_from_slice(b"e."); // APPENDS, STOP
            let length = (out.len() - start - 4) as u32;
            out[start..start + 4].copy_from_slice(&length.to_be_bytes());
        }
        out
    }

    fn parse_line(line: &[u8]) -> Option<(&[u8], f64, i64)> {
        let mut fields = line.split(|byte| *byte == b' ');
        let path = fields.next().filter(|path| !path.is_empty())?;
        let value = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
        let timestamp = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
        Some((path, value, timestamp))
    }
}

#[cfg(test)]
mod tests;
