//! Parser throughput: lines/s and bytes/s on realistic datagrams.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_benches::{TagStyle, counter_datagrams, mixed_datagrams, tag_style_datagrams};
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

/// The same 10 000 series with their tags written each way: DogStatsD's tag
/// field, or in the name (InfluxDB, Librato, SignalFx), against untagged lines.
fn bench_tag_styles(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse/tag_style");
    for style in TagStyle::ALL {
        let (datagrams, lines) = tag_style_datagrams(style, 10_000);
        group.throughput(Throughput::Elements(lines as u64));
        group.bench_function(style.as_str(), |b| b.iter(|| parse_all(black_box(&datagrams))));
    }
    group.finish();
}

criterion_group!(benches, bench_parse, bench_tag_styles);
criterion_main!(benches);
