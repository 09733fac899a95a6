//! `sendmmsg(2)`: hands a batch of datagrams to the kernel in one system call.
//!
//! The only module of the crate allowed `unsafe`. [`BatchSender`] keeps its
//! `iovec` and `mmsghdr` arrays between calls so a batch allocates nothing
//! once they have grown to fit.
//!
//! ```ignore
//! let mut sender = BatchSender::default();
//! let sent = sender.send(socket.as_fd(), [&b"a:1|c"[..], &b"b:1|c"[..]])?;
//! ```

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Most datagrams one `sendmmsg` call takes (the kernel's `UIO_MAXIOV`).
pub const MAX_BATCH_DATAGRAMS: usize = 1024;

/// Reusable buffers for `sendmmsg` on a connected datagram socket.
#[derive(Default)]
pub struct BatchSender {
    iovecs: Vec<libc::iovec>,
    headers: Vec<libc::mmsghdr>,
}

impl BatchSender {
    /// Sends `datagrams` (at most [`MAX_BATCH_DATAGRAMS`]; the rest are
    /// ignored) on the connected socket `socket` in one system call.
    ///
    /// Returns how many datagrams, counted from the first, the kernel
    /// accepted; an error means none was. Fewer than all can be accepted
    /// when an error stops the batch part way; the caller resends the rest.
    pub fn send<'a>(
        &mut self,
        socket: BorrowedFd<'_>,
        datagrams: impl IntoIterator<Item = &'a [u8]>,
    ) -> io::Result<usize> {
        self.iovecs.clear();
        self.headers.clear();
        for datagram in datagrams.into_iter().take(MAX_BATCH_DATAGRAMS) {
            self.iovecs.push(libc::iovec { iov_base: datagram.as_ptr().cast_mut().cast(), iov_len: datagram.len() });
        }
        if self.iovecs.is_empty() {
            return Ok(0);
        }
        // The headers point into `iovecs`, which does not move from here on.
        for iovec in &mut self.iovecs {
            // SAFETY: `mmsghdr` is a plain C struct of integers and pointers,
            // for which all-zero bytes are a valid value (null pointers, zero
            // lengths).
            let mut header: libc::mmsghdr = unsafe { std::mem::zeroed() };
            header.msg_hdr.msg_iov = iovec;
            header.msg_hdr.msg_iovlen = 1;
            self.headers.push(header);
        }
        let count = u32::try_from(self.headers.len()).expect("at most MAX_BATCH_DATAGRAMS headers");
        // SAFETY: `headers` holds `count` initialised headers, each pointing
        // at one `iovec` of `iovecs`, each of which points at a datagram
        // borrowed for `'a`, which outlives this call. The kernel only reads
        // the buffers and writes `msg_len` of each header, which we own
        // mutably. `msg_name` is null: the socket is connected.
        let sent = unsafe { libc::sendmmsg(socket.as_raw_fd(), self.headers.as_mut_ptr(), count, 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(sent).expect("a non-negative count"))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn sends_each_datagram_of_a_batch_whole() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender_socket.connect(receiver.local_addr().unwrap()).unwrap();
        let mut sender = BatchSender::default();
        let datagrams: [&[u8]; 3] = [b"a:1|c", b"bb:2|g\ncc:3|ms", b"d:x|s"];
        assert_eq!(sender.send(sender_socket.as_fd(), datagrams).unwrap(), 3);
        assert_eq!(sender.send(sender_socket.as_fd(), []).unwrap(), 0);
        let mut buf = [0u8; 64];
        for expected in datagrams {
            let len = receiver.recv(&mut buf).unwrap();
            assert_eq!(&buf[..len], expected);
        }
    }
}
