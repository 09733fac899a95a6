//! Why a batch was refused: the `reason` of an [`Ack`], one closed set shared
//! by the side that answers and the side that counts the answer.
//!
//! A receiver answers with an [`AckReason`] ([`AckReason::ack`]); a sender
//! counts a refusal under [`AckReason::label`] of the reason it read, which is
//! the reason itself whenever the receiver is a tessera daemon of this
//! version, `unspecified` when empty and `other` for anything else (a newer
//! peer), so metric labels stay a closed set whatever arrives.
//!
//! | reason | answered by | status |
//! |---|---|---|
//! | `not_owner`, `too_late`, `too_early`, `malformed`, `unknown_series_ref` | aggregator | permanent |
//! | `buffer_full`, `shutting_down` | aggregator | retryable |
//! | `invalid_batch` | ingester | permanent |
//! | `queue_full`, `queue_io` | ingester | retryable |
//! | `fenced`, `placement_ahead`, `placement_stale` | ingester (of an ingesters' placement) | retryable |
//! | `duplicate` | ingester | ok (already queued) |
//! | `malformed_frame`, `frame_too_large`, `unexpected_frame` | ingester, before it closes the connection | permanent |
//!
//! ```
//! use tessera_proto::{AckReason, AckStatus};
//!
//! let ack = AckReason::QueueFull.ack(7, "queue over its bound".into());
//! assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Retryable as i32, "queue_full"));
//! assert_eq!(AckReason::label(&ack.reason), "queue_full");
//! assert_eq!(AckReason::label("from_the_future"), "other");
//! ```

use crate::{Ack, AckStatus};

/// Why a batch was not simply taken; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckReason {
    /// A shard in the batch is not owned by this aggregator for its window.
    NotOwner,
    /// The window's tile has already been flushed.
    TooLate,
    /// The window ends too far in the future.
    TooEarly,
    /// The batch or one of its aggregates is invalid.
    Malformed,
    /// A series ref the connection's dictionary does not hold (the sender starts a new one).
    UnknownSeriesRef,
    /// The aggregator's buffer towards the ingesters is full.
    BufferFull,
    /// The aggregator is shutting down.
    ShuttingDown,
    /// The tile batch has no storage policy, resolution or tile end.
    InvalidBatch,
    /// The ingester's queue is over its bound.
    QueueFull,
    /// The ingester cannot write or sync its queue.
    QueueIo,
    /// The batch was queued already (a resend): acknowledged, not queued twice.
    Duplicate,
    /// Bytes that are not a frame; the connection is closed.
    MalformedFrame,
    /// A frame longer than the receiver's maximum; the connection is closed.
    FrameTooLarge,
    /// A valid frame of a kind the receiver does not take here.
    UnexpectedFrame,
    /// No target of the ingester stores the batch's storage policy: acknowledged, not
    /// stored (its configuration chose one resolution per store).
    NoTarget,
    /// The ingester cannot renew its liveness lease in time and writes nothing until it
    /// has (its shards may be failing over): send again later, or to the new owner.
    Fenced,
    /// The batch was routed under a newer placement than the ingester has seen: it takes
    /// it once it has caught up.
    PlacementAhead,
    /// The batch was routed under an older placement, and the ingester does not own some of
    /// its series' shards in its own: the sender routes it again by its current placement.
    PlacementStale,
}

impl AckReason {
    /// Every reason: what an aggregator answers, then what an ingester answers.
    pub const ALL: [AckReason; 18] = concat(AckReason::FROM_AGGREGATOR, AckReason::FROM_INGESTER);

    /// What an aggregator answers a collector's partial batch with.
    pub const FROM_AGGREGATOR: [AckReason; 7] = [
        AckReason::NotOwner,
        AckReason::TooLate,
        AckReason::TooEarly,
        AckReason::Malformed,
        AckReason::UnknownSeriesRef,
        AckReason::BufferFull,
        AckReason::ShuttingDown,
    ];

    /// What an ingester answers an aggregator's tile batch with.
    pub const FROM_INGESTER: [AckReason; 11] = [
        AckReason::InvalidBatch,
        AckReason::QueueFull,
        AckReason::QueueIo,
        AckReason::Duplicate,
        AckReason::MalformedFrame,
        AckReason::FrameTooLarge,
        AckReason::UnexpectedFrame,
        AckReason::NoTarget,
        AckReason::Fenced,
        AckReason::PlacementAhead,
        AckReason::PlacementStale,
    ];

    /// The label of a refusal whose reason was empty.
    pub const UNSPECIFIED: &'static str = "unspecified";
    /// The label of a refusal whose reason this build does not know.
    pub const OTHER: &'static str = "other";

    /// The reason as it travels and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            AckReason::NotOwner => "not_owner",
            AckReason::TooLate => "too_late",
            AckReason::TooEarly => "too_early",
            AckReason::Malformed => "malformed",
            AckReason::UnknownSeriesRef => "unknown_series_ref",
            AckReason::BufferFull => "buffer_full",
            AckReason::ShuttingDown => "shutting_down",
            AckReason::InvalidBatch => "invalid_batch",
            AckReason::QueueFull => "queue_full",
            AckReason::QueueIo => "queue_io",
            AckReason::Duplicate => "duplicate",
            AckReason::MalformedFrame => "malformed_frame",
            AckReason::FrameTooLarge => "frame_too_large",
            AckReason::UnexpectedFrame => "unexpected_frame",
            AckReason::NoTarget => "no_target",
            AckReason::Fenced => "fenced",
            AckReason::PlacementAhead => "placement_ahead",
            AckReason::PlacementStale => "placement_stale",
        }
    }

    /// The reason `text` names, if any.
    pub fn parse(text: &str) -> Option<AckReason> {
        AckReason::ALL.into_iter().find(|reason| reason.as_str() == text)
    }

    /// The status an answer with this reason carries.
    pub fn status(self) -> AckStatus {
        match self {
            AckReason::Duplicate | AckReason::NoTarget => AckStatus::Ok,
            AckReason::BufferFull
            | AckReason::ShuttingDown
            | AckReason::QueueFull
            | AckReason::QueueIo
            | AckReason::Fenced
            | AckReason::PlacementAhead
            | AckReason::PlacementStale => AckStatus::Retryable,
            _ => AckStatus::Permanent,
        }
    }

    /// Whether the sender should send the batch again later.
    pub fn is_retryable(self) -> bool {
        self.status() == AckStatus::Retryable
    }

    /// The acknowledgement of batch `sequence` with this reason and its status.
    pub fn ack(self, sequence: u64, message: String) -> Ack {
        Ack { sequence, status: self.status() as i32, message, reason: self.as_str().to_owned() }
    }

    /// The metric label of a reason as read from an [`Ack`]: the reason when known,
    /// [`UNSPECIFIED`](Self::UNSPECIFIED) when empty, [`OTHER`](Self::OTHER) otherwise.
    pub fn label(text: &str) -> &'static str {
        match AckReason::parse(text) {
            Some(reason) => reason.as_str(),
            None if text.is_empty() => AckReason::UNSPECIFIED,
            None => AckReason::OTHER,
        }
    }

    /// Every label a sender counts the permanent refusals of `answers` under: each
    /// permanent reason, then [`UNSPECIFIED`](Self::UNSPECIFIED) and [`OTHER`](Self::OTHER).
    pub fn refusal_labels(answers: &[AckReason]) -> Vec<&'static str> {
        let permanent = answers.iter().filter(|reason| reason.status() == AckStatus::Permanent);
        permanent.map(|reason| reason.as_str()).chain([AckReason::UNSPECIFIED, AckReason::OTHER]).collect()
    }
}

/// `first` then `second`, in a constant.
const fn concat<const A: usize, const B: usize, const ALL: usize>(
    first: [AckReason; A],
    second: [AckReason; B],
) -> [AckReason; ALL] {
    assert!(A + B == ALL, "ALL holds both lists");
    let mut all = [AckReason::NotOwner; ALL];
    let mut index = 0;
    while index < A {
        all[index] = first[index];
        index += 1;
    }
    let mut index = 0;
    while index < B {
        all[A + index] = second[index];
        index += 1;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_itself_and_its_own_label() {
        for reason in AckReason::ALL {
            assert_eq!(AckReason::parse(reason.as_str()), Some(reason));
            assert_eq!(AckReason::label(reason.as_str()), reason.as_str());
            let ack = reason.ack(3, String::new());
            assert_eq!((ack.sequence, ack.status), (3, reason.status() as i32));
        }
        assert_eq!(AckReason::label(""), "unspecified");
        assert_eq!(AckReason::label("too_old"), "other");
    }

    #[test]
    fn each_side_answers_with_its_own_reasons() {
        let mut names: Vec<&str> = AckReason::ALL.iter().map(|reason| reason.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), AckReason::ALL.len(), "every reason is answered by one side, once");
        assert_eq!(
            AckReason::refusal_labels(&AckReason::FROM_INGESTER),
            ["invalid_batch", "malformed_frame", "frame_too_large", "unexpected_frame", "unspecified", "other"]
        );
        assert!(AckReason::BufferFull.is_retryable() && !AckReason::NotOwner.is_retryable());
    }
}
