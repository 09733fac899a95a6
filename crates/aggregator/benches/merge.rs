//! Merge rate of partials into tiles (the tiler thread's hot path), in
//! partials per second on one core, with the default policies
//! (`10s:2d`, `1m:40d`: every partial is merged into two tiles).
//!
//! `cargo bench -p tessera-aggregator --bench merge`
//!
//! Every series is in the tables before measuring (the steady state: known
//! series allocate nothing); batches of 10 000 partials go round the whole
//! series set, all in one open window, so no tile closes while measuring.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tessera_aggregator::{Partial, Tiler, TilerSettings, Via, WindowPartials};
use tessera_core::aggregate::{Aggregate, Distribution, Gauge};
use tessera_core::hll::HyperLogLog;
use tessera_core::parse::MetricKind;

const NOW: i64 = 1_700_000_045_000;
const WINDOW: i64 = 1_700_000_044_000;
const BATCH: usize = 10_000;

/// The policies these numbers were measured with since the start: 10 s and 1 min tiles.
const TWO_POLICIES: [&str; 2] = ["10s:2d", "1m:40d"];

fn id(n: usize) -> Vec<u8> {
    format!("http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}", n % 50, n % 1000).into_bytes()
}

fn counter(n: usize) -> Partial {
    Partial { via: Via::Id, kind: MetricKind::Counter, id: id(n), aggregate: Aggregate::Counter((n % 10) as f64) }
}

/// A mix: 70 % counters, 10 % gauges, 15 % timers (10 samples), 5 % sets (3 members).
fn mixed(n: usize) -> Partial {
    match n % 20 {
        0..=13 => counter(n),
        14 | 15 => Partial {
            via: Via::Id,
            kind: MetricKind::Gauge,
            id: id(n),
            aggregate: Aggregate::Gauge(Box::new(Gauge::with_value(n as f64, WINDOW * 1_000_000))),
        },
        16..=18 => {
            let mut timer = Distribution::default();
            for sample in 0..10 {
                timer.insert(((n + sample * 7) % 250 + 1) as f64, 1.0);
            }
            Partial {
                via: Via::Id,
                kind: MetricKind::Timer,
                id: id(n),
                aggregate: Aggregate::Distribution(Box::new(timer)),
            }
        }
        _ => {
            let mut set = HyperLogLog::new();
            for member in 0..3 {
                set.insert(format!("user{}", (n + member) % 977).as_bytes());
            }
            Partial { via: Via::Id, kind: MetricKind::Set, id: id(n), aggregate: Aggregate::Set(Box::new(set)) }
        }
    }
}

fn batches(series: usize, make: fn(usize) -> Partial) -> Vec<WindowPartials> {
    (0..series.div_ceil(BATCH))
        .map(|index| WindowPartials {
            connection: 0,
            window_start_ms: WINDOW,
            window_ms: 1000,
            partials: (index * BATCH..((index + 1) * BATCH).min(series)).map(make).collect(),
        })
        .collect()
}

fn tiler() -> Tiler {
    let policies = TWO_POLICIES.iter().map(|text| text.parse().unwrap()).collect();
    Tiler::new(TilerSettings::new(policies), NOW)
}

fn bench_merge(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("merge");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    for (name, series, make) in [
        ("counters/10k_series", 10_000, counter as fn(usize) -> Partial),
        ("counters/1M_series", 1_000_000, counter),
        ("mixed/10k_series", 10_000, mixed),
        ("mixed/1M_series", 1_000_000, mixed),
    ] {
        // Built on first use, so that a filtered-out benchmark costs nothing.
        let mut state: Option<(Tiler, Vec<WindowPartials>)> = None;
        let mut next = 0;
        group.throughput(Throughput::Elements(BATCH as u64));
        group.bench_function(name, |bencher| {
            let (tiler, batches) = state.get_or_insert_with(|| {
                let batches = batches(series, make);
                let mut tiler = tiler();
                for batch in &batches {
                    tiler.accept(batch, NOW, &mut |_| {}).unwrap();
                }
                assert_eq!(tiler.series_held(0), series);
                (tiler, batches)
            });
            bencher.iter_batched(
                || {
                    next = (next + 1) % batches.len();
                    next
                },
                |index| tiler.accept(&batches[index], NOW, &mut |_| {}).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench_merge);
criterion_main!(benches);
