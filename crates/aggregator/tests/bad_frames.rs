//! A frame the aggregator cannot trust after a good handshake (bytes that are no frame, a
//! frame of the wrong kind, a frame without a body, a length over the maximum) closes its
//! connection only, after a `Permanent` ack that says why (the wire's one policy, the same
//! at the ingester), and the wire counts why (`frame_errors_total{reason}`).

mod support;

use std::time::Duration;

use support::{TileReceiver, connect_collector, empty_batch, metric_value, test_config, wait_until};
use tessera_aggregator::Aggregator;
use tessera_proto::framing::{self, DEFAULT_MAX_FRAME_BYTES};
use tessera_proto::{Ack, AckStatus, Frame, frame::Body};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_topology::{Placement, PlacementHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The refusal the aggregator sends before it closes: `Permanent`, sequence 0, `reason`.
async fn expect_refusal(stream: &mut TcpStream, reason: &str) {
    let mut scratch = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        framing::read_frame(stream, &mut scratch, DEFAULT_MAX_FRAME_BYTES),
    )
    .await
    .expect("an answer within 5 s");
    let Ok(Frame { body: Some(Body::Ack(ack)) }) = read else { panic!("expected an ack, got {read:?}") };
    assert_eq!((ack.status, ack.sequence, ack.reason.as_str()), (AckStatus::Permanent as i32, 0, reason), "{ack:?}");
}

/// Reads until the aggregator closes the connection; panics if it does not within 5 s.
async fn expect_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "the connection was not closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_cannot_be_trusted_closes_its_connection_and_is_counted_by_reason() {
    let receiver = TileReceiver::start().await;
    let telemetry = Telemetry::new("aggregator", "test");
    let shutdown = Shutdown::new();
    let config = test_config("agg-1", &receiver.address.to_string(), &["1s:1h"], 1);
    let own = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:1")], 8, 1, 0).unwrap());
    let aggregator = Aggregator::start_with_placement(config, own, telemetry.clone(), shutdown.clone()).await.unwrap();
    let address = aggregator.listen_addr();
    let counted = |reason: &str| {
        metric_value(&telemetry, "tessera_aggregator_frame_errors_total", &format!("reason=\"{reason}\""))
    };
    assert_eq!(counted("malformed_frame"), Some(0.0), "every reason is exported from the start");

    // A length prefix, then bytes that are no protobuf frame.
    let mut garbage = connect_collector(address, "garbage-host").await;
    garbage.write_all(&[0, 0, 0, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    expect_refusal(&mut garbage, "malformed_frame").await;
    expect_closed(&mut garbage).await;
    // A well-formed frame of a kind a collector never sends.
    let mut confused = connect_collector(address, "confused-host").await;
    let ack = Frame { body: Some(Body::Ack(Ack { sequence: 3, ..Ack::default() })) };
    framing::write_frame(&mut confused, &ack, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
    expect_refusal(&mut confused, "unexpected_frame").await;
    expect_closed(&mut confused).await;
    // A frame without a body.
    let mut empty = connect_collector(address, "empty-host").await;
    framing::write_frame(&mut empty, &Frame { body: None }, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
    expect_refusal(&mut empty, "malformed_frame").await;
    expect_closed(&mut empty).await;
    // A declared length over the maximum: refused before its body is read.
    let mut oversized = connect_collector(address, "oversized-host").await;
    oversized.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
    expect_refusal(&mut oversized, "frame_too_large").await;
    expect_closed(&mut oversized).await;
    wait_until("every close to be counted", Duration::from_secs(5), || {
        ["malformed_frame", "unexpected_frame", "empty", "too_large"].iter().all(|reason| counted(reason) == Some(1.0))
    })
    .await;

    // A good connection is unaffected: its batch is acknowledged.
    let mut good = connect_collector(address, "good-host").await;
    framing::write_frame(&mut good, &empty_batch("good-host", 1), DEFAULT_MAX_FRAME_BYTES).await.unwrap();
    let mut scratch = Vec::new();
    let answer = framing::read_frame(&mut good, &mut scratch, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
    assert!(matches!(&answer.body, Some(Body::Ack(ack)) if ack.sequence == 1), "{answer:?}");
    assert_eq!(counted("malformed_frame"), Some(1.0), "counted once");
    assert_eq!(counted("unexpected_frame"), Some(1.0), "counted once");
    shutdown.trigger();
    aggregator.wait().await;
}
