//! A real carbon-cache for tests: Debian's `graphite-carbon` started as a child process
//! on free loopback ports (plaintext and pickle receivers), its configuration, whisper
//! files and log in a temporary directory, killed when dropped. Values are read back
//! from the whisper files with Debian's `whisper-fetch` (package `python3-whisper`).
//!
//! The binaries are `$TESSERA_CARBON_CACHE_BIN` and `$TESSERA_WHISPER_FETCH_BIN`, else
//! `carbon-cache` and `whisper-fetch` on `PATH`, else under `/usr/bin`.
//!
//! Carbon is configured as a test needs it, not as Debian ships it: no limit on creates
//! and updates (Debian's 50 creates a minute would hold new series back for minutes),
//! tags off (no graphite-web beside it), and one storage schema for every path.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::free_port;
use crate::process::{Server, system_binary};

/// A running carbon-cache, killed on drop.
pub struct Carbon {
    server: Option<Server>,
    /// Configuration, whisper files and logs; kept across [`Carbon::restart`].
    dir: tempfile::TempDir,
    /// The plaintext receiver.
    pub plaintext: SocketAddr,
    /// The pickle receiver.
    pub pickle: SocketAddr,
}

impl Carbon {
    /// Starts carbon-cache storing every path with `retentions` (e.g. `1s:1h`, `10s:6h`),
    /// and waits until both receivers accept connections.
    pub fn start(retentions: &str) -> Carbon {
        let schemas = format!("[everything]\npattern = .*\nretentions = {retentions}\n");
        let aggregation = "[everything]\npattern = .*\nxFilesFactor = 0\naggregationMethod = sum\n";
        Carbon::start_with(&schemas, aggregation)
    }

    /// Starts carbon-cache with these `storage-schemas.conf` and `storage-aggregation.conf`
    /// (tessera's own, in `deploy/graphite/`, say).
    pub fn start_with(schemas: &str, aggregation: &str) -> Carbon {
        let dir = Server::directory();
        let plaintext: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let pickle: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let query = free_port();
        let root = dir.path().display().to_string();
        for sub in ["conf", "whisper", "log", "pid", "lists"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("carbon's directories");
        }
        let conf = format!(
            "[cache]\nSTORAGE_DIR = {root}/\nLOCAL_DATA_DIR = {root}/whisper/\nWHITELISTS_DIR = {root}/lists/\n\
             CONF_DIR = {root}/conf/\nLOG_DIR = {root}/log/\nPID_DIR = {root}/pid/\nDATABASE = whisper\n\
             ENABLE_LOGROTATION = False\nUSER =\nMAX_CACHE_SIZE = inf\nMAX_UPDATES_PER_SECOND = inf\n\
             MAX_CREATES_PER_MINUTE = inf\nLINE_RECEIVER_INTERFACE = 127.0.0.1\nLINE_RECEIVER_PORT = {}\n\
             ENABLE_UDP_LISTENER = False\nPICKLE_RECEIVER_INTERFACE = 127.0.0.1\nPICKLE_RECEIVER_PORT = {}\n\
             CACHE_QUERY_INTERFACE = 127.0.0.1\nCACHE_QUERY_PORT = {query}\nENABLE_TAGS = False\n",
            plaintext.port(),
            pickle.port()
        );
        std::fs::write(dir.path().join("conf/carbon.conf"), conf).expect("carbon.conf");
        std::fs::write(dir.path().join("conf/storage-schemas.conf"), schemas).expect("storage-schemas.conf");
        std::fs::write(dir.path().join("conf/storage-aggregation.conf"), aggregation)
            .expect("storage-aggregation.conf");
        let mut carbon = Carbon { server: None, dir, plaintext, pickle };
        carbon.restart();
        carbon
    }

    /// Starts carbon-cache again on the same ports and files (after [`Carbon::kill`]).
    pub fn restart(&mut self) {
        let run = Server::directory();
        let mut command = Command::new(system_binary("TESSERA_CARBON_CACHE_BIN", "carbon-cache"));
        command
            .arg(format!("--config={}", self.dir.path().join("conf/carbon.conf").display()))
            .args(["--debug", "start"]);
        // A pid file left by a killed carbon-cache makes the next one refuse to start.
        let _ = std::fs::remove_file(self.dir.path().join("pid/carbon-cache-a.pid"));
        let mut server = Server::spawn("carbon-cache", command, run, "; install Debian's `graphite-carbon`");
        let (plaintext, pickle) = (self.plaintext, self.pickle);
        let accepting = |address| TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok();
        server
            .wait_ready_with(Duration::from_secs(60), || accepting(plaintext) && accepting(pickle))
            .unwrap_or_else(|why| panic!("{why}"));
        self.server = Some(server);
    }

    /// Stops carbon-cache (SIGSTOP): the kernel still takes what is written to it, up to
    /// the sockets' buffers, and none of it reaches a whisper file.
    pub fn pause(&self) {
        if let Some(pid) = self.server.as_ref().and_then(Server::pid) {
            let _ = Command::new("kill").args(["-STOP", &pid.to_string()]).status();
        }
    }

    /// Kills carbon-cache at once (SIGKILL): what its cache held is lost.
    pub fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
    }

    /// carbon-cache's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(Server::pid)
    }

    /// carbon-cache's console log so far.
    pub fn log(&self) -> String {
        self.server.as_ref().map(Server::log).unwrap_or_default()
    }

    /// The whisper file of `path` (`stats.api.hits` → `<dir>/whisper/stats/api/hits.wsp`).
    pub fn whisper_file(&self, path: &str) -> PathBuf {
        self.dir.path().join("whisper").join(format!("{}.wsp", path.replace('.', "/")))
    }

    /// Every value stored for `path` since `from` (unix seconds), as `(timestamp, value)`;
    /// empty while the file does not exist.
    pub fn fetch(&self, path: &str, from: i64) -> Vec<(i64, f64)> {
        let file = self.whisper_file(path);
        if !file.exists() {
            return Vec::new();
        }
        let output = Command::new(system_binary("TESSERA_WHISPER_FETCH_BIN", "whisper-fetch"))
            .arg(format!("--from={from}"))
            .arg(&file)
            .output()
            .unwrap_or_else(|error| panic!("cannot run whisper-fetch ({error}); install Debian's `python3-whisper`"));
        assert!(
            output.status.success(),
            "whisper-fetch {}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (timestamp, value) = line.split_once('\t')?;
                Some((timestamp.trim().parse().ok()?, value.trim().parse().ok()?))
            })
            .collect()
    }
}
