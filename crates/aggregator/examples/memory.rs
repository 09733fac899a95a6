//! Memory per active series, per metric type, measured with RSS.
//!
//! ```text
//! cargo run --release -p tessera-aggregator --example memory [-- SERIES]
//! ```
//!
//! For each type, a child process (for a clean RSS) merges `SERIES`
//! (default 1 000 000) distinct series into one open tile of one policy,
//! in batches of 10 000 partials dropped after each merge, and reports the
//! growth of its resident set (`/proc/self/statm`) divided by the series
//! count: the cost of one series in one table. Ids are about 70 bytes
//! (`http.server.requests|#endpoint:...,host:...,series:N`).
//!
//! The figure covers the series' registry entry (its id, once per merge
//! thread) and its slot in one table. Every further open table (the
//! default policies and buffers keep 2 per policy, 4 in all) adds one
//! 16-byte slot per series, plus the aggregate's own allocation for gauges,
//! timers and sets (one remembered value per policy for gauges).

use std::process::Command;

use tessera_aggregator::{Partial, Tiler, TilerSettings, Via, WindowPartials};
use tessera_core::aggregate::{Aggregate, Distribution, Gauge};
use tessera_core::hll::HyperLogLog;
use tessera_core::parse::MetricKind;

const NOW: i64 = 1_700_000_045_000;
const WINDOW: i64 = 1_700_000_044_000;
const BATCH: usize = 10_000;
const KINDS: [&str; 4] = ["counter", "gauge", "timer", "set"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let kind = args.get(2).cloned().unwrap_or_default();
        let series = args.get(3).and_then(|text| text.parse().ok()).unwrap_or(1_000_000);
        measure(&kind, series);
        return;
    }
    let series: usize = args.get(1).and_then(|text| text.parse().ok()).unwrap_or(1_000_000);
    let program = std::env::current_exe().expect("the example knows its own path");
    println!("series: {series}; one table (one open tile of one policy)");
    for kind in KINDS {
        let output = Command::new(&program)
            .args(["--child", kind, &series.to_string()])
            .output()
            .expect("the example can run itself");
        print!("{}", String::from_utf8_lossy(&output.stdout));
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
    }
}

fn partial(kind: &str, n: usize) -> Partial {
    let id = format!("http.server.requests|#endpoint:/api/v1/item{},host:host-{:04},series:{n}", n % 50, n % 1000)
        .into_bytes();
    match kind {
        "counter" => Partial { via: Via::Id, kind: MetricKind::Counter, id, aggregate: Aggregate::Counter(1.0) },
        "gauge" => Partial {
            via: Via::Id,
            kind: MetricKind::Gauge,
            id,
            aggregate: Aggregate::Gauge(Box::new(Gauge::with_value(n as f64, WINDOW * 1_000_000))),
        },
        "timer" => {
            // 20 samples from 1 to 96 ms: about 200 sketch buckets wide.
            let mut timer = Distribution::default();
            for sample in 0..20 {
                timer.insert((1 + (n + sample * 5) % 96) as f64, 1.0);
            }
            Partial { via: Via::Id, kind: MetricKind::Timer, id, aggregate: Aggregate::Distribution(Box::new(timer)) }
        }
        _ => {
            let mut set = HyperLogLog::new();
            for member in 0..3 {
                set.insert(format!("user{}", n + member).as_bytes());
            }
            Partial { via: Via::Id, kind: MetricKind::Set, id, aggregate: Aggregate::Set(Box::new(set)) }
        }
    }
}

fn measure(kind: &str, series: usize) {
    let settings = TilerSettings::new(vec!["10s:2d".parse().expect("a valid policy")]);
    let mut tiler = Tiler::new(settings, NOW);
    // Warm the allocator with one batch, so the input's own memory is in the baseline.
    let warm = WindowPartials {
        connection: 0,
        window_start_ms: WINDOW,
        window_ms: 1000,
        partials: (0..BATCH).map(|n| partial(kind, n)).collect(),
    };
    drop(warm);
    let before = resident_bytes();
    let mut start = 0;
    while start < series {
        let end = (start + BATCH).min(series);
        let batch = WindowPartials {
            connection: 0,
            window_start_ms: WINDOW,
            window_ms: 1000,
            partials: (start..end).map(|n| partial(kind, n)).collect(),
        };
        tiler.accept(&batch, NOW, &mut |_| {}).expect("the window is open");
        start = end;
    }
    let after = resident_bytes();
    assert_eq!(tiler.series_held(0), series);
    let per_series = (after.saturating_sub(before)) as f64 / series as f64;
    println!("{kind:>8}: {per_series:7.0} bytes per series per table (RSS +{} MiB)", (after - before) >> 20);
}

/// Resident set size, from `/proc/self/statm` (pages of 4 KiB).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|field| field.parse().ok()).unwrap_or(0);
    pages * 4096
}
