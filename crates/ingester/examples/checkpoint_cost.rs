//! What a checkpoint of the running totals costs: the encoding, which the intake writer
//! thread does in steps between batches (acknowledgements wait at most a step), the durable
//! file write (temporary file, fsync, rename, directory fsync), done on its own thread, and
//! the restore at start.
//!
//! ```sh
//! cargo run --release -p tessera-ingester --example checkpoint_cost -- --counters 100000 --timers 0
//! cargo run --release -p tessera-ingester --example checkpoint_cost -- --counters 0 --timers 100000
//! ```
//!
//! `--dir` picks the file system the file goes to (the default is the system's temporary
//! directory, which may be a tmpfs: then the fsyncs cost nothing).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use tessera_core::aggregate::{Aggregate, Distribution};
use tessera_ingester::{CheckpointMeta, Converter, HistogramMode, Position, write_atomically};
use tessera_proto::{MetricType, SeriesValue, TileBatch};

/// The cost of one checkpoint.
#[derive(Debug, Parser)]
struct Flags {
    /// Counter series (one running total each).
    #[arg(long, default_value_t = 100_000)]
    counters: usize,
    /// Timer series written as native histograms (a running total and a sketch each).
    #[arg(long, default_value_t = 0)]
    timers: usize,
    /// Distinct values per timer tile (buckets of its sketch).
    #[arg(long, default_value_t = 20)]
    values_per_timer: usize,
    /// Checkpoints to take (the median is printed).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Where to write the file (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn tile(id: String, metric_type: MetricType, aggregate: Aggregate) -> SeriesValue {
    SeriesValue {
        r#ref: 0,
        series_id: id.into_bytes(),
        r#type: metric_type as i32,
        aggregate: Some(aggregate.to_proto()),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let flags = Flags::parse();
    let temporary = tempfile::tempdir().expect("temporary directory");
    let dir = flags.dir.clone().unwrap_or_else(|| temporary.path().to_owned());
    let mut converter = Converter::new(&[0.5, 0.9, 0.99], 3_600_000).with_histograms(HistogramMode::Native, 160);
    let mut tiles: Vec<SeriesValue> = (0..flags.counters)
        .map(|n| {
            tile(
                format!("app.requests|#host:host-{:04},series:{n}", n % 1000),
                MetricType::Counter,
                Aggregate::Counter(1.0),
            )
        })
        .collect();
    tiles.extend((0..flags.timers).map(|n| {
        let mut distribution = Distribution::default();
        for k in 0..flags.values_per_timer {
            distribution.insert(1.0 + (n % 7) as f64 * 1.1f64.powi(k as i32 * 3), 1.0);
        }
        let id = format!("app.latency|#host:host-{:04},series:{n}", n % 1000);
        tile(id, MetricType::Timer, Aggregate::Distribution(Box::new(distribution)))
    }));
    for (sequence, chunk) in tiles.chunks(25_000).enumerate() {
        let batch = TileBatch {
            placement_version: 0,
            completes_version: 0,
            owner_refused: false,
            source: "bench".into(),
            sequence: sequence as u64,
            storage_policy: "10s:2d".into(),
            resolution_ms: 10_000,
            tile_end_ms: 1_700_000_000_000,
            tiles: chunk.to_vec(),
            flushed_at_ms: 0,
            incomplete: false,
        };
        converter.convert(&batch, 0).expect("a valid batch");
        converter.commit();
    }

    // As the writer thread does it: 256 series between two looks at the clock, steps of 1 ms.
    let meta = CheckpointMeta { taken_at_ms: 0, covers: Position { segment: 1, offset: 8 } };
    let start = Instant::now();
    let mut encoder = converter.begin_checkpoint(meta);
    let begin = start.elapsed().as_secs_f64();
    let mut steps = Vec::new();
    let mut done = false;
    while !done {
        let step = Instant::now();
        loop {
            done = converter.continue_checkpoint(&mut encoder, 256);
            if done || step.elapsed() >= Duration::from_millis(1) {
                break;
            }
        }
        steps.push(step.elapsed().as_secs_f64());
    }
    let (count, longest) = (steps.len(), steps.iter().copied().fold(0.0, f64::max));
    let start = Instant::now();
    drop(converter.finish_checkpoint(encoder));
    let finish = start.elapsed().as_secs_f64();
    println!(
        "in steps: begin {:.2} ms, {count} steps (median {:.2} ms, longest {:.2} ms), finish {:.2} ms",
        begin * 1e3,
        median(steps) * 1e3,
        longest * 1e3,
        finish * 1e3
    );

    let (mut encode, mut write, mut restore) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = Vec::new();
    for round in 0..flags.rounds {
        let start = Instant::now();
        let meta = CheckpointMeta { taken_at_ms: round as i64, covers: Position { segment: 1, offset: 8 } };
        let mut checkpoint = converter.encode_checkpoint(meta);
        encode.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        write_atomically(&dir, &checkpoint.parts()).expect("write the checkpoint");
        write.push(start.elapsed().as_secs_f64());
        bytes = checkpoint.into_bytes();
        let start = Instant::now();
        let mut restored = Converter::new(&[0.5, 0.9, 0.99], 3_600_000);
        restored.restore_checkpoint(&bytes).expect("restore the checkpoint");
        restore.push(start.elapsed().as_secs_f64());
        assert_eq!(restored.cumulative_series(), converter.cumulative_series());
    }
    println!(
        "{} running totals ({} native histograms), {:.1} MB: all at once, encode {:.1} ms; write+fsync {:.1} ms (file thread); restore {:.1} ms; median of {}",
        converter.cumulative_series(),
        converter.cumulative_histograms(),
        bytes.len() as f64 / 1e6,
        median(encode) * 1e3,
        median(write) * 1e3,
        median(restore) * 1e3,
        flags.rounds,
    );
}
