//! Remote write to the stores teams run in production, for real: Prometheus behind
//! `--web.config.file` (HTTPS and basic auth), VictoriaMetrics behind `-tls` and
//! `-httpAuth.*`, and a recording front for headers, tenants and rotating tokens.
//! Certificates are made in the test (rcgen).

mod support {
    pub use tessera_testkit::prometheus;
    pub mod wire;
}

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::prometheus::Prometheus;
use support::wire::{
    Sender, batch, counter, gauge, metric_value, recent_tile_end_ms, start_ingester, timer, wait_until,
};
use tessera_ingester::Ingester;
use tessera_proto::AckStatus;
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::tls::{Pki, TEST_PASSWORD};
use tessera_testkit::victoria::VictoriaMetrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An ingester writing everything to `sink` (the TOML of its `[sink]` table, `kind` and
/// `url` included), with its telemetry registry.
async fn start_with_sink(data: &Path, sink: &str) -> (Ingester, Telemetry, Shutdown, Sender) {
    start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[pool]\nworkers = 2\nretry_initial_backoff_ms = 20\n\
         retry_max_backoff_ms = 200\n[sink]\n{sink}\n",
        data.display()
    ))
    .await
}

/// Three tiles of a counter and a gauge, acknowledged: what every store must hold exactly.
async fn send_three_tiles(sender: &mut Sender, t0: i64) {
    for i in 0..3u32 {
        let tiles = vec![counter("api.hits|#env:prod", f64::from(i + 1)), gauge("temp|#room:1", 20.0 + f64::from(i))];
        let ack = sender.send(batch(u64::from(i), "10s:2d", t0 + i64::from(i) * 10_000, tiles)).await;
        assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    }
}

fn value(result: &Value) -> f64 {
    let series = result.as_array().expect("a result array");
    assert_eq!(series.len(), 1, "one series expected: {result}");
    series[0]["value"][1].as_str().unwrap().parse().unwrap()
}

fn tls_sink(url: &str, ca: &Path, password_file: &Path) -> String {
    format!(
        "kind = \"remote_write\"\nurl = \"{url}\"\n[sink.tls]\nca_file = \"{}\"\n[sink.basic_auth]\n\
         username = \"tessera\"\npassword_file = \"{}\"\n",
        ca.display(),
        password_file.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_over_https_with_basic_auth_gets_exact_values_and_refusals_are_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Arc::new(Pki::create(dir.path()));
    let store = pki.clone();
    let prometheus = tokio::task::spawn_blocking(move || Prometheus::start_secure(&store)).await.unwrap();
    let store_ca = pki.ca.clone();
    let password = dir.path().join("password");
    std::fs::write(&password, format!("{TEST_PASSWORD}\n")).unwrap();
    let url = prometheus.remote_write_url();
    assert!(url.starts_with("https://"), "{url}");

    // The right CA and password: exact values over HTTPS.
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, _shutdown, mut sender) =
        start_with_sink(data.path(), &tls_sink(&url, &store_ca, &password)).await;
    let t0 = recent_tile_end_ms(10);
    send_three_tiles(&mut sender, t0).await;
    wait_until("the queue to drain over https", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    let at = (t0 + 20_000) as f64 / 1000.0;
    assert_eq!(value(&prometheus.query(r#"api_hits_total{env="prod"}"#, at)), 6.0);
    assert_eq!(value(&prometheus.query(r#"temp{room="1"}"#, at)), 22.0);
    let text = telemetry.encode().unwrap();
    assert_eq!(metric_value(&text, "tessera_ingester_samples_written_total", r#"target="default""#), 6.0);

    // A wrong password: refused (401), counted, retried; never acknowledged as written.
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password").unwrap();
    refused_and_kept(&prometheus, &tls_sink(&url, &store_ca, &wrong), "unauthorized", t0 + 30_000).await;
    // A server certificate from a CA we do not trust: the handshake fails, counted as tls.
    refused_and_kept(&prometheus, &tls_sink(&url, &pki.other_ca, &password), "tls", t0 + 40_000).await;
}

/// Sends one counter at `tile_end_ms` to an ingester writing to `sink`: storage refuses
/// every request with `outcome` (counted, retried), the sample waits in the queue and
/// never reaches Prometheus, and nothing is counted as written or rejected for good.
async fn refused_and_kept(prometheus: &Prometheus, sink: &str, outcome: &str, tile_end_ms: i64) {
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, _shutdown, mut sender) = start_with_sink(data.path(), sink).await;
    let ack = sender.send(batch(0, "10s:2d", tile_end_ms, vec![counter("refused.hits", 1.0)])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "the batch is durable: {ack:?}");
    let labels = format!(r#"target="default",outcome="{outcome}""#);
    let refusals = || metric_value(&telemetry.encode().unwrap(), "tessera_ingester_sink_requests_total", &labels);
    wait_until(&format!("two requests refused as {outcome}"), Duration::from_secs(30), || refusals() >= 2.0).await;
    let text = telemetry.encode().unwrap();
    assert_eq!(metric_value(&text, "tessera_ingester_samples_written_total", r#"target="default""#), 0.0);
    let rejected = text.lines().filter(|line| line.starts_with("tessera_ingester_sink_rejected_samples_total"));
    assert!(rejected.clone().all(|line| line.ends_with(" 0")), "{:?}", rejected.collect::<Vec<_>>());
    assert_eq!(ingester.pending_records(), 1, "the refused record waits in the queue");
    assert_eq!(prometheus.query("refused_hits_total", tile_end_ms as f64 / 1000.0), Value::Array(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn victoria_metrics_over_https_with_basic_auth_gets_exact_values() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let ca = pki.ca.clone();
    let victoria = tokio::task::spawn_blocking(move || VictoriaMetrics::start_secure(&pki)).await.unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, TEST_PASSWORD).unwrap();
    let data = tempfile::tempdir().unwrap();
    let sink = tls_sink(&victoria.remote_write_url(), &ca, &password);
    let (ingester, _telemetry, _shutdown, mut sender) = start_with_sink(data.path(), &sink).await;
    let t0 = recent_tile_end_ms(10);
    send_three_tiles(&mut sender, t0).await;
    wait_until("the queue to drain over https", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    victoria.force_flush();
    let at = (t0 + 20_000) as f64 / 1000.0;
    let hits = || victoria.query(r#"api_hits_total{env="prod"}"#, at);
    wait_until("VictoriaMetrics to answer for api_hits_total", Duration::from_secs(20), || {
        victoria.force_flush();
        hits().as_array().is_some_and(|series| !series.is_empty())
    })
    .await;
    assert_eq!(value(&hits()), 6.0);
    assert_eq!(value(&victoria.query(r#"temp{room="1"}"#, at)), 22.0);
}

/// One request a recording front received: its headers (lower-case names).
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    /// The body, uncompressed (snappy block format, as remote write sends it).
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// A plain HTTP/1.1 front that answers every request 204 and records it.
async fn recording_front() -> (SocketAddr, Arc<Mutex<Vec<Received>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    // Read one request: the head, then Content-Length bytes of body.
                    let head_end = loop {
                        if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                            break at;
                        }
                        let mut chunk = [0u8; 8192];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
                    let headers: Vec<(String, String)> = head
                        .lines()
                        .skip(1)
                        .filter_map(|line| line.split_once(':'))
                        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
                        .collect();
                    let length: usize = headers
                        .iter()
                        .find(|(name, _)| name == "content-length")
                        .and_then(|(_, value)| value.parse().ok())
                        .unwrap_or(0);
                    while buffer.len() < head_end + 4 + length {
                        let mut chunk = [0u8; 8192];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = snap::raw::Decoder::new()
                        .decompress_vec(&buffer[head_end + 4..head_end + 4 + length])
                        .unwrap_or_default();
                    buffer.drain(..head_end + 4 + length);
                    log.lock().unwrap().push(Received { headers, body });
                    if stream.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (address, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_carries_the_headers_its_tenant_and_the_current_token() {
    let (front, received) = recording_front().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let sink = format!(
        "kind = \"remote_write\"\nurl = \"http://{front}/api/v1/write\"\nbearer_token_file = \"{}\"\n\
         tenant_label = \"team\"\nheaders = {{ \"X-Scope-OrgID\" = \"shared\", \"X-Extra\" = \"yes\" }}\n",
        token.display()
    );
    let data = tempfile::tempdir().unwrap();
    let (ingester, _telemetry, _shutdown, mut sender) = start_with_sink(data.path(), &sink).await;
    let t0 = recent_tile_end_ms(10);
    let tiles = vec![
        counter("hits|#team:a", 1.0),
        counter("hits|#team:b", 2.0),
        counter("other.hits|#team:a", 3.0),
        counter("untagged.hits", 4.0),
    ];
    assert_eq!(sender.send(batch(0, "10s:2d", t0, tiles)).await.status, AckStatus::Ok as i32);
    wait_until("the first batch to be written", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    let first: Vec<Received> = received.lock().unwrap().drain(..).collect();
    let mut tenants: Vec<&str> = first.iter().map(|request| request.header("x-scope-orgid").unwrap_or("-")).collect();
    tenants.sort_unstable();
    // Each worker's share of the record goes out as one request per tenant in it.
    let requests = tenants.len();
    tenants.dedup();
    assert_eq!(tenants, ["a", "b", "shared"], "untagged series go with the configured header");
    assert!(requests <= 2 * tenants.len(), "{requests} requests");
    for request in &first {
        assert_eq!(request.header("authorization"), Some("Bearer first-token"), "{request:?}");
        assert_eq!(request.header("x-extra"), Some("yes"), "{request:?}");
    }

    // The token rotates on disk: the next request carries the new one, without a restart.
    std::fs::write(&token, "second-token-rotated").unwrap();
    let ack = sender.send(batch(1, "10s:2d", t0 + 10_000, vec![counter("hits|#team:a", 1.0)])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32, "{ack:?}");
    wait_until("the second batch to be written", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    let second: Vec<Received> = received.lock().unwrap().drain(..).collect();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(second[0].header("authorization"), Some("Bearer second-token-rotated"));
    assert_eq!(second[0].header("x-scope-orgid"), Some("a"));
}

/// Remote write's metadata, on by default: every family the target writes, with its type,
/// help (the mapping file's where it has one) and unit, in requests of their own once an
/// interval, never inside the sample requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_family_s_type_help_and_unit_go_out_in_metadata_requests_of_their_own() {
    use prost::Message;
    use tessera_ingester::prompb::WriteRequest;
    let (front, received) = recording_front().await;
    let dir = tempfile::tempdir().unwrap();
    let mapping = dir.path().join("mapping.yml");
    std::fs::write(&mapping, "mappings:\n- match: api.latency\n  name: api_latency\n  help: Latency of the API.\n")
        .unwrap();
    let (ingester, telemetry, _shutdown, mut sender) = start_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[mapping]\nfile = \"{}\"\n\
         [sink]\nkind = \"remote_write\"\nurl = \"http://{front}/api/v1/write\"\nhistograms = \"summary\"\n\
         metadata_interval_secs = 1\n",
        dir.path().display(),
        mapping.display()
    ))
    .await;
    let tiles = vec![counter("api.hits|#env:prod", 1.0), gauge("temp", 20.0), timer("api_latency", &[0.2, 0.4])];
    let t0 = recent_tile_end_ms(10);
    assert_eq!(sender.send(batch(0, "10s:2d", t0, tiles)).await.status, AckStatus::Ok as i32);
    wait_until("the batch to be written", Duration::from_secs(30), || ingester.pending_records() == 0).await;
    let metadata_requests = || {
        received
            .lock()
            .unwrap()
            .iter()
            .map(|request| WriteRequest::decode(request.body.as_slice()).expect("a WriteRequest"))
            .filter(|request| !request.metadata.is_empty())
            .collect::<Vec<WriteRequest>>()
    };
    wait_until("a metadata request", Duration::from_secs(10), || !metadata_requests().is_empty()).await;
    let requests = received.lock().unwrap().len();
    for request in metadata_requests() {
        assert!(request.timeseries.is_empty(), "metadata goes in requests of its own");
    }
    let request = metadata_requests().remove(0);
    let entries: Vec<(i32, &str, &str, &str)> = request
        .metadata
        .iter()
        .map(|entry| (entry.r#type, entry.metric_family_name.as_str(), entry.help.as_str(), entry.unit.as_str()))
        .collect();
    let counter_help = "statsd counter (c), written by tessera";
    let gauge_help = "statsd gauge (g), set (s), or a timer's min or max, written by tessera";
    assert_eq!(
        entries,
        [
            (1, "api_hits", counter_help, ""),
            (5, "api_latency", "Latency of the API.", "seconds"),
            (2, "api_latency_max", gauge_help, "seconds"),
            (2, "api_latency_min", gauge_help, "seconds"),
            (2, "temp", gauge_help, ""),
        ]
    );
    // Once an interval: the next round comes a second later, the same families again.
    wait_until("a second metadata request", Duration::from_secs(10), || metadata_requests().len() >= 2).await;
    assert!(received.lock().unwrap().len() > requests);
    let text = telemetry.encode().unwrap();
    assert!(metric_value(&text, "tessera_ingester_metadata_requests_total", "target=\"default\"") >= 2.0);
    assert_eq!(metric_value(&text, "tessera_ingester_metadata_families", "target=\"default\""), 5.0);
}
