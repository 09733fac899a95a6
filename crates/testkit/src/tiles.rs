//! Tile values and tile batches as an aggregator sends them to an ingester,
//! for the ingester's tests and benchmarks.
//!
//! ```
//! use tessera_testkit::tiles::{batch, counter};
//!
//! let tiles = batch(1_700_000_000_000, vec![counter("hits|#env:prod", 1.0)]);
//! assert_eq!(tiles.storage_policy, "10s:2d");
//! ```

use tessera_core::aggregate::{Aggregate, Distribution, Gauge};
use tessera_core::hll::HyperLogLog;
use tessera_proto::{MetricType, SeriesValue, TileBatch};

/// One tile value of series `id`.
pub fn tile(id: &str, metric_type: MetricType, aggregate: Aggregate) -> SeriesValue {
    SeriesValue {
        r#ref: 0,
        series_id: id.as_bytes().to_vec(),
        r#type: metric_type as i32,
        aggregate: Some(aggregate.to_proto()),
    }
}

/// A counter's tile value: what it added in the tile.
pub fn counter(id: &str, delta: f64) -> SeriesValue {
    tile(id, MetricType::Counter, Aggregate::Counter(delta))
}

/// A gauge's tile value, set at 1 ns past the epoch.
pub fn gauge(id: &str, value: f64) -> SeriesValue {
    tile(id, MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(value, 1))))
}

/// A timer's tile value: `values`, each observed once.
pub fn timer(id: &str, values: &[f64]) -> SeriesValue {
    let mut distribution = Distribution::default();
    for value in values {
        distribution.insert(*value, 1.0);
    }
    tile(id, MetricType::Timer, Aggregate::Distribution(Box::new(distribution)))
}

/// A set's tile value: `members`, each seen at least once.
pub fn set(id: &str, members: &[&str]) -> SeriesValue {
    let mut set = HyperLogLog::new();
    for member in members {
        set.insert(member.as_bytes());
    }
    tile(id, MetricType::Set, Aggregate::Set(Box::new(set)))
}

/// Batch 1 from `agg-1` of the 10 s tile of `10s:2d` ending at `tile_end_ms`,
/// flushed 100 ms after it.
pub fn batch(tile_end_ms: i64, tiles: Vec<SeriesValue>) -> TileBatch {
    TileBatch {
        placement_version: 0,
        completes_version: 0,
        owner_refused: false,
        source: "agg-1".into(),
        sequence: 1,
        storage_policy: "10s:2d".into(),
        resolution_ms: 10_000,
        tile_end_ms,
        tiles,
        flushed_at_ms: tile_end_ms + 100,
        incomplete: false,
    }
}
