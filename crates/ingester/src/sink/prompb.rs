//! Prometheus remote write 1.0 messages (`prompb`), and building a request body from
//! queue samples.
//!
//! Only the fields remote write 1.0 needs are declared: `WriteRequest { timeseries }`,
//! `TimeSeries { labels, samples, histograms }`, `Label { name, value }`, `Sample { value,
//! timestamp }`, and the integer native `Histogram` with its `BucketSpan`s, with the field
//! numbers of Prometheus' `prompb/remote.proto` and `types.proto`.
//!
//! **Native histograms** ([`HistogramEncoder`]) are written from a [`Sketch`] as they are:
//! its schema, its buckets as spans and delta-encoded integer counts (each count rounded to
//! the nearest integer: statsd sample rates give fractional weights, and Prometheus before
//! 2.45 takes only integer histograms over remote write), its zero bucket with the sketch's
//! threshold, and the sum. The count is the zero bucket's plus every bucket's, so it always
//! agrees with the buckets.
//!
//! Queue samples keep their labels pre-encoded ([`encode_labels`]), so
//! [`encode_write_request`] writes each `TimeSeries` by copying those bytes and appending
//! one `Sample`; no label is decoded or re-encoded on the way to storage. The body is then
//! snappy block-compressed ([`compress`]), as the protocol requires.
//!
//! ```
//! use bytes::Bytes;
//! use prost::Message;
//! use tessera_ingester::prompb::{self, WriteRequest};
//! use tessera_ingester::record::StoredSample;
//!
//! let mut labels = Vec::new();
//! prompb::encode_labels(&mut labels, &[("__name__", "hits_total"), ("env", "prod")]);
//! let sample = StoredSample { labels: Bytes::from(labels), value: 3.0, kind: 1, ..Default::default() };
//! let mut body = Vec::new();
//! prompb::encode_write_request(&mut body, std::slice::from_ref(&sample), 10_000);
//! let request = WriteRequest::decode(body.as_slice()).unwrap();
//! assert_eq!(request.timeseries[0].labels[1].value, "prod");
//! assert_eq!(request.timeseries[0].samples[0].timestamp, 10_000);
//! ```

use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

use tessera_core::sketch::{Sketch, ZERO_THRESHOLD};

use crate::queue::record::StoredSample;

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// The series, each with its samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Labels sorted by name, `__name__` among them.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples in timestamp order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    /// Native histogram samples in timestamp order.
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<Histogram>,
}

/// `prometheus.Histogram`, integer flavour (the float fields are not declared).
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

/// `prometheus.BucketSpan`: `length` consecutive buckets, starting `offset` buckets after
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

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Unix milliseconds.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Wire key of a length-delimited field 1 (`TimeSeries.labels`, `WriteRequest.timeseries`,
/// `Label.name`).
const FIELD_1_LEN: u8 = 0x0a;
/// Wire key of a length-delimited field 2 (`TimeSeries.samples`, `Label.value`).
const FIELD_2_LEN: u8 = 0x12;
/// Wire key of `Sample.value` (field 1, fixed64).
const SAMPLE_VALUE: u8 = 0x09;
/// Wire key of `Sample.timestamp` (field 2, varint).
const SAMPLE_TIMESTAMP: u8 = 0x10;
/// Wire key of `TimeSeries.histograms` (field 4, length-delimited).
const SERIES_HISTOGRAM: u8 = 0x22;
/// Wire key of `Histogram.timestamp` (field 15, varint).
const HISTOGRAM_TIMESTAMP: u8 = 0x78;

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
/// which [`encode_write_request`] appends. Keeps one buffer to reuse.
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

/// Appends `labels` (already sorted by name) to `out` as repeated `TimeSeries.labels`.
pub fn encode_labels(out: &mut Vec<u8>, labels: &[(&str, &str)]) {
    for (name, value) in labels {
        encode_label(out, name, &[value]);
    }
}

/// Appends one `Label` (field 1 of a `TimeSeries`) whose value is `value`'s parts joined:
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
    TimeSeries::decode(labels).map(|series| series.labels)
}

/// Bytes `sample` takes as one `TimeSeries` inside a `WriteRequest`, the length of the
/// `TimeSeries`, of its `Sample` or `Histogram`, and of the reset marker's `Sample`
/// before it (0 without one).
fn series_lengths(sample: &StoredSample, tile_end_ms: i64) -> (usize, usize, usize, usize) {
    let timestamp_ms = sample.at(tile_end_ms);
    let timestamp_len = 1 + encoded_len_varint(timestamp_ms as u64);
    let point_len = match sample.histogram.is_empty() {
        true => 1 + 8 + timestamp_len,
        false => sample.histogram.len() + timestamp_len,
    };
    let marker_len = match sample.reset_before && sample.histogram.is_empty() {
        true => 1 + 8 + 1 + encoded_len_varint((timestamp_ms - 1) as u64),
        false => 0,
    };
    let marker_field = if marker_len > 0 { 1 + encoded_len_varint(marker_len as u64) + marker_len } else { 0 };
    let series_len = sample.labels.len() + marker_field + 1 + encoded_len_varint(point_len as u64) + point_len;
    (1 + encoded_len_varint(series_len as u64) + series_len, series_len, point_len, marker_len)
}

/// Size of the uncompressed `WriteRequest` [`encode_write_request`] would write.
pub fn write_request_len(samples: &[StoredSample], timestamp_ms: i64) -> usize {
    samples.iter().map(|sample| series_lengths(sample, timestamp_ms).0).sum()
}

/// Appends a `WriteRequest` holding one `TimeSeries` per sample, each with one sample (or,
/// for a sample carrying a histogram, one histogram) at the record's `tile_end_ms` (or the
/// sample's own timestamp, [`StoredSample::at`]), to `out`. A plain sample marked
/// `reset_before` is preceded in its series by a 0 one millisecond before it.
pub fn encode_write_request(out: &mut Vec<u8>, samples: &[StoredSample], tile_end_ms: i64) {
    out.reserve(write_request_len(samples, tile_end_ms));
    for sample in samples {
        let (_, series_len, point_len, marker_len) = series_lengths(sample, tile_end_ms);
        let timestamp_ms = sample.at(tile_end_ms);
        out.push(FIELD_1_LEN);
        encode_varint(series_len as u64, out);
        out.extend_from_slice(&sample.labels);
        if marker_len > 0 {
            out.push(FIELD_2_LEN);
            encode_varint(marker_len as u64, out);
            out.push(SAMPLE_VALUE);
            out.extend_from_slice(&0f64.to_le_bytes());
            out.push(SAMPLE_TIMESTAMP);
            encode_varint((timestamp_ms - 1) as u64, out);
        }
        if sample.histogram.is_empty() {
            out.push(FIELD_2_LEN);
            encode_varint(point_len as u64, out);
            out.push(SAMPLE_VALUE);
            out.extend_from_slice(&sample.value.to_le_bytes());
            out.push(SAMPLE_TIMESTAMP);
        } else {
            out.push(SERIES_HISTOGRAM);
            encode_varint(point_len as u64, out);
            out.extend_from_slice(&sample.histogram);
            out.push(HISTOGRAM_TIMESTAMP);
        }
        encode_varint(timestamp_ms as u64, out);
    }
}

/// Snappy block compression (not the framed format), as remote write requires.
pub fn compress(body: &[u8]) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(body)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn stored(labels: &[(&str, &str)], value: f64) -> StoredSample {
        let mut bytes = Vec::new();
        encode_labels(&mut bytes, labels);
        StoredSample { labels: Bytes::from(bytes), value, kind: 2, ..Default::default() }
    }

    #[test]
    fn hand_encoding_matches_prost() {
        let samples = [
            stored(&[("__name__", "a"), ("env", "prod")], 1.25),
            stored(&[("__name__", &"b".repeat(300)), ("x", "é\"\n")], -3.0),
            stored(&[("__name__", "zero")], 0.0),
            StoredSample { reset_before: true, ..stored(&[("__name__", "adopted_total")], 42.0) },
            // A late tile's correction, at its own timestamp.
            StoredSample { timestamp_ms: 1_700_000_020_001, ..stored(&[("__name__", "late_total")], 7.0) },
        ];
        for timestamp in [0, 1, 1_700_000_000_000, -5] {
            let mut ours = Vec::new();
            encode_write_request(&mut ours, &samples, timestamp);
            assert_eq!(ours.len(), write_request_len(&samples, timestamp));
            let theirs = WriteRequest {
                timeseries: samples
                    .iter()
                    .map(|sample| {
                        let timestamp = sample.at(timestamp);
                        TimeSeries {
                            labels: decode_labels(&sample.labels).unwrap(),
                            samples: match sample.reset_before {
                                true => vec![
                                    Sample { value: 0.0, timestamp: timestamp - 1 },
                                    Sample { value: sample.value, timestamp },
                                ],
                                false => vec![Sample { value: sample.value, timestamp }],
                            },
                            histograms: Vec::new(),
                        }
                    })
                    .collect(),
            };
            assert_eq!(WriteRequest::decode(ours.as_slice()).unwrap(), theirs, "timestamp {timestamp}");
        }
    }

    fn histogram_sample(sketch: &Sketch, sum: f64, reset: bool) -> StoredSample {
        let mut bytes = Vec::new();
        HistogramEncoder::default().encode(&mut bytes, sketch, sum, reset);
        let mut sample = stored(&[("__name__", "latency"), ("resolution", "10s")], sketch.count());
        sample.histogram = Bytes::from(bytes);
        sample
    }

    #[test]
    fn a_native_histogram_decodes_as_prometheus_reads_it() {
        let mut sketch = Sketch::new();
        // Runs of neighbouring buckets with gaps, negative values, zeros, fractional weights.
        for (value, weight) in
            [(1.0, 3.0), (1.03, 2.0), (1.05, 1.0), (4.0, 7.0), (1000.0, 1.0), (-2.0, 4.0), (-2.1, 1.0)]
        {
            sketch.insert(value, weight);
        }
        sketch.insert(0.0, 5.0);
        sketch.insert(50.0, 2.6); // rounds to 3
        sketch.insert(60.0, 0.4); // rounds to 0, still a bucket
        let sample = histogram_sample(&sketch, 123.5, true);
        let samples = [stored(&[("__name__", "a")], 1.0), sample.clone()];
        let mut body = Vec::new();
        encode_write_request(&mut body, &samples, 1_700_000_000_000);
        assert_eq!(body.len(), write_request_len(&samples, 1_700_000_000_000));
        let request = WriteRequest::decode(body.as_slice()).unwrap();
        assert_eq!(request.timeseries[0].samples.len(), 1);
        let series = &request.timeseries[1];
        assert!(series.samples.is_empty());
        let [histogram] = series.histograms.as_slice() else { panic!("one histogram: {series:?}") };
        assert_eq!(histogram.timestamp, 1_700_000_000_000);
        assert_eq!((histogram.schema, histogram.zero_threshold, histogram.zero_count_int), (5, ZERO_THRESHOLD, 5));
        assert_eq!((histogram.sum, histogram.reset_hint), (123.5, RESET_HINT_YES));
        let rounded = |weight: f64| weight.round() as u64;
        let positive: Vec<(i32, u64)> =
            sketch.positive_buckets().map(|(index, weight)| (index, rounded(weight))).collect();
        let negative: Vec<(i32, u64)> =
            sketch.negative_buckets().map(|(index, weight)| (index, rounded(weight))).collect();
        assert_eq!(histogram.positive_buckets(), positive);
        assert_eq!(histogram.negative_buckets(), negative);
        assert!(histogram.positive_spans.len() >= 4, "gaps make spans: {:?}", histogram.positive_spans);
        let buckets: u64 = positive.iter().chain(&negative).map(|(_, count)| count).sum();
        assert_eq!(histogram.count_int, buckets + 5, "the count agrees with the buckets");
        assert_eq!(histogram.count_int, 3 + 2 + 1 + 7 + 1 + 4 + 1 + 5 + 3);

        // Without a reset the hint is left unknown; an empty sketch is a valid empty histogram.
        let quiet = histogram_sample(&Sketch::new(), 0.0, false);
        let decoded = Histogram::decode(quiet.histogram.as_ref()).unwrap();
        assert_eq!((decoded.reset_hint, decoded.count_int, decoded.positive_spans.len()), (0, 0, 0));
    }

    #[test]
    fn visiting_labels_matches_decoding_and_refuses_garbage() {
        let sample = stored(&[("__name__", "a"), ("env", "pröd"), ("z", "")], 1.0);
        let mut seen = Vec::new();
        visit_labels(&sample.labels, |name, value| seen.push((name.to_owned(), value.to_owned()))).unwrap();
        let decoded: Vec<_> = decode_labels(&sample.labels).unwrap().into_iter().map(|l| (l.name, l.value)).collect();
        assert_eq!(seen, decoded);
        for garbage in [&b"\x0a"[..], b"\x0a\x05\x0a\x01a", b"\x12\x00", b"\x0a\x04\x0a\x01\xff\x12"] {
            assert!(visit_labels(garbage, |_, _| {}).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn compresses_to_snappy_block_format() {
        let mut body = Vec::new();
        encode_write_request(&mut body, &[stored(&[("__name__", "a")], 1.0)], 5);
        let compressed = compress(&body).unwrap();
        assert_eq!(snap::raw::Decoder::new().decompress_vec(&compressed).unwrap(), body);
    }
}
