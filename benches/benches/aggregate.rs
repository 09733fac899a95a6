//! Parse + aggregate: lines/s folded into a series table of 10 000 and
//! 1 000 000 known series.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_benches::{TagStyle, counter_datagrams, mixed_datagrams, tag_style_datagrams};
use tessera_core::parse::ParseOptions;
use tessera_core::table::{Table, TableOptions};

fn fold_all(table: &mut Table, datagrams: &[Vec<u8>]) {
    // What a collector reader does with a datagram.
    for datagram in datagrams {
        table.fold_datagram(datagram, ParseOptions::default(), 0, |folded| {
            black_box(folded);
        });
    }
}

fn bench_aggregate(c: &mut Criterion) {
    for (name, series, tagged) in
        [("counters_10k", 10_000, false), ("tagged_counters_10k", 10_000, true), ("counters_1m", 1_000_000, false)]
    {
        let (datagrams, lines) = counter_datagrams(series, 1400, tagged);
        let mut table = Table::new(TableOptions::default());
        fold_all(&mut table, &datagrams);
        let mut group = c.benchmark_group(format!("parse_aggregate/{name}"));
        if series >= 1_000_000 {
            group.sample_size(10);
        }
        group.throughput(Throughput::Elements(lines as u64));
        group.bench_function("lines", |b| b.iter(|| fold_all(&mut table, black_box(&datagrams))));
        group.finish();
    }
    let (datagrams, lines) = mixed_datagrams(60_000);
    let mut table = Table::new(TableOptions::default());
    fold_all(&mut table, &datagrams);
    let mut group = c.benchmark_group("parse_aggregate/dogstatsd_mix");
    group.throughput(Throughput::Elements(lines as u64));
    group.bench_function("lines", |b| b.iter(|| fold_all(&mut table, black_box(&datagrams))));
    group.finish();

    // The same 10 000 series with their tags written each way (see the parse bench).
    let mut group = c.benchmark_group("parse_aggregate/tag_style");
    for style in TagStyle::ALL {
        let (datagrams, lines) = tag_style_datagrams(style, 10_000);
        let mut table = Table::new(TableOptions::default());
        fold_all(&mut table, &datagrams);
        group.throughput(Throughput::Elements(lines as u64));
        group.bench_function(style.as_str(), |b| b.iter(|| fold_all(&mut table, black_box(&datagrams))));
    }
    group.finish();
}

criterion_group!(benches, bench_aggregate);
criterion_main!(benches);
