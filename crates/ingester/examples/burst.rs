//! Burst benchmark: N series flushed every 10 s, as an aggregator tier does, into the real
//! `tessera-ingester` binary writing to a real Prometheus.
//!
//! ```sh
//! cargo build --release -p tessera-ingester --bins --examples
//! target/release/examples/burst --series 1000000 --bursts 4
//! ```
//!
//! It starts Debian's `prometheus` (remote-write receiver on) and the release
//! `tessera-ingester` next to this example (or `$TESSERA_INGESTER_BIN`), measures
//! request latency while idle, then sends one burst per 10 s tile (the tile's counters,
//! split into batches of `--batch-tiles` like the aggregator's 16 MiB frames, sent 1 s
//! after the tile end) and prints per burst:
//!
//! - time to durable: first frame sent → last batch acknowledged (acks mean fsynced);
//! - drain time: first frame sent → the queue is empty (every sample acknowledged by
//!   Prometheus), and the tile's end-to-end latency bound (queue empty − tile end);
//! - storage request latency p50/p99 during the burst, against idle;
//! - the adaptive in-flight limit and pace reached, the ingester's peak RSS;
//! - end-to-end latency p50/p99 over every tile (from the ingester's histogram).

use tessera_testkit::graphite::Carbon;
use tessera_testkit::influx::Influx;
use tessera_testkit::prometheus;
#[path = "../tests/support/wire.rs"]
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use prometheus::{Prometheus, free_port, http_get};
use tessera_core::aggregate::Aggregate;
use tessera_core::clock::now_ms;
use tessera_proto::framing::{DEFAULT_MAX_FRAME_BYTES, encode_frame};
use tessera_proto::{AckStatus, Frame, MetricType, SeriesValue, frame::Body};
use wire::Sender;

/// Burst benchmark of tessera-ingester into a real Prometheus.
#[derive(Debug, Parser)]
struct Flags {
    /// Series (counters) per burst.
    #[arg(long, default_value_t = 1_000_000)]
    series: usize,
    /// Bursts, one per 10 s tile.
    #[arg(long, default_value_t = 4)]
    bursts: usize,
    /// Tiles per batch (the aggregator splits a tile into 16 MiB frames: ~250k counters).
    #[arg(long, default_value_t = 250_000)]
    batch_tiles: usize,
    /// Samples per remote-write request.
    #[arg(long, default_value_t = 2000)]
    max_samples_per_request: usize,
    /// Workers (and the highest in-flight limit).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Where samples go: `prometheus` (remote write), `file` (the OpenMetrics sink, to
    /// see the ingester's own capacity when storage is not the bottleneck), `graphite` (a
    /// real carbon-cache, brubeck's names), `graphite-null` (a receiver that drops the
    /// lines: the Graphite target's own cost) or `influxdb` (a real InfluxDB 1.x).
    #[arg(long, default_value = "prometheus")]
    sink: String,
    /// Extra `[pacing]` keys, e.g. `min_in_flight = 4` (repeatable); default: the
    /// ingester's defaults.
    #[arg(long)]
    pacing: Vec<String>,
    /// Extra `[sink]` keys, e.g. `resend_window_secs = 0` (repeatable).
    #[arg(long)]
    sink_option: Vec<String>,
}

struct Process {
    child: Child,
    telemetry: SocketAddr,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    fn metrics(&self) -> String {
        http_get(self.telemetry, "/metrics").map(|(_, text)| text).unwrap_or_default()
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after the state.
    (ticks(11) + ticks(12)) / 100.0
}

fn metric(text: &str, name: &str, labels: &str) -> f64 {
    wire::metric_value(text, name, labels)
}

/// Cumulative `(le, count)` buckets of the histogram series of `name` holding `label`.
fn buckets(text: &str, name: &str, label: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter(|line| line.starts_with(&prefix) && line.contains(label))
        .filter_map(|line| {
            let (_, after_le) = line.split_once("le=\"")?;
            let (le, _) = after_le.split_once('"')?;
            let (_, count) = line.rsplit_once(' ')?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// `histogram_quantile` over the difference of two bucket snapshots (linear within a bucket).
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, count)| (*le, count - before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, c)| *c)))
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in diff {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let within = if width > 0.0 { (rank - lower.1) / width } else { 1.0 };
            return Some(lower.0 + (le - lower.0) * within);
        }
        lower = (le, count);
    }
    None
}

fn tiles(series: usize) -> Vec<SeriesValue> {
    (0..series)
        .map(|n| SeriesValue {
            r#ref: 0,
            series_id: format!("bench.requests|#host:host-{:04},series:{n}", n % 1000).into_bytes(),
            r#type: MetricType::Counter as i32,
            aggregate: Some(Aggregate::Counter(1.0).to_proto()),
        })
        .collect()
}

/// A carbon receiver that reads and drops everything (a thread per connection): the
/// Graphite target's own cost, with no store behind it. Returns its address.
fn null_carbon() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the null carbon");
    let address = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let _ = std::io::copy(&mut stream, &mut std::io::sink());
            });
        }
    });
    address
}

fn ingester_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TESSERA_INGESTER_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("own path");
    exe.parent().and_then(|examples| examples.parent()).expect("target/<profile>/examples").join("tessera-ingester")
}

/// Sends pre-encoded frames, each until it is acknowledged Ok; returns the refusals.
async fn send_frames(sender: &mut Sender, frames: &[Vec<u8>]) -> u32 {
    let mut refusals = 0;
    for frame in frames {
        loop {
            let ack = sender.exchange_encoded(frame).await;
            match AckStatus::try_from(ack.status) {
                Ok(AckStatus::Ok) => break,
                Ok(AckStatus::Retryable) => {
                    refusals += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => panic!("batch refused for good: {ack:?}"),
            }
        }
    }
    refusals
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let flags = Flags::parse();
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.expect("prometheus starts");
    let dir = tempfile::tempdir().expect("temporary directory");
    let (wire_port, telemetry_port) = (free_port(), free_port());
    let config = dir.path().join("ingester.toml");
    // The store whose CPU is measured beside the ingester's (none for the file sink and
    // the null carbon, which is a thread of this process reading and dropping lines).
    let mut store_pid = prometheus.pid();
    let mut _store: Option<Box<dyn std::any::Any + Send>> = None;
    let sink = match flags.sink.as_str() {
        "file" => {
            store_pid = None;
            "kind = \"file\"\nrotate_secs = 10\n".to_owned()
        }
        "graphite-null" => {
            store_pid = None;
            format!("kind = \"graphite\"\naddress = \"{}\"\n", null_carbon())
        }
        "graphite" => {
            let carbon = tokio::task::spawn_blocking(|| Carbon::start("10s:10m")).await.expect("carbon-cache starts");
            store_pid = carbon.pid();
            let sink = format!("kind = \"graphite\"\naddress = \"{}\"\nnaming = \"brubeck\"\n", carbon.plaintext);
            _store = Some(Box::new(carbon));
            sink
        }
        "influxdb" => {
            let influx = tokio::task::spawn_blocking(|| {
                let influx = Influx::start();
                influx.query("CREATE DATABASE bench");
                influx
            })
            .await
            .expect("influxd starts");
            store_pid = influx.pid();
            let sink = format!("kind = \"influxdb\"\nurl = \"http://{}\"\ndatabase = \"bench\"\n", influx.address);
            _store = Some(Box::new(influx));
            sink
        }
        _ => format!("kind = \"remote_write\"\nurl = \"{}\"\n", prometheus.remote_write_url()),
    };
    let sink: String = std::iter::once(sink).chain(flags.sink_option.iter().map(|line| format!("{line}\n"))).collect();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{wire_port}\"\ndata_dir = \"{}\"\nsink_policies = [\"10s\", \"idle\"]\n[pool]\nworkers = {}\nmax_samples_per_request = {}\n[pacing]\nmax_in_flight = {}\n{}[sink]\n{sink}[telemetry]\nlisten = \"127.0.0.1:{telemetry_port}\"\n",
            dir.path().join("data").display(),
            flags.workers,
            flags.max_samples_per_request,
            flags.workers,
            flags.pacing.iter().map(|line| format!("{line}\n")).collect::<String>(),
        ),
    )
    .expect("write the config");
    let child = Command::new(ingester_binary())
        .arg("--config")
        .arg(&config)
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .spawn()
        .expect("run tessera-ingester (cargo build --release -p tessera-ingester --bins)");
    let ingester = Process { child, telemetry: ([127, 0, 0, 1], telemetry_port).into() };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(ingester.telemetry, "/readyz"), Ok((200, _))) {
        assert!(Instant::now() < deadline, "tessera-ingester did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut sender = Sender::connect(([127, 0, 0, 1], wire_port).into()).await;
    let rss_idle = ingester.rss_bytes();
    println!(
        "series per burst: {}, bursts: {}, batch tiles: {}, samples/request: {}, workers: {}, sink: {}, pacing: {:?}",
        flags.series,
        flags.bursts,
        flags.batch_tiles,
        flags.max_samples_per_request,
        flags.workers,
        flags.sink,
        flags.pacing
    );

    // Idle: every 500 ms for 5 s, about one full request per worker.
    let duration_name = "tessera_ingester_sink_request_duration_seconds";
    let before_idle = buckets(&ingester.metrics(), duration_name, "target=\"default\"");
    let idle_series = tiles(flags.max_samples_per_request * flags.workers * 9 / 10);
    let first_tile_end = (now_ms() / 10_000 - 60) * 10_000;
    for i in 0..10 {
        let mut batch = wire::batch(i, "idle:1d", first_tile_end + i as i64 * 500, idle_series.clone());
        batch.resolution_ms = 500;
        sender.send_until_ok(batch).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    while metric(&ingester.metrics(), "tessera_ingester_queue_records", "target=\"default\"") > 0.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after_idle = buckets(&ingester.metrics(), duration_name, "target=\"default\"");
    let idle_p50 = quantile(&before_idle, &after_idle, 0.5).unwrap_or(f64::NAN);
    let idle_p99 = quantile(&before_idle, &after_idle, 0.99).unwrap_or(f64::NAN);
    println!("idle: storage request p50 {:.1} ms, p99 {:.1} ms", idle_p50 * 1000.0, idle_p99 * 1000.0);

    let all_tiles = tiles(flags.series);
    let e2e_name = "tessera_ingester_end_to_end_latency_seconds";
    let e2e_before = buckets(&ingester.metrics(), e2e_name, "resolution=\"10s\"");
    let mut e2e_after_first = e2e_before.clone();
    let mut sequence = 1_000;
    let mut peak_rss = rss_idle;
    let ingester_pid = ingester.child.id();
    println!(
        "burst | durable s | drain s | e2e bound s | req p50 ms | req p99 ms | limit min/avg/max | pace max/s | refusals | rss MiB | cpu-s ingester | cpu-s store"
    );
    for burst in 0..flags.bursts {
        // The tile that ends at the next 10 s boundary, flushed 1 s after its end.
        let tile_end = (now_ms() / 10_000 + 1) * 10_000;
        let frames: Vec<Vec<u8>> = all_tiles
            .chunks(flags.batch_tiles)
            .map(|chunk| {
                sequence += 1;
                let batch = wire::batch(sequence, "10s:2d", tile_end, chunk.to_vec());
                encode_frame(&Frame { body: Some(Body::Tiles(batch)) }, DEFAULT_MAX_FRAME_BYTES).expect("frame fits")
            })
            .collect();
        let wait = (tile_end + 1_000 - now_ms()).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let before = buckets(&ingester.metrics(), duration_name, "target=\"default\"");
        let store_cpu_before = store_pid.map_or(0.0, cpu_seconds);
        let ingester_cpu = cpu_seconds(ingester_pid);
        let start = Instant::now();
        let refusals = send_frames(&mut sender, &frames).await;
        let durable = start.elapsed();
        let (mut limit_min, mut limit_max, mut limit_sum, mut polls, mut pace_max) =
            (f64::MAX, 0.0f64, 0.0, 0.0, 0.0f64);
        loop {
            let text = ingester.metrics();
            let limit = metric(&text, "tessera_ingester_in_flight_limit", "target=\"default\"");
            (limit_min, limit_max, limit_sum, polls) =
                (limit_min.min(limit), limit_max.max(limit), limit_sum + limit, polls + 1.0);
            pace_max = pace_max.max(metric(&text, "tessera_ingester_pace_samples_per_second", "target=\"default\""));
            peak_rss = peak_rss.max(ingester.rss_bytes());
            if metric(&text, "tessera_ingester_queue_records", "target=\"default\"") == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drain = start.elapsed();
        let e2e_bound = (now_ms() - tile_end) as f64 / 1000.0;
        let after = buckets(&ingester.metrics(), duration_name, "target=\"default\"");
        println!(
            "{burst:>5} | {:>9.2} | {:>7.2} | {:>11.2} | {:>10.1} | {:>10.1} | {limit_min:>5}/{:>4.1}/{limit_max:<5} | {pace_max:>10.0} | {refusals:>8} | {:>7} | {:>14.1} | {:>16.1}",
            durable.as_secs_f64(),
            drain.as_secs_f64(),
            e2e_bound,
            quantile(&before, &after, 0.5).unwrap_or(f64::NAN) * 1000.0,
            quantile(&before, &after, 0.99).unwrap_or(f64::NAN) * 1000.0,
            limit_sum / polls,
            peak_rss >> 20,
            cpu_seconds(ingester_pid) - ingester_cpu,
            store_pid.map_or(0.0, cpu_seconds) - store_cpu_before,
        );
        if burst == 0 {
            e2e_after_first = buckets(&ingester.metrics(), e2e_name, "resolution=\"10s\"");
        }
    }
    let text = ingester.metrics();
    let e2e_after = buckets(&text, e2e_name, "resolution=\"10s\"");
    let tiles_between =
        |from: &[(f64, f64)]| e2e_after.last().map_or(0.0, |(_, n)| *n) - from.last().map_or(0.0, |(_, n)| *n);
    println!(
        "end-to-end latency (storage ack - tile end, histogram_quantile): all {} tiles p50 {:.2} s p99 {:.2} s; after the first burst {} tiles p50 {:.2} s p99 {:.2} s",
        tiles_between(&e2e_before),
        quantile(&e2e_before, &e2e_after, 0.5).unwrap_or(f64::NAN),
        quantile(&e2e_before, &e2e_after, 0.99).unwrap_or(f64::NAN),
        tiles_between(&e2e_after_first),
        quantile(&e2e_after_first, &e2e_after, 0.5).unwrap_or(f64::NAN),
        quantile(&e2e_after_first, &e2e_after, 0.99).unwrap_or(f64::NAN),
    );
    println!(
        "ingester RSS: idle {} MiB, peak {} MiB; retries {}, rejected samples {}",
        rss_idle >> 20,
        peak_rss >> 20,
        metric(&text, "tessera_ingester_sink_retries_total", "target=\"default\""),
        metric(&text, "tessera_ingester_sink_rejected_samples_total", "target=\"default\",status=\"400\""),
    );
    if flags.sink == "prometheus" {
        let check = prometheus.query("count(bench_requests_total)", now_ms() as f64 / 1000.0);
        println!("prometheus holds {} bench series", check[0]["value"][1].as_str().unwrap_or("0"));
    }
}
