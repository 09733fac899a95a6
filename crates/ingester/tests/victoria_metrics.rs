//! The ingester against a real VictoriaMetrics (Debian's `victoria-metrics`, 1.79): remote
//! write to `/api/v1/write`, exact values read back through its Prometheus query API.
//!
//! VictoriaMetrics takes timers as summaries (`histograms = "summary"`, its documented
//! setting). With `"both"` it still stores the summaries exactly and drops the native
//! histograms it cannot read without failing the request (also tested).

mod support {
    pub use tessera_testkit::{prometheus, victoria};
    pub mod wire;
}

use std::time::Duration;

use serde_json::Value;
use support::prometheus::query;
use support::victoria::VictoriaMetrics;
use support::wire::{batch, counter, gauge, recent_tile_end_ms, start_ingester, timer, wait_until};
use tessera_proto::AckStatus;

/// Raw `(unix seconds, value)` points of the one series a range query returns.
fn points(result: &Value) -> Vec<(f64, f64)> {
    let Some([series]) = result.as_array().map(Vec::as_slice) else { return Vec::new() };
    series["values"]
        .as_array()
        .map(|values| {
            values
                .iter()
                .map(|point| (point[0].as_f64().unwrap(), point[1].as_str().unwrap().parse().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_reach_victoria_metrics_with_exact_values() {
    samples_reach_victoria_metrics_with_timers_as("summary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_histograms_both_victoria_metrics_keeps_the_summaries_and_drops_the_native_histograms() {
    samples_reach_victoria_metrics_with_timers_as("both").await;
}

async fn samples_reach_victoria_metrics_with_timers_as(histograms: &str) {
    let victoria = tokio::task::spawn_blocking(VictoriaMetrics::start).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let (ingester, _telemetry, shutdown, mut sender) = start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[pool]\nworkers = 2\n[sink]\nkind = \"remote_write\"\nurl = \"{}\"\nhistograms = \"{}\"\n",
        data.path().display(),
        victoria.remote_write_url(),
        histograms
    ))
    .await;

    let t0 = recent_tile_end_ms(10);
    for i in 0..4u32 {
        let tiles = vec![
            counter("vm.requests|#route:/api", 2.5),
            gauge("vm.temp", 10.0 * f64::from(i)),
            timer("vm.lat", &[1.0, 2.0, 3.0]),
        ];
        let ack = sender.send(batch(u64::from(i), "10s:2d", t0 + i64::from(i) * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
    wait_until("the queue to drain", Duration::from_secs(30), || ingester.pending_records() == 0).await;

    let end = (t0 + 30_000) as f64 / 1000.0;
    let times: Vec<f64> = (0..4).map(|i| (t0 + i * 10_000) as f64 / 1000.0).collect();
    let expect = |promql: &str, values: [f64; 4]| -> (String, Vec<(f64, f64)>) {
        (promql.to_owned(), times.iter().copied().zip(values).collect())
    };
    let cases = [
        expect(r#"vm_requests_total{route="/api"}[1m]"#, [2.5, 5.0, 7.5, 10.0]),
        expect(r#"vm_temp[1m]"#, [0.0, 10.0, 20.0, 30.0]),
        expect(r#"vm_lat_count[1m]"#, [3.0, 6.0, 9.0, 12.0]),
        expect(r#"vm_lat_sum[1m]"#, [6.0, 12.0, 18.0, 24.0]),
        expect(r#"vm_lat_max[1m]"#, [3.0, 3.0, 3.0, 3.0]),
    ];
    // VictoriaMetrics makes rows searchable shortly after it acknowledges them; ask now.
    victoria.force_flush();
    for (promql, expected) in cases {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            got = points(&query(victoria.address, &promql, end));
            if got == expected {
                break;
            }
            victoria.force_flush();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(got, expected, "{promql}\n{}", victoria.log());
    }
    // No series but the summary's under the timer's name: the histograms were not stored.
    let series = query(victoria.address, r#"count({__name__="vm_lat"})"#, end);
    assert_eq!(series[0]["value"][1], "3", "three quantile series and nothing else: {series}");
    shutdown.trigger();
    ingester.wait().await;
}
