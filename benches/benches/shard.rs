//! Shard hash: murmur3_32 of canonical ids.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_core::shard::shard_of;

fn bench_shard(c: &mut Criterion) {
    let ids: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("http.requests.{i}|#env:prod,route:/api/v1/users,status:200").into_bytes())
        .collect();
    let bytes: usize = ids.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group("shard");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("ids", |b| b.iter(|| ids.iter().map(|id| shard_of(black_box(id), 4096)).sum::<u32>()));
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("bytes", |b| b.iter(|| ids.iter().map(|id| shard_of(black_box(id), 4096)).sum::<u32>()));
    group.finish();
}

criterion_group!(benches, bench_shard);
criterion_main!(benches);
