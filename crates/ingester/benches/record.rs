//! The intake writer's hot path: tiles to a queue record, and the record's framing.
//!
//! - `convert`: a 10 000-counter tile batch to storage samples (names, labels, running
//!   totals), in tiles per second;
//! - `encode_crc`: prost encoding plus the CRC32 frame of a 10 000-sample record;
//! - `verify_decode`: the reader's side, checksum then zero-copy decode.
//!
//! `cargo bench -p tessera-ingester --bench record`

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod support;

use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use support::request_counters;
use tessera_ingester::Converter;
use tessera_ingester::record::{self, HEADER_BYTES};

const TILES: usize = 10_000;

fn bench_record(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("record");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(TILES as u64));

    let mut converter = Converter::new(&[0.5, 0.9, 0.99], 3_600_000);
    let mut tile_end_ms = 1_700_000_000_000;
    let mut input = request_counters(TILES, tile_end_ms);
    group.bench_function("convert/10k_counters", |bencher| {
        bencher.iter(|| {
            tile_end_ms += 10_000;
            input.tile_end_ms = tile_end_ms;
            let conversion = converter.convert(&input, tile_end_ms).unwrap();
            converter.commit();
            conversion.record.samples.len()
        })
    });

    let conversion = converter.convert(&request_counters(TILES, tile_end_ms + 10_000), 0).unwrap();
    let framed = record::encode(&conversion.record);
    group.bench_function("encode_crc/10k_samples", |bencher| bencher.iter(|| record::encode(&conversion.record).len()));

    let payload = Bytes::copy_from_slice(&framed[HEADER_BYTES..]);
    let (_, crc) = record::parse_header(framed[..HEADER_BYTES].try_into().unwrap());
    group.bench_function("verify_decode/10k_samples", |bencher| {
        bencher.iter(|| {
            record::verify(&payload, crc).unwrap();
            record::decode_payload(payload.clone()).unwrap().samples.len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_record);
criterion_main!(benches);
