//! Unix datagram socket intake, for clients that send statsd over a socket file.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use tessera_runtime::shutdown::Shutdown;

use super::reader::Reader;
use super::udp::RECV_TIMEOUT;
use tessera_core::clock::{now_ms, now_ns};

/// Binds the socket at `path`, replacing a stale socket file left by a
/// previous run, and gives the file `mode` when set; with `credentials`, each datagram
/// comes with its sender's PID (origin detection).
pub fn bind(path: &Path, mode: Option<u32>, credentials: bool) -> io::Result<UnixDatagram> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let socket = UnixDatagram::bind(path)?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    socket.set_read_timeout(Some(RECV_TIMEOUT))?;
    if credentials {
        super::sys::enable_sender_credentials(&socket)?;
    }
    Ok(socket)
}

/// The reader loop of the Unix socket.
pub fn read_loop(socket: UnixDatagram, mut reader: Reader, max_datagram_bytes: usize, shutdown: Shutdown) {
    let mut buffer = vec![0u8; max_datagram_bytes];
    let credentials = reader.tags_origins();
    loop {
        if shutdown.is_triggered() {
            reader.cut();
            return;
        }
        let received = if credentials {
            super::sys::recv_with_sender(&socket, &mut buffer)
        } else {
            socket.recv(&mut buffer).map(|len| (len, None))
        };
        match received {
            Ok((len, pid)) => {
                // One thread reads the socket, so the read time keeps the order.
                if credentials {
                    reader.ingest_from(&buffer[..len], now_ns(), pid);
                } else {
                    reader.ingest(&buffer[..len], now_ns());
                }
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
