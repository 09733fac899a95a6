//! tessera-collector: the per-host statsd daemon.
//!
//! Applications send statsd / DogStatsD to `localhost:8125`. The collector
//! reads it with several threads, each folding lines into its own table
//! (`intake/`); every second the tables are cut and the window stage merges
//! the readers' cuts of each window (`window.rs`); the outbound side routes
//! each series by shard to the aggregators that own it, through one bounded
//! queue and one sender per aggregator (`outbound/`).
//!
//! ```text
//!  statsd ──▶ intake: udp/tcp/unix readers ──Cut──▶ window: flusher ──▶ outbound: route, encode,
//!             (one table per reader)        each 1 s  (merge, watermark)  queue + sender per aggregator
//! ```
//!
//! [`Collector::start`] is the one entry point: the binary, `tessera local`
//! and the tests all run it.
//!
//! ```no_run
//! # async fn example(placement: tessera_collector::PlacementHandle) -> Result<(), tessera_collector::StartError> {
//! use tessera_collector::{Collector, Config};
//! use tessera_runtime::{Shutdown, Telemetry};
//!
//! let shutdown = Shutdown::new();
//! let collector = Collector::start(Config::default(), placement, Telemetry::new("collector", "dev"), shutdown.clone()).await?;
//! println!("statsd on {:?}", collector.udp_addr());
//! shutdown.trigger();
//! collector.wait().await;
//! # Ok(()) }
//! ```

mod config;
mod intake;
mod metrics;
mod outbound;
mod rules;
mod window;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_rules::RulesHandle;
use tessera_runtime::daemon::spawn_thread;
use tessera_runtime::{Readiness, ServerHandle, Shutdown, Telemetry};

use intake::ReaderSettings;
use outbound::{Destinations, OutboundSettings, Router};
use window::{FlushSettings, Flusher};

pub use config::Config;
pub use intake::return_large_buffers_when_freed;
pub use metrics::{Metrics, PREFIX as METRIC_PREFIX};
pub use tessera_runtime::StartError;
pub use tessera_topology::{PlacementHandle, PlacementSource};

/// How many nice steps the flusher runs below the readers.
const FLUSHER_NICE: i32 = 10;

/// A running collector.
pub struct Collector {
    udp_addr: Option<SocketAddr>,
    tcp_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    telemetry_addr: Option<SocketAddr>,
    metrics: Metrics,
    supervisor: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// Validates `config`, binds every listener, starts the reader threads,
    /// the flusher and the telemetry endpoint, and returns once the
    /// collector is receiving. It runs until `shutdown` fires, then cuts
    /// the current window and delivers what is queued within the grace
    /// period; [`Collector::wait`] returns when that is done.
    pub async fn start(
        config: Config,
        placement: PlacementHandle,
        telemetry: Telemetry,
        shutdown: Shutdown,
    ) -> Result<Collector, StartError> {
        config.validate_settings()?;
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register_with_placement(registry, &placement));
        let readiness = Readiness::new();
        let listening = readiness.condition("listening");

        let instance_id = config.instance_id.clone().unwrap_or_else(|| tessera_runtime::daemon::hostname("collector"));
        let window_ms = config.aggregation.window_ms();
        let parse_options = config.parse.options();
        // Room for pieces of 64 M series on their way (a channel slot is a few dozen
        // bytes, allocated up front), and a few emptied pieces kept for the readers
        // (about 1 MB each; more are freed).
        let (cut_links, flusher_links) = intake::cut_links(4 * 1024, 4);
        let rule_set = config.rule_set(&metrics.rules)?;
        for note in rule_set.notes() {
            tracing::info!(note, "mapping file");
        }
        let rules = Arc::new(RulesHandle::new(rule_set));
        // Only a mapping file makes classic histograms and summaries of its own.
        let observers =
            config.mapping.file.is_some().then(|| rules.clone() as Arc<dyn tessera_core::table::ObserverSource>);
        // The memory budget: a guard thread reads the resident memory and the readers
        // refuse new series near the limit.
        let budget = tessera_runtime::memory::MemoryGuard::start(config.memory_limit, None, &metrics.memory)?;
        let origin = intake::origin::start(&config.origin, &metrics.origin).map_err(|error| {
            StartError::setup("cannot start origin detection ([origin])", std::io::Error::other(error))
        })?;
        let reader_settings = ReaderSettings {
            window_ms,
            max_series: config.aggregation.max_series,
            expire_after_idle_windows: config.aggregation.expire_after_idle_windows(),
            parse_options,
            timer_unit: config.aggregation.timer_unit.into(),
            budget,
            origins: origin.as_ref().map(|(origins, _)| Arc::clone(origins)),
        };
        // Everything that can fail on a bad file (the TLS files) before the readers start,
        // so that a failed start leaves no reader thread holding the ports.
        let outbound_settings = OutboundSettings {
            window_ms,
            max_frame_bytes: config.forward.max_frame_bytes,
            max_queue_bytes: config.forward.max_queue_bytes,
            series_dictionary: config.forward.series_dictionary,
            sender: config
                .forward
                .sender_settings(
                    instance_id.clone(),
                    tessera_proto::Role::Collector,
                    "aggregator",
                    None,
                    metrics.senders.tls_reload_errors(),
                )
                .map_err(|error| StartError::setup("cannot load the TLS files of [forward.tls]", error))?,
        };
        let listeners =
            intake::start(&config, &reader_settings, observers, cut_links, &metrics.intake, &metrics.drops, &shutdown)
                .await?;

        let stop_senders = Shutdown::new();
        let destinations =
            Destinations::new(outbound_settings.max_queue_bytes, metrics.senders.clone(), metrics.drops.clone());
        destinations.start_senders(&outbound_settings.sender, &stop_senders);
        let router = Router::new(outbound_settings, placement, destinations.clone(), metrics.drops.clone());
        let flush_settings = FlushSettings {
            window_ms,
            flush_delay_ms: config.aggregation.flush_delay_ms as i64,
            readers: listeners.readers.len(),
            rules: rules.clone(),
            rules_idle_ms: config.aggregation.rules_idle_ms(),
        };
        let flusher =
            Flusher::new(flusher_links, flush_settings, router, metrics.window.clone(), metrics.rules.clone());
        let flusher = spawn_thread("flusher", move || {
            // The readers go first when both want one core (see `lower_this_thread_priority`).
            if let Err(error) = intake::lower_this_thread_priority(FLUSHER_NICE) {
                tracing::warn!(%error, "cannot lower the flusher's priority");
            }
            flusher.run()
        })?;

        if let Some((_, resolver)) = origin {
            tokio::spawn(resolver.run(shutdown.clone()));
        }
        let source = rules::RuleSource { config: config.clone() };
        tokio::spawn(rules::reload_loop(rules, source, window_ms, metrics.rules.clone(), shutdown.clone()));

        if let Some(drops) = listeners.kernel_drops {
            tokio::spawn(intake::poll_kernel_drops(drops, metrics.intake.clone(), shutdown.clone()));
        }

        let server = match config.telemetry.listen {
            Some(address) => {
                telemetry.set_profiling(config.telemetry.profiling);
                telemetry.set_web_config(config.telemetry.web_config.as_deref())?;
                Some(tessera_runtime::serve(address, telemetry, readiness, shutdown.clone()).await?)
            }
            None => None,
        };
        let telemetry_addr = server.as_ref().map(ServerHandle::local_addr);
        listening.mark_ready();
        tracing::info!(instance_id, telemetry = ?telemetry_addr, "collector started");

        let grace = config.forward.shutdown_grace();
        let supervisor = tokio::spawn(supervise(
            shutdown,
            listeners.readers,
            flusher,
            destinations,
            stop_senders,
            grace,
            metrics.clone(),
            server,
        ));
        Ok(Collector {
            udp_addr: listeners.udp_addr,
            tcp_addr: listeners.tcp_addr,
            unix_path: listeners.unix_path,
            telemetry_addr,
            metrics,
            supervisor,
        })
    }

    /// The bound UDP address (useful with port 0).
    pub fn udp_addr(&self) -> Option<SocketAddr> {
        self.udp_addr
    }

    /// The bound TCP address.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The Unix socket path.
    pub fn unix_path(&self) -> Option<&PathBuf> {
        self.unix_path.as_ref()
    }

    /// The bound telemetry address.
    pub fn telemetry_addr(&self) -> Option<SocketAddr> {
        self.telemetry_addr
    }

    /// The collector's metric handles.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Waits until the collector has shut down and drained.
    pub async fn wait(self) {
        if let Err(error) = self.supervisor.await {
            tracing::error!(%error, "collector supervisor failed");
        }
    }
}

/// Waits for shutdown, then drains in order: readers cut their windows,
/// the flusher routes everything, senders deliver within the grace period.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    shutdown: Shutdown,
    readers: Vec<std::thread::JoinHandle<()>>,
    flusher: std::thread::JoinHandle<()>,
    destinations: Destinations,
    stop_senders: Shutdown,
    grace: Duration,
    metrics: Metrics,
    server: Option<ServerHandle>,
) {
    shutdown.wait().await;
    tracing::info!("shutting down: cutting the current window and delivering what is queued");
    let deadline = Instant::now() + grace;
    let joined = tokio::task::spawn_blocking(move || {
        for reader in readers {
            let _ = reader.join();
        }
        let _ = flusher.join();
    })
    .await;
    if joined.is_err() {
        tracing::error!("a reader or the flusher panicked");
    }
    while !destinations.all_idle() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_senders.trigger();
    let (_, abandoned) = destinations.abandon_all();
    if abandoned > 0 {
        tessera_runtime::telemetry::count_drops(&metrics.drops, "shutdown", "partials", abandoned);
        tracing::warn!(partials = abandoned, "shutdown grace elapsed with partials undelivered");
    }
    if let Some(server) = server {
        let _ = server.stopped().await;
    }
    tracing::info!("collector stopped");
}

/// Starts the placement source the configuration names (a static file, or
/// etcd watched live with a cache file for cold starts).
pub async fn start_placement(config: &Config) -> Result<PlacementHandle, tessera_topology::SourceError> {
    let source = config.placement.as_ref().expect("validate() requires a placement");
    source.start().await
}
