//! Intake: the UDP, TCP and Unix-socket listeners.
//!
//! - [`udp`]: several reader threads, each with its own `SO_REUSEPORT`
//!   socket on the same address, batched receive with `recvmmsg`, a large
//!   receive buffer, kernel drops read back from `/proc/net/udp`;
//! - [`stream`]: newline-delimited statsd over TCP, many connections, fed
//!   to one line thread;
//! - [`unix`]: a Unix datagram socket read by its own thread.
//!
//! Each reader owns a [`crate::intake::reader::Reader`]; nothing on the receive
//! path is shared between readers.

pub mod reader;
pub mod stream;
pub mod sys;
pub mod udp;
pub mod unix;
