//! Intake: the UDP, TCP and Unix-socket listeners.
//!
//! - [`udp`]: several reader threads, each with its own `SO_REUSEPORT`
//!   socket on the same address, batched receive with `recvmmsg`, a large
//!   receive buffer, kernel drops read back from `/proc/net/udp`;
//! - [`stream`]: newline-delimited statsd over TCP, many connections, fed
//!   to one line thread;
//! - [`unix`]: a Unix datagram socket read by its own thread.
//!
//! Each reader owns a [`crate::worker::Worker`]; nothing on the receive
//! path is shared between readers.

pub mod stream;
pub mod sys;
pub mod udp;
pub mod unix;

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall clock, unix milliseconds.
#[inline]
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Wall clock, unix nanoseconds: the receive stamp of what stream and Unix
/// intake read, and of a datagram the kernel gave no stamp.
#[inline]
pub fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}
