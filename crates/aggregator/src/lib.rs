//! tessera-aggregator: merges collectors' 1 s partials into epoch-aligned
//! tiles, one set per storage policy, and flushes each closed tile in one
//! burst to an ingester.
//!
//! An aggregator owns the shards the placement gives its `instance_id`.
//! Its `src/` reads in the order data flows:
//!
//! ```text
//! connection tasks ──frame bytes──▶ decoder ──SplitBatch──▶ admission ──shares──▶ merge threads ──parts──▶ flusher
//!        ▲                             │ not_owner,             │ too_late, too_early,                      │ frames,
//!        └──────────── ack ◀───────────┴ malformed ◀────────────┴ buffer_full, ok                           ▼ ingester queues
//! └─────────────── intake/ ───────────────┘                 └───────────── tile/ ─────────────┘            flush/ ─▶ outbound
//! ```
//!
//! - `intake/`: collectors connect to the wire listener and send partial
//!   batches; each is decoded and checked on a dedicated thread (frame,
//!   ownership, aggregates, connection dictionaries, split by merge
//!   thread).
//! - `tile/`: the admission thread admits each batch whole or refuses it
//!   whole and closes tiles once every connected collector's watermark has
//!   passed their end (`max_buffer_past` after it at the latest); the merge
//!   threads, each owning a share of the shards, merge partials into tiles
//!   (late and early data, gauge resolution, expiry); storage policies;
//!   the shards this instance owns.
//! - `flush/`: the flusher thread joins the merge threads' parts of each
//!   tile, splits it into tile batches and queues them. With replicas, one
//!   leader per shard set flushes and the others hold their copies until
//!   its flush marks pass them (etcd election on the liveness lease,
//!   fencing, takeover).
//! - `outbound`: one queue and sender task per ingester, with
//!   acknowledgements, retries, a bounded buffer, and re-routing when an
//!   ingester leaves the ingesters' placement.
//! - `config` reads the configuration file; each stage declares its own
//!   metrics (`<stage>/metrics.rs`) and `metrics` gathers them with the
//!   drops under the daemon's prefix; this file wires the threads together.
//!
//! Decoding, merging and cutting never run on a tokio worker. Each
//! connection waits for the answer to one batch before reading the next,
//! so what sits in the decoder's and admission's channels is bounded by
//! the number of connections times one frame, and the merge threads'
//! queues are bounded.
//!
//! [`Aggregator::start`] is the one entry point: the binary, `tessera
//! local` and the tests all run it.
//!
//! ```no_run
//! # async fn example() -> Result<(), tessera_aggregator::StartError> {
//! use tessera_aggregator::{Aggregator, Config};
//! use tessera_runtime::{Shutdown, Telemetry};
//!
//! let config: Config = tessera_runtime::config::load_toml(Some("aggregator.toml".as_ref())).expect("config");
//! let shutdown = Shutdown::new();
//! let aggregator = Aggregator::start(config, Telemetry::new("aggregator", "dev"), shutdown.clone()).await?;
//! println!("partials on {}", aggregator.listen_addr());
//! shutdown.trigger();
//! aggregator.wait().await;
//! # Ok(()) }
//! ```

mod config;
mod flush;
mod intake;
mod metrics;
mod outbound;
mod tile;

// The daemon (binary, `tessera local`, tests), then its hot paths (benchmarks, fuzz target,
// examples, doc examples).
pub use config::{Config, ConfigError};
pub use intake::{Decoded, Decoder, Partial, Via};
pub use metrics::{Metrics, PREFIX as METRIC_PREFIX};
pub use tessera_runtime::StartError;
pub use tile::{
    DEFAULT_POLICIES, StoragePolicy, TileMetrics, Tiler, TilerSettings, Trigger, Watermarks, WindowPartials,
};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tessera_core::clock::now_ms;
use tessera_runtime::{Readiness, ServerHandle, Shutdown, Telemetry};
use tessera_topology::{PlacementHandle, PlacementSource, Tier};
use tessera_wire::Heartbeat;

use flush::{FlushSettings, Leadership};
use outbound::Ingesters;

/// A running aggregator.
pub struct Aggregator {
    listen_addr: SocketAddr,
    telemetry_addr: Option<SocketAddr>,
    metrics: Metrics,
    placement: PlacementHandle,
    ingesters: Ingesters,
    leadership: Leadership,
    supervisor: tokio::task::JoinHandle<()>,
}

impl Aggregator {
    /// Validates `config`, loads the placement it names (a static file, or
    /// etcd watched live, registering this instance's liveness lease), and
    /// starts; see [`start_with_placement`](Self::start_with_placement).
    pub async fn start(config: Config, telemetry: Telemetry, shutdown: Shutdown) -> Result<Aggregator, StartError> {
        config.validate()?;
        let Some(source) = config.placement.clone() else {
            return Err(ConfigError::new("placement", "must be set").into());
        };
        let placement = source.start().await.map_err(|error| StartError::setup("cannot load the placement", error))?;
        let aggregator = Self::start_with_placement(config.clone(), placement, telemetry, shutdown.clone()).await?;
        if let PlacementSource::Etcd(etcd) = source {
            let settings = flush::ElectionSettings {
                etcd,
                instance_id: config.instance_id().to_owned(),
                ttl: config.liveness_ttl(),
                max_buffer_past_ms: config.max_buffer_past_ms() as i64,
            };
            tokio::spawn(flush::run_election(
                settings,
                aggregator.leadership.clone(),
                aggregator.placement.clone(),
                aggregator.ingesters.clone(),
                aggregator.metrics.flush.clone(),
                shutdown,
            ));
        } else if aggregator.placement.current().replication_factor() > 1 {
            tracing::warn!(
                "the placement replicates shard sets but is not in etcd: no leader can be elected, so every replica \
                 flushes (the ingester skips the second copy of a tile, and a whole copy replaces the one a \
                 replica restarted mid-tile marked incomplete, but every replica writes to the ingesters); use an \
                 etcd placement for replicas"
            );
        }
        Ok(aggregator)
    }

    /// Starts on a placement the caller provides (tests, `tessera local`);
    /// `config.placement` only says whether an election will run (an etcd
    /// placement: a replica of a replicated shard set then holds its tiles until
    /// elected). Binds the listener, starts the
    /// decoder, tiler and flusher threads, the ingester senders and the
    /// telemetry endpoint, and returns once partials are accepted.
    ///
    /// It runs until `shutdown` fires; then it stops reading, closes every
    /// open tile (flushing what it holds) and delivers buffered tiles for
    /// up to `ingester.shutdown_grace_secs`. [`wait`](Self::wait) returns
    /// when that is done.
    pub async fn start_with_placement(
        config: Config,
        placement: PlacementHandle,
        telemetry: Telemetry,
        shutdown: Shutdown,
    ) -> Result<Aggregator, StartError> {
        config.validate_settings()?;
        let instance_id = config.instance_id().to_owned();
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register_with_placement(registry, &placement));
        let readiness = Readiness::new();
        let listening = readiness.condition("listening");
        let placement_ready = readiness.condition("placement");

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::bind(config.listen, source))?;
        let listen_addr = listener.local_addr().map_err(|source| StartError::bind(config.listen, source))?;
        // The TLS files are read before any thread or task of the pipeline starts.
        let server_settings = config
            .listener_settings(instance_id.clone(), metrics.intake.listener.listener_tls_reload_errors.clone())
            .map_err(|error| StartError::setup("cannot load the TLS files of [tls]", error))?;

        let ingesters = match ingester_placement(&config).await? {
            Some(placement) => {
                Ingesters::placed(placement, config.ingester.max_queue_bytes, &metrics.outbound, &metrics.drops)
            }
            None => Ingesters::new(
                &config.ingester.endpoints,
                config.ingester.max_queue_bytes,
                &metrics.outbound,
                &metrics.drops,
            ),
        }
        .reserving(config.ingester.max_frame_bytes.min(config.ingester.max_queue_bytes / 2));
        let stop_senders = Shutdown::new();
        let heartbeat = Heartbeat { after: config.ingester.heartbeat(), frame: outbound::heartbeat_frame };
        let sender_settings = config
            .ingester
            .sender_settings(
                instance_id.clone(),
                tessera_proto::Role::Aggregator,
                "ingester",
                Some(heartbeat),
                metrics.outbound.senders.tls_reload_errors(),
            )
            .map_err(|error| StartError::setup("cannot load the TLS files of [ingester.tls]", error))?;
        ingesters.spawn_senders(&sender_settings, &stop_senders);

        // The memory budget: a guard thread reads the resident memory, and the merge
        // threads refuse new series near the limit.
        let budget = tessera_runtime::memory::MemoryGuard::start(
            config.memory_limit,
            Some(config.memory_bytes_per_series),
            &metrics.memory,
        )?;
        let merge_threads = config.merge_threads();
        let tiler_settings = config.tiler_settings(merge_threads);
        let started_ms = now_ms();
        let shadow = Tiler::new(tiler_settings.clone(), started_ms);
        let policy_metrics = config.policies.iter().map(|policy| metrics.flush.policy(&policy.to_string())).collect();
        for policy in &config.policies {
            // Exported at 0 from the start, as every reason of a count is.
            metrics.tile.late_for_policy(policy, 0);
        }
        let (frame_sender, frame_receiver) = crossbeam_channel::unbounded();
        let (batch_sender, batch_receiver) = crossbeam_channel::unbounded();
        let (part_sender, part_receiver) = crossbeam_channel::unbounded();
        let decoder = Decoder::new(instance_id.clone(), placement.clone(), merge_threads);
        let flush_settings =
            FlushSettings { source: instance_id.clone(), max_frame_bytes: config.ingester.max_frame_bytes };
        let leadership = Leadership::new(config.policies.clone(), started_ms);
        // A replica whose election will run (etcd placement, replicated shard set) holds
        // every tile until that election says it leads.
        let current = placement.current();
        if matches!(config.placement, Some(PlacementSource::Etcd(_)))
            && current.replication_factor() > 1
            && current.instance(&instance_id).is_some()
        {
            leadership.hold_until_elected();
        }
        if config.ingester.placement.is_some() {
            let reroute = outbound::Reroute {
                source: instance_id.clone(),
                max_frame_bytes: config.ingester.max_frame_bytes,
                on_rerouted: {
                    let leadership = leadership.clone();
                    std::sync::Arc::new(move |policy: &str, tile_end_ms, queue, last_sequence| {
                        leadership.rerouted(policy, tile_end_ms, queue, last_sequence)
                    })
                },
            };
            ingesters.rerouting(reroute);
            tokio::spawn(outbound::run_rerouter(ingesters.clone(), stop_senders.clone()));
        }
        // Shutdown joins the threads in this order: each one's exit closes the next one's input.
        let mut threads = vec![spawn_thread("decoder", {
            let (metrics, refusals) = (metrics.intake.clone(), metrics.tile.refusals.clone());
            move || intake::run_decoder(frame_receiver, decoder, batch_sender, metrics, refusals)
        })?];
        let mut merge_jobs = Vec::with_capacity(merge_threads);
        let mut merge_handles = Vec::with_capacity(merge_threads);
        for index in 0..merge_threads {
            let (jobs, job_receiver) = crossbeam_channel::bounded(tile::MERGE_QUEUE_JOBS);
            merge_jobs.push(jobs);
            let mut tiler = Tiler::new(tiler_settings.clone(), started_ms);
            if let Some(budget) = &budget {
                tiler = tiler.with_budget(budget.clone());
            }
            let (parts, metrics, drops) = (part_sender.clone(), metrics.tile.clone(), metrics.drops.clone());
            merge_handles.push(spawn_thread(&format!("merge-{index}"), move || {
                tile::run_merge_thread(tiler, job_receiver, parts, metrics, drops)
            })?);
        }
        drop(part_sender);
        threads.push(spawn_thread("admission", {
            let (ingesters, metrics) = (ingesters.clone(), metrics.tile.clone());
            let tier = tile::MergeTier::new(merge_jobs);
            let longest_tile_ms = config.policies.iter().map(|policy| policy.resolution_ms()).max().unwrap_or(0);
            let watermarks = Watermarks::new(config.buffer_past_ms as i64, config.max_buffer_past_ms() as i64)
                .remembering_departed_for(longest_tile_ms);
            move || tile::run_admission(shadow, tier, watermarks, batch_receiver, ingesters, metrics)
        })?);
        threads.extend(merge_handles);
        threads.push(spawn_thread("flusher", {
            let flusher = flush::Flusher {
                ingesters: ingesters.clone(),
                settings: flush_settings,
                metrics: metrics.flush.clone(),
                drops: metrics.drops.clone(),
                policies: policy_metrics,
                leadership: leadership.clone(),
            };
            let gatherer = flush::Gatherer::new(merge_threads);
            move || flush::run_flusher(part_receiver, gatherer, flusher)
        })?);

        tokio::spawn(tile::watch_ownership(
            placement.clone(),
            instance_id.clone(),
            config.policies.clone(),
            metrics.tile.clone(),
            placement_ready,
            shutdown.clone(),
        ));
        tokio::spawn(intake::accept_loop(
            listener,
            frame_sender,
            server_settings,
            metrics.intake.listener.clone(),
            shutdown.clone(),
        ));

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
        let policies: Vec<String> = config.policies.iter().map(ToString::to_string).collect();
        tracing::info!(
            instance_id,
            listen = %listen_addr,
            telemetry = ?telemetry_addr,
            ?policies,
            merge_threads,
            "aggregator started"
        );

        let drain = Drain {
            threads,
            ingesters: ingesters.clone(),
            stop_senders,
            grace: config.ingester.shutdown_grace(),
            metrics: metrics.clone(),
            server,
        };
        let supervisor = tokio::spawn(drain.after(shutdown));
        Ok(Aggregator { listen_addr, telemetry_addr, metrics, placement, ingesters, leadership, supervisor })
    }

    /// The bound wire listener address (useful with port 0).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The bound telemetry address.
    pub fn telemetry_addr(&self) -> Option<SocketAddr> {
        self.telemetry_addr
    }

    /// The aggregator's metric handles.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The placement in use.
    pub fn placement(&self) -> &PlacementHandle {
        &self.placement
    }

    /// Waits until the aggregator has shut down and drained.
    pub async fn wait(self) {
        if let Err(error) = self.supervisor.await {
            tracing::error!(%error, "aggregator supervisor failed");
        }
    }
}

/// What shutdown waits for, in order.
struct Drain {
    threads: Vec<std::thread::JoinHandle<()>>,
    ingesters: Ingesters,
    stop_senders: Shutdown,
    grace: Duration,
    metrics: Metrics,
    server: Option<ServerHandle>,
}

impl Drain {
    /// Waits for `shutdown`, then: connections stop reading, the decoder,
    /// tiler (closing every open tile) and flusher finish in turn, and the
    /// senders deliver what is buffered within the grace period.
    async fn after(self, shutdown: Shutdown) {
        shutdown.wait().await;
        tracing::info!("shutting down: closing every open tile and delivering buffered tiles");
        let deadline = Instant::now() + self.grace;
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || threads.into_iter().all(|thread| thread.join().is_ok())).await;
        if !matches!(joined, Ok(true)) {
            tracing::error!("a pipeline thread panicked");
        }
        while !self.ingesters.all_idle() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop_senders.trigger();
        let (batches, series) = self.ingesters.abandon_all();
        if batches > 0 {
            tessera_runtime::telemetry::count_drops(&self.metrics.drops, "shutdown", "batches", batches);
            tessera_runtime::telemetry::count_drops(&self.metrics.drops, "shutdown", "series", series);
            tracing::warn!(batches, series, "shutdown grace elapsed with tile batches undelivered");
        }
        if let Some(server) = self.server {
            let _ = server.stopped().await;
        }
        tracing::info!("aggregator stopped");
    }
}

/// The ingesters' placement, when `[ingester.placement]` names one (etcd: the
/// ingesters' key, `/tessera/<env>/ingesters/placement`).
async fn ingester_placement(config: &Config) -> Result<Option<PlacementHandle>, StartError> {
    let source = match &config.ingester.placement {
        None => return Ok(None),
        Some(PlacementSource::Etcd(etcd)) => PlacementSource::Etcd(etcd.clone().for_tier(Tier::Ingesters)),
        Some(other) => other.clone(),
    };
    let placement =
        source.start().await.map_err(|error| StartError::setup("cannot load the ingesters' placement", error))?;
    let current = placement.current();
    if current.replication_factor() != 1 {
        tracing::warn!(
            replication_factor = current.replication_factor(),
            "the ingesters' placement replicates shards; each series goes to its first owner only"
        );
    }
    tracing::info!(
        version = current.version(),
        ingesters = current.instances().len(),
        shards = current.num_shards(),
        "routing tiles by the ingesters' placement"
    );
    Ok(Some(placement))
}

/// Spawns a pipeline thread named `agg-<stage>` (`agg-decoder`, `agg-merge-0`, ...): Linux
/// keeps 15 bytes of a thread's name, and CPU profiles group samples by it.
fn spawn_thread(name: &str, body: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>, StartError> {
    Ok(tessera_runtime::daemon::spawn_thread(format!("agg-{name}"), body)?)
}
