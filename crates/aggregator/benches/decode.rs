//! Decode rate of partial batch frames (the decoder thread's hot path):
//! protobuf decoding, the ownership check, shard hash and aggregate
//! validation, in partials per second on one core.
//!
//! `cargo bench -p tessera-aggregator --bench decode`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use prost::Message;
use tessera_aggregator::{Decoded, Decoder};
use tessera_core::aggregate::Aggregate;
use tessera_core::shard::shard_of;
use tessera_proto::{Frame, MetricType, PartialBatch, SeriesValue, ShardPartials, frame::Body};
use tessera_topology::{Placement, PlacementHandle};

const SERIES: usize = 10_000;
const NUM_SHARDS: u32 = 64;

fn frame() -> Vec<u8> {
    let mut shards: Vec<ShardPartials> =
        (0..NUM_SHARDS).map(|shard| ShardPartials { shard, series: Vec::new() }).collect();
    for n in 0..SERIES {
        let id = format!("http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}", n % 50, n % 1000);
        let shard = shard_of(id.as_bytes(), NUM_SHARDS);
        shards[shard as usize].series.push(SeriesValue {
            r#ref: 0,
            series_id: id.into_bytes(),
            r#type: MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        });
    }
    let batch = PartialBatch { window_start_ms: 1_700_000_044_000, window_ms: 1000, shards, ..Default::default() };
    Frame { body: Some(Body::Partials(batch)) }.encode_to_vec()
}

fn bench_decode(criterion: &mut Criterion) {
    let placement = Placement::init(&[("agg-1", "127.0.0.1:7400")], NUM_SHARDS, 1, 0).unwrap();
    let mut decoder = Decoder::new("agg-1".into(), PlacementHandle::fixed(placement), 1);
    let frame = frame();
    let mut group = criterion.benchmark_group("decode");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(SERIES as u64));
    group.bench_function("counters/10k_partials_per_frame", |bencher| {
        bencher.iter(|| match decoder.decode(1, &frame) {
            Decoded::Batch { batch, .. } => batch.partials() as usize,
            other => panic!("{other:?}"),
        })
    });
    group.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
