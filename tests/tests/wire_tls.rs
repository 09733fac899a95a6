//! Mutual TLS on both wire links, with the real binaries and certificates made in the
//! test ([`Pki`]): collector ─[forward.tls]→ aggregator [tls] ─[ingester.tls]→ ingester
//! [tls], each listener requiring a client certificate from the test CA.
//!
//! - a counter sent N times arrives in the ingester's file sink summed exactly;
//! - peers without a valid certificate are refused at the handshake and counted: a
//!   plain TCP client and a TLS client without a certificate (the aggregator's
//!   `frame_errors_total{reason="tls"}`), a collector without a certificate (refused,
//!   its data never written; its `tls_errors_total{reason="no_certificate"}`), and a collector trusting another CA (its
//!   `tls_errors_total{reason="unknown_ca"}`);
//! - the server certificate rotated on disk is presented to new connections of both
//!   listeners without a restart, a collector started after the rotation delivers, and
//!   no reload error is counted.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tessera_proto::Role;
use tessera_testkit::free_port;
use tessera_testkit::tls::Pki;
use tessera_tests::{
    ONE_SECOND_SINK, ONE_SECOND_TILES, collector_config, loopback, start_daemon, start_lone_aggregator, wait_until,
};
use tessera_wire::WireStream;
use tessera_wire::{ClientTls, connect};
use tessera_wire::{ClientTlsConfig, load_certs};

/// How long values, counts and reloads may take to show.
const WAIT: Duration = Duration::from_secs(20);
/// Counter lines sent before the rotation, and after it by a collector started anew.
const BEFORE_ROTATION: u64 = 120;
const AFTER_ROTATION: u64 = 80;

fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// A listener's `[tls]`: the server certificate, and client certificates required.
fn listener_tls(pki: &Pki) -> String {
    format!(
        "[tls]\ncert_file = {}\nkey_file = {}\nclient_ca_file = {}\n",
        quoted(&pki.server_cert),
        quoted(&pki.server_key),
        quoted(&pki.ca)
    )
}

/// A sender's `[<table>.tls]` trusting `ca`, with the client certificate when `with_cert`.
fn sender_tls(table: &str, pki: &Pki, ca: &Path, with_cert: bool) -> String {
    let mut text = format!("[{table}.tls]\nca_file = {}\n", quoted(ca));
    if with_cert {
        text += &format!("cert_file = {}\nkey_file = {}\n", quoted(&pki.client_cert), quoted(&pki.client_key));
    }
    text
}

/// The highest value written for the untagged counter `name` (cumulative in the file
/// sink), from the ingester's open journal: `<type> <family> <timestamp_ms> <value> <series>`.
/// The store holds one resolution, so the series is `<name>_total`, with no label.
fn written_total(journal: &Path, name: &str) -> Option<f64> {
    let text = std::fs::read_to_string(journal).ok()?;
    let wanted = format!("{name}_total");
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(5, ' ');
            let (kind, _family, _timestamp, value, series) =
                (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            (kind == "counter" && series == wanted).then(|| value.parse::<f64>().ok())?
        })
        .reduce(f64::max)
}

/// Sends `count` lines `name:1|c` to `statsd`, 20 to a datagram.
fn send_counter(statsd: SocketAddr, name: &str, count: u64) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut left = count;
    while left > 0 {
        let lines = left.min(20);
        let datagram: String = (0..lines).map(|_| format!("{name}:1|c\n")).collect();
        socket.send_to(datagram.as_bytes(), statsd).unwrap();
        left -= lines;
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A wire client's TLS from `config`, as the daemons build theirs.
fn client_tls(config: ClientTlsConfig) -> Arc<ClientTls> {
    tessera_wire::client_tls(Some(&config), Counter::default()).unwrap().expect("TLS configured")
}

/// Connects to `address` as a tool and hands back the server's leaf certificate (DER),
/// or the error, as text, when the connection is refused.
fn handshake(
    runtime: &tokio::runtime::Runtime,
    address: SocketAddr,
    tls: Option<&Arc<ClientTls>>,
) -> Result<Vec<u8>, String> {
    runtime.block_on(async {
        let connected =
            connect(&address.to_string(), Role::Tool, "wire-tls-test", 0, Duration::from_secs(5), tls).await;
        match connected {
            Ok(WireStream::Client(stream)) => {
                let certificates = stream.get_ref().1.peer_certificates().expect("a TLS server presents one");
                Ok(certificates[0].as_ref().to_vec())
            }
            Ok(_) => Ok(Vec::new()),
            Err(error) => Err(format!("{} ({:?})", error, error.reason())),
        }
    })
}

fn leaf(path: &Path) -> Vec<u8> {
    load_certs("server certificate", path).unwrap()[0].as_ref().to_vec()
}

#[test]
fn mutual_tls_on_both_links_delivers_exactly_refuses_strangers_and_follows_a_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    let pki = Pki::create(&pki_dir);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    let (ingester_port, aggregator_port) = (free_port(), free_port());
    let data_dir = dir.path().join("ingester");
    let journal = data_dir.join("openmetrics/default/current.journal");
    let ingester_text = format!(
        "listen = \"127.0.0.1:{ingester_port}\"\ndata_dir = {}\n{ONE_SECOND_SINK}{}[sink]\nkind = \"file\"\nrotate_secs = 3600\n",
        quoted(&data_dir),
        listener_tls(&pki)
    );
    let ingester = start_daemon("ingester", "tessera-ingester", &ingester_text, free_port());
    let (aggregator, placement) = start_lone_aggregator(
        dir.path(),
        aggregator_port,
        &format!("{ONE_SECOND_TILES}{}", listener_tls(&pki)),
        ingester_port,
        &sender_tls("ingester", &pki, &pki.ca, true),
    );
    let collector_statsd = free_port();
    let collector_text =
        collector_config("host-1", collector_statsd, &placement, &sender_tls("forward", &pki, &pki.ca, true));
    let mut collector = start_daemon("collector", "tessera-collector", &collector_text, free_port());

    // 1. Exact values over mutual TLS on both links.
    send_counter(loopback(collector_statsd), "wire_tls.hits", BEFORE_ROTATION);
    wait_until("the counter written summed exactly", WAIT, || {
        written_total(&journal, "wire_tls_hits") == Some(BEFORE_ROTATION as f64)
    });
    assert!(collector.metric("tessera_collector_batches_sent_total", "") > 0.0, "{}", collector.log());
    assert_eq!(collector.metric("tessera_collector_tls_errors_total", ""), 0.0, "{}", collector.log());
    assert_eq!(aggregator.metric("tessera_aggregator_tls_errors_total", ""), 0.0, "{}", aggregator.log());

    // 2. Strangers are refused at the handshake and counted.
    let aggregator_tls_refusals = || aggregator.metric("tessera_aggregator_frame_errors_total", "reason=\"tls\"");
    assert_eq!(aggregator_tls_refusals(), 0.0, "no refusal yet");
    let plain = handshake(&runtime, loopback(aggregator_port), None);
    assert!(plain.is_err(), "a plain TCP client is refused: {plain:?}");
    wait_until("the plain client's refusal counted", WAIT, || aggregator_tls_refusals() >= 1.0);
    let without_certificate = client_tls(ClientTlsConfig { ca_file: Some(pki.ca.clone()), ..Default::default() });
    let anonymous = handshake(&runtime, loopback(aggregator_port), Some(&without_certificate));
    assert!(anonymous.is_err(), "a TLS client without a certificate is refused: {anonymous:?}");
    wait_until("the anonymous client's refusal counted", WAIT, || aggregator_tls_refusals() >= 2.0);
    let ingester_anonymous = handshake(&runtime, loopback(ingester_port), Some(&without_certificate));
    assert!(ingester_anonymous.is_err(), "the ingester refuses it too: {ingester_anonymous:?}");
    wait_until("the ingester's refusal counted", WAIT, || {
        ingester.metric("tessera_ingester_frame_errors_total", "reason=\"tls\"") >= 1.0
    });

    // A collector without a certificate: refused, counted on both sides, never written.
    let anonymous_statsd = free_port();
    let anonymous_text =
        collector_config("host-2", anonymous_statsd, &placement, &sender_tls("forward", &pki, &pki.ca, false));
    let anonymous_collector = start_daemon("collector-no-cert", "tessera-collector", &anonymous_text, free_port());
    let refusals_before = aggregator_tls_refusals();
    send_counter(loopback(anonymous_statsd), "wire_tls.anonymous", 10);
    wait_until("the collector without a certificate refused and counted", WAIT, || {
        aggregator_tls_refusals() > refusals_before
            && anonymous_collector.metric("tessera_collector_connect_errors_total", "") > 0.0
            && anonymous_collector.metric("tessera_collector_tls_errors_total", "reason=\"no_certificate\"") > 0.0
    });
    assert_eq!(anonymous_collector.metric("tessera_collector_batches_sent_total", ""), 0.0);

    // A collector trusting another CA: refuses the aggregator, counted as unknown_ca.
    let distrustful_statsd = free_port();
    let distrustful_text =
        collector_config("host-3", distrustful_statsd, &placement, &sender_tls("forward", &pki, &pki.other_ca, true));
    let distrustful = start_daemon("collector-other-ca", "tessera-collector", &distrustful_text, free_port());
    send_counter(loopback(distrustful_statsd), "wire_tls.distrustful", 10);
    wait_until("the unknown CA counted by the collector", WAIT, || {
        distrustful.metric("tessera_collector_tls_errors_total", "reason=\"unknown_ca\"") > 0.0
            && distrustful.metric("tessera_collector_connect_errors_total", "") > 0.0
    });
    assert_eq!(distrustful.metric("tessera_collector_batches_sent_total", ""), 0.0);
    drop((anonymous_collector, distrustful));

    // 3. A rotated server certificate is presented to new connections, no restart.
    let with_certificate = client_tls(ClientTlsConfig {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(pki.client_cert.clone()),
        key_file: Some(pki.client_key.clone()),
        ..Default::default()
    });
    let old_leaf = leaf(&pki.server_cert);
    for port in [aggregator_port, ingester_port] {
        assert_eq!(handshake(&runtime, loopback(port), Some(&with_certificate)), Ok(old_leaf.clone()));
    }
    pki.rotate_server();
    let new_leaf = leaf(&pki.server_cert);
    assert_ne!(old_leaf, new_leaf);
    for (name, port) in [("aggregator", aggregator_port), ("ingester", ingester_port)] {
        wait_until(&format!("the {name} to present the rotated certificate"), WAIT, || {
            handshake(&runtime, loopback(port), Some(&with_certificate)) == Ok(new_leaf.clone())
        });
    }
    // The collector started again after the rotation: its new handshake succeeds.
    assert_eq!(collector.terminate(), Some(0), "{}", collector.log());
    drop(collector);
    let collector = start_daemon("collector-after-rotation", "tessera-collector", &collector_text, free_port());
    send_counter(loopback(collector_statsd), "wire_tls.hits", AFTER_ROTATION);
    wait_until("the counter after the rotation written summed exactly", WAIT, || {
        written_total(&journal, "wire_tls_hits") == Some((BEFORE_ROTATION + AFTER_ROTATION) as f64)
    });
    assert_eq!(collector.metric("tessera_collector_tls_errors_total", ""), 0.0, "{}", collector.log());
    assert_eq!(aggregator.metric("tessera_aggregator_listener_tls_reload_errors_total", ""), 0.0);
    assert_eq!(ingester.metric("tessera_ingester_listener_tls_reload_errors_total", ""), 0.0);
    assert_eq!(aggregator.metric("tessera_aggregator_tls_errors_total", ""), 0.0, "{}", aggregator.log());
    assert_eq!(written_total(&journal, "wire_tls_anonymous"), None, "the anonymous collector's data is never written");
    assert_eq!(written_total(&journal, "wire_tls_distrustful"), None);
}
