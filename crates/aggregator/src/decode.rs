//! Decoding and checking one partial batch frame, off the async runtime.
//!
//! [`Decoder::decode`] turns the bytes of a frame into a [`Batch`] ready
//! for the tiler, or into the refusal to send back. It checks, for the
//! batch as a whole (one bad series refuses the whole batch, so nothing
//! of it is applied):
//!
//! 1. the frame is a `PartialBatch` (anything else closes the connection);
//! 2. every shard is below `num_shards` and owned by this instance for the
//!    window (`Placement::owns(id, shard, window_start_ms)`), otherwise
//!    `not_owner`;
//! 3. every series has a known type, a non-empty id that hashes to the
//!    shard it came in, and a valid aggregate of that type, otherwise
//!    `malformed`.
//!
//! Whether the window is still open is the admission thread's decision (it
//! owns the clock of tile closes), made right before it dispatches. The
//! partials of a batch come out split into one share per merge thread
//! ([`crate::merge::thread_of`] of their shard).

use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_proto::frame::Body;
use tessera_proto::framing;
use tessera_proto::{PartialBatch, SeriesValue};
use tessera_topology::{Placement, PlacementHandle};

use crate::merge::thread_of;
use crate::metrics::Reason;
use crate::tiler::Partial;
use tessera_runtime::logging::error_chain;

/// What became of one frame.
#[derive(Debug)]
pub enum Decoded {
    /// A valid batch for admission.
    Batch {
        /// The sender's sequence, echoed in the ack.
        sequence: u64,
        /// The partials, split by merge thread.
        batch: SplitBatch,
    },
    /// A batch refused before the tiler saw it.
    Refused {
        /// The sender's sequence.
        sequence: u64,
        /// Why.
        reason: Reason,
        /// Details for the ack message and logs.
        message: String,
        /// Series partials in the batch.
        partials: u64,
        /// The batch's watermark, if it carried one.
        watermark_ms: Option<i64>,
    },
    /// The frame cannot be trusted; the connection is closed.
    Protocol {
        /// A closed-set label: `malformed_frame` or `unexpected_frame`.
        reason: &'static str,
        /// Details for the log.
        message: String,
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
    /// The sender's watermark ([`crate::watermark`]), if it sent one.
    pub watermark_ms: Option<i64>,
}

impl SplitBatch {
    /// Partials in every share.
    pub fn partials(&self) -> u64 {
        self.shares.iter().map(|share| share.len() as u64).sum()
    }
}

/// Which shards this instance owns for one window, cached per placement
/// generation and window (every collector sends the same windows).
struct OwnedShards {
    generation: u64,
    window_start_ms: i64,
    owned: Vec<bool>,
}

/// Decodes frames against the current placement; one per decoder thread.
pub struct Decoder {
    instance_id: String,
    placement: PlacementHandle,
    max_frame_bytes: usize,
    merge_threads: usize,
    owned: Option<OwnedShards>,
}

impl Decoder {
    /// A decoder for `instance_id` reading the placement from `placement`,
    /// splitting batches for `merge_threads` merge threads.
    pub fn new(
        instance_id: String,
        placement: PlacementHandle,
        max_frame_bytes: usize,
        merge_threads: usize,
    ) -> Decoder {
        Decoder { instance_id, placement, max_frame_bytes, merge_threads: merge_threads.max(1), owned: None }
    }

    /// Decodes and checks one frame (length prefix included).
    pub fn decode(&mut self, frame: &[u8]) -> Decoded {
        let decoded = match framing::decode_frame(frame, self.max_frame_bytes) {
            Ok(Some((frame, _))) => frame,
            Ok(None) => return protocol("malformed_frame", "truncated frame".to_owned()),
            Err(error) => return protocol("malformed_frame", error_chain(&error)),
        };
        let batch = match decoded.body {
            Some(Body::Partials(batch)) => batch,
            other => {
                let kind = framing::body_kind(&tessera_proto::Frame { body: other });
                return protocol("unexpected_frame", format!("expected a partial batch, got `{kind}`"));
            }
        };
        self.check(batch)
    }

    fn check(&mut self, batch: PartialBatch) -> Decoded {
        let sequence = batch.sequence;
        let partials: u64 = batch.shards.iter().map(|shard| shard.series.len() as u64).sum();
        let watermark_ms = (batch.watermark_ms != 0).then_some(batch.watermark_ms);
        let refuse = |reason, message| Decoded::Refused { sequence, reason, message, partials, watermark_ms };
        let placement = self.placement.current();
        let num_shards = placement.num_shards();
        for group in &batch.shards {
            if group.shard >= num_shards {
                let message = format!("shard {} is out of range (the placement has {num_shards} shards)", group.shard);
                return refuse(Reason::Malformed, message);
            }
            if !self.owns(&placement, group.shard, batch.window_start_ms) {
                let message = format!(
                    "shard {} is not owned by `{}` for the window at {} (placement version {})",
                    group.shard,
                    self.instance_id,
                    batch.window_start_ms,
                    placement.version()
                );
                return refuse(Reason::NotOwner, message);
            }
        }
        let window_ms = i64::from(batch.window_ms);
        let mut shares: Vec<Vec<Partial>> = vec![Vec::new(); self.merge_threads];
        for group in batch.shards {
            let share = &mut shares[thread_of(group.shard, self.merge_threads)];
            share.reserve(group.series.len());
            for series in group.series {
                match partial(series, group.shard, num_shards) {
                    Ok(partial) => share.push(partial),
                    Err(message) => return refuse(Reason::Malformed, message),
                }
            }
        }
        let batch = SplitBatch { window_start_ms: batch.window_start_ms, window_ms, shares, watermark_ms };
        Decoded::Batch { sequence, batch }
    }

    fn owns(&mut self, placement: &Placement, shard: u32, window_start_ms: i64) -> bool {
        let generation = self.placement.generation();
        let fresh = self
            .owned
            .as_ref()
            .is_some_and(|owned| owned.generation == generation && owned.window_start_ms == window_start_ms);
        if !fresh {
            let mut owned = vec![false; placement.num_shards() as usize];
            for id in placement.owned_shards(&self.instance_id, window_start_ms) {
                if let Some(slot) = owned.get_mut(id as usize) {
                    *slot = true;
                }
            }
            self.owned = Some(OwnedShards { generation, window_start_ms, owned });
        }
        self.owned.as_ref().and_then(|owned| owned.owned.get(shard as usize).copied()).unwrap_or(false)
    }
}

/// One wire series checked and converted.
fn partial(series: SeriesValue, shard: u32, num_shards: u32) -> Result<Partial, String> {
    let kind = kind_from_proto(series.r#type).map_err(|error| error.to_string())?;
    if series.series_id.is_empty() {
        return Err("a series has an empty id".to_owned());
    }
    let name = || String::from_utf8_lossy(&series.series_id).into_owned();
    let actual = shard_of(&series.series_id, num_shards);
    if actual != shard {
        return Err(format!("series `{}` belongs to shard {actual}, not {shard}", name()));
    }
    let Some(wire) = &series.aggregate else {
        return Err(format!("series `{}` has no aggregate", name()));
    };
    let aggregate =
        Aggregate::from_proto(wire).map_err(|error| format!("series `{}`: {}", name(), error_chain(&error)))?;
    let fits = matches!(
        (kind, &aggregate),
        (MetricKind::Counter, Aggregate::Counter(_))
            | (MetricKind::Gauge, Aggregate::Gauge(_))
            | (MetricKind::Set, Aggregate::Set(_))
            | (MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution, Aggregate::Distribution(_))
    );
    if !fits {
        return Err(format!(
            "series `{}` of type {} carries a {} aggregate",
            name(),
            kind.as_str(),
            aggregate.kind_name()
        ));
    }
    Ok(Partial { kind, id: series.series_id, aggregate })
}

fn protocol(reason: &'static str, message: String) -> Decoded {
    Decoded::Protocol { reason, message }
}

#[cfg(test)]
mod tests {
    use tessera_proto::{Frame, ShardPartials};

    use super::*;

    fn placement() -> PlacementHandle {
        PlacementHandle::fixed(Placement::init(&[("a", "h:1"), ("b", "h:2")], 8, 1, 0).unwrap())
    }

    fn series_of_shard(shard: u32) -> SeriesValue {
        let id = (0..).map(|n| format!("s{n}")).find(|id| shard_of(id.as_bytes(), 8) == shard).unwrap();
        SeriesValue {
            series_id: id.into_bytes(),
            r#type: tessera_proto::MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        }
    }

    fn frame(shards: Vec<ShardPartials>) -> Vec<u8> {
        let batch = PartialBatch { sequence: 9, window_start_ms: 1000, window_ms: 1000, shards, ..Default::default() };
        framing::encode_frame(&Frame { body: Some(Body::Partials(batch)) }, 1 << 20).unwrap()
    }

    fn refused(decoded: Decoded) -> (Reason, String) {
        match decoded {
            Decoded::Refused { reason, message, sequence: 9, .. } => (reason, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn owned_shards_decode_into_a_batch() {
        let mut decoder = Decoder::new("a".into(), placement(), 1 << 20, 1);
        // Instance `a` owns the even shards.
        let shards = vec![
            ShardPartials { shard: 0, series: vec![series_of_shard(0)] },
            ShardPartials { shard: 2, series: vec![series_of_shard(2), series_of_shard(2)] },
        ];
        match decoder.decode(&frame(shards)) {
            Decoded::Batch { sequence: 9, batch } => {
                assert_eq!((batch.window_start_ms, batch.window_ms, batch.partials()), (1000, 1000, 3));
            }
            other => panic!("{other:?}"),
        }
        // With four merge threads, each shard's partials go to thread `shard mod 4`.
        let mut decoder = Decoder::new("a".into(), placement(), 1 << 20, 4);
        let shards = vec![
            ShardPartials { shard: 0, series: vec![series_of_shard(0)] },
            ShardPartials { shard: 6, series: vec![series_of_shard(6), series_of_shard(6)] },
        ];
        match decoder.decode(&frame(shards)) {
            Decoded::Batch { batch, .. } => {
                let sizes: Vec<usize> = batch.shares.iter().map(Vec::len).collect();
                assert_eq!(sizes, [1, 0, 2, 0]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_foreign_shard_refuses_the_whole_batch() {
        let mut decoder = Decoder::new("a".into(), placement(), 1 << 20, 1);
        let shards = vec![
            ShardPartials { shard: 0, series: vec![series_of_shard(0)] },
            ShardPartials { shard: 1, series: vec![series_of_shard(1)] },
        ];
        let (reason, message) = refused(decoder.decode(&frame(shards)));
        assert_eq!(reason, Reason::NotOwner);
        assert!(message.contains("shard 1 is not owned by `a`"), "{message}");
        let (reason, _) = refused(decoder.decode(&frame(vec![ShardPartials { shard: 99, series: vec![] }])));
        assert_eq!(reason, Reason::Malformed);
    }

    #[test]
    fn bad_series_are_malformed_and_garbage_closes_the_connection() {
        let mut decoder = Decoder::new("a".into(), placement(), 1 << 20, 1);
        let mut wrong_shard = series_of_shard(2);
        wrong_shard.series_id = series_of_shard(4).series_id;
        let mut wrong_type = series_of_shard(0);
        wrong_type.r#type = tessera_proto::MetricType::Gauge as i32;
        let mut not_finite = series_of_shard(0);
        not_finite.aggregate =
            Some(tessera_proto::Aggregate { value: Some(tessera_proto::aggregate::Value::Counter(f64::NAN)) });
        let mut unknown_type = series_of_shard(0);
        unknown_type.r#type = 77;
        for (series, shard, fragment) in [
            (wrong_shard, 2, "belongs to shard 4"),
            (wrong_type, 0, "of type gauge carries a counter"),
            (not_finite, 0, "non-finite sum"),
            (unknown_type, 0, "unknown metric type 77"),
        ] {
            let (reason, message) =
                refused(decoder.decode(&frame(vec![ShardPartials { shard, series: vec![series] }])));
            assert_eq!(reason, Reason::Malformed);
            assert!(message.contains(fragment), "{fragment}: {message}");
        }
        let mut garbage = vec![0, 0, 0, 4];
        garbage.extend_from_slice(&[0xff; 4]);
        assert!(matches!(decoder.decode(&garbage), Decoded::Protocol { reason: "malformed_frame", .. }));
        let ack = framing::encode_frame(&Frame { body: Some(Body::Ack(Default::default())) }, 1024).unwrap();
        assert!(matches!(decoder.decode(&ack), Decoded::Protocol { reason: "unexpected_frame", .. }));
    }
}
