//! Quantile sketch and HyperLogLog: insert and merge rates.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_core::hll::HyperLogLog;
use tessera_core::sketch::Sketch;

fn latencies(n: usize) -> Vec<f64> {
    // Deterministic, spread over four decades like request latencies.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            10f64.powf((state >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 1.0)
        })
        .collect()
}

/// Benchmarks `merge` of every one of `partials` into an `empty()` one, in partials per second.
fn bench_merge<T>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    partials: &[T],
    empty: impl Fn() -> T,
    merge: impl Fn(&mut T, &T),
) {
    group.throughput(Throughput::Elements(partials.len() as u64));
    group.bench_function("merge", |b| {
        b.iter(|| {
            let mut total = empty();
            for partial in partials {
                merge(&mut total, black_box(partial));
            }
            total
        })
    });
}

fn bench_sketch(c: &mut Criterion) {
    let values = latencies(100_000);
    let mut group = c.benchmark_group("sketch");
    group.throughput(Throughput::Elements(values.len() as u64));
    group.bench_function("insert", |b| {
        let mut sketch = Sketch::new();
        b.iter(|| {
            for value in &values {
                sketch.insert(black_box(*value), 1.0);
            }
        })
    });
    let partials: Vec<Sketch> = values
        .chunks(1000)
        .map(|chunk| {
            let mut sketch = Sketch::new();
            chunk.iter().for_each(|value| sketch.insert(*value, 1.0));
            sketch
        })
        .collect();
    bench_merge(&mut group, &partials, Sketch::new, Sketch::merge);
    group.finish();

    let members: Vec<Vec<u8>> = (0..100_000).map(|i| format!("user-{i}").into_bytes()).collect();
    let mut group = c.benchmark_group("hll");
    group.throughput(Throughput::Elements(members.len() as u64));
    group.bench_function("insert", |b| {
        let mut set = HyperLogLog::new();
        b.iter(|| {
            for member in &members {
                set.insert(black_box(member));
            }
        })
    });
    let partials: Vec<HyperLogLog> = members
        .chunks(2000)
        .map(|chunk| {
            let mut set = HyperLogLog::new();
            chunk.iter().for_each(|member| set.insert(member));
            set
        })
        .collect();
    bench_merge(&mut group, &partials, HyperLogLog::new, HyperLogLog::merge);
    group.finish();
}

criterion_group!(benches, bench_sketch);
criterion_main!(benches);
