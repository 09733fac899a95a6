//! Real tessera binaries as child processes for end-to-end tests: each gets
//! a config file in a temporary directory, its log in a file, is polled on
//! `/readyz` until ready (never a fixed sleep), and is killed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::http_get;
use crate::process::Server;

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
    server: Server,
    /// Its `/metrics`, `/readyz` address.
    pub telemetry: SocketAddr,
}

impl Daemon {
    /// Starts `binary --config <file with config_text>` and waits until
    /// `GET /readyz` on `telemetry` answers 200.
    pub fn start(name: &str, binary_name: &str, config_text: &str, telemetry: SocketAddr) -> Daemon {
        Daemon::start_with_env(name, binary_name, config_text, telemetry, &[])
    }

    /// [`start`](Self::start) with environment variables set for the process (a
    /// failpoint, `TESSERA_FAILPOINTS`, say).
    pub fn start_with_env(
        name: &str,
        binary_name: &str,
        config_text: &str,
        telemetry: SocketAddr,
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::start_wrapped(name, binary_name, config_text, telemetry, env, &[])
    }

    /// [`start_with_env`](Self::start_with_env) through `wrapper`: the command run is
    /// `wrapper..., binary, --config, ...` (a shell that joins a cgroup and execs the rest,
    /// say); an empty wrapper runs the binary itself.
    pub fn start_wrapped(
        name: &str,
        binary_name: &str,
        config_text: &str,
        telemetry: SocketAddr,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Daemon {
        let dir = Server::directory();
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, config_text).expect("write config");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary(binary_name));
                command
            }
            None => Command::new(binary(binary_name)),
        };
        command.arg("--config").arg(&config).arg("--log-level").arg("info");
        command.envs(env.iter().copied());
        let mut server = Server::spawn(name, command, dir, "");
        if let Err(why) = server.wait_ready(telemetry, "/readyz", Duration::from_secs(30)) {
            panic!("{why}");
        }
        Daemon { name: name.to_owned(), server, telemetry }
    }

    /// [`start`](Self::start) for a daemon whose telemetry port is not plain HTTP (TLS):
    /// ready when `ready` says so.
    pub fn start_until(
        name: &str,
        binary_name: &str,
        config_text: &str,
        telemetry: SocketAddr,
        ready: impl FnMut() -> bool,
    ) -> Daemon {
        let dir = Server::directory();
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, config_text).expect("write config");
        let mut command = Command::new(binary(binary_name));
        command.arg("--config").arg(&config).arg("--log-level").arg("info");
        let mut server = Server::spawn(name, command, dir, "");
        if let Err(why) = server.wait_ready_with(Duration::from_secs(30), ready) {
            panic!("{why}");
        }
        Daemon { name: name.to_owned(), server, telemetry }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        self.server.log()
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

    /// Sends `signal` (`STOP`, `CONT`, ...) to the running daemon: `STOP`
    /// freezes it with its sockets open, as a stuck process would be.
    pub fn signal(&self, signal: &str) {
        let pid = self.server.pid().unwrap_or_else(|| panic!("{} is not running", self.name));
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.server.terminate()
    }

    /// Kills the daemon at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.server.kill();
    }
}
