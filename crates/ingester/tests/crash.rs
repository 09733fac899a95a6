//! SIGKILL in the middle of draining a backlog: the real `tessera-ingester` binary is
//! killed while it writes a paced backlog into a real Prometheus, then restarted. Every
//! sample ends up in Prometheus with its value, none is rejected as a conflicting
//! duplicate, and only what was in flight at the kill is sent again.

mod support {
    pub use tessera_testkit::prometheus;
    pub mod binary;
    pub mod wire;
}

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use support::binary::Process;
use support::prometheus::{Prometheus, free_port};
use support::wire::{Sender, batch, counter, gauge, recent_tile_end_ms};
use tessera_proto::AckStatus;

const BATCHES: u64 = 30;
const COUNTERS: usize = 800;
const GAUGES: usize = 200;
const SAMPLES: u64 = BATCHES * (COUNTERS + GAUGES) as u64;
const WORKERS: u64 = 4;
const MAX_SAMPLES_PER_REQUEST: u64 = 250;

fn write_config(path: &Path, data: &Path, wire: u16, telemetry: u16, url: &str, pace: Option<f64>) {
    let pacing = pace.map_or(String::new(), |rate| format!("[pacing]\nmax_samples_per_sec = {rate:.1}\n"));
    let text = format!(
        r#"
listen = "127.0.0.1:{wire}"
data_dir = "{data}"
[pool]
workers = {WORKERS}
max_samples_per_request = {MAX_SAMPLES_PER_REQUEST}
[sink]
kind = "remote_write"
url = "{url}"
[telemetry]
listen = "127.0.0.1:{telemetry}"
{pacing}"#,
        data = data.display()
    );
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_drain_loses_nothing_and_writes_nothing_twice() {
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("ingester.toml");
    let log = dir.path().join("ingester.log");
    let (wire, telemetry) = (free_port(), free_port());
    let telemetry_addr: SocketAddr = ([127, 0, 0, 1], telemetry).into();
    // A low ceiling keeps the first run draining for seconds.
    write_config(&config, &data, wire, telemetry, &prometheus.remote_write_url(), Some(6000.0));
    let first = Process::start(&config, telemetry_addr, &log, "warn");

    let mut sender = Sender::connect(([127, 0, 0, 1], wire).into()).await;
    let t0 = recent_tile_end_ms(10);
    for sequence in 0..BATCHES {
        let mut tiles: Vec<_> = (0..COUNTERS).map(|n| counter(&format!("crash.c{n}"), 1.0 + n as f64)).collect();
        tiles.extend((0..GAUGES).map(|n| gauge(&format!("crash.g{n}"), (sequence * 1000 + n as u64) as f64)));
        let ack = sender.send(batch(sequence, "10s:2d", t0 + sequence as i64 * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
    drop(sender);

    // Kill it once part of the backlog is in Prometheus.
    let deadline = Instant::now() + Duration::from_secs(30);
    let written_before_kill = loop {
        let written = first.metric("tessera_ingester_samples_written_total", r#"target="default""#);
        if written >= 8000.0 {
            break written as u64;
        }
        assert!(Instant::now() < deadline, "the first run wrote only {written} samples");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(written_before_kill < SAMPLES / 2, "the backlog must still be draining at the kill");
    drop(first); // SIGKILL

    write_config(&config, &data, wire, telemetry, &prometheus.remote_write_url(), None);
    let second = Process::start(&config, telemetry_addr, &log, "warn");
    assert!(second.metric("tessera_ingester_queue_replayed_records_total", r#"target="default""#) > 0.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while second.metric("tessera_ingester_queue_records", r#"target="default""#) > 0.0 {
        assert!(Instant::now() < deadline, "the restarted ingester did not drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let written_after_restart = second.metric("tessera_ingester_samples_written_total", r#"target="default""#) as u64;
    let in_flight = WORKERS * MAX_SAMPLES_PER_REQUEST;
    eprintln!(
        "written before the kill: {written_before_kill}, after the restart: {written_after_restart}, of {SAMPLES}"
    );
    assert!(
        written_after_restart <= SAMPLES - written_before_kill + in_flight,
        "the restart sent {written_after_restart} samples; at most {} were not yet written",
        SAMPLES - written_before_kill + in_flight
    );
    assert_eq!(second.metric("tessera_ingester_sink_rejected_samples_total", r#"target="default",status="400""#), 0.0);
    assert!(
        !data.join("rejected-samples.log").exists(),
        "storage refused samples:\n{}",
        std::fs::read_to_string(&log).unwrap()
    );

    // Every sample, exactly once per series and tile, with its value.
    let end = (t0 + (BATCHES as i64 - 1) * 10_000) as f64 / 1000.0;
    let result = prometheus.query(r#"{__name__=~"crash_.*"}[10m]"#, end);
    let mut series: std::collections::BTreeMap<String, Vec<(f64, f64)>> = std::collections::BTreeMap::new();
    for one in result.as_array().unwrap() {
        let name = one["metric"]["__name__"].as_str().unwrap().to_owned();
        let points = one["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|point| (point[0].as_f64().unwrap(), point[1].as_str().unwrap().parse().unwrap()))
            .collect();
        assert!(series.insert(name.clone(), points).is_none(), "{name} twice");
    }
    assert_eq!(series.len(), COUNTERS + GAUGES);
    let expected = |value_at: &dyn Fn(u64) -> f64| -> Vec<(f64, f64)> {
        (0..BATCHES).map(|i| ((t0 + i as i64 * 10_000) as f64 / 1000.0, value_at(i))).collect()
    };
    for n in 0..COUNTERS {
        let name = format!("crash_c{n}_total");
        assert_eq!(series[&name], expected(&|i| (i + 1) as f64 * (1.0 + n as f64)), "{name}");
    }
    for n in 0..GAUGES {
        let name = format!("crash_g{n}");
        assert_eq!(series[&name], expected(&|i| (i * 1000 + n as u64) as f64), "{name}");
    }
    let samples: usize = series.values().map(Vec::len).sum();
    assert_eq!(samples as u64, SAMPLES);
}
