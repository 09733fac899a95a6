//! Building remote-write requests: splitting a record into per-worker requests, the
//! protobuf `WriteRequest` from pre-encoded labels, and snappy block compression.
//!
//! `cargo bench -p tessera-ingester --bench remote_write`

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod support;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use support::request_counters;
use tessera_ingester::record::StoredSample;
use tessera_ingester::{Converter, prompb, split};

const SAMPLES: usize = 2_000;

fn samples(count: usize) -> Vec<StoredSample> {
    let batch = request_counters(count, 1_700_000_000_000);
    Converter::new(&[0.5], 3_600_000).convert(&batch, 0).unwrap().record.samples
}

fn bench_remote_write(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("remote_write");
    group.sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));

    let request = samples(SAMPLES);
    group.throughput(Throughput::Elements(SAMPLES as u64));
    let mut body = Vec::new();
    group.bench_function("encode/2k_samples", |bencher| {
        bencher.iter(|| {
            body.clear();
            prompb::encode_write_request(&mut body, &request, 1_700_000_000_000);
            body.len()
        })
    });
    group.bench_function("encode_snappy/2k_samples", |bencher| {
        bencher.iter(|| {
            body.clear();
            prompb::encode_write_request(&mut body, &request, 1_700_000_000_000);
            prompb::compress(&body).unwrap().len()
        })
    });

    let record = samples(20_000);
    group.throughput(Throughput::Elements(record.len() as u64));
    group.bench_function("split/20k_samples_8_workers", |bencher| {
        bencher.iter(|| split(record.clone(), 8, SAMPLES).len())
    });
    group.finish();
}

criterion_group!(benches, bench_remote_write);
criterion_main!(benches);
