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
}

// serde's derive does not take const generics yet.
impl<'de, const DEFAULT_PORT: u16> Deserialize<'de> for TelemetryConfig<DEFAULT_PORT> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            #[serde(default)]
            listen: Option<SocketAddr>,
        }
        let fields = Fields::deserialize(deserializer)?;
        Ok(TelemetryConfig { listen: fields.listen.or(Self::default().listen) })
    }
}

impl<const DEFAULT_PORT: u16> Default for TelemetryConfig<DEFAULT_PORT> {
    fn default() -> Self {
        TelemetryConfig { listen: Some((Ipv4Addr::LOCALHOST, DEFAULT_PORT).into()) }
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
    toml::from_str(&text).map_err(|error| ConfigError::Parse { path: path.to_owned(), error })
}

/// What tells a file's new version from its old one: its modification time and size
/// (`None` while it cannot be read).
pub fn file_stamp(path: &std::path::Path) -> Option<(std::time::SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}
