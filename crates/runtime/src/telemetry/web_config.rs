//! TLS and a password on the telemetry port, from a web configuration file in the format
//! of Prometheus' exporter-toolkit (`--web.config.file`), so that the file an SRE already
//! writes for node_exporter works here:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt      # PEM chain; relative paths are from this file's directory
//!   key_file: server.key
//!   client_ca_file: ca.crt     # with client_auth_type below: mutual TLS
//!   client_auth_type: RequireAndVerifyClientCert  # or VerifyClientCertIfGiven, NoClientCert
//!   min_version: TLS12         # or TLS13; max_version too
//! basic_auth_users:
//!   prometheus: $2y$10$…    # bcrypt, e.g. `htpasswd -nBC 10 "" | tr -d ':\n'`
//! ```
//!
//! Either part may be left out, not both.
//!
//! **TLS.** With `tls_server_config` the port speaks only HTTPS (rustls, ring). The
//! certificate, key and client CA files are read again when they change on disk (looked at
//! most once a second, as the wire's certificates are): a new connection gets the new
//! certificate, and a rotation that does not load keeps the previous one, logged and
//! counted in `tessera_<daemon>_telemetry_web_config_reload_errors_total`. The section
//! itself (which files, which client auth) is read at start. A handshake that fails, a
//! client without an accepted certificate, or one silent for 10 s, is counted in
//! `tessera_<daemon>_telemetry_tls_failures_total{reason}` (`no_certificate`,
//! `unknown_ca`, `bad_certificate`, `timeout`, `tls`). exporter-toolkit's
//! `RequestClientCert` and `RequireAnyClientCert` (certificates asked for and not
//! verified), `cipher_suites`, `curve_preferences` and `client_allowed_sans` are refused
//! with the reason: rustls' defaults are used.
//!
//! **Basic auth.** With users listed, every path but `/healthz` and `/readyz` (left open
//! for probes) needs HTTP basic auth as one of them: `/metrics`, the dashboard, the
//! profiler. A request without it, or with a wrong one, gets 401 with a `WWW-Authenticate`
//! challenge and is counted in `tessera_<daemon>_telemetry_auth_failures_total{reason}`
//! (`missing`, `malformed`, `wrong`; exported by every daemon, 0 without a web config). A
//! bcrypt check takes tens of milliseconds by design, so it runs off the async workers, and
//! a pair of credentials once accepted is remembered (up to [`REMEMBERED`] pairs, until the
//! file changes) so that a scrape every few seconds costs one check, as exporter-toolkit
//! does. The users are read again when the file changes: users added, removed or with a
//! new hash take effect on the next request (none left: no password asked). A file that no
//! longer parses keeps the users it had, logged and counted.
//!
//! Without `tls_server_config`, basic auth sends the password in clear: keep such a port
//! on a private network.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::ServerConfig;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;

/// Accepted credential pairs remembered, so that a steady scraper costs one bcrypt check.
pub const REMEMBERED: usize = 64;

/// Why a web configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file cannot be read.
    #[error("cannot read the telemetry web config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a web configuration.
    #[error("invalid telemetry web config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The file's keys tessera reads (exporter-toolkit's names).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    #[serde(default)]
    tls_server_config: Option<TlsSection>,
    #[serde(default)]
    http_server_config: Option<serde_yaml::Value>,
}

/// `tls_server_config`: the keys tessera reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
}

/// `--check-config`'s look at a daemon's web config (`None`: it has none): what the daemon
/// would refuse at start, it refuses here, without listening.
///
/// # Errors
///
/// The file cannot be read or parsed, or its TLS section or certificates cannot work.
pub fn check(path: Option<&Path>) -> Result<(), WebConfigError> {
    let Some(path) = path else { return Ok(()) };
    read(path)?;
    load_tls(path, Counter::default()).map(|_| ())
}

/// The telemetry port's TLS: its rustls configuration, rebuilt when a file changes.
pub type Tls = crate::tls::Reloading<ServerConfig>;

/// Reads the `tls_server_config` of the web config at `path`: `None` when it has none.
/// Later changes of its certificate files that do not load count in `reload_errors`.
///
/// # Errors
///
/// The file cannot be read or parsed, the section asks for what tessera does not do, or
/// its certificates do not load (each named, with the reason).
pub fn load_tls(path: &Path, reload_errors: Counter) -> Result<Option<Tls>, WebConfigError> {
    let invalid = |message: String| WebConfigError::Invalid { path: path.to_owned(), message };
    let Some(section) = parse(path)?.tls_server_config else { return Ok(None) };
    let base = path.parent().unwrap_or(Path::new("."));
    let cert = base.join(&section.cert_file);
    let key = base.join(&section.key_file);
    let ca = section.client_ca_file.as_ref().map(|ca| base.join(ca));
    let auth_type = section.client_auth_type.as_deref().unwrap_or("NoClientCert");
    match (auth_type, &ca) {
        ("NoClientCert", Some(_)) => {
            return Err(invalid(
                "tls_server_config: client_ca_file without client_auth_type; set it to \
                 RequireAndVerifyClientCert (or VerifyClientCertIfGiven)"
                    .to_owned(),
            ));
        }
        ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven", None) => {
            return Err(invalid(format!("tls_server_config: client_auth_type {auth_type} needs client_ca_file")));
        }
        ("NoClientCert" | "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven", _) => {}
        ("RequestClientCert" | "RequireAnyClientCert", _) => {
            return Err(invalid(format!(
                "tls_server_config: client_auth_type {auth_type} accepts certificates it does not verify, \
                 which tessera does not do; use RequireAndVerifyClientCert with client_ca_file"
            )));
        }
        (other, _) => {
            return Err(invalid(format!(
                "tls_server_config: unknown client_auth_type `{other}` (NoClientCert, \
                 RequireAndVerifyClientCert or VerifyClientCertIfGiven)"
            )));
        }
    }
    let version = |key: &str, value: Option<&str>, default| match value {
        None => Ok(default),
        Some("TLS12") => Ok(0),
        Some("TLS13") => Ok(1),
        Some(other) => Err(invalid(format!("tls_server_config: {key} `{other}`: TLS12 or TLS13"))),
    };
    let (min, max) = (
        version("min_version", section.min_version.as_deref(), 0)?,
        version("max_version", section.max_version.as_deref(), 1)?,
    );
    if min > max {
        return Err(invalid("tls_server_config: min_version is above max_version".to_owned()));
    }
    let all = [&rustls::version::TLS12, &rustls::version::TLS13];
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = all[min..=max].to_vec();
    let files: Vec<PathBuf> = [Some(&cert), Some(&key), ca.as_ref()].into_iter().flatten().cloned().collect();
    let optional = auth_type == "VerifyClientCertIfGiven";
    let build = move || {
        let clients = match &ca {
            Some(ca) if optional => crate::tls::ClientCerts::IfGiven(ca),
            Some(ca) => crate::tls::ClientCerts::Required(ca),
            None => crate::tls::ClientCerts::NotAsked,
        };
        crate::tls::server_config(&cert, &key, clients, &versions)
    };
    let on_error = move |error: &crate::tls::TlsError| {
        reload_errors.inc();
        tracing::warn!(%error, "the telemetry port's certificates changed and do not load; keeping the previous ones");
    };
    crate::tls::Reloading::new(files, build, on_error)
        .map(Some)
        .map_err(|error| invalid(format!("tls_server_config: {error}")))
}

/// The users of one version of the file.
#[derive(Debug)]
struct Users {
    /// User name → bcrypt hash.
    hashes: BTreeMap<String, String>,
    /// When the file was last modified, to notice a change.
    modified: Option<SystemTime>,
    /// `user:password` pairs accepted since the file was read.
    accepted: HashSet<Vec<u8>>,
}

/// Basic auth from a web configuration file; cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct BasicAuth {
    path: PathBuf,
    users: Arc<Mutex<Users>>,
    failures: Family<Vec<(&'static str, &'static str)>, Counter>,
    reload_errors: Counter,
}

/// What [`BasicAuth::check`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The request may go on.
    Allowed,
    /// Refused, for this reason (`missing`, `malformed`, `wrong`).
    Refused(&'static str),
}

impl BasicAuth {
    /// Reads `path`; an error names the file and what is wrong with it. Refusals count in
    /// `failures` (by reason), changes of the file that do not load in `reload_errors`.
    pub fn load(
        path: &Path,
        failures: Family<Vec<(&'static str, &'static str)>, Counter>,
        reload_errors: Counter,
    ) -> Result<BasicAuth, WebConfigError> {
        let (hashes, modified) = read(path)?;
        Ok(BasicAuth {
            path: path.to_owned(),
            users: Arc::new(Mutex::new(Users { hashes, modified, accepted: HashSet::new() })),
            failures,
            reload_errors,
        })
    }

    /// Checks an `Authorization` header's value (`None`: no header). Blocks for a bcrypt
    /// check when the pair was not accepted before: call it off the async workers.
    pub fn check(&self, authorization: Option<&[u8]>) -> Verdict {
        let verdict = self.decide(authorization);
        if let Verdict::Refused(reason) = verdict {
            self.failures.get_or_create(&vec![("reason", reason)]).inc();
        }
        verdict
    }

    fn decide(&self, authorization: Option<&[u8]>) -> Verdict {
        self.reload_if_changed();
        if self.users.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).hashes.is_empty() {
            return Verdict::Allowed;
        }
        let Some(header) = authorization else { return Verdict::Refused("missing") };
        let Some(encoded) = header.strip_prefix(b"Basic ").or_else(|| header.strip_prefix(b"basic ")) else {
            return Verdict::Refused("malformed");
        };
        let Some(pair) = tessera_core::base64::decode(encoded.trim_ascii()) else {
            return Verdict::Refused("malformed");
        };
        let Some(colon) = pair.iter().position(|byte| *byte == b':') else {
            return Verdict::Refused("malformed");
        };
        let (Ok(user), password) = (std::str::from_utf8(&pair[..colon]), &pair[colon + 1..]) else {
            return Verdict::Refused("malformed");
        };
        let hash = {
            let users = self.users.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if users.accepted.contains(&pair) {
                return Verdict::Allowed;
            }
            match users.hashes.get(user) {
                Some(hash) => hash.clone(),
                None => return Verdict::Refused("wrong"),
            }
        };
        if !bcrypt::verify(password, &hash).unwrap_or(false) {
            return Verdict::Refused("wrong");
        }
        let mut users = self.users.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Only if the hash is still the one checked (the file may have changed meanwhile).
        if users.hashes.get(user) == Some(&hash) {
            if users.accepted.len() >= REMEMBERED {
                users.accepted.clear();
            }
            users.accepted.insert(pair);
        }
        Verdict::Allowed
    }

    /// Reads the file again if it changed on disk; a version that does not load is logged
    /// and counted, and the users stay as they were.
    fn reload_if_changed(&self) {
        let modified = std::fs::metadata(&self.path).and_then(|metadata| metadata.modified()).ok();
        let mut users = self.users.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if modified == users.modified {
            return;
        }
        users.modified = modified;
        match read(&self.path) {
            Ok((hashes, _)) => {
                tracing::info!(file = %self.path.display(), users = hashes.len(), "telemetry web config reloaded");
                users.hashes = hashes;
                users.accepted.clear();
            }
            Err(error) => {
                self.reload_errors.inc();
                tracing::warn!(%error, "telemetry web config changed and does not load; keeping the users it had");
            }
        }
    }
}

/// The file at `path`, parsed, with the checks every part needs.
fn parse(path: &Path) -> Result<File, WebConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| WebConfigError::Read { path: path.to_owned(), source })?;
    let invalid = |message: String| WebConfigError::Invalid { path: path.to_owned(), message };
    let file: File = serde_yaml::from_str(&text).map_err(|error| invalid(error.to_string()))?;
    if file.http_server_config.is_some() {
        return Err(invalid("http_server_config is not supported".to_owned()));
    }
    if file.basic_auth_users.is_empty() && file.tls_server_config.is_none() {
        return Err(invalid("it lists neither basic_auth_users nor tls_server_config".to_owned()));
    }
    for (user, hash) in &file.basic_auth_users {
        if user.contains(':') {
            return Err(invalid(format!("user name `{user}` holds a `:`, which basic auth cannot send")));
        }
        if hash.parse::<bcrypt::HashParts>().is_err() {
            return Err(invalid(format!("the password of `{user}` is not a bcrypt hash (`$2y$…`)")));
        }
    }
    Ok(file)
}

/// The users of the file at `path` (none: no password asked), and when it was modified.
fn read(path: &Path) -> Result<(BTreeMap<String, String>, Option<SystemTime>), WebConfigError> {
    let modified = std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok();
    Ok((parse(path)?.basic_auth_users, modified))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> Vec<u8> {
        let encoded = tessera_core::base64::encode(format!("{user}:{password}").as_bytes());
        format!("Basic {encoded}").into_bytes()
    }

    fn file_with(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("web.yml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn right_wrong_missing_and_malformed_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::load(
            &file_with(dir.path(), &format!("basic_auth_users:\n  prom: {hash}\n")),
            Family::default(),
            Counter::default(),
        )
        .unwrap();
        assert_eq!(auth.check(Some(&header("prom", "s3cret"))), Verdict::Allowed);
        // Remembered: the same pair again is allowed without another bcrypt check.
        assert_eq!(auth.check(Some(&header("prom", "s3cret"))), Verdict::Allowed);
        assert_eq!(auth.check(Some(&header("prom", "guess"))), Verdict::Refused("wrong"));
        assert_eq!(auth.check(Some(&header("nobody", "s3cret"))), Verdict::Refused("wrong"));
        assert_eq!(auth.check(None), Verdict::Refused("missing"));
        assert_eq!(auth.check(Some(b"Bearer abc")), Verdict::Refused("malformed"));
        assert_eq!(auth.check(Some(b"Basic !!!")), Verdict::Refused("malformed"));
        let count = |reason: &'static str| auth.failures.get_or_create(&vec![("reason", reason)]).get();
        assert_eq!((count("wrong"), count("missing"), count("malformed")), (2, 1, 2));
    }

    #[test]
    fn a_changed_file_takes_effect_and_a_broken_one_keeps_the_users() {
        let dir = tempfile::tempdir().unwrap();
        let first = bcrypt::hash("one", 4).unwrap();
        let path = file_with(dir.path(), &format!("basic_auth_users:\n  prom: {first}\n"));
        let auth = BasicAuth::load(&path, Family::default(), Counter::default()).unwrap();
        assert_eq!(auth.check(Some(&header("prom", "one"))), Verdict::Allowed);
        // A new password: the old one, though remembered, no longer opens.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = bcrypt::hash("two", 4).unwrap();
        std::fs::write(&path, format!("basic_auth_users:\n  prom: {second}\n")).unwrap();
        let bump = SystemTime::now() + std::time::Duration::from_secs(1);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(bump).unwrap();
        assert_eq!(auth.check(Some(&header("prom", "one"))), Verdict::Refused("wrong"));
        assert_eq!(auth.check(Some(&header("prom", "two"))), Verdict::Allowed);
        // A broken version: logged and counted, the users stay.
        std::fs::write(&path, "basic_auth_users: [").unwrap();
        let bump = bump + std::time::Duration::from_secs(1);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(bump).unwrap();
        assert_eq!(auth.check(Some(&header("prom", "two"))), Verdict::Allowed);
        assert_eq!(auth.reload_errors.get(), 1);
    }

    #[test]
    fn tls_sections_tessera_cannot_serve_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let pair = "  cert_file: a.crt\n  key_file: a.key\n";
        for (section, reason) in [
            ("  cert_file: a.crt\n".to_owned(), "missing field `key_file`"),
            (format!("{pair}  client_ca_file: ca.crt\n"), "without client_auth_type"),
            (format!("{pair}  client_auth_type: RequireAndVerifyClientCert\n"), "needs client_ca_file"),
            (format!("{pair}  client_ca_file: ca.crt\n  client_auth_type: RequireAnyClientCert\n"), "does not verify"),
            (format!("{pair}  client_auth_type: Sometimes\n"), "unknown client_auth_type `Sometimes`"),
            (format!("{pair}  min_version: TLS11\n"), "TLS12 or TLS13"),
            (format!("{pair}  min_version: TLS13\n  max_version: TLS12\n"), "above max_version"),
            (format!("{pair}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"), "unknown field `cipher_suites`"),
            (pair.to_owned(), "cert_file"),
        ] {
            let path = file_with(dir.path(), &format!("tls_server_config:\n{section}"));
            let error = load_tls(&path, Counter::default()).unwrap_err().to_string();
            assert!(error.contains(reason) && error.contains("web.yml"), "{section}: {error}");
        }
        // The missing certificate is named where it was looked for: beside the web config.
        let path = file_with(dir.path(), &format!("tls_server_config:\n{pair}"));
        let error = load_tls(&path, Counter::default()).unwrap_err().to_string();
        assert!(error.contains(&dir.path().join("a.crt").display().to_string()), "{error}");
        // Basic auth alone: no TLS; TLS alone: no password asked.
        let hash = bcrypt::hash("x", 4).unwrap();
        let users = file_with(dir.path(), &format!("basic_auth_users:\n  u: {hash}\n"));
        assert!(load_tls(&users, Counter::default()).unwrap().is_none());
    }

    #[test]
    fn a_file_with_tls_and_no_users_asks_no_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_with(dir.path(), "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n");
        let auth = BasicAuth::load(&path, Family::default(), Counter::default()).unwrap();
        assert_eq!(auth.check(None), Verdict::Allowed);
    }

    #[test]
    fn files_that_cannot_work_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("x", 4).unwrap();
        for (text, reason) in [
            ("basic_auth_users:\n  u: plain-text\n".to_owned(), "not a bcrypt hash"),
            (format!("basic_auth_users:\n  \"a:b\": {hash}\n"), "holds a `:`"),
            ("basic_auth_users: {}\n".to_owned(), "neither basic_auth_users nor tls_server_config"),
            ("basic_auth_user:\n  u: x\n".to_owned(), "unknown field"),
        ] {
            let error = BasicAuth::load(&file_with(dir.path(), &text), Family::default(), Counter::default())
                .unwrap_err()
                .to_string();
            assert!(error.contains(reason) && error.contains("web.yml"), "{text}: {error}");
        }
        let error = BasicAuth::load(&dir.path().join("missing.yml"), Family::default(), Counter::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot read") && error.contains("missing.yml"), "{error}");
    }
}
