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
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, system_binary};
use crate::{free_port, http_get};

/// A running VictoriaMetrics, killed on drop.
pub struct VictoriaMetrics {
    server: Server,
    /// Where it listens.
    pub address: SocketAddr,
}

impl VictoriaMetrics {
    /// Starts VictoriaMetrics on a free port and waits until it is healthy.
    pub fn start() -> VictoriaMetrics {
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
            let mut server = Server::spawn("victoria-metrics", command, dir, "; install Debian's `victoria-metrics`");
            match server.wait_ready(address, "/health", Duration::from_secs(60)) {
                Ok(()) => return VictoriaMetrics { server, address },
                Err(why) => eprintln!("{why}"),
            }
        }
        panic!("victoria-metrics did not become ready on three ports");
    }

    /// The remote-write endpoint.
    pub fn remote_write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.address)
    }

    /// Makes every row received so far searchable now (`/internal/force_flush`), instead of
    /// within the next few seconds.
    pub fn force_flush(&self) {
        let _ = http_get(self.address, "/internal/force_flush");
    }

    /// What VictoriaMetrics logged so far.
    pub fn log(&self) -> String {
        self.server.log()
    }
}
