//! Encodes [`PartialBatch`] frames series by series, without building the
//! message tree.
//!
//! A collector flushes every series it saw in a window: at a million series
//! per second, building one `SeriesValue` per series (its id copied into a
//! `Vec`, pushed into per-shard vectors, then walked again by the encoder)
//! costs more than reading the lines did. Instead, the flusher appends each
//! series, already encoded, to its shard's [`ShardSeries`] as it routes it,
//! and [`encode_partials_frame`] joins a batch header and whole shard
//! sections into a frame with a few copies.
//!
//! The bytes are exactly what prost writes for the same message (fields in
//! tag order, defaults omitted), so the receiving side decodes them with the
//! generated types as before; the tests check byte equality.
//!
//! ```
//! use tessera_proto::partials::{ShardSeries, encode_partials_frame};
//! use tessera_proto::{framing, frame::Body, Aggregate, MetricType, PartialBatch, aggregate::Value};
//!
//! let mut shard = ShardSeries::default();
//! let counter = Aggregate { value: Some(Value::Counter(3.0)) };
//! shard.push(1 << 20, b"requests|#env:prod", MetricType::Counter as i32, &counter, 0);
//! let header = PartialBatch { source: "host-1".into(), sequence: 7, ..Default::default() };
//! let sections: Vec<(u32, &[u8])> = shard.chunks().map(|(bytes, _)| (5, bytes)).collect();
//! let frame = encode_partials_frame(&header, &sections);
//! let (decoded, _) = framing::decode_frame(&frame, framing::DEFAULT_MAX_FRAME_BYTES).unwrap().unwrap();
//! let Some(Body::Partials(batch)) = decoded.body else { unreachable!() };
//! assert_eq!((batch.sequence, batch.shards[0].shard), (7, 5));
//! assert_eq!(batch.shards[0].series[0].series_id, b"requests|#env:prod");
//! ```

use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::{Aggregate, PartialBatch, aggregate::Value};

/// `Frame.partials`.
const FRAME_PARTIALS: u32 = 3;
/// `PartialBatch.shards`.
const BATCH_SHARDS: u32 = 6;
/// `PartialBatch.watermark_ms`.
const BATCH_WATERMARK: u32 = 7;
/// `ShardPartials.shard`.
const SHARD_NUMBER: u32 = 1;
/// `ShardPartials.series`.
const SHARD_SERIES: u32 = 2;
/// `PartialBatch.dictionary`.
const BATCH_DICTIONARY: u32 = 8;
/// `PartialBatch.expanded_from`.
const BATCH_EXPANDED_FROM: u32 = 9;
/// `SeriesValue.series_id`, `.type`, `.aggregate`, `.ref`.
const SERIES_ID: u32 = 1;
const SERIES_TYPE: u32 = 2;
const SERIES_AGGREGATE: u32 = 3;
const SERIES_REF: u32 = 4;

/// The largest ref a series dictionary may hold (see `SeriesValue.ref`):
/// a sender names further series in full, a receiver refuses larger refs.
pub const MAX_SERIES_REFS: u32 = 1 << 22;

/// `Aggregate.counter`, a double.
const AGGREGATE_COUNTER: u32 = 1;

/// Bytes of a field key for tags below 16.
const KEY_BYTES: usize = 1;
/// An encoded `Aggregate { counter }`: key and eight bytes.
const COUNTER_BYTES: usize = KEY_BYTES + 8;

/// The one-byte key of field `tag` (below 16).
#[inline]
const fn key(tag: u32, wire_type: WireType) -> u8 {
    ((tag << 3) | wire_type as u32) as u8
}

/// A varint, inline: the lengths written here are mostly one byte.
#[inline]
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Encoded series of one shard (repeated `ShardPartials.series` fields), in
/// chunks of a bounded size so that a large shard can span several frames.
///
/// [`ShardSeries::clear`] keeps the chunks' memory for the next window (what the window
/// used; a burst's extra chunks are given back).
#[derive(Debug, Default)]
pub struct ShardSeries {
    chunks: Vec<Chunk>,
    used: usize,
}

#[derive(Debug, Default)]
struct Chunk {
    bytes: Vec<u8>,
    series: u64,
}

impl ShardSeries {
    /// Appends one `SeriesValue`, starting a new chunk when the current one
    /// would grow past `chunk_bytes`; returns the bytes it took. `series_ref` 0
    /// leaves the ref out; a series named by its ref alone has an empty
    /// `series_id` and `metric_type` 0.
    pub fn push(
        &mut self,
        chunk_bytes: usize,
        series_id: &[u8],
        metric_type: i32,
        aggregate: &Aggregate,
        series_ref: u32,
    ) -> usize {
        // A counter (most series) is one fixed64 field, written here; the
        // other aggregates go through prost.
        let counter = match aggregate.value {
            Some(Value::Counter(sum)) => Some(sum),
            _ => None,
        };
        let aggregate_len = if counter.is_some() { COUNTER_BYTES } else { aggregate.encoded_len() };
        let type_len = if metric_type == 0 { 0 } else { KEY_BYTES + encoded_len_varint(i64::from(metric_type) as u64) };
        // Like prost, leave out fields that hold their default value.
        let id_len = if series_id.is_empty() {
            0
        } else {
            KEY_BYTES + encoded_len_varint(series_id.len() as u64) + series_id.len()
        };
        let ref_len = if series_ref == 0 { 0 } else { KEY_BYTES + encoded_len_varint(u64::from(series_ref)) };
        let body_len =
            id_len + type_len + KEY_BYTES + encoded_len_varint(aggregate_len as u64) + aggregate_len + ref_len;
        let field_len = KEY_BYTES + encoded_len_varint(body_len as u64) + body_len;
        let chunk = self.chunk_with_room(chunk_bytes, field_len);
        let out = &mut chunk.bytes;
        out.reserve(field_len);
        out.push(key(SHARD_SERIES, WireType::LengthDelimited));
        put_varint(out, body_len as u64);
        if !series_id.is_empty() {
            out.push(key(SERIES_ID, WireType::LengthDelimited));
            put_varint(out, series_id.len() as u64);
            out.extend_from_slice(series_id);
        }
        if metric_type != 0 {
            out.push(key(SERIES_TYPE, WireType::Varint));
            put_varint(out, i64::from(metric_type) as u64);
        }
        out.push(key(SERIES_AGGREGATE, WireType::LengthDelimited));
        put_varint(out, aggregate_len as u64);
        match counter {
            Some(sum) => {
                out.push(key(AGGREGATE_COUNTER, WireType::SixtyFourBit));
                out.extend_from_slice(&sum.to_le_bytes());
            }
            None => aggregate.encode(out).expect("a Vec grows to fit"),
        }
        if series_ref != 0 {
            out.push(key(SERIES_REF, WireType::Varint));
            put_varint(out, u64::from(series_ref));
        }
        chunk.series += 1;
        field_len
    }

    fn chunk_with_room(&mut self, chunk_bytes: usize, field_len: usize) -> &mut Chunk {
        let current_full = self.used == 0 || {
            let current = &self.chunks[self.used - 1];
            current.series > 0 && current.bytes.len() + field_len > chunk_bytes
        };
        if current_full {
            if self.used == self.chunks.len() {
                self.chunks.push(Chunk::default());
            }
            self.used += 1;
        }
        &mut self.chunks[self.used - 1]
    }

    /// Whether no series was pushed since the last clear.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Series pushed since the last clear.
    pub fn series(&self) -> u64 {
        self.chunks[..self.used].iter().map(|chunk| chunk.series).sum()
    }

    /// The chunks in order: encoded series and how many.
    pub fn chunks(&self) -> impl Iterator<Item = (&[u8], u64)> {
        self.chunks[..self.used].iter().map(|chunk| (chunk.bytes.as_slice(), chunk.series))
    }

    /// Takes the chunks out in order, with their series counts, leaving no series: the
    /// caller owns (and frees) their memory. [`cut_frames`] frees each once it is framed.
    pub fn drain_chunks(&mut self) -> impl Iterator<Item = (Vec<u8>, u64)> + '_ {
        let used = std::mem::take(&mut self.used);
        self.chunks.drain(..).take(used).map(|chunk| (chunk.bytes, chunk.series))
    }

    /// Forgets the series, keeping the memory of the chunks this window used; chunks a
    /// burst of series grew beyond twice that are given back.
    pub fn clear(&mut self) {
        for chunk in &mut self.chunks[..self.used] {
            chunk.bytes.clear();
            chunk.series = 0;
        }
        if self.chunks.len() > 2 * self.used + 2 {
            self.chunks.truncate(self.used + 1);
        }
        self.used = 0;
    }
}

/// One length-prefixed `Frame { partials }`: `header` (whose `shards` must
/// be empty) followed by one `ShardPartials` per `(shard, encoded series)`
/// section, in the order given, and the header's `watermark_ms`,
/// `dictionary` and `expanded_from` last (their tags follow `shards`, which
/// is where prost writes them).
pub fn encode_partials_frame(header: &PartialBatch, sections: &[(u32, &[u8])]) -> Vec<u8> {
    debug_assert!(header.shards.is_empty(), "sections carry the shards");
    // The varint fields tagged after `shards`, in tag order; prost omits zeros.
    let trailing = [
        (BATCH_WATERMARK, header.watermark_ms as u64),
        (BATCH_DICTIONARY, header.dictionary),
        (BATCH_EXPANDED_FROM, header.expanded_from),
    ];
    let header = PartialBatch { watermark_ms: 0, dictionary: 0, expanded_from: 0, ..header.clone() };
    let trailing_len: usize =
        trailing.iter().filter(|(_, value)| *value != 0).map(|(_, value)| KEY_BYTES + encoded_len_varint(*value)).sum();
    let section_body_len = |shard: u32, series: &[u8]| {
        let number_len = if shard == 0 { 0 } else { KEY_BYTES + encoded_len_varint(u64::from(shard)) };
        number_len + series.len()
    };
    let sections_len: usize = sections
        .iter()
        .map(|(shard, series)| {
            let body = section_body_len(*shard, series);
            KEY_BYTES + encoded_len_varint(body as u64) + body
        })
        .sum();
    let batch_len = header.encoded_len() + sections_len + trailing_len;
    let frame_len = KEY_BYTES + encoded_len_varint(batch_len as u64) + batch_len;
    let mut out = Vec::with_capacity(4 + frame_len);
    out.extend_from_slice(&(frame_len as u32).to_be_bytes());
    encode_key(FRAME_PARTIALS, WireType::LengthDelimited, &mut out);
    encode_varint(batch_len as u64, &mut out);
    header.encode(&mut out).expect("a Vec grows to fit");
    for (shard, series) in sections {
        encode_key(BATCH_SHARDS, WireType::LengthDelimited, &mut out);
        encode_varint(section_body_len(*shard, series) as u64, &mut out);
        if *shard != 0 {
            encode_key(SHARD_NUMBER, WireType::Varint, &mut out);
            encode_varint(u64::from(*shard), &mut out);
        }
        out.extend_from_slice(series);
    }
    for (tag, value) in trailing.into_iter().filter(|(_, value)| *value != 0) {
        encode_key(tag, WireType::Varint, &mut out);
        encode_varint(value, &mut out);
    }
    debug_assert_eq!(out.len(), 4 + frame_len);
    out
}

/// Cuts one window's encoded shards into frames of whole chunks under
/// `budget` bytes, shards in the order given, handing each to `out` with
/// its sequence (from `sequences`) and series count; no shards is one frame
/// with none. The last frame carries `header.watermark_ms`, the others at
/// most the window's start: a receiver must not take the window as sent in
/// full before its last frame.
///
/// Each shard comes as its chunks and their series counts: borrowed
/// ([`ShardSeries::chunks`]) or owned ([`ShardSeries::drain_chunks`]). Owned
/// chunks are freed as soon as their frame is encoded, so that a window's
/// encoded series and its frames are not both held whole.
pub fn cut_frames<B: AsRef<[u8]>, C: IntoIterator<Item = (B, u64)>>(
    header: &PartialBatch,
    shards: impl IntoIterator<Item = (u32, C)>,
    budget: usize,
    sequences: &mut dyn FnMut() -> u64,
    mut out: impl FnMut(u64, Vec<u8>, u64),
) {
    let mut sections: Vec<(u32, B)> = Vec::new();
    let (mut pending_bytes, mut pending_series) = (0usize, 0u64);
    let mut cut = |sections: &mut Vec<(u32, B)>, series: &mut u64, bytes: &mut usize, last: bool| {
        if sections.is_empty() && !last {
            return;
        }
        let watermark_ms = if last { header.watermark_ms } else { header.watermark_ms.min(header.window_start_ms) };
        let sequence = sequences();
        let slices: Vec<(u32, &[u8])> = sections.iter().map(|(shard, chunk)| (*shard, chunk.as_ref())).collect();
        let frame = encode_partials_frame(&PartialBatch { sequence, watermark_ms, ..header.clone() }, &slices);
        out(sequence, frame, *series);
        sections.clear();
        (*series, *bytes) = (0, 0);
    };
    for (shard, chunks) in shards {
        for (chunk, count) in chunks {
            let len = chunk.as_ref().len();
            if pending_bytes + len > budget {
                cut(&mut sections, &mut pending_series, &mut pending_bytes, false);
            }
            sections.push((shard, chunk));
            pending_bytes += len + 8;
            pending_series += count;
        }
    }
    cut(&mut sections, &mut pending_series, &mut pending_bytes, true);
}

/// Why a batch's refs could not be expanded.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    /// The frame is not a partial batch that decodes.
    #[error("not a partial batch frame: {0}")]
    Frame(String),
    /// A ref the dictionary does not hold.
    #[error("ref {0} is not in the dictionary")]
    UnknownRef(u32),
}

/// Rewrites a partial batch frame that names series by ref into frames
/// that name every series in full and carry no dictionary, for a
/// connection that never saw the refs' definitions (the batch was encoded
/// for a connection or dictionary that is gone). `lookup` gives a ref's
/// `(metric type, series id)`.
///
/// Ids are longer than refs, so the batch is split, by whole shard groups
/// and within them, into frames of at most `budget` encoded series bytes
/// each; every frame but the last carries a watermark no later than the
/// window's start (as the sender's own split does). `sequences` numbers
/// the frames; each names the batch's own sequence as the one it was
/// expanded from, so that a receiver that took the batch takes none of them.
pub fn expand_refs<'d>(
    frame: &[u8],
    max_frame_bytes: usize,
    budget: usize,
    mut sequences: impl FnMut() -> u64,
    lookup: impl Fn(u32) -> Option<(i32, &'d [u8])>,
) -> Result<Vec<(u64, Vec<u8>, u64)>, ExpandError> {
    let mut header = match crate::framing::decode_frame(frame, max_frame_bytes) {
        Ok(Some((crate::Frame { body: Some(crate::frame::Body::Partials(batch)) }, _))) => batch,
        Ok(_) => return Err(ExpandError::Frame("not a partial batch".into())),
        Err(error) => return Err(ExpandError::Frame(error.to_string())),
    };
    let groups = std::mem::take(&mut header.shards);
    header.dictionary = 0;
    header.expanded_from = header.sequence;
    let empty = Aggregate::default();
    let mut shards: Vec<(u32, ShardSeries)> = Vec::with_capacity(groups.len());
    for group in &groups {
        let mut series = ShardSeries::default();
        for value in &group.series {
            let aggregate = value.aggregate.as_ref().unwrap_or(&empty);
            if value.r#ref != 0 && value.series_id.is_empty() {
                let (metric_type, id) = lookup(value.r#ref).ok_or(ExpandError::UnknownRef(value.r#ref))?;
                series.push(budget, id, metric_type, aggregate, 0);
            } else {
                series.push(budget, &value.series_id, value.r#type, aggregate, 0);
            }
        }
        shards.push((group.shard, series));
    }
    let mut frames = Vec::new();
    let sections = shards.iter().map(|(shard, series)| (*shard, series.chunks()));
    cut_frames(&header, sections, budget, &mut sequences, |sequence, frame, series| {
        frames.push((sequence, frame, series));
    });
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::{DEFAULT_MAX_FRAME_BYTES, encode_frame};
    use crate::{Frame, Gauge, MetricType, SeriesValue, ShardPartials, frame::Body};

    fn series(n: usize) -> Vec<SeriesValue> {
        (0..n)
            .map(|i| SeriesValue {
                r#ref: 0,
                series_id: format!("metric.{i}|#host:h{}", i % 7).into_bytes(),
                r#type: if i % 3 == 0 { MetricType::Gauge as i32 } else { MetricType::Counter as i32 },
                aggregate: Some(Aggregate {
                    value: Some(if i % 3 == 0 {
                        Value::Gauge(Gauge { has_value: true, value: i as f64, timestamp_ns: 5, ..Gauge::default() })
                    } else {
                        Value::Counter(i as f64 * 0.5)
                    }),
                }),
            })
            .collect()
    }

    fn header(sequence: u64) -> PartialBatch {
        PartialBatch {
            dictionary: 0,
            source: "collector-a".into(),
            sequence,
            window_start_ms: 1_700_000_000_000,
            window_ms: 1000,
            placement_version: 3,
            shards: Vec::new(),
            watermark_ms: 1_700_000_001_000,
            expanded_from: 0,
        }
    }

    #[test]
    fn a_heartbeat_with_no_shards_is_what_prost_writes() {
        let ours = encode_partials_frame(&header(4), &[]);
        let theirs = encode_frame(&Frame { body: Some(Body::Partials(header(4))) }, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(ours, theirs);
        for trailing in [
            PartialBatch { watermark_ms: 0, ..header(4) },
            PartialBatch { dictionary: 5, expanded_from: 3, ..header(4) },
            PartialBatch { watermark_ms: 0, expanded_from: 300, ..header(4) },
        ] {
            let theirs =
                encode_frame(&Frame { body: Some(Body::Partials(trailing.clone())) }, DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(encode_partials_frame(&trailing, &[]), theirs, "{trailing:?}");
        }
    }

    #[test]
    fn frames_are_byte_for_byte_what_prost_writes() {
        // Shard 0 (whose number prost omits), a big shard number, an empty id.
        let mut values = series(40);
        values.push(SeriesValue { r#ref: 0, series_id: Vec::new(), r#type: 0, aggregate: Some(Aggregate::default()) });
        let shards = [(0u32, &values[..10]), (7, &values[10..30]), (300_000, &values[30..])];
        let mut encoded: Vec<(u32, ShardSeries)> = Vec::new();
        for (shard, values) in shards {
            let mut buffer = ShardSeries::default();
            for value in values {
                buffer.push(1 << 20, &value.series_id, value.r#type, value.aggregate.as_ref().unwrap(), value.r#ref);
            }
            assert_eq!(buffer.series(), values.len() as u64);
            encoded.push((shard, buffer));
        }
        let sections: Vec<(u32, &[u8])> =
            encoded.iter().flat_map(|(shard, buffer)| buffer.chunks().map(move |(bytes, _)| (*shard, bytes))).collect();
        let ours = encode_partials_frame(&header(9), &sections);

        let mut batch = header(9);
        batch.shards =
            shards.iter().map(|(shard, values)| ShardPartials { shard: *shard, series: values.to_vec() }).collect();
        let theirs = encode_frame(&Frame { body: Some(Body::Partials(batch)) }, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn a_shard_is_split_into_chunks_under_the_bound_and_cleared_for_reuse() {
        let values = series(1000);
        let mut buffer = ShardSeries::default();
        for value in &values {
            buffer.push(2048, &value.series_id, value.r#type, value.aggregate.as_ref().unwrap(), value.r#ref);
        }
        let chunks: Vec<(&[u8], u64)> = buffer.chunks().collect();
        assert!(chunks.len() > 5, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|(bytes, _)| bytes.len() <= 2048));
        assert_eq!(chunks.iter().map(|(_, n)| n).sum::<u64>(), 1000);
        // Each chunk is a whole number of series: decoded in order, they are the input.
        let mut decoded = Vec::new();
        for (bytes, _) in &chunks {
            let frame = encode_partials_frame(&header(1), &[(4, bytes)]);
            let (frame, _) = crate::framing::decode_frame(&frame, DEFAULT_MAX_FRAME_BYTES).unwrap().unwrap();
            let Some(Body::Partials(mut batch)) = frame.body else { panic!("not partials") };
            decoded.append(&mut batch.shards[0].series);
        }
        assert_eq!(decoded, values);

        buffer.clear();
        assert!(buffer.is_empty());
        assert_eq!(buffer.chunks().count(), 0);
        buffer.push(2048, b"x", MetricType::Counter as i32, &Aggregate { value: Some(Value::Counter(1.0)) }, 0);
        assert_eq!(buffer.series(), 1);
        let grown = buffer.chunks.len();
        // A window that used one chunk gives back what the burst grew.
        buffer.clear();
        assert!(grown > 5 && buffer.chunks.len() <= 2, "{grown} chunks, then {}", buffer.chunks.len());
    }

    #[test]
    fn one_series_larger_than_the_chunk_bound_gets_a_chunk_of_its_own() {
        let mut buffer = ShardSeries::default();
        let counter = Aggregate { value: Some(Value::Counter(1.0)) };
        buffer.push(64, b"a", 1, &counter, 0);
        buffer.push(64, &[b'x'; 200], 1, &counter, 0);
        buffer.push(64, b"b", 1, &counter, 0);
        let counts: Vec<u64> = buffer.chunks().map(|(_, n)| n).collect();
        assert_eq!(counts, vec![1, 1, 1]);
    }

    #[test]
    fn expanded_refs_are_split_to_the_budget_with_the_watermark_on_the_last_frame() {
        let ids: Vec<Vec<u8>> = (0..40).map(|n| format!("a.long.series.name.{n}|#host:h{n}").into_bytes()).collect();
        let mut by_ref = ShardSeries::default();
        let counter = Aggregate { value: Some(Value::Counter(1.0)) };
        for n in 0..40u32 {
            by_ref.push(1 << 20, b"", 0, &counter, n + 1);
        }
        let header = PartialBatch { window_start_ms: 5_000, watermark_ms: 6_000, dictionary: 3, ..Default::default() };
        let mut frame = Vec::new();
        cut_frames(&header, [(2, by_ref.chunks())], 1 << 20, &mut || 7, |_, bytes, _| frame = bytes);
        let mut next = 100;
        let lookup = |series_ref: u32| Some((MetricType::Counter as i32, &ids[series_ref as usize - 1][..]));
        let frames = expand_refs(
            &frame,
            1 << 20,
            512,
            || {
                next += 1;
                next
            },
            lookup,
        )
        .unwrap();
        assert!(frames.len() > 2, "{} frames", frames.len());
        let mut named = Vec::new();
        for (index, (sequence, bytes, count)) in frames.iter().enumerate() {
            let (decoded, _) = crate::framing::decode_frame(bytes, DEFAULT_MAX_FRAME_BYTES).unwrap().unwrap();
            let Some(Body::Partials(batch)) = decoded.body else { panic!("{decoded:?}") };
            let last = index == frames.len() - 1;
            assert_eq!(
                (batch.sequence, batch.dictionary, batch.watermark_ms, batch.expanded_from),
                (*sequence, 0, if last { 6_000 } else { 5_000 }, 7)
            );
            assert_eq!(*count, batch.shards[0].series.len() as u64);
            named.extend(batch.shards[0].series.iter().map(|value| (value.series_id.clone(), value.r#ref)));
        }
        assert_eq!(named, ids.iter().map(|id| (id.clone(), 0)).collect::<Vec<_>>());
        let unknown = expand_refs(&frame, 1 << 20, 512, || 0, |_| None).unwrap_err();
        assert_eq!(unknown.to_string(), "ref 1 is not in the dictionary");
    }
}
