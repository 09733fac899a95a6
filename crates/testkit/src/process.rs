//! A server started as a child process for a test: its files (and its log) in a
//! temporary directory, readiness polled over HTTP (never a fixed sleep), killed on
//! drop. [`crate::prometheus`], [`crate::victoria`] and [`crate::daemons`] are built
//! on it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http_get;

/// A system binary: `$env_var` if set, else `name` on `PATH`, else `/usr/bin/<name>`.
pub fn system_binary(env_var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|path| path.is_file()));
    on_path.unwrap_or_else(|| Path::new("/usr/bin").join(name))
}

/// A child process with its working files and log, killed on drop.
pub struct Server {
    name: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Server {
    /// A fresh temporary directory for a server's files (pass it to [`Server::spawn`]).
    pub fn directory() -> tempfile::TempDir {
        tempfile::tempdir().expect("temporary directory")
    }

    /// Runs `command` with its output in `<dir>/log`; panics with `install_hint` when
    /// it cannot run at all.
    pub fn spawn(name: &str, mut command: Command, dir: tempfile::TempDir, install_hint: &str) -> Server {
        let log = std::fs::File::create(dir.path().join("log")).expect("create the log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot run {name} ({error}){install_hint}"));
        Server { name: name.to_owned(), child: Some(child), dir }
    }

    /// Polls `GET path` on `address` until it answers 200. Fails, saying why and with
    /// the log so far, when the process exits first or `timeout` passes.
    pub fn wait_ready(&mut self, address: SocketAddr, path: &str, timeout: Duration) -> Result<(), String> {
        self.wait_ready_with(timeout, || matches!(http_get(address, path), Ok((200, _))))
    }

    /// Polls `ready` until it holds (e.g. a `GET` over TLS answered 200), like
    /// [`wait_ready`](Self::wait_ready).
    pub fn wait_ready_with(&mut self, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("{} exited with {status} while starting:\n{}", self.name, self.log()));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("{} not ready after {timeout:?}:\n{}", self.name, self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What the process wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let child = self.child.as_mut()?;
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let status = child.wait().ok()?;
        self.child = None;
        status.code()
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
