//! A real carbon-cache for tests: Debian's `graphite-carbon` started as a child process
//! on free loopback ports (plaintext and pickle receivers), its configuration, whisper
//! files and log in a temporary directory, killed when dropped. Values are read back
//! from the whisper files with Debian's `whisper-fetch` (package `python3-whisper`).
//!
//! The binaries are `$TESSERA_CARBON_CACHE_BIN` and `$TESSERA_WHISPER_FETCH_BIN`, else
//! `carbon-cache` and `whisper-fetch` on `PATH`, else under `/usr/bin`.
//!
//! Carbon is configured as a test needs it, not as Debian ships it: no limit on creates
//! and updates (Debian's 50 creates a minute would hold new series back for minutes) and
//! one storage schema for every path. Tags are off, unless [`Carbon::start_tagged`] starts
//! a graphite-web (Debian's `graphite-web`, Django's development server, its tag database in
//! SQLite) beside it first: carbon then posts each new tagged series to that tag database,
//! and tagged series are read back as dashboards read them, through `/render` with
//! `seriesByTag(…)`. graphite-web must be up before carbon-cache, or carbon's tag index
//! misses the series created meanwhile.
//!
//! graphite-web runs under `$TESSERA_GRAPHITE_PYTHON`, else Debian's `/usr/bin/python3`
//! (the Python its packages are installed for).

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{Server, system_binary};
use crate::{free_port, http_get};

/// A running carbon-cache, killed on drop.
pub struct Carbon {
    server: Option<Server>,
    /// Configuration, whisper files and logs; kept across [`Carbon::restart`].
    dir: tempfile::TempDir,
    /// The plaintext receiver.
    pub plaintext: SocketAddr,
    /// The pickle receiver.
    pub pickle: SocketAddr,
    /// graphite-web, with [`Carbon::start_tagged`].
    web: Option<GraphiteWeb>,
}

/// graphite-web serving one carbon's whisper files and tag database, killed on drop.
struct GraphiteWeb {
    _server: Server,
    address: SocketAddr,
}

impl GraphiteWeb {
    /// Starts graphite-web on the whisper files under `root`, its database migrated, and
    /// waits until its tag API answers.
    fn start(root: &std::path::Path) -> GraphiteWeb {
        let address: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let dir = Server::directory();
        let root = root.display();
        let settings = format!(
            "SECRET_KEY = 'tessera-test'\nSTORAGE_DIR = '{root}/'\nWHISPER_DIR = '{root}/whisper/'\n\
             STANDARD_DIRS = ['{root}/whisper/']\nLOG_DIR = '{root}/log/'\nINDEX_FILE = '{root}/index'\n\
             CONF_DIR = '{root}/conf/'\nGRAPHITE_ROOT = '/usr/share/graphite-web'\n\
             STATIC_ROOT = '/usr/share/graphite-web/static'\n\
             TAGDB = 'graphite.tags.localdatabase.LocalDatabaseTagDB'\nTAGDB_CACHE_DURATION = 0\n\
             DATABASES = {{'default': {{'NAME': '{root}/graphite.db', 'ENGINE': 'django.db.backends.sqlite3'}}}}\n\
             LOG_ROTATION = False\nDEFAULT_XFILES_FACTOR = 0\nFUNCTION_PLUGINS = []\n"
        );
        std::fs::write(dir.path().join("tessera_graphite.py"), settings).expect("graphite-web's settings");
        let python = system_binary("TESSERA_GRAPHITE_PYTHON", "/usr/bin/python3");
        let django = |command: &mut Command| {
            command
                .env("PYTHONPATH", dir.path())
                .env("GRAPHITE_SETTINGS_MODULE", "tessera_graphite")
                .env("DJANGO_SETTINGS_MODULE", "graphite.settings")
                .args(["-m", "django"]);
        };
        let mut migrate = Command::new(&python);
        django(&mut migrate);
        let output = migrate.args(["migrate", "--run-syncdb"]).output().expect("graphite-web's migrate");
        assert!(
            output.status.success(),
            "graphite-web's database (install Debian's `graphite-web`): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut command = Command::new(&python);
        django(&mut command);
        command.args(["runserver", "--noreload", &address.to_string()]);
        let mut server = Server::spawn("graphite-web", command, dir, "; install Debian's `graphite-web`");
        let ready = || matches!(http_get(address, "/tags/findSeries?expr=name=none"), Ok((200, _)));
        server.wait_ready_with(Duration::from_secs(60), ready).unwrap_or_else(|why| panic!("{why}"));
        GraphiteWeb { _server: server, address }
    }
}

/// One series of a graphite-web `/render` answer: its name (tags included) and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The series' name, `path;tag=value;…` for a tagged series.
    pub target: String,
    /// Its tags, `name` included.
    pub tags: serde_json::Map<String, serde_json::Value>,
    /// `(timestamp, value)` of every slot that holds a value.
    pub points: Vec<(i64, f64)>,
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
        Carbon::start_inner(schemas, aggregation, false)
    }

    /// [`Carbon::start_with`], with tags on and a graphite-web beside it (started first),
    /// to read tagged series back with [`Carbon::render`].
    pub fn start_tagged(schemas: &str, aggregation: &str) -> Carbon {
        Carbon::start_inner(schemas, aggregation, true)
    }

    fn start_inner(schemas: &str, aggregation: &str, tagged: bool) -> Carbon {
        let dir = Server::directory();
        let plaintext: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let pickle: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let query = free_port();
        let root = dir.path().display().to_string();
        for sub in ["conf", "whisper", "log", "pid", "lists"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("carbon's directories");
        }
        let web = tagged.then(|| GraphiteWeb::start(dir.path()));
        let tags = match &web {
            Some(web) => format!("ENABLE_TAGS = True\nGRAPHITE_URL = http://{}\n", web.address),
            None => "ENABLE_TAGS = False\n".to_owned(),
        };
        let conf = format!(
            "[cache]\nSTORAGE_DIR = {root}/\nLOCAL_DATA_DIR = {root}/whisper/\nWHITELISTS_DIR = {root}/lists/\n\
             CONF_DIR = {root}/conf/\nLOG_DIR = {root}/log/\nPID_DIR = {root}/pid/\nDATABASE = whisper\n\
             ENABLE_LOGROTATION = False\nUSER =\nMAX_CACHE_SIZE = inf\nMAX_UPDATES_PER_SECOND = inf\n\
             MAX_CREATES_PER_MINUTE = inf\nLINE_RECEIVER_INTERFACE = 127.0.0.1\nLINE_RECEIVER_PORT = {}\n\
             ENABLE_UDP_LISTENER = False\nPICKLE_RECEIVER_INTERFACE = 127.0.0.1\nPICKLE_RECEIVER_PORT = {}\n\
             CACHE_QUERY_INTERFACE = 127.0.0.1\nCACHE_QUERY_PORT = {query}\n{tags}",
            plaintext.port(),
            pickle.port()
        );
        std::fs::write(dir.path().join("conf/carbon.conf"), conf).expect("carbon.conf");
        std::fs::write(dir.path().join("conf/storage-schemas.conf"), schemas).expect("storage-schemas.conf");
        std::fs::write(dir.path().join("conf/storage-aggregation.conf"), aggregation)
            .expect("storage-aggregation.conf");
        let mut carbon = Carbon { server: None, dir, plaintext, pickle, web };
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

    /// What graphite-web's `/render?target=…&format=json` answers for `target` (such as
    /// `seriesByTag('name=stats_counts.api.hits')`) since `from` (unix seconds): each
    /// series found, with the slots that hold a value. Needs [`Carbon::start_tagged`].
    pub fn render(&self, target: &str, from: i64) -> Vec<Rendered> {
        let web = self.web.as_ref().expect("render needs Carbon::start_tagged");
        let encoded = crate::prometheus::encode_component(target);
        let path = format!("/render?target={encoded}&format=json&from={from}&until=now");
        let (status, body) = http_get(web.address, &path).expect("graphite-web answers /render");
        assert_eq!(status, 200, "graphite-web /render {target}: {body}");
        let answer: Vec<serde_json::Value> = serde_json::from_str(&body)
            .unwrap_or_else(|error| panic!("graphite-web /render {target}: {error}: {body}"));
        answer
            .iter()
            .map(|series| Rendered {
                target: series["target"].as_str().unwrap_or_default().to_owned(),
                tags: series["tags"].as_object().cloned().unwrap_or_default(),
                points: series["datapoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|point| Some((point[1].as_i64()?, point[0].as_f64()?)))
                    .collect(),
            })
            .collect()
    }

    /// [`Carbon::fetch`] without a process per file: the whisper file's first archive read
    /// here ([`read_whisper`]), for checkers that read thousands of series.
    pub fn points(&self, path: &str, from: i64) -> Vec<(i64, f64)> {
        read_whisper(&self.whisper_file(path), from).unwrap_or_default()
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

/// The points of a whisper file's first (finest) archive stamped at or after `from` (unix
/// seconds), by time: whisper's format is a header (aggregation, max retention, xFilesFactor,
/// archive count), one `(offset, seconds per point, points)` per archive, then each archive
/// a ring of `(timestamp u32, value f64)`, all big-endian. A slot never written holds
/// timestamp 0; one written before the ring wrapped holds a timestamp older than the
/// archive's retention, left out when `from` is within it.
pub fn read_whisper(path: &std::path::Path, from: i64) -> std::io::Result<Vec<(i64, f64)>> {
    let bytes = std::fs::read(path)?;
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: not whisper", path.display()));
    let u32_at = |at: usize| -> std::io::Result<u32> {
        Ok(u32::from_be_bytes(bytes.get(at..at + 4).ok_or_else(invalid)?.try_into().map_err(|_| invalid())?))
    };
    if u32_at(12)? == 0 {
        return Ok(Vec::new());
    }
    let (offset, points) = (u32_at(16)? as usize, u32_at(24)? as usize);
    let mut out = Vec::new();
    for slot in 0..points {
        let at = offset + slot * 12;
        let timestamp = i64::from(u32_at(at)?);
        let value =
            f64::from_be_bytes(bytes.get(at + 4..at + 12).ok_or_else(invalid)?.try_into().map_err(|_| invalid())?);
        if timestamp != 0 && timestamp >= from {
            out.push((timestamp, value));
        }
    }
    out.sort_by_key(|point| point.0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// The reader against whisper's own tools: a file made by `whisper-create`, written by
    /// `whisper-update`, read back the same as `whisper-fetch` reads it.
    #[test]
    fn read_whisper_reads_what_whispers_tools_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.wsp");
        // whisper's other tools, from wherever whisper-fetch is.
        let tool = |name: &str| Command::new(system_binary("TESSERA_WHISPER_FETCH_BIN", name).with_file_name(name));
        let created = tool("whisper-create").arg(&file).args(["10s:1h", "1m:1d"]).output().unwrap();
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let end = now - now % 10;
        let points = [(end - 30, 1.5), (end - 20, -2.0), (end, 1e9)];
        let mut update = tool("whisper-update");
        update.arg(&file).args(points.iter().map(|(time, value)| format!("{time}:{value}")));
        assert!(update.status().unwrap().success());
        assert_eq!(read_whisper(&file, end - 60).unwrap(), points.to_vec());
        assert_eq!(read_whisper(&file, end - 20).unwrap(), points[1..].to_vec());
    }
}
