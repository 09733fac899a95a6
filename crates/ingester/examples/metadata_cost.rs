//! What noting each family for remote write's metadata costs the intake writer: the same
//! counter batches converted by a converter that notes families and by one that does not,
//! alternating round by round in one thread so that both see the same machine. Two
//! workloads: every tile of one name (the common case: noting costs a compare per tile),
//! and every tile a name of its own (the worst: a family lookup per tile).
//!
//! ```sh
//! cargo run --release -p tessera-ingester --example metadata_cost -- --series 20000 --rounds 10
//! ```

use std::time::Instant;

use clap::Parser;
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tessera_ingester::{Converter, Families};
use tessera_proto::TileBatch;
use tessera_testkit::tiles::{batch, counter};

#[derive(Debug, Parser)]
struct Flags {
    /// Counter series per batch.
    #[arg(long, default_value_t = 20_000)]
    series: usize,
    /// Rounds per variant (10 s tiles).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

fn counters(series: usize, distinct_names: bool, tile_end_ms: i64) -> TileBatch {
    let tiles = (0..series)
        .map(|n| {
            let id = if distinct_names {
                format!("app.metric_{n}|#host:host-{:03}", n % 100)
            } else {
                format!("http.server.requests|#endpoint:/api/v1/item{},series:{n}", n % 50)
            };
            counter(&id, 1.0)
        })
        .collect();
    batch(tile_end_ms, tiles)
}

fn main() {
    let flags = Flags::parse();
    for distinct_names in [false, true] {
        let families = Families::new(1_000_000, Gauge::default(), Counter::default());
        let mut plain = Converter::new(&[0.5], 3_600_000);
        let mut noting = Converter::new(&[0.5], 3_600_000).with_families(families.clone(), "seconds");
        let mut best = [f64::INFINITY; 2];
        for round in 0..=flags.rounds {
            let tile_end_ms = 1_700_000_000_000 + round as i64 * 10_000;
            let input = counters(flags.series, distinct_names, tile_end_ms);
            // Round 0 warms both up (the first noting of every family is in it).
            for (index, converter) in [&mut plain, &mut noting].into_iter().enumerate() {
                let started = Instant::now();
                let conversion = converter.convert(&input, tile_end_ms).unwrap();
                converter.commit();
                let ns_per_tile = started.elapsed().as_nanos() as f64 / flags.series as f64;
                assert_eq!(conversion.record.samples.len(), flags.series);
                if round > 0 {
                    best[index] = best[index].min(ns_per_tile);
                }
            }
        }
        println!(
            "{}: {} families; convert without noting {:.1} ns/tile, noting {:.1} ns/tile ({:+.1} %), best of {} rounds",
            if distinct_names { "a name per tile" } else { "one name" },
            families.snapshot().len(),
            best[0],
            best[1],
            (best[1] / best[0] - 1.0) * 100.0,
            flags.rounds
        );
    }
}
