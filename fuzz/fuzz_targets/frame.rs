//! Fuzzes frame decoding and aggregate validation on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::aggregate::Aggregate;
use tessera_proto::{frame::Body, framing};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((frame, used))) = framing::decode_frame(data, 1 << 20) {
        assert!(used <= data.len());
        if let Some(Body::Partials(batch)) = frame.body {
            for shard in &batch.shards {
                for series in &shard.series {
                    if let Some(aggregate) = &series.aggregate {
                        let _ = Aggregate::from_proto(aggregate);
                    }
                }
            }
        }
    }
});
