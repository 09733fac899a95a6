//! The wire listener under bad input: garbage and oversized frames close their own
//! connection with a clear answer, and nothing else is affected.

mod support {
    pub mod wire;
}

use std::time::Duration;

use support::wire::{
    Sender, batch, counter, metric_value, recent_tile_end_ms, start_ingester, start_unconnected_ingester,
};
use tessera_ingester::Ingester;
use tessera_proto::{AckStatus, Frame, PartialBatch, frame::Body};
use tessera_runtime::{Shutdown, Telemetry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(data_dir: &std::path::Path) -> (Ingester, Telemetry, Shutdown) {
    start_unconnected_ingester(&format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nmax_frame_bytes = 65536\n",
        data_dir.display()
    ))
    .await
}

/// Reads until the peer closes; panics if it does not within 10 s.
async fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection was not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_connection() {
    let data = tempfile::tempdir().unwrap();
    let (ingester, telemetry, shutdown) = start(data.path()).await;
    let t0 = recent_tile_end_ms(5);

    let mut good = Sender::connect(ingester.listen_addr()).await;
    let ack = good.send(batch(1, "10s:2d", t0, vec![counter("a", 1.0)])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32);

    // Garbage after the handshake: a length prefix, then bytes that are no protobuf.
    let mut garbage = Sender::connect(ingester.listen_addr()).await;
    garbage.stream.write_all(&[0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    let ack = garbage.read_ack().await.expect("an explanation before the close");
    assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Permanent as i32, "malformed_frame"));
    assert!(ack.message.contains("malformed frame of 6 bytes"), "{}", ack.message);
    expect_closed(&mut garbage.stream).await;

    // A declared length over max_frame_bytes: refused before the body is read.
    let mut oversized = Sender::connect(ingester.listen_addr()).await;
    oversized.stream.write_all(&(10_000_000u32).to_be_bytes()).await.unwrap();
    let ack = oversized.read_ack().await.expect("an explanation before the close");
    assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Permanent as i32, "frame_too_large"));
    assert_eq!(ack.message, "frame of 10000000 bytes exceeds the maximum of 65536 bytes");
    expect_closed(&mut oversized.stream).await;

    // No handshake at all.
    let mut rude = TcpStream::connect(ingester.listen_addr()).await.unwrap();
    rude.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    expect_closed(&mut rude).await;

    // A frame of the wrong kind, and one without a body: the wire's one policy, a refusal
    // for sequence 0, then the close.
    let mut wrong_kind = Sender::connect(ingester.listen_addr()).await;
    let partials = Frame { body: Some(Body::Partials(PartialBatch { sequence: 9, ..Default::default() })) };
    let ack = wrong_kind.exchange(&partials).await;
    assert_eq!((ack.status, ack.sequence, ack.reason.as_str()), (AckStatus::Permanent as i32, 0, "unexpected_frame"));
    assert!(ack.message.contains("not `partials` frames"), "{}", ack.message);
    expect_closed(&mut wrong_kind.stream).await;
    let mut empty = Sender::connect(ingester.listen_addr()).await;
    let ack = empty.exchange(&Frame { body: None }).await;
    assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Permanent as i32, "malformed_frame"));
    expect_closed(&mut empty.stream).await;

    // The first connection is unaffected: a new batch, a resent one, an invalid one.
    let ack = good.send(batch(2, "10s:2d", t0 + 10_000, vec![counter("a", 1.0)])).await;
    assert_eq!((ack.status, ack.sequence), (AckStatus::Ok as i32, 2));
    let ack = good.send(batch(2, "10s:2d", t0 + 10_000, vec![counter("a", 1.0)])).await;
    assert_eq!(
        (ack.status, ack.reason.as_str()),
        (AckStatus::Ok as i32, "duplicate"),
        "a resent batch is not queued twice"
    );
    let mut no_policy = batch(3, "", t0, vec![counter("a", 1.0)]);
    no_policy.resolution_ms = 0;
    let ack = good.send(no_policy).await;
    assert_eq!((ack.status, ack.reason.as_str()), (AckStatus::Permanent as i32, "invalid_batch"));
    let ack = good.send(batch(4, "10s:2d", t0 + 20_000, vec![counter("a", 1.0)])).await;
    assert_eq!(ack.status, AckStatus::Ok as i32);

    let text = telemetry.encode().unwrap();
    for reason in ["malformed_frame", "too_large", "handshake", "unexpected_frame", "empty"] {
        assert_eq!(
            metric_value(&text, "tessera_ingester_frame_errors_total", &format!("reason=\"{reason}\"")),
            1.0,
            "{reason}\n{text}"
        );
    }
    assert_eq!(metric_value(&text, "tessera_ingester_batch_acks_total", r#"status="ok",reason="duplicate""#), 1.0);
    assert_eq!(metric_value(&text, "tessera_ingester_samples_queued_total", ""), 3.0);
    shutdown.trigger();
    ingester.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_cap_is_refused_at_once_and_counted() {
    let data = tempfile::tempdir().unwrap();
    let config = format!("listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nmax_connections = 2\n", data.path().display());
    // Two handshaken connections that then say nothing hold both slots.
    let (ingester, telemetry, shutdown, first) = start_ingester(&config).await;
    let _second = Sender::connect(ingester.listen_addr()).await;
    // A third is closed at once (before its handshake), not left waiting.
    let mut third = TcpStream::connect(ingester.listen_addr()).await.unwrap();
    expect_closed(&mut third).await;
    let refused = || {
        metric_value(
            &telemetry.encode().unwrap(),
            "tessera_ingester_frame_errors_total",
            r#"reason="too_many_connections""#,
        )
    };
    assert_eq!(refused(), 1.0);
    // A slot freed is a slot taken: a new aggregator connects and is served.
    drop(first);
    let mut accepted = None;
    for _ in 0..50 {
        let mut stream = TcpStream::connect(ingester.listen_addr()).await.unwrap();
        if tessera_proto::framing::client_handshake(&mut stream, tessera_proto::Role::Aggregator, "late").await.is_ok()
        {
            accepted = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(accepted.is_some(), "no connection accepted after a slot was freed");
    shutdown.trigger();
    ingester.wait().await;
}
