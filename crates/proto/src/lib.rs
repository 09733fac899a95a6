//! The tessera wire contract.
//!
//! Every message exchanged between tessera daemons is a protobuf type
//! generated from `proto/tessera/v1/tessera.proto`:
//!
//! - [`PartialBatch`]: collector → aggregator, the 1 s partials of one window,
//!   grouped by shard;
//! - [`TileBatch`]: aggregator → ingester, closed tiles of one storage policy;
//! - [`Ack`]: the answer to either, with an [`AckStatus`] that tells the
//!   sender to forget the batch, retry it later, or give up on it, and an
//!   [`AckReason`] both sides share ([`ack`]);
//! - [`Placement`]: which aggregator instance owns which shard, kept in etcd.
//!
//! On a byte stream every message travels inside a [`Frame`]; [`framing`]
//! reads and writes length-prefixed frames with a size bound and performs
//! the versioned [`Hello`] handshake.
//!
//! ```
//! use tessera_proto::{framing, Frame, frame::Body, Ack, AckStatus};
//!
//! let frame = Frame { body: Some(Body::Ack(Ack { sequence: 7, status: AckStatus::Ok as i32, ..Default::default() })) };
//! let bytes = framing::encode_frame(&frame, framing::DEFAULT_MAX_FRAME_BYTES).unwrap();
//! let (decoded, used) = framing::decode_frame(&bytes, framing::DEFAULT_MAX_FRAME_BYTES).unwrap().unwrap();
//! assert_eq!(used, bytes.len());
//! assert_eq!(decoded, frame);
//! ```

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/tessera.v1.rs"));
}

pub use generated::*;

pub mod ack;
pub mod framing;
pub mod partials;

pub use ack::AckReason;
