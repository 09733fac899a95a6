//! A wire connection's byte stream: plain TCP, or TCP under TLS (the client's
//! or the server's side). Everything above reads and writes frames on it alike.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection between daemons, with or without TLS.
#[derive(Debug)]
pub enum WireStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, as the side that connected.
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS, as the side that accepted.
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl WireStream {
    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        !matches!(self, WireStream::Plain(_))
    }
}

impl AsyncRead for WireStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            WireStream::Client(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
            WireStream::Server(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WireStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WireStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            WireStream::Client(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
            WireStream::Server(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            WireStream::Client(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            WireStream::Server(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WireStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            WireStream::Client(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            WireStream::Server(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
