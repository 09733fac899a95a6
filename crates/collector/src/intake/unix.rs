//! Unix datagram socket intake, for clients that send statsd over a socket file.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use tessera_runtime::shutdown::Shutdown;

use super::reader::Reader;
use super::udp::RECV_TIMEOUT;
use tessera_core::clock::{now_ms, now_ns};

/// Binds the socket at `path`, replacing a stale socket file left by a
/// previous run.
pub fn bind(path: &Path) -> io::Result<UnixDatagram> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let socket = UnixDatagram::bind(path)?;
    socket.set_read_timeout(Some(RECV_TIMEOUT))?;
    Ok(socket)
}

/// The reader loop of the Unix socket.
pub fn read_loop(socket: UnixDatagram, mut reader: Reader, max_datagram_bytes: usize, shutdown: Shutdown) {
    let mut buffer = vec![0u8; max_datagram_bytes];
    loop {
        if shutdown.is_triggered() {
            reader.cut();
            return;
        }
        match socket.recv(&mut buffer) {
            Ok(len) => {
                // One thread reads the socket, so the read time keeps the order.
                reader.ingest(&buffer[..len], now_ns());
                reader.publish_counts();
            }
            Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                reader.tick(now_ms());
            }
            Err(error) => {
                reader.receive_error();
                tracing::warn!(%error, "unix socket receive failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}
