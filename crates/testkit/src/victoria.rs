//! A real VictoriaMetrics for tests: Debian's `victoria-metrics` binary (package
//! `victoria-metrics`) started as a child process on a free loopback port, data in a
//! temporary directory, readiness polled on `/health`, killed when dropped.
//!
//! Queries go through its Prometheus API with [`crate::prometheus::query`]. `-search.latencyOffset=0s` and `-search.disableCache` make fresh samples
//! visible to queries at once, which the defaults (30 s, cached) do not.
//!
//! The binary is `$TESSERA_VICTORIA_METRICS_BIN`, else `victoria-metrics` on `PATH`,
//! else `/usr/bin/victoria-metrics`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, system_binary};
use crate::tls::{Pki, TEST_PASSWORD, https_get};
use crate::{free_port, http_get};

/// A running VictoriaMetrics, killed on drop.
pub struct VictoriaMetrics {
    server: Server,
    /// Where it listens.
    pub address: SocketAddr,
    /// With TLS and basic auth: the CA to trust (user `tessera`, [`TEST_PASSWORD`]).
    secure: Option<PathBuf>,
}

impl VictoriaMetrics {
    /// Starts VictoriaMetrics on a free port and waits until it is healthy.
    pub fn start() -> VictoriaMetrics {
        VictoriaMetrics::start_with(None)
    }

    /// Starts VictoriaMetrics serving HTTPS (`-tls`) with `pki`'s server certificate and
    /// requiring basic auth (`-httpAuth.*`: user `tessera`, [`TEST_PASSWORD`]).
    pub fn start_secure(pki: &Pki) -> VictoriaMetrics {
        VictoriaMetrics::start_with(Some(pki))
    }

    fn start_with(pki: Option<&Pki>) -> VictoriaMetrics {
        // A port found free can be taken before VictoriaMetrics binds it: try a few.
        for _ in 0..3 {
            let dir = Server::directory();
            let address: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let mut command = Command::new(system_binary("TESSERA_VICTORIA_METRICS_BIN", "victoria-metrics"));
            command
                .arg(format!("-httpListenAddr={address}"))
                .arg(format!("-storageDataPath={}", dir.path().join("data").display()))
                .arg("-retentionPeriod=100y")
                .arg("-search.latencyOffset=0s")
                .arg("-search.disableCache")
                .arg("-loggerLevel=ERROR");
            if let Some(pki) = pki {
                command
                    .arg("-tls")
                    .arg(format!("-tlsCertFile={}", pki.server_cert.display()))
                    .arg(format!("-tlsKeyFile={}", pki.server_key.display()))
                    .arg("-httpAuth.username=tessera")
                    .arg(format!("-httpAuth.password={TEST_PASSWORD}"));
            }
            let mut server = Server::spawn("victoria-metrics", command, dir, "; install Debian's `victoria-metrics`");
            let secure = pki.map(|pki| pki.ca.clone());
            let ready = match &secure {
                None => server.wait_ready(address, "/health", Duration::from_secs(60)),
                Some(ca) => server.wait_ready_with(Duration::from_secs(60), || {
                    matches!(https_get(address, "/health", ca, Some(("tessera", TEST_PASSWORD))), Ok((200, _)))
                }),
            };
            match ready {
                Ok(()) => return VictoriaMetrics { server, address, secure },
                Err(why) => eprintln!("{why}"),
            }
        }
        panic!("victoria-metrics did not become ready on three ports");
    }

    /// The remote-write endpoint (`https://localhost:<port>/...` when secure).
    pub fn remote_write_url(&self) -> String {
        match self.secure {
            None => format!("http://{}/api/v1/write", self.address),
            Some(_) => format!("https://localhost:{}/api/v1/write", self.address.port()),
        }
    }

    /// Makes every row received so far searchable now (`/internal/force_flush`), instead of
    /// within the next few seconds.
    pub fn force_flush(&self) {
        let _ = self.get("/internal/force_flush");
    }

    /// `GET path`, over TLS with basic auth when secure: status and body.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        match &self.secure {
            None => http_get(self.address, path),
            Some(ca) => https_get(self.address, path, ca, Some(("tessera", TEST_PASSWORD))),
        }
    }

    /// Runs an instant query at `time` (unix seconds) and returns `data.result`.
    pub fn query(&self, promql: &str, time: f64) -> serde_json::Value {
        crate::prometheus::query_with(promql, time, |path| self.get(path))
    }

    /// What VictoriaMetrics logged so far.
    pub fn log(&self) -> String {
        self.server.log()
    }
}
