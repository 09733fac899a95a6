//! Running totals across restarts of the real `tessera-ingester` binary, into a real
//! Prometheus: a counter, a timer's summary `_count`/`_sum` and its native histogram go on
//! from where they were after a SIGKILL between tiles (no checkpoint yet, then a checkpoint
//! and the records after it) and after a SIGTERM (the checkpoint written at shutdown). In
//! Prometheus every sample is the exact running total, `resets()` finds none, and the native
//! histogram's count goes on with no reset. Prometheus 2.42 ignores a histogram's reset hint
//! (it finds resets from the counts), so the hint is read from the remote-write requests
//! themselves, caught by a small receiver. A damaged checkpoint is counted, set aside and
//! logged, and the ingester starts anyway.

mod support {
    pub use tessera_testkit::prometheus;
    pub mod binary;
    pub mod wire;
}

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use serde_json::Value;
use support::binary::Process;
use support::prometheus::{Prometheus, free_port, single_series_points};
use support::wire::{Sender, batch, counter, recent_tile_end_ms, timer};
use tessera_ingester::prompb::WriteRequest;
use tessera_ingester::series::RESET_HINT_YES;
use tessera_proto::{AckStatus, TileBatch};

const TILES: i64 = 16;
const SERIES: f64 = 5.0; // restart_c_total, restart_other_total, restart_t_count, restart_t_sum, restart_t
const DEFAULT: &str = r#"target="default""#;

fn write_config(path: &Path, data: &Path, wire: u16, telemetry: u16, url: &str, checkpoint_interval_secs: u64) {
    let text = format!(
        r#"
listen = "127.0.0.1:{wire}"
data_dir = "{data}"
[queue]
checkpoint_interval_secs = {checkpoint_interval_secs}
[pool]
retry_initial_backoff_ms = 20
retry_max_backoff_ms = 200
[sink]
kind = "remote_write"
url = "{url}"
histograms = "both"
[telemetry]
listen = "127.0.0.1:{telemetry}"
"#,
        data = data.display()
    );
    std::fs::write(path, text).unwrap();
}

/// Tile `n`: the counter adds `n + 1`; the timer has 1 000 observations in the first tile
/// and 10 in each after it (so a reset would show as a jump of about a thousand).
fn tile(t0: i64, n: i64) -> TileBatch {
    let observations: Vec<f64> = match n {
        0 => (0..1000).map(|k| f64::from(1 + k % 50)).collect(),
        _ => (0..10).map(|k| f64::from(100 + k)).collect(),
    };
    let tiles = vec![
        counter("restart.c", (n + 1) as f64),
        counter("restart.other|#host:h1", 1.0),
        timer("restart.t", &observations),
    ];
    batch(n as u64, "10s:2d", t0 + n * 10_000, tiles)
}

/// The counter's running total after tile `n`.
fn counter_total(n: i64) -> f64 {
    ((n + 1) * (n + 2) / 2) as f64
}

/// The timer's observation count, and their sum, after tile `n`.
fn timer_totals(n: i64) -> (f64, f64) {
    let first: f64 = (0..1000).map(|k| f64::from(1 + k % 50)).sum();
    let each: f64 = (0..10).map(|k| f64::from(100 + k)).sum();
    (1000.0 + 10.0 * n as f64, first + each * n as f64)
}

async fn send_tiles(wire: u16, t0: i64, tiles: std::ops::Range<i64>) {
    let mut sender = Sender::connect(([127, 0, 0, 1], wire).into()).await;
    for n in tiles {
        let ack = sender.send(tile(t0, n)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "tile {n}: {ack:?}");
    }
}

/// `[(time, value)]` of the one series `selector` matches over the test's tiles.
fn points(prometheus: &Prometheus, selector: &str, end: f64) -> Vec<(f64, f64)> {
    let result = prometheus.query(&format!("{selector}[10m]"), end);
    let points = single_series_points(&result, selector);
    points.into_iter().map(|(time, value)| (time, value.parse().unwrap())).collect()
}

fn scalar(prometheus: &Prometheus, promql: &str, at: f64) -> f64 {
    let result = prometheus.query(promql, at);
    let series = result.as_array().expect("a result array");
    assert_eq!(series.len(), 1, "{promql}: {result}");
    let value: &Value = &series[0]["value"][1];
    value.as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_go_on_across_sigkill_and_sigterm_restarts() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.unwrap();
    let url = prometheus.remote_write_url();
    let dir = tempfile::tempdir().unwrap();
    let (data, config, log) = (dir.path().join("data"), dir.path().join("ingester.toml"), dir.path().join("log"));
    let (wire, telemetry) = (free_port(), free_port());
    let telemetry_addr: SocketAddr = ([127, 0, 0, 1], telemetry).into();
    let t0 = recent_tile_end_ms(10);
    let start = |interval: u64| {
        write_config(&config, &data, wire, telemetry, &url, interval);
        Process::start(&config, telemetry_addr, &log, "info")
    };

    // 1. No checkpoint yet (the interval is far off): SIGKILL after tiles 0..4. The restart
    //    rolls the totals forward through every queued record.
    let first = start(3600);
    for failure in ["write", "read", "corrupt"] {
        let labels = format!(r#"target="default",reason="{failure}""#);
        assert!(first.metrics().contains(&format!("tessera_ingester_checkpoint_errors_total{{{labels}}} 0")));
    }
    send_tiles(wire, t0, 0..4).await;
    drop(first);

    // 2. SIGTERM after tiles 4..8: the final checkpoint is written at shutdown.
    let second = start(3600);
    assert_eq!(second.metric("tessera_ingester_checkpoint_restored_series", DEFAULT), SERIES);
    assert_eq!(second.metric("tessera_ingester_checkpoints_total", DEFAULT), 0.0);
    send_tiles(wire, t0, 4..8).await;
    assert_eq!(second.terminate(), Some(0));
    assert!(data.join("queue/default/checkpoint").exists());

    // 3. Periodic checkpoints (every second): one taken after tiles 8..10, then tiles 10..12
    //    and a SIGKILL. The restart restores the checkpoint and rolls forward what followed.
    let third = start(1);
    assert_eq!(third.metric("tessera_ingester_checkpoint_restored_series", DEFAULT), SERIES);
    assert!(third.metric("tessera_ingester_checkpoint_age_seconds", DEFAULT) < 60.0, "the age of the one loaded");
    send_tiles(wire, t0, 8..10).await;
    let sent = Instant::now();
    // A checkpoint younger than the last tile covers it (a round with nothing new queued is
    // skipped, and counts as fresh).
    let deadline = Instant::now() + Duration::from_secs(20);
    while third.metric("tessera_ingester_checkpoints_total", DEFAULT) < 1.0
        || third.metric("tessera_ingester_checkpoint_age_seconds", DEFAULT) + 0.05 > sent.elapsed().as_secs_f64()
    {
        assert!(Instant::now() < deadline, "no periodic checkpoint");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(third.metric("tessera_ingester_checkpoint_series", DEFAULT), SERIES);
    assert!(third.metric("tessera_ingester_checkpoint_duration_seconds_count", DEFAULT) >= 1.0);
    assert!(data.join("queue/default/checkpoint").exists() && !data.join("queue/default/checkpoint.tmp").exists());
    send_tiles(wire, t0, 10..12).await;
    drop(third);

    // 4. The last tiles, delivered; then a clean stop.
    let fourth = start(1);
    assert_eq!(fourth.metric("tessera_ingester_checkpoint_restored_series", DEFAULT), SERIES);
    send_tiles(wire, t0, 12..TILES).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fourth.metric("tessera_ingester_queue_records", DEFAULT) > 0.0 {
        assert!(Instant::now() < deadline, "the queue did not drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for failure in ["write", "read", "corrupt"] {
        let labels = format!(r#"target="default",reason="{failure}""#);
        assert_eq!(fourth.metric("tessera_ingester_checkpoint_errors_total", &labels), 0.0, "{failure}");
    }
    assert_eq!(fourth.terminate(), Some(0));
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("running totals restored"), "{log_text}");

    // Every sample is the exact running total: nothing started again from 0.
    let at = |n: i64| (t0 + n * 10_000) as f64 / 1000.0;
    let end = at(TILES - 1);
    let expected = |total: &dyn Fn(i64) -> f64| (0..TILES).map(|n| (at(n), total(n))).collect::<Vec<_>>();
    assert_eq!(points(&prometheus, "restart_c_total", end), expected(&counter_total));
    assert_eq!(points(&prometheus, "restart_other_total", end), expected(&|n| (n + 1) as f64));
    assert_eq!(points(&prometheus, "restart_t_count", end), expected(&|n| timer_totals(n).0));
    assert_eq!(points(&prometheus, "restart_t_sum", end), expected(&|n| timer_totals(n).1));
    for counter in ["restart_c_total", "restart_other_total", "restart_t_count", "restart_t_sum"] {
        assert_eq!(scalar(&prometheus, &format!("resets({counter}[10m])"), end), 0.0, "{counter}");
    }

    // The native histogram's count goes on through every restart, and Prometheus sees no
    // reset there: the increase over the last two samples is one tile's 10 observations
    // (extrapolated by up to half), where a reset would count all of them again (1 000 and more).
    let native = r#"restart_t{quantile=""}"#;
    for n in 0..TILES {
        let count = scalar(&prometheus, &format!("histogram_count({native})"), at(n));
        assert_eq!(count, timer_totals(n).0, "tile {n}");
    }
    for restarted_at in [4, 8, 12] {
        let increase = scalar(&prometheus, &format!("histogram_count(increase({native}[15s]))"), at(restarted_at));
        assert!((10.0..=15.0).contains(&increase), "increase {increase} across the restart before tile {restarted_at}");
    }
    assert_eq!(scalar(&prometheus, &format!("histogram_sum({native})"), end), timer_totals(TILES - 1).1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_checkpoint_is_counted_set_aside_and_the_ingester_starts() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (data, config, log) = (dir.path().join("data"), dir.path().join("ingester.toml"), dir.path().join("log"));
    let (wire, telemetry) = (free_port(), free_port());
    let telemetry_addr: SocketAddr = ([127, 0, 0, 1], telemetry).into();
    write_config(&config, &data, wire, telemetry, &prometheus.remote_write_url(), 3600);
    let t0 = recent_tile_end_ms(10);

    let first = Process::start(&config, telemetry_addr, &log, "info");
    send_tiles(wire, t0, 0..2).await;
    assert_eq!(first.terminate(), Some(0));
    let checkpoint = data.join("queue/default/checkpoint");
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&checkpoint, bytes).unwrap();

    let second = Process::start(&config, telemetry_addr, &log, "info");
    assert_eq!(second.metric("tessera_ingester_checkpoint_errors_total", r#"target="default",reason="corrupt""#), 1.0);
    assert!(data.join("queue/default/checkpoint.corrupt").exists());
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("checkpoint checksum mismatch"), "{log_text}");
    // It takes tiles as usual and writes a good checkpoint at shutdown.
    send_tiles(wire, t0, 2..3).await;
    assert_eq!(second.terminate(), Some(0));
    let third = Process::start(&config, telemetry_addr, &log, "info");
    assert_eq!(third.metric("tessera_ingester_checkpoint_errors_total", r#"target="default",reason="corrupt""#), 0.0);
    assert_eq!(third.metric("tessera_ingester_checkpoint_restored_series", DEFAULT), SERIES);
}

/// A remote-write receiver that keeps every native histogram it is sent, as
/// `(timestamp, count, reset hint)`, and answers 204.
struct Receiver {
    address: SocketAddr,
    histograms: Arc<Mutex<Vec<(i64, u64, i32)>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let histograms = Arc::new(Mutex::new(Vec::new()));
        let kept = histograms.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let kept = kept.clone();
                std::thread::spawn(move || Receiver::serve(stream, &kept));
            }
        });
        Receiver { address, histograms }
    }

    /// HTTP/1.1 requests on one connection, until it closes.
    fn serve(stream: std::net::TcpStream, kept: &Mutex<Vec<(i64, u64, i32)>>) {
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        loop {
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let body = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
            let request = WriteRequest::decode(body.as_slice()).unwrap();
            for series in request.timeseries {
                for histogram in series.histograms {
                    kept.lock().unwrap().push((histogram.timestamp, histogram.count_int, histogram.reset_hint));
                }
            }
            writer.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        }
    }

    /// The histograms received, by timestamp.
    fn histograms(&self) -> Vec<(i64, u64, i32)> {
        let mut histograms = self.histograms.lock().unwrap().clone();
        histograms.sort();
        histograms
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_histogram_after_a_restart_carries_no_reset_hint() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let (data, config, log) = (dir.path().join("data"), dir.path().join("ingester.toml"), dir.path().join("log"));
    let (wire, telemetry) = (free_port(), free_port());
    let telemetry_addr: SocketAddr = ([127, 0, 0, 1], telemetry).into();
    let url = format!("http://{}/api/v1/write", receiver.address);
    write_config(&config, &data, wire, telemetry, &url, 3600);
    let t0 = recent_tile_end_ms(10);

    // Tiles 0 and 1, SIGKILL (rolled forward), tile 2, SIGTERM (checkpoint), tile 3.
    let first = Process::start(&config, telemetry_addr, &log, "info");
    send_tiles(wire, t0, 0..2).await;
    drop(first);
    let second = Process::start(&config, telemetry_addr, &log, "info");
    send_tiles(wire, t0, 2..3).await;
    assert_eq!(second.terminate(), Some(0));
    let third = Process::start(&config, telemetry_addr, &log, "info");
    send_tiles(wire, t0, 3..4).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.histograms().iter().all(|(timestamp, ..)| *timestamp != t0 + 30_000) {
        assert!(Instant::now() < deadline, "tile 3 not received: {:?}", receiver.histograms());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(third.terminate(), Some(0));

    // A restart may send again what was in flight (the same sample, the same hint): one of each.
    let mut histograms = receiver.histograms();
    histograms.dedup();
    let expected: Vec<(i64, u64, i32)> =
        (0..4).map(|n| (t0 + n * 10_000, timer_totals(n).0 as u64, if n == 0 { RESET_HINT_YES } else { 0 })).collect();
    assert_eq!(histograms, expected, "only the series' very first sample is a reset");
}
