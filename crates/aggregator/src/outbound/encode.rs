//! Tile batches towards an ingester: the values of one tile (or one
//! ingester's share of it) cut into framed [`TileBatch`]es under the frame
//! bound, numbered by the destination queue.

use prost::Message;
use tessera_proto::framing;
use tessera_proto::{Frame, SeriesValue, TileBatch, frame::Body};
use tessera_wire::Batch;

/// Per-value overhead of the repeated field (tag and length prefix), bytes, at most.
const VALUE_OVERHEAD_BYTES: usize = 6;

/// What every batch of one tile says about the tile.
#[derive(Debug, Clone, Copy)]
pub struct TileHead<'a> {
    /// The storage policy, e.g. `10s:2d`.
    pub storage_policy: &'a str,
    /// The policy's resolution, milliseconds.
    pub resolution_ms: u32,
    /// The tile's end, unix milliseconds.
    pub tile_end_ms: i64,
    /// When the aggregator flushed the tile, unix milliseconds.
    pub flushed_at_ms: i64,
    /// The tile began before this process started: its copy may lack partials.
    pub incomplete: bool,
    /// The version of the ingesters' placement the share was routed by (0: a fixed list).
    pub placement_version: u64,
    /// A completion's: the version the shard set's leader routed its incomplete copy under
    /// (0: not a completion, or not known).
    pub completes_version: u64,
    /// Routed again after the ingester it went to refused it for good (it did not write it).
    pub owner_refused: bool,
}

/// Splits some of a tile's values (one ingester's share) into framed
/// batches of at most half of `max_frame_bytes` each (the other half is
/// headroom), numbered by `next_sequence`.
///
/// Returns the batches and the series values that could not be sent
/// because a single value exceeds the frame bound.
pub fn encode_values(
    head: &TileHead<'_>,
    values: Vec<SeriesValue>,
    source: &str,
    max_frame_bytes: usize,
    next_sequence: &mut dyn FnMut() -> u64,
) -> (Vec<Batch>, u64) {
    let budget = (max_frame_bytes / 2).max(1);
    let mut batches = Vec::new();
    let mut too_large = 0u64;
    let mut pending: Vec<SeriesValue> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut seal = |values: Vec<SeriesValue>, batches: &mut Vec<Batch>, too_large: &mut u64| {
        let series = values.len() as u64;
        let sequence = next_sequence();
        let batch = TileBatch {
            source: source.to_owned(),
            sequence,
            storage_policy: head.storage_policy.to_owned(),
            resolution_ms: head.resolution_ms,
            tile_end_ms: head.tile_end_ms,
            tiles: values,
            flushed_at_ms: head.flushed_at_ms,
            incomplete: head.incomplete,
            placement_version: head.placement_version,
            completes_version: head.completes_version,
            owner_refused: head.owner_refused,
        };
        match framing::encode_frame(&Frame { body: Some(Body::Tiles(batch)) }, max_frame_bytes) {
            Ok(frame) => batches.push(Batch { sequence, frame, items: series, refs: None, owner_refused: false }),
            Err(error) => {
                tracing::warn!(%error, series, "a tile batch exceeds the frame bound; dropped");
                *too_large += series;
            }
        }
    };
    for value in values {
        let value_bytes = value.encoded_len() + VALUE_OVERHEAD_BYTES;
        if pending_bytes + value_bytes > budget && !pending.is_empty() {
            seal(std::mem::take(&mut pending), &mut batches, &mut too_large);
            pending_bytes = 0;
        }
        pending_bytes += value_bytes;
        pending.push(value);
    }
    if !pending.is_empty() {
        seal(pending, &mut batches, &mut too_large);
    }
    (batches, too_large)
}
