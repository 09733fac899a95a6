//! The InfluxDB target against a real InfluxDB 1.x (Debian's `influxdb`), through the
//! ingester's wire intake: values per tile, and what each refusal does.
//!
//! - **404** (no such database): the records wait in the queue; once the database is
//!   created every tile is written.
//! - **401** (wrong password): the same, until the right credential is configured.
//! - **400** (a field type conflict InfluxDB refuses for good): counted by status,
//!   written to the rejected-samples log, not retried; the points beside it are written.
//! - **influxd SIGKILLed and restarted**: every tile is there afterwards.

mod support {
    pub mod wire;
}

use std::path::Path;
use std::time::Duration;

use support::wire::{
    Sender, batch, counter, gauge, metric_value, recent_tile_end_ms, start_ingester, timer, wait_until,
};
use tessera_ingester::Ingester;
use tessera_proto::AckStatus;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::influx::{ADMIN, Influx};

async fn start_with_sink(data: &Path, sink: &str) -> (Ingester, Telemetry, Shutdown, Sender) {
    start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[pool]\nworkers = 2\nretry_initial_backoff_ms = 20\n\
         retry_max_backoff_ms = 200\n[sink]\n{sink}\n",
        data.display()
    ))
    .await
}

/// `count` tiles of `api.hits` (`i + 1` in tile `i`) and a gauge, 10 s apart from `t0`.
async fn send_tiles(sender: &mut Sender, first_sequence: u64, t0: i64, count: u32) {
    for i in 0..count {
        let tiles = vec![counter("api.hits|#env:prod", f64::from(i + 1)), gauge("temp|#room:1", 20.0 + f64::from(i))];
        let sequence = first_sequence + u64::from(i);
        let ack = sender.send(batch(sequence, "10s:2d", t0 + i64::from(i) * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
}

/// The `value` of every row of `measurement`, by time.
fn values(influx: &Influx, database: &str, measurement: &str) -> Vec<(i64, f64)> {
    let rows = influx.rows(database, &format!("SELECT value FROM {measurement}"));
    rows.iter().filter_map(|row| Some((row["time"].as_i64()?, row["value"].as_f64()?))).collect()
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

fn metric(telemetry: &Telemetry, name: &str, labels: &str) -> f64 {
    metric_value(&telemetry.encode().unwrap(), name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_holds_the_tiles_until_it_exists_then_a_restart_of_influxd_loses_nothing() {
    let influx = blocking(Influx::start).await;
    let url = format!("http://{}", influx.address);
    let data = tempfile::tempdir().unwrap();
    let sink = format!("kind = \"influxdb\"\nurl = \"{url}\"\ndatabase = \"tessera\"\n");
    let (_ingester, telemetry, _shutdown, mut sender) = start_with_sink(data.path(), &sink).await;
    let t0 = recent_tile_end_ms(10);
    send_tiles(&mut sender, 0, t0, 3).await;
    wait_until("a 404 retried", Duration::from_secs(20), || {
        metric(&telemetry, "tessera_ingester_sink_requests_total", "target=\"default\",outcome=\"not_found\"") >= 1.0
    })
    .await;
    let influx = blocking(move || {
        influx.query("CREATE DATABASE tessera");
        influx
    })
    .await;
    let influx = std::sync::Arc::new(std::sync::Mutex::new(influx));
    let check = influx.clone();
    wait_until("three tiles in InfluxDB", Duration::from_secs(30), || {
        values(&check.lock().unwrap(), "tessera", "api_hits").len() == 3
    })
    .await;
    let hits = values(&influx.lock().unwrap(), "tessera", "api_hits");
    assert_eq!(hits, vec![(t0, 1.0), (t0 + 10_000, 2.0), (t0 + 20_000, 3.0)], "per tile, at the tile's end");
    let rows = influx.lock().unwrap().rows("tessera", "SELECT * FROM temp");
    assert_eq!(rows.len(), 3);
    assert_eq!((rows[0]["room"].as_str(), rows[0]["metric_type"].as_str()), (Some("1"), Some("gauge")));

    // influxd killed and restarted: tiles sent meanwhile are written once it is back.
    influx.lock().unwrap().kill();
    send_tiles(&mut sender, 10, t0 + 30_000, 3).await;
    wait_until("the restart's refusals retried", Duration::from_secs(20), || {
        metric(&telemetry, "tessera_ingester_sink_requests_total", "target=\"default\",outcome=\"network\"") >= 1.0
    })
    .await;
    let restarted = influx.clone();
    blocking(move || restarted.lock().unwrap().restart()).await;
    wait_until("six tiles in InfluxDB", Duration::from_secs(30), || {
        values(&check.lock().unwrap(), "tessera", "api_hits").len() == 6
    })
    .await;
    let sum: f64 = values(&influx.lock().unwrap(), "tessera", "api_hits").iter().map(|(_, value)| value).sum();
    assert_eq!(sum, 12.0, "1 + 2 + 3 twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_holds_the_tiles_and_a_field_type_conflict_is_refused_for_good() {
    let influx = blocking(|| {
        let influx = Influx::start_with_auth();
        influx.query("CREATE DATABASE tessera");
        influx
    })
    .await;
    let url = format!("http://{}", influx.address);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let sink = |password: &Path| {
        format!(
            "kind = \"influxdb\"\nurl = \"{url}\"\ndatabase = \"tessera\"\n[sink.basic_auth]\nusername = \"{}\"\n\
             password_file = \"{}\"\n",
            ADMIN.0,
            password.display()
        )
    };
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, shutdown, mut sender) = start_with_sink(data.path(), &sink(&wrong)).await;
    let t0 = recent_tile_end_ms(10);
    send_tiles(&mut sender, 0, t0, 2).await;
    wait_until("a 401 retried", Duration::from_secs(20), || {
        metric(&telemetry, "tessera_ingester_sink_requests_total", "target=\"default\",outcome=\"unauthorized\"") >= 1.0
    })
    .await;
    assert_eq!(metric(&telemetry, "tessera_ingester_samples_written_total", "target=\"default\""), 0.0);
    drop(sender);
    shutdown.trigger();
    ingester.wait().await;

    // The right password, on the same queue: the held tiles are written.
    let right = dir.path().join("right");
    std::fs::write(&right, format!("{}\n", ADMIN.1)).unwrap();
    let (_ingester, telemetry, _shutdown, mut sender) = start_with_sink(data.path(), &sink(&right)).await;
    let influx = std::sync::Arc::new(influx);
    let check = influx.clone();
    wait_until("the held tiles in InfluxDB", Duration::from_secs(30), || {
        values(&check, "tessera", "api_hits").len() == 2
    })
    .await;

    // `value` of api.hits is an integer field: a gauge of the same name writes a float
    // there, which InfluxDB refuses for good (400, a partial write). The other series of
    // the same tile is written.
    let tiles = vec![gauge("api.hits|#env:prod", 1.5), timer("api.latency", &[0.1, 0.2])];
    let ack = sender.send(batch(100, "10s:2d", t0 + 20_000, tiles)).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    wait_until("the refusal counted", Duration::from_secs(20), || {
        metric(&telemetry, "tessera_ingester_sink_rejected_samples_total", "target=\"default\",status=\"400\"") >= 1.0
    })
    .await;
    let rows = blocking(move || check.rows("tessera", "SELECT count, upper FROM api_latency")).await;
    assert_eq!(rows.len(), 1, "the point beside the refused one is written: {rows:?}");
    assert_eq!((rows[0]["count"].as_f64(), rows[0]["upper"].as_f64()), (Some(2.0), Some(200.0)), "in ms, as sent");
    let rejected = std::fs::read_to_string(data.path().join("rejected-samples.log")).unwrap();
    assert!(rejected.contains("api_hits,env=prod,metric_type=gauge value=1.5"), "{rejected}");
    assert!(rejected.contains("field type conflict"), "InfluxDB's message: {rejected}");
}
