//! A real VictoriaMetrics for tests: Debian's `victoria-metrics` binary (package
//! `victoria-metrics`) started as a child process on a free loopback port, data in a
//! temporary directory, readiness polled on `/health`, killed when dropped.
//!
//! Queries go through its Prometheus API with the helpers of `prometheus.rs` (include
//! both). `-search.latencyOffset=0s` and `-search.disableCache` make fresh samples
//! visible to queries at once, which the defaults (30 s, cached) do not.
//!
//! The binary is `$TESSERA_VICTORIA_METRICS_BIN`, else `victoria-metrics` on `PATH`,
//! else `/usr/bin/victoria-metrics`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::prometheus::{free_port, http_get};

/// A running VictoriaMetrics, killed on drop.
pub struct VictoriaMetrics {
    child: Option<Child>,
    /// Where it listens.
    pub address: SocketAddr,
    dir: tempfile::TempDir,
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TESSERA_VICTORIA_METRICS_BIN") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join("victoria-metrics")).find(|path| path.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/victoria-metrics"))
}

impl VictoriaMetrics {
    /// Starts VictoriaMetrics on a free port and waits until it is healthy.
    pub fn start() -> VictoriaMetrics {
        for _ in 0..3 {
            let dir = tempfile::tempdir().expect("temporary directory");
            let log = std::fs::File::create(dir.path().join("victoria.log")).expect("create the log file");
            let address: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let binary = binary();
            let child = Command::new(&binary)
                .arg(format!("-httpListenAddr={address}"))
                .arg(format!("-storageDataPath={}", dir.path().join("data").display()))
                .arg("-retentionPeriod=100y")
                .arg("-search.latencyOffset=0s")
                .arg("-search.disableCache")
                .arg("-loggerLevel=ERROR")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|error| {
                    panic!("cannot run {} ({error}); install Debian's `victoria-metrics`", binary.display())
                });
            let mut server = VictoriaMetrics { child: Some(child), address, dir };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Some(child) = server.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    eprintln!("victoria-metrics exited with {status}:\n{}", server.log());
                    break;
                }
                if matches!(http_get(address, "/health"), Ok((200, _))) {
                    return server;
                }
                std::thread::sleep(Duration::from_millis(50));
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
        std::fs::read_to_string(self.dir.path().join("victoria.log")).unwrap_or_default()
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
