//! UDP intake: one `SO_REUSEPORT` socket per reader thread.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tessera_core::clock::{now_ms, now_ns};
use tessera_runtime::shutdown::Shutdown;

use super::metrics::IntakeMetrics;
use super::reader::Reader;
use super::sys::{RecvBatch, attach_random_reuseport_program, enable_receive_stamps};
use crate::config::{Distribution, UdpConfig};

/// How long a blocked receive waits before the reader checks its window
/// and the shutdown flag.
pub const RECV_TIMEOUT: Duration = Duration::from_millis(50);

/// Binds `config.reader_threads` sockets on one address. The first socket
/// may bind port 0; the rest bind the port it got. Also says whether the
/// kernel stamps every socket's datagrams with their receive time.
pub fn bind(config: &UdpConfig, threads: usize) -> io::Result<(Vec<UdpSocket>, bool)> {
    let mut sockets: Vec<UdpSocket> = Vec::with_capacity(threads);
    let mut stamped = true;
    let mut address: SocketAddr = config.listen;
    for _ in 0..threads {
        let socket = Socket::new(Domain::for_address(address), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_port(true)?;
        if let Err(error) = socket.set_recv_buffer_size(config.recv_buffer_bytes) {
            tracing::warn!(%error, wanted = config.recv_buffer_bytes, "could not set the UDP receive buffer size");
        }
        socket.bind(&address.into())?;
        let socket: UdpSocket = socket.into();
        // Receive stamps order one sender's gauge lines across reader threads.
        if let Err(error) = enable_receive_stamps(&socket) {
            tracing::warn!(%error, "could not enable kernel receive timestamps; datagrams are stamped when read");
            stamped = false;
        }
        socket.set_read_timeout(Some(RECV_TIMEOUT))?;
        address = socket.local_addr()?;
        sockets.push(socket);
    }
    if threads > 1
        && config.distribute == Distribution::Random
        && let Err(error) = attach_random_reuseport_program(&sockets[0], threads as u32)
    {
        tracing::warn!(%error, "could not attach the reuseport program; the kernel will hash each sender to one reader");
    }
    Ok((sockets, stamped))
}

/// Receive buffer the kernel granted `socket` (Linux reports twice the
/// requested size, including its bookkeeping).
pub fn granted_recv_buffer(socket: &UdpSocket) -> usize {
    socket2::SockRef::from(socket).recv_buffer_size().unwrap_or(0)
}

/// The reader loop of one UDP socket; returns after `shutdown`, having cut
/// its last window.
pub fn read_loop(
    socket: UdpSocket,
    mut reader: Reader,
    batch_datagrams: usize,
    max_datagram_bytes: usize,
    shutdown: Shutdown,
) {
    let mut batch = RecvBatch::new(batch_datagrams, max_datagram_bytes);
    let mut errors_logged = 0u32;
    loop {
        if shutdown.is_triggered() {
            drain_queued(&socket, &mut batch, &mut reader);
            reader.cut();
            return;
        }
        match batch.recv(&socket) {
            Ok(_) => {
                ingest_batch(&batch, &mut reader);
                reader.publish_counts();
            }
            Err(error) if is_timeout(&error) => reader.tick(now_ms()),
            Err(error) => {
                reader.receive_error();
                if errors_logged < 10 {
                    tracing::warn!(%error, "udp receive failed");
                    errors_logged += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// On shutdown, takes what the kernel already queued so that it is not lost.
fn drain_queued(socket: &UdpSocket, batch: &mut RecvBatch, reader: &mut Reader) {
    if socket.set_nonblocking(true).is_err() {
        return;
    }
    while let Ok(received) = batch.recv(socket) {
        if received == 0 {
            break;
        }
        ingest_batch(batch, reader);
    }
    reader.publish_counts();
}

/// Folds every datagram of a batch, each with its kernel receive stamp (the
/// time of reading where the kernel gave none).
#[inline]
fn ingest_batch(batch: &RecvBatch, reader: &mut Reader) {
    let read_at_ns = now_ns();
    for datagram in batch.datagrams() {
        let stamp_ns = datagram.stamp_ns.unwrap_or(read_at_ns);
        if datagram.truncated {
            reader.ingest_truncated(datagram.bytes, stamp_ns);
        } else {
            reader.ingest(datagram.bytes, stamp_ns);
        }
    }
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted)
}

/// Kernel drop counters of UDP sockets, read from `/proc/net/udp{,6}`.
///
/// Sockets are matched by inode, so only this process's sockets count.
pub struct KernelDrops {
    inodes: Vec<u64>,
    last: Vec<u64>,
}

impl KernelDrops {
    /// Tracks the drops of `sockets`.
    pub fn new(sockets: &[UdpSocket]) -> KernelDrops {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let inodes = sockets
            .iter()
            .map(|socket| {
                std::fs::metadata(format!("/proc/self/fd/{}", socket.as_raw_fd())).map_or(0, |meta| meta.ino())
            })
            .collect::<Vec<_>>();
        KernelDrops { last: vec![0; inodes.len()], inodes }
    }

    /// Reads the current totals and calls `each(socket index, previous, total)`.
    pub fn poll(&mut self, mut each: impl FnMut(usize, u64, u64)) {
        for table in ["/proc/net/udp", "/proc/net/udp6"] {
            let Ok(text) = std::fs::read_to_string(table) else { continue };
            for (inode, drops) in text.lines().skip(1).filter_map(parse_proc_udp_line) {
                if let Some(index) = self.inodes.iter().position(|known| *known == inode) {
                    each(index, self.last[index], drops);
                    self.last[index] = self.last[index].max(drops);
                }
            }
        }
    }
}

/// Reads the kernel drop counters every second until `shutdown`, into
/// `kernel_drops_total{socket}`.
pub async fn poll_kernel_drops(mut drops: KernelDrops, metrics: IntakeMetrics, shutdown: Shutdown) {
    while !shutdown.is_triggered() {
        drops.poll(|socket, previous, total| metrics.record_kernel_drops(socket, previous, total));
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = shutdown.wait() => {}
        }
    }
}

/// `(inode, drops)` of one line of `/proc/net/udp`: inode is field 10, drops the last field.
fn parse_proc_udp_line(line: &str) -> Option<(u64, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let inode = fields.get(9)?.parse().ok()?;
    let drops = fields.last()?.parse().ok()?;
    Some((inode, drops))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_udp_lines() {
        let line = "  310: 0100007F:1FBD 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 123456 2 0000000000000000 42";
        assert_eq!(parse_proc_udp_line(line), Some((123_456, 42)));
        assert_eq!(parse_proc_udp_line("garbage"), None);
    }

    #[test]
    fn binds_several_reuseport_sockets_on_one_port() {
        let config = UdpConfig { listen: "127.0.0.1:0".parse().unwrap(), ..UdpConfig::default() };
        let (sockets, stamped) = bind(&config, 3).unwrap();
        assert!(stamped, "Linux stamps datagrams on request");
        let port = sockets[0].local_addr().unwrap().port();
        assert!(sockets.iter().all(|socket| socket.local_addr().unwrap().port() == port));
        let mut drops = KernelDrops::new(&sockets);
        // The kernel writes /proc/net/udp a page at a time, so a line can be
        // missed while other sockets come and go (tests run in parallel):
        // every socket must be found within a few reads.
        let mut seen = [false; 3];
        for _ in 0..20 {
            drops.poll(|index, _, _| seen[index] = true);
            if seen.iter().all(|found| *found) {
                break;
            }
        }
        assert_eq!(seen, [true; 3], "every socket is found in /proc/net/udp");
    }
}
