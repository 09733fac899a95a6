//! Quantile sketch and HyperLogLog: insert and merge rates.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
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

/// Benchmarks, in group `name`, `insert` of every one of `items` into one value, then
/// `merge` of partials made of `chunk` items each into an empty one; both in elements per
/// second.
fn bench_insert_and_merge<T, I>(
    c: &mut Criterion,
    name: &str,
    items: &[I],
    chunk: usize,
    empty: impl Fn() -> T,
    insert: impl Fn(&mut T, &I),
    merge: impl Fn(&mut T, &T),
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(items.len() as u64));
    group.bench_function("insert", |b| {
        let mut value = empty();
        b.iter(|| {
            for item in items {
                insert(&mut value, black_box(item));
            }
        })
    });
    let partials: Vec<T> = items
        .chunks(chunk)
        .map(|chunk| {
            let mut partial = empty();
            chunk.iter().for_each(|item| insert(&mut partial, item));
            partial
        })
        .collect();
    group.throughput(Throughput::Elements(partials.len() as u64));
    group.bench_function("merge", |b| {
        b.iter(|| {
            let mut total = empty();
            for partial in &partials {
                merge(&mut total, black_box(partial));
            }
            total
        })
    });
    group.finish();
}

fn bench_sketch(c: &mut Criterion) {
    let values = latencies(100_000);
    let insert_value = |sketch: &mut Sketch, value: &f64| sketch.insert(*value, 1.0);
    bench_insert_and_merge(c, "sketch", &values, 1000, Sketch::new, insert_value, Sketch::merge);

    let members: Vec<Vec<u8>> = (0..100_000).map(|i| format!("user-{i}").into_bytes()).collect();
    let insert_member = |set: &mut HyperLogLog, member: &Vec<u8>| set.insert(member);
    bench_insert_and_merge(c, "hll", &members, 2000, HyperLogLog::new, insert_member, HyperLogLog::merge);
}

criterion_group!(benches, bench_sketch);
criterion_main!(benches);
