use std::sync::Arc;

use tessera_core::aggregate::Distribution;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::queue::segment::RequestKey;
use crate::record::StoredSample;
use crate::sink::RecordInfo;

fn text(naming: &InfluxNaming, id: &str, value: TileValue<'_>) -> (String, Changes) {
    let mut out = String::new();
    let mut changes = Changes::default();
    let tile = Tile { id: id.as_bytes(), value, interval_secs: 10.0, timer_scale: 1000.0 };
    naming.write(&tile, 1_700_000_010_000, &mut out, &mut changes);
    (out, changes)
}

#[test]
fn points_are_named_as_telegrafs_statsd_input_writes_them() {
    let naming = InfluxNaming::default();
    let (counter, _) = text(&naming, "api.hits|#env:prod,route:/users", TileValue::Counter(300.0));
    assert_eq!(counter, "api_hits,env=prod,metric_type=counter,route=/users value=300i 1700000010000\n");
    let (gauge, _) = text(&naming, "queue.depth", TileValue::Gauge(42.5));
    assert_eq!(gauge, "queue_depth,metric_type=gauge value=42.5 1700000010000\n");
    let (set, _) = text(&naming, "users", TileValue::Set(3.0));
    assert_eq!(set, "users,metric_type=set value=3i 1700000010000\n");
    let mut timings = Distribution::default();
    for ms in (1..=10).map(|n| f64::from(n) * 100.0) {
        timings.insert(ms / 1000.0, 1.0);
    }
    let (timer, _) = text(&naming, "api.latency", TileValue::Distribution(MetricKind::Timer, &timings));
    let (head, fields) = timer.split_once(' ').unwrap();
    assert_eq!(head, "api_latency,metric_type=timing");
    let fields: std::collections::BTreeMap<&str, &str> =
        fields.split(' ').next().unwrap().split(',').map(|field| field.split_once('=').unwrap()).collect();
    assert_eq!(fields["count"], "10i");
    assert_eq!((fields["lower"], fields["upper"], fields["sum"], fields["mean"]), ("100", "1000", "5500", "550"));
    let stddev: f64 = fields["stddev"].parse().unwrap();
    assert!((stddev - 82_500f64.sqrt()).abs() < 1e-6, "population, in ms: {stddev}");
    let p90: f64 = fields["90_percentile"].parse().unwrap();
    assert!((p90 - 900.0).abs() <= 900.0 * 0.011, "{p90}");
    assert!(fields.contains_key("median"));
    assert_eq!(fields.len(), 8, "{fields:?}");
}

#[test]
fn names_and_tags_are_escaped_and_empty_tags_dropped() {
    let naming = InfluxNaming::default();
    let (line, changes) = text(&naming, "disk used,x|#mount:/a b,k=v:1,empty:,bare", TileValue::Gauge(1.0));
    assert_eq!(line, "disk\\ used\\,x,bare=true,k\\=v=1,metric_type=gauge,mount=/a\\ b value=1 1700000010000\n");
    assert_eq!(changes.tags_dropped, 1, "`empty:`");
    let (line, changes) = text(&naming, "x|#metric_type:mine", TileValue::Counter(1.0));
    assert_eq!(line, "x,metric_type=counter value=1i 1700000010000\n", "Telegraf's own tag wins");
    assert_eq!(changes.tags_dropped, 1);
}

#[test]
fn endpoints_of_both_apis() {
    assert_eq!(endpoint("http://db:8086/", false, "telegraf", ""), "http://db:8086/write?db=telegraf&precision=ms");
    assert_eq!(
        endpoint("http://db:8086/influx", false, "a b", "two weeks"),
        "http://db:8086/influx/write?db=a%20b&rp=two%20weeks&precision=ms"
    );
    assert_eq!(
        endpoint("https://cloud", true, "metrics", "acme & co"),
        "https://cloud/api/v2/write?org=acme%20%26%20co&bucket=metrics&precision=ms"
    );
}

/// Answers each request with the next of `answers` (status line and headers); returns the
/// address and what it received.
async fn server(answers: Vec<&'static str>) -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for answer in answers {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0; 4096];
            loop {
                let read = stream.read(&mut buffer).await.unwrap();
                request.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&request).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length: usize = head
                        .lines()
                        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_owned))
                        .map_or(0, |value| value.trim().parse().unwrap());
                    if body.len() >= length {
                        log.lock().unwrap().push(text);
                        break;
                    }
                }
            }
            let body = "{\"error\":\"refused\"}";
            let response = format!("{answer}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            stream.write_all(response.as_bytes()).await.unwrap();
        }
    });
    (address, seen)
}

fn sink(address: std::net::SocketAddr, authorization: Option<&'static str>) -> InfluxSink {
    InfluxSink::new(InfluxSettings {
        url: endpoint(&format!("http://{address}"), false, "tessera", "").parse().unwrap(),
        destination: "database `tessera`".into(),
        authorization: authorization.map(HeaderValue::from_static),
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        max_idle_connections: 1,
    })
    .unwrap()
}

fn request(lines: &str) -> SinkRequest {
    let record = Arc::new(RecordInfo {
        storage_policy: "10s:2d".into(),
        resolution: "10s".into(),
        tile_end_ms: 1_700_000_010_000,
        received_at_ms: 0,
        tiles: 1,
        position: Default::default(),
    });
    let sample = StoredSample { lines: Bytes::copy_from_slice(lines.as_bytes()), ..Default::default() };
    SinkRequest { record, samples: vec![sample], key: RequestKey { shard: 0, chunk: 0, fingerprint: 0 } }
}

#[tokio::test]
async fn answers_become_written_refused_for_good_or_retried() {
    let (address, seen) = server(vec![
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 400 Bad Request",
        "HTTP/1.1 401 Unauthorized",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7",
        "HTTP/1.1 503 Service Unavailable",
    ])
    .await;
    let sink = sink(address, Some("Basic dTpw"));
    let point = "a,metric_type=gauge value=1 1700000010000\n";
    sink.write(&request(point)).await.unwrap();
    let request_text = seen.lock().unwrap()[0].clone();
    assert!(request_text.starts_with("POST /write?db=tessera&precision=ms HTTP/1.1\r\n"), "{request_text}");
    assert!(request_text.to_ascii_lowercase().contains("authorization: basic dtpw"), "{request_text}");
    assert!(request_text.ends_with(point), "{request_text}");
    let outcomes: Vec<SinkError> = [
        sink.write(&request(point)).await.unwrap_err(),
        sink.write(&request(point)).await.unwrap_err(),
        sink.write(&request(point)).await.unwrap_err(),
        sink.write(&request(point)).await.unwrap_err(),
        sink.write(&request(point)).await.unwrap_err(),
    ]
    .into();
    assert!(
        matches!(&outcomes[0], SinkError::Permanent { status: 400, message } if message.contains("refused")),
        "{:?}",
        outcomes[0]
    );
    assert!(matches!(&outcomes[1], SinkError::Retryable { reason: "unauthorized", .. }), "{:?}", outcomes[1]);
    assert!(
        matches!(&outcomes[2], SinkError::Retryable { reason: "not_found", message, .. } if message.contains("database `tessera` does not exist")),
        "{:?}",
        outcomes[2]
    );
    assert!(
        matches!(&outcomes[3], SinkError::RetryAfter { reason: "status_429", after, .. } if *after == Duration::from_secs(7)),
        "{:?}",
        outcomes[3]
    );
    assert!(
        matches!(&outcomes[4], SinkError::Retryable { reason: "status_5xx", overloaded: true, .. }),
        "{:?}",
        outcomes[4]
    );
}
