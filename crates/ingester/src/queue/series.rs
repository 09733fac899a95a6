//! The series of a queue record, in the queue's own form, which every sink reads: labels
//! as repeated `Label { name = 1, value = 2 }` messages sorted by name, and native
//! histograms as a `Histogram` message (schema, zero bucket, spans and delta-encoded
//! integer counts, sum, reset hint).
//!
//! The form is tessera's, written here by the converter ([`crate::admit`]) and read back
//! by each sink in its own way: the file sink visits the labels ([`visit_labels`]) and
//! writes OpenMetrics text; remote write ([`crate::sink::prompb`]) copies them, because
//! the field numbers were chosen as Prometheus' `prompb` has them (`Label`, `Histogram`,
//! `BucketSpan`), so that a `TimeSeries` is the copy of a record's labels plus one sample.
//! `prompb`'s tests decode what it writes with remote write's own message types.
//!
//! **Native histograms** ([`HistogramEncoder`]) are written from a [`Sketch`] as they are:
//! its schema, its buckets as spans and delta-encoded integer counts (each count rounded to
//! the nearest integer: statsd sample rates give fractional weights, and Prometheus before
//! 2.45 takes only integer histograms over remote write), its zero bucket with the sketch's
//! threshold, and the sum. The count is the zero bucket's plus every bucket's, so it always
//! agrees with the buckets.

use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

use tessera_core::sketch::{Sketch, ZERO_THRESHOLD};

/// Wire key of a length-delimited field 1 (a label, `Label.name`).
const FIELD_1_LEN: u8 = 0x0a;
/// Wire key of a length-delimited field 2 (`Label.value`).
const FIELD_2_LEN: u8 = 0x12;

/// A native histogram, integer counts (the field numbers of `prometheus.Histogram`; its
/// float fields are not declared).
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    /// Observations, the zero bucket's included.
    #[prost(uint64, tag = "1")]
    pub count_int: u64,
    /// Sum of the observations.
    #[prost(double, tag = "3")]
    pub sum: f64,
    /// `2^schema` buckets per power of two.
    #[prost(sint32, tag = "4")]
    pub schema: i32,
    /// Magnitudes up to this count in the zero bucket.
    #[prost(double, tag = "5")]
    pub zero_threshold: f64,
    /// Observations in the zero bucket.
    #[prost(uint64, tag = "6")]
    pub zero_count_int: u64,
    /// Runs of consecutive negative buckets.
    #[prost(message, repeated, tag = "8")]
    pub negative_spans: Vec<BucketSpan>,
    /// Counts of the negative buckets, each as the difference to the one before.
    #[prost(sint64, repeated, tag = "9")]
    pub negative_deltas: Vec<i64>,
    /// Runs of consecutive positive buckets.
    #[prost(message, repeated, tag = "11")]
    pub positive_spans: Vec<BucketSpan>,
    /// Counts of the positive buckets, each as the difference to the one before.
    #[prost(sint64, repeated, tag = "12")]
    pub positive_deltas: Vec<i64>,
    /// 0 unknown, 1 a counter reset, 2 no reset, 3 a gauge histogram.
    #[prost(int32, tag = "14")]
    pub reset_hint: i32,
    /// Unix milliseconds.
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
}

/// A run of buckets (`prometheus.BucketSpan`): `length` consecutive buckets, starting `offset` buckets after
/// the end of the span before (the first span: at bucket index `offset`).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct BucketSpan {
    /// Gap to the span before, or the first index.
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    /// Buckets in the span.
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

impl Histogram {
    /// The positive buckets as `(index, count)`.
    pub fn positive_buckets(&self) -> Vec<(i32, u64)> {
        expand_buckets(&self.positive_spans, &self.positive_deltas)
    }

    /// The negative buckets as `(index of the magnitude, count)`.
    pub fn negative_buckets(&self) -> Vec<(i32, u64)> {
        expand_buckets(&self.negative_spans, &self.negative_deltas)
    }
}

fn expand_buckets(spans: &[BucketSpan], deltas: &[i64]) -> Vec<(i32, u64)> {
    let mut buckets = Vec::with_capacity(deltas.len());
    let (mut index, mut count, mut deltas) = (0i32, 0i64, deltas.iter());
    for span in spans {
        index += span.offset;
        for step in 0..span.length {
            count += deltas.next().copied().unwrap_or(0);
            buckets.push((index + step as i32, count.max(0) as u64));
        }
        index += span.length as i32;
    }
    buckets
}

/// Reset hint `YES`: the histogram restarted from zero (the ingester's first sample of it).
pub const RESET_HINT_YES: i32 = 1;

/// One label (`prometheus.Label`).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A series' labels alone: what [`decode_labels`] reads.
#[derive(Clone, PartialEq, Message)]
struct Labels {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<Label>,
}

/// `Histogram` wire keys: count_int (1), sum (3), schema (4), zero_threshold (5),
/// zero_count_int (6), negative_spans (8), negative_deltas (9), positive_spans (11),
/// positive_deltas (12), reset_hint (14); and `BucketSpan`'s offset (1) and length (2).
const HISTOGRAM_COUNT: u8 = 0x08;
const HISTOGRAM_SUM: u8 = 0x19;
const HISTOGRAM_SCHEMA: u8 = 0x20;
const HISTOGRAM_ZERO_THRESHOLD: u8 = 0x29;
const HISTOGRAM_ZERO_COUNT: u8 = 0x30;
const NEGATIVE_SPANS: u8 = 0x42;
const NEGATIVE_DELTAS: u8 = 0x4a;
const POSITIVE_SPANS: u8 = 0x5a;
const POSITIVE_DELTAS: u8 = 0x62;
const HISTOGRAM_RESET_HINT: u8 = 0x70;
const SPAN_OFFSET: u8 = 0x08;
const SPAN_LENGTH: u8 = 0x10;

/// Writes native histograms from sketches: the [`Histogram`] message without its timestamp,
/// which remote write appends ([`crate::sink::prompb::encode_write_request`]). Keeps one buffer to reuse.
#[derive(Default)]
pub struct HistogramEncoder {
    deltas: Vec<u8>,
}

impl HistogramEncoder {
    /// Appends the `Histogram` fields of `sketch` with `sum` to `out`. `reset` sets the reset
    /// hint `YES`; otherwise it stays unknown, for storage to detect resets itself.
    pub fn encode(&mut self, out: &mut Vec<u8>, sketch: &Sketch, sum: f64, reset: bool) {
        let zero = round_count(sketch.zero_count());
        out.push(HISTOGRAM_SUM);
        out.extend_from_slice(&sum.to_le_bytes());
        out.push(HISTOGRAM_SCHEMA);
        encode_varint(zigzag(i64::from(sketch.schema())), out);
        out.push(HISTOGRAM_ZERO_THRESHOLD);
        out.extend_from_slice(&ZERO_THRESHOLD.to_le_bytes());
        out.push(HISTOGRAM_ZERO_COUNT);
        encode_varint(zero, out);
        let negative = self.buckets(out, sketch.negative_buckets(), NEGATIVE_SPANS, NEGATIVE_DELTAS);
        let positive = self.buckets(out, sketch.positive_buckets(), POSITIVE_SPANS, POSITIVE_DELTAS);
        out.push(HISTOGRAM_COUNT);
        encode_varint(zero + negative + positive, out);
        if reset {
            out.push(HISTOGRAM_RESET_HINT);
            encode_varint(RESET_HINT_YES as u64, out);
        }
    }

    /// Appends the spans and the packed deltas of `buckets` (by increasing index); returns
    /// the sum of their counts.
    fn buckets(
        &mut self,
        out: &mut Vec<u8>,
        buckets: impl Iterator<Item = (i32, f64)>,
        spans_key: u8,
        deltas_key: u8,
    ) -> u64 {
        self.deltas.clear();
        let (mut total, mut previous) = (0u64, 0i64);
        // The open span: its offset, its length, and the index that would extend it.
        let mut span: Option<(i32, u32, i32)> = None;
        for (index, weight) in buckets {
            let count = round_count(weight);
            total += count;
            span = match span {
                Some((offset, length, next)) if next == index => Some((offset, length + 1, next + 1)),
                Some((offset, length, next)) => {
                    push_span(out, spans_key, offset, length);
                    Some((index - next, 1, index + 1))
                }
                None => Some((index, 1, index + 1)),
            };
            encode_varint(zigzag(count as i64 - previous), &mut self.deltas);
            previous = count as i64;
        }
        if let Some((offset, length, _)) = span {
            push_span(out, spans_key, offset, length);
            out.push(deltas_key);
            encode_varint(self.deltas.len() as u64, out);
            out.extend_from_slice(&self.deltas);
        }
        total
    }
}

/// A bucket weight as an integer count: the nearest one.
fn round_count(weight: f64) -> u64 {
    weight.round().max(0.0) as u64
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn push_span(out: &mut Vec<u8>, key: u8, offset: i32, length: u32) {
    let offset = zigzag(i64::from(offset));
    out.push(key);
    encode_varint((2 + encoded_len_varint(offset) + encoded_len_varint(u64::from(length))) as u64, out);
    out.push(SPAN_OFFSET);
    encode_varint(offset, out);
    out.push(SPAN_LENGTH);
    encode_varint(u64::from(length), out);
}

/// Appends `labels` (already sorted by name) to `out` as a series' labels.
pub fn encode_labels(out: &mut Vec<u8>, labels: &[(&str, &str)]) {
    for (name, value) in labels {
        encode_label(out, name, &[value]);
    }
}

/// Appends one `Label` (field 1) whose value is `value`'s parts joined:
/// the one label encoder, for requests and for the converter's label arena alike.
pub fn encode_label(out: &mut Vec<u8>, name: &str, value: &[&str]) {
    let value_len: usize = value.iter().map(|part| part.len()).sum();
    let inner =
        1 + encoded_len_varint(name.len() as u64) + name.len() + 1 + encoded_len_varint(value_len as u64) + value_len;
    out.reserve(1 + encoded_len_varint(inner as u64) + inner);
    out.push(FIELD_1_LEN);
    encode_varint(inner as u64, out);
    out.push(FIELD_1_LEN);
    encode_varint(name.len() as u64, out);
    out.extend_from_slice(name.as_bytes());
    out.push(FIELD_2_LEN);
    encode_varint(value_len as u64, out);
    for part in value {
        out.extend_from_slice(part.as_bytes());
    }
}

/// Calls `visit` with each `(name, value)` of pre-encoded labels, in order, without
/// allocating. Fails (and stops) on bytes that are not labels as [`encode_labels`] writes them.
pub fn visit_labels<'a>(
    mut bytes: &'a [u8],
    mut visit: impl FnMut(&'a str, &'a str),
) -> Result<(), prost::DecodeError> {
    fn take<'a>(bytes: &mut &'a [u8], key: u8) -> Result<&'a [u8], prost::DecodeError> {
        let Some((&found, rest)) = bytes.split_first() else {
            return Err(prost::DecodeError::new("truncated label"));
        };
        if found != key {
            return Err(prost::DecodeError::new("unexpected field in labels"));
        }
        *bytes = rest;
        let len = prost::encoding::decode_varint(bytes)? as usize;
        if len > bytes.len() {
            return Err(prost::DecodeError::new("label longer than its buffer"));
        }
        let (field, rest) = bytes.split_at(len);
        *bytes = rest;
        Ok(field)
    }
    let text = |field: &'a [u8]| std::str::from_utf8(field).map_err(|_| prost::DecodeError::new("label is not UTF-8"));
    while !bytes.is_empty() {
        let mut label = take(&mut bytes, FIELD_1_LEN)?;
        let name = text(take(&mut label, FIELD_1_LEN)?)?;
        let value = text(take(&mut label, FIELD_2_LEN)?)?;
        if !label.is_empty() {
            return Err(prost::DecodeError::new("unexpected field in a label"));
        }
        visit(name, value);
    }
    Ok(())
}

/// Decodes pre-encoded labels back into [`Label`]s.
pub fn decode_labels(labels: &[u8]) -> Result<Vec<Label>, prost::DecodeError> {
    Labels::decode(labels).map(|series| series.labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visiting_labels_matches_decoding_and_refuses_garbage() {
        let mut labels = Vec::new();
        encode_labels(&mut labels, &[("__name__", "a"), ("env", "pröd"), ("z", "")]);
        let mut seen = Vec::new();
        visit_labels(&labels, |name, value| seen.push((name.to_owned(), value.to_owned()))).unwrap();
        let decoded: Vec<_> = decode_labels(&labels).unwrap().into_iter().map(|l| (l.name, l.value)).collect();
        assert_eq!(seen, decoded);
        for garbage in [&b"\x0a"[..], b"\x0a\x05\x0a\x01a", b"\x12\x00", b"\x0a\x04\x0a\x01\xff\x12"] {
            assert!(visit_labels(garbage, |_, _| {}).is_err(), "{garbage:?}");
        }
    }
}
