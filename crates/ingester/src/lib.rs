//! tessera-ingester: takes the aggregators' bursts of tiles, makes them durable, and
//! drains them into storage at the pace storage sustains.
//!
//! ```text
//! aggregators ──TileBatch──▶ intake (one task per connection)
//!                              │ frames to the writer thread
//!                              ▼
//!                            writer thread: admit tiles as samples (admit),
//!                              │ append to the target's durable queue, then ack Ok
//!                              ▼             (Retryable `queue_full` when over the bound)
//!                            queue/<target>/  segment files, CRC per record, fsync policy
//!                              │
//!                              ▼
//!                            dispatcher thread: split records by series shard into requests
//!                              │ several bounded channels
//!                              ▼
//!                            workers (fixed, long-lived) ─ adaptive in-flight limit (AIMD)
//!                              │                           + optional samples/s ceiling
//!                              ▼
//!                            sink: Prometheus remote write, or OpenMetrics files
//! ```
//!
//! The modules are private; the stages, in the order a batch goes through them:
//!
//! - `intake`: the wire listener: each frame's body handed on, each answer written.
//! - `writer`: the writer thread that decodes, admits and queues each batch and decides
//!   its ack, and the thread that writes each target's checkpoint of the running totals.
//! - `admit`: a tile batch to the samples of one queue record (names, labels, cumulative
//!   counters and histograms), each tile admitted once, and the checkpoint format that
//!   carries the running totals across a restart.
//! - `queue`: the durable queue of checksummed records (`queue/record.rs`) and its replay.
//! - `pool`: the fixed worker pool and how it paces writes (`pool/pacing.rs`).
//! - `sink`: remote write (with its messages, `sink/prompb.rs`), OpenMetrics files.
//! - `tier`: this ingester's place among the ingesters: the shards it owns.
//! - `config`, `metrics`: every key, every `tessera_ingester_*` metric.
//!
//! What other crates (the `tessera` CLI, tests, benchmarks and examples) use is
//! re-exported below in one `pub use` block.
//!
//! Each storage target (the default sink, and each storage policy given its own sink in
//! `policy_sinks`) has its own queue, dispatcher, workers and pacing, so a slow or dead
//! target holds up only its own policies.
//!
//! **End-to-end latency.** When storage acknowledges a request, `now − tile end` is
//! recorded once per tile it carried in
//! `tessera_ingester_end_to_end_latency_seconds{resolution}` (see [`pool`] for tiles of
//! several samples); the time from receipt to the
//! first request goes in `tessera_ingester_queue_time_seconds`, and each request's
//! duration in `tessera_ingester_sink_request_duration_seconds`.
//!
//! **Shutdown.** When `shutdown` fires the listener stops, connections finish the batch
//! in hand, the writer fsyncs, writes each target's final checkpoint and exits, workers
//! finish the request they are sending (up to `shutdown_grace_secs`) and take no new one,
//! the file sink closes its journal into an `.om` file. Whatever was not written stays in
//! the queue and is sent after the next start.
//!
//! ```no_run
//! # async fn example() -> Result<(), tessera_ingester::StartError> {
//! use tessera_ingester::{Config, Ingester};
//! use tessera_runtime::{Shutdown, Telemetry};
//!
//! let shutdown = Shutdown::new();
//! let ingester = Ingester::start(Config::default(), Telemetry::new("ingester", "dev"), shutdown.clone()).await?;
//! println!("tile batches on {}", ingester.listen_addr());
//! shutdown.trigger();
//! ingester.wait().await;
//! # Ok(()) }
//! ```

mod admit;
mod config;
mod intake;
mod metrics;
mod pool;
mod queue;
mod sink;
mod tier;
mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tessera_runtime::{Readiness, ServerHandle, Shutdown, Telemetry};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub use admit::checkpoint::CheckpointMeta;
pub use admit::{Converter, HistogramMode};
pub use config::Config;
pub use metrics::{Metrics, PREFIX as METRIC_PREFIX};
pub use pool::pacing::{Aimd, Outcome};
pub use pool::split;
pub use queue::{FsyncPolicy, Position, Queue, QueueOptions, QueueReader, RequestKey, open as open_queue};
pub use queue::{record, series};
pub use sink::metadata::{Families, FamilyMeta};
pub use sink::openmetrics::Helps;
pub use sink::prompb;
pub use sink::remote_write::RemoteWriteSink;
pub use sink::{RecordInfo, SinkRequest};
pub use tessera_runtime::StartError;
pub use writer::checkpoint::write_atomically;
pub use writer::{RecentBatches, Routes, Writer};

use config::{SinkConfig, TargetConfig, target_dir_name};
use intake::accept_loop;
use pool::pacing::{AdaptiveLimit, Pace};
use pool::{Pool, Target};
use queue::QueueWriter;
use record::{Record, RecordHead};
use sink::file::FileSink;
use sink::rejected::RejectedLog;
use sink::{AnySink, Sink};
use writer::Job;
use writer::checkpoint::{CheckpointTarget, Checkpoints};

/// The file in the data directory that says the totals restored at start are stale
/// ([`tier::Ownership::persist_rejoined`]).
const REJOIN_MARKER: &str = "rejoined";

/// Batches remembered to answer a resent batch `Ok` without queueing it twice.
const RECENT_BATCHES: usize = 65_536;

/// A queue that cannot be opened stops the ingester from starting.
impl From<queue::OpenError> for StartError {
    fn from(error: queue::OpenError) -> StartError {
        StartError::failed("cannot open the queue", error)
    }
}

/// A running ingester.
pub struct Ingester {
    listen_addr: SocketAddr,
    telemetry_addr: Option<SocketAddr>,
    metrics: Metrics,
    queues: Vec<(String, Queue)>,
    supervisor: tokio::task::JoinHandle<()>,
}

/// What runs for one target.
struct RunningTarget {
    name: String,
    queue: Queue,
    pool: Pool,
    sink: Arc<AnySink>,
}

impl Ingester {
    /// Validates `config`, replays every target's queue, starts the sinks, the worker
    /// pools, the writer thread, the wire listener and the telemetry endpoint, and returns
    /// once batches are accepted. Runs until `shutdown` fires; [`Ingester::wait`] returns
    /// once it has drained (see the [crate docs](crate)).
    pub async fn start(config: Config, telemetry: Telemetry, shutdown: Shutdown) -> Result<Ingester, StartError> {
        config.validate()?;
        let metrics = Metrics::default();
        telemetry.with_registry(|registry| metrics.register(registry, METRIC_PREFIX));
        let readiness = Readiness::new();
        let listening = readiness.condition("listening");
        let instance_id = config.instance_id.clone().unwrap_or_else(|| tessera_runtime::daemon::hostname("ingester"));

        let rejected =
            Arc::new(RejectedLog::new(config.data_dir.join("rejected-samples.log"), config.rejected_log_max_bytes));
        let mut recent = RecentBatches::new(RECENT_BATCHES);
        let mut running = Vec::new();
        let mut paced = Vec::new();
        let mut writers: Vec<QueueWriter> = Vec::new();
        let mut converters = Vec::new();
        let mut routes = writer::Routes::default();
        let mut checkpoint_targets = Vec::new();
        // One of an ingesters' placement: which shards this one owns, for the converters.
        let tier = config.placement.as_ref().map(|_| {
            let tier_metrics = tier::TierMetrics::default();
            telemetry.with_registry(|registry| tier_metrics.register(registry, METRIC_PREFIX));
            (Arc::new(tier::Ownership::with_rejoin_marker(config.data_dir.join(REJOIN_MARKER))), tier_metrics)
        });
        // Writes only while the liveness lease is certainly alive (tier::fence); always
        // without a placement.
        let fence = Arc::new(match &tier {
            Some((ownership, tier_metrics)) => tier::Fence::of_placement(tier_metrics.into(), Arc::clone(ownership)),
            None => tier::Fence::none(),
        });
        // The memory budget: a guard thread reads the resident memory, and the converters
        // evict their least recently written totals near the limit.
        let budget = tessera_runtime::memory::MemoryGuard::start(config.memory_limit, None, &metrics.memory)?;
        for (index, target_config) in config.targets().into_iter().enumerate() {
            let name = target_config.name.clone();
            let sink_config = target_config.sink.clone();
            let dir = config.data_dir.join("queue").join(target_dir_name(&name));
            let checkpoint_metrics = metrics.writer.checkpoint(&name);
            let families = metadata_families(&target_config, &metrics.sink.target(&name).writes);
            let mut converter = converter_for(&config, &target_config, &tier, &metrics.sink);
            if let Some(families) = &families {
                converter = converter.with_families(families.clone(), config.mapping.timer_unit.as_str());
            }
            if let Some(budget) = &budget {
                converter = converter.with_budget(budget.clone(), metrics.writer.totals_evicted.clone());
            }
            let covers = writer::checkpoint::load(&dir, &name, &checkpoint_metrics, &mut converter);
            let from_checkpoint = converter.cumulative_series();
            let mut options = config.queue.options(dir.clone());
            options.checkpointed = Some(covers);
            let mut rolled_forward = 0u64;
            let mut replay_record = |position: Position, payload: &[u8]| {
                if let Ok(head) = RecordHead::decode(payload) {
                    recent.insert(head.batch_key());
                }
                if position < covers {
                    return;
                }
                match Record::decode(payload) {
                    Ok(record) => {
                        converter.roll_forward(&record);
                        rolled_forward += 1;
                    }
                    Err(error) => {
                        tracing::warn!(target = name, %error, "a queued record does not decode; not rolled forward")
                    }
                }
            };
            let (queue, writer, reader, replay) = queue::open_visiting(
                options,
                metrics.queue.target(&name, config.queue.max_queue_bytes),
                &mut replay_record,
            )?;
            let restored = converter.cumulative_series();
            checkpoint_metrics.stats.restored_series.set(restored as i64);
            if restored > 0 || rolled_forward > 0 {
                tracing::info!(
                    target = name,
                    series = restored,
                    from_checkpoint,
                    rolled_forward_records = rolled_forward,
                    histograms = converter.cumulative_histograms(),
                    "running totals restored from the checkpoint and the records queued after it"
                );
            }
            if replay.records > 0 || replay.corrupt > 0 {
                tracing::info!(
                    target = name,
                    records = replay.records,
                    segments = replay.segments,
                    corrupt = replay.corrupt,
                    "replaying the queue"
                );
            }
            let sink = Arc::new(build_sink(&config, &name, &sink_config, &metrics.sink)?);
            if let (Some(families), AnySink::RemoteWrite(_)) = (families, sink.as_ref()) {
                let writes = metrics.sink.target(&name).writes;
                tokio::spawn(send_metadata(sink.clone(), families, writes, shutdown.clone()));
            }
            let aimd = config.pacing.aimd(config.pool.workers);
            let target_metrics = metrics.pool.target(&name, &metrics.sink);
            let limit = AdaptiveLimit::new(
                aimd,
                target_metrics.gauges.in_flight_limit.clone(),
                target_metrics.gauges.in_flight.clone(),
            );
            let target = Target {
                name: name.clone(),
                sink: sink.clone(),
                limit,
                pace: Pace::new(config.pacing.max_samples_per_sec),
                metrics: target_metrics.clone(),
                rejected: rejected.clone(),
                queue: queue.clone(),
                fence: fence.clone(),
            };
            let pool = Pool::start(target, reader, config.pool.settings(), shutdown.clone())?;
            routes.add(&target_config.takes, index);
            writers.push(writer);
            converters.push(converter);
            checkpoint_targets.push(CheckpointTarget {
                name: name.clone(),
                dir,
                queue: queue.clone(),
                metrics: checkpoint_metrics,
            });
            running.push(RunningTarget { name, queue, pool, sink });
            paced.push(target_metrics);
        }
        tokio::spawn(measure_pace(paced, shutdown.clone()));

        let (jobs, job_receiver) = mpsc::channel(config.max_connections.clamp(1, 1024));
        metrics.writer.cumulative_series.set(converters.iter().map(Converter::cumulative_series).sum::<usize>() as i64);
        metrics
            .writer
            .cumulative_histograms
            .set(converters.iter().map(Converter::cumulative_histograms).sum::<usize>() as i64);
        let mut checkpoints = Checkpoints::start(checkpoint_targets, config.queue.checkpoint_interval())?;
        if let Some((ownership, _)) = &tier {
            checkpoints = checkpoints.clearing_rejoin(ownership.clone());
        }
        let writer = Writer {
            converters,
            queues: writers,
            routes,
            recent,
            metrics: metrics.writer.clone(),
            checkpoints: Some(checkpoints),
            fence: fence.clone(),
            ownership: tier.as_ref().map(|(ownership, _)| ownership.clone()),
        };
        let writer = tessera_runtime::daemon::spawn_thread("intake-writer", move || writer.run(job_receiver))?;
        tokio::spawn(tick_writer(jobs.clone(), config.queue.writer_tick(), shutdown.clone()));

        let listener =
            TcpListener::bind(config.listen).await.map_err(|source| StartError::bind(config.listen, source))?;
        let listen_addr = listener.local_addr().map_err(|source| StartError::bind(config.listen, source))?;
        let settings = config
            .listener_settings(instance_id.clone(), metrics.listener.listener_tls_reload_errors.clone())
            .map_err(|error| StartError::setup("cannot load the TLS files of [tls]", error))?;
        tokio::spawn(accept_loop(listener, jobs, settings, metrics.listener.clone(), shutdown.clone()));
        if let (Some(placement), Some((ownership, tier_metrics))) = (&config.placement, tier) {
            let settings = placement.settings(&instance_id, listen_addr);
            tracing::info!(instance_id, endpoint = settings.endpoint, "joining the ingesters' placement");
            tokio::spawn(tier::run_tier(settings, ownership, fence, tier_metrics, shutdown.clone()));
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
        tracing::info!(instance_id, listen = %listen_addr, telemetry = ?telemetry_addr, targets = running.len(), "ingester started");

        let queues = running.iter().map(|target| (target.name.clone(), target.queue.clone())).collect();
        let supervisor = tokio::spawn(supervise(shutdown, writer, running, config.shutdown_grace(), server));
        Ok(Ingester { listen_addr, telemetry_addr, metrics, queues, supervisor })
    }

    /// The bound wire address (useful with port 0).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The bound telemetry address.
    pub fn telemetry_addr(&self) -> Option<SocketAddr> {
        self.telemetry_addr
    }

    /// The ingester's metric handles.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Records queued and not yet written, over every target.
    pub fn pending_records(&self) -> u64 {
        self.queues.iter().map(|(_, queue)| queue.pending_records()).sum()
    }

    /// The queue of `target` (`default`, or a storage policy with its own sink).
    pub fn queue(&self, target: &str) -> Option<&Queue> {
        self.queues.iter().find(|(name, _)| name == target).map(|(_, queue)| queue)
    }

    /// Waits until the ingester has shut down and drained.
    pub async fn wait(self) {
        if let Err(error) = self.supervisor.await {
            tracing::error!(%error, "ingester supervisor failed");
        }
    }
}

/// The converter of one target: a remote-write target writes distributions as its
/// `histograms` setting says, a file target as summaries (OpenMetrics text has no native
/// histograms).
fn converter_for(
    config: &Config,
    target: &TargetConfig,
    tier: &Option<(Arc<tier::Ownership>, tier::TierMetrics)>,
    metrics: &sink::SinkMetrics,
) -> Converter {
    let converter = Converter::new(&config.mapping.quantiles, config.mapping.counter_expire_after_secs as i64 * 1000);
    if let SinkConfig::Graphite(graphite) = &target.sink {
        // Per tile: no running totals, so nothing that moves with a shard of the
        // ingesters' placement either (two owners write the same values to one slot).
        let format = admit::lines::LineFormat::Graphite { naming: graphite.naming(), timer_scale: timer_scale(config) };
        return converter.with_lines(format, metrics.name_changes(&target.name));
    }
    if let SinkConfig::Influxdb(influx) = &target.sink {
        let format = admit::lines::LineFormat::Influx { naming: influx.naming(), timer_scale: timer_scale(config) };
        return converter.with_lines(format, metrics.name_changes(&target.name));
    }
    let mut converter = converter.with_resolution_label(target.resolution_label());
    if let Some((ownership, metrics)) = tier {
        converter = converter.with_ownership(ownership.clone(), metrics);
    }
    match &target.sink {
        SinkConfig::RemoteWrite(remote) => converter
            .with_histograms(remote.histograms, remote.max_buckets)
            .with_external_labels(&remote.external_labels),
        SinkConfig::File(_) | SinkConfig::Graphite(_) | SinkConfig::Influxdb(_) => converter,
    }
}

/// What a per-tile target multiplies timers by to write them in the unit they were sent in.
fn timer_scale(config: &Config) -> f64 {
    match config.mapping.timer_unit {
        config::TimerUnitName::Seconds => 1000.0,
        config::TimerUnitName::Milliseconds => 1.0,
    }
}

fn build_sink(
    config: &Config,
    name: &str,
    sink: &SinkConfig,
    metrics: &sink::SinkMetrics,
) -> Result<AnySink, StartError> {
    let sink_error =
        |source: std::io::Error| StartError::failed(format!("cannot set up the sink of target `{name}`"), source);
    let helps = config.mapping.helps().map_err(|error| StartError::failed("cannot read [mapping] file", error))?;
    match sink {
        SinkConfig::File(file) => {
            let settings = sink::file::FileSinkSettings {
                helps,
                ..file.settings(|| default_file_sink_dir(&config.data_dir, name))
            };
            let sink =
                FileSink::open(settings, metrics.file_sink(name), config.pool.workers * 2).map_err(sink_error)?;
            Ok(AnySink::File(sink))
        }
        SinkConfig::Influxdb(influx) => {
            let settings = influx
                .settings(config.pool.workers)
                .map_err(|(field, reason)| sink_error(std::io::Error::other(format!("{field}: {reason}"))))?;
            let sink =
                sink::influx::InfluxSink::new(settings).map_err(|error| sink_error(std::io::Error::other(error)))?;
            Ok(AnySink::Influx(Box::new(sink)))
        }
        SinkConfig::Graphite(graphite) => {
            Ok(AnySink::Graphite(Box::new(sink::carbon::CarbonSink::new(graphite.settings(), metrics.carbon(name)))))
        }
        SinkConfig::RemoteWrite(remote) => {
            let settings = remote
                .settings(config.pool.workers, metrics.sink_reload_errors.clone())
                .map_err(|(field, reason)| sink_error(std::io::Error::other(format!("{field}: {reason}"))))?;
            let settings = sink::remote_write::RemoteWriteSettings { helps, ..settings };
            let sink = RemoteWriteSink::new(settings).map_err(|error| sink_error(std::io::Error::other(error)))?;
            Ok(AnySink::RemoteWrite(Box::new(sink)))
        }
    }
}

/// The families of a remote-write target that sends metadata (`metadata = true`, no tenant
/// label nor M3 headers), counted in `writes`.
fn metadata_families(target: &TargetConfig, writes: &sink::TargetWrites) -> Option<sink::metadata::Families> {
    let SinkConfig::RemoteWrite(remote) = &target.sink else { return None };
    remote.sends_metadata().then(|| {
        sink::metadata::Families::new(
            sink::metadata::MAX_FAMILIES,
            writes.metadata_families.clone(),
            writes.metadata_families_dropped.clone(),
        )
    })
}

/// Sends every family's metadata to a remote-write target every `metadata_interval`,
/// first one interval after the start; a failed round is logged and counted, and the
/// next round sends everything again.
async fn send_metadata(
    sink: Arc<AnySink>,
    families: sink::metadata::Families,
    writes: sink::TargetWrites,
    shutdown: Shutdown,
) {
    let AnySink::RemoteWrite(remote) = sink.as_ref() else { return };
    if !remote.sends_metadata() {
        return;
    }
    let mut interval = tokio::time::interval(remote.metadata_interval());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    while shutdown.tick(&mut interval).await {
        match remote.send_metadata(&families).await {
            Ok(0) => {}
            Ok(sent) => {
                writes.metadata_requests.inc();
                tracing::debug!(families = sent, "metadata sent");
            }
            Err(error) => {
                writes.metadata_errors.inc();
                tracing::warn!(%error, "metadata not sent; the next round sends it again");
            }
        }
    }
}

/// Sends the writer a tick now and then, so the interval fsync policy runs while idle.
async fn tick_writer(jobs: mpsc::Sender<Job>, every: Duration, shutdown: Shutdown) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while shutdown.tick(&mut interval).await {
        if jobs.try_send(Job::Tick).is_err() && jobs.is_closed() {
            return;
        }
    }
}

/// Sets each target's pace gauge to the samples written over the last second.
async fn measure_pace(targets: Vec<pool::TargetMetrics>, shutdown: Shutdown) {
    let mut previous: Vec<u64> = targets.iter().map(|target| target.sink.writes.samples_written.get()).collect();
    let mut interval = tokio::time::interval(Duration::from_secs(1));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = tokio::time::Instant::now();
    while shutdown.tick(&mut interval).await {
        let elapsed = last.elapsed().as_secs_f64().max(0.001);
        last = tokio::time::Instant::now();
        for (target, before) in targets.iter().zip(previous.iter_mut()) {
            let now = target.sink.writes.samples_written.get();
            target.gauges.pace.set((now - *before) as f64 / elapsed);
            *before = now;
        }
    }
}

/// Waits for shutdown, then drains in order: intake, writer (fsync), pools, sinks.
async fn supervise(
    shutdown: Shutdown,
    writer: std::thread::JoinHandle<()>,
    targets: Vec<RunningTarget>,
    grace: Duration,
    server: Option<ServerHandle>,
) {
    shutdown.wait().await;
    tracing::info!("shutting down: finishing in-flight batches and storage requests");
    let joined = tokio::time::timeout(grace, tokio::task::spawn_blocking(move || writer.join())).await;
    match joined {
        Ok(Ok(Ok(()))) => {}
        Ok(_) => tracing::error!("the intake writer thread panicked"),
        Err(_) => tracing::warn!("the intake writer did not finish within the grace period"),
    }
    for target in &targets {
        target.queue.close();
    }
    for target in targets {
        target.pool.join(grace).await;
        target.sink.close().await;
        let pending = target.queue.pending_records();
        if pending > 0 {
            tracing::info!(target = target.name, pending, "records stay queued for the next start");
        }
    }
    if let Some(server) = server {
        let _ = server.stopped().await;
    }
    tracing::info!("ingester stopped");
}

/// Where `Config::data_dir` puts the file sink output of `target` by default.
fn default_file_sink_dir(data_dir: &std::path::Path, target: &str) -> PathBuf {
    data_dir.join("openmetrics").join(target_dir_name(target))
}
