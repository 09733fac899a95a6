//! The real `tessera-ingester` binary as a child process, for tests that kill or stop it:
//! started with a config file, its output appended to a log file, polled on `/readyz`
//! (never a fixed sleep), SIGKILLed on drop.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_testkit::http_get;

use super::wire::metric_value;

/// The running binary; SIGKILLed when dropped, as a crash would.
pub struct Process {
    child: Child,
    telemetry: SocketAddr,
}

impl Process {
    /// Starts the binary with `config`, its output appended to `log` at `log_level`, and
    /// waits until `/readyz` on `telemetry` answers 200.
    pub fn start(config: &Path, telemetry: SocketAddr, log: &Path, log_level: &str) -> Process {
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-ingester"))
            .arg("--config")
            .arg(config)
            .args(["--log-level", log_level])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("run tessera-ingester");
        let mut process = Process { child, telemetry };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(http_get(telemetry, "/readyz"), Ok((200, _))) {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("tessera-ingester exited with {status}:\n{}", std::fs::read_to_string(log).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "tessera-ingester did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        process
    }

    /// The ingester's own metrics, as OpenMetrics text.
    pub fn metrics(&self) -> String {
        http_get(self.telemetry, "/metrics").expect("scrape the ingester").1
    }

    /// The value of `name{labels}` now (0 when absent).
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        metric_value(&self.metrics(), name, labels)
    }

    /// SIGTERM, then waits for the exit code (the graceful drain).
    pub fn terminate(mut self) -> Option<i32> {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|status| status.success()), "kill -TERM");
        self.child.wait().ok()?.code()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
