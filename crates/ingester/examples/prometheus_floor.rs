//! What a burst costs Prometheus without tessera: a minimal remote-write sender that
//! posts the burst benchmark's samples (same labels, same values, one sample per series)
//! straight into a real Prometheus as fast as it takes them.
//!
//! ```sh
//! cargo build --release -p tessera-ingester --examples
//! target/release/examples/prometheus_floor --series 1000000 --sizes 2000,5000,10000 --concurrency 2,4,8
//! ```
//!
//! Every request body (protobuf + snappy) is built before the clock starts, so the sender
//! costs almost nothing while Prometheus works. The first burst creates the series (and is
//! reported apart); then each `(samples per request, concurrency)` pair sends `--bursts`
//! bursts, `--gap-secs` apart, and prints per burst: wall time until the last request was
//! acknowledged, Prometheus CPU seconds until then and until the end of the gap (Go's GC and
//! WAL work finish after the last answer), and the sender's own CPU seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tessera_ingester::record::StoredSample;
use tessera_ingester::{prompb, series};
use tessera_testkit::prometheus::Prometheus;

/// Prometheus's own cost of a burst, posted by a minimal sender.
#[derive(Debug, Parser)]
struct Flags {
    /// Series (one sample each) per burst.
    #[arg(long, default_value_t = 1_000_000)]
    series: usize,
    /// Samples per request to try, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2000,5000,10000")]
    sizes: Vec<usize>,
    /// Requests in flight to try, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    concurrency: Vec<usize>,
    /// Bursts per pair.
    #[arg(long, default_value_t = 2)]
    bursts: usize,
    /// Pause after each burst, seconds.
    #[arg(long, default_value_t = 4)]
    gap_secs: u64,
    /// Label set: `tessera` (what the ingester sends: `__name__`, host, resolution, series)
    /// or `minimal` (`__name__` and series only).
    #[arg(long, default_value = "tessera")]
    labels: String,
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn labels(series: usize, minimal: bool) -> Vec<Bytes> {
    (0..series)
        .map(|n| {
            let mut out = Vec::new();
            let (host, number) = (format!("host-{:04}", n % 1000), n.to_string());
            if minimal {
                series::encode_labels(&mut out, &[("__name__", "bench_requests_total"), ("series", &number)]);
            } else {
                series::encode_labels(
                    &mut out,
                    &[
                        ("__name__", "bench_requests_total"),
                        ("host", &host),
                        ("resolution", "10s"),
                        ("series", &number),
                    ],
                );
            }
            Bytes::from(out)
        })
        .collect()
}

fn bodies(labels: &[Bytes], value: f64, timestamp_ms: i64, per_request: usize) -> Vec<Bytes> {
    labels
        .chunks(per_request)
        .map(|chunk| {
            let samples: Vec<StoredSample> = chunk
                .iter()
                .map(|labels| StoredSample { labels: labels.clone(), value, kind: 1, ..Default::default() })
                .collect();
            let mut body = Vec::new();
            prompb::encode_write_request(&mut body, &samples, timestamp_ms);
            Bytes::from(prompb::compress(&body).expect("snappy"))
        })
        .collect()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Posts every body with `concurrency` requests in flight; returns the wall time.
async fn post_all(client: &HttpClient, url: &str, bodies: Vec<Bytes>, concurrency: usize) -> Duration {
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, bodies, next) = (client.clone(), url.to_owned(), bodies.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(index) else { return };
                    let request = hyper::Request::post(&url)
                        .header("Content-Encoding", "snappy")
                        .header("Content-Type", "application/x-protobuf")
                        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                        .body(Full::new(body.clone()))
                        .expect("request");
                    let response = client.request(request).await.expect("prometheus answers");
                    let status = response.status();
                    let text = response.into_body().collect().await.expect("body").to_bytes();
                    assert!(status.is_success(), "prometheus said {status}: {}", String::from_utf8_lossy(&text));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("sender task");
    }
    start.elapsed()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let flags = Flags::parse();
    let prometheus = tokio::task::spawn_blocking(Prometheus::start).await.expect("prometheus starts");
    let pid = prometheus.pid().expect("prometheus runs");
    let url = prometheus.remote_write_url();
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let labels = labels(flags.series, flags.labels == "minimal");
    let now_ms = tessera_core::clock::now_ms();
    let mut timestamp_ms = (now_ms - 30 * 60_000) / 10_000 * 10_000;
    let mut value = 0.0;
    let gap = Duration::from_secs(flags.gap_secs);
    println!("series {}, labels {}, bursts per pair {}, gap {:?}", flags.series, flags.labels, flags.bursts, gap);
    println!(
        "samples/request | in flight | wall s | samples/s | prometheus cpu-s at last ack | prometheus cpu-s incl. gap | µs cpu/sample | sender cpu-s"
    );
    let mut runs = vec![(flags.sizes[0], flags.concurrency[0], true)];
    for &size in &flags.sizes {
        for &concurrency in &flags.concurrency {
            for _ in 0..flags.bursts {
                runs.push((size, concurrency, false));
            }
        }
    }
    for (size, concurrency, first) in runs {
        timestamp_ms += 10_000;
        value += 1.0;
        let bodies = bodies(&labels, value, timestamp_ms, size);
        let (prometheus_before, own_before) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
        let wall = post_all(&client, &url, bodies, concurrency).await;
        let (prometheus_at_ack, own) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
        tokio::time::sleep(gap).await;
        let prometheus_with_gap = cpu_seconds(pid);
        let cpu_at_ack = prometheus_at_ack - prometheus_before;
        let cpu_total = prometheus_with_gap - prometheus_before;
        println!(
            "{size:>15} | {concurrency:>9} | {:>6.2} | {:>9.0} | {cpu_at_ack:>28.2} | {cpu_total:>26.2} | {:>13.2} | {:>12.2}{}",
            wall.as_secs_f64(),
            flags.series as f64 / wall.as_secs_f64(),
            cpu_total * 1e6 / flags.series as f64,
            own - own_before,
            if first { "  (creates the series)" } else { "" },
        );
    }
}
