//! Answering batches on a wire connection; see the crate docs, *Answering a batch*.

use std::future::Future;
use std::time::Duration;

use tessera_proto::framing::{self, FrameError, body_kind};
use tessera_proto::{Ack, AckReason, AckStatus, Frame, frame::Body};
use tessera_runtime::Shutdown;
use tessera_runtime::logging::error_chain;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::inbound::{WireConnection, WireError};
use crate::metrics::CloseReason;

/// What a listener answers one frame with.
#[derive(Debug)]
pub enum Answer {
    /// Send this acknowledgement and read the next frame.
    Ack(Ack),
    /// The frame cannot be trusted: tell the peer why, then close the connection; the
    /// wire counts and logs `reason` as the connection ends.
    Close {
        /// Why: [`CloseReason::MalformedFrame`], [`CloseReason::EmptyFrame`] or
        /// [`CloseReason::UnexpectedFrame`].
        reason: CloseReason,
        /// What was wrong, for the peer and the log.
        message: String,
    },
}

impl Answer {
    /// Taken: acknowledged with no reason.
    pub fn taken(sequence: u64) -> Answer {
        Answer::Ack(Ack { sequence, status: AckStatus::Ok as i32, ..Ack::default() })
    }

    /// Refused for `reason` (its status, retryable or not, is the reason's).
    pub fn refusal(sequence: u64, reason: AckReason, message: String) -> Answer {
        Answer::Ack(reason.ack(sequence, message))
    }
}

/// A frame body handed on by [`serve_batches`] that cannot be trusted: why, for
/// `frame_errors_total`, and what was wrong, for the peer and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFrame {
    /// [`CloseReason::MalformedFrame`], [`CloseReason::EmptyFrame`] or
    /// [`CloseReason::UnexpectedFrame`].
    pub reason: CloseReason,
    /// What was wrong.
    pub message: String,
}

impl From<BadFrame> for Answer {
    fn from(BadFrame { reason, message }: BadFrame) -> Answer {
        Answer::Close { reason, message }
    }
}

/// The body of a frame handed on by [`serve_batches`], if `take` accepts its kind (the
/// listener's batches); otherwise why the connection closes, by the wire's one policy:
/// bytes that are not a frame, a frame without a body, a frame of a kind the listener
/// does not take (`listener_takes` says what it takes, for the message).
pub fn take_batch<T>(
    body: &[u8],
    listener_takes: &str,
    take: impl FnOnce(Body) -> Result<T, Body>,
) -> Result<T, BadFrame> {
    let frame = match framing::decode_body(body) {
        Ok(frame) => frame,
        Err(FrameError::Empty) => {
            return Err(BadFrame { reason: CloseReason::EmptyFrame, message: "frame without a body".to_owned() });
        }
        Err(error) => return Err(BadFrame { reason: CloseReason::MalformedFrame, message: error_chain(&error) }),
    };
    let body = frame.body.expect("decode_body refuses a frame without a body");
    take(body).map_err(|other| {
        let kind = body_kind(&Frame { body: Some(other) });
        BadFrame { reason: CloseReason::UnexpectedFrame, message: format!("{listener_takes}, not `{kind}` frames") }
    })
}

/// How long telling a peer why its connection closes may take.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);

/// Reads frame bodies from `wire` and writes the answer `handle` gives each, one frame at
/// a time, until the connection ends. `handle` returns `None` when the pipeline behind it
/// is gone (shutdown): the connection then ends cleanly.
///
/// One batch in flight per connection is the backpressure: a sender waiting for its ack
/// sends nothing more.
///
/// # Errors
///
/// What ended the connection ([`WireError::reason`] labels it), after the peer was told
/// why when the frame was refused: a frame declared over the maximum (before its body is
/// read), or one `handle` answered with [`Answer::Close`].
pub async fn serve_batches<H, F>(wire: &mut WireConnection, shutdown: &Shutdown, mut handle: H) -> Result<(), WireError>
where
    H: FnMut(Vec<u8>) -> F,
    F: Future<Output = Option<Answer>>,
{
    loop {
        let body = match wire.next_frame(shutdown).await {
            Ok(body) => body,
            Err(WireError::Frame(FrameError::TooLarge { len, max })) => {
                let message = format!("frame of {len} bytes exceeds the maximum of {max} bytes");
                refuse(&mut wire.stream, AckReason::FrameTooLarge, message).await;
                return Err(WireError::Frame(FrameError::TooLarge { len, max }));
            }
            Err(error) => return Err(error),
        };
        let Some(answer) = handle(body).await else { return Ok(()) };
        match answer {
            Answer::Ack(ack) => {
                let frame = Frame { body: Some(Body::Ack(ack)) };
                framing::write_frame(&mut wire.stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES).await?;
            }
            Answer::Close { reason, message } => {
                let refusal = match reason {
                    CloseReason::UnexpectedFrame => AckReason::UnexpectedFrame,
                    _ => AckReason::MalformedFrame,
                };
                refuse(&mut wire.stream, refusal, message.clone()).await;
                return Err(WireError::Closed { reason, message });
            }
        }
    }
}

/// Tells the peer why its connection closes: a `Permanent` ack for sequence 0 with the
/// reason, then the end of the stream (best effort, bounded in time).
async fn refuse(stream: &mut (impl AsyncWrite + Unpin), reason: AckReason, message: String) {
    let frame = Frame { body: Some(Body::Ack(reason.ack(0, message))) };
    let _ =
        tokio::time::timeout(REFUSAL_DEADLINE, framing::write_frame(stream, &frame, framing::DEFAULT_MAX_FRAME_BYTES))
            .await;
    let _ = tokio::time::timeout(REFUSAL_DEADLINE, stream.shutdown()).await;
}
