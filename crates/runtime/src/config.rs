//! Loading a daemon's TOML config file.
//!
//! Each daemon owns its config struct, with `#[serde(default, deny_unknown_fields)]`, a
//! doc on every key and units in key names (`flush_interval_secs`). [`load_toml`] reads
//! and parses it; with no file, the struct's serde defaults apply. A binary that gets a
//! [`ConfigError`] (or fails its own validation) prints it and exits with
//! [`EXIT_CONFIG`].
//!
//! ```
//! use tessera_runtime::config::load_toml;
//!
//! #[derive(Debug, Default, serde::Deserialize)]
//! #[serde(default, deny_unknown_fields)]
//! struct Config {
//!     /// How often partials are flushed, in seconds.
//!     flush_interval_secs: u64,
//! }
//!
//! let config: Config = load_toml(None).unwrap();
//! assert_eq!(config.flush_interval_secs, 0);
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Exit code for a bad config file or bad flags (`EX_USAGE` from `sysexits.h`).
pub const EXIT_CONFIG: u8 = 64;

/// `[telemetry]`, the same table in every daemon's config: where `/metrics`, `/healthz`
/// and `/readyz` are served, by default on loopback port `DEFAULT_PORT` (each daemon has
/// its own, so that they can share a host).
#[derive(Debug, Clone)]
pub struct TelemetryConfig<const DEFAULT_PORT: u16> {
    /// Address of `/metrics`, `/healthz`, `/readyz`; off when `None` (which only code,
    /// such as tests, can ask for: a missing key means the default address).
    pub listen: Option<SocketAddr>,
    /// Serve CPU profiles at `/debug/pprof/profile` (default `true`); `false` answers 403
    /// there, for a port others can reach.
    pub profiling: bool,
    /// A Prometheus exporter-toolkit web configuration file: `tls_server_config` (HTTPS
    /// only, mutual TLS with a client CA) and `basic_auth_users` (bcrypt hashes, which every
    /// path but `/healthz` and `/readyz` requires) ([`crate::telemetry::web_config`]); none
    /// by default.
    pub web_config: Option<PathBuf>,
}

// serde's derive does not take const generics yet.
impl<'de, const DEFAULT_PORT: u16> Deserialize<'de> for TelemetryConfig<DEFAULT_PORT> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            listen: Option<SocketAddr>,
            #[serde(default = "profiling_default")]
            profiling: bool,
            #[serde(default)]
            web_config: Option<PathBuf>,
        }
        fn profiling_default() -> bool {
            true
        }
        let fields = Fields::deserialize(deserializer)?;
        Ok(TelemetryConfig {
            listen: fields.listen.or(Self::default().listen),
            profiling: fields.profiling,
            web_config: fields.web_config,
        })
    }
}

impl<const DEFAULT_PORT: u16> Default for TelemetryConfig<DEFAULT_PORT> {
    fn default() -> Self {
        TelemetryConfig { listen: Some((Ipv4Addr::LOCALHOST, DEFAULT_PORT).into()), profiling: true, web_config: None }
    }
}

/// A configuration value that parses but cannot work (each daemon's validation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{key}`: {reason}")]
pub struct InvalidSetting {
    /// The key, e.g. `aggregation.interval_ms`.
    pub key: String,
    /// Why.
    pub reason: String,
}

impl InvalidSetting {
    /// `key` cannot be used, because `reason`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> InvalidSetting {
        InvalidSetting { key: key.into(), reason: reason.into() }
    }
}

/// Why a config file could not be loaded.
///
/// The message names the file and carries the underlying cause in full (for a parse
/// error, toml's line, column, a snippet and the offending key), so `{}` is enough to
/// report it. The cause is deliberately not also returned by
/// [`source`](std::error::Error::source), so that error-chain printers (`anyhow`'s
/// `{:#}`) do not print it twice; it stays available in the `error` field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    #[error("cannot read config file `{path}`: {error}")]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// What reading it returned.
        error: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the config (an unknown key, a wrong type).
    #[error("invalid config file `{path}`: {error}")]
    Parse {
        /// The file that was read.
        path: PathBuf,
        /// toml's error, with line, column and key.
        error: toml::de::Error,
    },
    /// The file names an environment variable (`${env:NAME}`) that is not set, or whose
    /// value cannot stand in a TOML string.
    #[error("config file `{path}`, line {line}: {reason}")]
    Environment {
        /// The file that was read.
        path: PathBuf,
        /// The line of the reference, from 1.
        line: usize,
        /// Which variable, and what is wrong with it.
        reason: String,
    },
    /// With no file, the config type could not be built from its serde defaults (a field
    /// without `#[serde(default)]`); a bug in the daemon, not in its input.
    #[error("config has no usable defaults (is `#[serde(default)]` missing?): {error}")]
    Defaults {
        /// toml's error for the empty document.
        error: toml::de::Error,
    },
}

/// Loads a config of type `T` from the TOML file at `path`, or from its serde defaults
/// when `path` is `None`.
///
/// Unknown keys are rejected when `T` has `#[serde(deny_unknown_fields)]`; each nested
/// table needs it too.
///
/// # Errors
///
/// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Parse`] when it is
/// not valid TOML for `T`, [`ConfigError::Defaults`] when `path` is `None` and `T` cannot
/// be built from an empty document.
pub fn load_toml<T: DeserializeOwned>(path: Option<&Path>) -> Result<T, ConfigError> {
    let Some(path) = path else {
        return toml::from_str("").map_err(|error| ConfigError::Defaults { error });
    };
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.to_owned(), error })?;
    let text = expand_environment(&text, |name| std::env::var(name).ok())
        .map_err(|(line, reason)| ConfigError::Environment { path: path.to_owned(), line, reason })?;
    toml::from_str(&text).map_err(|error| ConfigError::Parse { path: path.to_owned(), error })
}

/// Replaces every `${env:NAME}` outside comment lines with the value of the environment
/// variable `NAME`, so that one file serves every replica of a Kubernetes StatefulSet
/// (`instance_id = "${env:POD_NAME}"`). Only this form is expanded: `${1}` in a rule's
/// replacement stays as it is.
///
/// A variable that is not set, or whose value holds a quote, a backslash or a control
/// character (it would change the TOML around it), is an error `(line, reason)`.
fn expand_environment(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, (usize, String)> {
    const OPEN: &str = "${env:";
    if !text.contains(OPEN) {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    for (index, line) in text.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find(OPEN) {
            out.push_str(&rest[..start]);
            let after = &rest[start + OPEN.len()..];
            let Some(end) = after.find('}') else {
                return Err((index + 1, "`${env:` without its closing `}`".to_owned()));
            };
            let name = &after[..end];
            let value = lookup(name).ok_or_else(|| (index + 1, format!("environment variable `{name}` is not set")))?;
            if value.chars().any(|c| c == '"' || c == '\'' || c == '\\' || c.is_control()) {
                return Err((
                    index + 1,
                    format!("environment variable `{name}` holds a quote, a backslash or a control character"),
                ));
            }
            out.push_str(&value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

/// What tells a file's new version from its old one: its modification time and size
/// (`None` while it cannot be read).
pub fn file_stamp(path: &std::path::Path) -> Option<(std::time::SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

#[cfg(test)]
mod tests {
    use super::expand_environment;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "POD_NAME" => Some("tessera-ingester-1".to_owned()),
            "QUOTED" => Some("a\"b".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn env_references_are_expanded_outside_comments() {
        let text = "# ${env:UNSET} in a comment stays\ninstance_id = \"${env:POD_NAME}\"\n\
                    advertise = \"${env:POD_NAME}.tessera-ingester:7500\"\nreplace = \"${1}_total\"\n";
        let expanded = expand_environment(text, lookup).unwrap();
        assert_eq!(
            expanded,
            "# ${env:UNSET} in a comment stays\ninstance_id = \"tessera-ingester-1\"\n\
             advertise = \"tessera-ingester-1.tessera-ingester:7500\"\nreplace = \"${1}_total\"\n"
        );
    }

    #[test]
    fn an_unset_or_unsafe_variable_is_an_error_with_its_line() {
        let unset = expand_environment("a = 1\nb = \"${env:UNSET}\"\n", lookup).unwrap_err();
        assert_eq!(unset, (2, "environment variable `UNSET` is not set".to_owned()));
        let quoted = expand_environment("b = \"${env:QUOTED}\"", lookup).unwrap_err();
        assert_eq!(quoted.0, 1);
        assert!(quoted.1.contains("quote"), "{}", quoted.1);
        let open = expand_environment("b = \"${env:POD_NAME\"", lookup).unwrap_err();
        assert!(open.1.contains("closing"), "{}", open.1);
    }
}
