//! Decoding and checking one partial batch frame, off the async runtime.
//!
//! [`Decoder::decode`] turns the bytes of a frame into a [`SplitBatch`]
//! ready for admission, or into the refusal to send back. It checks, for the
//! batch as a whole (one bad series refuses the whole batch, so nothing
//! of it is applied):
//!
//! 1. the frame is a `PartialBatch` (anything else closes the connection, by the wire's
//!    one policy: `tessera_wire`, *Answering a batch*);
//! 2. every shard is below `num_shards` and owned by this instance for the
//!    window (`Placement::owns(id, shard, window_start_ms)`), otherwise
//!    `not_owner`;
//! 3. every series has a known type, a non-empty id that hashes to the
//!    shard it came in, and a valid aggregate of that type, otherwise
//!    `malformed`.
//!
//! 4. every series named by a ref (`SeriesValue.ref`) is defined in the
//!    connection's dictionary ([`super::dictionary`]), for the shard it
//!    came in, otherwise `unknown_series_ref` (or `malformed`).
//!
//! Whether the window is still open is the admission thread's decision (it
//! owns the clock of tile closes), made right before it dispatches. The
//! partials of a batch come out split into one share per merge thread
//! ([`thread_of`] of their shard).

use std::collections::HashMap;

use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_proto::frame::Body;
use tessera_proto::partials::MAX_SERIES_REFS;
use tessera_proto::{PartialBatch, SeriesValue};
use tessera_topology::{Placement, PlacementHandle};

use super::batch::{Partial, SplitBatch, Via, thread_of};
use super::dictionary::ConnectionDictionary;
use tessera_proto::AckReason;
use tessera_runtime::logging::error_chain;
use tessera_wire::{BadFrame, CloseReason, take_batch};

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
        reason: AckReason,
        /// Details for the ack message and logs.
        message: String,
        /// Series partials in the batch.
        partials: u64,
        /// The batch's watermark, if it carried one.
        watermark_ms: Option<i64>,
    },
    /// The frame cannot be trusted; the connection is closed.
    Protocol {
        /// Why: [`CloseReason::MalformedFrame`] or [`CloseReason::UnexpectedFrame`].
        reason: CloseReason,
        /// Details for the log.
        message: String,
    },
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
    merge_threads: usize,
    owned: Option<OwnedShards>,
    dictionaries: HashMap<u64, ConnectionDictionary>,
    /// A connection whose old dictionary the merge threads must forget
    /// before its last decoded batch is applied.
    forgotten: Option<u64>,
}

impl Decoder {
    /// A decoder for `instance_id` reading the placement from `placement`,
    /// splitting batches for `merge_threads` merge threads.
    pub fn new(instance_id: String, placement: PlacementHandle, merge_threads: usize) -> Decoder {
        Decoder {
            instance_id,
            placement,
            merge_threads: merge_threads.max(1),
            owned: None,
            dictionaries: HashMap::new(),
            forgotten: None,
        }
    }

    /// The connection whose previous dictionary the last [`Decoder::decode`]
    /// ended: the merge threads must forget it before anything of that
    /// batch (or a later one) is applied.
    pub fn take_forgotten(&mut self) -> Option<u64> {
        self.forgotten.take()
    }

    /// Drops a closed connection's dictionary.
    pub fn closed(&mut self, connection: u64) {
        self.dictionaries.remove(&connection);
    }

    /// Refs defined across every connection's dictionary.
    pub fn dictionary_refs(&self) -> usize {
        self.dictionaries.values().map(ConnectionDictionary::len).sum()
    }

    /// Decodes and checks one frame's body (without its length prefix) that came on
    /// `connection`.
    pub fn decode(&mut self, connection: u64, body: &[u8]) -> Decoded {
        let taken = take_batch(body, "an aggregator takes partial batches", |body| match body {
            Body::Partials(batch) => Ok(batch),
            other => Err(other),
        });
        let batch = match taken {
            Ok(batch) => batch,
            Err(BadFrame { reason, message }) => return protocol(reason, message),
        };
        self.check(connection, batch)
    }

    fn check(&mut self, connection: u64, batch: PartialBatch) -> Decoded {
        let sequence = batch.sequence;
        let partials: u64 = batch.shards.iter().map(|shard| shard.series.len() as u64).sum();
        let watermark_ms = (batch.watermark_ms != 0).then_some(batch.watermark_ms);
        let refuse = |reason, message| Decoded::Refused { sequence, reason, message, partials, watermark_ms };
        let placement = self.placement.current();
        let num_shards = placement.num_shards();
        for group in &batch.shards {
            if group.shard >= num_shards {
                let message = format!("shard {} is out of range (the placement has {num_shards} shards)", group.shard);
                return refuse(AckReason::Malformed, message);
            }
            if !self.owns(&placement, group.shard, batch.window_start_ms) {
                let message = format!(
                    "shard {} is not owned by `{}` for the window at {} (placement version {})",
                    group.shard,
                    self.instance_id,
                    batch.window_start_ms,
                    placement.version()
                );
                return refuse(AckReason::NotOwner, message);
            }
        }
        let window_ms = i64::from(batch.window_ms);
        let dictionary = self.dictionaries.entry(connection).or_default();
        if batch.dictionary != 0 && batch.dictionary != dictionary.generation {
            if dictionary.generation != 0 {
                self.forgotten = Some(connection);
            }
            dictionary.restart(batch.dictionary);
        }
        dictionary.begin();
        let mut shares: Vec<Vec<Partial>> = vec![Vec::new(); self.merge_threads];
        for group in batch.shards {
            let thread = thread_of(group.shard, self.merge_threads);
            let share = &mut shares[thread];
            share.reserve(group.series.len());
            for series in group.series {
                let named = match (series.r#ref, series.series_id.is_empty()) {
                    (0, _) => partial(series, group.shard, num_shards),
                    (series_ref, _) if batch.dictionary == 0 => {
                        Err(format!("series ref {series_ref} in a batch without a dictionary"))
                    }
                    // Refused before it can size the dictionary's table.
                    (series_ref, false) if series_ref > MAX_SERIES_REFS => Err(format!(
                        "series ref {series_ref} is over the largest a dictionary holds ({MAX_SERIES_REFS})"
                    )),
                    (series_ref, false) => partial(series, group.shard, num_shards).map(|mut partial| {
                        let slot = dictionary.define(series_ref, partial.kind, group.shard, thread);
                        partial.via = Via::Define { slot };
                        partial
                    }),
                    (series_ref, true) => {
                        let Some(entry) = dictionary.get(series_ref) else {
                            let message = format!(
                                "series ref {series_ref} is not in dictionary {} of this connection",
                                batch.dictionary
                            );
                            dictionary.rollback();
                            return refuse(AckReason::UnknownSeriesRef, message);
                        };
                        if entry.shard != group.shard {
                            Err(format!(
                                "series ref {series_ref} belongs to shard {}, not {}",
                                entry.shard, group.shard
                            ))
                        } else {
                            let name = || format!("ref {series_ref}");
                            aggregate_of(entry.kind, series.aggregate.as_ref(), name).map(|aggregate| Partial {
                                via: Via::Ref { slot: entry.slot },
                                kind: entry.kind,
                                id: Vec::new(),
                                aggregate,
                            })
                        }
                    }
                };
                match named {
                    Ok(partial) => share.push(partial),
                    Err(message) => {
                        dictionary.rollback();
                        return refuse(AckReason::Malformed, message);
                    }
                }
            }
        }
        let batch = SplitBatch {
            window_start_ms: batch.window_start_ms,
            window_ms,
            shares,
            watermark_ms,
            expanded_from: batch.expanded_from,
        };
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
    let name = || format!("series `{}`", String::from_utf8_lossy(&series.series_id));
    let actual = shard_of(&series.series_id, num_shards);
    if actual != shard {
        return Err(format!("{} belongs to shard {actual}, not {shard}", name()));
    }
    let aggregate = aggregate_of(kind, series.aggregate.as_ref(), name)?;
    Ok(Partial { via: Via::Id, kind, id: series.series_id, aggregate })
}

/// A wire aggregate checked against its series' kind; `name` names the
/// series in errors.
fn aggregate_of(
    kind: MetricKind,
    wire: Option<&tessera_proto::Aggregate>,
    name: impl Fn() -> String,
) -> Result<Aggregate, String> {
    let Some(wire) = wire else {
        return Err(format!("{} has no aggregate", name()));
    };
    let aggregate = Aggregate::from_proto(wire).map_err(|error| format!("{}: {}", name(), error_chain(&error)))?;
    let fits = matches!(
        (kind, &aggregate),
        (MetricKind::Counter, Aggregate::Counter(_))
            | (MetricKind::Gauge, Aggregate::Gauge(_))
            | (MetricKind::Set, Aggregate::Set(_))
            | (MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution, Aggregate::Distribution(_))
    );
    if !fits {
        return Err(format!("{} of type {} carries a {} aggregate", name(), kind.as_str(), aggregate.kind_name()));
    }
    Ok(aggregate)
}

fn protocol(reason: CloseReason, message: String) -> Decoded {
    Decoded::Protocol { reason, message }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use tessera_proto::{Frame, ShardPartials};

    use super::*;

    fn placement() -> PlacementHandle {
        PlacementHandle::fixed(Placement::init(&[("a", "h:1"), ("b", "h:2")], 8, 1, 0).unwrap())
    }

    fn series_of_shard(shard: u32) -> SeriesValue {
        let id = (0..).map(|n| format!("s{n}")).find(|id| shard_of(id.as_bytes(), 8) == shard).unwrap();
        SeriesValue {
            r#ref: 0,
            series_id: id.into_bytes(),
            r#type: tessera_proto::MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        }
    }

    /// `count` partials of series hashed to `shard`.
    fn shard_partials(shard: u32, count: usize) -> ShardPartials {
        ShardPartials { shard, series: (0..count).map(|_| series_of_shard(shard)).collect() }
    }

    /// A partial batch (sequence 9, window 1000..2000 ms) of `shards`, its refs in `dictionary`
    /// (0: none), framed.
    fn frame(dictionary: u64, shards: Vec<ShardPartials>) -> Vec<u8> {
        let batch = PartialBatch {
            sequence: 9,
            window_start_ms: 1000,
            window_ms: 1000,
            shards,
            dictionary,
            ..Default::default()
        };
        Frame { body: Some(Body::Partials(batch)) }.encode_to_vec()
    }

    /// A decoder for instance `a` with `merge_threads` merge threads.
    fn new_decoder(merge_threads: usize) -> Decoder {
        Decoder::new("a".into(), placement(), merge_threads)
    }

    fn refused(decoded: Decoded) -> (AckReason, String) {
        match decoded {
            Decoded::Refused { reason, message, sequence: 9, .. } => (reason, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn owned_shards_decode_into_a_batch() {
        // Instance `a` owns the even shards.
        match new_decoder(1).decode(1, &frame(0, vec![shard_partials(0, 1), shard_partials(2, 2)])) {
            Decoded::Batch { sequence: 9, batch } => {
                assert_eq!((batch.window_start_ms, batch.window_ms, batch.partials()), (1000, 1000, 3));
            }
            other => panic!("{other:?}"),
        }
        // With four merge threads, each shard's partials go to thread `shard mod 4`.
        match new_decoder(4).decode(1, &frame(0, vec![shard_partials(0, 1), shard_partials(6, 2)])) {
            Decoded::Batch { batch, .. } => {
                let sizes: Vec<usize> = batch.shares.iter().map(Vec::len).collect();
                assert_eq!(sizes, [1, 0, 2, 0]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_foreign_shard_refuses_the_whole_batch() {
        let mut decoder = new_decoder(1);
        let (reason, message) = refused(decoder.decode(1, &frame(0, vec![shard_partials(0, 1), shard_partials(1, 1)])));
        assert_eq!(reason, AckReason::NotOwner);
        assert!(message.contains("shard 1 is not owned by `a`"), "{message}");
        let (reason, _) = refused(decoder.decode(1, &frame(0, vec![shard_partials(99, 0)])));
        assert_eq!(reason, AckReason::Malformed);
    }

    #[test]
    fn bad_series_are_malformed_and_garbage_closes_the_connection() {
        let mut decoder = new_decoder(1);
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
                refused(decoder.decode(1, &frame(0, vec![ShardPartials { shard, series: vec![series] }])));
            assert_eq!(reason, AckReason::Malformed);
            assert!(message.contains(fragment), "{fragment}: {message}");
        }
        let garbage = [0xff; 4];
        assert!(matches!(decoder.decode(1, &garbage), Decoded::Protocol { reason: CloseReason::MalformedFrame, .. }));
        let ack = Frame { body: Some(Body::Ack(Default::default())) }.encode_to_vec();
        assert!(matches!(decoder.decode(1, &ack), Decoded::Protocol { reason: CloseReason::UnexpectedFrame, .. }));
        let empty = Frame { body: None }.encode_to_vec();
        assert!(matches!(decoder.decode(1, &empty), Decoded::Protocol { reason: CloseReason::EmptyFrame, .. }));
    }

    #[test]
    fn refs_resolve_through_the_connections_dictionary_and_unknown_ones_refuse_the_batch() {
        let mut decoder = new_decoder(2);
        let framed = |dictionary: u64, shard: u32, series: Vec<SeriesValue>| {
            frame(dictionary, vec![ShardPartials { shard, series }])
        };
        let define = |series_ref: u32| SeriesValue { r#ref: series_ref, ..series_of_shard(2) };
        let by_ref = |series_ref: u32| SeriesValue {
            r#ref: series_ref,
            series_id: Vec::new(),
            r#type: 0,
            aggregate: Some(Aggregate::Counter(2.0).to_proto()),
        };
        let vias = |decoded: Decoded| match decoded {
            Decoded::Batch { batch, .. } => {
                batch.shares.concat().iter().map(|partial| (partial.via, partial.kind, partial.id.len())).collect()
            }
            other => panic!("{other:?}"),
        };
        let id_len = series_of_shard(2).series_id.len();
        let vias_1: Vec<(Via, MetricKind, usize)> = vias(decoder.decode(1, &framed(5, 2, vec![define(7), by_ref(7)])));
        assert_eq!(
            vias_1,
            [(Via::Define { slot: 0 }, MetricKind::Counter, id_len), (Via::Ref { slot: 0 }, MetricKind::Counter, 0)]
        );
        assert_eq!((decoder.take_forgotten(), decoder.dictionary_refs()), (None, 1));
        // Another connection knows nothing of connection 1's refs.
        let (reason, message) = refused(decoder.decode(2, &framed(5, 2, vec![by_ref(7)])));
        assert_eq!(reason, AckReason::UnknownSeriesRef);
        assert!(message.contains("series ref 7 is not in dictionary 5"), "{message}");
        // A ref without a dictionary, or in another shard than its definition, is malformed.
        assert_eq!(refused(decoder.decode(1, &framed(0, 2, vec![by_ref(7)]))).0, AckReason::Malformed);
        let (reason, message) = refused(decoder.decode(1, &framed(5, 4, vec![by_ref(7)])));
        assert_eq!(reason, AckReason::Malformed);
        assert!(message.contains("belongs to shard 2, not 4"), "{message}");
        // A new dictionary on connection 1 forgets the old one, here and on the merge threads.
        assert_eq!(refused(decoder.decode(1, &framed(6, 2, vec![by_ref(7)]))).0, AckReason::UnknownSeriesRef);
        assert_eq!(decoder.take_forgotten(), Some(1));
        decoder.closed(1);
        assert_eq!(decoder.dictionary_refs(), 0);
        // A ref far beyond what the dictionary holds is refused before it sizes anything.
        let (reason, message) = refused(decoder.decode(4, &framed(1, 2, vec![define(u32::MAX)])));
        assert_eq!(reason, AckReason::Malformed);
        assert!(message.contains("series ref 4294967295 is over the largest"), "{message}");
        assert!(matches!(decoder.decode(4, &framed(1, 2, vec![define(MAX_SERIES_REFS)])), Decoded::Batch { .. }));
        decoder.closed(4);
        // A refused batch defines nothing: a malformed series after a
        // definition leaves the ref unknown to the next batch.
        let mut malformed = series_of_shard(2);
        malformed.aggregate = None;
        assert_eq!(refused(decoder.decode(3, &framed(1, 2, vec![define(4), malformed]))).0, AckReason::Malformed);
        assert_eq!(decoder.dictionary_refs(), 0);
        assert_eq!(refused(decoder.decode(3, &framed(1, 2, vec![by_ref(4)]))).0, AckReason::UnknownSeriesRef);
    }
}
