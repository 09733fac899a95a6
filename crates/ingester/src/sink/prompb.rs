//! Prometheus remote write 1.0 messages (`prompb`), and building a request body from
//! queue samples; remote write is the only user of this module.
//!
//! Only the fields remote write 1.0 needs are declared: `WriteRequest { timeseries, metadata }`,
//! `TimeSeries { labels, samples, histograms }`, `Sample { value, timestamp }` and
//! `MetricMetadata { type, metric_family_name, help, unit }`, with the field numbers of
//! Prometheus' `prompb/remote.proto` and `types.proto`.
//!
//! **Metadata** ([`encode_metadata_request`]): a request of its own, sent once a minute with
//! one `MetricMetadata` per metric family the target writes (see [`crate::sink::metadata`]):
//! its type (counter; gauge for gauges, sets and a timer's `_min`/`_max`; summary for
//! quantiles, `_sum` and `_count`; histogram for native and classic histograms), a help text
//! naming what statsd sent ([`help_text`](crate::sink::openmetrics::help_text), or a mapping's
//! `help`, [`Helps`](crate::sink::openmetrics::Helps); the file sink's `# HELP`) and a unit (`seconds` for timers). Stores that
//! keep metadata (Mimir, recent VictoriaMetrics) use it; Prometheus 2's receiver drops it.
//!
//! A queue record's series are in the queue's own form ([`crate::queue::series`]), whose
//! `Label` and `Histogram` have the field numbers of remote write's. So
//! [`encode_write_request`] writes each `TimeSeries` by copying a sample's label bytes and
//! appending one `Sample` (or its histogram with a timestamp); no label is decoded or
//! re-encoded on the way to storage. The body is then snappy block-compressed
//! ([`compress`]), as the protocol requires. The tests decode the body as Prometheus
//! reads it.
//!
//! ```
//! use bytes::Bytes;
//! use prost::Message;
//! use tessera_ingester::prompb::{self, WriteRequest};
//! use tessera_ingester::record::StoredSample;
//! use tessera_ingester::series;
//!
//! let mut labels = Vec::new();
//! series::encode_labels(&mut labels, &[("__name__", "hits_total"), ("env", "prod")]);
//! let sample = StoredSample { labels: Bytes::from(labels), value: 3.0, kind: 1, ..Default::default() };
//! let mut body = Vec::new();
//! prompb::encode_write_request(&mut body, std::slice::from_ref(&sample), 10_000);
//! let request = WriteRequest::decode(body.as_slice()).unwrap();
//! assert_eq!(request.timeseries[0].labels[1].value, "prod");
//! assert_eq!(request.timeseries[0].samples[0].timestamp, 10_000);
//! ```

use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

use crate::queue::record::StoredSample;
use crate::queue::series::{Histogram, Label};

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// The series, each with its samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// One entry per metric family.
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// `prometheus.MetricMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    /// `MetricType`: 1 counter, 2 gauge, 3 histogram, 5 summary.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The family name (a counter's without `_total`).
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    /// The help text.
    #[prost(string, tag = "4")]
    pub help: String,
    /// The unit (empty: none given).
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// `MetricType` of an OpenMetrics type name.
fn metric_type(type_name: &str) -> i32 {
    match type_name {
        "counter" => 1,
        "gauge" => 2,
        "histogram" => 3,
        "summary" => 5,
        _ => 0,
    }
}

/// Wire key of `WriteRequest.metadata` (field 3, length-delimited).
const REQUEST_METADATA: u8 = 0x1a;
/// Wire key of `MetricMetadata.type` (field 1, varint).
const METADATA_TYPE: u8 = 0x08;
/// Wire key of `MetricMetadata.help` (field 4, length-delimited).
const METADATA_HELP: u8 = 0x22;
/// Wire key of `MetricMetadata.unit` (field 5, length-delimited).
const METADATA_UNIT: u8 = 0x2a;

/// One family's metadata: name, OpenMetrics type, help, unit (empty: none).
pub type MetadataEntry<'a> = (&'a str, &'static str, &'a str, &'a str);

/// Bytes of `entry` as a `WriteRequest.metadata` field.
pub fn metadata_entry_len(entry: &MetadataEntry<'_>) -> usize {
    let inner = metadata_inner_len(entry);
    1 + encoded_len_varint(inner as u64) + inner
}

fn metadata_inner_len((family, _, help, unit): &MetadataEntry<'_>) -> usize {
    let field = |len: usize| if len == 0 { 0 } else { 1 + encoded_len_varint(len as u64) + len };
    2 + field(family.len()) + field(help.len()) + field(unit.len())
}

/// Appends a `WriteRequest` holding only `entries`' metadata, one `MetricMetadata` each.
pub fn encode_metadata_request(out: &mut Vec<u8>, entries: &[MetadataEntry<'_>]) {
    out.reserve(entries.iter().map(metadata_entry_len).sum());
    for entry in entries {
        let (family, type_name, help, unit) = *entry;
        out.push(REQUEST_METADATA);
        encode_varint(metadata_inner_len(entry) as u64, out);
        out.push(METADATA_TYPE);
        out.push(metric_type(type_name) as u8);
        for (key, text) in [(FIELD_2_LEN, family), (METADATA_HELP, help), (METADATA_UNIT, unit)] {
            if !text.is_empty() {
                out.push(key);
                encode_varint(text.len() as u64, out);
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
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
    samples.iter().map(|sample| series_lengths(sample, timestamp_ms).0).sum::<usize>()
}

/// Appends a `WriteRequest` holding one `TimeSeries` per sample, each with one sample (or,
/// for a sample carrying a histogram, one histogram) at the record's `tile_end_ms` (or the
/// sample's own timestamp, [`StoredSample::at`]), to `out`. A plain sample marked
/// `reset_before` is preceded in its series by a 0 one millisecond before it.
pub fn encode_write_request(out: &mut Vec<u8>, samples: &[StoredSample], tile_end_ms: i64) {
    out.reserve(samples.iter().map(|sample| series_lengths(sample, tile_end_ms).0).sum());
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
    use tessera_core::sketch::{Sketch, ZERO_THRESHOLD};

    use super::*;
    use crate::queue::series::{HistogramEncoder, RESET_HINT_YES, decode_labels, encode_labels};

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
                metadata: Vec::new(),
            };
            assert_eq!(WriteRequest::decode(ours.as_slice()).unwrap(), theirs, "timestamp {timestamp}");
        }
    }

    #[test]
    fn a_metadata_request_decodes_as_prometheus_reads_it() {
        let long = "h".repeat(300);
        let entries: [MetadataEntry<'_>; 3] = [
            ("hits", "counter", "statsd counter (c), written by tessera", ""),
            ("lat", "summary", &long, "seconds"),
            ("temp", "gauge", "", ""),
        ];
        let mut body = Vec::new();
        encode_metadata_request(&mut body, &entries);
        assert_eq!(body.len(), entries.iter().map(metadata_entry_len).sum::<usize>());
        let request = WriteRequest::decode(body.as_slice()).unwrap();
        assert!(request.timeseries.is_empty());
        let decoded: Vec<(i32, &str, &str, &str)> = request
            .metadata
            .iter()
            .map(|entry| (entry.r#type, entry.metric_family_name.as_str(), entry.help.as_str(), entry.unit.as_str()))
            .collect();
        assert_eq!(
            decoded,
            [
                (1, "hits", "statsd counter (c), written by tessera", ""),
                (5, "lat", long.as_str(), "seconds"),
                (2, "temp", "", "")
            ]
        );
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
    fn compresses_to_snappy_block_format() {
        let mut body = Vec::new();
        encode_write_request(&mut body, &[stored(&[("__name__", "a")], 1.0)], 5);
        let compressed = compress(&body).unwrap();
        assert_eq!(snap::raw::Decoder::new().decompress_vec(&compressed).unwrap(), body);
    }
}
