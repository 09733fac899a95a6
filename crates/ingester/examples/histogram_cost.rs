//! What writing timers as native histograms costs the ingester, beside summaries: the same
//! batches of timer tiles converted (the intake writer's work per tile) and encoded as a
//! remote-write body with snappy (the draining side), in one thread, the modes alternating
//! round by round so that both see the same machine.
//!
//! ```sh
//! cargo run --release -p tessera-ingester --example histogram_cost -- --series 20000 --rounds 6
//! ```
//!
//! Each tile holds `--values` observations of a log-normal-like spread over two decades (a
//! latency), and a series is converted again at every round, so the native histograms are
//! cumulative over the rounds, as in a running ingester.

use std::time::Instant;

use clap::Parser;
use tessera_core::aggregate::{Aggregate, Distribution};
use tessera_ingester::prompb;
use tessera_ingester::{Converter, HistogramMode};
use tessera_proto::{MetricType, SeriesValue, TileBatch};

#[derive(Debug, Parser)]
struct Flags {
    /// Timer series per batch.
    #[arg(long, default_value_t = 20_000)]
    series: usize,
    /// Observations per tile.
    #[arg(long, default_value_t = 50)]
    values: usize,
    /// Rounds per mode (10 s tiles).
    #[arg(long, default_value_t = 6)]
    rounds: usize,
}

fn batch(series: usize, values: usize, round: usize) -> TileBatch {
    let tiles = (0..series)
        .map(|n| {
            let mut distribution = Distribution::default();
            for k in 0..values {
                // A deterministic spread over 1..100 ms, different per series and round.
                let x = ((n * 7 + k * 13 + round * 3) % 97) as f64 / 97.0;
                distribution.insert(10f64.powf(2.0 * x), 1.0);
            }
            SeriesValue {
                r#ref: 0,
                series_id: format!("api.latency|#route:/r{n}").into_bytes(),
                r#type: MetricType::Timer as i32,
                aggregate: Some(Aggregate::Distribution(Box::new(distribution)).to_proto()),
            }
        })
        .collect();
    TileBatch {
        placement_version: 0,
        completes_version: 0,
        owner_refused: false,
        source: "bench".into(),
        sequence: round as u64,
        storage_policy: "10s:2d".into(),
        resolution_ms: 10_000,
        tile_end_ms: 1_700_000_000_000 + round as i64 * 10_000,
        tiles,
        flushed_at_ms: 0,
        incomplete: false,
    }
}

#[derive(Default)]
struct Totals {
    convert_ns: u128,
    encode_ns: u128,
    tiles: usize,
    samples: usize,
    body_bytes: usize,
    snappy_bytes: usize,
}

fn main() {
    let flags = Flags::parse();
    let modes = [("summary", HistogramMode::Summary), ("native", HistogramMode::Native)];
    let mut converters: Vec<Converter> = modes
        .iter()
        .map(|(_, mode)| Converter::new(&[0.5, 0.9, 0.99], 3_600_000).with_histograms(*mode, 160))
        .collect();
    let mut totals: Vec<Totals> = modes.iter().map(|_| Totals::default()).collect();
    for round in 0..flags.rounds {
        let batch = batch(flags.series, flags.values, round);
        for (index, converter) in converters.iter_mut().enumerate() {
            let started = Instant::now();
            let conversion = converter.convert(&batch, 0).expect("a valid batch");
            converter.commit();
            let converted = started.elapsed();
            let started = Instant::now();
            let mut body = Vec::new();
            prompb::encode_write_request(&mut body, &conversion.record.samples, batch.tile_end_ms);
            let compressed = prompb::compress(&body).expect("snappy");
            let encoded = started.elapsed();
            // The first round fills the tables; count the rest.
            if round > 0 {
                let total = &mut totals[index];
                total.convert_ns += converted.as_nanos();
                total.encode_ns += encoded.as_nanos();
                total.tiles += batch.tiles.len();
                total.samples += conversion.record.samples.len();
                total.body_bytes += body.len();
                total.snappy_bytes += compressed.len();
            }
        }
    }
    println!("{} series x {} observations a tile, {} rounds counted", flags.series, flags.values, flags.rounds - 1);
    println!("mode     convert ns/tile  encode ns/tile  samples/tile  body B/tile  snappy B/tile");
    for ((name, _), total) in modes.iter().zip(&totals) {
        let tiles = total.tiles.max(1) as f64;
        println!(
            "{name:<8} {:>15.0} {:>15.0} {:>13.1} {:>12.0} {:>14.0}",
            total.convert_ns as f64 / tiles,
            total.encode_ns as f64 / tiles,
            total.samples as f64 / tiles,
            total.body_bytes as f64 / tiles,
            total.snappy_bytes as f64 / tiles,
        );
    }
    let native = &converters[1];
    println!("native histograms in memory: {}", native.cumulative_histograms());
}
