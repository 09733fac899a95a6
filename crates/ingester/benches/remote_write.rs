//! Building remote-write requests: splitting a record into per-worker requests, the
//! protobuf `WriteRequest` from pre-encoded labels, and snappy block compression.
//!
//! `cargo bench -p tessera-ingester --bench remote_write`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_core::aggregate::Aggregate;
use tessera_ingester::mapping::Converter;
use tessera_ingester::pool::split;
use tessera_ingester::prompb;
use tessera_ingester::record::StoredSample;
use tessera_proto::{MetricType, SeriesValue, TileBatch};

const SAMPLES: usize = 2_000;

fn samples(count: usize) -> Vec<StoredSample> {
    let tiles = (0..count)
        .map(|n| SeriesValue {
            r#ref: 0,
            series_id: format!(
                "http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}",
                n % 50,
                n % 1000
            )
            .into_bytes(),
            r#type: MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        })
        .collect();
    let batch = TileBatch {
        storage_policy: "10s:2d".into(),
        resolution_ms: 10_000,
        tile_end_ms: 1_700_000_000_000,
        tiles,
        ..Default::default()
    };
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
