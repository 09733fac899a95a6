//! Fuzzes frame decoding, aggregate validation, and the aggregator's
//! decoder and merge threads on arbitrary bytes.
//!
//! The input is read as a stream of frames on two connections (the first
//! byte of each step picks one), so series dictionaries carry over from
//! frame to frame: definitions, refs, unknown refs, new dictionaries and
//! frames without one all reach the decoder and the tilers in any order.
//! Nothing may panic, and a ref the decoder let through must reach a slot
//! its merge thread knows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_aggregator::{Decoded, Decoder, Tiler, TilerSettings, WindowPartials};
use tessera_core::aggregate::Aggregate;
use tessera_proto::{frame::Body, framing};
use tessera_topology::{Placement, PlacementHandle};

const MAX_FRAME_BYTES: usize = 1 << 20;
const MERGE_THREADS: usize = 2;
const T0: i64 = 1_700_000_040_000;

fuzz_target!(|data: &[u8]| {
    let placement = Placement::init(&[("a", "h:1")], 8, 1, 0).expect("a valid placement");
    let mut decoder = Decoder::new("a".to_owned(), PlacementHandle::fixed(placement), MERGE_THREADS);
    let mut settings = TilerSettings::new(vec!["10s:2d".parse().expect("policy")]);
    // Series expire and their numbers are reused while dictionaries name others.
    settings.expire_after_empty_tiles = Some(1);
    let mut tilers: Vec<Tiler> = (0..MERGE_THREADS).map(|_| Tiler::new(settings.clone(), T0)).collect();
    let mut rest = data;
    while let Some((&connection, after)) = rest.split_first() {
        let connection = u64::from(connection & 1);
        let Ok(Some((frame, used))) = framing::decode_frame(after, MAX_FRAME_BYTES) else { break };
        assert!(used <= after.len());
        if let Some(Body::Partials(batch)) = &frame.body {
            for series in batch.shards.iter().flat_map(|shard| &shard.series) {
                if let Some(aggregate) = &series.aggregate {
                    let _ = Aggregate::from_proto(aggregate);
                }
            }
        }
        let decoded = decoder.decode(connection, &after[framing::LENGTH_PREFIX_BYTES..used]);
        // As the pipeline does: after every decode, refused or not.
        if let Some(forgotten) = decoder.take_forgotten() {
            tilers.iter_mut().for_each(|tiler| tiler.forget_dictionary(forgotten));
        }
        if let Decoded::Batch { batch, .. } = decoded {
            // Windows within a minute of T0, admitted or refused as the
            // admission thread would (refused: definitions bound only).
            let window_start_ms = T0 + batch.window_start_ms.rem_euclid(60_000) / 1_000 * 1_000;
            let admitted = tilers[0].check(window_start_ms, 1_000, window_start_ms + 1_000).is_ok();
            if admitted {
                // Close what ended 20 s before the window, as admission would.
                tilers.iter_mut().for_each(|tiler| tiler.close_through(window_start_ms - 20_000, &mut |_| {}));
            }
            for (tiler, partials) in tilers.iter_mut().zip(batch.shares) {
                let batch = WindowPartials { connection, window_start_ms, window_ms: 1_000, partials };
                if !admitted {
                    tiler.bind_definitions(&batch);
                    continue;
                }
                let applied = tiler.apply(&batch, &mut |_| {});
                assert_eq!(applied.unknown_refs, 0, "the decoder let through a ref its merge thread never saw");
            }
        }
        rest = &after[used..];
    }
    for connection in 0..2 {
        decoder.closed(connection);
        tilers.iter_mut().for_each(|tiler| tiler.forget_dictionary(connection));
    }
    assert_eq!(decoder.dictionary_refs(), 0, "closed connections keep no refs");
});
