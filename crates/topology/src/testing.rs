//! Test helpers (feature `testing`): a real etcd server as a child process.
//!
//! Any crate's tests can use it with
//! `tessera-topology = { workspace = true, features = ["testing"] }` in
//! `[dev-dependencies]`. It runs Debian's `etcd` (`/usr/bin/etcd`, or the
//! binary named by `$ETCD_BIN`; `scripts/setup.sh` installs it) on free
//! loopback ports with its data in a temporary directory, waits until
//! `/health` answers (polling, never a fixed sleep), and kills it on drop.
//!
//! ```no_run
//! use tessera_topology::testing::EtcdServer;
//!
//! let mut etcd = EtcdServer::start().expect("etcd starts");
//! let config = etcd.config("test");
//! etcd.stop(); // as if it crashed
//! etcd.restart().expect("etcd restarts on the same ports and data");
//! # drop(config);
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd::EtcdConfig;

/// How long a start may take before it is reported as failed.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running etcd, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    directory: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// Starts etcd on two free loopback ports and waits until it is healthy.
    /// Blocks (use `tokio::task::block_in_place` inside a runtime).
    pub fn start() -> std::io::Result<Self> {
        let mut last_error = None;
        // A port picked free may be taken before etcd binds it: try again with others.
        for _ in 0..3 {
            let directory = tempfile::Builder::new().prefix("tessera-etcd-").tempdir()?;
            let mut server = Self { child: None, directory, client_port: free_port()?, peer_port: free_port()? };
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("the loop ran at least once"))
    }

    /// Starts etcd again after [`stop`](Self::stop), on the same ports with the same data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.spawn_and_wait()
    }

    /// Kills etcd (SIGKILL, like a crash) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The etcd process id while it runs (to freeze it with SIGSTOP, as a
    /// hung or partitioned etcd would be).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the etcd process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// An [`EtcdConfig`] for this server with short timeouts and backoffs
    /// suited to tests, and no cache file.
    pub fn config(&self, env: &str) -> EtcdConfig {
        EtcdConfig {
            connect_timeout_ms: 500,
            request_timeout_ms: 1_000,
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 500,
            start_timeout_ms: 5_000,
            ..EtcdConfig::new([self.endpoint()], env)
        }
    }

    /// etcd's log file (stdout and stderr), for failure messages.
    pub fn log_path(&self) -> PathBuf {
        self.directory.path().join("etcd.log")
    }

    /// The last lines of etcd's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn data_dir(&self) -> PathBuf {
        self.directory.path().join("data")
    }

    fn spawn_and_wait(&mut self) -> std::io::Result<()> {
        let binary = std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from("/usr/bin/etcd"), PathBuf::from);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let client_url = self.endpoint();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&binary)
            .arg("--name=default")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            // Fast elections make a fast start and a short minimum lease TTL (1 s).
            .arg("--heartbeat-interval=20")
            .arg("--election-timeout=200")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|error| {
                std::io::Error::new(
                    error.kind(),
                    format!("starting {} (apt-get install etcd-server, or set ETCD_BIN): {error}", binary.display()),
                )
            })?;
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        let mut poll_interval = Duration::from_millis(10);
        loop {
            if healthy(self.client_port) {
                return Ok(());
            }
            if !self.is_running() {
                return Err(std::io::Error::other(format!("etcd exited during start:\n{}", self.log_tail())));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(std::io::Error::other(format!(
                    "etcd not healthy after {START_TIMEOUT:?}:\n{}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(poll_interval);
            poll_interval = (poll_interval * 2).min(Duration::from_millis(100));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Whether etcd's `/health` endpoint reports a healthy member (it has a leader).
fn healthy(port: u16) -> bool {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(200)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}
