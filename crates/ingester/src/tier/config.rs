//! `[placement]`: the ingester tier's configuration, and the settings the tier task
//! runs on.

use std::time::Duration;

use tessera_topology::EtcdConfig;

/// `[placement]`: this ingester's place in the ingesters' placement (optional;
/// without it the ingester takes whatever aggregators send it, as a single
/// ingester or one of a fixed `endpoints` list).
///
/// ```toml
/// [placement]
/// advertise = "10.0.1.1:7500"    # where aggregators reach this ingester (default: listen)
/// liveness_ttl_secs = 10         # failover comes this long after a crash
/// num_shards = 64                # shards of a placement this ingester creates
/// join = true                    # add itself when it is not in the placement
/// move_delay_secs = 30           # a join's shards move at least this long from now,
/// move_boundary_secs = 60        #   on a multiple of this
/// settle_secs = 90               # moves are finalized this long after their cutover
/// [placement.etcd]
/// endpoints = ["http://127.0.0.1:2379"]
/// env = "prod"
/// ```
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// etcd; the placement is `/tessera/<env>/ingesters/placement`.
    pub etcd: EtcdConfig,
    /// `host:port` aggregators reach this ingester at; default: `listen` (which must
    /// then not be a wildcard address).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Liveness lease TTL: a crashed ingester's shards move this long after its last keep-alive.
    #[serde(default = "default_liveness_ttl_secs")]
    pub liveness_ttl_secs: u64,
    /// Shards of the placement this ingester creates when there is none.
    #[serde(default = "default_num_shards")]
    pub num_shards: u32,
    /// Add this ingester to the placement when it is not in it (at start, or after it
    /// was failed over).
    #[serde(default = "default_join")]
    pub join: bool,
    /// A join's shards move at least this long from now ...
    #[serde(default = "default_move_delay_secs")]
    pub move_delay_secs: u64,
    /// ... on a multiple of this (a multiple of every storage policy's resolution).
    #[serde(default = "default_move_boundary_secs")]
    pub move_boundary_secs: u64,
    /// Moves are finalized this long after their cutover (the largest tile plus the
    /// aggregators' buffer, so the old owner has written the last tile before it).
    #[serde(default = "default_settle_secs")]
    pub settle_secs: u64,
}

fn default_liveness_ttl_secs() -> u64 {
    10
}
fn default_num_shards() -> u32 {
    64
}
fn default_join() -> bool {
    true
}
fn default_move_delay_secs() -> u64 {
    30
}
fn default_move_boundary_secs() -> u64 {
    60
}
fn default_settle_secs() -> u64 {
    90
}

impl PlacementConfig {
    /// Checks values that parse but cannot work; `listen` is the wire listener.
    pub fn validate(&self, listen: std::net::SocketAddr) -> Result<(), tessera_runtime::config::InvalidSetting> {
        let invalid = |key: &str, reason: &str| Err(tessera_runtime::config::InvalidSetting::new(key, reason));
        if let Err(error) = self.etcd.validate() {
            return invalid("placement.etcd", &error.to_string());
        }
        if self.liveness_ttl_secs == 0 {
            return invalid("placement.liveness_ttl_secs", "must be at least 1");
        }
        if self.num_shards == 0 {
            return invalid("placement.num_shards", "must be at least 1");
        }
        if self.move_boundary_secs == 0 {
            return invalid("placement.move_boundary_secs", "must be at least 1");
        }
        match &self.advertise {
            Some(endpoint) => {
                let port_ok = endpoint
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !port_ok {
                    return invalid("placement.advertise", "must be `host:port`");
                }
            }
            None if listen.ip().is_unspecified() => {
                return invalid(
                    "placement.advertise",
                    "must be set when `listen` is a wildcard address: aggregators need an address to reach",
                );
            }
            None => {}
        }
        Ok(())
    }

    /// The tier task's settings for instance `instance_id` listening on `listen`.
    pub fn settings(&self, instance_id: &str, listen: std::net::SocketAddr) -> TierSettings {
        TierSettings {
            etcd: self.etcd.clone(),
            instance_id: instance_id.to_owned(),
            endpoint: self.advertise.clone().unwrap_or_else(|| listen.to_string()),
            ttl: Duration::from_secs(self.liveness_ttl_secs),
            num_shards: self.num_shards,
            join: self.join,
            move_delay_ms: (self.move_delay_secs as i64).saturating_mul(1000),
            move_boundary_ms: (self.move_boundary_secs as i64).saturating_mul(1000),
            settle_ms: (self.settle_secs as i64).saturating_mul(1000),
        }
    }
}

/// What [`run_tier`](super::run_tier) needs.
#[derive(Debug, Clone)]
pub struct TierSettings {
    /// etcd (the ingesters' key is used whatever `tier` says).
    pub etcd: EtcdConfig,
    /// This ingester's id in the placement.
    pub instance_id: String,
    /// Where aggregators reach this ingester, `host:port`.
    pub endpoint: String,
    /// Liveness lease TTL.
    pub ttl: Duration,
    /// Shards of a placement this ingester creates (when there is none).
    pub num_shards: u32,
    /// Add this ingester to the placement when it is not in it.
    pub join: bool,
    /// When a join moves shards (delay and boundary).
    pub move_delay_ms: i64,
    /// Moves take effect on multiples of this.
    pub move_boundary_ms: i64,
    /// How long after a move's cutover it is finalized.
    pub settle_ms: i64,
}
