//! The only unsafe code of the collector: batched receive with `recvmmsg`
//! and the reuseport distribution program, both thin wrappers over libc.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Preallocated buffers for one `recvmmsg` call of up to `capacity` datagrams.
pub struct RecvBatch {
    buffers: Vec<u8>,
    datagram_bytes: usize,
    /// Distance between two datagrams' buffers (see [`buffer_stride`]).
    stride: usize,
    /// Kept alive (and never moved) because `headers` point into it.
    _iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
    received: usize,
}

// SAFETY: the raw pointers in `iovecs` and `headers` point into `buffers` and
// `iovecs`, which the batch owns and never reallocates after construction, so
// moving the batch to another thread moves their targets with it.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Buffers for `capacity` datagrams of at most `datagram_bytes` each.
    pub fn new(capacity: usize, datagram_bytes: usize) -> RecvBatch {
        let capacity = capacity.max(1);
        let stride = buffer_stride(datagram_bytes);
        let mut buffers = vec![0u8; capacity * stride];
        let mut iovecs: Vec<libc::iovec> = buffers
            .chunks_mut(stride)
            .map(|chunk| libc::iovec { iov_base: chunk.as_mut_ptr().cast(), iov_len: datagram_bytes })
            .collect();
        let headers = iovecs
            .iter_mut()
            .map(|iovec| {
                // SAFETY: mmsghdr is a plain C struct for which all-zero is a valid value.
                let mut header: libc::mmsghdr = unsafe { std::mem::zeroed() };
                header.msg_hdr.msg_iov = iovec;
                header.msg_hdr.msg_iovlen = 1;
                header
            })
            .collect();
        RecvBatch { buffers, datagram_bytes, stride, _iovecs: iovecs, headers, received: 0 }
    }

    /// Receives up to the batch's capacity of datagrams from `socket`,
    /// blocking for the first one (up to the socket's receive timeout) and
    /// taking whatever else is already queued. Returns how many arrived.
    pub fn recv(&mut self, socket: &impl AsRawFd) -> io::Result<usize> {
        self.received = 0;
        for header in &mut self.headers {
            header.msg_len = 0;
            header.msg_hdr.msg_flags = 0;
        }
        let fd: RawFd = socket.as_raw_fd();
        // SAFETY: `headers` holds `headers.len()` initialised mmsghdr whose
        // iovecs point at distinct `datagram_bytes`-long regions of
        // `buffers`, all alive for the duration of the call; MSG_WAITFORONE
        // makes the call return once at least one datagram arrived.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.headers.as_mut_ptr(),
                self.headers.len() as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.received = n as usize;
        Ok(self.received)
    }

    /// The datagrams of the last receive, each with whether the kernel
    /// truncated it (it was longer than the buffer).
    pub fn datagrams(&self) -> impl Iterator<Item = (&[u8], bool)> {
        self.headers[..self.received].iter().enumerate().map(|(i, header)| {
            let start = i * self.stride;
            let len = (header.msg_len as usize).min(self.datagram_bytes);
            let truncated = header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            (&self.buffers[start..start + len], truncated)
        })
    }

    /// Bytes of buffer per datagram.
    pub fn datagram_bytes(&self) -> usize {
        self.datagram_bytes
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.headers.len()
    }
}

/// Distance between the buffers of two datagrams of a batch.
///
/// Buffers `datagram_bytes` apart (64 KiB by default) start at nearly the
/// same offset modulo the caches' set stride, so the first kilobytes of
/// every datagram, the only ones a statsd datagram fills, would compete for
/// the same few cache sets: the kernel's copy of a batch would evict the
/// datagrams before the reader parses them. Padding the stride to a whole
/// number of pages plus 24 cache lines spreads them over the sets.
fn buffer_stride(datagram_bytes: usize) -> usize {
    datagram_bytes.next_multiple_of(4096) + 24 * 64
}

/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Attaches a classic BPF program to a `SO_REUSEPORT` group that sends each
/// datagram to a random socket of the group, so that one busy sender is
/// spread over every reader thread instead of hashed to one.
pub fn attach_random_reuseport_program(socket: &impl AsRawFd, group_size: u32) -> io::Result<()> {
    let ld_random = libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: (libc::SKF_AD_OFF + libc::SKF_AD_RANDOM) as u32,
    };
    let modulo = libc::sock_filter {
        code: (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: group_size.max(1),
    };
    let ret_a = libc::sock_filter { code: (libc::BPF_RET | libc::BPF_A) as u16, jt: 0, jf: 0, k: 0 };
    let mut program = [ld_random, modulo, ret_a];
    let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    // SAFETY: `fprog` points at `program`, alive for the call; the kernel
    // copies the program and validates it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    #[test]
    fn receives_a_batch_and_flags_truncation() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let target = receiver.local_addr().unwrap();
        sender.send_to(b"a:1|c", target).unwrap();
        sender.send_to(b"b:2|c\nc:3|c", target).unwrap();
        sender.send_to(&[b'x'; 100], target).unwrap();
        let mut batch = RecvBatch::new(8, 64);
        assert_eq!(batch.capacity(), 8);
        let mut got = Vec::new();
        while got.len() < 3 {
            batch.recv(&receiver).unwrap();
            got.extend(batch.datagrams().map(|(data, truncated)| (data.to_vec(), truncated)));
        }
        assert_eq!(got[0], (b"a:1|c".to_vec(), false));
        assert_eq!(got[1], (b"b:2|c\nc:3|c".to_vec(), false));
        assert_eq!((got[2].0.len(), got[2].1), (64, true));
    }
}
