//! One sender: a thread with its own socket that hands its batches of
//! datagrams to the kernel, paced by a token bucket.
//!
//! - UDP and Unix datagram sockets are connected and sent to with
//!   `sendmmsg` ([`super::sendmmsg`]); TCP gets whole batches written, every
//!   line ending in `\n`.
//! - Transient errors (`ENOBUFS`, `EAGAIN` after the 100 ms send timeout,
//!   `ECONNREFUSED` from an earlier ICMP error, `EINTR`) are counted by
//!   reason and the rest of the batch is retried, so the lines handed to the
//!   kernel are always a prefix of the sender's fixed order and are counted
//!   exactly. Any other error ends the sender.
//! - The pacer lets a batch go once the lines sent so far are within the
//!   rate times the elapsed time, sleeping (or, under 100 µs, yielding) until
//!   then; batches are sized to about a millisecond of lines so the pace is
//!   smooth at low rates and exact on average at high ones.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::sendmmsg::BatchSender;
use super::workload::{Burst, LineSource, Workload};

/// How long a blocked send waits before the sender checks whether to stop.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

/// Most datagrams per batch.
const MAX_BATCH_DATAGRAMS: usize = 64;

/// The time's worth of lines a paced batch holds.
const PACED_BATCH: Duration = Duration::from_millis(1);

/// Most credit a paced sender keeps after falling behind.
const MAX_PACE_CREDIT: Duration = Duration::from_millis(10);

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// UDP datagrams to this address.
    Udp(SocketAddr),
    /// Datagrams to this Unix datagram socket.
    Unix(PathBuf),
    /// Newline-terminated lines over a TCP connection to this address.
    Tcp(SocketAddr),
}

impl Target {
    /// `udp`, `unix` or `tcp`.
    pub fn transport(&self) -> &'static str {
        match self {
            Target::Udp(_) => "udp",
            Target::Unix(_) => "unix",
            Target::Tcp(_) => "tcp",
        }
    }

    /// The address or path.
    pub fn address(&self) -> String {
        match self {
            Target::Udp(address) | Target::Tcp(address) => address.to_string(),
            Target::Unix(path) => path.display().to_string(),
        }
    }
}

/// One sender's open socket.
#[derive(Debug)]
pub enum Connection {
    /// A connected UDP or Unix datagram socket.
    Datagram(OwnedFd),
    /// A TCP connection.
    Stream(TcpStream),
}

impl Connection {
    /// Opens a socket to `target`; for UDP with its own ephemeral source
    /// port and, when given, a send buffer of `send_buffer_bytes`.
    pub fn open(target: &Target, send_buffer_bytes: Option<usize>) -> io::Result<Connection> {
        match target {
            Target::Udp(address) => {
                let socket = socket2::Socket::new(
                    socket2::Domain::for_address(*address),
                    socket2::Type::DGRAM,
                    Some(socket2::Protocol::UDP),
                )?;
                if let Some(bytes) = send_buffer_bytes {
                    socket.set_send_buffer_size(bytes)?;
                }
                socket.set_write_timeout(Some(SEND_TIMEOUT))?;
                socket.connect(&(*address).into())?;
                Ok(Connection::Datagram(socket.into()))
            }
            Target::Unix(path) => {
                let socket = UnixDatagram::unbound()?;
                if let Some(bytes) = send_buffer_bytes {
                    socket2::SockRef::from(&socket).set_send_buffer_size(bytes)?;
                }
                socket.set_write_timeout(Some(SEND_TIMEOUT))?;
                socket.connect(path)?;
                Ok(Connection::Datagram(socket.into()))
            }
            Target::Tcp(address) => {
                let stream = TcpStream::connect(address)?;
                if let Some(bytes) = send_buffer_bytes {
                    socket2::SockRef::from(&stream).set_send_buffer_size(bytes)?;
                }
                stream.set_write_timeout(Some(SEND_TIMEOUT))?;
                Ok(Connection::Stream(stream))
            }
        }
    }
}

/// Why a send failed for a moment (it is retried): the keys of `send_errors_by_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendErrorReason {
    /// `ENOBUFS`: the kernel was out of buffer space.
    NoBufferSpace,
    /// `EAGAIN`: the socket stayed full for the send timeout.
    WouldBlock,
    /// `ECONNREFUSED`: nothing listened at the target (an earlier ICMP error).
    ConnectionRefused,
    /// `EINTR`: a signal interrupted the send.
    Interrupted,
}

impl SendErrorReason {
    /// Every reason, in report order.
    pub const ALL: [SendErrorReason; 4] = [
        SendErrorReason::NoBufferSpace,
        SendErrorReason::WouldBlock,
        SendErrorReason::ConnectionRefused,
        SendErrorReason::Interrupted,
    ];

    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            SendErrorReason::NoBufferSpace => "no_buffer_space",
            SendErrorReason::WouldBlock => "would_block",
            SendErrorReason::ConnectionRefused => "connection_refused",
            SendErrorReason::Interrupted => "interrupted",
        }
    }

    /// The reason of a transient `error`; `None` when it is not transient.
    fn of(error: &io::Error) -> Option<SendErrorReason> {
        match error.raw_os_error()? {
            libc::ENOBUFS => Some(SendErrorReason::NoBufferSpace),
            code if code == libc::EAGAIN || code == libc::EWOULDBLOCK => Some(SendErrorReason::WouldBlock),
            libc::ECONNREFUSED => Some(SendErrorReason::ConnectionRefused),
            libc::EINTR => Some(SendErrorReason::Interrupted),
            _ => None,
        }
    }
}

/// Transient send errors, per reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendErrors([u64; SendErrorReason::ALL.len()]);

impl SendErrors {
    /// Every reason with its count.
    pub fn by_reason(&self) -> impl Iterator<Item = (SendErrorReason, u64)> {
        SendErrorReason::ALL.into_iter().zip(self.0)
    }

    /// All of them.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Adds `other`.
    pub fn add(&mut self, other: &SendErrors) {
        for (count, more) in self.0.iter_mut().zip(other.0) {
            *count += more;
        }
    }

    /// Counts `error` when it is transient; `false` when it is not.
    fn count(&mut self, error: &io::Error) -> bool {
        let Some(reason) = SendErrorReason::of(error) else { return false };
        self.0[reason as usize] += 1;
        true
    }
}

/// What one sender has done so far: exact in its final [`SenderReport`],
/// published after each batch for `--progress`.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct SenderProgress {
    /// Lines handed to the kernel.
    pub lines: AtomicU64,
    /// Datagrams (for TCP, packed chunks) handed to the kernel.
    pub datagrams: AtomicU64,
    /// Payload bytes handed to the kernel.
    pub bytes: AtomicU64,
    /// Transient send errors.
    pub errors: AtomicU64,
}

/// What one sender did.
#[derive(Debug, Default)]
pub struct SenderReport {
    /// Lines handed to the kernel.
    pub lines: u64,
    /// Datagrams (for TCP, packed chunks) handed to the kernel.
    pub datagrams: u64,
    /// Payload bytes handed to the kernel.
    pub bytes: u64,
    /// Transient send errors, each followed by a retry.
    pub errors: SendErrors,
    /// Whether its whole cycle was formatted up front.
    pub precomputed: bool,
    /// The error that ended it early, if any.
    pub failure: Option<io::Error>,
}

/// How one sender runs.
#[derive(Debug, Clone)]
pub struct SenderPlan {
    /// The series it sends.
    pub series: Range<u64>,
    /// Its share of the rate; flat out when `None`.
    pub lines_per_sec: Option<f64>,
    /// Lines to send before stopping.
    pub total_lines: Option<u64>,
    /// How long to send before stopping.
    pub duration: Option<Duration>,
    /// Memory its precomputed cycle may take.
    pub max_cycle_bytes: usize,
}

/// Runs one sender: formats its lines, waits at `start` for the others,
/// then sends until its plan is done or `stop` is set.
pub fn run_sender(
    workload: &Arc<Workload>,
    plan: &SenderPlan,
    mut connection: Connection,
    start: &Barrier,
    stop: &AtomicBool,
    progress: &SenderProgress,
) -> SenderReport {
    let mut source = LineSource::new(workload, plan.series.clone(), plan.max_cycle_bytes);
    let mut report = SenderReport { precomputed: source.is_precomputed(), ..SenderReport::default() };
    let mut mmsg = BatchSender::default();
    start.wait();
    let started = Instant::now();
    let deadline = plan.duration.map(|duration| started + duration);
    let mut pacer = plan.lines_per_sec.map(|rate| Pacer::new(rate, started));
    let paced_batch_lines = plan.lines_per_sec.map(|rate| (rate * PACED_BATCH.as_secs_f64()).max(1.0));
    let mut max_datagrams = if paced_batch_lines.is_some() { 1 } else { MAX_BATCH_DATAGRAMS };
    loop {
        let lines_left = plan.total_lines.map_or(u64::MAX, |total| total - report.lines);
        if lines_left == 0 || stop.load(Ordering::Relaxed) || deadline.is_some_and(|end| Instant::now() >= end) {
            break;
        }
        let batch = source.next_batch(max_datagrams, lines_left);
        if let Some(pacer) = &mut pacer
            && !pacer.wait_until_allowed(report.lines, deadline, stop)
        {
            break;
        }
        let result = match &mut connection {
            Connection::Datagram(socket) => send_datagrams(&mut mmsg, socket, batch, stop, &mut report),
            Connection::Stream(stream) => write_stream(stream, batch, stop, &mut report),
        };
        progress.lines.store(report.lines, Ordering::Relaxed);
        progress.datagrams.store(report.datagrams, Ordering::Relaxed);
        progress.bytes.store(report.bytes, Ordering::Relaxed);
        progress.errors.store(report.errors.total(), Ordering::Relaxed);
        if let Err(error) = result {
            report.failure = Some(error);
            break;
        }
        if let Some(target_lines) = paced_batch_lines {
            let lines_per_datagram = batch.lines as f64 / batch.datagrams.len().max(1) as f64;
            max_datagrams = ((target_lines / lines_per_datagram) as usize).clamp(1, MAX_BATCH_DATAGRAMS);
        }
    }
    report
}

/// Sends every datagram of `batch`, retrying after transient errors, until
/// done or `stop` is set.
fn send_datagrams(
    mmsg: &mut BatchSender,
    socket: &OwnedFd,
    batch: Burst<'_>,
    stop: &AtomicBool,
    report: &mut SenderReport,
) -> io::Result<()> {
    let mut next = 0;
    while next < batch.datagrams.len() {
        let pending = &batch.datagrams[next..];
        match mmsg.send(socket.as_fd(), pending.iter().map(|datagram| datagram.payload(batch.bytes))) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "sendmmsg sent no datagram")),
            Ok(sent) => {
                for datagram in &pending[..sent] {
                    report.lines += u64::from(datagram.lines);
                    report.bytes += u64::from(datagram.len) - 1;
                }
                report.datagrams += sent as u64;
                next += sent;
            }
            Err(error) if report.errors.count(&error) => {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::yield_now();
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Writes `batch` to the stream, retrying after transient errors. When
/// `stop` is set mid-way it still finishes the line it is in, so the
/// receiver never sees half a line.
fn write_stream(
    stream: &mut TcpStream,
    batch: Burst<'_>,
    stop: &AtomicBool,
    report: &mut SenderReport,
) -> io::Result<()> {
    let (Some(first), Some(last)) = (batch.datagrams.first(), batch.datagrams.last()) else {
        return Ok(());
    };
    let region = &batch.bytes[first.start..last.end()];
    let mut end = region.len();
    let mut written = 0;
    let mut failure = None;
    while written < end {
        match stream.write(&region[written..end]) {
            Ok(0) => {
                failure = Some(io::Error::from(io::ErrorKind::WriteZero));
                break;
            }
            Ok(count) => written += count,
            Err(error) if report.errors.count(&error) => {
                if stop.load(Ordering::Relaxed) {
                    end = line_end_at_or_after(region, written);
                }
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    if written == region.len() {
        report.lines += batch.lines;
        report.datagrams += batch.datagrams.len() as u64;
    } else {
        report.lines += region[..written].iter().filter(|byte| **byte == b'\n').count() as u64;
        let region_start = first.start;
        report.datagrams +=
            batch.datagrams.iter().filter(|datagram| datagram.end() - region_start <= written).count() as u64;
    }
    report.bytes += written as u64;
    failure.map_or(Ok(()), Err)
}

/// `at` when it starts a line, else one past the end of the line holding it.
fn line_end_at_or_after(region: &[u8], at: usize) -> usize {
    if at == 0 || region[at - 1] == b'\n' {
        return at;
    }
    region[at..].iter().position(|byte| *byte == b'\n').map_or(region.len(), |offset| at + offset + 1)
}

/// A token bucket over lines: `lines_per_sec` of credit per second, at
/// most [`MAX_PACE_CREDIT`] of it saved up.
#[derive(Debug)]
struct Pacer {
    lines_per_sec: f64,
    origin: Instant,
    lines_at_origin: f64,
    max_credit_lines: f64,
}

impl Pacer {
    fn new(lines_per_sec: f64, origin: Instant) -> Pacer {
        let max_credit_lines = (lines_per_sec * MAX_PACE_CREDIT.as_secs_f64()).max(1.0);
        Pacer { lines_per_sec, origin, lines_at_origin: 0.0, max_credit_lines }
    }

    /// Waits until `sent` lines are within the credit, so the next batch may
    /// go. `false` when `deadline` passes or `stop` is set first.
    fn wait_until_allowed(&mut self, sent: u64, deadline: Option<Instant>, stop: &AtomicBool) -> bool {
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|end| now >= end) || stop.load(Ordering::Relaxed) {
                return false;
            }
            let allowed = self.lines_at_origin + self.lines_per_sec * (now - self.origin).as_secs_f64();
            let behind = sent as f64 - allowed;
            if behind <= 0.0 {
                if -behind > self.max_credit_lines {
                    self.origin = now;
                    self.lines_at_origin = sent as f64 + self.max_credit_lines;
                }
                return true;
            }
            let wait = Duration::from_secs_f64(behind / self.lines_per_sec);
            if wait >= Duration::from_micros(100) {
                std::thread::sleep(wait.min(SEND_TIMEOUT));
            } else {
                std::thread::yield_now();
            }
        }
    }
}
