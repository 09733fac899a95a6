//! Length-prefixed framing of [`Frame`]s over a byte stream, and the
//! versioned handshake.
//!
//! A frame on the wire is a 4-byte big-endian length `n`, then `n` bytes of
//! an encoded [`Frame`]. Frames larger than the receiver's maximum are
//! refused before any of their body is read, with
//! [`FrameError::TooLarge`]; the connection must then be closed, since the
//! stream can no longer be trusted.
//!
//! The first frame a client sends is a [`Hello`] carrying
//! [`PROTOCOL_VERSION`]; the server answers with a [`HelloAck`] and refuses
//! versions it does not speak. [`client_handshake`] and
//! [`server_handshake`] implement both sides.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Frame, Hello, HelloAck, Role, frame::Body};

/// The protocol version this build speaks.
///
/// - 1: the first contract;
/// - 2: gauges carry order stamps in nanoseconds and a delta range
///   (`Gauge.timestamp_ns`, `has_delta`, `delta_first_ns`, `delta_last_ns`);
/// - 3: the per-connection series dictionary (`SeriesValue.ref`,
///   `PartialBatch.dictionary`).
pub const PROTOCOL_VERSION: u32 = 3;

/// Default maximum size of one frame's body: 64 MiB.
///
/// A 1 s partial batch for 1 000 000 counters encodes to roughly 40 MB, so
/// senders split larger batches (see [`split_hint`]).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame's declared length exceeds the maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Declared length of the frame body.
        len: usize,
        /// Maximum accepted.
        max: usize,
    },
    /// The body is not a valid protobuf `Frame`.
    #[error("malformed frame of {len} bytes")]
    Malformed {
        /// Length of the body.
        len: usize,
        /// Decoder error.
        #[source]
        source: prost::DecodeError,
    },
    /// The frame has no body (an empty oneof).
    #[error("frame without a body")]
    Empty,
    /// Reading or writing the stream failed.
    #[error("frame i/o")]
    Io(#[from] std::io::Error),
    /// The stream ended cleanly between frames.
    #[error("connection closed")]
    Closed,
}

/// Why the handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Framing failed during the handshake.
    #[error("handshake framing")]
    Frame(#[from] FrameError),
    /// The peer's first frame was not the expected handshake frame.
    #[error("expected {expected} as the first frame, got {got}")]
    Unexpected {
        /// What we waited for.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {peer}, this build speaks {ours}")]
    Version {
        /// Peer's version.
        peer: u32,
        /// Ours.
        ours: u32,
    },
    /// The server refused the connection.
    #[error("peer refused the connection: {0}")]
    Refused(String),
}

/// Name of a frame body's kind, for errors and metrics labels.
pub fn body_kind(frame: &Frame) -> &'static str {
    match &frame.body {
        None => "empty",
        Some(Body::Hello(_)) => "hello",
        Some(Body::HelloAck(_)) => "hello_ack",
        Some(Body::Partials(_)) => "partials",
        Some(Body::Tiles(_)) => "tiles",
        Some(Body::Ack(_)) => "ack",
    }
}

/// Encodes `frame` with its length prefix, refusing frames over `max_frame_bytes`.
pub fn encode_frame(frame: &Frame, max_frame_bytes: usize) -> Result<Vec<u8>, FrameError> {
    let len = frame.encoded_len();
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge { len, max: max_frame_bytes });
    }
    let mut out = Vec::with_capacity(LENGTH_PREFIX_BYTES + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    frame.encode(&mut out).expect("a Vec grows to fit the frame");
    Ok(out)
}

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame, and the
/// frame with the number of bytes it used otherwise. A declared length over
/// `max_frame_bytes` is refused before waiting for the body.
pub fn decode_frame(buf: &[u8], max_frame_bytes: usize) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(prefix.try_into().expect("slice of 4 bytes")) as usize;
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge { len, max: max_frame_bytes });
    }
    let Some(body) = buf.get(LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + len) else {
        return Ok(None);
    };
    let frame = decode_body(body)?;
    Ok(Some((frame, LENGTH_PREFIX_BYTES + len)))
}

/// Decodes a frame's body (read without its length prefix); a frame without a body is
/// [`FrameError::Empty`].
pub fn decode_body(body: &[u8]) -> Result<Frame, FrameError> {
    let frame = Frame::decode(body).map_err(|source| FrameError::Malformed { len: body.len(), source })?;
    if frame.body.is_none() {
        return Err(FrameError::Empty);
    }
    Ok(frame)
}

/// Writes one frame and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
    max_frame_bytes: usize,
) -> Result<(), FrameError> {
    let bytes = encode_frame(frame, max_frame_bytes)?;
    writer.write_all(&bytes).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one frame, reusing `scratch` for the body.
///
/// Returns [`FrameError::Closed`] if the stream ends before the first byte of
/// a frame, and an I/O error if it ends inside one.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    scratch: &mut Vec<u8>,
    max_frame_bytes: usize,
) -> Result<Frame, FrameError> {
    let len = read_length_prefix(reader, max_frame_bytes).await?;
    scratch.clear();
    scratch.resize(len, 0);
    reader.read_exact(scratch).await?;
    decode_body(scratch)
}

/// Reads a frame's length prefix and refuses a length over
/// `max_frame_bytes` before any of the body is read. Returns
/// [`FrameError::Closed`] if the stream ends before the first byte of a
/// frame, and an I/O error if it ends inside the prefix. The caller reads
/// the body (the returned number of bytes) into whatever buffer suits it.
pub async fn read_length_prefix<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<usize, FrameError> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let first = reader.read(&mut prefix).await?;
    if first == 0 {
        return Err(FrameError::Closed);
    }
    if first < LENGTH_PREFIX_BYTES {
        reader.read_exact(&mut prefix[first..]).await?;
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge { len, max: max_frame_bytes });
    }
    Ok(len)
}

/// Client side of the handshake: sends a [`Hello`] and waits for an accepting [`HelloAck`].
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    role: Role,
    instance_id: &str,
) -> Result<HelloAck, HandshakeError> {
    client_handshake_for(stream, role, instance_id, 0).await
}

/// [`client_handshake`] for the sender's stream of batches `sender_stream`
/// (`Hello.stream`: kept across its reconnections, so that the receiver
/// takes a re-sent batch at most once; 0 for none).
pub async fn client_handshake_for<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    role: Role,
    instance_id: &str,
    sender_stream: u64,
) -> Result<HelloAck, HandshakeError> {
    let hello = Frame {
        body: Some(Body::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            role: role as i32,
            instance_id: instance_id.to_owned(),
            stream: sender_stream,
        })),
    };
    write_frame(stream, &hello, DEFAULT_MAX_FRAME_BYTES).await?;
    let mut scratch = Vec::new();
    let answer = read_frame(stream, &mut scratch, 64 << 10).await?;
    match answer.body {
        Some(Body::HelloAck(ack)) if ack.accepted => Ok(ack),
        Some(Body::HelloAck(ack)) => Err(HandshakeError::Refused(ack.message)),
        _ => Err(HandshakeError::Unexpected { expected: "hello_ack", got: body_kind(&answer) }),
    }
}

/// Server side of the handshake: reads the client's [`Hello`], answers it,
/// and returns it if its version is accepted.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    instance_id: &str,
) -> Result<Hello, HandshakeError> {
    let mut scratch = Vec::new();
    let first = read_frame(stream, &mut scratch, 64 << 10).await?;
    let hello = match first.body {
        Some(Body::Hello(hello)) => hello,
        _ => return Err(HandshakeError::Unexpected { expected: "hello", got: body_kind(&first) }),
    };
    let accepted = hello.protocol_version == PROTOCOL_VERSION;
    let message = if accepted {
        String::new()
    } else {
        format!("protocol version {} not supported, this server speaks {PROTOCOL_VERSION}", hello.protocol_version)
    };
    let answer = Frame {
        body: Some(Body::HelloAck(HelloAck {
            protocol_version: PROTOCOL_VERSION,
            accepted,
            message,
            instance_id: instance_id.to_owned(),
        })),
    };
    write_frame(stream, &answer, DEFAULT_MAX_FRAME_BYTES).await?;
    if !accepted {
        return Err(HandshakeError::Version { peer: hello.protocol_version, ours: PROTOCOL_VERSION });
    }
    Ok(hello)
}

/// How many pieces a batch of `encoded_len` bytes should be split into so
/// that each fits in `max_frame_bytes` with headroom.
pub fn split_hint(encoded_len: usize, max_frame_bytes: usize) -> usize {
    let budget = (max_frame_bytes / 2).max(1);
    encoded_len.div_ceil(budget).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ack, AckStatus, PartialBatch};

    fn ack(sequence: u64) -> Frame {
        Frame {
            body: Some(Body::Ack(Ack {
                sequence,
                status: AckStatus::Retryable as i32,
                message: "full".into(),
                reason: "queue_full".into(),
            })),
        }
    }

    #[test]
    fn round_trips_and_waits_for_whole_frames() {
        let bytes = encode_frame(&ack(3), 1024).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode_frame(&bytes[..cut], 1024).unwrap().is_none(), "partial frame of {cut} bytes decoded");
        }
        let (frame, used) = decode_frame(&bytes, 1024).unwrap().unwrap();
        assert_eq!(frame, ack(3));
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn refuses_a_frame_over_the_maximum_on_encode_and_decode() {
        let big = Frame { body: Some(Body::Partials(PartialBatch { source: "x".repeat(2000), ..Default::default() })) };
        let err = encode_frame(&big, 1000).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: 1000, .. }), "{err}");
        assert!(err.to_string().contains("exceeds the maximum of 1000 bytes"), "{err}");

        // A declared length over the maximum is refused from the prefix alone.
        let prefix = (1_000_000u32).to_be_bytes();
        let err = decode_frame(&prefix, 1000).unwrap_err();
        assert_eq!(err.to_string(), "frame of 1000000 bytes exceeds the maximum of 1000 bytes");
    }

    #[test]
    fn garbage_is_a_malformed_frame_not_a_panic() {
        let mut bytes = vec![0, 0, 0, 6];
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        let err = decode_frame(&bytes, 1000).unwrap_err();
        assert!(matches!(err, FrameError::Malformed { len: 6, .. }), "{err}");
        let empty = [0, 0, 0, 0];
        assert!(matches!(decode_frame(&empty, 1000).unwrap_err(), FrameError::Empty));
    }

    #[tokio::test]
    async fn async_read_refuses_oversized_frame_without_reading_body() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        tokio::io::AsyncWriteExt::write_all(&mut a, &(10_000u32).to_be_bytes()).await.unwrap();
        let mut scratch = Vec::new();
        let err = read_frame(&mut b, &mut scratch, 100).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len: 10_000, max: 100 }), "{err}");
        assert!(scratch.capacity() < 10_000, "body buffer was allocated for a refused frame");
    }

    #[tokio::test]
    async fn handshake_accepts_same_version_and_refuses_another() {
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let (c, s) =
            tokio::join!(client_handshake(&mut client, Role::Collector, "c1"), server_handshake(&mut server, "agg1"));
        assert_eq!(c.unwrap().instance_id, "agg1");
        assert_eq!(s.map(|hello| (hello.instance_id, hello.stream)).unwrap(), ("c1".into(), 0));
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let (_, s) = tokio::join!(
            client_handshake_for(&mut client, Role::Collector, "c1", 77),
            server_handshake(&mut server, "agg1")
        );
        assert_eq!(s.unwrap().stream, 77, "the sender's stream reaches the server");

        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let old = Frame {
            body: Some(Body::Hello(Hello {
                protocol_version: PROTOCOL_VERSION - 1,
                stream: 0,
                role: Role::Tool as i32,
                instance_id: "t".into(),
            })),
        };
        let send = async {
            write_frame(&mut client, &old, 1024).await.unwrap();
            let mut scratch = Vec::new();
            read_frame(&mut client, &mut scratch, 1024).await.unwrap()
        };
        let (answer, s) = tokio::join!(send, server_handshake(&mut server, "agg1"));
        let refused = s.unwrap_err();
        assert!(
            matches!(refused, HandshakeError::Version { peer, ours: PROTOCOL_VERSION } if peer == PROTOCOL_VERSION - 1),
            "{refused}"
        );
        match answer.body {
            Some(Body::HelloAck(ack)) => {
                let old_version = format!("version {} not supported", PROTOCOL_VERSION - 1);
                assert!(!ack.accepted && ack.message.contains(&old_version), "{}", ack.message);
            }
            other => panic!("expected a refusing hello_ack, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn closed_between_frames_is_reported_as_closed() {
        let (a, mut b) = tokio::io::duplex(64);
        drop(a);
        let mut scratch = Vec::new();
        assert!(matches!(read_frame(&mut b, &mut scratch, 100).await.unwrap_err(), FrameError::Closed));
    }
}
