//! Prometheus remote write 1.0 messages (`prompb`), and building a request body from
//! queue samples.
//!
//! Only the fields remote write 1.0 needs are declared: `WriteRequest { timeseries }`,
//! `TimeSeries { labels, samples }`, `Label { name, value }`, `Sample { value, timestamp }`,
//! with the field numbers of Prometheus' `prompb/remote.proto` and `types.proto`.
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
//! let sample = StoredSample { labels: Bytes::from(labels), value: 3.0, kind: 1 };
//! let mut body = Vec::new();
//! prompb::encode_write_request(&mut body, std::slice::from_ref(&sample), 10_000);
//! let request = WriteRequest::decode(body.as_slice()).unwrap();
//! assert_eq!(request.timeseries[0].labels[1].value, "prod");
//! assert_eq!(request.timeseries[0].samples[0].timestamp, 10_000);
//! ```

use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

use crate::record::StoredSample;

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
}

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

/// Appends `labels` (already sorted by name) to `out` as repeated `TimeSeries.labels`.
pub fn encode_labels(out: &mut Vec<u8>, labels: &[(&str, &str)]) {
    for (name, value) in labels {
        let inner = 1
            + encoded_len_varint(name.len() as u64)
            + name.len()
            + 1
            + encoded_len_varint(value.len() as u64)
            + value.len();
        out.push(FIELD_1_LEN);
        encode_varint(inner as u64, out);
        out.push(FIELD_1_LEN);
        encode_varint(name.len() as u64, out);
        out.extend_from_slice(name.as_bytes());
        out.push(FIELD_2_LEN);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value.as_bytes());
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

/// Bytes `sample` takes as one `TimeSeries` inside a `WriteRequest`, and the length of the
/// `TimeSeries` and `Sample` messages.
fn series_lengths(labels_len: usize, timestamp_ms: i64) -> (usize, usize, usize) {
    let sample_len = 1 + 8 + 1 + encoded_len_varint(timestamp_ms as u64);
    let series_len = labels_len + 1 + encoded_len_varint(sample_len as u64) + sample_len;
    (1 + encoded_len_varint(series_len as u64) + series_len, series_len, sample_len)
}

/// Size of the uncompressed `WriteRequest` [`encode_write_request`] would write.
pub fn write_request_len(samples: &[StoredSample], timestamp_ms: i64) -> usize {
    samples.iter().map(|sample| series_lengths(sample.labels.len(), timestamp_ms).0).sum()
}

/// Appends a `WriteRequest` holding one `TimeSeries` per sample, each with one sample at
/// `timestamp_ms`, to `out`.
pub fn encode_write_request(out: &mut Vec<u8>, samples: &[StoredSample], timestamp_ms: i64) {
    out.reserve(write_request_len(samples, timestamp_ms));
    for sample in samples {
        let (_, series_len, sample_len) = series_lengths(sample.labels.len(), timestamp_ms);
        out.push(FIELD_1_LEN);
        encode_varint(series_len as u64, out);
        out.extend_from_slice(&sample.labels);
        out.push(FIELD_2_LEN);
        encode_varint(sample_len as u64, out);
        out.push(SAMPLE_VALUE);
        out.extend_from_slice(&sample.value.to_le_bytes());
        out.push(SAMPLE_TIMESTAMP);
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
        StoredSample { labels: Bytes::from(bytes), value, kind: 2 }
    }

    #[test]
    fn hand_encoding_matches_prost() {
        let samples = [
            stored(&[("__name__", "a"), ("env", "prod")], 1.25),
            stored(&[("__name__", &"b".repeat(300)), ("x", "é\"\n")], -3.0),
            stored(&[("__name__", "zero")], 0.0),
        ];
        for timestamp in [0, 1, 1_700_000_000_000, -5] {
            let mut ours = Vec::new();
            encode_write_request(&mut ours, &samples, timestamp);
            assert_eq!(ours.len(), write_request_len(&samples, timestamp));
            let theirs = WriteRequest {
                timeseries: samples
                    .iter()
                    .map(|sample| TimeSeries {
                        labels: decode_labels(&sample.labels).unwrap(),
                        samples: vec![Sample { value: sample.value, timestamp }],
                    })
                    .collect(),
            };
            assert_eq!(WriteRequest::decode(ours.as_slice()).unwrap(), theirs, "timestamp {timestamp}");
        }
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
