//! Real tessera binaries as child processes for end-to-end tests: each gets
//! a config file in a temporary directory, its log in a file, is polled on
//! `/readyz` until ready (never a fixed sleep), and is killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http_get;

/// The path of a workspace binary next to this test's own executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A running daemon.
pub struct Daemon {
    /// Name used in messages.
    pub name: String,
    child: Option<Child>,
    /// Its `/metrics`, `/readyz` address.
    pub telemetry: SocketAddr,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `binary --config <file with config_text>` and waits until
    /// `GET /readyz` on `telemetry` answers 200.
    pub fn start(name: &str, binary_name: &str, config_text: &str, telemetry: SocketAddr) -> Daemon {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, config_text).expect("write config");
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let child = Command::new(binary(binary_name))
            .arg("--config")
            .arg(&config)
            .arg("--log-level")
            .arg("info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {binary_name}: {error}"));
        let mut daemon = Daemon { name: name.to_owned(), child: Some(child), telemetry, dir };
        daemon.wait_ready(Duration::from_secs(30));
        daemon
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("{} exited with {status} while starting:\n{}", self.name, self.log());
            }
            if matches!(http_get(self.telemetry, "/readyz"), Ok((200, _))) {
                return;
            }
            assert!(Instant::now() < deadline, "{} not ready after {timeout:?}:\n{}", self.name, self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Scrapes `/metrics` and sums every sample of `name` whose labels contain `labels`.
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let (_, text) = http_get(self.telemetry, "/metrics").unwrap_or((0, String::new()));
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter(|line| {
                line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                    && line.contains(labels)
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let child = self.child.as_mut()?;
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let status = child.wait().ok()?;
        self.child = None;
        status.code()
    }

    /// Kills the daemon at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}
