//! The collector's configuration file (TOML).
//!
//! Every key is optional; the defaults run a collector on
//! `127.0.0.1:8125`. Unknown keys are rejected. See `deploy/config/collector.toml`
//! for a commented example of every key.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use tessera_core::aggregate::{GaugeDeltas, TimerUnit};
use tessera_core::parse::ParseOptions;
use tessera_rules::{MappingConfig, RulesConfig};
use tessera_rules::{RuleMetrics, RuleSet, RulesError};
use tessera_runtime::memory::MemoryLimit;
use tessera_topology::PlacementSource;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Name of this collector in batches and logs; defaults to the host name.
    pub instance_id: Option<String>,
    /// UDP listener.
    pub udp: UdpConfig,
    /// TCP listener.
    pub tcp: TcpConfig,
    /// Unix datagram socket listener.
    pub unix: UnixConfig,
    /// Parser settings: the line length limit, the name tag styles.
    pub parse: ParseConfig,
    /// Pre-aggregation.
    pub aggregation: AggregationConfig,
    /// Where the placement comes from: `kind = "static"` with `path`, or
    /// `kind = "etcd"` with `endpoints`, `env` and `cache_path`.
    pub placement: Option<PlacementSource>,
    /// Forwarding to aggregators.
    pub forward: ForwardConfig,
    /// The `/metrics`, `/healthz`, `/readyz` endpoint.
    pub telemetry: TelemetryConfig,
    /// A statsd_exporter mapping file: dotted name parts become labels.
    pub mapping: MappingConfig,
    /// Allow/deny, tag rules, rollups, global tags, a name prefix and cardinality limits,
    /// applied before sharding (see `tessera_rules::RulesConfig`).
    pub rules: RulesConfig,
    /// The memory budget: bytes (`536870912`, `"512MiB"`) or a share of the cgroup's
    /// limit (`"80%"`). From 75 % of it (until under 65 %) lines of new series are refused
    /// and counted (`drops_total{reason="memory_limit"}`); known series go on. Without it, 80 % of the
    /// cgroup's limit when it has one; `"none"`: no budget.
    pub memory_limit: Option<MemoryLimit>,
    /// Origin detection: the container and pod behind each metric, as tags added before
    /// sharding (see `intake/origin.rs`). Off by default.
    pub origin: OriginConfig,
    /// The file this configuration was read from, set by the binary (not a key): the
    /// rules reload when it changes. `None` on the embedded defaults or in a library.
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
}

/// How datagrams are spread over the UDP reader sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Distribution {
    /// Each datagram goes to a random reader (a reuseport BPF program), so
    /// one busy sender uses every reader thread.
    #[default]
    Random,
    /// The kernel's default: each sender's flow hashes to one reader.
    Flow,
}

/// How signed gauge values are read on a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GaugeDeltasConfig {
    /// `+N`/`-N` change the gauge (the statsd spec).
    #[default]
    Statsd,
    /// `-N` sets the gauge to -N.
    Absolute,
}

impl From<GaugeDeltasConfig> for GaugeDeltas {
    fn from(config: GaugeDeltasConfig) -> Self {
        match config {
            GaugeDeltasConfig::Statsd => GaugeDeltas::Statsd,
            GaugeDeltasConfig::Absolute => GaugeDeltas::Absolute,
        }
    }
}

/// `[udp]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UdpConfig {
    /// Whether to listen on UDP at all.
    pub enabled: bool,
    /// Address to bind; use `0.0.0.0:8125` in a container.
    pub listen: SocketAddr,
    /// Reader threads, each with its own socket; default one per core.
    pub reader_threads: Option<usize>,
    /// Receive buffer to ask the kernel for, per socket. The kernel caps it
    /// at `net.core.rmem_max`; the granted size is logged and exported.
    pub recv_buffer_bytes: usize,
    /// Largest datagram read whole; longer ones keep their complete lines
    /// and count as truncated.
    pub max_datagram_bytes: usize,
    /// Datagrams taken per `recvmmsg` call.
    pub batch_datagrams: usize,
    /// How datagrams are spread over reader sockets.
    pub distribute: Distribution,
    /// Reading of signed gauge values.
    pub gauge_deltas: GaugeDeltasConfig,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            enabled: true,
            listen: "127.0.0.1:8125".parse().expect("valid address"),
            reader_threads: None,
            recv_buffer_bytes: 32 << 20,
            max_datagram_bytes: 65_535,
            batch_datagrams: 64,
            distribute: Distribution::Random,
            gauge_deltas: GaugeDeltasConfig::Statsd,
        }
    }
}

/// `[tcp]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConfig {
    /// Address to bind; off when absent.
    pub listen: Option<SocketAddr>,
    /// Most concurrent connections.
    pub max_connections: usize,
    /// Reading of signed gauge values.
    pub gauge_deltas: GaugeDeltasConfig,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { listen: None, max_connections: 1024, gauge_deltas: GaugeDeltasConfig::Statsd }
    }
}

/// `[unix]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnixConfig {
    /// Path of the Unix datagram socket; off when absent.
    pub path: Option<PathBuf>,
    /// Permissions of the socket file once bound (`0o666`: senders running as any user may
    /// send, which needs write permission on the file); absent, the process' umask decides.
    pub mode: Option<u32>,
    /// Reading of signed gauge values.
    pub gauge_deltas: GaugeDeltasConfig,
}

/// `[parse]`: how statsd lines are read.
///
/// Tags may be written in the metric name, as Prometheus' statsd_exporter
/// reads them (each style on by default there too): `key=value` in the
/// name is the tag `key:value`, so `api.hits,env=prod:1|c` and
/// `api.hits:1|c|#env:prod` are one series. A malformed name tag is skipped
/// and counted (`tessera_collector_name_tag_errors_total`); a line with
/// both name tags and a DogStatsD `|#` tag field is rejected
/// (`parse_errors_total{reason="mixed_tag_styles"}`). A style switched off
/// leaves its bytes in the name. See
/// `tessera_core::parse::name_tags` for the exact rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParseConfig {
    /// Longest line accepted, in bytes.
    pub max_line_bytes: usize,
    /// InfluxDB / Telegraf tags in the name: `api.hits,env=prod:1|c`
    /// (statsd_exporter's `--statsd.parse-influxdb-tags`).
    pub influxdb_tags: bool,
    /// Librato tags in the name: `api.hits#env=prod:1|c`
    /// (`--statsd.parse-librato-tags`).
    pub librato_tags: bool,
    /// SignalFx tags in the name, cut out of it: `api.[env=prod]hits:1|c`
    /// (`--statsd.parse-signalfx-tags`).
    pub signalfx_tags: bool,
}

impl Default for ParseConfig {
    fn default() -> Self {
        let options = ParseOptions::default();
        ParseConfig {
            max_line_bytes: options.max_line_bytes,
            influxdb_tags: options.influxdb_tags,
            librato_tags: options.librato_tags,
            signalfx_tags: options.signalfx_tags,
        }
    }
}

impl ParseConfig {
    /// The parser settings these keys ask for.
    pub fn options(&self) -> ParseOptions {
        ParseOptions {
            max_line_bytes: self.max_line_bytes,
            influxdb_tags: self.influxdb_tags,
            librato_tags: self.librato_tags,
            signalfx_tags: self.signalfx_tags,
        }
    }
}

/// `[aggregation]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregationConfig {
    /// Length of a pre-aggregation window.
    pub interval_ms: u64,
    /// How long after a window ends its partials are cut and sent, so that
    /// every reader has handed in its share.
    pub flush_delay_ms: u64,
    /// Most series per reader table; lines of new series beyond it are
    /// dropped and counted (`reason="series_limit"`). No cap when absent.
    pub max_series: Option<usize>,
    /// Series idle this long are forgotten.
    pub expire_after_idle_secs: u64,
    /// The unit `|ms` timer values are kept and written in: `seconds` (each value divided
    /// by 1000, as statsd_exporter does and Prometheus names durations) or `milliseconds`
    /// (as sent). `|h` and `|d` values have no unit and are kept as sent.
    pub timer_unit: TimerUnitConfig,
}

/// The unit of `|ms` values (`[aggregation] timer_unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimerUnitConfig {
    /// Divided by 1000.
    #[default]
    Seconds,
    /// As sent.
    Milliseconds,
}

impl From<TimerUnitConfig> for TimerUnit {
    fn from(config: TimerUnitConfig) -> Self {
        match config {
            TimerUnitConfig::Seconds => TimerUnit::Seconds,
            TimerUnitConfig::Milliseconds => TimerUnit::Milliseconds,
        }
    }
}

impl Default for AggregationConfig {
    fn default() -> Self {
        AggregationConfig {
            interval_ms: 1000,
            flush_delay_ms: 150,
            max_series: Some(4_000_000),
            expire_after_idle_secs: 300,
            timer_unit: TimerUnitConfig::Seconds,
        }
    }
}

impl AggregationConfig {
    /// The window length, ms.
    pub fn window_ms(&self) -> i64 {
        self.interval_ms as i64
    }

    /// Windows a series may stay idle before a reader's table forgets it (at least one).
    pub fn expire_after_idle_windows(&self) -> u32 {
        (self.expire_after_idle_secs * 1000 / self.interval_ms.max(1)).max(1) as u32
    }

    /// How long the rules keep a series' outcome after its last window, ms: one window
    /// longer than the readers keep the series.
    pub fn rules_idle_ms(&self) -> i64 {
        i64::from(self.expire_after_idle_windows() + 1) * self.window_ms()
    }
}

tessera_wire::sender_config! {
    /// `[forward]`
    pub struct ForwardConfig {
        /// Name each series in full once per connection, then by a small
        /// integer (the series dictionary). Off by default: naming a series
        /// costs the collector a lookup in a per-destination table that, at a
        /// million series, costs more than it saves the aggregator (see
        /// BENCHMARKS.md, *Series dictionary*).
        pub series_dictionary: bool = false,
    }
    defaults { max_queue_bytes: 256 << 20, max_frame_bytes: 16 << 20, ack_timeout_ms: 10_000, shutdown_grace_secs: 5 }
}

/// `[telemetry]`: `listen`, by default `127.0.0.1:9102`; `profiling` (default `true`; `false` answers 403 at
/// `/debug/pprof/profile`); `web_config`, a Prometheus web config file: `tls_server_config` (HTTPS only) and
/// `basic_auth_users`, which every path but the probes requires.
pub type TelemetryConfig = tessera_runtime::config::TelemetryConfig<9102>;

/// A configuration that cannot work.
pub type ConfigError = tessera_runtime::config::InvalidSetting;

impl Config {
    /// Checks values that parse but cannot work.
    /// Checks every value but the placement source (which callers that
    /// bring their own placement, like `tessera local`, do not set).
    pub fn validate_settings(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| Err(ConfigError::new(key, reason));
        if self.aggregation.interval_ms == 0 {
            return invalid("aggregation.interval_ms", "must be at least 1");
        }
        if let Some(limit) = self.memory_limit {
            limit.resolve().map_err(|reason| ConfigError::new("memory_limit", reason))?;
        }
        if self.aggregation.flush_delay_ms >= self.aggregation.interval_ms * 10 {
            return invalid("aggregation.flush_delay_ms", "must be shorter than ten intervals");
        }
        if !(512..=(1 << 20)).contains(&self.udp.max_datagram_bytes) {
            return invalid("udp.max_datagram_bytes", "must be between 512 and 1048576");
        }
        if self.udp.batch_datagrams == 0 || self.udp.batch_datagrams > 1024 {
            return invalid("udp.batch_datagrams", "must be between 1 and 1024");
        }
        if self.udp.reader_threads == Some(0) {
            return invalid("udp.reader_threads", "must be at least 1 (leave it out for one per core)");
        }
        if self.parse.max_line_bytes == 0 {
            return invalid("parse.max_line_bytes", "must be at least 1");
        }
        self.forward.validate_sender("forward")?;
        if !self.udp.enabled && self.tcp.listen.is_none() && self.unix.path.is_none() {
            return invalid("udp.enabled", "no listener is enabled (udp, tcp.listen or unix.path)");
        }
        self.rule_set(&RuleMetrics::default())?;
        self.origin.validate()?;
        if self.unix.mode.is_some_and(|mode| mode > 0o777) {
            return invalid("unix.mode", "must be permission bits, at most 0o777");
        }
        Ok(())
    }

    /// Loads the mapping file and compiles `[rules]`, with counters in `metrics`.
    pub fn rule_set(&self, metrics: &RuleMetrics) -> Result<RuleSet, ConfigError> {
        RuleSet::load(&self.mapping, &self.rules, metrics).map_err(|error| match error {
            RulesError::Mapping { .. } => ConfigError::new("mapping.file", error.to_string()),
            RulesError::Glob { key, source } => ConfigError::new(key, source.to_string()),
            RulesError::Invalid { key, reason } => ConfigError::new(key, reason),
        })
    }

    /// [`Config::validate_settings`], and a usable `[placement]` source: what
    /// the binary needs, since it starts the placement from the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_settings()?;
        let invalid = |reason: String| Err(ConfigError::new("placement", reason));
        match &self.placement {
            None => invalid("missing: set kind = \"static\" with path, or kind = \"etcd\"".to_owned()),
            Some(PlacementSource::Etcd(etcd)) => etcd.validate().or_else(|error| invalid(error.to_string())),
            Some(PlacementSource::Static { .. }) => Ok(()),
        }
    }

    /// Reader threads for UDP.
    pub fn udp_reader_threads(&self) -> usize {
        self.udp.reader_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
    }
}

/// Which origin tags are added (Datadog's tag cardinality tiers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cardinality {
    /// Namespace, owner (deployment, statefulset, …), container name in the pod, image,
    /// allow-listed labels.
    #[default]
    Low,
    /// And the pod's name (the Docker container's name off Kubernetes).
    Orchestrator,
    /// And the container id.
    High,
}

/// `[origin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    /// Tags each metric with the container and pod that sent it: over the Unix socket from
    /// the sender's credentials, on every listener from a line's DogStatsD `|c:` container
    /// id or `|e:` external data.
    pub enabled: bool,
    /// `low`, `orchestrator` or `high`.
    pub cardinality: Cardinality,
    /// How long a reader keeps what it learnt of a sender or a container before it looks
    /// again, seconds.
    pub tags_ttl_secs: u64,
    /// How often the sources are listed whole, seconds; a metric of an unknown container
    /// lists them at once (at most once a second).
    pub refresh_secs: u64,
    /// How long one listing of a source may take, milliseconds.
    pub lookup_timeout_ms: u64,
    /// Where `<pid>/cgroup` files are read (`/proc`; the host's, so the collector runs with
    /// the host's PID namespace, `hostPID: true` on Kubernetes).
    pub proc_root: PathBuf,
    /// Where cgroup trees are (for `|c:in-<inode>`).
    pub cgroup_root: PathBuf,
    /// The Docker Engine API as a source of tags.
    pub docker: Option<DockerConfig>,
    /// The kubelet's pod list as a source of tags.
    pub kubelet: Option<KubeletConfig>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            enabled: false,
            cardinality: Cardinality::Low,
            tags_ttl_secs: 60,
            refresh_secs: 10,
            lookup_timeout_ms: 2000,
            proc_root: "/proc".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
            docker: None,
            kubelet: None,
        }
    }
}

/// `[origin.docker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// The Docker Engine API's socket.
    pub socket: PathBuf,
    /// Container labels copied as tags.
    pub labels: Vec<String>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig { socket: "/var/run/docker.sock".into(), labels: Vec::new() }
    }
}

/// `[origin.kubelet]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// The pod list: `https://<node IP>:10250/pods` (`${env:NODE_IP}` from the downward API).
    pub url: String,
    /// The bearer token's file (the pod's service account token); read at each listing.
    pub token_file: Option<PathBuf>,
    /// A CA bundle that signs the kubelet's certificate, beside the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Check the kubelet's certificate. Most kubelets serve a self-signed one: off, any
    /// certificate is taken (the token still goes only to `url`).
    pub tls_verify: bool,
    /// Pod labels copied as tags.
    pub labels: Vec<String>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        KubeletConfig {
            url: "https://127.0.0.1:10250/pods".into(),
            token_file: Some("/var/run/secrets/kubernetes.io/serviceaccount/token".into()),
            ca_file: None,
            tls_verify: true,
            labels: Vec::new(),
        }
    }
}

impl OriginConfig {
    /// Checks what can be checked before the start.
    pub fn validate(&self) -> Result<(), tessera_runtime::config::InvalidSetting> {
        if !self.enabled {
            return Ok(());
        }
        if self.tags_ttl_secs == 0 {
            return Err(tessera_runtime::config::InvalidSetting::new("origin.tags_ttl_secs", "must be at least 1"));
        }
        if self.refresh_secs == 0 {
            return Err(tessera_runtime::config::InvalidSetting::new("origin.refresh_secs", "must be at least 1"));
        }
        if self.lookup_timeout_ms == 0 {
            return Err(tessera_runtime::config::InvalidSetting::new("origin.lookup_timeout_ms", "must be at least 1"));
        }
        if let Some(kubelet) = &self.kubelet {
            let url: hyper::Uri = kubelet.url.parse().map_err(|error| {
                tessera_runtime::config::InvalidSetting::new("origin.kubelet.url", format!("not a URL: {error}"))
            })?;
            if !matches!(url.scheme_str(), Some("http" | "https")) || url.host().is_none() {
                return Err(tessera_runtime::config::InvalidSetting::new(
                    "origin.kubelet.url",
                    "must be an http:// or https:// URL",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_only_a_placement() {
        let config: Config = toml::from_str("[placement]\nkind = \"static\"\npath = \"p.toml\"\n").unwrap();
        config.validate().unwrap();
        assert_eq!(config.udp.listen.to_string(), "127.0.0.1:8125");
        let err = Config::default().validate().unwrap_err();
        assert!(err.to_string().starts_with("invalid `placement`: missing"), "{err}");
    }

    #[test]
    fn windows_and_idle_times_come_from_the_aggregation_keys() {
        let aggregation: AggregationConfig = toml::from_str("interval_ms = 500\nexpire_after_idle_secs = 3\n").unwrap();
        assert_eq!(aggregation.window_ms(), 500);
        assert_eq!(aggregation.expire_after_idle_windows(), 6);
        assert_eq!(aggregation.rules_idle_ms(), 3_500, "one window longer than the readers keep a series");
        let brief: AggregationConfig = toml::from_str("interval_ms = 10000\nexpire_after_idle_secs = 1\n").unwrap();
        assert_eq!(brief.expire_after_idle_windows(), 1, "at least one window");
    }

    #[test]
    fn name_tag_styles_are_on_by_default_and_each_can_be_switched_off() {
        assert_eq!(Config::default().parse.options(), ParseOptions::default());
        let parse: ParseConfig = toml::from_str("influxdb_tags = false\nsignalfx_tags = false\n").unwrap();
        let options = parse.options();
        assert!(!options.influxdb_tags && options.librato_tags && !options.signalfx_tags, "{options:?}");
        assert_eq!(options.max_line_bytes, tessera_core::parse::DEFAULT_MAX_LINE_BYTES);
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = toml::from_str::<Config>("[udp]\nlisten_address = \"0.0.0.0:8125\"\n").unwrap_err();
        assert!(err.to_string().contains("listen_address"), "{err}");
    }

    #[test]
    fn bad_values_are_rejected() {
        let text = "[placement]\nkind = \"static\"\npath = \"p\"\n[aggregation]\ninterval_ms = 0\n";
        let err = toml::from_str::<Config>(text).unwrap().validate().unwrap_err();
        assert!(err.to_string().contains("aggregation.interval_ms"), "{err}");
        let text = "[placement]\nkind = \"static\"\npath = \"p\"\n[udp]\ndistribute = \"roundrobin\"\n";
        assert!(toml::from_str::<Config>(text).is_err());
    }
}
