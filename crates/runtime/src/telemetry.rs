//! The metrics registry, the readiness flag and the HTTP endpoint that serves them.
//!
//! [`Telemetry`] owns one `prometheus_client` [`Registry`]. It already holds:
//!
//! - `tessera_build_info{daemon,version} 1`;
//! - `tessera_<daemon>_up 1`;
//! - `process_start_time_seconds`, and on Linux `process_cpu_seconds_total` and
//!   `process_resident_memory_bytes`, read from `/proc/self` at each scrape.
//!
//! The registry takes no prefix: callers register full names per STYLE.md,
//! `tessera_<daemon>_<noun>_<unit>`, declared once per crate in its `metrics.rs`.
//! `prometheus_client` appends `_total` to counters and `_info` to info metrics itself, so
//! a counter exported as `tessera_collector_lines_received_total` is registered as
//! `tessera_collector_lines_received`; help texts take no trailing period (one is added).
//! The registry is locked only to register and to encode a scrape; metric handles are
//! `Arc`s: clone them into hot paths and update them lock-free.
//!
//! [`serve`] answers on one address:
//!
//! | path | answer |
//! |---|---|
//! | `GET /` | the live dashboard page ([`dashboard`]): charts of the last 15 minutes of this registry |
//! | `GET /dashboard/data?since=MS` | the dashboard's points after `since` (unix ms), JSON |
//! | `GET /metrics` | the registry in OpenMetrics text |
//! | `GET /healthz` | 200 `ok` while the process runs |
//! | `GET /readyz` | 200 once every [`Readiness`] condition is met, else 503 naming those that are not |
//! | `GET /debug/pprof/profile?seconds=N&frequency=HZ&format=pprof\|flamegraph` | a CPU profile of every thread ([`profile`]) |
//! | `GET /debug/pprof/heap` | 501: no heap profiler (see below) |
//! | anything else | 404 |
//!
//! CPU profiles are sampled in process by walking frame pointers; see [`profile`] for the
//! parameters and what it costs. Profiles taken, seconds sampled and requests refused are
//! counted: `tessera_<daemon>_profiles_total{format}`, `tessera_<daemon>_profile_seconds_total`,
//! `tessera_<daemon>_profile_requests_refused_total{reason}`.
//!
//! There is no heap profile: the daemons use the system allocator (glibc malloc), which
//! has no sampling heap profiler to read cheaply. jemalloc's would (`prof:true`), at the
//! price of building jemalloc from C in every build and swapping the allocator of the hot
//! paths; `/debug/pprof/heap` answers 501 saying so. The steady state of the hot paths
//! allocates nothing per line (a tested property), and memory per series is measured in
//! BENCHMARKS.md.
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//! use tessera_runtime::Telemetry;
//!
//! let telemetry = Telemetry::new("collector", "0.1.0");
//! let lines_received = Counter::<u64>::default();
//! telemetry.register("tessera_collector_lines_received", "Statsd lines received", lines_received.clone());
//! lines_received.inc_by(3);
//! let text = telemetry.encode().unwrap();
//! assert!(text.contains("tessera_collector_lines_received_total 3"));
//! assert!(text.contains(r#"tessera_build_info{daemon="collector",version="0.1.0"} 1"#));
//! ```

pub mod dashboard;
pub mod declare;
mod drops;
pub mod labels;
pub mod naming;
mod process;
pub mod profile;
mod readiness;
mod server;
pub mod web_config;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::collector::Collector;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Metric;

pub use declare::{lag_histogram, latency_histogram, storage_buckets, storage_histogram, zeroed_family};
pub use drops::{Drops, count_drops};
pub use prometheus_client::registry::Registry;
pub use readiness::{Readiness, ReadinessCondition};
pub use server::{ServeError, ServerHandle, serve};

/// The daemon's metrics registry; cheap to clone (one `Arc`). See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    daemon: String,
    registry: Mutex<Registry>,
    profiles: profile::ProfileMetrics,
    /// `/debug/pprof/profile` takes profiles (`[telemetry] profiling`).
    profiling: std::sync::atomic::AtomicBool,
    /// Basic auth on every path but the probes (`[telemetry] web_config`).
    basic_auth: Mutex<Option<web_config::BasicAuth>>,
    /// Requests refused for their credentials, by reason.
    auth_failures: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Changes of the web config file that did not load.
    web_config_reload_errors: Counter,
    /// TLS on the port (`tls_server_config` of the web config).
    tls: Mutex<Option<Arc<web_config::Tls>>>,
    /// TLS handshakes that failed, by reason.
    tls_failures: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl Telemetry {
    /// A registry for the daemon named `daemon` (`collector`, `aggregator`, `ingester`,
    /// `local`) at `version`, holding the build, up and process metrics. Characters of
    /// `daemon` other than ASCII letters and digits become `_` in the `up` metric's name.
    pub fn new(daemon: &str, version: &str) -> Self {
        let mut registry = Registry::default();
        let build_info = Info::new([("daemon", daemon.to_owned()), ("version", version.to_owned())]);
        // Exported as `tessera_build_info`: the encoder appends `_info`.
        registry.register("tessera_build", "The daemon and version of this tessera binary", build_info);

        let metric_name_part = metric_name_part(daemon);
        let up = Gauge::<i64>::default();
        up.set(1);
        registry.register(format!("tessera_{metric_name_part}_up"), "1 while the daemon runs", up);
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        let profiles = profile::ProfileMetrics::default();
        let prefix = format!("tessera_{metric_name_part}");
        registry.register(format!("{prefix}_profiles"), "CPU profiles taken, per format", profiles.taken.clone());
        registry.register(
            format!("{prefix}_profile_seconds"),
            "Seconds spent sampling CPU profiles",
            profiles.seconds.clone(),
        );
        registry.register(
            format!("{prefix}_profile_requests_refused"),
            "Profile requests refused, per reason (busy: one was running; bad_request; sampler: it failed; disabled: profiling = false)",
            profiles.refused.clone(),
        );

        let auth_failures = Family::default();
        registry.register(
            format!("{prefix}_telemetry_auth_failures"),
            "Telemetry requests refused for their credentials, per reason (missing, malformed, wrong)",
            auth_failures.clone(),
        );
        let web_config_reload_errors = Counter::default();
        registry.register(
            format!("{prefix}_telemetry_web_config_reload_errors"),
            "Changes of the telemetry web config file that did not load (the users it had stay)",
            web_config_reload_errors.clone(),
        );
        let tls_failures = Family::default();
        registry.register(
            format!("{prefix}_telemetry_tls_failures"),
            "TLS handshakes on the telemetry port that failed, per reason (no_certificate, unknown_ca, bad_certificate, timeout, tls)",
            tls_failures.clone(),
        );
        let profiling = std::sync::atomic::AtomicBool::new(true);
        let inner = Inner {
            daemon: daemon.to_owned(),
            registry: Mutex::new(registry),
            profiles,
            profiling,
            basic_auth: Mutex::new(None),
            auth_failures,
            web_config_reload_errors,
            tls: Mutex::new(None),
            tls_failures,
        };
        Self { inner: Arc::new(inner) }
    }

    /// Requires basic auth as a user of the web configuration file at `path` on every path
    /// but `/healthz` and `/readyz` ([`web_config`]); nothing when `path` is `None`.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or cannot work (named, with the reason).
    pub fn set_web_config(&self, path: Option<&std::path::Path>) -> Result<(), web_config::WebConfigError> {
        let Some(path) = path else { return Ok(()) };
        let auth = web_config::BasicAuth::load(
            path,
            self.inner.auth_failures.clone(),
            self.inner.web_config_reload_errors.clone(),
        )?;
        let tls = web_config::load_tls(path, self.inner.web_config_reload_errors.clone())?;
        *self.inner.basic_auth.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(auth);
        *self.inner.tls.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = tls.map(Arc::new);
        Ok(())
    }

    /// The TLS [`set_web_config`](Self::set_web_config) set, if any: the port then serves
    /// HTTPS only.
    pub fn tls(&self) -> Option<Arc<web_config::Tls>> {
        self.inner.tls.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Counts a failed TLS handshake on the telemetry port under `reason`.
    pub fn count_tls_failure(&self, reason: &'static str) {
        self.inner.tls_failures.get_or_create(&vec![("reason", reason)]).inc();
    }

    /// The basic auth [`set_web_config`](Self::set_web_config) set, if any.
    pub fn basic_auth(&self) -> Option<web_config::BasicAuth> {
        self.inner.basic_auth.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Whether `/debug/pprof/profile` takes CPU profiles (on by default); off, it answers
    /// 403 and counts the request refused with reason `disabled`.
    pub fn set_profiling(&self, on: bool) {
        self.inner.profiling.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// See [`set_profiling`](Self::set_profiling).
    pub fn profiling(&self) -> bool {
        self.inner.profiling.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The profile counters, for the `/debug/pprof/profile` handler.
    pub fn profile_metrics(&self) -> &profile::ProfileMetrics {
        &self.inner.profiles
    }

    /// The daemon name given to [`new`](Self::new).
    pub fn daemon(&self) -> &str {
        &self.inner.daemon
    }

    /// Registers `metric` under its full `name` (without `_total` for counters: the encoder
    /// adds it). Keep a clone of the handle to update it.
    pub fn register(&self, name: impl Into<String>, help: impl Into<String>, metric: impl Metric) {
        let name = name.into();
        debug_assert!(
            !(matches!(metric.metric_type(), MetricType::Counter) && name.ends_with("_total")),
            "register counter `{name}` without `_total`: prometheus_client appends it"
        );
        self.lock_registry().register(name, help, metric);
    }

    /// Registers a collector, asked for its metrics at each scrape.
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.lock_registry().register_collector(collector);
    }

    /// Runs `register` with the registry locked, for what [`register`](Self::register)
    /// does not cover (units, sub-registries). Do not scrape from inside it.
    pub fn with_registry<R>(&self, register: impl FnOnce(&mut Registry) -> R) -> R {
        register(&mut self.lock_registry())
    }

    /// Every registered metric in OpenMetrics text, ending in `# EOF`.
    ///
    /// # Errors
    ///
    /// When a metric or collector fails to encode itself.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut text, &self.lock_registry())?;
        Ok(text)
    }

    fn lock_registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while registering leaves the registry usable: each register is one push.
        self.inner.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `daemon` as it appears in metric names: characters other than ASCII letters and digits
/// become `_`.
fn metric_name_part(daemon: &str) -> String {
    daemon.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}
