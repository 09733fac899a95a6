//! A real Prometheus for tests: Debian's `prometheus` binary started as a child process
//! on a free loopback port, with the remote-write receiver on, its TSDB in a temporary
//! directory, readiness polled on `/-/ready`, and killed when dropped.
//!
//! Self-contained (std, `tempfile` and `serde_json` only) so that any crate's tests can
//! include it:
//!
//! ```ignore
//! #[path = "../../ingester/tests/support/prometheus.rs"]
//! mod prometheus;
//!
//! let prometheus = prometheus::Prometheus::start();
//! // point a remote-write client at prometheus.remote_write_url() ...
//! let result = prometheus.query("up", 1_700_000_000.0);
//! ```
//!
//! The binary is `$TESSERA_PROMETHEUS_BIN`, else `prometheus` on `PATH`, else
//! `/usr/bin/prometheus` (`scripts/setup.sh` installs Debian's package).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    child: Option<Child>,
    /// Where it listens.
    pub address: SocketAddr,
    dir: tempfile::TempDir,
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local address").port()
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TESSERA_PROMETHEUS_BIN") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("prometheus")).find(|path| path.is_file()));
    on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

/// A configuration that scrapes nothing (remote write only).
pub const NO_SCRAPES: &str = "global:\n  scrape_interval: 1h\n  evaluation_interval: 1h\n";

impl Prometheus {
    /// Starts Prometheus on a free port and waits until it is ready.
    pub fn start() -> Prometheus {
        Prometheus::start_with_config(NO_SCRAPES)
    }

    /// Starts Prometheus with `config` (the text of `prometheus.yml`, e.g. with scrape
    /// targets) on a free port and waits until it is ready.
    pub fn start_with_config(config: &str) -> Prometheus {
        // A port found free can be taken before Prometheus binds it: try a few.
        for _ in 0..3 {
            if let Some(prometheus) = Prometheus::try_start(free_port(), config, Duration::from_secs(60)) {
                return prometheus;
            }
        }
        panic!("prometheus did not become ready on three ports");
    }

    /// Starts Prometheus on `port` (for tests that need the address before the server
    /// exists) and waits until it is ready.
    pub fn start_on(port: u16) -> Prometheus {
        Prometheus::try_start(port, NO_SCRAPES, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("prometheus did not become ready on port {port}"))
    }

    fn try_start(port: u16, config_text: &str, timeout: Duration) -> Option<Prometheus> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_text).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("create the log file");
        let address: SocketAddr = ([127, 0, 0, 1], port).into();
        let binary = binary();
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run {} ({error}); install Debian's `prometheus` (scripts/setup.sh)", binary.display())
            });
        let mut prometheus = Prometheus { child: Some(child), address, dir };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = prometheus.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                eprintln!("prometheus exited with {status}:\n{}", prometheus.log());
                return None;
            }
            if matches!(prometheus.get("/-/ready"), Ok((200, _))) {
                return Some(prometheus);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("prometheus not ready after {timeout:?}:\n{}", prometheus.log());
        None
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The remote-write endpoint.
    pub fn remote_write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.address)
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` (path and query, already encoded): status and body.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(self.address, path)
    }

    /// Runs an instant query at `time` (unix seconds) and returns `data.result`.
    pub fn query(&self, promql: &str, time: f64) -> serde_json::Value {
        query(self.address, promql, time)
    }

    /// Stops Prometheus now (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs an instant query against any Prometheus-compatible API at `address`.
pub fn query(address: SocketAddr, promql: &str, time: f64) -> serde_json::Value {
    let path = format!("/api/v1/query?query={}&time={time:.3}", encode_component(promql));
    let (status, body) = http_get(address, &path).unwrap_or_else(|error| panic!("query `{promql}`: {error}"));
    let json: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|error| panic!("query `{promql}`: {error}: {body}"));
    assert_eq!(status, 200, "query `{promql}`: {body}");
    json["data"]["result"].clone()
}

/// Percent-encodes a query-string component.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A minimal HTTP/1.0 GET (the server closes the connection after the answer).
pub fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}
