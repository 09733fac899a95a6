//! Per-tile targets: each series' tile rendered, at ingest time, as text in the target's
//! protocol (carbon plaintext for Graphite, [`crate::sink::graphite`]; line protocol for
//! InfluxDB, [`crate::sink::influx`]).
//!
//! A per-tile store keeps what happened in each interval, one value per (path, slot), and
//! a later write to a slot replaces the earlier one (whisper; InfluxDB's points, by
//! measurement, tags and time). So of the rules in
//! [`crate::admit`] (*Each tile counts once*) only the copies' apply; running totals,
//! corrections, adoptions and resets do not:
//!
//! | copy of a tile | written |
//! |---|---|
//! | whole, first or again (a replica's, a resend) | yes: the same values over the same slots |
//! | whole, after an incomplete copy | yes: it replaces the incomplete copy's values |
//! | incomplete, after a whole copy | no (`tiles_skipped{reason="incomplete"}`) |
//! | incomplete, after another aggregator's incomplete copy | the series that copy did not write (`reason="incomplete"` for the rest) |
//! | late (older than tiles written) | yes, at its own timestamp: a past slot takes it |
//!
//! The record's samples are one per series: [`StoredSample::lines`] holds the series'
//! lines, stamped with the tile's end in seconds (statsd and brubeck stamp their flush
//! time, which is the end of the interval flushed). A replay resends the same text.

use bytes::Bytes;
use tessera_core::aggregate::{Aggregate, kind_from_proto};
use tessera_core::parse::MetricKind;
use tessera_proto::TileBatch;

use super::{Conversion, Converter, PerTile, SkipReason, SkippedTiles};
use crate::queue::record::{Record, SampleKind, StoredSample};
use crate::sink::NameChangeMetrics;
use crate::sink::graphite::{Changes, Naming, Tile, TileValue};
use crate::sink::influx::InfluxNaming;

/// How a per-tile target renders a series' tile.
#[derive(Debug, Clone)]
pub enum LineFormat {
    /// Carbon plaintext, `path value timestamp\n`, named by `naming`; timers are multiplied
    /// by `timer_scale` to be in the unit they were sent in.
    Graphite {
        /// Whose paths, and how tags are written.
        naming: Naming,
        /// 1000 when the collectors keep `|ms` timers in seconds, else 1.
        timer_scale: f64,
    },
    /// InfluxDB line protocol, named as Telegraf's statsd input writes it, stamped in ms.
    Influx {
        /// Separator and percentiles.
        naming: InfluxNaming,
        /// As for Graphite.
        timer_scale: f64,
    },
}

/// A converter's per-tile rendering, with the changes of the conversion not committed yet.
pub(super) struct Lines {
    format: LineFormat,
    counters: NameChangeMetrics,
    pending: Changes,
    text: String,
    /// Text bytes per tile of the last batch, to size the next at once.
    bytes_per_tile: usize,
}

impl Converter {
    /// Makes this the converter of a per-tile target: each series' tile is rendered in
    /// `format` (see [`lines`](self)); the names it had to change are counted in `changes`.
    pub fn with_lines(mut self, format: LineFormat, changes: NameChangeMetrics) -> Converter {
        self.lines = Some(Lines {
            format,
            counters: changes,
            pending: Changes::default(),
            text: String::new(),
            bytes_per_tile: 0,
        });
        self
    }

    /// Whether this converter renders per-tile lines (it keeps no running totals then).
    pub fn renders_lines(&self) -> bool {
        self.lines.is_some()
    }

    /// Converts `batch` for a per-tile target.
    pub(super) fn convert_lines(&mut self, batch: &TileBatch, resolution: String, received_at_ms: i64) -> Conversion {
        let Some(mut lines) = self.lines.take() else {
            unreachable!("convert_lines is called for a per-tile converter")
        };
        let tile_end_ms = batch.tile_end_ms;
        let resolution_ms = match i64::from(batch.resolution_ms) {
            0 => super::checkpoint::resolution_ms(&resolution).unwrap_or(10_000),
            ms => ms,
        };
        lines.pending = Changes::default();
        lines.text.clear();
        lines.text.reserve(batch.tiles.len() * lines.bytes_per_tile);
        let mut spans = Vec::with_capacity(batch.tiles.len());
        let mut skipped = SkippedTiles::default();
        let key = (resolution_ms, tile_end_ms);
        for tile in &batch.tiles {
            let Ok(kind) = kind_from_proto(tile.r#type) else {
                skipped.add(SkipReason::UnknownType);
                continue;
            };
            let Some(aggregate) = tile.aggregate.as_ref().and_then(|aggregate| Aggregate::from_proto(aggregate).ok())
            else {
                skipped.add(SkipReason::InvalidAggregate);
                continue;
            };
            let origin = xxhash_rust::xxh3::xxh3_64_with_seed(&tile.series_id, kind as u64);
            match self.per_tile {
                PerTile::Skip(verdict) => {
                    skipped.count(verdict);
                    continue;
                }
                PerTile::UnlessWritten(verdict) if self.copies.written_at_end(key, origin) => {
                    skipped.count(verdict);
                    continue;
                }
                _ => {}
            }
            let value = match (kind, &aggregate) {
                (MetricKind::Counter, Aggregate::Counter(count)) => TileValue::Counter(*count),
                (MetricKind::Gauge, Aggregate::Gauge(gauge)) => {
                    TileValue::Gauge(gauge.resolve(Some(0.0)).unwrap_or(0.0))
                }
                (MetricKind::Set, Aggregate::Set(set)) => TileValue::Set(set.estimate()),
                (
                    MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution,
                    Aggregate::Distribution(distribution),
                ) => TileValue::Distribution(kind, distribution),
                _ => {
                    skipped.add(SkipReason::TypeMismatch);
                    continue;
                }
            };
            if batch.incomplete {
                self.written_at_end_pending.push(origin);
            }
            let start = lines.text.len();
            let (LineFormat::Graphite { timer_scale, .. } | LineFormat::Influx { timer_scale, .. }) = &lines.format;
            let tile = Tile {
                id: &tile.series_id,
                value,
                interval_secs: resolution_ms as f64 / 1000.0,
                timer_scale: *timer_scale,
            };
            match &lines.format {
                LineFormat::Graphite { naming, .. } => {
                    naming.write(&tile, tile_end_ms.div_euclid(1000), &mut lines.text, &mut lines.pending)
                }
                LineFormat::Influx { naming, .. } => {
                    naming.write(&tile, tile_end_ms, &mut lines.text, &mut lines.pending)
                }
            }
            spans.push((start, lines.text.len()));
        }
        if !batch.tiles.is_empty() {
            lines.bytes_per_tile = lines.text.len().div_ceil(batch.tiles.len());
        }
        let text = Bytes::from(std::mem::take(&mut lines.text).into_bytes());
        let samples: Vec<StoredSample> = spans
            .iter()
            .map(|&(start, end)| StoredSample {
                lines: text.slice(start..end),
                kind: SampleKind::Gauge as i32,
                ..Default::default()
            })
            .collect();
        self.lines = Some(lines);
        self.newest_tile_end_ms = self.newest_tile_end_ms.max(tile_end_ms);
        let record = Record {
            storage_policy: batch.storage_policy.clone(),
            resolution,
            tile_end_ms,
            received_at_ms,
            source: batch.source.clone(),
            batch_sequence: batch.sequence,
            tiles: samples.len() as u32,
            samples,
            flushed_at_ms: batch.flushed_at_ms,
            incomplete: batch.incomplete,
        };
        Conversion { record, skipped }
    }

    /// Counts the names the last conversion changed (its record is durable).
    pub(super) fn commit_lines(&mut self) {
        if let Some(lines) = &mut self.lines {
            let changes = std::mem::take(&mut lines.pending);
            lines.counters.keys_sanitized.inc_by(changes.keys_sanitized);
            lines.counters.tags_sanitized.inc_by(changes.tags_sanitized);
            lines.counters.tags_dropped.inc_by(changes.tags_dropped);
        }
    }

    /// Forgets the names the last conversion changed (its record was not queued).
    pub(super) fn rollback_lines(&mut self) {
        if let Some(lines) = &mut self.lines {
            lines.pending = Changes::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use tessera_testkit::tiles::{batch, counter, gauge, timer};

    use super::*;
    use crate::admit::SkipReason;

    fn converter() -> Converter {
        let format = LineFormat::Graphite { naming: Naming::default(), timer_scale: 1000.0 };
        Converter::new(&[0.5], 3_600_000).with_lines(format, NameChangeMetrics::default())
    }

    /// Converts and commits `batch`; returns its text and skipped tiles.
    fn convert(converter: &mut Converter, batch: &TileBatch) -> (String, SkippedTiles) {
        let conversion = converter.convert(batch, 0).unwrap();
        converter.commit();
        let text = conversion.record.samples.iter().map(|sample| String::from_utf8(sample.lines.to_vec()).unwrap());
        (text.collect(), conversion.skipped)
    }

    #[test]
    fn each_series_tile_is_one_sample_of_its_lines_stamped_with_the_tiles_end() {
        let mut converter = converter();
        let tiles = vec![counter("api.hits", 50.0), gauge("queue depth", 4.0), timer("api.latency", &[0.1, 0.3])];
        let conversion = converter.convert(&batch(1_700_000_010_000, tiles), 0).unwrap();
        converter.commit();
        let texts: Vec<String> =
            conversion.record.samples.iter().map(|sample| String::from_utf8(sample.lines.to_vec()).unwrap()).collect();
        assert_eq!(texts.len(), 3);
        assert_eq!(texts[0], "stats.api.hits 5 1700000010\nstats_counts.api.hits 50 1700000010\n");
        assert_eq!(texts[1], "stats.gauges.queue_depth 4 1700000010\n");
        assert!(texts[2].contains("stats.timers.api.latency.upper 300 1700000010\n"), "in ms: {}", texts[2]);
        assert!(texts[2].contains("stats.timers.api.latency.sum 400 1700000010\n"), "{}", texts[2]);
        assert_eq!(conversion.record.tiles, 3);
        assert_eq!(converter.cumulative_series(), 0, "no running totals");
        assert_eq!(converter.lines.as_ref().unwrap().counters.keys_sanitized.get(), 1, "`queue depth`, once committed");
    }

    #[test]
    fn an_incomplete_copy_never_overwrites_a_whole_one_and_a_whole_one_replaces_an_incomplete_one() {
        let mut converter = converter();
        let whole = batch(10_000, vec![counter("a", 10.0)]);
        let incomplete =
            |end| TileBatch { incomplete: true, source: "agg-2".into(), ..batch(end, vec![counter("a", 4.0)]) };
        convert(&mut converter, &whole);
        let (text, skipped) = convert(&mut converter, &incomplete(10_000));
        assert_eq!(text, "");
        assert_eq!(skipped[SkipReason::Incomplete], 1);
        let (text, _) = convert(&mut converter, &incomplete(20_000));
        assert_eq!(text, "stats.a 0.4 20\nstats_counts.a 4 20\n", "only an incomplete copy: written");
        let (text, _) = convert(&mut converter, &batch(20_000, vec![counter("a", 10.0)]));
        assert_eq!(text, "stats.a 1 20\nstats_counts.a 10 20\n", "the whole copy replaces it");
        let (text, _) = convert(&mut converter, &whole);
        assert_eq!(text, "stats.a 1 10\nstats_counts.a 10 10\n", "a duplicate writes the same values again");
    }

    #[test]
    fn a_rolled_back_conversion_counts_no_name_changes() {
        let mut converter = converter();
        converter.convert(&batch(10_000, vec![counter("a b", 1.0)]), 0).unwrap();
        converter.rollback();
        assert_eq!(converter.lines.as_ref().unwrap().counters.keys_sanitized.get(), 0);
    }
}
