//! What the intake hands the tile stage: each connection's opening and end, and each
//! decoded batch, split by merge thread, with the channel its answer goes back on.

use tessera_core::aggregate::Aggregate;
use tessera_core::parse::MetricKind;
use tessera_wire::Answer;
use tokio::sync::oneshot;

/// One series' partial for one window, decoded and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// How the sender named the series.
    pub via: Via,
    /// The series' type.
    pub kind: MetricKind,
    /// The canonical series id (empty for [`Via::Ref`]).
    pub id: Vec<u8>,
    /// The aggregate; its variant matches `kind`.
    pub aggregate: Aggregate,
}

/// How a partial names its series: by id, or through the batch's
/// connection dictionary ([`super::dictionary`]), whose refs the decoder
/// turned into a slot number dense per connection and merge thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// By its id alone.
    Id,
    /// By its id, binding the connection's dictionary slot `slot` to it.
    Define {
        /// The slot.
        slot: u32,
    },
    /// By the connection's dictionary slot `slot` alone (no id).
    Ref {
        /// The slot.
        slot: u32,
    },
}

/// The partials of one window from one sender, one share per merge thread.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SplitBatch {
    /// Window start, unix milliseconds.
    pub window_start_ms: i64,
    /// Window length, milliseconds.
    pub window_ms: i64,
    /// `shares[i]`: the partials of the shards merge thread `i` owns.
    pub shares: Vec<Vec<Partial>>,
    /// The sender's watermark ([`crate::tile::Watermarks`]), if it sent one.
    pub watermark_ms: Option<i64>,
    /// The sequence of the batch this one was expanded from; 0 when whole
    /// (`PartialBatch.expanded_from`).
    pub expanded_from: u64,
}

impl SplitBatch {
    /// Partials in every share.
    pub fn partials(&self) -> u64 {
        self.shares.iter().map(|share| share.len() as u64).sum()
    }
}

/// What the decoder hands admission.
pub enum AdmissionJob {
    /// See [`Inbound::Opened`](super::Inbound::Opened).
    Opened {
        /// The connection.
        connection: u64,
        /// The collector's instance id.
        source: String,
        /// Its stream of batches (`Hello.stream`; 0: none).
        stream: u64,
    },
    /// A decoded batch to admit or refuse.
    Batch {
        /// The connection it came on.
        connection: u64,
        /// The sender's sequence.
        sequence: u64,
        /// The batch.
        batch: SplitBatch,
        /// Where the answer goes.
        reply: oneshot::Sender<Answer>,
    },
    /// The merge threads forget the connection's dictionary (its sender
    /// started a new one).
    Forget {
        /// The connection.
        connection: u64,
    },
    /// A batch the decoder refused for good still moves its sender's watermark.
    Watermark {
        /// The connection.
        connection: u64,
        /// The batch's watermark.
        watermark_ms: i64,
    },
    /// See [`Inbound::Closed`](super::Inbound::Closed).
    Closed {
        /// The connection.
        connection: u64,
    },
}

/// The merge thread that owns `shard`.
#[inline]
pub fn thread_of(shard: u32, threads: usize) -> usize {
    shard as usize % threads.max(1)
}
