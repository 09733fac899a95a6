//! A real Prometheus for tests: Debian's `prometheus` binary started as a child process
//! on a free loopback port, with the remote-write receiver and native histograms on, its TSDB in a temporary
//! directory, readiness polled on `/-/ready`, and killed when dropped.
//!
//! ```no_run
//! let prometheus = tessera_testkit::prometheus::Prometheus::start();
//! // point a remote-write client at prometheus.remote_write_url() ...
//! let result = prometheus.query("up", 1_700_000_000.0);
//! ```
//!
//! The binary is `$TESSERA_PROMETHEUS_BIN`, else `prometheus` on `PATH`, else
//! `/usr/bin/prometheus` (`scripts/setup.sh` installs Debian's package).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, system_binary};
use crate::tls::{Pki, TEST_PASSWORD, TEST_PASSWORD_BCRYPT, https_get};

/// A running Prometheus, killed on drop.
pub struct Prometheus {
    server: Server,
    /// Where it listens.
    pub address: SocketAddr,
    /// With TLS and basic auth: the CA to trust (user `tessera`, [`TEST_PASSWORD`]).
    secure: Option<PathBuf>,
}

pub use crate::{free_port, http_get};

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
            if let Some(prometheus) = Prometheus::try_start(free_port(), config, true, Duration::from_secs(60)) {
                return prometheus;
            }
        }
        panic!("prometheus did not become ready on three ports");
    }

    /// Starts Prometheus on `port` (for tests that need the address before the server
    /// exists) and waits until it is ready.
    pub fn start_on(port: u16) -> Prometheus {
        Prometheus::try_start(port, NO_SCRAPES, true, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("prometheus did not become ready on port {port}"))
    }

    /// Starts Prometheus as above but without `--enable-feature=native-histograms`, as
    /// Prometheus runs by default.
    pub fn start_without_native_histograms() -> Prometheus {
        Prometheus::try_start(free_port(), NO_SCRAPES, false, Duration::from_secs(60))
            .expect("prometheus did not become ready")
    }

    /// Starts Prometheus serving HTTPS with `pki`'s server certificate and requiring basic
    /// auth (user `tessera`, [`TEST_PASSWORD`]) on every endpoint, remote write included
    /// (`--web.config.file`); queries go over HTTPS too.
    pub fn start_secure(pki: &Pki) -> Prometheus {
        let web = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  tessera: {TEST_PASSWORD_BCRYPT}\n",
            pki.server_cert.display(),
            pki.server_key.display()
        );
        for _ in 0..3 {
            if let Some(prometheus) = Prometheus::try_start_with(
                free_port(),
                NO_SCRAPES,
                true,
                Some((&web, &pki.ca)),
                Duration::from_secs(60),
            ) {
                return prometheus;
            }
        }
        panic!("prometheus (TLS) did not become ready on three ports");
    }

    fn try_start(port: u16, config_text: &str, native_histograms: bool, timeout: Duration) -> Option<Prometheus> {
        Prometheus::try_start_with(port, config_text, native_histograms, None, timeout)
    }

    fn try_start_with(
        port: u16,
        config_text: &str,
        native_histograms: bool,
        web: Option<(&str, &PathBuf)>,
        timeout: Duration,
    ) -> Option<Prometheus> {
        let dir = Server::directory();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_text).expect("write prometheus.yml");
        let address: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut command = Command::new(system_binary("TESSERA_PROMETHEUS_BIN", "prometheus"));
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn");
        if native_histograms {
            // Timers arrive as native histograms (the remote-write default).
            command.arg("--enable-feature=native-histograms");
        }
        if let Some((web, _)) = web {
            let path = dir.path().join("web.yml");
            std::fs::write(&path, web).expect("write web.yml");
            command.arg(format!("--web.config.file={}", path.display()));
        }
        let secure = web.map(|(_, ca)| ca.clone());
        let mut server =
            Server::spawn("prometheus", command, dir, "; install Debian's `prometheus` (scripts/setup.sh)");
        let ready = match &secure {
            None => server.wait_ready(address, "/-/ready", timeout),
            Some(ca) => server.wait_ready_with(timeout, || {
                matches!(https_get(address, "/-/ready", ca, Some(("tessera", TEST_PASSWORD))), Ok((200, _)))
            }),
        };
        match ready {
            Ok(()) => Some(Prometheus { server, address, secure }),
            Err(why) => {
                eprintln!("{why}");
                None
            }
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// The remote-write endpoint (`https://localhost:<port>/...` when secure).
    pub fn remote_write_url(&self) -> String {
        match self.secure {
            None => format!("http://{}/api/v1/write", self.address),
            Some(_) => format!("https://localhost:{}/api/v1/write", self.address.port()),
        }
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// `GET path` (path and query, already encoded): status and body.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(self.address, path)
    }

    /// Runs an instant query at `time` (unix seconds) and returns `data.result`.
    pub fn query(&self, promql: &str, time: f64) -> serde_json::Value {
        match &self.secure {
            None => query(self.address, promql, time),
            Some(ca) => {
                query_with(promql, time, |path| https_get(self.address, path, ca, Some(("tessera", TEST_PASSWORD))))
            }
        }
    }

    /// Stops Prometheus now (SIGKILL).
    pub fn kill(&mut self) {
        self.server.kill();
    }
}

/// Runs an instant query against any Prometheus-compatible API at `address`.
pub fn query(address: SocketAddr, promql: &str, time: f64) -> serde_json::Value {
    query_with(promql, time, |path| http_get(address, path))
}

/// Runs an instant query with `get` (plain or TLS) and returns `data.result`.
pub fn query_with(promql: &str, time: f64, get: impl Fn(&str) -> std::io::Result<(u16, String)>) -> serde_json::Value {
    let path = format!("/api/v1/query?query={}&time={time:.3}", encode_component(promql));
    let (status, body) = get(&path).unwrap_or_else(|error| panic!("query `{promql}`: {error}"));
    let json: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|error| panic!("query `{promql}`: {error}: {body}"));
    assert_eq!(status, 200, "query `{promql}`: {body}");
    json["data"]["result"].clone()
}

/// `(time, value)` of every point of the one series a range query returned (`result` as
/// [`query`] gives it), the value as Prometheus writes it; `what` names the query if there
/// is not exactly one series.
pub fn single_series_points(result: &serde_json::Value, what: &str) -> Vec<(f64, String)> {
    let series = result.as_array().expect("a result array");
    assert_eq!(series.len(), 1, "{what}: {result}");
    series[0]["values"]
        .as_array()
        .expect("a matrix")
        .iter()
        .map(|point| (point[0].as_f64().unwrap(), point[1].as_str().unwrap().to_owned()))
        .collect()
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
