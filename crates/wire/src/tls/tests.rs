use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls::ClientConfig;
use tessera_proto::Role;
use tessera_runtime::Shutdown;
use tessera_testkit::tls::Pki;

use super::*;
use crate::client::{self, ClientTls};
use crate::inbound::{ListenerSettings, WireConnection, WireError};

/// Certificates made for this test, in a directory removed when the first value drops.
fn pki() -> (tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    (dir, pki)
}

fn client(pki: &Pki, ca: &Path, with_cert: bool) -> ClientTlsConfig {
    ClientTlsConfig {
        ca_file: Some(ca.to_owned()),
        cert_file: with_cert.then(|| pki.client_cert.clone()),
        key_file: with_cert.then(|| pki.client_key.clone()),
        ..ClientTlsConfig::default()
    }
}

fn server(pki: &Pki, require_client_cert: bool) -> ServerTlsConfig {
    ServerTlsConfig {
        cert_file: Some(pki.server_cert.clone()),
        key_file: Some(pki.server_key.clone()),
        client_ca_file: require_client_cert.then(|| pki.ca.clone()),
    }
}

fn never(_: &TlsError) {}

/// A wire listener on loopback with `tls`: the outcome of the first connection's accept.
async fn listen(tls: ServerTlsConfig) -> (String, tokio::task::JoinHandle<Result<(), WireError>>) {
    let (address, listener, settings) = bind(tls).await;
    let accepted = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        WireConnection::accept(stream, &settings, &Shutdown::new()).await.map(|_| ())
    });
    (address, accepted)
}

async fn bind(tls: ServerTlsConfig) -> (String, tokio::net::TcpListener, ListenerSettings) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("localhost:{}", listener.local_addr().unwrap().port());
    let config = Reloading::new(tls.files(), move || tls.server_config(), never).unwrap();
    let settings = ListenerSettings {
        instance_id: "server".into(),
        max_frame_bytes: 64 << 20,
        max_connections: 4,
        handshake_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(5),
        tls: Some(Arc::new(config)),
    };
    (address, listener, settings)
}

async fn connect(address: &str, tls: ClientTlsConfig) -> Result<crate::stream::WireStream, client::ClientError> {
    let build = tls.clone();
    let config = Reloading::new(tls.files(), move || build.client_config(), never).unwrap();
    let tls = Arc::new(ClientTls { config, settings: tls });
    client::connect(address, Role::Tool, "t", 0, Duration::from_secs(5), Some(&tls)).await
}

#[tokio::test]
async fn mutual_tls_connects_and_a_client_without_a_certificate_is_refused_at_the_handshake() {
    let (_dir, pki) = pki();

    let (address, accepted) = listen(server(&pki, true)).await;
    let stream = connect(&address, client(&pki, &pki.ca, true)).await.unwrap();
    assert!(stream.is_tls());
    accepted.await.unwrap().unwrap();

    let (address, accepted) = listen(server(&pki, true)).await;
    // TLS 1.3: the client learns of the refusal when it reads, in the wire handshake.
    let error = connect(&address, client(&pki, &pki.ca, false)).await.unwrap_err();
    assert_eq!(error.tls_failure(), Some("no_certificate"), "{error:?}");
    let refused = accepted.await.unwrap().unwrap_err();
    assert_eq!(refused.reason(), Some(crate::metrics::CloseReason::Tls), "{refused:?}");
    assert_eq!(refused.tls_failure(), Some("no_certificate"), "{refused:?}");
}

/// Frames far larger than the socket buffers, to a server that comes to them late: the
/// TLS session holds records back when the socket is full, and the exchange flushes them
/// (the pipeline benchmark found acks waiting for the ack timeout without the flush; this
/// test caught it in one run of three, when the socket filled at a frame's very end).
#[tokio::test]
async fn a_large_frame_over_tls_is_acknowledged_at_once() {
    use tessera_proto::{Ack, AckStatus, Frame, frame::Body, framing};
    let (_dir, pki) = pki();
    let (address, listener, settings) = bind(server(&pki, false)).await;
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let shutdown = Shutdown::new();
        let mut wire = WireConnection::accept(stream, &settings, &shutdown).await.unwrap();
        loop {
            // The server comes to each frame late, as a busy aggregator does: the client's
            // socket fills up while it writes.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Ok(frame) = wire.next_frame(&shutdown).await else { return };
            let ack = Ack { sequence: frame.len() as u64, status: AckStatus::Ok as i32, ..Default::default() };
            framing::write_frame(&mut wire.stream, &Frame { body: Some(Body::Ack(ack)) }, 1 << 20).await.unwrap();
        }
    });
    let mut stream = connect(&address, client(&pki, &pki.ca, false)).await.unwrap();
    for len in [32 << 20, 1 << 20, 7_777_777] {
        let mut frame = (len as u32).to_be_bytes().to_vec();
        frame.resize(4 + len, 0xA5);
        let ack = client::exchange(&mut stream, &frame, len as u64, &mut Vec::new(), Duration::from_secs(10)).await;
        assert_eq!(ack.unwrap().sequence, len as u64);
    }
}

#[tokio::test]
async fn a_server_certificate_from_an_unknown_ca_is_refused_and_told_apart() {
    let (_dir, pki) = pki();
    let (address, _accepted) = listen(server(&pki, false)).await;
    let error = connect(&address, client(&pki, &pki.other_ca, false)).await.unwrap_err();
    assert_eq!((error.reason(), error.tls_failure()), ("tls", Some("unknown_ca")), "{error:?}");

    // The right CA, but a name the certificate does not carry.
    let (address, _accepted) = listen(server(&pki, false)).await;
    let mut tls = client(&pki, &pki.ca, false);
    tls.server_name = Some("elsewhere.example".into());
    let error = connect(&address, tls).await.unwrap_err();
    assert_eq!(error.tls_failure(), Some("name_mismatch"), "{error:?}");
}

#[test]
fn every_misconfiguration_is_an_error_naming_the_file() {
    let (dir, pki) = pki();
    let missing = dir.path().join("missing.pem");
    let message = |result: Result<Arc<ClientConfig>, TlsError>| result.map(|_| ()).unwrap_err().to_string();

    let error = message(ClientTlsConfig { ca_file: Some(missing.clone()), ..Default::default() }.client_config());
    assert!(error.starts_with("ca_file") && error.contains("missing.pem"), "{error}");
    // A key that is not the certificate's.
    let mismatched = ClientTlsConfig {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(pki.client_cert.clone()),
        key_file: Some(pki.server_key.clone()),
        ..Default::default()
    };
    let error = message(mismatched.client_config());
    assert!(error.contains("cert_file and key_file"), "{error}");
    let half = ClientTlsConfig {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(pki.client_cert.clone()),
        ..Default::default()
    };
    assert!(message(half.client_config()).contains("go together"));
    // A certificate where a key should be.
    let not_a_key = ServerTlsConfig {
        cert_file: Some(pki.server_cert.clone()),
        key_file: Some(pki.server_cert.clone()),
        client_ca_file: None,
    };
    let error = not_a_key.server_config().map(|_| ()).unwrap_err().to_string();
    assert!(error.starts_with("key_file") && error.contains("server.pem"), "{error}");
    let error = ServerTlsConfig::default().server_config().map(|_| ()).unwrap_err().to_string();
    assert!(error.contains("needs cert_file and key_file"), "{error}");
    // A file with no certificate in it.
    let error =
        message(ClientTlsConfig { ca_file: Some(pki.client_key.clone()), ..Default::default() }.client_config());
    assert!(error.contains("no CERTIFICATE"), "{error}");
}

#[test]
fn a_rotated_certificate_is_picked_up_and_a_broken_one_keeps_the_old() {
    let (_dir, pki) = pki();
    let tls = server(&pki, false);
    let failures = Arc::new(AtomicU64::new(0));
    let counted = failures.clone();
    let reloading = Reloading::new(
        tls.files(),
        move || tls.server_config(),
        move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        },
    )
    .unwrap();
    let first = reloading.current();
    // Past the check interval, so that the files are looked at: unchanged, nothing rebuilt.
    std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
    assert!(Arc::ptr_eq(&first, &reloading.current()), "unchanged files: the same configuration");
    assert_eq!(failures.load(Ordering::Relaxed), 0);

    std::fs::write(&pki.server_cert, "not a certificate").unwrap();
    std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
    assert!(Arc::ptr_eq(&first, &reloading.current()), "a broken file keeps the previous configuration");
    assert_eq!(failures.load(Ordering::Relaxed), 1);

    pki.rotate_server();
    std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
    assert!(!Arc::ptr_eq(&first, &reloading.current()), "the rotated certificate is loaded");
    assert_eq!(failures.load(Ordering::Relaxed), 1);
}
