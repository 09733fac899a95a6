//! Tile batches to storage samples, at ingest time.
//!
//! [`Converter::convert`] turns one [`TileBatch`] into one [`Record`] of final samples
//! before the record is written to the queue, so a replay resends exactly what was
//! computed the first time. Names and labels follow [`names`]; every sample gets a
//! `resolution` label from the batch's storage policy (`10s:2d` → `resolution="10s"`), so
//! several resolutions can share one store; every sample is stamped with the tile's end.
//!
//! | statsd type | samples (OpenMetrics family type) |
//! |---|---|
//! | counter | `<name>_total`, **cumulative** (counter; a name already ending in `_total` keeps it) |
//! | gauge | `<name>`: the tile's value; a tile holding only `+N`/`-N` deltas gives `0 + delta` (gauge) |
//! | set | `<name>`: the estimated number of distinct members in the tile (gauge) |
//! | timer, histogram, distribution | `<name>{quantile="0.5"\|"0.9"\|"0.99"}` per tile, `<name>_sum` and `<name>_count` cumulative (summary); `<name>_min`, `<name>_max` per tile (gauges) |
//!
//! **Cumulative values.** Counters, `_sum` and `_count` are running totals per series
//! (name, tags and resolution), kept in memory and added to in record order. A restart
//! starts them from 0 again, which storage sees as a counter reset (`rate()` and
//! `increase()` handle it); so does a series idle for longer than the expiry. A tile that
//! is not newer than the last one written for its series (late, or a second partial for
//! the same tile) is added to the running total without a sample of its own, so its
//! count appears in the next sample instead of being rejected by storage as out of order.
//! Quantiles are clamped to the tile's `[min, max]`.
//!
//! The conversion is transactional: [`Converter::commit`] keeps the new totals once the
//! record is durable, [`Converter::rollback`] restores them when it could not be queued.

pub mod names;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;
use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_core::series::split_id;
use tessera_proto::TileBatch;

use crate::record::{Record, SampleKind, StoredSample};

/// Why a whole batch was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    /// Neither a storage policy nor a resolution.
    #[error("batch from `{source_name}` has no storage policy and no resolution")]
    NoResolution {
        /// The batch's source.
        source_name: String,
    },
    /// The tile end is not a positive unix time.
    #[error("batch from `{source_name}` has an invalid tile end {tile_end_ms}")]
    TileEnd {
        /// The batch's source.
        source_name: String,
        /// The tile end given.
        tile_end_ms: i64,
    },
}

/// Why single tiles were skipped (the rest of the batch is kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkippedTiles {
    /// The metric type is unknown.
    pub unknown_type: u64,
    /// The aggregate is missing or invalid (non-finite values, bad sketch or set).
    pub invalid_aggregate: u64,
    /// The aggregate does not match the metric type.
    pub type_mismatch: u64,
    /// Not newer than the series' last sample: folded into the running total, no sample.
    pub late: u64,
}

impl SkippedTiles {
    /// Every reason with its count, for metrics.
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        [
            ("unknown_type", self.unknown_type),
            ("invalid_aggregate", self.invalid_aggregate),
            ("type_mismatch", self.type_mismatch),
            ("late", self.late),
        ]
    }
}

/// The result of converting one batch.
#[derive(Debug)]
pub struct Conversion {
    /// The record to queue.
    pub record: Record,
    /// Tiles that gave no samples, by reason.
    pub skipped: SkippedTiles,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Total {
    value: f64,
    /// Tile end of the last sample written for the series.
    last_tile_end_ms: i64,
}

/// A hasher for keys that are already hashes (xxh3-128 of the labels).
#[derive(Default)]
struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }
}

type Totals = HashMap<u128, Total, BuildHasherDefault<PrehashedKey>>;

/// Converts tile batches into records; holds the running totals. See the [module docs](self).
pub struct Converter {
    quantiles: Vec<(f64, String)>,
    totals: Totals,
    undo: Vec<(u128, Option<Total>)>,
    expire_after_ms: i64,
    newest_tile_end_ms: i64,
    last_sweep_tile_end_ms: i64,
    tags: names::TagLabels,
    name: String,
    /// The statsd name `name` was made from (consecutive tiles often share it).
    raw_name: Vec<u8>,
    arena: Vec<u8>,
    /// Label bytes per tile of the last batch, to size the next arena at once.
    arena_bytes_per_tile: usize,
    spans: Vec<(usize, usize, f64, SampleKind)>,
}

/// What one tile turns into, before the labels are encoded.
struct Emit<'a> {
    suffix: &'a str,
    quantile: Option<&'a str>,
    value: f64,
    kind: SampleKind,
}

impl Converter {
    /// A converter emitting `quantiles` for distributions and forgetting the running total
    /// of a series not written for `expire_after_ms`.
    pub fn new(quantiles: &[f64], expire_after_ms: i64) -> Converter {
        Converter {
            quantiles: quantiles.iter().map(|q| (*q, q.to_string())).collect(),
            totals: Totals::default(),
            undo: Vec::new(),
            expire_after_ms,
            newest_tile_end_ms: i64::MIN,
            last_sweep_tile_end_ms: i64::MIN,
            tags: names::TagLabels::default(),
            name: String::new(),
            raw_name: Vec::new(),
            arena: Vec::new(),
            arena_bytes_per_tile: 0,
            spans: Vec::new(),
        }
    }

    /// Series with a running total in memory.
    pub fn cumulative_series(&self) -> usize {
        self.totals.len()
    }

    /// Converts `batch`. Running totals change at once; [`commit`](Self::commit) or
    /// [`rollback`](Self::rollback) must follow before the next call.
    pub fn convert(&mut self, batch: &TileBatch, received_at_ms: i64) -> Result<Conversion, BatchError> {
        let Some(resolution) = names::resolution_label(&batch.storage_policy, batch.resolution_ms) else {
            return Err(BatchError::NoResolution { source_name: batch.source.clone() });
        };
        if batch.tile_end_ms <= 0 {
            return Err(BatchError::TileEnd { source_name: batch.source.clone(), tile_end_ms: batch.tile_end_ms });
        }
        self.undo.clear();
        self.arena.clear();
        self.arena.reserve(batch.tiles.len() * self.arena_bytes_per_tile);
        self.spans.clear();
        let tile_end_ms = batch.tile_end_ms;
        let mut skipped = SkippedTiles::default();
        let mut tiles = 0u32;
        for tile in &batch.tiles {
            let Ok(kind) = kind_from_proto(tile.r#type) else {
                skipped.unknown_type += 1;
                continue;
            };
            let Some(aggregate) = tile.aggregate.as_ref().and_then(|aggregate| Aggregate::from_proto(aggregate).ok())
            else {
                skipped.invalid_aggregate += 1;
                continue;
            };
            let (raw_name, raw_tags) = split_id(&tile.series_id);
            if raw_name != self.raw_name.as_slice() || self.name.is_empty() {
                self.name.clear();
                names::metric_name(raw_name, &mut self.name);
                self.raw_name.clear();
                self.raw_name.extend_from_slice(raw_name);
            }
            names::tag_labels(raw_tags, &mut self.tags);
            let written = match (kind, &aggregate) {
                (MetricKind::Counter, Aggregate::Counter(delta)) => self.counter(*delta, &resolution, tile_end_ms),
                (MetricKind::Gauge, Aggregate::Gauge(gauge)) => {
                    let value = gauge.resolve(Some(0.0)).unwrap_or(0.0);
                    self.emit(&resolution, &Emit { suffix: "", quantile: None, value, kind: SampleKind::Gauge });
                    true
                }
                (MetricKind::Set, Aggregate::Set(set)) => {
                    let value = set.estimate();
                    self.emit(&resolution, &Emit { suffix: "", quantile: None, value, kind: SampleKind::Gauge });
                    true
                }
                (
                    MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution,
                    Aggregate::Distribution(summary),
                ) => self.distribution(summary, &resolution, tile_end_ms),
                _ => {
                    skipped.type_mismatch += 1;
                    continue;
                }
            };
            if written {
                tiles += 1;
            } else {
                skipped.late += 1;
            }
        }
        self.newest_tile_end_ms = self.newest_tile_end_ms.max(tile_end_ms);
        if !batch.tiles.is_empty() {
            self.arena_bytes_per_tile = self.arena.len().div_ceil(batch.tiles.len());
        }
        let arena = Bytes::from(std::mem::take(&mut self.arena));
        let samples = self
            .spans
            .iter()
            .map(|&(start, end, value, kind)| StoredSample {
                labels: arena.slice(start..end),
                value,
                kind: kind as i32,
            })
            .collect();
        let record = Record {
            storage_policy: batch.storage_policy.clone(),
            resolution,
            tile_end_ms,
            received_at_ms,
            source: batch.source.clone(),
            batch_sequence: batch.sequence,
            tiles,
            samples,
            flushed_at_ms: batch.flushed_at_ms,
        };
        Ok(Conversion { record, skipped })
    }

    /// Keeps the running totals of the last conversion (its record is durable), and
    /// forgets totals idle for longer than the expiry (checked at most once a minute of
    /// tile time).
    pub fn commit(&mut self) {
        self.undo.clear();
        if self.newest_tile_end_ms.saturating_sub(self.last_sweep_tile_end_ms) >= 60_000 {
            self.last_sweep_tile_end_ms = self.newest_tile_end_ms;
            let oldest_kept = self.newest_tile_end_ms.saturating_sub(self.expire_after_ms);
            self.totals.retain(|_, total| total.last_tile_end_ms >= oldest_kept);
        }
    }

    /// Restores the running totals from before the last conversion (its record was not queued).
    pub fn rollback(&mut self) {
        while let Some((key, previous)) = self.undo.pop() {
            match previous {
                Some(total) => self.totals.insert(key, total),
                None => self.totals.remove(&key),
            };
        }
    }

    fn counter(&mut self, delta: f64, resolution: &str, tile_end_ms: i64) -> bool {
        let suffix = if self.name.ends_with("_total") { "" } else { "_total" };
        let span = self.encode(resolution, suffix, None);
        let key = xxhash_rust::xxh3::xxh3_128(&self.arena[span.0..span.1]);
        match self.add_to_total(key, delta, tile_end_ms) {
            Some(value) => {
                self.spans.push((span.0, span.1, value, SampleKind::Counter));
                true
            }
            None => {
                self.arena.truncate(span.0);
                false
            }
        }
    }

    fn distribution(
        &mut self,
        summary: &tessera_core::aggregate::Distribution,
        resolution: &str,
        tile_end_ms: i64,
    ) -> bool {
        let count_span = self.encode(resolution, "_count", None);
        let count_key = xxhash_rust::xxh3::xxh3_128(&self.arena[count_span.0..count_span.1]);
        let sum_span = self.encode(resolution, "_sum", None);
        let sum_key = xxhash_rust::xxh3::xxh3_128(&self.arena[sum_span.0..sum_span.1]);
        let count = self.add_to_total(count_key, summary.count, tile_end_ms);
        // The sum follows the count's verdict, so the two stay in step.
        let sum = match count {
            Some(_) => self.add_to_total(sum_key, summary.sum, tile_end_ms),
            None => {
                self.add_to_total(sum_key, summary.sum, i64::MIN);
                None
            }
        };
        let (Some(count), Some(sum)) = (count, sum) else {
            self.arena.truncate(count_span.0);
            return false;
        };
        self.spans.push((count_span.0, count_span.1, count, SampleKind::SummaryCount));
        self.spans.push((sum_span.0, sum_span.1, sum, SampleKind::SummarySum));
        let (min, max) = (summary.min, summary.max);
        if min.is_finite() && max.is_finite() && min <= max {
            for index in 0..self.quantiles.len() {
                let Some(value) = summary.sketch.quantile(self.quantiles[index].0) else { continue };
                let quantile = std::mem::take(&mut self.quantiles[index].1);
                let emit = Emit {
                    suffix: "",
                    quantile: Some(&quantile),
                    value: value.clamp(min, max),
                    kind: SampleKind::SummaryQuantile,
                };
                self.emit(resolution, &emit);
                self.quantiles[index].1 = quantile;
            }
            self.emit(resolution, &Emit { suffix: "_min", quantile: None, value: min, kind: SampleKind::Gauge });
            self.emit(resolution, &Emit { suffix: "_max", quantile: None, value: max, kind: SampleKind::Gauge });
        }
        true
    }

    /// Adds `delta` to the series' total; returns the new total if a sample is due (the
    /// tile is newer than the last sample), `None` if the tile was folded in silently.
    fn add_to_total(&mut self, key: u128, delta: f64, tile_end_ms: i64) -> Option<f64> {
        let previous = self.totals.get(&key).copied();
        self.undo.push((key, previous));
        let (value, last) = previous.map_or((0.0, i64::MIN), |total| (total.value, total.last_tile_end_ms));
        let value = value + delta;
        if tile_end_ms > last {
            self.totals.insert(key, Total { value, last_tile_end_ms: tile_end_ms });
            Some(value)
        } else {
            self.totals.insert(key, Total { value, last_tile_end_ms: last });
            None
        }
    }

    fn emit(&mut self, resolution: &str, emit: &Emit<'_>) {
        let (start, end) = self.encode(resolution, emit.suffix, emit.quantile);
        self.spans.push((start, end, emit.value, emit.kind));
    }

    /// Encodes the labels of `<name><suffix>` into the arena; returns their span.
    ///
    /// The labels tessera adds sort as `__name__` < `quantile` < `resolution`, and tags
    /// never carry those names ([`names::RESERVED_LABELS`]), so one merge of two sorted
    /// lists gives the sorted label set without a sort or an allocation.
    fn encode(&mut self, resolution: &str, suffix: &str, quantile: Option<&str>) -> (usize, usize) {
        let start = self.arena.len();
        let name = [self.name.as_str(), suffix];
        let quantile_parts = quantile.map(|quantile| [quantile, ""]);
        let resolution_parts = [resolution, ""];
        let mut extras: [Option<(&str, &[&str; 2])>; 3] = [
            Some(("__name__", &name)),
            quantile_parts.as_ref().map(|parts| ("quantile", parts)),
            Some(("resolution", &resolution_parts)),
        ];
        let mut tags = self.tags.labels.iter().peekable();
        let mut extra_index = 0;
        loop {
            while extra_index < extras.len() && extras[extra_index].is_none() {
                extra_index += 1;
            }
            let extra = extras.get_mut(extra_index).and_then(Option::take);
            match (extra, tags.peek()) {
                (None, None) => break,
                (Some((label, parts)), Some((tag, _))) if tag.as_str() < label => {
                    extras[extra_index] = Some((label, parts));
                    let (tag, value) = tags.next().expect("peeked");
                    encode_label(&mut self.arena, tag, &[value, ""]);
                }
                (Some((label, parts)), _) => {
                    encode_label(&mut self.arena, label, parts);
                    extra_index += 1;
                }
                (None, Some(_)) => {
                    let (tag, value) = tags.next().expect("peeked");
                    encode_label(&mut self.arena, tag, &[value, ""]);
                }
            }
        }
        (start, self.arena.len())
    }
}

/// Appends one `TimeSeries.labels` entry whose value is the concatenation of `value`.
fn encode_label(out: &mut Vec<u8>, name: &str, value: &[&str; 2]) {
    use prost::encoding::encoded_len_varint;
    let value_len = value[0].len() + value[1].len();
    let inner =
        1 + encoded_len_varint(name.len() as u64) + name.len() + 1 + encoded_len_varint(value_len as u64) + value_len;
    out.reserve(1 + encoded_len_varint(inner as u64) + inner);
    out.push(0x0a);
    push_varint(out, inner);
    out.push(0x0a);
    push_varint(out, name.len());
    out.extend_from_slice(name.as_bytes());
    out.push(0x12);
    push_varint(out, value_len);
    out.extend_from_slice(value[0].as_bytes());
    out.extend_from_slice(value[1].as_bytes());
}

/// Appends `value` as a protobuf varint (labels are short: one byte is the common case).
fn push_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests;
