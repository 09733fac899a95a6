//! The placement in etcd: configuration and key layout, the
//! compare-and-swap [`PlacementStore`], the [`Watcher`] that keeps the
//! current placement in memory (and in a cache file), and instance
//! liveness leases ([`Registration`]).
//!
//! # Keys
//!
//! Everything of one environment lives under `/tessera/<env>/`:
//!
//! - `/tessera/<env>/placement`: the aggregators' [`Placement`](crate::Placement),
//!   protobuf-encoded;
//! - `/tessera/<env>/ingesters/placement`: the ingesters' placement, same
//!   encoding, its own instances and shards ([`Tier::Ingesters`]);
//! - `/tessera/<env>/alive/<instance id>`: one key per live instance,
//!   attached to a lease that the instance keeps alive;
//! - `/tessera/<env>/leader/<shard set>` and `/tessera/<env>/flushed/<shard set>`:
//!   each replicated shard set's leader and its flush marks ([`election`]).

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use serde::Deserialize;

use crate::error::StoreError;

pub mod election;
pub mod liveness;
pub mod store;
pub mod watch;

pub use election::{Election, FlushMarks, IncompleteTile, Leader, Observed};
pub use liveness::{FENCE_MARGIN, LeaseDeadline, Registration};
pub use store::PlacementStore;
pub use watch::Watcher;

/// The root of every tessera key in etcd.
pub const KEY_ROOT: &str = "/tessera";

/// How to reach etcd and where tessera's keys are.
///
/// As a TOML table (every key but `endpoints` and `env` has a default):
///
/// ```toml
/// endpoints = ["http://127.0.0.1:2379"]
/// env = "prod"
/// cache_path = "/var/lib/tessera/placement.pb"
/// request_timeout_ms = 5000
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// etcd client URLs, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Environment name; keys live under `/tessera/<env>/`. No `/` allowed.
    pub env: String,
    /// File where the watcher keeps the last placement it saw, loaded at
    /// start when etcd is unreachable. No cache when absent.
    #[serde(default)]
    pub cache_path: Option<PathBuf>,
    /// Time allowed to open a connection to an endpoint.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Time allowed for one request (get, transaction, lease, watch creation).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// First wait before retrying after an etcd error; doubles up to `retry_max_backoff_ms`, with jitter.
    #[serde(default = "default_retry_initial_backoff_ms")]
    pub retry_initial_backoff_ms: u64,
    /// Longest wait between retries.
    #[serde(default = "default_retry_max_backoff_ms")]
    pub retry_max_backoff_ms: u64,
    /// How long a watcher waits at start for a first placement (from etcd or
    /// the cache file) before giving up.
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// Whose placement this reads and writes: set by the daemon, not in a
    /// config file (an aggregator's `[placement]` is the aggregators', its
    /// `[ingester.placement]` the ingesters').
    #[serde(skip)]
    pub tier: Tier,
}

/// Which instance set a placement places: each tier has its own placement
/// key, instances and shards; liveness keys are shared (instance ids must
/// differ across tiers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tier {
    /// The aggregators (`/tessera/<env>/placement`).
    #[default]
    Aggregators,
    /// The ingesters (`/tessera/<env>/ingesters/placement`).
    Ingesters,
}

impl Tier {
    /// A stable name, for flags and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Aggregators => "aggregators",
            Tier::Ingesters => "ingesters",
        }
    }
}

fn default_connect_timeout_ms() -> u64 {
    2_000
}
fn default_request_timeout_ms() -> u64 {
    5_000
}
fn default_retry_initial_backoff_ms() -> u64 {
    100
}
fn default_retry_max_backoff_ms() -> u64 {
    5_000
}
fn default_start_timeout_ms() -> u64 {
    30_000
}

impl EtcdConfig {
    /// A config with default timeouts and no cache file.
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>, env: impl Into<String>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            env: env.into(),
            cache_path: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            request_timeout_ms: default_request_timeout_ms(),
            retry_initial_backoff_ms: default_retry_initial_backoff_ms(),
            retry_max_backoff_ms: default_retry_max_backoff_ms(),
            start_timeout_ms: default_start_timeout_ms(),
            tier: Tier::Aggregators,
        }
    }

    /// The same etcd, reading and writing `tier`'s placement.
    pub fn for_tier(self, tier: Tier) -> Self {
        Self { tier, ..self }
    }

    /// Sets `cache_path`.
    pub fn with_cache_path(self, cache_path: impl Into<PathBuf>) -> Self {
        Self { cache_path: Some(cache_path.into()), ..self }
    }

    /// Checks that the config can be used.
    pub fn validate(&self) -> Result<(), StoreError> {
        let invalid = |message: String| Err(StoreError::InvalidConfig { message });
        if self.endpoints.is_empty() {
            return invalid("`endpoints` is empty".into());
        }
        if self.endpoints.iter().any(|endpoint| endpoint.trim().is_empty()) {
            return invalid("`endpoints` has an empty entry".into());
        }
        if self.env.is_empty() || self.env.contains('/') {
            return invalid(format!("`env` must be non-empty and without `/`, got `{}`", self.env));
        }
        for (name, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("retry_initial_backoff_ms", self.retry_initial_backoff_ms),
            ("retry_max_backoff_ms", self.retry_max_backoff_ms),
        ] {
            if value == 0 {
                return invalid(format!("`{name}` must be positive"));
            }
        }
        if self.retry_initial_backoff_ms > self.retry_max_backoff_ms {
            return invalid(format!(
                "`retry_initial_backoff_ms` ({}) exceeds `retry_max_backoff_ms` ({})",
                self.retry_initial_backoff_ms, self.retry_max_backoff_ms
            ));
        }
        Ok(())
    }

    /// `/tessera/<env>/placement` (aggregators) or `/tessera/<env>/ingesters/placement`.
    pub fn placement_key(&self) -> String {
        match self.tier {
            Tier::Aggregators => format!("{KEY_ROOT}/{}/placement", self.env),
            Tier::Ingesters => format!("{KEY_ROOT}/{}/ingesters/placement", self.env),
        }
    }

    /// `/tessera/<env>/alive/`.
    pub fn alive_prefix(&self) -> String {
        format!("{KEY_ROOT}/{}/alive/", self.env)
    }

    /// `/tessera/<env>/alive/<instance_id>`.
    pub fn alive_key(&self, instance_id: &str) -> String {
        format!("{}{instance_id}", self.alive_prefix())
    }

    /// `/tessera/<env>/leader/`.
    pub fn leader_prefix(&self) -> String {
        format!("{KEY_ROOT}/{}/leader/", self.env)
    }

    /// `/tessera/<env>/leader/<shard_set>`.
    pub fn leader_key(&self, shard_set: u32) -> String {
        format!("{}{shard_set}", self.leader_prefix())
    }

    /// `/tessera/<env>/flushed/<shard_set>`.
    pub fn flushed_key(&self, shard_set: u32) -> String {
        format!("{KEY_ROOT}/{}/flushed/{shard_set}", self.env)
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

/// Opens a client (connections are made lazily, on the first request).
pub(crate) async fn connect(config: &EtcdConfig) -> Result<Client, StoreError> {
    config.validate()?;
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
        // HTTP/2 pings find a dead peer behind an idle watch; etcd refuses
        // pings more often than every 5 s by default.
        .with_keep_alive(Duration::from_secs(10), config.request_timeout())
        .with_keep_alive_while_idle(true);
    let endpoints = config.endpoints.join(",");
    with_timeout(config, "connect", &endpoints, Client::connect(&config.endpoints, Some(options)))
        .await?
        .map_err(|source| StoreError::Connect { endpoints, source: Box::new(source) })
}

/// Runs `request` with the configured request timeout.
pub(crate) async fn with_timeout<T>(
    config: &EtcdConfig,
    operation: &'static str,
    key: &str,
    request: impl Future<Output = T>,
) -> Result<T, StoreError> {
    tokio::time::timeout(config.request_timeout(), request).await.map_err(|_| StoreError::Timeout {
        operation,
        key: key.to_owned(),
        timeout_ms: config.request_timeout_ms,
    })
}

/// Runs an etcd request with the request timeout and maps its error.
pub(crate) async fn request<T>(
    config: &EtcdConfig,
    operation: &'static str,
    key: &str,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    with_timeout(config, operation, key, request).await?.map_err(|source| StoreError::Request {
        operation,
        key: key.to_owned(),
        source: Box::new(source),
    })
}

/// The retry backoff of every etcd request loop: `tessera-wire`'s one backoff, from
/// `retry_initial_backoff_ms` doubling to `retry_max_backoff_ms`, with jitter.
pub(crate) type Backoff = tessera_runtime::Backoff;

impl EtcdConfig {
    /// A fresh retry backoff for this config.
    pub(crate) fn backoff(&self) -> Backoff {
        let initial_ms = self.retry_initial_backoff_ms.max(1);
        Backoff::new(
            Duration::from_millis(initial_ms),
            Duration::from_millis(self.retry_max_backoff_ms.max(initial_ms)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_env() {
        let config = EtcdConfig::new(["http://127.0.0.1:2379"], "prod");
        assert_eq!(config.placement_key(), "/tessera/prod/placement");
        assert_eq!(config.alive_key("agg-1"), "/tessera/prod/alive/agg-1");
        assert_eq!(config.leader_key(3), "/tessera/prod/leader/3");
        assert_eq!(config.flushed_key(3), "/tessera/prod/flushed/3");
        config.validate().unwrap();
    }

    #[test]
    fn bad_configs_are_rejected() {
        let good = EtcdConfig::new(["http://127.0.0.1:2379"], "prod");
        let cases = [
            EtcdConfig { endpoints: vec![], ..good.clone() },
            EtcdConfig { env: "a/b".into(), ..good.clone() },
            EtcdConfig { request_timeout_ms: 0, ..good.clone() },
            EtcdConfig { retry_initial_backoff_ms: 10_000, ..good.clone() },
        ];
        for config in cases {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }

    #[test]
    fn config_parses_with_defaults_and_rejects_unknown_keys() {
        let config: EtcdConfig = toml::from_str("endpoints = [\"http://e:2379\"]\nenv = \"dev\"\n").unwrap();
        assert_eq!(config, EtcdConfig::new(["http://e:2379"], "dev"));
        let err = toml::from_str::<EtcdConfig>("endpoints = []\nenv = \"dev\"\nttl = 3\n").unwrap_err();
        assert!(err.to_string().contains("ttl"), "{err}");
    }

    #[test]
    fn backoff_grows_with_jitter_and_resets() {
        let config =
            EtcdConfig { retry_initial_backoff_ms: 100, retry_max_backoff_ms: 400, ..EtcdConfig::new(["x"], "e") };
        let mut backoff = config.backoff();
        let waits: Vec<u64> = (0..5).map(|_| backoff.next_delay().as_millis() as u64).collect();
        for (wait, step) in waits.iter().zip([100, 200, 400, 400, 400]) {
            assert!((step / 2..=step).contains(wait), "{waits:?}");
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
