//! Checkpoints of a [`Converter`]'s running state, so that a restarted ingester continues
//! its cumulative series (counters, `_sum`, `_count`, native histograms) instead of
//! starting them from 0.
//!
//! A checkpoint records the queue position it covers: every record appended before that
//! position had been converted into the state it holds. At start the ingester restores it
//! ([`Converter::restore_checkpoint`]), then rolls forward ([`Converter::roll_forward`])
//! through every record appended after that position, delivered or not: the queue keeps
//! them until a newer checkpoint covers them ([`crate::queue`]). Together they give the
//! state of the moment the process stopped. Files are written and read by
//! [`crate::writer::checkpoint`].
//!
//! ```text
//! records:  r1 r2 r3 │ r4 r5          checkpoint = state after r1..r3, covers = position of r4
//!                    └─ restart: restore the checkpoint, then roll forward r4, r5
//! ```
//!
//! **A few series at a time.** Encoding a large state at once would hold up the writer
//! writer thread, and acknowledgements with it (100 000 native histograms take about
//! 80 ms). So a checkpoint is encoded in steps between conversions
//! ([`Converter::begin_checkpoint`], [`Converter::continue_checkpoint`],
//! [`Converter::finish_checkpoint`]); [`Converter::encode_checkpoint`] does all at once.
//! Conversions go on meanwhile, so each series is saved as it was at its step, at or after
//! the covered position. The roll-forward makes this whole: it sets a total only from a
//! sample newer than the total's tile end, so a record the saved series already holds is
//! skipped and a later one applied. A native histogram is saved at the same step as its
//! count's total, so the two stay in step. A series that first appears during the steps is
//! not in the checkpoint: the roll-forward brings it back from its records.
//!
//! **Roll-forward.** A record holds samples, not tiles, and a sample of a running total is
//! the total after its tile. So a sample of kind counter, summary `_count` or `_sum` sets
//! the total keyed by `xxh3_128(labels)` to its value, with the record's tile end; a native
//! histogram sample also sets the series' cumulative sketch and sum, decoded from the
//! remote-write `Histogram` it carries. What a record cannot tell:
//!
//! - which statsd series a total belongs to: the first tile to reach it adopts it (see
//!   the [admit docs](super));
//! - what its tile added: taken as the difference to the total before, which also holds
//!   the late tiles folded in since (it only decides whether a resent copy of that tile is
//!   counted as a duplicate or a conflict; neither changes the total);
//! - (a late tile's correction is a sample at its own timestamp: it rolls forward like a
//!   tile's, and marks the late tile written);
//! - a native histogram's fractional bucket weights (statsd sample rates): they come back
//!   rounded, as they were written.
//!
//! **File** (little-endian):
//!
//! ```text
//! magic        8 bytes "TSCKPT\0\0"
//! version      u32     VERSION; a reader takes 1..=its own
//! crc          u32     CRC32 (crc32fast) of everything after it
//! taken_at_ms  i64
//! covers       u64 segment, u64 offset
//! newest_tile_end_ms i64, last_sweep_tile_end_ms i64
//! total_bytes  u32     bytes of one total's fields
//! totals       u64 n, then n × (key u128, the fields of `total_fields`)
//! histograms   u64 n, then n × (key u128, sum f64, written u8, schema i32, zero_count f64,
//!                      positive buckets, negative buckets)
//! buckets      u32 m, then m × (index i32, weight f64), non-zero ones by increasing index
//! placement    u64 version (version 4): of the ingesters' placement the totals were made
//!                      under when the checkpoint began
//! cutoffs      u64 n, then n × i64 (version 4): per shard, the cutoff at which this
//!                      ingester was giving it away then (0: none); none (n = 0) when the
//!                      converter knew no placement
//! ```
//!
//! **Placement.** A restart compares the placement a checkpoint records with its first view
//! of it: a shard whose cutoff differs was given back or given away again while the process
//! was down (or since the checkpoint), so its receiver may have written it from an explicit
//! reset, and the totals restored for it are of a tenure that ended: its series start over
//! with a reset of their own ([`Converter::restore_checkpoint`]). So does a shard with no
//! cutoff in either when the placement's version differs: it may have been given away and
//! back in between (a failover gives a shard back with no cutoff). A shard whose move is
//! the same one (the same cutoff) keeps its totals, and so does every shard when the
//! placement is the one of the checkpoint. A change the restart cannot see through costs a
//! reset too many, which is exact; a total carried on from an ended tenure is not. A view
//! taken in while a checkpoint is encoded in steps is of a newer placement than the one
//! recorded, so every later view differs from it: the totals saved under either are
//! trusted only where the cutoff is the same one.
//!
//! **Adding a field to a running total** is one line in `total_fields`, at the end (and
//! `VERSION + 1`). Totals are read at the width the file states, so a file written before
//! the field gives it its default: an upgrade keeps the totals.
//!
//! ```
//! use tessera_ingester::{CheckpointMeta, Converter};
//!
//! let converter = Converter::new(&[0.5], 3_600_000);
//! let mut bytes = converter.encode_checkpoint(CheckpointMeta::default()).into_bytes();
//! let mut restarted = Converter::new(&[0.5], 3_600_000);
//! assert_eq!(restarted.restore_checkpoint(&bytes).unwrap(), CheckpointMeta::default());
//! bytes[20] ^= 1;
//! assert!(restarted.restore_checkpoint(&bytes).is_err());
//! ```

use prost::Message;
use tessera_core::sketch::{MAX_BUCKETS, Sketch, SketchError};
use tessera_runtime::RateLimitedLog;

use super::{Converter, Cumulative, Histograms, Total, Totals, UNKNOWN_ORIGIN};
use crate::queue::Position;
use crate::queue::record::{Record, SampleKind};
use crate::queue::series::{BucketSpan, Histogram};

/// The checkpoint's file name in its queue directory.
pub const FILE_NAME: &str = "checkpoint";

/// The first bytes of a checkpoint file.
pub const MAGIC: [u8; 8] = *b"TSCKPT\x00\x00";

/// The format version this build writes; it reads every version up to it.
pub const VERSION: u32 = 5;

/// Magic, version and CRC.
const HEADER_BYTES: usize = MAGIC.len() + 8;

/// The least a histogram takes in the file (key, sum, written, schema, zero count, two
/// empty stores), to refuse an impossible count before allocating.
const MIN_HISTOGRAM_BYTES: usize = 16 + 8 + 1 + 4 + 8 + 2 * 4;

/// Bytes of one bucket in the file: index and weight.
const BUCKET_BYTES: usize = 4 + 8;

static HISTOGRAM_LOG: RateLimitedLog = RateLimitedLog::new("ingester.roll_forward_histogram", 5);

/// Visits every field of a running total in file order.
///
/// **A field added to [`Total`] is one line here, at the end** (and `VERSION + 1`): a
/// file written before it gives the field its [`Default`].
fn total_fields(total: &mut Total, fields: &mut impl Fields) {
    fields.field(&mut total.value);
    fields.field(&mut total.last_tile_end_ms);
    fields.field(&mut total.last_delta);
    fields.field(&mut total.written);
    fields.field(&mut total.origin);
    // Version 2: the shard (plus one) of the ingesters' placement; 0, unknown, in version 1.
    fields.field(&mut total.shard);
    // Version 3: the newest sample's timestamp (a late tile's correction), 0 before; and
    // whether the newest tile came from an incomplete copy (1), 0 before.
    fields.field(&mut total.last_sample_ms);
    let mut last_incomplete = u8::from(total.last_incomplete);
    fields.field(&mut last_incomplete);
    total.last_incomplete = last_incomplete != 0;
    // Version 5: adopted from another writer (1), its first tile still remembered; 0 before,
    // when an adopted total marked the tiles before its first in `written` instead.
    let mut adopted = u8::from(total.adopted);
    fields.field(&mut adopted);
    total.adopted = adopted != 0;
}

/// The ingesters' placement as a checkpoint records it (see the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PlacementSeen {
    /// Its version.
    pub(super) version: u64,
    /// Per shard, the cutoff at which this ingester gives it away (0: none).
    pub(super) cutoffs: Vec<i64>,
}

/// What a checkpoint says beside the converter's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// When it was taken, unix milliseconds.
    pub taken_at_ms: i64,
    /// Every queue record before this position is in the state (see
    /// [`crate::queue::QueueWriter::appended_through`]).
    pub covers: Position,
}

/// Why a checkpoint could not be restored; the converter is left as it was.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// The file does not start with [`MAGIC`].
    #[error("not a checkpoint: the file does not start with the checkpoint magic")]
    Magic,
    /// A version this build does not know.
    #[error("checkpoint version {found} is not one this build reads (1 to {VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The body does not match its CRC.
    #[error("checkpoint checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// CRC in the header.
        stored: u32,
        /// CRC of the body read.
        computed: u32,
    },
    /// The file ends before what it declares.
    #[error("checkpoint ends early: {what} at byte {offset} needs {needed} bytes, {left} left")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left in the file.
        left: usize,
    },
    /// A histogram's buckets are out of order, or spread wider than a sketch holds.
    #[error("checkpoint holds unordered or too widely spread buckets for series {key:032x}")]
    Buckets {
        /// The series key.
        key: u128,
    },
    /// A histogram's sketch is invalid.
    #[error("checkpoint holds an invalid histogram for series {key:032x}")]
    Sketch {
        /// The series key.
        key: u128,
        /// What is wrong with it.
        #[source]
        source: SketchError,
    },
    /// Bytes follow the last histogram.
    #[error("checkpoint has {bytes} bytes after its end")]
    Trailing {
        /// How many.
        bytes: usize,
    },
}

/// Why a queued native histogram could not be rolled forward.
#[derive(Debug, thiserror::Error)]
enum HistogramBytesError {
    #[error("not a remote-write histogram")]
    Decode(#[from] prost::DecodeError),
    #[error("{store} buckets out of order or spanning more than {MAX_BUCKETS}")]
    Buckets { store: &'static str },
    #[error("invalid histogram buckets")]
    Sketch(#[from] SketchError),
}

/// Bytes of one piece of an encoded checkpoint: growing one buffer would copy it all at
/// each doubling, a pause in the middle of a step.
const PIECE_BYTES: usize = 1 << 20;

/// Encoded bytes in pieces of about [`PIECE_BYTES`].
#[derive(Debug, Default)]
struct Pieces {
    done: Vec<Vec<u8>>,
    current: Vec<u8>,
}

impl Pieces {
    /// Where the next bytes go.
    fn out(&mut self) -> &mut Vec<u8> {
        if self.current.len() >= PIECE_BYTES {
            let full = std::mem::replace(&mut self.current, Vec::with_capacity(PIECE_BYTES + PIECE_BYTES / 4));
            self.done.push(full);
        }
        &mut self.current
    }

    fn into_vec(mut self) -> Vec<Vec<u8>> {
        self.done.push(self.current);
        self.done
    }
}

/// A checkpoint being encoded a few series at a time (see the [module docs](self)).
#[derive(Debug)]
pub struct CheckpointEncoder {
    meta: CheckpointMeta,
    /// The series with a running total when it began; each is saved as it is at its step.
    keys: Vec<u128>,
    next: usize,
    totals: Pieces,
    total_count: u64,
    histograms: Pieces,
    histogram_count: u64,
    /// The placement the converter's totals were made under when it began (see the
    /// [module docs](self)).
    placement: Option<PlacementSeen>,
}

impl CheckpointEncoder {
    /// Whether every series has been saved.
    pub fn is_done(&self) -> bool {
        self.next >= self.keys.len()
    }
}

/// An encoded checkpoint: the file in parts, so it need not be copied into one.
#[derive(Debug)]
pub struct EncodedCheckpoint {
    /// Header and the fixed fields, up to the totals' count.
    head: Vec<u8>,
    totals: Vec<Vec<u8>>,
    histogram_count: [u8; 8],
    histograms: Vec<Vec<u8>>,
    /// The placement's version, the cutoffs' count and values.
    placement: Vec<u8>,
    series: u64,
}

impl EncodedCheckpoint {
    /// The file's bytes, in order, with the CRC of the body in the header.
    pub fn parts(&mut self) -> Vec<&[u8]> {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&self.head[HEADER_BYTES..]);
        self.totals.iter().for_each(|piece| crc.update(piece));
        crc.update(&self.histogram_count);
        self.histograms.iter().for_each(|piece| crc.update(piece));
        crc.update(&self.placement);
        self.head[MAGIC.len() + 4..HEADER_BYTES].copy_from_slice(&crc.finalize().to_le_bytes());
        let mut parts = vec![self.head.as_slice()];
        parts.extend(self.totals.iter().map(Vec::as_slice));
        parts.push(&self.histogram_count);
        parts.extend(self.histograms.iter().map(Vec::as_slice));
        parts.push(&self.placement);
        parts
    }

    /// The whole file.
    pub fn into_bytes(mut self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.len());
        for part in self.parts() {
            bytes.extend_from_slice(part);
        }
        bytes
    }

    /// Bytes of the file.
    pub fn len(&self) -> usize {
        let pieces = |pieces: &[Vec<u8>]| pieces.iter().map(Vec::len).sum::<usize>();
        self.head.len()
            + pieces(&self.totals)
            + self.histogram_count.len()
            + pieces(&self.histograms)
            + self.placement.len()
    }

    /// Whether it is empty (never: a checkpoint has at least its header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Running totals in it.
    pub fn series(&self) -> u64 {
        self.series
    }
}

impl Converter {
    /// Starts a checkpoint covering the queue up to `meta.covers`; the series are saved by
    /// [`continue_checkpoint`](Self::continue_checkpoint). Call it, and the steps, between
    /// conversions (after [`commit`](Converter::commit) or [`rollback`](Converter::rollback)).
    pub fn begin_checkpoint(&self, meta: CheckpointMeta) -> CheckpointEncoder {
        CheckpointEncoder {
            meta,
            keys: self.totals.keys().copied().collect(),
            next: 0,
            totals: Pieces::default(),
            total_count: 0,
            histograms: Pieces::default(),
            histogram_count: 0,
            placement: self.placement_seen(),
        }
    }

    /// The placement a checkpoint records: that of the views taken in, or before the first
    /// one, the one restored (a restart that checkpoints before it converts anything keeps
    /// what it restored, and what that is compared with).
    fn placement_seen(&self) -> Option<PlacementSeen> {
        if self.owned.is_empty() {
            self.restored_placement.clone()
        } else {
            Some(PlacementSeen { version: self.view_version, cutoffs: self.cutoffs.clone() })
        }
    }

    /// Saves up to `series` more series as they are now; returns whether every one is saved.
    pub fn continue_checkpoint(&self, encoder: &mut CheckpointEncoder, series: usize) -> bool {
        let end = encoder.next.saturating_add(series).min(encoder.keys.len());
        for key in &encoder.keys[encoder.next..end] {
            // Gone since it began: it expired. Stale (made before this ingester last lost
            // or gained its shard): a restart would take it for current.
            let Some(total) = self.totals.get(key).filter(|total| self.total_is_current(total)) else { continue };
            let out = encoder.totals.out();
            key.put(out);
            let mut fields = *total;
            total_fields(&mut fields, &mut Put(out));
            encoder.total_count += 1;
            if let Some(histogram) = self.histograms.get(key) {
                let out = encoder.histograms.out();
                key.put(out);
                encode_histogram(histogram, out);
                encoder.histogram_count += 1;
            }
        }
        encoder.next = end;
        encoder.is_done()
    }

    /// Ends a checkpoint whose series are all saved (any left are saved now).
    pub fn finish_checkpoint(&self, mut encoder: CheckpointEncoder) -> EncodedCheckpoint {
        self.continue_checkpoint(&mut encoder, usize::MAX);
        let mut head = Vec::with_capacity(HEADER_BYTES + 64);
        head.extend_from_slice(&MAGIC);
        VERSION.put(&mut head);
        0u32.put(&mut head); // the CRC, once the body is known ([`EncodedCheckpoint::parts`])
        encoder.meta.taken_at_ms.put(&mut head);
        encoder.meta.covers.segment.put(&mut head);
        encoder.meta.covers.offset.put(&mut head);
        self.newest_tile_end_ms.put(&mut head);
        self.last_sweep_tile_end_ms.put(&mut head);
        (total_bytes() as u32).put(&mut head);
        encoder.total_count.put(&mut head);
        // The placement it began under (see the module docs); the first view, if it came in
        // during the steps.
        let recorded = encoder.placement.or_else(|| self.placement_seen()).unwrap_or_default();
        let mut placement = Vec::with_capacity(16 + 8 * recorded.cutoffs.len());
        recorded.version.put(&mut placement);
        (recorded.cutoffs.len() as u64).put(&mut placement);
        for cutoff in recorded.cutoffs {
            cutoff.put(&mut placement);
        }
        EncodedCheckpoint {
            head,
            totals: encoder.totals.into_vec(),
            histogram_count: encoder.histogram_count.to_le_bytes(),
            histograms: encoder.histograms.into_vec(),
            placement,
            series: encoder.total_count,
        }
    }

    /// Encodes the whole running state with `meta` at once.
    pub fn encode_checkpoint(&self, meta: CheckpointMeta) -> EncodedCheckpoint {
        self.finish_checkpoint(self.begin_checkpoint(meta))
    }

    /// Replaces the running state with the checkpoint in `bytes`; returns what it covers.
    /// On an error nothing changes. The first ownership view taken in after it makes the
    /// totals of a shard the placement may have moved since stale (see the
    /// [module docs](self), *Placement*).
    pub fn restore_checkpoint(&mut self, bytes: &[u8]) -> Result<CheckpointMeta, CheckpointError> {
        let decoded = decode(bytes)?;
        self.undo.clear();
        self.discard_pending();
        self.totals = decoded.totals;
        self.histograms = decoded.histograms;
        self.restored_placement = decoded.placement;
        self.newest_tile_end_ms = decoded.newest_tile_end_ms;
        self.last_sweep_tile_end_ms = decoded.last_sweep_tile_end_ms;
        Ok(decoded.meta)
    }

    /// Applies one record appended after the restored checkpoint (see the
    /// [module docs](self)); returns how many running totals it set.
    pub fn roll_forward(&mut self, record: &Record) -> usize {
        if self.renders_lines() {
            // A per-tile target keeps no running totals.
            return 0;
        }
        let resolution_ms = resolution_ms(&record.resolution);
        let mut applied = 0;
        for sample in &record.samples {
            let kind = sample.sample_kind();
            if !matches!(
                kind,
                SampleKind::Counter
                    | SampleKind::SummaryCount
                    | SampleKind::SummarySum
                    | SampleKind::Histogram
                    | SampleKind::HistogramBucket
                    | SampleKind::HistogramSum
                    | SampleKind::HistogramCount
            ) {
                continue;
            }
            let key = xxhash_rust::xxh3::xxh3_128(&sample.labels);
            let rolled = match sample.timestamp_ms {
                0 => self.roll_total_forward(key, sample.value, record, resolution_ms),
                timestamp_ms => {
                    self.roll_correction_forward(key, sample.value, timestamp_ms, record.tile_end_ms, resolution_ms)
                }
            };
            if !rolled {
                continue;
            }
            applied += 1;
            if kind != SampleKind::Histogram {
                continue;
            }
            match cumulative_from_histogram(&sample.histogram) {
                Ok(histogram) => {
                    self.histograms.insert(key, histogram);
                }
                Err(error) => {
                    // Its next tile starts the histogram again (reset hint YES).
                    self.histograms.remove(&key);
                    if HISTOGRAM_LOG.allow() {
                        tracing::warn!(%error, tile_end_ms = record.tile_end_ms, "cannot roll a queued native histogram forward");
                    }
                }
            }
        }
        self.newest_tile_end_ms = self.newest_tile_end_ms.max(record.tile_end_ms);
        applied
    }

    /// Sets the total `key` to `value` at `tile_end_ms` if that is newer than what it holds.
    fn roll_total_forward(&mut self, key: u128, value: f64, record: &Record, resolution_ms: Option<i64>) -> bool {
        let tile_end_ms = record.tile_end_ms;
        let total = self.totals.entry(key).or_insert(Total {
            last_tile_end_ms: i64::MIN,
            origin: UNKNOWN_ORIGIN,
            ..Total::default()
        });
        if tile_end_ms <= total.last_tile_end_ms {
            return false;
        }
        let behind = tile_end_ms.saturating_sub(total.last_tile_end_ms);
        let shift = match resolution_ms {
            Some(resolution_ms) => behind / resolution_ms,
            None => 64,
        };
        total.written = if (0..64).contains(&shift) { total.written << shift } else { 0 } | 1;
        total.last_delta = value - total.value;
        total.value = value;
        total.last_tile_end_ms = tile_end_ms;
        total.last_sample_ms = tile_end_ms;
        total.last_incomplete = record.incomplete;
        true
    }

    /// Sets the total `key` to `value`, a correction written at `timestamp_ms` for the tile
    /// ending `late_tile_end_ms`, if it is newer than the total's newest sample: a late
    /// tile's (it counts as written) or a complete copy's that replaced the newest tile.
    fn roll_correction_forward(
        &mut self,
        key: u128,
        value: f64,
        timestamp_ms: i64,
        late_tile_end_ms: i64,
        resolution_ms: Option<i64>,
    ) -> bool {
        let Some(total) = self.totals.get_mut(&key) else { return false };
        if timestamp_ms <= total.last_sample_ms.max(total.last_tile_end_ms) {
            return false;
        }
        let back = resolution_ms
            .filter(|resolution| *resolution > 0)
            .and_then(|resolution| Some(total.last_tile_end_ms.checked_sub(late_tile_end_ms)? / resolution));
        if let Some(back) = back.filter(|back| (0..64).contains(back)) {
            total.written |= 1 << back;
        }
        if late_tile_end_ms == total.last_tile_end_ms {
            // A complete copy replaced the incomplete one: its tile added what this adds.
            total.last_delta += value - total.value;
            total.last_incomplete = false;
        }
        total.value = value;
        total.last_sample_ms = timestamp_ms;
        true
    }
}

/// Milliseconds of a `resolution` label (`500ms`, `10s`, `1m`, `1h`, `1d`).
pub(super) fn resolution_ms(label: &str) -> Option<i64> {
    let digits = label.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = label.split_at(digits);
    let number: i64 = number.parse().ok()?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number.checked_mul(unit_ms).filter(|ms| *ms > 0)
}

/// The cumulative histogram a queued remote-write `Histogram` holds.
fn cumulative_from_histogram(bytes: &[u8]) -> Result<Cumulative, HistogramBytesError> {
    let histogram = Histogram::decode(bytes)?;
    let (positive_offset, positive_counts) =
        dense_buckets(&histogram.positive_spans, &histogram.positive_deltas, "positive")?;
    let (negative_offset, negative_counts) =
        dense_buckets(&histogram.negative_spans, &histogram.negative_deltas, "negative")?;
    let sketch = Sketch::from_proto(&tessera_proto::Sketch {
        schema: histogram.schema,
        zero_count: histogram.zero_count_int as f64,
        positive_offset,
        positive_counts,
        negative_offset,
        negative_counts,
    })?;
    Ok(Cumulative { sketch, sum: histogram.sum, written: true, before_last: None })
}

/// Spans and delta-encoded counts as the first index and the dense counts from it, refusing
/// (without allocating much) spans that go backwards or reach past [`MAX_BUCKETS`].
fn dense_buckets(
    spans: &[BucketSpan],
    deltas: &[i64],
    store: &'static str,
) -> Result<(i32, Vec<f64>), HistogramBytesError> {
    let refused = HistogramBytesError::Buckets { store };
    let (mut index, mut count, mut first) = (0i64, 0i64, None);
    let mut deltas = deltas.iter();
    let mut counts = Vec::new();
    for span in spans {
        index += i64::from(span.offset);
        for _ in 0..span.length {
            count = count.saturating_add(deltas.next().copied().unwrap_or(0));
            let first = *first.get_or_insert(index);
            let position = index - first;
            if !(0..MAX_BUCKETS as i64).contains(&position) {
                return Err(refused);
            }
            counts.resize(position as usize + 1, 0.0);
            counts[position as usize] = count.max(0) as f64;
            index += 1;
        }
    }
    let first = i32::try_from(first.unwrap_or(0)).map_err(|_| refused)?;
    Ok((first, counts))
}

fn encode_histogram(histogram: &Cumulative, out: &mut Vec<u8>) {
    let sketch = &histogram.sketch;
    histogram.sum.put(out);
    u8::from(histogram.written).put(out);
    sketch.schema().put(out);
    sketch.zero_count().put(out);
    put_buckets(sketch.positive_buckets(), out);
    put_buckets(sketch.negative_buckets(), out);
}

/// The non-zero buckets, sparse: a sketch's window is often much wider than what it holds.
fn put_buckets(buckets: impl Iterator<Item = (i32, f64)>, out: &mut Vec<u8>) {
    let count_at = out.len();
    0u32.put(out);
    let mut count = 0u32;
    for (index, weight) in buckets {
        index.put(out);
        weight.put(out);
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
}

/// Sparse buckets (by increasing index) as the first index and the dense weights from it,
/// if they are in order and span at most [`MAX_BUCKETS`].
fn dense_from_sparse(buckets: &[(i32, f64)]) -> Option<(i32, Vec<f64>)> {
    let (Some(&(first, _)), Some(&(last, _))) = (buckets.first(), buckets.last()) else {
        return Some((0, Vec::new()));
    };
    let ordered = buckets.windows(2).all(|pair| pair[0].0 < pair[1].0);
    if !ordered || i64::from(last) - i64::from(first) >= MAX_BUCKETS as i64 {
        return None;
    }
    let mut dense = vec![0.0; (last - first) as usize + 1];
    for (index, weight) in buckets {
        dense[(index - first) as usize] = *weight;
    }
    Some((first, dense))
}

/// A decoded checkpoint, before it replaces a converter's state.
struct Decoded {
    meta: CheckpointMeta,
    newest_tile_end_ms: i64,
    last_sweep_tile_end_ms: i64,
    totals: Totals,
    histograms: Histograms,
    /// `None` before version 4, or when the converter knew no placement.
    placement: Option<PlacementSeen>,
}

fn decode(bytes: &[u8]) -> Result<Decoded, CheckpointError> {
    let mut reader = Reader { bytes, at: 0 };
    if reader.take(MAGIC.len(), "magic")? != MAGIC {
        return Err(CheckpointError::Magic);
    }
    let version: u32 = reader.scalar("version")?;
    if !(1..=VERSION).contains(&version) {
        return Err(CheckpointError::Version { found: version });
    }
    let stored: u32 = reader.scalar("checksum")?;
    let computed = crc32fast::hash(&bytes[HEADER_BYTES..]);
    if stored != computed {
        return Err(CheckpointError::Checksum { stored, computed });
    }
    let taken_at_ms = reader.scalar("taken_at_ms")?;
    let covers = Position { segment: reader.scalar("covered segment")?, offset: reader.scalar("covered offset")? };
    let newest_tile_end_ms = reader.scalar("newest_tile_end_ms")?;
    let last_sweep_tile_end_ms = reader.scalar("last_sweep_tile_end_ms")?;
    let total_bytes = reader.scalar::<u32>("total_bytes")? as usize;

    let count = reader.count("totals", 16 + total_bytes)?;
    let mut totals = Totals::with_capacity_and_hasher(count, Default::default());
    for _ in 0..count {
        let key: u128 = reader.scalar("total key")?;
        let mut total = Total::default();
        total_fields(&mut total, &mut Get(reader.take(total_bytes, "total")?));
        totals.insert(key, total);
    }

    let count = reader.count("histograms", MIN_HISTOGRAM_BYTES)?;
    let mut histograms = Histograms::with_capacity_and_hasher(count, Default::default());
    for _ in 0..count {
        let key: u128 = reader.scalar("histogram key")?;
        let sum = reader.scalar("histogram sum")?;
        let written = reader.scalar::<u8>("histogram written")? != 0;
        let schema = reader.scalar("histogram schema")?;
        let zero_count = reader.scalar("histogram zero count")?;
        let positive = dense_from_sparse(&reader.buckets("positive buckets")?);
        let negative = dense_from_sparse(&reader.buckets("negative buckets")?);
        let (Some((positive_offset, positive_counts)), Some((negative_offset, negative_counts))) = (positive, negative)
        else {
            return Err(CheckpointError::Buckets { key });
        };
        let proto = tessera_proto::Sketch {
            schema,
            zero_count,
            positive_offset,
            positive_counts,
            negative_offset,
            negative_counts,
        };
        let sketch = Sketch::from_proto(&proto).map_err(|source| CheckpointError::Sketch { key, source })?;
        histograms.insert(key, Cumulative { sketch, sum, written, before_last: None });
    }
    let placement = if version >= 4 {
        let version = reader.scalar("placement version")?;
        let count = reader.count("cutoffs", 8)?;
        let cutoffs = (0..count).map(|_| reader.scalar("cutoff")).collect::<Result<Vec<i64>, _>>()?;
        Some(PlacementSeen { version, cutoffs }).filter(|placement| !placement.cutoffs.is_empty())
    } else {
        None
    };
    let left = bytes.len() - reader.at;
    if left > 0 {
        return Err(CheckpointError::Trailing { bytes: left });
    }
    Ok(Decoded {
        meta: CheckpointMeta { taken_at_ms, covers },
        newest_tile_end_ms,
        last_sweep_tile_end_ms,
        totals,
        histograms,
        placement,
    })
}

/// Bytes of one total's fields as this build writes them.
fn total_bytes() -> usize {
    let mut count = CountBytes(0);
    total_fields(&mut Total::default(), &mut count);
    count.0
}

/// Reads a checkpoint front to back, refusing to read past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, needed: usize, what: &'static str) -> Result<&'a [u8], CheckpointError> {
        let left = self.bytes.len() - self.at;
        if needed > left {
            return Err(CheckpointError::Truncated { what, offset: self.at, needed, left });
        }
        let taken = &self.bytes[self.at..self.at + needed];
        self.at += needed;
        Ok(taken)
    }

    fn scalar<T: Scalar>(&mut self, what: &'static str) -> Result<T, CheckpointError> {
        Ok(T::get(self.take(T::BYTES, what)?))
    }

    /// A count of items of at least `item_bytes` each, refused when they cannot fit in what
    /// is left (so a damaged count never allocates).
    fn count(&mut self, what: &'static str, item_bytes: usize) -> Result<usize, CheckpointError> {
        let count: u64 = self.scalar(what)?;
        let left = self.bytes.len() - self.at;
        let needed = u128::from(count) * item_bytes as u128;
        if needed > left as u128 {
            let needed = usize::try_from(needed).unwrap_or(usize::MAX);
            return Err(CheckpointError::Truncated { what, offset: self.at, needed, left });
        }
        Ok(count as usize)
    }

    /// A `u32` count, then that many buckets (index and weight).
    fn buckets(&mut self, what: &'static str) -> Result<Vec<(i32, f64)>, CheckpointError> {
        let count = self.scalar::<u32>(what)? as usize;
        let bytes = self.take(count.saturating_mul(BUCKET_BYTES), what)?;
        Ok(bytes.chunks_exact(BUCKET_BYTES).map(|bucket| (i32::get(&bucket[..4]), f64::get(&bucket[4..]))).collect())
    }
}

/// A fixed-width little-endian value of the file.
trait Scalar: Copy {
    const BYTES: usize;
    fn put(self, out: &mut Vec<u8>);
    /// From exactly `BYTES` bytes.
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! little_endian_scalar {
    ($($type:ty),*) => {$(
        impl Scalar for $type {
            const BYTES: usize = std::mem::size_of::<$type>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$type>::from_le_bytes(bytes.try_into().expect("the reader takes exactly BYTES bytes"))
            }
        }
    )*};
}

little_endian_scalar!(u8, u32, i32, u64, i64, u128, f64);

/// Something that visits a total's fields ([`total_fields`]).
trait Fields {
    fn field<T: Scalar>(&mut self, value: &mut T);
}

/// Appends each field.
struct Put<'a>(&'a mut Vec<u8>);

impl Fields for Put<'_> {
    fn field<T: Scalar>(&mut self, value: &mut T) {
        value.put(self.0);
    }
}

/// Reads each field from one total's bytes; a field past them (a file from before it was
/// added) keeps its default.
struct Get<'a>(&'a [u8]);

impl Fields for Get<'_> {
    fn field<T: Scalar>(&mut self, value: &mut T) {
        if let Some((bytes, rest)) = self.0.split_at_checked(T::BYTES) {
            *value = T::get(bytes);
            self.0 = rest;
        }
    }
}

/// Adds up the fields' widths.
struct CountBytes(usize);

impl Fields for CountBytes {
    fn field<T: Scalar>(&mut self, _: &mut T) {
        self.0 += T::BYTES;
    }
}

#[cfg(test)]
mod tests;
