//! A password on the telemetry port, from a web configuration file in the format of
//! Prometheus' exporter-toolkit (`--web.config.file`), so that the file an SRE already
//! writes for node_exporter works here:
//!
//! ```yaml
//! basic_auth_users:
//!   prometheus: $2y$10$…    # bcrypt, e.g. `htpasswd -nBC 10 "" | tr -d ':\n'`
//! ```
//!
//! With users listed, every path but `/healthz` and `/readyz` (left open for probes)
//! needs HTTP basic auth as one of them: `/metrics`, the dashboard, the profiler. A
//! request without it, or with a wrong one, gets 401 with a `WWW-Authenticate` challenge
//! and is counted in `tessera_<daemon>_telemetry_auth_failures_total{reason}` (`missing`,
//! `malformed`, `wrong`; exported by every daemon, 0 without a web config). A bcrypt check takes tens of milliseconds by design, so it runs
//! off the async workers, and a pair of credentials once accepted is remembered (up to
//! [`REMEMBERED`] pairs, until the file changes) so that a scrape every few seconds costs
//! one check, as exporter-toolkit does.
//!
//! The file is read again when it changes on disk: users added, removed or with a new
//! hash take effect on the next request. A file that no longer parses keeps the users it
//! had, logged and counted (`tessera_<daemon>_telemetry_web_config_reload_errors_total`).
//!
//! **Not built yet:** `tls_server_config` (the port serves plain HTTP; a file that has it is
//! refused at start, so that nobody believes the port is encrypted). Until then, basic auth
//! on a port others reach sends the password in clear: keep the port on a private network,
//! or put a TLS proxy in front.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

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
    tls_server_config: Option<serde_yaml::Value>,
    #[serde(default)]
    http_server_config: Option<serde_yaml::Value>,
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
        self.reload_if_changed();
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

/// The users of the file at `path`, and when it was modified.
fn read(path: &Path) -> Result<(BTreeMap<String, String>, Option<SystemTime>), WebConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| WebConfigError::Read { path: path.to_owned(), source })?;
    let modified = std::fs::metadata(path).and_then(|metadata| metadata.modified()).ok();
    let invalid = |message: String| WebConfigError::Invalid { path: path.to_owned(), message };
    let file: File = serde_yaml::from_str(&text).map_err(|error| invalid(error.to_string()))?;
    if file.tls_server_config.is_some() {
        return Err(invalid(
            "tls_server_config is not supported yet: the telemetry port serves plain HTTP \
             (put a TLS proxy in front of it, or leave the key out)"
                .to_owned(),
        ));
    }
    if file.http_server_config.is_some() {
        return Err(invalid("http_server_config is not supported".to_owned()));
    }
    if file.basic_auth_users.is_empty() {
        return Err(invalid("basic_auth_users lists no user".to_owned()));
    }
    for (user, hash) in &file.basic_auth_users {
        if user.contains(':') {
            return Err(invalid(format!("user name `{user}` holds a `:`, which basic auth cannot send")));
        }
        if hash.parse::<bcrypt::HashParts>().is_err() {
            return Err(invalid(format!("the password of `{user}` is not a bcrypt hash (`$2y$…`)")));
        }
    }
    Ok((file.basic_auth_users, modified))
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
    fn files_that_cannot_work_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("x", 4).unwrap();
        for (text, reason) in [
            (
                format!("tls_server_config:\n  cert_file: a\nbasic_auth_users:\n  u: {hash}\n"),
                "tls_server_config is not supported yet",
            ),
            ("basic_auth_users:\n  u: plain-text\n".to_owned(), "not a bcrypt hash"),
            (format!("basic_auth_users:\n  \"a:b\": {hash}\n"), "holds a `:`"),
            ("basic_auth_users: {}\n".to_owned(), "lists no user"),
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
