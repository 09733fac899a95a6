//! The ingester's configuration file (TOML).
//!
//! Every key is optional; the defaults run an ingester on `127.0.0.1:7500` writing
//! OpenMetrics files under `./data/ingester`. Unknown keys are rejected. Every key:
//!
//! ```toml
//! # Name in handshakes and logs; defaults to the host name.
//! instance_id = "ingester-1"
//! # Wire listener for aggregators' tile batches.
//! listen = "127.0.0.1:7500"
//! # Largest frame accepted; a longer one closes its connection.
//! max_frame_bytes = 67108864
//! # Most aggregator connections at once.
//! max_connections = 256
//! handshake_timeout_ms = 10000
//! # An aggregator connection silent this long after its handshake is closed
//! # (aggregators send a heartbeat when they have had nothing to send for a while).
//! idle_timeout_ms = 30000
//! # Queue segments (<data_dir>/queue/<target>/), file sink output
//! # (<data_dir>/openmetrics/<target>/) and the rejected-samples log.
//! data_dir = "./data/ingester"
//! # On SIGTERM: how long in-flight storage requests may take to finish.
//! shutdown_grace_secs = 10
//! # Bound of the rejected-samples log (<data_dir>/rejected-samples.log and its .1).
//! rejected_log_max_bytes = 67108864
//! # What [sink] stores: resolutions ("10s", every policy of it) or whole policies
//! # ("10s:2d"). One: its samples carry no `resolution` label (one resolution per store);
//! # several: the label is kept (a warning at --check-config). Tiles of a policy that no
//! # target stores are acknowledged and not stored (batch_acks_total{reason="no_target"}).
//! sink_policies = ["10s"]
//!
//! [queue]                     # one queue per sink target, each bounded alone
//! max_queue_bytes = 1073741824   # above this, batches are answered retryable (queue_full)
//! segment_max_bytes = 67108864   # segment files are sealed past this size
//! fsync = "always"               # "always" (before each ack), "interval" or "never"
//! fsync_interval_ms = 1000       # with fsync = "interval"
//! # Checkpoint the running totals (counters, _sum, _count, native histograms) this often,
//! # into <queue dir>/checkpoint: a restart continues them from it and the records queued
//! # after it, which are kept on disk until the next checkpoint (delivered or not).
//! checkpoint_interval_secs = 10
//!
//! [pool]                      # per sink target
//! workers = 8                    # long-lived workers, each with its own channel
//! channel_requests = 4           # requests waiting in each worker's channel
//! max_samples_per_request = 2000
//! retry_initial_backoff_ms = 100 # doubles per retry, with jitter
//! retry_max_backoff_ms = 10000
//!
//! [pacing]                    # per sink target
//! min_in_flight = 1              # the adaptive limit on requests in flight stays
//! max_in_flight = 8              #   within [min, max] (and at most `workers`)
//! initial_in_flight = 2
//! latency_ratio = 2.0            # grow while window latency <= ratio x baseline
//! max_samples_per_sec = 500000   # optional ceiling; absent = none
//!
//! [mapping]
//! quantiles = [0.5, 0.9, 0.99]   # quantile samples of timers and distributions
//! counter_expire_after_secs = 3600  # forget running totals of series idle this long
//! # file = "/etc/tessera/mapping.yml"  # the collectors' mapping file: its `help` texts become
//! #                                    # each family's HELP (literal names only)
//! timer_unit = "seconds"         # what the collectors write |ms timers in: the unit of
//!                                # timer families in remote write's metadata
//!
//! [sink]                      # the default target: kind = "file", "remote_write", "graphite"
//!                             # or "influxdb"
//! kind = "file"
//! dir = "./data/ingester/openmetrics/default"  # default: <data_dir>/openmetrics/default
//! rotate_bytes = 67108864        # close the journal into an .om file past this size
//! rotate_secs = 60               # ... or after this long
//! fsync = true                   # fsync the journal before acknowledging
//!
//! [policy_sinks."1m:40d"]     # optional: a storage policy with its own target
//! kind = "remote_write"
//! url = "http://127.0.0.1:9090/api/v1/write"  # or https://
//! m3_headers = false             # M3-Metrics-Type / M3-Storage-Policy headers
//! # Timers, histograms and distributions: "native" (one cumulative native histogram per
//! # series; Prometheus with --enable-feature=native-histograms), "summary" (quantile series
//! # with _sum and _count: VictoriaMetrics, the M3 coordinator) or "both".
//! histograms = "native"
//! max_buckets = 160              # a native histogram with more buckets lowers its schema
//! request_timeout_ms = 10000
//! connect_timeout_ms = 2000
//! headers = { "X-Scope-OrgID" = "team-a" }  # sent with every request
//! external_labels = { cluster = "eu-1" }  # added to every series (a tag of the same name wins)
//! bearer_token_file = "/run/secrets/token"  # Authorization: Bearer, re-read when it changes
//! tenant_label = "team"          # one request per value of this tag, the value in
//! tenant_header = "X-Scope-OrgID"  # this header (the default); untagged: `headers` alone
//! # metadata = true              # each family's type, help and unit, in requests of their
//! metadata_interval_secs = 60    # own this often; on unless tenant_label or m3_headers
//!                                # is set (a request without series has neither)
//! # [policy_sinks."1m:40d".tls]  # https only: ca_file (else the system's roots), cert_file
//! # ca_file = "/etc/tessera/ca.crt"  # and key_file (mTLS), server_name, insecure_skip_verify
//! # [policy_sinks."1m:40d".basic_auth]  # instead of bearer_token_file: username and
//! # username = "tessera"              # password_file or password_env (one of the two)
//! # password_file = "/run/secrets/password"
//!
//! [policy_sinks."10s:7d"]     # or [sink]: Graphite, each tile written once (per-tile
//! kind = "graphite"              # values, not running totals; see crate::sink::graphite)
//! address = "127.0.0.1:2003"     # carbon's receiver, host:port
//! protocol = "plaintext"         # or "pickle" (carbon's PICKLE_RECEIVER_PORT, 2004)
//! naming = "statsd"              # whose paths: "statsd", "brubeck" or "tessera"
//! tags = "tagged"                # "tagged" (path;k=v), "path" (path.k_v) or "drop"
//! legacy_namespace = true        # statsd's graphite options, same meanings:
//! global_prefix = "stats"        #   with legacy_namespace = false, counters are
//! prefix_counter = "counters"    #   <global_prefix>.<prefix_counter>.<key>.rate / .count
//! prefix_timer = "timers"
//! prefix_gauge = "gauges"
//! prefix_set = "sets"
//! global_suffix = ""
//! percent_thresholds = [90]      # statsd's percentThreshold: count_90, upper_90, ...
//! resend_window_secs = 60        # what was written this recently is sent again after a
//! resend_window_bytes = 268435456  # break (carbon has no acks; its cache dies with it)
//! connect_timeout_ms = 2000
//! write_timeout_ms = 10000
//!
//! [policy_sinks."1m:1y"]      # or [sink]: InfluxDB, each tile written once in line
//! kind = "influxdb"              # protocol, named as Telegraf's statsd input writes it
//! url = "http://127.0.0.1:8086"  # or https://; a path prefix is kept
//! database = "telegraf"          # 1.x: /write?db=...&rp=...&precision=ms
//! retention_policy = ""          # 1.x: empty for the database's default
//! # [policy_sinks."1m:1y".basic_auth]  # 1.x: username and password_file or password_env
//! # org = "acme"                 # 2.x: org, bucket and token_file (Authorization: Token)
//! # bucket = "statsd"            #   bucket set: /api/v2/write?org=...&bucket=...
//! # token_file = "/run/secrets/influx-token"
//! separator = "_"                # Telegraf's metric_separator: api.hits -> api_hits
//! percentiles = [90]             # Telegraf's percentiles: 90_percentile fields of timers
//! request_timeout_ms = 10000
//! connect_timeout_ms = 2000
//!
//! [telemetry]
//! listen = "127.0.0.1:9104"      # /metrics, /healthz, /readyz; absent = off
//! profiling = true             # CPU profiles at /debug/pprof/profile; false: 403
//! # web_config = "/etc/tessera/web.yml"  # Prometheus web config: tls_server_config, basic_auth_users
//!
//! [tls]                       # optional: TLS on the wire listener; plain TCP when absent
//! cert_file = "/etc/tessera/tls/ingester.crt"
//! key_file = "/etc/tessera/tls/ingester.key"
//! client_ca_file = "/etc/tessera/tls/ca.crt"  # require client certificates signed by it
//!
//! [placement]                 # optional: one of several ingesters, each owning a share of
//!                             # the series (the ingesters' placement in etcd; see crate::tier)
//! advertise = "10.0.1.1:7500"    # where aggregators reach this one (default: listen)
//! liveness_ttl_secs = 10         # a crashed ingester's shards move this long after it died
//! num_shards = 64                # shards of a placement this ingester creates
//! join = true                    # add itself when it is not in the placement
//! move_delay_secs = 30           # a join moves shards at least this long from now,
//! move_boundary_secs = 60        #   on a multiple of this
//! settle_secs = 90               # moves are finalized this long after their cutover
//! [placement.etcd]
//! endpoints = ["http://127.0.0.1:2379"]
//! env = "prod"
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::admit::HistogramMode;
use crate::pool::PoolSettings;
use crate::pool::pacing::Aimd;
use crate::queue::{FsyncPolicy, QueueOptions};
use crate::sink::carbon::{CarbonSettings, Protocol};
use crate::sink::file::FileSinkSettings;
use crate::sink::graphite::{Naming, Scheme, StatsdOptions, TagStyle};
use crate::sink::influx::{InfluxNaming, InfluxSettings, endpoint};
use crate::sink::openmetrics::Helps;
use crate::sink::remote_write::{Authorization, RemoteWriteSettings, TokenFile, parse_url};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// What `[sink]` stores by default: the 10 s tiles, whatever their retention.
pub const DEFAULT_SINK_POLICY: &str = "10s";

/// The smallest `max_buckets`: at the coarsest schema (-4, a bucket per 2^16) every finite
/// magnitude fits in 128 buckets a sign, and usual data in far fewer.
pub const MIN_MAX_BUCKETS: usize = 16;

tessera_wire::listener_config! {
    /// The whole configuration; see the [module docs](self).
    pub struct Config {
        /// Name in handshakes and logs; defaults to the host name.
        pub instance_id: Option<String> = None,
        /// Root of the queue, the file sink output and the rejected-samples log.
        pub data_dir: PathBuf = PathBuf::from("./data/ingester"),
        /// How long in-flight storage requests may take to finish on shutdown, seconds.
        pub shutdown_grace_secs: u64 = 10,
        /// Bound of the rejected-samples log with its one rotated file, bytes.
        pub rejected_log_max_bytes: u64 = 64 << 20,
        /// The memory budget: bytes (`536870912`, `"2GiB"`) or a share of the cgroup's
        /// limit (`"80%"`). From 75 % of it until under 65 %, the least recently written
        /// tenth of the running totals is evicted once a second and counted
        /// (`totals_evicted_total`); their series start over with an explicit reset. Without it, 80 % of the
        /// cgroup's limit when it has one; `"none"`: no budget.
        pub memory_limit: Option<tessera_runtime::memory::MemoryLimit> = None,
        /// `[queue]`
        pub queue: QueueConfig = QueueConfig::default(),
        /// `[pool]`
        pub pool: PoolConfig = PoolConfig::default(),
        /// `[pacing]`
        pub pacing: PacingConfig = PacingConfig::default(),
        /// `[mapping]`
        pub mapping: MappingConfig = MappingConfig::default(),
        /// What `[sink]` stores: each entry a resolution (`"10s"`, every policy of that
        /// resolution) or a whole storage policy (`"10s:2d"`). One entry: its samples carry no
        /// `resolution` label (one resolution per store, as M3's namespaces). Several: the label
        /// is kept, so that the resolutions stay apart in one store (a warning at
        /// `--check-config`: queries written for statsd_exporter would count them all).
        pub sink_policies: Vec<String> = vec![DEFAULT_SINK_POLICY.to_owned()],
        /// `[sink]`: the default target.
        pub sink: SinkConfig = SinkConfig::default(),
        /// `[policy_sinks."<policy>"]`: storage policies with their own target (a second store
        /// with a longer retention for the 1 m tiles, say); one policy each, no `resolution`
        /// label.
        pub policy_sinks: BTreeMap<String, SinkConfig> = BTreeMap::new(),
        /// `[telemetry]`
        pub telemetry: TelemetryConfig = TelemetryConfig::default(),
        /// `[placement]`: one of several ingesters in the ingesters' placement (optional).
        pub placement: Option<crate::tier::PlacementConfig> = None,
    }
    defaults { listen: "127.0.0.1:7500", max_connections: 256, handshake_timeout_ms: 10_000 }
}

/// When queue appends are fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FsyncConfig {
    /// Before each acknowledgement.
    #[default]
    Always,
    /// Every `fsync_interval_ms`.
    Interval,
    /// Left to the kernel.
    Never,
}

/// `[queue]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Bound of each target's queue, bytes; above it batches are answered `Retryable`.
    pub max_queue_bytes: u64,
    /// Segment files are sealed past this size, bytes.
    pub segment_max_bytes: u64,
    /// When appends are fsynced.
    pub fsync: FsyncConfig,
    /// Fsync interval with `fsync = "interval"`, milliseconds.
    pub fsync_interval_ms: u64,
    /// How often each target's running totals are checkpointed, seconds. A restart continues
    /// them from the checkpoint and the records queued after it, which stay on disk until
    /// the next checkpoint, delivered or not: a longer interval keeps more of them and makes
    /// the roll-forward at start longer.
    pub checkpoint_interval_secs: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_queue_bytes: 1 << 30,
            segment_max_bytes: 64 << 20,
            fsync: FsyncConfig::Always,
            fsync_interval_ms: 1000,
            checkpoint_interval_secs: 10,
        }
    }
}

impl QueueConfig {
    /// The fsync policy these keys describe.
    pub fn fsync_policy(&self) -> FsyncPolicy {
        match self.fsync {
            FsyncConfig::Always => FsyncPolicy::Always,
            FsyncConfig::Interval => FsyncPolicy::Interval(Duration::from_millis(self.fsync_interval_ms)),
            FsyncConfig::Never => FsyncPolicy::Never,
        }
    }

    /// The options of a target's queue in `dir`.
    pub fn options(&self, dir: PathBuf) -> QueueOptions {
        QueueOptions::new(dir, self.max_queue_bytes, self.segment_max_bytes, self.fsync_policy())
    }

    /// How often the writer thread looks whether an interval fsync is due: half the
    /// interval, between 5 ms and 1 s.
    pub fn writer_tick(&self) -> Duration {
        Duration::from_millis((self.fsync_interval_ms / 2).clamp(5, 1000))
    }

    /// How often the running totals are checkpointed.
    pub fn checkpoint_interval(&self) -> Duration {
        Duration::from_secs(self.checkpoint_interval_secs)
    }
}

/// `[pool]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Long-lived workers per target.
    pub workers: usize,
    /// Requests waiting in each worker's channel.
    pub channel_requests: usize,
    /// Most samples in one storage request.
    pub max_samples_per_request: usize,
    /// First retry delay, milliseconds.
    pub retry_initial_backoff_ms: u64,
    /// Longest retry delay, milliseconds.
    pub retry_max_backoff_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            workers: 8,
            channel_requests: 4,
            max_samples_per_request: 2000,
            retry_initial_backoff_ms: 100,
            retry_max_backoff_ms: 10_000,
        }
    }
}

impl PoolConfig {
    /// The settings of every target's pool.
    pub fn settings(&self) -> PoolSettings {
        PoolSettings {
            workers: self.workers,
            channel_requests: self.channel_requests,
            max_samples_per_request: self.max_samples_per_request,
            retry_initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            retry_max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
        }
    }
}

/// `[pacing]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PacingConfig {
    /// Lowest adaptive in-flight limit.
    pub min_in_flight: usize,
    /// Highest adaptive in-flight limit (workers cap it too).
    pub max_in_flight: usize,
    /// Limit at start.
    pub initial_in_flight: usize,
    /// The limit grows while a window's mean latency is at most this times the baseline.
    pub latency_ratio: f64,
    /// Optional ceiling on samples written per second, per target.
    pub max_samples_per_sec: Option<f64>,
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            min_in_flight: 1,
            max_in_flight: 8,
            initial_in_flight: 2,
            latency_ratio: 2.0,
            max_samples_per_sec: None,
        }
    }
}

impl PacingConfig {
    /// The in-flight limit of a target served by `workers` workers (which cap it too).
    pub fn aimd(&self, workers: usize) -> Aimd {
        let max_in_flight = self.max_in_flight.min(workers);
        Aimd::new(self.min_in_flight.min(max_in_flight), max_in_flight, self.initial_in_flight, self.latency_ratio)
    }
}

/// `[mapping]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MappingConfig {
    /// Quantiles emitted for timers, histograms and distributions, each in (0, 1].
    pub quantiles: Vec<f64>,
    /// Running totals of series idle this long are forgotten (a counter reset), seconds.
    pub counter_expire_after_secs: u64,
    /// The collectors' statsd_exporter mapping file, read for the `help` of its mappings
    /// (the `# HELP` of the file sink, remote write's metadata).
    pub file: Option<PathBuf>,
    /// The unit the collectors write `|ms` timers in (their `[aggregation] timer_unit`):
    /// the `unit` of timer families in remote write's metadata.
    pub timer_unit: TimerUnitName,
}

/// `[mapping] timer_unit`: `seconds` (the collectors' default) or `milliseconds`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerUnitName {
    /// Timers in seconds.
    #[default]
    Seconds,
    /// Timers in milliseconds.
    Milliseconds,
}

impl TimerUnitName {
    /// The metadata's unit.
    pub fn as_str(self) -> &'static str {
        match self {
            TimerUnitName::Seconds => "seconds",
            TimerUnitName::Milliseconds => "milliseconds",
        }
    }
}

impl Default for MappingConfig {
    fn default() -> Self {
        MappingConfig {
            quantiles: vec![0.5, 0.9, 0.99],
            counter_expire_after_secs: 3600,
            file: None,
            timer_unit: TimerUnitName::Seconds,
        }
    }
}

impl MappingConfig {
    /// The help texts of `file`'s mappings (none without one).
    pub fn helps(&self) -> Result<Helps, ConfigError> {
        let Some(path) = &self.file else { return Ok(Helps::default()) };
        let file = tessera_rules::MappingFile::load(path)
            .map_err(|error| ConfigError::new("mapping.file", error.to_string()))?;
        Ok(Helps::new(file.helps()))
    }
}

/// A sink target.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SinkConfig {
    /// OpenMetrics files.
    File(FileSinkConfig),
    /// Prometheus remote write.
    RemoteWrite(Box<RemoteWriteConfig>),
    /// Graphite (carbon), per tile.
    Graphite(Box<GraphiteConfig>),
    /// InfluxDB line protocol, per tile.
    Influxdb(Box<InfluxConfig>),
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig::File(FileSinkConfig::default())
    }
}

/// `kind = "file"`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileSinkConfig {
    /// Output directory; default `<data_dir>/openmetrics/<target>`.
    pub dir: Option<PathBuf>,
    /// Close the journal into an `.om` file past this size, bytes.
    pub rotate_bytes: u64,
    /// Close the journal into an `.om` file after this long, seconds.
    pub rotate_secs: u64,
    /// Fsync the journal before acknowledging a request.
    pub fsync: bool,
}

impl Default for FileSinkConfig {
    fn default() -> Self {
        FileSinkConfig { dir: None, rotate_bytes: 64 << 20, rotate_secs: 60, fsync: true }
    }
}

impl FileSinkConfig {
    /// The file sink's settings, writing in `dir` (this `dir`, else the default given).
    pub fn settings(&self, default_dir: impl FnOnce() -> PathBuf) -> FileSinkSettings {
        FileSinkSettings {
            dir: self.dir.clone().unwrap_or_else(default_dir),
            rotate_bytes: self.rotate_bytes,
            rotate_after: Duration::from_secs(self.rotate_secs),
            fsync: self.fsync,
            helps: Helps::default(),
        }
    }
}

/// `kind = "remote_write"`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteWriteConfig {
    /// Endpoint, `http://host:port/path` or `https://host:port/path`.
    pub url: String,
    /// Send `M3-Metrics-Type: aggregated` and `M3-Storage-Policy: <policy>`.
    pub m3_headers: bool,
    /// Whole-request deadline, milliseconds.
    pub request_timeout_ms: u64,
    /// TCP connect deadline, milliseconds.
    pub connect_timeout_ms: u64,
    /// How timers, histograms and distributions are written.
    pub histograms: HistogramMode,
    /// Most buckets of a native histogram; beyond, its schema is lowered.
    pub max_buckets: usize,
    /// `[sink.tls]`: for an `https` url, the CA file to trust (else the system's roots),
    /// a client certificate and key (mTLS), `server_name`, `insecure_skip_verify` (tests only).
    pub tls: Option<tessera_wire::ClientTlsConfig>,
    /// `[sink.basic_auth]`: `username`, and the password from `password_file` or the
    /// environment variable `password_env` (never from this file, never logged).
    pub basic_auth: Option<BasicAuthConfig>,
    /// A file holding a bearer token (`Authorization: Bearer <token>`), re-read when it
    /// changes, so that rotated tokens are used without a restart.
    pub bearer_token_file: Option<PathBuf>,
    /// Headers sent with every request, e.g. `{ "X-Scope-OrgID" = "team-a" }`.
    pub headers: BTreeMap<String, String>,
    /// A tag whose value is the tenant of each series: requests are split by it and each
    /// carries its tenant in `tenant_header`. Series without it go with `headers` alone.
    pub tenant_label: Option<String>,
    /// The header `tenant_label` sets.
    pub tenant_header: String,
    /// Send each family's type, help and unit (remote write's metadata) in requests of
    /// their own every `metadata_interval_secs`, as Prometheus' own sender does. Not with
    /// `tenant_label` or `m3_headers` (a metadata request has no series to take a tenant
    /// or a storage policy from). Prometheus 2's receiver drops it; Mimir keeps it. Unset:
    /// on where it can be sent; `true` where it cannot is a warning at `--check-config`.
    pub metadata: Option<bool>,
    /// How often the metadata goes out, seconds.
    pub metadata_interval_secs: u64,
    /// Labels added to every series this target writes, as Prometheus' `external_labels`
    /// (`{ cluster = "eu-1" }`): a tag of the series with the same name wins.
    pub external_labels: BTreeMap<String, String>,
}

impl RemoteWriteConfig {
    /// Whether the target sends metadata: unless turned off, where a request without
    /// series can be sent (no `tenant_label`, no `m3_headers`).
    pub fn sends_metadata(&self) -> bool {
        self.metadata != Some(false) && self.tenant_label.is_none() && !self.m3_headers
    }
}

impl Default for RemoteWriteConfig {
    fn default() -> Self {
        RemoteWriteConfig {
            url: String::new(),
            m3_headers: false,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 2_000,
            histograms: HistogramMode::Native,
            max_buckets: 160,
            tls: None,
            basic_auth: None,
            bearer_token_file: None,
            headers: BTreeMap::new(),
            tenant_label: None,
            tenant_header: "X-Scope-OrgID".to_owned(),
            metadata: None,
            metadata_interval_secs: 60,
            external_labels: BTreeMap::new(),
        }
    }
}

/// `kind = "graphite"`: carbon's plaintext or pickle protocol, each tile written once with
/// the names of `naming` (see [`crate::sink::graphite`] and [`crate::sink::carbon`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphiteConfig {
    /// carbon's receiver, `host:port` (plaintext: carbon's `LINE_RECEIVER_PORT`, 2003;
    /// pickle: `PICKLE_RECEIVER_PORT`, 2004).
    pub address: String,
    /// `plaintext` or `pickle`.
    pub protocol: Protocol,
    /// Whose paths: `statsd`, `brubeck` or `tessera`.
    pub naming: Scheme,
    /// How tags are written: `tagged` (`path;k=v`), `path` (`path.k_v`) or `drop`.
    pub tags: TagStyle,
    /// statsd's `legacyNamespace`.
    pub legacy_namespace: bool,
    /// statsd's `globalPrefix`.
    pub global_prefix: String,
    /// statsd's `prefixCounter`.
    pub prefix_counter: String,
    /// statsd's `prefixTimer`.
    pub prefix_timer: String,
    /// statsd's `prefixGauge`.
    pub prefix_gauge: String,
    /// statsd's `prefixSet`.
    pub prefix_set: String,
    /// statsd's `globalSuffix`.
    pub global_suffix: String,
    /// statsd's `percentThreshold`.
    pub percent_thresholds: Vec<f64>,
    /// What was written this recently is sent again after a break, seconds.
    pub resend_window_secs: u64,
    /// The resend window's most bytes.
    pub resend_window_bytes: u64,
    /// TCP connect deadline, milliseconds.
    pub connect_timeout_ms: u64,
    /// Deadline of one write, milliseconds.
    pub write_timeout_ms: u64,
}

impl Default for GraphiteConfig {
    fn default() -> Self {
        let statsd = StatsdOptions::default();
        GraphiteConfig {
            address: "127.0.0.1:2003".to_owned(),
            protocol: Protocol::Plaintext,
            naming: Scheme::Statsd,
            tags: TagStyle::Tagged,
            legacy_namespace: statsd.legacy_namespace,
            global_prefix: statsd.global_prefix,
            prefix_counter: statsd.prefix_counter,
            prefix_timer: statsd.prefix_timer,
            prefix_gauge: statsd.prefix_gauge,
            prefix_set: statsd.prefix_set,
            global_suffix: statsd.global_suffix,
            percent_thresholds: statsd.percent_thresholds,
            resend_window_secs: 60,
            resend_window_bytes: 256 << 20,
            connect_timeout_ms: 2_000,
            write_timeout_ms: 10_000,
        }
    }
}

impl GraphiteConfig {
    /// The target's naming.
    pub fn naming(&self) -> Naming {
        Naming {
            scheme: self.naming,
            tags: self.tags,
            statsd: StatsdOptions {
                legacy_namespace: self.legacy_namespace,
                global_prefix: self.global_prefix.clone(),
                prefix_counter: self.prefix_counter.clone(),
                prefix_timer: self.prefix_timer.clone(),
                prefix_gauge: self.prefix_gauge.clone(),
                prefix_set: self.prefix_set.clone(),
                global_suffix: self.global_suffix.clone(),
                percent_thresholds: self.percent_thresholds.clone(),
            },
        }
    }

    /// The connection's settings.
    pub fn settings(&self) -> CarbonSettings {
        CarbonSettings {
            address: self.address.clone(),
            protocol: self.protocol,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            write_timeout: Duration::from_millis(self.write_timeout_ms),
            resend_window: Duration::from_secs(self.resend_window_secs),
            resend_window_bytes: usize::try_from(self.resend_window_bytes).unwrap_or(usize::MAX),
        }
    }
}

/// `kind = "influxdb"`: each tile once in line protocol, named as Telegraf's statsd input
/// writes it (see [`crate::sink::influx`]). InfluxDB 1.x (`database`, optional
/// `retention_policy` and `[basic_auth]`) or 2.x (`org`, `bucket` and `token_file`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InfluxConfig {
    /// The server, `http://host:8086` or `https://…` (a path prefix is kept).
    pub url: String,
    /// 1.x: the database (`/write?db=`).
    pub database: String,
    /// 1.x: the retention policy (`&rp=`); empty: the database's default.
    pub retention_policy: String,
    /// 1.x: `username` and `password_file` or `password_env`.
    pub basic_auth: Option<BasicAuthConfig>,
    /// 2.x: the organization (`/api/v2/write?org=`).
    pub org: String,
    /// 2.x: the bucket; set, the target speaks 2.x's API.
    pub bucket: String,
    /// 2.x: a file holding the API token (`Authorization: Token …`).
    pub token_file: Option<PathBuf>,
    /// Telegraf's `metric_separator`: what joins a dotted name's parts in a measurement.
    pub separator: String,
    /// Telegraf's `percentiles`: `<p>_percentile` fields of timers.
    pub percentiles: Vec<f64>,
    /// Whole-request deadline, milliseconds.
    pub request_timeout_ms: u64,
    /// TCP connect deadline, milliseconds.
    pub connect_timeout_ms: u64,
}

impl Default for InfluxConfig {
    fn default() -> Self {
        let naming = InfluxNaming::default();
        InfluxConfig {
            url: "http://127.0.0.1:8086".to_owned(),
            database: "telegraf".to_owned(),
            retention_policy: String::new(),
            basic_auth: None,
            org: String::new(),
            bucket: String::new(),
            token_file: None,
            separator: naming.separator,
            percentiles: naming.percentiles,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 2_000,
        }
    }
}

impl InfluxConfig {
    /// The target's naming.
    pub fn naming(&self) -> InfluxNaming {
        InfluxNaming { separator: self.separator.clone(), percentiles: self.percentiles.clone() }
    }

    /// The sink's settings, its credential read now.
    ///
    /// # Errors
    ///
    /// The key at fault and why.
    pub fn settings(&self, max_idle_connections: usize) -> Result<InfluxSettings, (&'static str, String)> {
        let v2 = !self.bucket.is_empty();
        let base = parse_url(&self.url).map_err(|error| ("url", error.to_string()))?;
        let (name, scope, destination) = if v2 {
            if self.org.is_empty() {
                return Err(("org", "a 2.x target (bucket set) needs its org".to_owned()));
            }
            (&self.bucket, &self.org, format!("bucket `{}`", self.bucket))
        } else {
            if self.database.is_empty() {
                return Err(("database", "must be set (or org and bucket for InfluxDB 2.x)".to_owned()));
            }
            (&self.database, &self.retention_policy, format!("database `{}`", self.database))
        };
        let url = endpoint(&base.to_string(), v2, name, scope)
            .parse()
            .map_err(|error: hyper::http::uri::InvalidUri| ("url", error.to_string()))?;
        let authorization = match (v2, &self.basic_auth, &self.token_file) {
            (true, Some(_), _) => return Err(("basic_auth", "InfluxDB 2.x takes a token_file, not basic_auth".into())),
            (false, _, Some(_)) => {
                return Err(("token_file", "InfluxDB 1.x takes basic_auth; set bucket for 2.x".into()));
            }
            (true, None, None) => return Err(("token_file", "InfluxDB 2.x needs an API token".to_owned())),
            (true, None, Some(path)) => {
                let token = std::fs::read_to_string(path)
                    .map_err(|error| ("token_file", format!("`{}`: {error}", path.display())))?;
                let mut value = HeaderValue::from_str(&format!("Token {}", token.trim()))
                    .map_err(|_| ("token_file", "the token holds characters a header cannot carry".to_owned()))?;
                value.set_sensitive(true);
                Some(value)
            }
            (false, Some(basic), None) => {
                let password = basic.password().map_err(|error| ("basic_auth", error))?;
                match Authorization::basic(&basic.username, &password) {
                    Ok(Authorization::Basic(value)) => Some(value),
                    _ => {
                        return Err((
                            "basic_auth",
                            "the user name or password holds characters a header cannot carry".into(),
                        ));
                    }
                }
            }
            (false, None, None) => None,
        };
        Ok(InfluxSettings {
            url,
            destination,
            authorization,
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            max_idle_connections,
        })
    }
}

/// `[sink.basic_auth]`
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BasicAuthConfig {
    /// The user name.
    pub username: String,
    /// A file holding the password (trailing newline ignored).
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    pub password_env: Option<String>,
}

impl BasicAuthConfig {
    /// The password, from its file or its environment variable.
    ///
    /// # Errors
    ///
    /// When neither or both are set, or the one set cannot be read.
    pub fn password(&self) -> Result<String, String> {
        match (&self.password_file, &self.password_env) {
            (Some(path), None) => std::fs::read_to_string(path)
                .map(|text| text.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|error| format!("password_file `{}`: {error}", path.display())),
            (None, Some(name)) => {
                std::env::var(name).map_err(|_| format!("password_env: the environment variable `{name}` is not set"))
            }
            _ => Err("set one of password_file and password_env".to_owned()),
        }
    }
}

impl RemoteWriteConfig {
    /// The sink's settings, its files read now; a TLS or bearer token file that changes and
    /// does not load is counted in `reload_errors`.
    ///
    /// # Errors
    ///
    /// The key at fault and why: a bad URL, a TLS file that cannot be used, `https` with
    /// no roots to trust, TLS settings on an `http` URL, a credential that cannot be read,
    /// a header that cannot be sent.
    pub fn settings(
        &self,
        max_idle_connections: usize,
        reload_errors: prometheus_client::metrics::counter::Counter,
    ) -> Result<RemoteWriteSettings, (&'static str, String)> {
        let url = parse_url(&self.url).map_err(|error| ("url", error.to_string()))?;
        let https = url.scheme_str() == Some("https");
        if self.tls.is_some() && !https {
            return Err(("tls", "is set but the url is not https://".to_owned()));
        }
        if https && self.tls.is_none() {
            // The system's roots: there must be some.
            tessera_wire::ClientTlsConfig::default().client_config().map_err(|error| ("url", error.to_string()))?;
        }
        let tls = tessera_wire::client_tls(self.tls.as_ref(), reload_errors.clone())
            .map_err(|error| ("tls", error.to_string()))?;
        let authorization = match (&self.basic_auth, &self.bearer_token_file) {
            (Some(_), Some(_)) => {
                return Err(("basic_auth", "set basic_auth or bearer_token_file, not both".to_owned()));
            }
            (Some(basic), None) => {
                if basic.username.is_empty() || basic.username.contains(':') {
                    return Err(("basic_auth.username", "must be set, without `:`".to_owned()));
                }
                let password = basic.password().map_err(|error| ("basic_auth", error))?;
                Some(Authorization::basic(&basic.username, &password).map_err(|_| {
                    ("basic_auth", "the user name or password holds characters a header cannot carry".to_owned())
                })?)
            }
            (None, Some(path)) => Some(Authorization::Bearer(
                TokenFile::open(path.clone(), reload_errors.clone()).map_err(|error| ("bearer_token_file", error))?,
            )),
            (None, None) => None,
        };
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ("headers", format!("`{name}` is not a header name")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| ("headers", format!("the value of `{name}` is not a header value")))?;
            headers.insert(name, value);
        }
        let tenant = match &self.tenant_label {
            Some(label) => {
                let header = HeaderName::from_bytes(self.tenant_header.as_bytes())
                    .map_err(|_| ("tenant_header", format!("`{}` is not a header name", self.tenant_header)))?;
                Some((label.clone(), header))
            }
            None => None,
        };
        Ok(RemoteWriteSettings {
            url,
            m3_headers: self.m3_headers,
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            max_idle_connections,
            tls,
            authorization,
            headers,
            tenant,
            metadata: self.sends_metadata(),
            metadata_interval: Duration::from_secs(self.metadata_interval_secs.max(1)),
            helps: Helps::default(),
        })
    }
}

/// `[telemetry]`: `listen`, by default `127.0.0.1:9104`.
pub type TelemetryConfig = tessera_runtime::config::TelemetryConfig<9104>;

/// A configuration that cannot work.
pub type ConfigError = tessera_runtime::config::InvalidSetting;

impl Config {
    /// On SIGTERM, how long to keep writing what is queued.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| Err(ConfigError::new(key, reason));
        self.validate_listener()?;
        if let Some(limit) = self.memory_limit {
            limit.resolve().map_err(|reason| ConfigError::new("memory_limit", reason))?;
        }
        if let Some(placement) = &self.placement {
            placement.validate(self.listen)?;
            if self.instance_id.as_deref().is_none_or(str::is_empty) {
                return invalid("instance_id", "must be set with [placement]: it names this ingester in it");
            }
        }
        if self.queue.segment_max_bytes < 4096 {
            return invalid("queue.segment_max_bytes", "must be at least 4096");
        }
        if self.queue.max_queue_bytes < self.queue.segment_max_bytes {
            return invalid("queue.max_queue_bytes", "must hold at least one segment (queue.segment_max_bytes)");
        }
        if self.queue.fsync == FsyncConfig::Interval && self.queue.fsync_interval_ms == 0 {
            return invalid("queue.fsync_interval_ms", "must be at least 1 with fsync = \"interval\"");
        }
        if !(1..=3600).contains(&self.queue.checkpoint_interval_secs) {
            return invalid("queue.checkpoint_interval_secs", "must be between 1 and 3600");
        }
        if self.pool.workers == 0 || self.pool.workers > 1024 {
            return invalid("pool.workers", "must be between 1 and 1024");
        }
        if self.pool.channel_requests == 0 {
            return invalid("pool.channel_requests", "must be at least 1");
        }
        if self.pool.max_samples_per_request == 0 {
            return invalid("pool.max_samples_per_request", "must be at least 1");
        }
        if self.pool.retry_initial_backoff_ms == 0
            || self.pool.retry_initial_backoff_ms > self.pool.retry_max_backoff_ms
        {
            return invalid("pool.retry_initial_backoff_ms", "must be at least 1 and at most retry_max_backoff_ms");
        }
        let pacing = &self.pacing;
        if pacing.min_in_flight == 0 || pacing.min_in_flight > pacing.max_in_flight {
            return invalid("pacing.min_in_flight", "must be at least 1 and at most max_in_flight");
        }
        if !(pacing.min_in_flight..=pacing.max_in_flight).contains(&pacing.initial_in_flight) {
            return invalid("pacing.initial_in_flight", "must be between min_in_flight and max_in_flight");
        }
        if !(pacing.latency_ratio.is_finite() && pacing.latency_ratio >= 1.0) {
            return invalid("pacing.latency_ratio", "must be a number of at least 1");
        }
        if pacing.max_samples_per_sec.is_some_and(|rate| !(rate.is_finite() && rate > 0.0)) {
            return invalid("pacing.max_samples_per_sec", "must be above 0 (leave it out for no ceiling)");
        }
        if self.mapping.quantiles.iter().any(|q| !(*q > 0.0 && *q <= 1.0)) {
            return invalid("mapping.quantiles", "each must be in (0, 1]");
        }
        self.mapping.helps()?;
        if self.mapping.counter_expire_after_secs == 0 {
            return invalid("mapping.counter_expire_after_secs", "must be at least 1");
        }
        if self.sink_policies.is_empty() {
            return invalid("sink_policies", "list at least one resolution (\"10s\") or storage policy (\"10s:2d\")");
        }
        if let Some(index) = self.sink_policies.iter().position(|entry| entry.trim().is_empty()) {
            return invalid("sink_policies", &format!("entry {} is empty", index + 1));
        }
        validate_sink("sink", &self.sink)?;
        for (policy, sink) in &self.policy_sinks {
            if policy.trim().is_empty() {
                return invalid("policy_sinks", "a storage policy key is empty");
            }
            validate_sink(&format!("policy_sinks.\"{policy}\""), sink)?;
        }
        Ok(())
    }

    /// What `--check-config` and the start warn about: a configuration that works but is
    /// probably not what its author meant.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.sink_policies.len() > 1 {
            warnings.push(format!(
                "sink_policies lists {} policies for one target, so its samples keep the `resolution` label: \
                 a query without a `resolution` matcher (`sum(rate(x_total[5m]))`) counts every resolution; \
                 give each resolution its own target ([policy_sinks.\"<policy>\"]) for one resolution per store",
                self.sink_policies.len()
            ));
        }
        for target in self.targets() {
            if let SinkConfig::RemoteWrite(remote) = &target.sink
                && remote.metadata == Some(true)
                && !remote.sends_metadata()
            {
                warnings.push(format!(
                    "target `{}` sends no metadata: a metadata request has no series to take its tenant                      (tenant_label) or storage policy (m3_headers) from; set metadata = false to say so",
                    target.name
                ));
            }
        }
        warnings
    }

    /// The sink targets: `default` first, then one per storage policy with its own sink.
    pub fn targets(&self) -> Vec<TargetConfig> {
        let mut targets = vec![TargetConfig {
            name: "default".to_owned(),
            takes: self.sink_policies.iter().map(|entry| entry.trim().to_owned()).collect(),
            sink: self.sink.clone(),
        }];
        for (policy, sink) in &self.policy_sinks {
            targets.push(TargetConfig {
                name: policy.trim().to_owned(),
                takes: vec![policy.trim().to_owned()],
                sink: sink.clone(),
            });
        }
        targets
    }
}

/// One sink target: its name, what it stores and where.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// `default` for `[sink]`, else the policy of `[policy_sinks."<policy>"]`.
    pub name: String,
    /// Resolutions (`10s`) or storage policies (`10s:2d`) it stores.
    pub takes: Vec<String>,
    /// The sink.
    pub sink: SinkConfig,
}

impl TargetConfig {
    /// Whether its samples carry the `resolution` label: only when it stores several.
    pub fn resolution_label(&self) -> bool {
        self.takes.len() > 1
    }
}

fn validate_sink(key: &str, sink: &SinkConfig) -> Result<(), ConfigError> {
    let invalid = |field: &str, reason: String| Err(ConfigError::new(format!("{key}.{field}"), reason));
    match sink {
        SinkConfig::File(file) => {
            if file.rotate_bytes == 0 {
                return invalid("rotate_bytes", "must be at least 1".into());
            }
            if file.rotate_secs == 0 {
                return invalid("rotate_secs", "must be at least 1".into());
            }
        }
        SinkConfig::Influxdb(influx) => {
            if let Err((field, reason)) = influx.settings(1) {
                return invalid(field, reason);
            }
            if influx.request_timeout_ms == 0 || influx.connect_timeout_ms == 0 {
                return invalid("request_timeout_ms", "timeouts must be at least 1 ms".into());
            }
            if let Some(bad) = influx.percentiles.iter().find(|pct| !(**pct > 0.0 && **pct <= 100.0)) {
                return invalid("percentiles", format!("{bad} is not within (0, 100]"));
            }
        }
        SinkConfig::Graphite(graphite) => {
            if graphite.address.trim().is_empty() || !graphite.address.contains(':') {
                return invalid("address", format!("`{}` is not host:port", graphite.address));
            }
            if graphite.connect_timeout_ms == 0 || graphite.write_timeout_ms == 0 {
                return invalid("connect_timeout_ms", "timeouts must be at least 1 ms".into());
            }
            if let Some(bad) = graphite.percent_thresholds.iter().find(|pct| !(pct.abs() > 0.0 && pct.abs() <= 100.0)) {
                return invalid("percent_thresholds", format!("{bad} is not within (0, 100] or [-100, 0)"));
            }
        }
        SinkConfig::RemoteWrite(remote) => {
            if let Err((field, reason)) = remote.settings(1, prometheus_client::metrics::counter::Counter::default()) {
                return invalid(field, reason);
            }
            if remote.request_timeout_ms == 0 || remote.connect_timeout_ms == 0 {
                return invalid("request_timeout_ms", "timeouts must be at least 1 ms".into());
            }
            if remote.max_buckets < MIN_MAX_BUCKETS {
                return invalid("max_buckets", format!("must be at least {MIN_MAX_BUCKETS}"));
            }
            for (name, value) in &remote.external_labels {
                let mut valid = String::new();
                let reserved = tessera_core::series::is_reserved_label(name);
                if !crate::admit::names::label_name(name.as_bytes(), &mut valid) || valid != *name || reserved {
                    let why = if reserved { "is tessera's or Prometheus'" } else { "is not a valid label name" };
                    return invalid("external_labels", format!("`{name}` {why}"));
                }
                if value.is_empty() {
                    return invalid("external_labels", format!("`{name}` has an empty value"));
                }
            }
        }
    }
    Ok(())
}

/// A directory name for a target (`1m:40d` → `1m_40d`).
pub fn target_dir_name(target: &str) -> String {
    target.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_target_for_two_resolutions_keeps_the_label_with_a_warning() {
        let config: Config = toml::from_str("sink_policies = [\"10s\", \"1m:40d\"]\n").unwrap();
        config.validate().unwrap();
        assert!(config.targets()[0].resolution_label());
        let warnings = config.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("keep the `resolution` label"), "{warnings:?}");
        for (bad, why) in [("sink_policies = []", "at least one"), ("sink_policies = [\" \"]", "entry 1 is empty")] {
            let config: Config = toml::from_str(bad).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains("sink_policies") && error.contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn external_labels_must_be_valid_label_names_of_the_users_own_with_values() {
        let with = |labels: &str| {
            let text = format!(
                "[sink]\nkind = \"remote_write\"\nurl = \"http://x:9090/api/v1/write\"\nexternal_labels = {labels}\n"
            );
            toml::from_str::<Config>(&text).unwrap().validate().map_err(|error| error.to_string())
        };
        with("{ cluster = \"eu-1\", writer = \"ing-1\" }").unwrap();
        for (bad, why) in [
            ("{ \"1st\" = \"x\" }", "`1st` is not a valid label name"),
            ("{ \"a-b\" = \"x\" }", "`a-b` is not a valid label name"),
            ("{ resolution = \"x\" }", "`resolution` is tessera's or Prometheus'"),
            ("{ __name__ = \"x\" }", "`__name__` is tessera's or Prometheus'"),
            ("{ cluster = \"\" }", "`cluster` has an empty value"),
        ] {
            let error = with(bad).unwrap_err();
            assert!(error.contains("external_labels") && error.contains(why), "{bad}: {error}");
        }
    }

    #[test]
    fn defaults_are_valid_and_write_files() {
        let config: Config = toml::from_str("").unwrap();
        config.validate().unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:7500");
        assert!(matches!(config.sink, SinkConfig::File(_)));
        assert_eq!(config.targets().len(), 1);
    }

    #[test]
    fn settings_carry_the_keys_as_durations_and_bounds() {
        let config: Config = toml::from_str(
            "[queue]\nfsync_interval_ms = 4\ncheckpoint_interval_secs = 7\n\
             [pool]\nworkers = 3\nretry_initial_backoff_ms = 50\nretry_max_backoff_ms = 900\n\
             [pacing]\nmax_in_flight = 8\ninitial_in_flight = 8\n\
             [sink]\nkind = \"file\"\nrotate_secs = 30\n",
        )
        .unwrap();
        assert_eq!(config.queue.writer_tick(), Duration::from_millis(5), "half the interval, at least 5 ms");
        assert_eq!(config.queue.checkpoint_interval(), Duration::from_secs(7));
        let pool = config.pool.settings();
        assert_eq!(
            (pool.workers, pool.retry_initial_backoff, pool.retry_max_backoff),
            (3, Duration::from_millis(50), Duration::from_millis(900))
        );
        assert_eq!(config.pacing.aimd(config.pool.workers).limit(), 3, "the workers cap the in-flight limit");
        let SinkConfig::File(file) = &config.sink else { panic!("a file sink") };
        let settings = file.settings(|| PathBuf::from("/default"));
        assert_eq!((settings.dir, settings.rotate_after), (PathBuf::from("/default"), Duration::from_secs(30)));
        assert_eq!(config.shutdown_grace(), Duration::from_secs(10));
    }

    #[test]
    fn parses_remote_write_targets_per_policy_and_rejects_unknown_keys() {
        let text = r#"
            [sink]
            kind = "remote_write"
            url = "http://127.0.0.1:9090/api/v1/write"
            m3_headers = true
            [policy_sinks."1m:40d"]
            kind = "file"
            rotate_secs = 5
            [pacing]
            max_samples_per_sec = 1000.0
        "#;
        let config: Config = toml::from_str(text).unwrap();
        config.validate().unwrap();
        let targets = config.targets();
        assert_eq!(targets[1].name, "1m:40d");
        assert_eq!(target_dir_name(&targets[1].name), "1m_40d");
        assert!(matches!(&targets[0].sink, SinkConfig::RemoteWrite(remote) if remote.m3_headers));
        assert_eq!(
            (targets[0].takes.as_slice(), targets[1].takes.as_slice()),
            (&["10s".to_owned()][..], &["1m:40d".to_owned()][..])
        );
        assert!(!targets[0].resolution_label() && !targets[1].resolution_label(), "one resolution per store");
        assert!(config.warnings().is_empty());

        for bad in [
            "listen_address = \"x\"",
            "[queue]\nmax_bytes = 1",
            "[sink]\nkind = \"file\"\nurl = \"x\"",
            "[sink]\nkind = \"kafka\"",
        ] {
            assert!(toml::from_str::<Config>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_documented_example_parses_and_is_valid() {
        let docs: String = include_str!("config.rs")
            .lines()
            .map_while(|line| line.strip_prefix("//!"))
            .map(|line| format!("{}\n", line.strip_prefix(' ').unwrap_or(line)))
            .collect();
        let example = docs.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).expect("a toml block");
        // Every key is known (unknown ones are refused); the files it names need not exist
        // here, so the Graphite target alone is validated.
        let config: Config = toml::from_str(example).unwrap_or_else(|error| panic!("{error}\n{example}"));
        let graphite =
            config.targets().into_iter().find(|target| target.name == "10s:7d").expect("the Graphite target");
        validate_sink("graphite", &graphite.sink).unwrap();
        let SinkConfig::Graphite(graphite) = graphite.sink else { panic!("kind = \"graphite\"") };
        assert_eq!(graphite.naming(), Naming::default(), "the example spells out the defaults");
        assert_eq!(graphite.settings().resend_window, Duration::from_secs(60));
        let influx = config.targets().into_iter().find(|target| target.name == "1m:1y").expect("the InfluxDB target");
        validate_sink("influxdb", &influx.sink).unwrap();
        let SinkConfig::Influxdb(influx) = influx.sink else { panic!("kind = \"influxdb\"") };
        assert_eq!(influx.naming(), InfluxNaming::default(), "the example spells out the defaults");
        assert_eq!(influx.settings(1).unwrap().url, "http://127.0.0.1:8086/write?db=telegraf&precision=ms");
    }

    #[test]
    fn validation_names_the_key() {
        let cases = [
            ("[pool]\nworkers = 0", "pool.workers"),
            ("[sink]\nkind = \"remote_write\"\nurl = \"ftp://x/\"", "sink.url"),
            ("[sink]\nkind = \"remote_write\"\nurl = \"http://x/\"\n[sink.tls]\nca_file = \"/etc/hosts\"", "sink.tls"),
            (
                "[sink]\nkind = \"remote_write\"\nurl = \"https://x/\"\n[sink.tls]\nca_file = \"/nonexistent.pem\"",
                "sink.tls",
            ),
            (
                "[sink]\nkind = \"remote_write\"\nurl = \"http://x/\"\n[sink.basic_auth]\nusername = \"u\"",
                "sink.basic_auth",
            ),
            (
                "[sink]\nkind = \"remote_write\"\nurl = \"http://x/\"\n[sink.basic_auth]\nusername = \"u\"\npassword_env = \"TESSERA_NO_SUCH_VARIABLE\"",
                "sink.basic_auth",
            ),
            (
                "[sink]\nkind = \"remote_write\"\nurl = \"http://x/\"\nbearer_token_file = \"/nonexistent\"",
                "sink.bearer_token_file",
            ),
            (
                "[sink]\nkind = \"remote_write\"\nurl = \"http://x/\"\nheaders = { \"bad header\" = \"x\" }",
                "sink.headers",
            ),
            ("[pacing]\nmin_in_flight = 4\nmax_in_flight = 2", "pacing.min_in_flight"),
            ("[mapping]\nquantiles = [1.5]", "mapping.quantiles"),
            ("[queue]\nmax_queue_bytes = 10", "queue.max_queue_bytes"),
            ("[queue]\ncheckpoint_interval_secs = 0", "queue.checkpoint_interval_secs"),
            ("[queue]\ncheckpoint_interval_secs = 3601", "queue.checkpoint_interval_secs"),
            ("[policy_sinks.\"1m:40d\"]\nkind = \"remote_write\"", "policy_sinks.\"1m:40d\".url"),
            ("[sink]\nkind = \"graphite\"\naddress = \"carbon\"", "sink.address"),
            ("[sink]\nkind = \"influxdb\"\nbucket = \"b\"", "sink.org"),
            ("[sink]\nkind = \"influxdb\"\nbucket = \"b\"\norg = \"o\"", "sink.token_file"),
            ("[sink]\nkind = \"influxdb\"\ntoken_file = \"/etc/hosts\"", "sink.token_file"),
            ("[sink]\nkind = \"influxdb\"\ndatabase = \"\"", "sink.database"),
            ("[sink]\nkind = \"influxdb\"\nurl = \"influx:8086\"", "sink.url"),
            ("[sink]\nkind = \"graphite\"\npercent_thresholds = [90, 0]", "sink.percent_thresholds"),
            ("[sink]\nkind = \"graphite\"\nwrite_timeout_ms = 0", "sink.connect_timeout_ms"),
        ];
        for (text, key) in cases {
            let config: Config = toml::from_str(text).unwrap();
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains(&format!("`{key}`")), "{text}: {err}");
        }
    }
}
