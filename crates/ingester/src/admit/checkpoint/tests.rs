use prost::Message;
use tessera_proto::TileBatch;
use tessera_testkit::tiles::{counter, timer};

use super::*;
use crate::admit::{HistogramMode, SkipReason};
use crate::queue::series::{Histogram, RESET_HINT_YES};

const START_MS: i64 = 1_700_000_000_000;

/// Tile `n` (10 s tiles): two counters, a timer written as summary and native histogram,
/// and one series that only appears in some tiles.
fn tile_batch(n: i64) -> TileBatch {
    let mut tiles = vec![
        counter("hits|#env:prod", 1.0 + n as f64),
        counter("bytes", 1000.5),
        timer("latency|#env:prod", &[n as f64 + 0.5, 10.0 * (n + 1) as f64, 250.0, -3.0, 0.0]),
    ];
    if n % 3 == 0 {
        tiles.push(counter("rare", 7.0));
    }
    TileBatch {
        placement_version: 0,
        completes_version: 0,
        owner_refused: false,
        source: "agg-1".into(),
        sequence: n as u64,
        storage_policy: "10s:2d".into(),
        resolution_ms: 10_000,
        tile_end_ms: START_MS + n * 10_000,
        tiles,
        flushed_at_ms: 0,
        incomplete: false,
    }
}

fn converter() -> Converter {
    Converter::new(&[0.5, 0.99], 3_600_000).with_histograms(HistogramMode::Both, 160)
}

fn convert(converter: &mut Converter, batch: &TileBatch) -> Record {
    let conversion = converter.convert(batch, 0).expect("a valid batch");
    converter.commit();
    conversion.record
}

fn checkpoint(converter: &Converter, covers: Position) -> Vec<u8> {
    converter.encode_checkpoint(CheckpointMeta { taken_at_ms: 42, covers }).into_bytes()
}

/// A converter's running state, comparable.
#[derive(Debug, PartialEq)]
struct State {
    totals: Vec<(u128, Total)>,
    /// Key, sum, written, sketch.
    histograms: Vec<(u128, f64, bool, Sketch)>,
    newest_tile_end_ms: i64,
}

fn state(converter: &Converter) -> State {
    let mut totals: Vec<_> = converter.totals.iter().map(|(key, total)| (*key, *total)).collect();
    totals.sort_by_key(|(key, _)| *key);
    let mut histograms: Vec<_> = converter
        .histograms
        .iter()
        .map(|(key, histogram)| (*key, histogram.sum, histogram.written, histogram.sketch.clone()))
        .collect();
    histograms.sort_by_key(|(key, ..)| *key);
    State { totals, histograms, newest_tile_end_ms: converter.newest_tile_end_ms }
}

/// The histogram of a record's native sample, decoded.
fn native(record: &Record) -> Histogram {
    let sample = record.samples.iter().find(|sample| !sample.histogram.is_empty()).expect("a native sample");
    Histogram::decode(sample.histogram.as_ref()).expect("a histogram")
}

#[test]
fn a_checkpoint_round_trips_counters_summaries_and_native_histograms() {
    let mut original = converter();
    for n in 0..5 {
        convert(&mut original, &tile_batch(n));
    }
    let covers = Position { segment: 7, offset: 4096 };
    let bytes = checkpoint(&original, covers);

    let mut restored = converter();
    let meta = restored.restore_checkpoint(&bytes).expect("a good checkpoint");
    assert_eq!(meta, CheckpointMeta { taken_at_ms: 42, covers });
    assert_eq!(state(&restored), state(&original));
    // Counters (3 incl. the rare one), the summary's _count and _sum, the histogram's count.
    assert_eq!(restored.cumulative_series(), 6);
    assert_eq!(restored.cumulative_histograms(), 1);

    // The next tile continues every series: the same samples as without a restart, and the
    // histogram is no reset.
    let next = tile_batch(5);
    let expected = convert(&mut original, &next);
    let got = convert(&mut restored, &next);
    assert_eq!(got.samples, expected.samples);
    assert_eq!(native(&got).reset_hint, 0, "no reset hint after a restore");
    assert_eq!(native(&got).count_int, 6 * 5);

    // A resent copy of an older tile is still known as written: not added twice.
    let conversion = restored.convert(&tile_batch(2), 0).unwrap();
    restored.rollback();
    assert!(conversion.record.samples.is_empty());
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 3, "{:?}", conversion.skipped);
}

#[test]
fn an_empty_converter_round_trips() {
    let bytes = checkpoint(&converter(), Position::default());
    let mut restored = converter();
    restored.restore_checkpoint(&bytes).unwrap();
    assert_eq!(state(&restored), state(&converter()));
}

#[test]
fn a_damaged_checkpoint_is_refused_with_the_reason_and_changes_nothing() {
    let mut original = converter();
    for n in 0..3 {
        convert(&mut original, &tile_batch(n));
    }
    let bytes = checkpoint(&original, Position { segment: 1, offset: 8 });
    let mut restored = converter();
    convert(&mut restored, &tile_batch(0));
    let before = state(&restored);

    // Every flipped bit and every truncation is refused, never a panic.
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x10;
        assert!(restored.restore_checkpoint(&damaged).is_err(), "flipped byte {at}");
    }
    for len in 0..bytes.len() {
        assert!(restored.restore_checkpoint(&bytes[..len]).is_err(), "cut at {len}");
    }
    assert_eq!(state(&restored), before, "a refused checkpoint changes nothing");

    let mut damaged = bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let error = restored.restore_checkpoint(&damaged).unwrap_err();
    assert!(matches!(error, CheckpointError::Checksum { .. }));
    assert!(error.to_string().starts_with("checkpoint checksum mismatch: stored 0x"), "{error}");
    let error = restored.restore_checkpoint(b"TSQSEG\x00\x01 a queue segment").unwrap_err();
    assert_eq!(error.to_string(), "not a checkpoint: the file does not start with the checkpoint magic");
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(VERSION + 1).to_le_bytes());
    let error = restored.restore_checkpoint(&newer).unwrap_err();
    assert_eq!(error, CheckpointError::Version { found: VERSION + 1 });
    let error = restored.restore_checkpoint(&bytes[..30]).unwrap_err();
    assert!(matches!(error, CheckpointError::Checksum { .. }), "a cut file fails its checksum first: {error}");
}

/// Re-seals a body edited in place.
fn reseal(bytes: &mut [u8]) {
    let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
    bytes[MAGIC.len() + 4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn impossible_counts_behind_a_valid_checksum_are_refused_without_allocating() {
    let bytes = checkpoint(&converter(), Position::default());
    // The totals count follows the fixed fields and the total width.
    let count_at = HEADER_BYTES + 8 + 16 + 8 + 8 + 4;
    let mut huge = bytes.clone();
    huge[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    reseal(&mut huge);
    let error = converter().restore_checkpoint(&huge).unwrap_err();
    assert!(matches!(error, CheckpointError::Truncated { what: "totals", .. }), "{error}");

    let mut trailing = bytes.clone();
    trailing.extend_from_slice(b"junk");
    reseal(&mut trailing);
    assert_eq!(converter().restore_checkpoint(&trailing).unwrap_err(), CheckpointError::Trailing { bytes: 4 });

    // The file ends with the placement's version and the cutoffs' count (none without a
    // placement).
    const CUTOFFS: usize = 16;
    let mut cutoffs = bytes.clone();
    let cutoffs_at = cutoffs.len() - 8;
    cutoffs[cutoffs_at..].copy_from_slice(&u64::MAX.to_le_bytes());
    reseal(&mut cutoffs);
    let error = converter().restore_checkpoint(&cutoffs).unwrap_err();
    assert!(matches!(error, CheckpointError::Truncated { what: "cutoffs", .. }), "{error}");

    // A histogram whose buckets are not a sketch's.
    let mut one = converter();
    convert(&mut one, &TileBatch { tiles: vec![timer("t", &[5.0])], ..tile_batch(0) });
    let mut bad = checkpoint(&one, Position::default());
    // From the end: no cutoff, no negative bucket, one positive bucket, the zero count, the
    // schema.
    let schema_at = bad.len() - CUTOFFS - 4 - (4 + BUCKET_BYTES) - 8 - 4;
    bad[schema_at..schema_at + 4].copy_from_slice(&99i32.to_le_bytes());
    reseal(&mut bad);
    let error = converter().restore_checkpoint(&bad).unwrap_err();
    assert!(matches!(error, CheckpointError::Sketch { source: SketchError::InvalidSchema { schema: 99 }, .. }));
    // Buckets out of order.
    let mut two = converter();
    convert(&mut two, &TileBatch { tiles: vec![timer("t", &[5.0, 500.0])], ..tile_batch(0) });
    let mut unordered = checkpoint(&two, Position::default());
    let second_index_at = unordered.len() - CUTOFFS - 4 - BUCKET_BYTES;
    let first_index = unordered[second_index_at - BUCKET_BYTES..second_index_at - BUCKET_BYTES + 4].to_vec();
    unordered[second_index_at..second_index_at + 4].copy_from_slice(&first_index);
    reseal(&mut unordered);
    assert!(matches!(converter().restore_checkpoint(&unordered).unwrap_err(), CheckpointError::Buckets { .. }));
}

#[test]
fn a_file_from_before_a_total_field_was_added_gives_it_its_default() {
    let mut original = converter();
    convert(&mut original, &TileBatch { tiles: vec![counter("c", 2.0)], ..tile_batch(0) });
    let bytes = checkpoint(&original, Position::default());
    // Rewrite it as an older build would have: totals without their last fields (origin,
    // then the shard of version 2 and the newest sample's time of version 3).
    let stripped = 8 + 4 + 8;
    let width_at = HEADER_BYTES + 8 + 16 + 8 + 8;
    let width = total_bytes();
    let first_total = width_at + 4 + 8;
    let mut older = bytes[..width_at].to_vec();
    older.extend_from_slice(&(width as u32 - stripped).to_le_bytes());
    older.extend_from_slice(&bytes[width_at + 4..first_total + 16 + width - stripped as usize]);
    older.extend_from_slice(&bytes[first_total + 16 + width..]);
    reseal(&mut older);

    let mut restored = converter();
    restored.restore_checkpoint(&older).expect("an older layout reads");
    let (_, total) = state(&restored).totals[0];
    assert_eq!((total.value, total.last_tile_end_ms, total.origin, total.last_sample_ms), (2.0, START_MS, 0, 0));
    // The unknown origin is adopted by the next tile, not taken for a name collision.
    let record = convert(&mut restored, &TileBatch { tiles: vec![counter("c", 3.0)], ..tile_batch(1) });
    assert_eq!(record.samples[0].value, 5.0);

    // A version 3 file ends after the histograms: no placement.
    let mut version3 = bytes[..bytes.len() - 16].to_vec();
    version3[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&3u32.to_le_bytes());
    reseal(&mut version3);
    let mut restored = converter();
    restored.restore_checkpoint(&version3).expect("version 3 reads");
    assert_eq!(state(&restored).totals[0].1.value, 2.0);
}

#[test]
fn rolling_forward_the_records_after_a_checkpoint_gives_the_state_without_a_restart() {
    let mut original = converter();
    let mut records = Vec::new();
    let mut taken = None;
    for n in 0..8 {
        records.push(convert(&mut original, &tile_batch(n)));
        if n == 3 {
            taken = Some(checkpoint(&original, Position { segment: 1, offset: n as u64 }));
        }
    }
    let mut restored = converter();
    restored.restore_checkpoint(&taken.expect("taken")).unwrap();
    let mut applied = 0;
    for record in &records[4..] {
        applied += restored.roll_forward(record);
    }
    assert!(applied > 0);
    let State { totals: original_totals, histograms: original_histograms, newest_tile_end_ms: newest } =
        state(&original);
    let State { totals, histograms, newest_tile_end_ms: restored_newest } = state(&restored);
    assert_eq!(restored_newest, newest);
    assert_eq!(totals.len(), original_totals.len());
    for ((key, total), (original_key, original_total)) in totals.iter().zip(&original_totals) {
        assert_eq!(key, original_key);
        // Value, tile end, written tiles and origin as without a restart; the last tile's
        // delta too, since no late tile came in between.
        assert_eq!(total, original_total);
    }
    // Integer observations: the sketches come back exactly from the written histograms.
    assert_eq!(histograms, original_histograms);

    // The next tile continues every series, the histogram without a reset hint.
    let expected = convert(&mut original, &tile_batch(8));
    let got = convert(&mut restored, &tile_batch(8));
    assert_eq!(got.samples, expected.samples);
    assert_eq!(native(&got).reset_hint, 0);
    // A replica's copy of a rolled-forward tile (four series, the rare one among them) is a
    // duplicate, not added again.
    let conversion = restored.convert(&tile_batch(6), 0).unwrap();
    restored.rollback();
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 4, "{:?}", conversion.skipped);
}

#[test]
fn a_checkpoint_encoded_in_steps_while_batches_convert_is_made_whole_by_the_roll_forward() {
    let mut original = converter();
    let mut records: Vec<Record> = (0..3).map(|n| convert(&mut original, &tile_batch(n))).collect();
    let covers = Position { segment: 1, offset: 3 };
    let mut encoder = original.begin_checkpoint(CheckpointMeta { taken_at_ms: 1, covers });
    // One series per step, a batch converted between two steps (one with a new series).
    let mut n = 3;
    while !original.continue_checkpoint(&mut encoder, 1) {
        let mut batch = tile_batch(n);
        if n == 4 {
            batch.tiles.push(counter("fresh", 2.0));
        }
        records.push(convert(&mut original, &batch));
        n += 1;
    }
    let bytes = original.finish_checkpoint(encoder).into_bytes();
    records.push(convert(&mut original, &tile_batch(n)));
    assert!(n >= 8, "the steps interleaved with batches");

    let mut restored = converter();
    assert_eq!(restored.restore_checkpoint(&bytes).unwrap().covers, covers);
    for record in &records[3..] {
        restored.roll_forward(record);
    }
    // Every series as without a restart; the one made during the steps, of unknown origin.
    let mut restored_state = state(&restored);
    let original_state = state(&original);
    assert_eq!(restored_state.totals.len(), 7);
    for ((_, total), (_, original_total)) in restored_state.totals.iter_mut().zip(&original_state.totals) {
        if total.origin == UNKNOWN_ORIGIN {
            assert_eq!(total.value, 2.0, "only the new series");
            total.origin = original_total.origin;
        }
    }
    assert_eq!(restored_state, original_state);
    let mut next = tile_batch(n + 1);
    next.tiles.push(counter("fresh", 1.0));
    assert_eq!(convert(&mut restored, &next).samples, convert(&mut original, &next).samples);
}

#[test]
fn rolling_forward_without_a_checkpoint_starts_totals_of_unknown_origin_that_tiles_adopt() {
    let mut original = converter();
    let records: Vec<Record> = (0..4).map(|n| convert(&mut original, &tile_batch(n))).collect();
    let mut restored = converter();
    for record in &records {
        restored.roll_forward(record);
    }
    assert!(restored.totals.values().all(|total| total.origin == UNKNOWN_ORIGIN));
    let expected = convert(&mut original, &tile_batch(4));
    let got = convert(&mut restored, &tile_batch(4));
    assert_eq!(got.samples, expected.samples, "no tile refused as a name collision");
    let unknown = restored.totals.values().filter(|total| total.origin == UNKNOWN_ORIGIN).count();
    assert_eq!(unknown, 1, "only the series without a tile since (rare) is left unknown");
    // Once adopted, another statsd series with the same Prometheus series (an empty tag is
    // dropped) is a name collision again.
    let colliding = TileBatch { tiles: vec![counter("hits|#env:prod,x:", 1.0)], ..tile_batch(5) };
    let conversion = restored.convert(&colliding, 0).unwrap();
    assert_eq!(conversion.skipped[SkipReason::NameCollision], 1);
}

#[test]
fn a_rolled_forward_histogram_restarts_when_its_bytes_are_damaged() {
    let mut original = converter();
    let mut record = convert(&mut original, &tile_batch(0));
    for sample in &mut record.samples {
        if !sample.histogram.is_empty() {
            sample.histogram = bytes::Bytes::from_static(b"\xff\xff\xff");
        }
    }
    let mut restored = converter();
    restored.roll_forward(&record);
    assert_eq!(restored.cumulative_histograms(), 0);
    assert_eq!(native(&convert(&mut restored, &tile_batch(1))).reset_hint, RESET_HINT_YES);
}

#[test]
fn resolution_labels_parse_to_milliseconds() {
    for (label, ms) in [("500ms", Some(500)), ("10s", Some(10_000)), ("1m", Some(60_000)), ("2h", Some(7_200_000))] {
        assert_eq!(resolution_ms(label), ms, "{label}");
    }
    for label in ["", "s", "10", "10x", "0s", "99999999999999999999d"] {
        assert_eq!(resolution_ms(label), None, "{label}");
    }
}

#[test]
fn sparse_buckets_become_a_dense_window_when_ordered_and_narrow_enough() {
    assert_eq!(dense_from_sparse(&[]), Some((0, Vec::new())));
    assert_eq!(dense_from_sparse(&[(-2, 1.0), (1, 2.5)]), Some((-2, vec![1.0, 0.0, 0.0, 2.5])));
    assert_eq!(dense_from_sparse(&[(1, 1.0), (1, 1.0)]), None);
    assert_eq!(dense_from_sparse(&[(i32::MIN, 1.0), (i32::MAX, 1.0)]), None);
}

#[test]
fn buckets_that_go_backwards_or_span_too_far_are_refused() {
    let span = |offset, length| BucketSpan { offset, length };
    assert_eq!(
        dense_buckets(&[span(3, 2), span(1, 1)], &[2, 1, -3], "positive").unwrap(),
        (3, vec![2.0, 3.0, 0.0, 0.0])
    );
    assert!(dense_buckets(&[span(0, 1), span(-5, 1)], &[1, 1], "positive").is_err());
    assert!(dense_buckets(&[span(0, u32::MAX)], &[1], "positive").is_err());
    assert!(dense_buckets(&[span(i32::MAX, 1), span(i32::MAX, 1)], &[1, 1], "positive").is_err());
}

#[test]
fn a_late_tiles_correction_rolls_forward_so_a_crash_after_it_keeps_the_late_delta() {
    let mut original = converter();
    for n in [1, 2] {
        convert(&mut original, &tile_batch(n));
    }
    let bytes = checkpoint(&original, Position::default());
    // Tile 0, never written and older than the newest: late, with its correction record
    // (without the series that only tile 0 has, which would be new, not late).
    let mut zero = tile_batch(0);
    zero.tiles.truncate(3);
    let late = convert(&mut original, &zero);
    assert!(!late.samples.is_empty() && late.samples.iter().all(|sample| sample.timestamp_ms == START_MS + 20_001));

    let mut restored = converter();
    restored.restore_checkpoint(&bytes).unwrap();
    assert!(restored.roll_forward(&late) > 0);
    assert_eq!(state(&restored), state(&original), "the correction rolled forward gives the same state");
    // A second copy of the late tile after the restart is a duplicate, not late again.
    let again = restored.convert(&zero, 0).unwrap();
    assert_eq!(again.skipped[crate::admit::SkipReason::Late], 0);
    // The next tile goes on from the total with the late delta in it.
    let next = convert(&mut restored, &tile_batch(3));
    let expected = convert(&mut original, &tile_batch(3));
    assert_eq!(next.samples, expected.samples);
}
