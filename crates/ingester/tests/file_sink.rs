//! The embedded file sink: what it writes is imported by Debian's
//! `promtool tsdb create-blocks-from openmetrics`, with the right values.

mod support {
    pub mod wire;
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::wire::{
    batch, counter, gauge, metric_value, recent_tile_end_ms, set, start_ingester, start_unconnected_ingester, timer,
};
use tessera_proto::AckStatus;

fn promtool() -> PathBuf {
    std::env::var_os("TESSERA_PROMTOOL_BIN").map_or_else(|| PathBuf::from("promtool"), PathBuf::from)
}

fn closed_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "om"))
        .collect();
    files.sort();
    files
}

/// `promtool tsdb dump` lines, `{__name__="x", k="v"} value timestamp_ms`, keyed by series.
fn dump(tsdb: &Path) -> BTreeMap<String, Vec<(i64, f64)>> {
    std::fs::create_dir_all(tsdb.join("wal")).unwrap();
    let output = Command::new(promtool()).args(["tsdb", "dump"]).arg(tsdb).output().expect("run promtool tsdb dump");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut series: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (labels, rest) = line.rsplit_once("} ").expect("labels, then value and time");
        let (value, timestamp) = rest.split_once(' ').expect("value and time");
        series.entry(format!("{labels}}}")).or_default().push((timestamp.parse().unwrap(), value.parse().unwrap()));
    }
    series
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_imports_the_files_with_the_right_values() {
    let data = tempfile::tempdir().unwrap();
    // Both resolutions in the one file target: the `resolution` label keeps them apart.
    let (ingester, _telemetry, shutdown, mut sender) = start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nsink_policies = [\"10s\", \"1m\"]\n[pool]\nworkers = 3\nmax_samples_per_request = 4\n[sink]\nkind = \"file\"\nrotate_secs = 3600\n",
        data.path().display()
    ))
    .await;
    let t0 = recent_tile_end_ms(5);
    for i in 0..3u32 {
        let tiles = vec![
            counter("jobs.done|#note:say \"hi\",queue:high priority", 2.0),
            gauge("disk.free|#mount:/var", 100.0 - f64::from(i)),
            timer("job.seconds", &[0.5, 1.5]),
            set("workers", &["w1", "w2"]),
        ];
        let ack = sender.send(batch(u64::from(i), "10s:2d", t0 + i64::from(i) * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
    let ack = sender
        .send(batch(9, "1m:40d", t0 + 60_000, vec![counter("jobs.done|#note:say \"hi\",queue:high priority", 6.0)]))
        .await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    support::wire::wait_until("the queue to drain", std::time::Duration::from_secs(30), || {
        ingester.pending_records() == 0
    })
    .await;
    // Shutdown closes the journal into an importable file.
    shutdown.trigger();
    ingester.wait().await;

    let files = closed_files(&data.path().join("openmetrics/default"));
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(!data.path().join("openmetrics/default/current.journal").exists());
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE jobs_done counter\n"), "{text}");
    assert!(text.contains("# TYPE job_seconds summary\n"), "{text}");
    assert!(text.contains("# HELP jobs_done statsd counter (c), written by tessera\n"), "{text}");

    let tsdb = data.path().join("tsdb");
    let output = Command::new(promtool())
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&files[0])
        .arg(&tsdb)
        .output()
        .expect("run promtool (Debian's prometheus package)");
    assert!(output.status.success(), "promtool refused the file:\n{}\n{text}", String::from_utf8_lossy(&output.stderr));

    let series = dump(&tsdb);
    let at = |i: i64| t0 + i * 10_000;
    let expect = |name: &str, points: Vec<(i64, f64)>| {
        assert_eq!(series.get(name), Some(&points), "{name} in {series:#?}");
    };
    expect(
        r#"{__name__="jobs_done_total", note="say \"hi\"", queue="high priority", resolution="10s"}"#,
        vec![(at(0), 2.0), (at(1), 4.0), (at(2), 6.0)],
    );
    expect(
        r#"{__name__="jobs_done_total", note="say \"hi\"", queue="high priority", resolution="1m"}"#,
        vec![(t0 + 60_000, 6.0)],
    );
    expect(
        r#"{__name__="disk_free", mount="/var", resolution="10s"}"#,
        vec![(at(0), 100.0), (at(1), 99.0), (at(2), 98.0)],
    );
    expect(r#"{__name__="job_seconds_count", resolution="10s"}"#, vec![(at(0), 2.0), (at(1), 4.0), (at(2), 6.0)]);
    expect(r#"{__name__="job_seconds_sum", resolution="10s"}"#, vec![(at(0), 2.0), (at(1), 4.0), (at(2), 6.0)]);
    expect(r#"{__name__="job_seconds_max", resolution="10s"}"#, vec![(at(0), 1.5), (at(1), 1.5), (at(2), 1.5)]);
    expect(r#"{__name__="workers", resolution="10s"}"#, vec![(at(0), 2.0), (at(1), 2.0), (at(2), 2.0)]);
    assert!(series.contains_key(r#"{__name__="job_seconds", quantile="0.99", resolution="10s"}"#), "{series:#?}");
}

/// A target reconfigured from remote write (native histograms) to files keeps its queue: the
/// file sink writes what OpenMetrics text can hold and skips the native histograms, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_histograms_left_in_a_file_targets_queue_are_skipped_and_counted() {
    let data = tempfile::tempdir().unwrap();
    let config_text = |sink: &str| {
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nshutdown_grace_secs = 1\n[sink]\n{sink}\n",
            data.path().display()
        )
    };
    // Remote write to a port nobody listens on: the record stays queued.
    let (ingester, _, shutdown, mut sender) = start_ingester(&config_text(
        "kind = \"remote_write\"\nurl = \"http://127.0.0.1:1/api/v1/write\"\nhistograms = \"native\"",
    ))
    .await;
    let t0 = recent_tile_end_ms(5);
    let tiles = vec![counter("jobs", 3.0), timer("job.seconds", &[0.5, 1.5])];
    let ack = sender.send(batch(0, "10s:2d", t0, tiles)).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    shutdown.trigger();
    ingester.wait().await;

    let (ingester, telemetry, shutdown) =
        start_unconnected_ingester(&config_text("kind = \"file\"\nrotate_secs = 3600")).await;
    support::wire::wait_until("the queue to drain", std::time::Duration::from_secs(30), || {
        ingester.pending_records() == 0
    })
    .await;
    let text = telemetry.encode().unwrap();
    let skipped = metric_value(&text, "tessera_ingester_file_sink_histograms_skipped_total", r#"target="default""#);
    assert_eq!(skipped, 1.0, "{text}");
    shutdown.trigger();
    ingester.wait().await;
    let files = closed_files(&data.path().join("openmetrics/default"));
    let written: String = files.iter().map(|file| std::fs::read_to_string(file).unwrap()).collect();
    // One resolution in the target: no `resolution` label.
    assert!(written.contains("\njobs_total 3.0"), "{written}");
    assert!(written.contains("\njob_seconds_min 0.5"), "{written}");
    assert!(written.contains("\njob_seconds_max 1.5"), "{written}");
    assert!(
        !written.lines().any(|line| line.starts_with("job_seconds ") || line.starts_with("job_seconds{")),
        "no histogram line: {written}"
    );
}
