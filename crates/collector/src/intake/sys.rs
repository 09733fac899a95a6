//! The only unsafe code of the collector: batched receive with `recvmmsg`
//! (with each datagram's kernel receive stamp), a Unix datagram with its sender's
//! credentials, the reuseport distribution
//! program, and the flusher's thread priority, thin wrappers over libc.
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
    /// Kept alive for the same reason: one control buffer per datagram, for its `SCM_TIMESTAMPNS`; u64s so
    /// that every buffer is aligned for a `cmsghdr`.
    _controls: Vec<u64>,
    headers: Vec<libc::mmsghdr>,
    received: usize,
}

/// Words of control buffer per datagram: room for one `SCM_TIMESTAMPNS`
/// message (a `cmsghdr` and a `timespec`, 32 bytes on 64-bit Linux) and
/// one more of any size the kernel might add.
const CONTROL_WORDS: usize = 8;

/// One datagram of a [`RecvBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Its bytes (cut at the buffer's size when truncated).
    pub bytes: &'a [u8],
    /// Whether the kernel truncated it (it was longer than the buffer).
    pub truncated: bool,
    /// When the kernel received it, unix nanoseconds, if the socket has
    /// receive stamps on ([`enable_receive_stamps`]).
    pub stamp_ns: Option<i64>,
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
        let mut controls = vec![0u64; capacity * CONTROL_WORDS];
        let headers = iovecs
            .iter_mut()
            .zip(controls.chunks_mut(CONTROL_WORDS))
            .map(|(iovec, control)| {
                // SAFETY: mmsghdr is a plain C struct for which all-zero is a valid value.
                let mut header: libc::mmsghdr = unsafe { std::mem::zeroed() };
                header.msg_hdr.msg_iov = iovec;
                header.msg_hdr.msg_iovlen = 1;
                header.msg_hdr.msg_control = control.as_mut_ptr().cast();
                header
            })
            .collect();
        RecvBatch { buffers, datagram_bytes, stride, _iovecs: iovecs, _controls: controls, headers, received: 0 }
    }

    /// Receives up to the batch's capacity of datagrams from `socket`,
    /// blocking for the first one (up to the socket's receive timeout) and
    /// taking whatever else is already queued. Returns how many arrived.
    pub fn recv(&mut self, socket: &impl AsRawFd) -> io::Result<usize> {
        self.received = 0;
        for header in &mut self.headers {
            header.msg_len = 0;
            header.msg_hdr.msg_flags = 0;
            // The kernel writes back how much control data it stored.
            header.msg_hdr.msg_controllen = CONTROL_WORDS * 8;
        }
        let fd: RawFd = socket.as_raw_fd();
        // SAFETY: `headers` holds `headers.len()` initialised mmsghdr whose
        // iovecs point at distinct `datagram_bytes`-long regions of
        // `buffers` and whose controls point at distinct `CONTROL_WORDS`
        // regions of `controls`, all alive for the duration of the call; MSG_WAITFORONE
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

    /// The datagrams of the last receive.
    pub fn datagrams(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.headers[..self.received].iter().enumerate().map(|(i, header)| {
            let start = i * self.stride;
            let len = (header.msg_len as usize).min(self.datagram_bytes);
            let truncated = header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            Datagram { bytes: &self.buffers[start..start + len], truncated, stamp_ns: receive_stamp(&header.msg_hdr) }
        })
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.headers.len()
    }
}

/// The `SCM_TIMESTAMPNS` stamp among a received message's control
/// messages, unix nanoseconds.
#[inline]
fn receive_stamp(message: &libc::msghdr) -> Option<i64> {
    if message.msg_controllen == 0 {
        return None;
    }
    // SAFETY: `message` was filled by recvmmsg: its control pointer and the
    // length the kernel wrote back describe initialised control messages
    // inside the batch's `controls`; CMSG_FIRSTHDR and CMSG_NXTHDR stay
    // within that length, and an SCM_TIMESTAMPNS message carries a timespec
    // (read unaligned, as the CMSG_DATA of any message may be).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(message);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS {
                let stamp = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::timespec>());
                return Some(stamp.tv_sec.saturating_mul(1_000_000_000).saturating_add(stamp.tv_nsec));
            }
            cmsg = libc::CMSG_NXTHDR(message, cmsg);
        }
    }
    None
}

/// Asks the kernel to stamp every datagram `socket` receives with its
/// receive time (`SO_TIMESTAMPNS`), read back by [`RecvBatch::datagrams`].
pub fn enable_receive_stamps(socket: &impl AsRawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a plain setsockopt with a pointer to an int alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

/// Lowers the calling thread's scheduling priority by `nice` steps (Linux applies
/// `setpriority` to one thread when given its thread id). The flusher calls it: when it
/// and the readers want the same core, the readers, which must keep up with the
/// sockets, go first, and the flusher's work waits (its cost is latency, not data).
pub fn lower_this_thread_priority(nice: i32) -> io::Result<()> {
    // SAFETY: gettid has no preconditions and cannot fail.
    let thread = unsafe { libc::gettid() };
    // SAFETY: setpriority takes plain integers; `thread` is this thread's id, so only
    // this thread's priority changes.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, nice) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Asks the kernel to attach each sender's credentials (`SCM_CREDENTIALS`: its PID, UID
/// and GID, in this process' PID namespace) to every datagram of a Unix socket.
pub fn enable_sender_credentials(socket: &impl AsRawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Receives one datagram into `buffer` with its sender's PID, when the kernel attached
/// credentials ([`enable_sender_credentials`]). Returns the length (cut at the buffer's
/// size; the rest of a longer datagram is discarded) and the PID.
pub fn recv_with_sender(socket: &impl AsRawFd, buffer: &mut [u8]) -> io::Result<(usize, Option<u32>)> {
    let mut iovec = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
    // Room for one `ucred` message (and one more of any size), aligned for a `cmsghdr`.
    let mut control = [0u64; CONTROL_WORDS];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iovec;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `message` points at live buffers of the sizes it gives.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut message, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut pid = None;
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with well-formed
    // messages; CMSG_FIRSTHDR/CMSG_NXTHDR stay inside them, and a credentials message
    // holds a `ucred` (read unaligned: the kernel does not promise its alignment).
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_CREDENTIALS {
                let credentials = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::ucred>());
                // The kernel sends PID 0 when the sender's PID has no number in our namespace.
                pid = u32::try_from(credentials.pid).ok().filter(|pid| *pid != 0);
            }
            header = libc::CMSG_NXTHDR(&raw const message, header);
        }
    }
    Ok((n as usize, pid))
}

/// Has glibc map every buffer of 256 KiB or more on its own, so that its memory goes back
/// to the kernel when it is freed. By default glibc raises that threshold to the largest
/// buffer freed so far, after which a window's frames and encoded series come from the
/// heap, and the heap stays resident at the size of the largest window between windows.
/// Called first thing in `main`.
pub fn return_large_buffers_when_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;

    use tessera_core::clock::now_ns;

    /// A receiver on loopback that gives up after 5 s, a sender, and the receiver's address.
    fn loopback_pair() -> (UdpSocket, UdpSocket, SocketAddr) {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let target = receiver.local_addr().unwrap();
        (receiver, sender, target)
    }

    #[test]
    fn receives_a_batch_and_flags_truncation() {
        let (receiver, sender, target) = loopback_pair();
        sender.send_to(b"a:1|c", target).unwrap();
        sender.send_to(b"b:2|c\nc:3|c", target).unwrap();
        sender.send_to(&[b'x'; 100], target).unwrap();
        let mut batch = RecvBatch::new(8, 64);
        assert_eq!(batch.capacity(), 8);
        let mut got = Vec::new();
        while got.len() < 3 {
            batch.recv(&receiver).unwrap();
            got.extend(batch.datagrams().map(|datagram| (datagram.bytes.to_vec(), datagram.truncated)));
        }
        assert_eq!(got[0], (b"a:1|c".to_vec(), false));
        assert_eq!(got[1], (b"b:2|c\nc:3|c".to_vec(), false));
        assert_eq!((got[2].0.len(), got[2].1), (64, true));
    }

    #[test]
    fn stamps_each_datagram_with_the_kernels_receive_time_in_send_order() {
        let (receiver, sender, target) = loopback_pair();
        let mut batch = RecvBatch::new(4, 64);
        sender.send_to(b"before", target).unwrap();
        batch.recv(&receiver).unwrap();
        assert_eq!(batch.datagrams().next().unwrap().stamp_ns, None, "no stamps until asked for");

        enable_receive_stamps(&receiver).unwrap();
        let before = now_ns();
        for i in 0..20u8 {
            sender.send_to(&[b'a' + i], target).unwrap();
        }
        let mut stamps = Vec::new();
        while stamps.len() < 20 {
            batch.recv(&receiver).unwrap();
            stamps.extend(batch.datagrams().map(|datagram| (datagram.bytes[0], datagram.stamp_ns.expect("stamped"))));
        }
        let after = now_ns();
        assert!(stamps.iter().all(|(_, stamp)| (before..=after).contains(stamp)), "{stamps:?} in {before}..{after}");
        assert!(stamps.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1), "{stamps:?}");
    }

    #[test]
    fn the_flusher_can_lower_its_own_priority_and_no_other_thread_s() {
        let nice_of_this_thread = || {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
            let after_name = &stat[stat.rfind(')').unwrap() + 2..];
            after_name.split(' ').nth(16).unwrap().parse::<i32>().unwrap()
        };
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(move || {
            lower_this_thread_priority(5).unwrap();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, 5, "the nice value of the thread that asked");
        assert_eq!(nice_of_this_thread(), before, "other threads keep theirs");
    }
}
