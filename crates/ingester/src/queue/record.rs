//! Queue records: the storage samples of one tile batch, and their checksummed framing.
//!
//! A tile batch is converted to final storage samples at ingest time ([`crate::admit`]),
//! before it is written, so that the queue holds exactly what storage will receive and a
//! replay after a crash resends byte-identical samples. One [`Record`] holds the samples of
//! one batch and its metadata (storage policy, tile end, when it was received).
//!
//! On disk a record is framed as
//!
//! ```text
//! u32 LE  payload length
//! u32 LE  CRC32 (IEEE, crate crc32fast) of the payload
//! payload the prost-encoded Record
//! ```
//!
//! Each [`StoredSample`] keeps its labels already encoded as the `labels` field of a
//! series' labels in the queue's own form (see [`crate::queue::series`]), so building a remote-write
//! request is a copy, and decoding a record is zero-copy ([`bytes::Bytes`] slices of the
//! record buffer).
//!
//! ```
//! use tessera_ingester::record::{self, Record};
//!
//! let record = Record { storage_policy: "10s:2d".into(), tile_end_ms: 10_000, ..Default::default() };
//! let framed = record::encode(&record);
//! let (decoded, used) = record::decode(&framed, 1 << 20).unwrap().unwrap();
//! assert_eq!(decoded, record);
//! assert_eq!(used, framed.len());
//! ```

use bytes::Bytes;
use prost::Message;

/// Bytes of the frame header: length and CRC32.
pub const HEADER_BYTES: usize = 8;

/// The samples of one tile batch, ready for storage.
#[derive(Clone, PartialEq, Message)]
pub struct Record {
    /// Storage policy of the batch, e.g. `10s:2d`.
    #[prost(string, tag = "1")]
    pub storage_policy: String,
    /// Value of the `resolution` label, e.g. `10s`.
    #[prost(string, tag = "2")]
    pub resolution: String,
    /// End of the tile, unix milliseconds; the timestamp of every sample.
    #[prost(int64, tag = "3")]
    pub tile_end_ms: i64,
    /// When the ingester received the batch, unix milliseconds.
    #[prost(int64, tag = "4")]
    pub received_at_ms: i64,
    /// The aggregator that sent the batch.
    #[prost(string, tag = "5")]
    pub source: String,
    /// The batch's sequence number from its source.
    #[prost(uint64, tag = "6")]
    pub batch_sequence: u64,
    /// Tiles the samples were made from (for per-tile latency).
    #[prost(uint32, tag = "7")]
    pub tiles: u32,
    /// The samples, all stamped `tile_end_ms`.
    #[prost(message, repeated, tag = "8")]
    pub samples: Vec<StoredSample>,
    /// When the aggregator flushed the batch, unix milliseconds.
    #[prost(int64, tag = "9")]
    pub flushed_at_ms: i64,
    /// The batch was marked incomplete by its aggregator (see [`crate::admit`]).
    #[prost(bool, tag = "10")]
    pub incomplete: bool,
}

/// One storage sample.
#[derive(Clone, PartialEq, Message)]
pub struct StoredSample {
    /// The series' labels (with `__name__`), sorted by name, encoded as repeated field 1
    /// (`labels`) of a remote-write `TimeSeries`.
    #[prost(bytes = "bytes", tag = "1")]
    pub labels: Bytes,
    /// The value.
    #[prost(double, tag = "2")]
    pub value: f64,
    /// What the sample is, for writers that declare types (OpenMetrics).
    #[prost(enumeration = "SampleKind", tag = "3")]
    pub kind: i32,
    /// A native histogram, encoded as a remote-write `Histogram` message without its
    /// timestamp (see [`crate::queue::series::HistogramEncoder`]); empty for a plain sample.
    #[prost(bytes = "bytes", tag = "4")]
    pub histogram: Bytes,
    /// Write a 0 one millisecond before this sample, in the same series: the explicit
    /// counter reset of a cumulative series this ingester adopted from another one (see
    /// [`crate::admit`]). Both sinks write it.
    #[prost(bool, tag = "5")]
    pub reset_before: bool,
    /// The sample's own timestamp, unix ms; 0 for the record's tile end (every sample but
    /// a late tile's correction: a cumulative series' new total one millisecond after its
    /// newest sample, see [`crate::admit`]).
    #[prost(int64, tag = "6")]
    pub timestamp_ms: i64,
    /// A per-tile target's text for the series' tile, in its protocol (carbon plaintext
    /// lines for Graphite, [`crate::sink::graphite`]), rendered at ingest time like the
    /// labels; `labels` is empty then, and `value` unused.
    #[prost(bytes = "bytes", tag = "7")]
    pub lines: Bytes,
}

impl StoredSample {
    /// The sample's timestamp in a record whose tile ends at `tile_end_ms`.
    pub fn at(&self, tile_end_ms: i64) -> i64 {
        if self.timestamp_ms != 0 { self.timestamp_ms } else { tile_end_ms }
    }

    /// The sample's kind ([`SampleKind::Gauge`] when unknown).
    pub fn sample_kind(&self) -> SampleKind {
        SampleKind::try_from(self.kind).unwrap_or(SampleKind::Gauge)
    }
}

/// The identifying fields of a [`Record`] alone: decoding a payload as a `RecordHead`
/// skips the samples, so the replay can list queued batches cheaply.
#[derive(Clone, PartialEq, Message)]
pub struct RecordHead {
    /// Storage policy of the batch.
    #[prost(string, tag = "1")]
    pub storage_policy: String,
    /// End of the tile, unix milliseconds.
    #[prost(int64, tag = "3")]
    pub tile_end_ms: i64,
    /// The aggregator that sent the batch.
    #[prost(string, tag = "5")]
    pub source: String,
    /// The batch's sequence number from its source.
    #[prost(uint64, tag = "6")]
    pub batch_sequence: u64,
}

impl RecordHead {
    /// The key that identifies the batch among those recently queued: a batch sent again
    /// (its acknowledgement was lost) has the same key.
    pub fn batch_key(&self) -> u128 {
        batch_key(&self.source, &self.storage_policy, self.tile_end_ms, self.batch_sequence)
    }
}

/// The key of a batch from `source` of `storage_policy` for the tile ending at
/// `tile_end_ms` with `sequence`; see [`RecordHead::batch_key`].
pub fn batch_key(source: &str, storage_policy: &str, tile_end_ms: i64, sequence: u64) -> u128 {
    let mut bytes = Vec::with_capacity(source.len() + storage_policy.len() + 18);
    bytes.extend_from_slice(source.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(storage_policy.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&tile_end_ms.to_le_bytes());
    bytes.extend_from_slice(&sequence.to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&bytes)
}

/// What a sample is, which decides its OpenMetrics family and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum SampleKind {
    /// Not set.
    Unspecified = 0,
    /// `<family>_total` of a counter family.
    Counter = 1,
    /// A gauge (also sets, and timer `_min` / `_max`).
    Gauge = 2,
    /// `<family>{quantile="q"}` of a summary family.
    SummaryQuantile = 3,
    /// `<family>_sum` of a summary family.
    SummarySum = 4,
    /// `<family>_count` of a summary family.
    SummaryCount = 5,
    /// A native histogram (remote write only): the sample's `histogram` holds it, its value
    /// is the observation count.
    Histogram = 6,
    /// `<family>_bucket{le="b"}` of a classic histogram family (cumulative).
    HistogramBucket = 7,
    /// `<family>_sum` of a classic histogram family.
    HistogramSum = 8,
    /// `<family>_count` of a classic histogram family.
    HistogramCount = 9,
}

/// Why a framed record could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// The declared payload length is larger than any record may be.
    #[error("record length {len} exceeds the maximum of {max} bytes")]
    TooLong {
        /// Declared length.
        len: usize,
        /// Maximum accepted.
        max: usize,
    },
    /// The payload does not match its checksum.
    #[error("record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the payload read.
        computed: u32,
    },
    /// The checksum matched but the payload is not a record.
    #[error("record payload does not decode: {0}")]
    Decode(String),
}

/// Frames `record`: header, then payload.
pub fn encode(record: &Record) -> Vec<u8> {
    let len = record.encoded_len();
    let mut out = Vec::with_capacity(HEADER_BYTES + len);
    out.extend_from_slice(&[0; HEADER_BYTES]);
    record.encode(&mut out).expect("a Vec grows to fit the record");
    seal(&mut out);
    out
}

/// Writes the header of a frame whose payload follows [`HEADER_BYTES`] zero bytes in `frame`.
pub fn seal(frame: &mut [u8]) {
    let (header, payload) = frame.split_at_mut(HEADER_BYTES);
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
}

/// Reads a frame header: payload length and CRC.
pub fn parse_header(header: [u8; HEADER_BYTES]) -> (usize, u32) {
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    (len, crc)
}

/// Checks `payload` against the header's CRC.
pub fn verify(payload: &[u8], stored: u32) -> Result<(), RecordError> {
    let computed = crc32fast::hash(payload);
    if computed == stored { Ok(()) } else { Err(RecordError::Checksum { stored, computed }) }
}

/// Decodes a checked payload. Labels are zero-copy slices of `payload`.
pub fn decode_payload(payload: Bytes) -> Result<Record, RecordError> {
    Record::decode(payload).map_err(|error| RecordError::Decode(error.to_string()))
}

/// Decodes one framed record from the front of `buf`: `Ok(None)` when `buf` does not hold
/// a whole frame yet, else the record and the bytes it used.
pub fn decode(buf: &[u8], max_record_bytes: usize) -> Result<Option<(Record, usize)>, RecordError> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let (len, crc) = parse_header(header.try_into().expect("slice of HEADER_BYTES"));
    if len > max_record_bytes {
        return Err(RecordError::TooLong { len, max: max_record_bytes });
    }
    let Some(payload) = buf.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Ok(None);
    };
    verify(payload, crc)?;
    let record = decode_payload(Bytes::copy_from_slice(payload))?;
    Ok(Some((record, HEADER_BYTES + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_record() -> Record {
        Record {
            storage_policy: "10s:2d".into(),
            resolution: "10s".into(),
            tile_end_ms: 1_700_000_010_000,
            received_at_ms: 1_700_000_011_000,
            source: "agg-1".into(),
            batch_sequence: 7,
            tiles: 2,
            samples: vec![
                StoredSample {
                    labels: Bytes::from_static(b"\x0a\x03abc"),
                    value: 1.5,
                    kind: SampleKind::Counter as i32,
                    histogram: Bytes::new(),
                    reset_before: true,
                    timestamp_ms: 0,
                    lines: Bytes::new(),
                },
                StoredSample {
                    labels: Bytes::from_static(b""),
                    value: -0.0,
                    kind: SampleKind::Gauge as i32,
                    histogram: Bytes::new(),
                    reset_before: false,
                    timestamp_ms: 1_700_000_020_001,
                    lines: Bytes::from_static(b"a.b 1 1700000020\n"),
                },
                StoredSample {
                    labels: Bytes::from_static(b"\x0a\x01h"),
                    value: 3.0,
                    kind: SampleKind::Histogram as i32,
                    histogram: Bytes::from_static(b"\x08\x03"),
                    reset_before: false,
                    timestamp_ms: 0,
                    lines: Bytes::new(),
                },
            ],
            flushed_at_ms: 1_700_000_010_500,
            incomplete: false,
        }
    }

    #[test]
    fn round_trips_and_waits_for_whole_frames() {
        let record = sample_record();
        let framed = encode(&record);
        for cut in 0..framed.len() {
            assert_eq!(decode(&framed[..cut], 1 << 20), Ok(None), "cut at {cut}");
        }
        let (decoded, used) = decode(&framed, 1 << 20).unwrap().unwrap();
        assert_eq!(decoded, record);
        assert_eq!(used, framed.len());
    }

    #[test]
    fn every_flipped_bit_is_caught_by_the_checksum() {
        let framed = encode(&sample_record());
        for byte in HEADER_BYTES..framed.len() {
            for bit in 0..8 {
                let mut damaged = framed.clone();
                damaged[byte] ^= 1 << bit;
                let err = decode(&damaged, 1 << 20).unwrap_err();
                assert!(matches!(err, RecordError::Checksum { .. }), "byte {byte} bit {bit}: {err}");
            }
        }
    }

    #[test]
    fn the_head_decodes_from_a_whole_record() {
        let record = sample_record();
        let head = RecordHead::decode(record.encode_to_vec().as_slice()).unwrap();
        assert_eq!(head.batch_key(), batch_key("agg-1", "10s:2d", 1_700_000_010_000, 7));
        assert_ne!(head.batch_key(), batch_key("agg-1", "10s:2d", 1_700_000_010_000, 8));
    }

    #[test]
    fn refuses_an_impossible_length_before_reading() {
        let mut framed = encode(&sample_record());
        framed[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode(&framed, 1 << 20).unwrap_err();
        assert_eq!(err, RecordError::TooLong { len: u32::MAX as usize, max: 1 << 20 });
    }

    #[test]
    fn a_matching_checksum_over_garbage_is_a_decode_error_not_a_panic() {
        let mut framed = vec![0; HEADER_BYTES];
        framed.extend_from_slice(&[0xff; 12]);
        seal(&mut framed);
        assert!(matches!(decode(&framed, 1 << 20), Err(RecordError::Decode(_))));
    }
}
