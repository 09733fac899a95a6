//! The real `tessera-collector` binary: bad configs exit 64 with a clear
//! message; a running collector forwards what it receives and, on SIGTERM,
//! cuts its current window, delivers it and exits 0.

#[path = "support/receiver.rs"]
mod receiver;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use receiver::Receiver;

const BINARY: &str = env!("CARGO_BIN_EXE_tessera-collector");

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn bad_configs_exit_64_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[udp]\nlisten_addr = \"x\"\n", "listen_addr"),
        ("[aggregation]\ninterval_ms = 0\n[placement]\nkind = \"static\"\npath = \"p\"\n", "aggregation.interval_ms"),
        ("", "placement"),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("collector.toml");
        std::fs::write(&path, text).unwrap();
        let output = Command::new(BINARY).arg("--config").arg(&path).arg("--check-config").output().unwrap();
        assert_eq!(output.status.code(), Some(64), "{text:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{text:?}: {stderr}");
    }
    let missing = Command::new(BINARY).args(["--config", "/nonexistent/collector.toml"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/collector.toml"));
    let help = Command::new(BINARY).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--config"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_delivers_the_current_window_and_exits_zero() {
    let receiver = Receiver::start("127.0.0.1:0").await;
    let dir = tempfile::tempdir().unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(
        &placement,
        format!("num_shards = 4\n[[instances]]\nid = \"agg-1\"\nendpoint = \"{}\"\n", receiver.address),
    )
    .unwrap();
    let port = free_udp_port();
    let telemetry_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = dir.path().join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "[udp]\nlisten = \"127.0.0.1:{port}\"\nreader_threads = 2\n[telemetry]\nlisten = \"127.0.0.1:{telemetry_port}\"\n\
             [aggregation]\ninterval_ms = 60000\n[placement]\nkind = \"static\"\npath = \"{}\"\n",
            placement.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(BINARY).arg("--config").arg(&config).stderr(Stdio::piped()).spawn().unwrap();

    // A 60 s window: nothing is cut before SIGTERM, so delivery proves the
    // shutdown cut. Keep sending until the collector has bound its port.
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // The telemetry endpoint comes up after every listener is bound.
    while std::net::TcpStream::connect(("127.0.0.1", telemetry_port)).is_err() {
        assert!(Instant::now() < deadline, "collector never bound its port");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..100 {
        socket.send_to(b"on.shutdown:1|c|#via:binary", ("127.0.0.1", port)).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.counter("on.shutdown|#via:binary"), None, "nothing is sent before the window ends");

    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = tokio::task::block_in_place(|| child.wait()).unwrap();
    assert_eq!(exit.code(), Some(0));
    assert_eq!(receiver.counter("on.shutdown|#via:binary"), Some(100.0));
}
