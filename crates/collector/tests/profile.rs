//! `/debug/pprof/profile` on a collector under load: the profile decodes as
//! pprof's protobuf (read back by `protoc --decode` against pprof's own
//! `profile.proto`, not by tessera's encoder), names the parser's functions
//! and the reader threads; the flame graph is well-formed SVG (parsed by
//! Python's XML parser); one profile at a time; bad parameters are refused.
//!
//! One test function: the sampler is one per process, and the steps must
//! not race each other.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tessera_collector::{Collector, Config, PlacementHandle};
use tessera_runtime::{Shutdown, Telemetry};
use tessera_testkit::{http_get, http_get_bytes};
use tessera_topology::Placement;

fn config() -> Config {
    let mut config: Config = toml::from_str(
        r#"
        [udp]
        listen = "127.0.0.1:0"
        reader_threads = 2
        [telemetry]
        listen = "127.0.0.1:0"
        "#,
    )
    .unwrap();
    config.telemetry.listen = Some("127.0.0.1:0".parse().unwrap());
    config
}

/// Sends tagged statsd to `target` from a thread until `stop` is set.
fn load(target: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut datagram = String::new();
        for n in 0..20 {
            datagram.push_str(&format!(
                "profile.requests:1|c|#route:/api/{},host:h{}\nprofile.latency:{n}|ms\n",
                n % 7,
                n % 3
            ));
        }
        let mut sent = 0;
        while !stop.load(Ordering::Relaxed) {
            // Loopback into a 32 MiB buffer: a drop now and then does not matter here.
            let _ = socket.send_to(datagram.as_bytes(), target);
            sent += 1;
        }
        sent
    })
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw).expect("the profile is gzipped");
    raw
}

/// Runs `program` with `args`, `input` on its standard input: (success, stdout, stderr).
fn pipe_through(program: &str, args: &[&str], input: &[u8]) -> (bool, String, String) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{program} runs (scripts/setup.sh installs it): {error}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

/// pprof's protobuf decoded by protoc, as text.
fn protoc_decode(profile: &[u8]) -> String {
    let proto_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/third_party/pprof");
    let args = ["--decode=perftools.profiles.Profile", "-I", proto_dir, "profile.proto"];
    let (decoded, text, errors) = pipe_through("protoc", &args, profile);
    assert!(decoded, "protoc could not decode the profile: {errors}");
    text
}

fn well_formed_xml(svg: &[u8]) -> Result<(), String> {
    let script = "import sys, xml.etree.ElementTree as ET; root = ET.parse(sys.stdin).getroot(); print(root.tag)";
    let (parsed, root, errors) = pipe_through("python3", &["-c", script], svg);
    if parsed && root.trim() == "{http://www.w3.org/2000/svg}svg" { Ok(()) } else { Err(format!("{root} {errors}")) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_under_load_serves_cpu_profiles() {
    let shutdown = Shutdown::new();
    let placement = PlacementHandle::fixed(Placement::init(&[("agg-1", "127.0.0.1:9")], 4, 1, 0).unwrap());
    let collector =
        Collector::start(config(), placement, Telemetry::new("collector", "test"), shutdown.clone()).await.unwrap();
    let telemetry = collector.telemetry_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = (0..2).map(|_| load(collector.udp_addr().unwrap(), stop.clone())).collect();

    let profile = tokio::task::spawn_blocking(move || {
        // Bad parameters: 400 with the reason, at once.
        for query in ["seconds=0", "seconds=100000", "frequency=0", "format=png"] {
            let (status, body) = http_get(telemetry, &format!("/debug/pprof/profile?{query}")).unwrap();
            assert_eq!(status, 400, "{query}: {body}");
            assert!(body.contains("must be"), "{query}: {body}");
        }

        // A 3 s profile; a second request while it runs gets 409.
        let first = std::thread::spawn(move || http_get_bytes(telemetry, "/debug/pprof/profile?seconds=3").unwrap());
        std::thread::sleep(Duration::from_millis(500));
        let (status, body) = http_get(telemetry, "/debug/pprof/profile?seconds=1").unwrap();
        assert_eq!(status, 409, "{body}");
        let (status, profile) = first.join().unwrap();
        assert_eq!(status, 200);
        let (status, svg) =
            http_get_bytes(telemetry, "/debug/pprof/profile?seconds=2&format=flamegraph&frequency=250").unwrap();
        assert_eq!(status, 200);
        let (status, heap) = http_get(telemetry, "/debug/pprof/heap").unwrap();
        assert_eq!(status, 501, "{heap}");
        let (_, metrics) = http_get(telemetry, "/metrics").unwrap();
        (profile, svg, metrics)
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let sent: u64 = loaders.into_iter().map(|loader| loader.join().unwrap()).sum();
    assert!(sent > 0);
    let (profile, svg, metrics) = profile;

    let decoded = protoc_decode(&gunzip(&profile));
    assert!(decoded.contains("sample_type"), "{decoded}");
    // The parser's functions, symbolised, and the threads that ran them.
    assert!(decoded.contains("tessera_core::parse"), "no parser frame in the profile:\n{decoded}");
    assert!(decoded.contains("udp-reader-"), "no reader thread in the profile");
    assert!(decoded.contains("string_table: \"thread\""), "samples carry a thread label");

    well_formed_xml(&svg).unwrap_or_else(|error| panic!("the flame graph is not well-formed SVG: {error}"));
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.contains("[udp-reader-"), "the flame graph starts from the threads");

    for expected in [
        "tessera_collector_profiles_total{format=\"pprof\"} 1",
        "tessera_collector_profiles_total{format=\"flamegraph\"} 1",
        "tessera_collector_profile_seconds_total 5",
        "tessera_collector_profile_requests_refused_total{reason=\"busy\"} 1",
        "tessera_collector_profile_requests_refused_total{reason=\"bad_request\"} 4",
    ] {
        assert!(metrics.contains(expected), "`{expected}` not in\n{metrics}");
    }
    shutdown.trigger();
    collector.wait().await;
}
