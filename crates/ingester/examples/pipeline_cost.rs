//! The ingester's own CPU per tile, without storage or sockets: the burst benchmark's
//! tiles go through the intake writer (frame decode, conversion, record encoding, queue
//! append) and then the draining side (queue read and checksum, record decode, split by
//! worker shard, remote-write body with snappy), in one thread.
//!
//! ```sh
//! cargo build --release -p tessera-ingester --examples
//! valgrind --tool=callgrind target/release/examples/pipeline_cost --series 100000 --bursts 2
//! callgrind_annotate --inclusive=yes callgrind.out.<pid> | grep -E 'Writer::handle|drain_all'
//! ```
//!
//! The queue is not fsynced (that costs wall time, not CPU). Building the tiles before
//! the first burst is part of the process's total, so compare the inclusive counts of
//! `Writer::handle` (intake) and `drain_all` (draining) rather than the total.

use std::time::Instant;

use clap::Parser;
use prost::Message;
use tessera_core::aggregate::Aggregate;
use tessera_ingester::record;
use tessera_ingester::{
    Converter, FsyncPolicy, Metrics, Position, Queue, QueueOptions, QueueReader, RecentBatches, RecordInfo,
    RemoteWriteSink, RequestKey, Routes, SinkRequest, Writer, open_queue, split,
};
use tessera_proto::{AckStatus, Frame, MetricType, SeriesValue, TileBatch, frame::Body};
use tessera_wire::Answer;

/// The ingester's CPU per tile, storage left out.
#[derive(Debug, Parser)]
struct Flags {
    /// Series (counters) per burst.
    #[arg(long, default_value_t = 100_000)]
    series: usize,
    /// Bursts.
    #[arg(long, default_value_t = 2)]
    bursts: usize,
    /// Tiles per batch.
    #[arg(long, default_value_t = 25_000)]
    batch_tiles: usize,
    /// Workers (shards of the split).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Samples per remote-write request.
    #[arg(long, default_value_t = 2000)]
    max_samples_per_request: usize,
}

/// Reads every queued record and builds every remote-write body; returns the bytes built.
#[inline(never)]
fn drain_all(reader: &mut QueueReader, queue: &Queue, flags: &Flags) -> usize {
    let mut bytes = 0;
    while queue.pending_records() > 0 {
        let read = reader.next_record().expect("read the queue").expect("a record");
        let record = record::decode_payload(read.payload).expect("a record decodes");
        let (info, samples) = RecordInfo::split(record, read.position);
        for (shard, chunk, samples) in split(samples, flags.workers, flags.max_samples_per_request) {
            let key = RequestKey { shard: shard as u32, chunk, fingerprint: 0 };
            let request = SinkRequest { record: info.clone(), samples, key };
            bytes += RemoteWriteSink::body(&request).expect("a body").len();
        }
        queue.complete(Position { ..read.position });
    }
    bytes
}

fn main() {
    let flags = Flags::parse();
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = QueueOptions::new(dir.path().to_owned(), 1 << 40, 64 << 20, FsyncPolicy::Never);
    let (queue, queue_writer, mut reader, _) = open_queue(options, Default::default()).expect("open the queue");
    let mut routes = Routes::default();
    routes.add(&["10s".to_owned()], 0);
    let mut writer = Writer {
        converters: vec![Converter::new(&[0.5, 0.9, 0.99], 3_600_000)],
        queues: vec![queue_writer],
        routes,
        recent: RecentBatches::new(1024),
        metrics: Metrics::default().writer,
        checkpoints: None,
        fence: Default::default(),
        ownership: None,
    };
    let tiles: Vec<SeriesValue> = (0..flags.series)
        .map(|n| SeriesValue {
            r#ref: 0,
            series_id: format!("bench.requests|#host:host-{:04},series:{n}", n % 1000).into_bytes(),
            r#type: MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        })
        .collect();
    let mut sequence = 0;
    let (mut intake_secs, mut drain_secs, mut body_bytes) = (0.0, 0.0, 0);
    for burst in 0..flags.bursts {
        let tile_end_ms = 1_700_000_000_000 + burst as i64 * 10_000;
        let bodies: Vec<Vec<u8>> = tiles
            .chunks(flags.batch_tiles)
            .map(|chunk| {
                sequence += 1;
                let batch = TileBatch {
                    placement_version: 0,
                    completes_version: 0,
                    owner_refused: false,
                    source: "bench".into(),
                    sequence,
                    storage_policy: "10s:2d".into(),
                    resolution_ms: 10_000,
                    tile_end_ms,
                    tiles: chunk.to_vec(),
                    flushed_at_ms: tile_end_ms,
                    incomplete: false,
                };
                Frame { body: Some(Body::Tiles(batch)) }.encode_to_vec()
            })
            .collect();
        let start = Instant::now();
        for body in &bodies {
            match writer.handle(body) {
                Answer::Ack(ack) if ack.status == AckStatus::Ok as i32 => {}
                other => panic!("batch not queued: {other:?}"),
            }
        }
        intake_secs += start.elapsed().as_secs_f64();
        let start = Instant::now();
        body_bytes += drain_all(&mut reader, &queue, &flags);
        drain_secs += start.elapsed().as_secs_f64();
    }
    let tiles = (flags.series * flags.bursts) as f64;
    println!(
        "{} tiles: intake {:.2} µs/tile, drain {:.2} µs/tile ({} compressed body bytes)",
        tiles,
        intake_secs * 1e6 / tiles,
        drain_secs * 1e6 / tiles,
        body_bytes
    );
}
