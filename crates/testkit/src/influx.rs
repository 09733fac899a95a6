//! A real InfluxDB 1.x for tests: Debian's `influxdb` (`influxd`) started as a child
//! process on free loopback ports, its data in a temporary directory, readiness polled on
//! `/ping` (204), killed when dropped. Queries go through its HTTP `/query` API. Its
//! series limits are off (`max-values-per-tag`, `max-series-per-database`: 100 000 and a
//! million by default), so that a benchmark can write a million series.
//!
//! The binary is `$TESSERA_INFLUXD_BIN`, else `influxd` on `PATH`, else `/usr/bin/influxd`.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, system_binary};
use crate::{free_port, http_get};

/// The admin a server with authentication gets, and its password.
pub const ADMIN: (&str, &str) = ("admin", "tessera-admin-password");

/// A running influxd, killed on drop.
pub struct Influx {
    server: Option<Server>,
    dir: tempfile::TempDir,
    /// Where its HTTP API listens.
    pub address: SocketAddr,
    auth: bool,
}

impl Influx {
    /// Starts influxd without authentication.
    pub fn start() -> Influx {
        Influx::start_with(false)
    }

    /// Starts influxd with `auth-enabled` and the admin [`ADMIN`].
    pub fn start_with_auth() -> Influx {
        Influx::start_with(true)
    }

    fn start_with(auth: bool) -> Influx {
        let dir = Server::directory();
        let address: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let root = dir.path().display().to_string();
        let config = format!(
            "reporting-disabled = true\nbind-address = \"127.0.0.1:{}\"\n[meta]\n  dir = \"{root}/meta\"\n\
             [data]\n  dir = \"{root}/data\"\n  wal-dir = \"{root}/wal\"\n  query-log-enabled = false\n\
             max-values-per-tag = 0\n  max-series-per-database = 0\n\
             [http]\n  bind-address = \"{address}\"\n  auth-enabled = {auth}\n  log-enabled = false\n\
             [monitor]\n  store-enabled = false\n",
            free_port()
        );
        std::fs::write(dir.path().join("influxdb.conf"), config).expect("influxdb.conf");
        let mut influx = Influx { server: None, dir, address, auth };
        influx.restart();
        if auth {
            let (user, password) = ADMIN;
            influx.query(&format!("CREATE USER {user} WITH PASSWORD '{password}' WITH ALL PRIVILEGES"));
        }
        influx
    }

    /// Starts influxd again on the same port and data (after [`Influx::kill`]).
    pub fn restart(&mut self) {
        let run = Server::directory();
        let mut command = Command::new(system_binary("TESSERA_INFLUXD_BIN", "influxd"));
        command.arg("-config").arg(self.dir.path().join("influxdb.conf"));
        let mut server = Server::spawn("influxd", command, run, "; install Debian's `influxdb`");
        let address = self.address;
        // `/ping` answers 204.
        let ready = || matches!(http_get(address, "/ping"), Ok((204, _)));
        server.wait_ready_with(Duration::from_secs(60), ready).unwrap_or_else(|why| panic!("{why}"));
        self.server = Some(server);
    }

    /// Kills influxd at once (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
    }

    /// influxd's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(Server::pid)
    }

    /// influxd's log so far.
    pub fn log(&self) -> String {
        self.server.as_ref().map(Server::log).unwrap_or_default()
    }

    /// Runs an InfluxQL statement (`CREATE DATABASE x`, `SELECT …` with `db=` in
    /// `statement`'s `database`), as the admin when the server has authentication;
    /// returns the JSON answer.
    pub fn query(&self, statement: &str) -> serde_json::Value {
        self.query_in("", statement)
    }

    /// [`Influx::query`] in `database`.
    pub fn query_in(&self, database: &str, statement: &str) -> serde_json::Value {
        let encoded = crate::prometheus::encode_component(statement);
        let mut path = format!("/query?db={database}&epoch=ms&q={encoded}");
        if self.auth {
            let (user, password) = ADMIN;
            path.push_str(&format!("&u={user}&p={password}"));
        }
        // influxd takes statements that change things by GET too (1.x, deprecated but kept).
        let (status, body) = http_get(self.address, &path).expect("influxd answers /query");
        assert!(status == 200, "influxd /query {statement}: {status} {body}");
        serde_json::from_str(&body).unwrap_or_else(|error| panic!("influxd /query {statement}: {error}: {body}"))
    }

    /// The rows of `SELECT … FROM …` in `database`: each row's columns by name.
    pub fn rows(&self, database: &str, statement: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        let answer = self.query_in(database, statement);
        let mut rows = Vec::new();
        let series = answer["results"][0]["series"].as_array().cloned().unwrap_or_default();
        for one in series {
            let columns: Vec<String> = one["columns"]
                .as_array()
                .map(|columns| columns.iter().filter_map(|column| column.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let tags = one["tags"].as_object().cloned().unwrap_or_default();
            for values in one["values"].as_array().cloned().unwrap_or_default() {
                let mut row = tags.clone();
                for (column, value) in columns.iter().zip(values.as_array().cloned().unwrap_or_default()) {
                    row.insert(column.clone(), value);
                }
                rows.push(row);
            }
        }
        rows
    }
}
