//! tessera-collector: the per-host statsd daemon.
//!
//! Applications send statsd / DogStatsD to `localhost:8125`. The collector
//! reads it with several threads ([`intake`]), each folding lines into its
//! own table ([`intake::reader`]); every second the tables are cut, merged and
//! routed by shard to the aggregators that own each shard ([`window`]),
//! through one bounded queue and one sender per aggregator ([`outbound`]).
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

pub mod config;
pub mod intake;
pub mod metrics;
pub mod outbound;
pub mod window;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use tessera_core::parse::ParseOptions;
use tessera_runtime::{Readiness, ServerHandle, Shutdown, Telemetry};

pub use config::Config;
use intake::reader::{Reader, ReaderSettings};
use metrics::Metrics;
use tessera_runtime::daemon::spawn_thread;
pub use tessera_topology::{PlacementHandle, PlacementSource};
use window::{Destinations, FlushSettings, Flusher};

pub use tessera_runtime::StartError;

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
        telemetry.with_registry(|registry| metrics.register(registry, metrics::PREFIX));
        telemetry.register_collector(Box::new(tessera_topology::WatchStatsCollector::new(
            "tessera_collector",
            placement.clone(),
        )));
        let readiness = Readiness::new();
        let listening = readiness.condition("listening");

        let instance_id = config.instance_id.clone().unwrap_or_else(|| tessera_runtime::daemon::hostname("collector"));
        let window_ms = config.aggregation.interval_ms as i64;
        let expire_windows =
            (config.aggregation.expire_after_idle_secs * 1000 / config.aggregation.interval_ms).max(1) as u32;
        let parse_options = ParseOptions { max_line_bytes: config.parse.max_line_bytes };
        let (cut_links, flusher_links) = intake::reader::cut_links(1024);
        let reader_settings = ReaderSettings {
            window_ms,
            max_series: config.aggregation.max_series,
            expire_after_idle_windows: expire_windows,
            parse_options,
        };
        let new_reader = |listener: &str, gauge_deltas: config::GaugeDeltasConfig| {
            Reader::new(
                &reader_settings,
                gauge_deltas.into(),
                cut_links.clone(),
                metrics.listener(listener),
                metrics.clone(),
            )
        };

        let mut readers = Vec::new();
        let mut udp_addr = None;
        let mut kernel_drops = None;
        if config.udp.enabled {
            let threads = config.udp_reader_threads();
            let what = format!("udp {}", config.udp.listen);
            let (sockets, stamped) =
                intake::udp::bind(&config.udp, threads).map_err(|source| StartError::bind(what, source))?;
            metrics.udp_receive_stamps.set(i64::from(stamped));
            udp_addr = sockets.first().and_then(|socket| socket.local_addr().ok());
            let granted = intake::udp::granted_recv_buffer(&sockets[0]);
            metrics.udp_recv_buffer_bytes.set(granted as i64);
            if granted < config.udp.recv_buffer_bytes {
                tracing::warn!(
                    granted,
                    wanted = config.udp.recv_buffer_bytes,
                    "the kernel granted a smaller UDP receive buffer than configured; raise net.core.rmem_max"
                );
            }
            kernel_drops = Some(intake::udp::KernelDrops::new(&sockets));
            for (index, socket) in sockets.into_iter().enumerate() {
                let reader = new_reader("udp", config.udp.gauge_deltas);
                let (batch, max_bytes, stop) =
                    (config.udp.batch_datagrams, config.udp.max_datagram_bytes, shutdown.clone());
                readers.push(spawn_thread(format!("udp-reader-{index}"), move || {
                    intake::udp::read_loop(socket, reader, batch, max_bytes, stop)
                })?);
            }
            tracing::info!(address = ?udp_addr, threads, recv_buffer_bytes = granted, "listening on udp");
        }
        let mut unix_path = None;
        if let Some(path) = &config.unix.path {
            let what = format!("unix {}", path.display());
            let socket = intake::unix::bind(path).map_err(|source| StartError::bind(what, source))?;
            let reader = new_reader("unix", config.unix.gauge_deltas);
            let (max_bytes, stop) = (config.udp.max_datagram_bytes, shutdown.clone());
            readers
                .push(spawn_thread("unix-reader", move || intake::unix::read_loop(socket, reader, max_bytes, stop))?);
            unix_path = Some(path.clone());
            tracing::info!(path = %path.display(), "listening on unix datagram socket");
        }
        let mut tcp_addr = None;
        if let Some(address) = config.tcp.listen {
            let what = format!("tcp {address}");
            let listener = intake::stream::bind(address).await.map_err(|source| StartError::bind(what, source))?;
            tcp_addr = listener.local_addr().ok();
            let (line_sender, line_receiver) = bounded(intake::stream::CHANNEL_CHUNKS);
            let reader = new_reader("tcp", config.tcp.gauge_deltas);
            let stop = shutdown.clone();
            readers.push(spawn_thread("tcp-lines", move || intake::stream::line_loop(line_receiver, reader, stop))?);
            let settings = intake::stream::StreamSettings {
                max_line_bytes: config.parse.max_line_bytes,
                max_connections: config.tcp.max_connections,
            };
            tokio::spawn(intake::stream::accept_loop(
                listener,
                line_sender,
                settings,
                metrics.listener("tcp"),
                shutdown.clone(),
            ));
            tracing::info!(address = ?tcp_addr, "listening on tcp");
        }
        drop(cut_links);

        let stop_senders = Shutdown::new();
        let destinations = Destinations::default();
        let settings = FlushSettings {
            window_ms,
            flush_delay_ms: config.aggregation.flush_delay_ms as i64,
            max_frame_bytes: config.forward.max_frame_bytes,
            max_queue_bytes: config.forward.max_queue_bytes,
            series_dictionary: config.forward.series_dictionary,
            sender: config.forward.sender_settings(
                instance_id.clone(),
                tessera_proto::Role::Collector,
                "aggregator",
                None,
            ),
            readers: readers.len(),
        };
        let flusher = Flusher::new(
            flusher_links,
            settings,
            placement,
            destinations.clone(),
            tokio::runtime::Handle::current(),
            stop_senders.clone(),
            metrics.clone(),
        );
        let flusher = spawn_thread("flusher", move || flusher.run())?;

        if let Some(mut drops) = kernel_drops {
            let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                while !shutdown.is_triggered() {
                    drops.poll(|socket, previous, total| metrics.record_kernel_drops(socket, previous, total));
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = shutdown.wait() => {}
                    }
                }
            });
        }

        let server = match config.telemetry.listen {
            Some(address) => Some(tessera_runtime::serve(address, telemetry, readiness, shutdown.clone()).await?),
            None => None,
        };
        let telemetry_addr = server.as_ref().map(ServerHandle::local_addr);
        listening.mark_ready();
        tracing::info!(instance_id, telemetry = ?telemetry_addr, "collector started");

        let grace = config.forward.shutdown_grace();
        let supervisor = tokio::spawn(supervise(
            shutdown,
            readers,
            flusher,
            destinations,
            stop_senders,
            grace,
            metrics.clone(),
            server,
        ));
        Ok(Collector { udp_addr, tcp_addr, unix_path, telemetry_addr, metrics, supervisor })
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
    let abandoned = destinations.abandon_all();
    if abandoned > 0 {
        metrics.drop_partials("shutdown", abandoned);
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
