//! Parser throughput: lines/s and bytes/s on realistic datagrams.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_benches::{counter_datagrams, mixed_datagrams};
use tessera_core::parse::{Parsed, parse_datagram};

fn parse_all(datagrams: &[Vec<u8>]) -> usize {
    let mut metrics = 0;
    for datagram in datagrams {
        parse_datagram(datagram, |parsed| {
            if let Parsed::Metric(line) = parsed {
                metrics += black_box(line.first.value) as usize & 1;
            }
        });
    }
    metrics
}

fn bench_parse(c: &mut Criterion) {
    let inputs = [
        ("simple_counters", counter_datagrams(10_000, 1400, false)),
        ("tagged_counters", counter_datagrams(10_000, 1400, true)),
        ("dogstatsd_mix", mixed_datagrams(10_000)),
    ];
    for (name, (datagrams, lines)) in &inputs {
        let bytes: usize = datagrams.iter().map(Vec::len).sum();
        let mut group = c.benchmark_group(format!("parse/{name}"));
        group.throughput(Throughput::Elements(*lines as u64));
        group.bench_function("lines", |b| b.iter(|| parse_all(black_box(datagrams))));
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function("bytes", |b| b.iter(|| parse_all(black_box(datagrams))));
        group.finish();
    }
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
