//! The aggregator's configuration file (TOML).
//!
//! `instance_id`, `[placement]` and either `ingester.endpoints` or
//! `[ingester.placement]` must be set; every other key has a default.
//! Unknown keys are rejected.
//!
//! ```toml
//! # This instance's id, exactly as the placement lists it.
//! instance_id = "aggregator-1"
//! # Wire listener for collectors' partial batches.
//! listen = "0.0.0.0:7400"
//! # Storage policies, `resolution:retention`; each tiles independently. One by
//! # default; add "1m:40d" for 1 min tiles where an ingester has a target for them
//! # (its `[policy_sinks."1m:40d"]`: one resolution per store).
//! policies = ["10s:2d"]
//! # A tile closes once every connected collector's watermark has passed
//! # its end, and at the latest this long after its end (default: up to 8 s,
//! # as far as no policy needs another table for it).
//! max_buffer_past_ms = 8000
//! # ... or this long after its end when no collector reports a watermark.
//! buffer_past_ms = 2000
//! # Partials whose window ends further than this in the future are refused.
//! buffer_future_ms = 2000
//! # Threads that merge partials, each owning a share of the shards
//! # (default: the cores available to the process).
//! merge_threads = 4
//!
//! [placement]            # a static file, or etcd (see tessera-topology's PlacementSource)
//! kind = "etcd"
//! endpoints = ["http://127.0.0.1:2379"]
//! env = "prod"
//! cache_path = "/var/lib/tessera/placement.pb"
//!
//! [ingester]
//! endpoints = ["10.0.0.9:7500"]
//! # or, several ingesters each owning a share of the series (the
//! # ingesters' own placement, at /tessera/<env>/ingesters/placement):
//! # [ingester.placement]
//! # kind = "etcd"
//! # endpoints = ["http://127.0.0.1:2379"]
//! # env = "prod"
//! # cache_path = "/var/lib/tessera/ingester-placement.pb"
//!
//! [telemetry]
//! listen = "0.0.0.0:9103"
//! profiling = true             # CPU profiles at /debug/pprof/profile; false: 403
//! # web_config = "/etc/tessera/web.yml"  # Prometheus web config: tls_server_config, basic_auth_users
//! ```

use std::time::Duration;

use tessera_topology::PlacementSource;

use crate::tile::{DEFAULT_POLICIES, StoragePolicy, TilerSettings, tables_per_policy};

/// Most tables (open tiles) a policy may need; bounds memory per series.
pub const MAX_TABLES_PER_POLICY: usize = 16;

/// `max_buffer_past_ms` when it is not set, at most (see [`Config::max_buffer_past_ms`]).
pub const DEFAULT_MAX_BUFFER_PAST_MS: u64 = 8_000;

tessera_wire::listener_config! {
    /// The whole configuration.
    pub struct Config {
        /// This instance's id, exactly as the placement lists it (required).
        /// Partials are accepted only for the shards the placement gives this id.
        pub instance_id: Option<String> = None,
        /// Storage policies, `resolution:retention` (units ms, s, m, h, d).
        /// Each policy tiles independently from the partials.
        pub policies: Vec<StoragePolicy> = DEFAULT_POLICIES.iter().map(|text| text.parse().expect("default policies parse")).collect(),
        /// A tile closes once every connected collector's watermark (the end
        /// of the newest window it has sent in full) has passed the tile's end,
        /// and at the latest this long after its end. Partials for a closed
        /// tile go into the tiles of the longer policies still open, and are
        /// refused as `too_late` once the longest policy's tile has closed
        /// (resolutions must nest: each a multiple of the shorter ones). Each policy keeps
        /// `ceil((max(buffer_past_ms, max_buffer_past_ms) + buffer_future_ms) /
        /// resolution) + 1` tables. Default: 8 s, lowered where a policy would
        /// need more tables for it than `buffer_past_ms` alone gives it (so the
        /// default costs no memory; with the default policies it is 8 s), and
        /// never below `buffer_past_ms`. See [`Config::max_buffer_past_ms`].
        pub max_buffer_past_ms: Option<u64> = None,
        /// When no connected collector reports a watermark (none connected, or
        /// one too old to send it), a tile closes this long after its end; a
        /// connection that has reported none holds tiles this long.
        pub buffer_past_ms: u64 = 2_000,
        /// Partials whose window ends more than this after now are refused as
        /// `too_early` (a sender with a clock ahead of ours).
        pub buffer_future_ms: u64 = 2_000,
        /// A series is forgotten after this many tiles without data (rounded up
        /// to a multiple of the policy's table count); never when absent.
        pub expire_after_empty_tiles: Option<u32> = Some(30),
        /// Most series each policy table holds; partials of new series beyond
        /// it are dropped and counted (`reason="series_limit"`). No cap when
        /// absent. Each merge thread holds an equal share of the cap.
        pub max_series_per_policy: Option<usize> = Some(8_000_000),
        /// The memory budget: bytes (`536870912`, `"2GiB"`) or a share of the cgroup's
        /// limit (`"80%"`). From 75 % of it until under 65 %, partials of new series are
        /// dropped and counted (`drops_total{reason="memory_limit"}`); known series go on.
        /// Without it, 80 % of the cgroup's limit when it has one; `"none"`: no budget.
        pub memory_limit: Option<tessera_runtime::memory::MemoryLimit> = None,
        /// What a series costs the aggregator all told, bytes: its tiles, their flush to the
        /// ingesters, the decode and merge buffers. With `memory_limit`, the series admitted
        /// at once are capped at 75 % of the limit over this (shared by every merge thread;
        /// further new series are dropped and counted as `reason="memory_limit"`): a series'
        /// memory comes seconds after it is admitted, when its tiles fill and flush, too late
        /// for the resident memory to warn. Measured for counters (`benches/load/waves.sh`):
        /// about 1 KiB; timers with wide sketches cost more.
        pub memory_bytes_per_series: u64 = 1024,
        /// Threads that merge partials into tiles. Shards are partitioned among
        /// them (shard `s` goes to thread `s mod merge_threads`), and each owns
        /// its shards' tables for every policy, so merging shares no lock.
        /// Default: the cores available to the process.
        pub merge_threads: Option<usize> = None,
        /// Where the placement comes from (required): `kind = "static"` with a
        /// `path`, or `kind = "etcd"` with `endpoints`, `env` and an optional
        /// `cache_path`.
        pub placement: Option<PlacementSource> = None,
        /// With an etcd placement, the TTL of this instance's liveness lease,
        /// seconds; `tessera placement show` lists the instances whose lease lives.
        pub liveness_ttl_secs: u64 = 10,
        /// Where closed tiles go.
        pub ingester: IngesterConfig = IngesterConfig::default(),
        /// The `/metrics`, `/healthz`, `/readyz` endpoint.
        pub telemetry: TelemetryConfig = TelemetryConfig::default(),
    }
    defaults { listen: "127.0.0.1:7400", max_connections: 4096, handshake_timeout_ms: 5_000 }
}

tessera_wire::sender_config! {
    /// `[ingester]`
    pub struct IngesterConfig {
        /// Ingester wire endpoints, `host:port`. All the batches of one tile go
        /// to one endpoint: the connected one with the least queued. Set this
        /// or `placement`, not both.
        pub endpoints: Vec<String> = Vec::new(),
        /// The ingesters' placement (a static file, or etcd: the key
        /// `/tessera/<env>/ingesters/placement`): each series goes to the one
        /// ingester owning its shard, and batches queued for an ingester that
        /// leaves it go to the new owners. Set this or `endpoints`.
        pub placement: Option<PlacementSource> = None,
        /// With nothing to send for this long, send an empty tile batch (a heartbeat) so
        /// that the ingester's `idle_timeout_ms` (30 s by default) does not close a healthy
        /// connection.
        pub heartbeat_ms: u64 = 10_000,
    }
    // Frames of 4 MiB (batches of 2 MiB, about 60 000 counter series): an ingester holds a
    // batch decoded, converted and written at once, so its memory follows the batch size
    // (benches/load/waves.sh: with 16 MiB frames a 512 MiB ingester was killed by its
    // cgroup under a wave of new series; with 4 MiB it peaked at 352 MiB).
    defaults { max_queue_bytes: 512 << 20, max_frame_bytes: 4 << 20, ack_timeout_ms: 30_000, shutdown_grace_secs: 10 }
}

/// `[telemetry]`: `listen`, by default `127.0.0.1:9103`.
pub type TelemetryConfig = tessera_runtime::config::TelemetryConfig<9103>;

/// A configuration that cannot work.
pub type ConfigError = tessera_runtime::config::InvalidSetting;

impl Config {
    /// Merge threads to run: `merge_threads`, or the cores available.
    pub fn merge_threads(&self) -> usize {
        self.merge_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |cores| cores.get()))
    }

    /// Checks values that parse but cannot work, the placement source included.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_settings()?;
        if self.placement.is_none() {
            let reason = "set `kind = \"static\"` with a `path`, or `kind = \"etcd\"` with `endpoints` and `env`";
            return Err(ConfigError::new("placement", reason));
        }
        Ok(())
    }

    /// Checks every value but the placement source (for callers that
    /// provide the placement themselves).
    pub fn validate_settings(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: String| Err(ConfigError::new(key, reason));
        if let Some(limit) = self.memory_limit {
            limit.resolve().map_err(|reason| ConfigError::new("memory_limit", reason))?;
        }
        if self.memory_bytes_per_series == 0 {
            return invalid("memory_bytes_per_series", "must be at least 1".to_owned());
        }
        match self.instance_id.as_deref() {
            None | Some("") => {
                return invalid("instance_id", "must be set to this instance's id in the placement".into());
            }
            Some(id) if id.contains('/') => return invalid("instance_id", format!("`{id}` must not contain `/`")),
            Some(_) => {}
        }
        self.validate_listener()?;
        if self.merge_threads == Some(0) || self.merge_threads.is_some_and(|threads| threads > 256) {
            return invalid("merge_threads", "must be between 1 and 256".into());
        }
        if self.policies.is_empty() {
            return invalid("policies", "list at least one storage policy".into());
        }
        for (index, policy) in self.policies.iter().enumerate() {
            if self.policies[..index].iter().any(|other| other.resolution_ms() == policy.resolution_ms()) {
                return invalid("policies", format!("two policies have the resolution of `{policy}`"));
            }
            // A window too late for a finer tile goes into the coarser ones still open, and
            // is refused once its coarsest tile has closed: that needs every finer tile to
            // lie within one coarser tile, closing before it (`tile/tiler.rs`, *Admission*).
            if let Some(other) = self.policies[..index].iter().find(|other| {
                let (fine, coarse) = if other.resolution_ms() < policy.resolution_ms() {
                    (other.resolution_ms(), policy.resolution_ms())
                } else {
                    (policy.resolution_ms(), other.resolution_ms())
                };
                coarse % fine != 0
            }) {
                return invalid(
                    "policies",
                    format!(
                        "the resolutions of `{other}` and `{policy}` do not nest: the longer must be a multiple of the shorter"
                    ),
                );
            }
        }
        for (key, value) in [
            ("buffer_past_ms", self.buffer_past_ms),
            ("max_buffer_past_ms", self.max_buffer_past_ms.unwrap_or_default()),
            ("buffer_future_ms", self.buffer_future_ms),
        ] {
            if value > i64::MAX as u64 / 4 {
                return invalid(key, "is out of range".into());
            }
        }
        if self.max_buffer_past_ms() < self.buffer_past_ms {
            return invalid(
                "max_buffer_past_ms",
                format!("must be at least buffer_past_ms ({} ms)", self.buffer_past_ms),
            );
        }
        for policy in &self.policies {
            let tables = tables_per_policy(policy, self.max_buffer_past_ms() as i64, self.buffer_future_ms as i64);
            if tables > MAX_TABLES_PER_POLICY {
                return invalid(
                    "max_buffer_past_ms",
                    format!(
                        "max_buffer_past_ms + buffer_future_ms span {tables} tiles of `{policy}` (at most {MAX_TABLES_PER_POLICY}): \
                         shorten the buffers or drop the policy"
                    ),
                );
            }
        }
        if self.expire_after_empty_tiles == Some(0) {
            return invalid("expire_after_empty_tiles", "must be at least 1 (leave it out to never expire)".into());
        }
        if self.max_series_per_policy == Some(0) {
            return invalid("max_series_per_policy", "must be at least 1 (leave it out for no cap)".into());
        }
        if self.liveness_ttl_secs == 0 {
            return invalid("liveness_ttl_secs", "must be at least 1".into());
        }
        self.ingester.validate()
    }

    /// The longest a tile waits for watermarks: `max_buffer_past_ms` as set,
    /// else `DEFAULT_MAX_BUFFER_PAST_MS` lowered to what every policy holds
    /// with the tables `buffer_past_ms` gives it, and at least `buffer_past_ms`.
    pub fn max_buffer_past_ms(&self) -> u64 {
        if let Some(set) = self.max_buffer_past_ms {
            return set;
        }
        let (past, future) = (self.buffer_past_ms as i64, self.buffer_future_ms as i64);
        let mut most = DEFAULT_MAX_BUFFER_PAST_MS;
        for policy in &self.policies {
            let tables = tables_per_policy(policy, past, future) as i64;
            let free = (tables - 1).saturating_mul(policy.resolution_ms()).saturating_sub(future);
            most = most.min(free.max(0) as u64);
        }
        most.max(self.buffer_past_ms)
    }

    /// The instance id (empty before [`validate`](Self::validate) has passed).
    pub fn instance_id(&self) -> &str {
        self.instance_id.as_deref().unwrap_or_default()
    }

    /// The settings of each of `merge_threads` tilers (and of admission's shadow one):
    /// the series cap is shared out among the threads.
    pub fn tiler_settings(&self, merge_threads: usize) -> TilerSettings {
        TilerSettings {
            policies: self.policies.clone(),
            buffer_past_ms: self.buffer_past_ms as i64,
            max_buffer_past_ms: self.max_buffer_past_ms() as i64,
            buffer_future_ms: self.buffer_future_ms as i64,
            expire_after_empty_tiles: self.expire_after_empty_tiles,
            max_series_per_policy: self.max_series_per_policy.map(|cap| cap.div_ceil(merge_threads.max(1))),
        }
    }

    /// How long this instance's liveness lease lasts without a renewal.
    pub fn liveness_ttl(&self) -> Duration {
        Duration::from_secs(self.liveness_ttl_secs)
    }
}

impl IngesterConfig {
    /// How long a connection to an ingester may have nothing to send before a heartbeat.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| Err(ConfigError::new(key, reason));
        match (&self.placement, self.endpoints.is_empty()) {
            (Some(_), false) => {
                return invalid("ingester.endpoints", "set `endpoints` or `[ingester.placement]`, not both");
            }
            (Some(PlacementSource::Etcd(etcd)), true) => {
                if let Err(error) = etcd.validate() {
                    return Err(ConfigError::new("ingester.placement", error.to_string()));
                }
            }
            (Some(PlacementSource::Static { .. }), true) => {}
            (None, _) => {
                if self.endpoints.is_empty() || self.endpoints.iter().any(|endpoint| endpoint.trim().is_empty()) {
                    return invalid(
                        "ingester.endpoints",
                        "list at least one `host:port`, none empty (or set `[ingester.placement]`)",
                    );
                }
            }
        }
        self.validate_sender("ingester")?;
        if self.heartbeat_ms < 100 {
            return invalid("ingester.heartbeat_ms", "must be at least 100");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        instance_id = "agg-1"
        [placement]
        kind = "static"
        path = "placement.toml"
        [ingester]
        endpoints = ["127.0.0.1:7500"]
    "#;

    #[test]
    fn the_tilers_share_the_series_cap_and_durations_come_from_the_keys() {
        let text = format!("{MINIMAL}\nheartbeat_ms = 2500\n");
        let text = text.replace(
            "instance_id = \"agg-1\"",
            "instance_id = \"agg-1\"\nmax_series_per_policy = 10\nliveness_ttl_secs = 4",
        );
        let config: Config = toml::from_str(&text).unwrap();
        config.validate().unwrap();
        let settings = config.tiler_settings(3);
        assert_eq!(settings.max_series_per_policy, Some(4), "10 series over 3 threads, rounded up");
        assert_eq!(settings.max_buffer_past_ms, config.max_buffer_past_ms() as i64);
        assert_eq!(config.liveness_ttl(), Duration::from_secs(4));
        assert_eq!(config.ingester.heartbeat(), Duration::from_millis(2500));
    }

    #[test]
    fn a_minimal_config_gets_the_documented_defaults() {
        let config: Config = toml::from_str(MINIMAL).unwrap();
        config.validate().unwrap();
        assert_eq!(config.instance_id(), "agg-1");
        let policies: Vec<String> = config.policies.iter().map(ToString::to_string).collect();
        assert_eq!(policies, ["10s:2d"]);
        assert_eq!(config.listen.to_string(), "127.0.0.1:7400");
        assert_eq!(config.buffer_past_ms, 2_000);
        assert_eq!(config.max_buffer_past_ms(), 8_000);
        // 8 s + 2 s of a 10 s policy: the minimum of two tables.
        assert_eq!(tables_per_policy(&config.policies[0], 8_000, config.buffer_future_ms as i64), 2);
        // A 1 s policy keeps the tables buffer_past gives it: no slack by default.
        let fine = Config { policies: vec!["1s:1h".parse().unwrap(), "10s:1d".parse().unwrap()], ..config.clone() };
        assert_eq!(fine.max_buffer_past_ms(), 2_000);
        let sub_second = Config { policies: vec!["500ms:1h".parse().unwrap()], buffer_past_ms: 400, ..config };
        // Six tables for 400 ms + 2 s: they hold 500 ms past the end.
        assert_eq!(sub_second.max_buffer_past_ms(), 500);
        sub_second.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = toml::from_str::<Config>(&format!("{MINIMAL}\nflush_every = 3\n")).unwrap_err();
        assert!(err.to_string().contains("flush_every"), "{err}");
        let text = MINIMAL.replace("endpoints = [", "endpoint = [");
        let err = toml::from_str::<Config>(&text).unwrap_err();
        assert!(err.to_string().contains("endpoint"), "{err}");
    }

    #[test]
    fn missing_or_bad_values_name_the_key() {
        let base: Config = toml::from_str(MINIMAL).unwrap();
        let cases: Vec<(Config, &str)> = vec![
            (Config { instance_id: None, ..base.clone() }, "instance_id"),
            (Config { placement: None, ..base.clone() }, "placement"),
            (Config { policies: vec![], ..base.clone() }, "policies"),
            (
                Config { policies: vec!["10s:1d".parse().unwrap(), "10s:2d".parse().unwrap()], ..base.clone() },
                "policies",
            ),
            (
                Config { policies: vec!["20s:1d".parse().unwrap(), "30s:2d".parse().unwrap()], ..base.clone() },
                "policies",
            ),
            (Config { max_buffer_past_ms: Some(3_600_000), ..base.clone() }, "max_buffer_past_ms"),
            (Config { max_buffer_past_ms: Some(1_000), ..base.clone() }, "max_buffer_past_ms"),
            (Config { buffer_future_ms: u64::MAX, ..base.clone() }, "buffer_future_ms"),
            (Config { expire_after_empty_tiles: Some(0), ..base.clone() }, "expire_after_empty_tiles"),
            (Config { max_frame_bytes: 10, ..base.clone() }, "max_frame_bytes"),
            (
                Config { ingester: IngesterConfig { endpoints: vec![], ..base.ingester.clone() }, ..base.clone() },
                "ingester.endpoints",
            ),
            (
                Config { ingester: IngesterConfig { max_queue_bytes: 1, ..base.ingester.clone() }, ..base.clone() },
                "ingester.max_queue_bytes",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().starts_with(&format!("invalid `{key}`")), "{key}: {err}");
        }
    }

    #[test]
    fn the_ingesters_placement_replaces_the_endpoints() {
        let text = MINIMAL.replace(
            "endpoints = [\"127.0.0.1:7500\"]",
            "[ingester.placement]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\nenv = \"prod\"",
        );
        let config: Config = toml::from_str(&text).unwrap();
        config.validate().unwrap();
        assert!(matches!(config.ingester.placement, Some(PlacementSource::Etcd(_))));
        let both = Config {
            ingester: IngesterConfig { endpoints: vec!["127.0.0.1:7500".into()], ..config.ingester.clone() },
            ..config.clone()
        };
        let err = both.validate().unwrap_err().to_string();
        assert!(err.contains("not both"), "{err}");
        let bad_env = text.replace("env = \"prod\"", "env = \"a/b\"");
        let err = toml::from_str::<Config>(&bad_env).unwrap().validate().unwrap_err().to_string();
        assert!(err.starts_with("invalid `ingester.placement`"), "{err}");
    }
}
