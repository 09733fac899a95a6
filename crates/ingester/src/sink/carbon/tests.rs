use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use super::*;
use crate::queue::segment::RequestKey;
use crate::record::StoredSample;
use crate::sink::RecordInfo;

fn settings(address: String, protocol: Protocol) -> CarbonSettings {
    CarbonSettings {
        address,
        protocol,
        connect_timeout: Duration::from_secs(2),
        write_timeout: Duration::from_secs(2),
        resend_window: Duration::from_secs(60),
        resend_window_bytes: 1 << 20,
    }
}

/// A request of one sample per text, each a series' lines.
fn request(texts: &[&str]) -> SinkRequest {
    let record = Arc::new(RecordInfo {
        storage_policy: "10s:2d".into(),
        resolution: "10s".into(),
        tile_end_ms: 1_700_000_010_000,
        received_at_ms: 1_700_000_011_000,
        tiles: texts.len() as u32,
        position: Default::default(),
    });
    let samples = texts
        .iter()
        .map(|text| StoredSample { lines: Bytes::copy_from_slice(text.as_bytes()), ..Default::default() })
        .collect();
    SinkRequest { record, samples, key: RequestKey { shard: 0, chunk: 0, fingerprint: 0 } }
}

/// Reads what one connection sends until it has `bytes` bytes.
async fn read_exactly(stream: &mut TcpStream, bytes: usize) -> String {
    let mut buffer = vec![0; bytes];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut buffer)).await.unwrap().unwrap();
    String::from_utf8(buffer).unwrap()
}

#[tokio::test]
async fn requests_go_out_as_plaintext_lines_on_one_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = CarbonMetrics::default();
    let sink =
        CarbonSink::new(settings(listener.local_addr().unwrap().to_string(), Protocol::Plaintext), metrics.clone());
    let first = "a.count 5 1700000010\na.rate 0.5 1700000010\n";
    let second = "b 42 1700000010\n";
    sink.write(&request(&[first, second])).await.unwrap();
    sink.write(&request(&[second])).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    let text = read_exactly(&mut stream, first.len() + 2 * second.len()).await;
    assert_eq!(text, format!("{first}{second}{second}"));
    assert_eq!(metrics.lines.get(), 4);
    assert_eq!(metrics.connections.get(), 1);
    assert_eq!(metrics.resends.get(), 0);
}

#[tokio::test]
async fn after_carbon_closes_the_connection_the_window_goes_out_again_before_new_lines() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = CarbonMetrics::default();
    let sink =
        CarbonSink::new(settings(listener.local_addr().unwrap().to_string(), Protocol::Plaintext), metrics.clone());
    let old = "old.count 1 1700000010\n";
    sink.write(&request(&[old])).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    assert_eq!(read_exactly(&mut stream, old.len()).await, old);
    // Carbon restarts: it read the line, and may have lost it from its cache.
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let new = "new.count 2 1700000020\n";
    sink.write(&request(&[new])).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    assert_eq!(read_exactly(&mut stream, old.len() + new.len()).await, format!("{old}{new}"), "the window first");
    assert_eq!(metrics.connections.get(), 2);
    assert_eq!(metrics.resends.get(), 1);
    assert_eq!(metrics.resent_lines.get(), 1);
    assert_eq!(metrics.lines.get(), 3);
}

#[tokio::test]
async fn a_refused_connection_is_retryable_and_the_request_goes_out_once_carbon_is_up() {
    // A port nothing listens on: bind, note it, close.
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let metrics = CarbonMetrics::default();
    let sink = CarbonSink::new(settings(address.to_string(), Protocol::Plaintext), metrics.clone());
    let line = "a 1 1700000010\n";
    let error = sink.write(&request(&[line])).await.unwrap_err();
    assert!(matches!(error, SinkError::Retryable { reason: "network", .. }), "{error:?}");
    assert_eq!(metrics.errors.get(), 1);
    assert_eq!(metrics.lines.get(), 0);
    let listener = TcpListener::bind(address).await.unwrap();
    sink.write(&request(&[line])).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    assert_eq!(read_exactly(&mut stream, line.len()).await, line, "once: nothing was in the window");
    assert_eq!(metrics.resends.get(), 0);
}

#[tokio::test]
async fn the_window_forgets_its_oldest_past_its_size_and_counts_them() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = CarbonMetrics::default();
    let mut settings = settings(listener.local_addr().unwrap().to_string(), Protocol::Plaintext);
    let line = "a 1 1700000010\n";
    settings.resend_window_bytes = 2 * line.len();
    let sink = CarbonSink::new(settings, metrics.clone());
    for _ in 0..3 {
        sink.write(&request(&[line])).await.unwrap();
    }
    assert_eq!(metrics.window_bytes.get(), 2 * line.len() as i64);
    assert_eq!(metrics.window_evicted_bytes.get(), line.len() as u64);
}

#[tokio::test]
async fn pickle_frames_hold_the_lines_points() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = CarbonSink::new(
        settings(listener.local_addr().unwrap().to_string(), Protocol::Pickle),
        CarbonMetrics::default(),
    );
    sink.write(&request(&["a.b 1.5 1700000010\n"])).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut length = [0; 4];
    stream.read_exact(&mut length).await.unwrap();
    let mut frame = vec![0; u32::from_be_bytes(length) as usize];
    stream.read_exact(&mut frame).await.unwrap();
    let mut expected = vec![0x80, 2, b']', b'(', b'X', 3, 0, 0, 0, b'a', b'.', b'b', b'J'];
    expected.extend_from_slice(&1_700_000_010i32.to_le_bytes());
    expected.push(b'G');
    expected.extend_from_slice(&1.5f64.to_be_bytes());
    expected.extend_from_slice(&[0x86, 0x86, b'e', b'.']);
    assert_eq!(frame, expected);
}

#[test]
fn pickle_splits_frames_and_skips_lines_it_cannot_read() {
    let mut text = String::new();
    for n in 0..(PICKLE_POINTS_PER_FRAME + 1) {
        text.push_str(&format!("p{n} {n} 1700000010\n"));
    }
    text.push_str("not a line\n");
    let bytes = pickle::frames(text.as_bytes());
    let first = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    let second = u32::from_be_bytes(bytes[4 + first..8 + first].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 8 + first + second, "two frames, nothing else");
    assert_eq!(bytes[8 + first + second - 2..], *b"e.");
}
