//! Runs one hot path over fixed input, for instruction counting with
//! `valgrind --tool=callgrind` (repeatable on a noisy machine, unlike
//! wall-clock benchmarks):
//!
//! ```sh
//! cargo build --release -p tessera-benches --example hot_paths
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/hot_paths parse
//! ```
//!
//! Divide the instruction total by the lines printed. Run natively, it also
//! prints lines per second of CPU time (user + system of this process), a
//! rate that holds on a machine whose cores are shared with other work.
use std::hint::black_box;

use tessera_benches::{TagStyle, counter_datagrams, mixed_datagrams, shuffled_counter_datagrams, tag_style_datagrams};
use tessera_core::parse::{ParseOptions, Parsed, parse_datagram};
use tessera_core::table::{Folded, Table, TableOptions};

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "parse".to_owned());
    let (datagrams, lines) = match which.as_str() {
        "parse" | "aggregate" => counter_datagrams(10_000, 1400, false),
        "parse-tagged" | "aggregate-tagged" => counter_datagrams(10_000, 1400, true),
        "parse-mix" | "aggregate-mix" => mixed_datagrams(10_000),
        "aggregate-1m" => counter_datagrams(1_000_000, 1400, false),
        "aggregate-1m-random" => shuffled_counter_datagrams(1_000_000, 1400, 7),
        "aggregate-10k-random" => shuffled_counter_datagrams(10_000, 1400, 7),
        other => {
            // `parse-style-<style>`, `aggregate-style-<style>`: one tag style (plain,
            // dogstatsd, influxdb, librato, signalfx), the same 10 000 series in each.
            let style = other
                .split_once("-style-")
                .and_then(|(_, style)| TagStyle::ALL.into_iter().find(|candidate| candidate.as_str() == style));
            match style {
                Some(style) => tag_style_datagrams(style, 10_000),
                None => panic!(
                    "unknown hot path {other}: parse[-tagged|-mix|-style-<style>], aggregate[-tagged|-mix|-style-<style>]"
                ),
            }
        }
    };
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
    let mut table = Table::new(TableOptions::default());
    let aggregate = which.starts_with("aggregate");
    let mut seen = 0usize;
    if aggregate {
        // Every series known first: the rounds measure lookups, not insertions.
        for datagram in &datagrams {
            table.fold_datagram(datagram, ParseOptions::default(), 0, |_| {});
        }
    }
    let cpu_start = cpu_seconds();
    for _ in 0..rounds {
        for datagram in &datagrams {
            if aggregate {
                // What a collector reader does with a datagram.
                table.fold_datagram(datagram, ParseOptions::default(), 0, |folded| {
                    seen += usize::from(black_box(folded) == Folded::Metric);
                });
                continue;
            }
            parse_datagram(datagram, |parsed| {
                if let Parsed::Metric(line) = parsed {
                    seen += black_box(line.first.value) as usize & 1;
                }
            });
        }
    }
    let cpu = cpu_seconds() - cpu_start;
    let total = lines * rounds;
    println!(
        "{which}: {total} lines ({seen}) in {cpu:.2} s of CPU: {:.2} M lines per CPU-second",
        total as f64 / cpu / 1e6
    );
}

/// User + system CPU seconds of this process, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}
