//! `tessera local`: the whole pipeline in one process.
//!
//! Runs a collector, one aggregator and an ingester on loopback with a
//! static one-instance placement, the file sink by default (OpenMetrics
//! files under `--data-dir`), Prometheus remote write with
//! `--remote-write URL` (over https, with a CA file, basic auth or a bearer
//! token, and headers: [`remote_write`]), Graphite with `--graphite
//! HOST:PORT` (statsd's paths, or `--graphite-naming brubeck|tessera`), or
//! InfluxDB 1.x with `--influxdb URL --influxdb-database NAME` (Telegraf's names). The three daemons share one
//! telemetry registry served on `--telemetry`. While it runs it shows
//! intake, active series, tiles, samples written, drops and end-to-end
//! latency, redrawn in place on a terminal and as a log line every ten
//! seconds otherwise. Ctrl-C (or SIGTERM) drains in order: the collector
//! cuts its window and delivers it, the aggregator flushes its open tiles,
//! the ingester writes what it holds.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_runtime::config::EXIT_CONFIG;
use tessera_runtime::{LogFormat, Shutdown, Telemetry, logging};
use tessera_topology::{Placement, PlacementHandle};

mod remote_write;

use remote_write::{FlagError, RemoteWriteFlags};

/// Flags of `tessera local`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where applications send statsd (UDP, and TCP on the same port).
    #[arg(long, default_value = "127.0.0.1:8125")]
    statsd: SocketAddr,
    /// Durable queue and OpenMetrics output live here.
    #[arg(long, default_value = "tessera-data")]
    data_dir: PathBuf,
    #[command(flatten)]
    remote_write: RemoteWriteFlags,
    /// Send to Graphite (carbon's plaintext receiver, e.g. 127.0.0.1:2003) instead of the
    /// file sink: each 10 s tile once, with statsd's paths by default.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "url")]
    graphite: Option<String>,
    /// With --graphite: whose paths to write, `statsd` (`stats.KEY`, `stats_counts.KEY`,
    /// `stats.timers.KEY.upper_90`, ...), `brubeck` or `tessera`.
    #[arg(long, value_name = "SCHEME", default_value = "statsd", requires = "graphite")]
    graphite_naming: String,
    /// With --graphite: `plaintext` (carbon's line receiver, 2003) or `pickle` (its
    /// pickle receiver, 2004).
    #[arg(long, value_name = "PROTOCOL", default_value = "plaintext", requires = "graphite")]
    graphite_protocol: String,
    /// Send to InfluxDB 1.x instead of the file sink (e.g. http://127.0.0.1:8086): each
    /// 10 s tile once, named as Telegraf's statsd input writes it.
    #[arg(long, value_name = "URL", conflicts_with_all = ["url", "graphite"])]
    influxdb: Option<String>,
    /// With --influxdb: the database to write to.
    #[arg(long, value_name = "NAME", default_value = "telegraf", requires = "influxdb")]
    influxdb_database: String,
    /// The dashboard page (`/`), `/metrics`, `/healthz`, `/readyz` of all three daemons.
    #[arg(long, default_value = "127.0.0.1:9100")]
    telemetry: SocketAddr,
    /// Refuse CPU profiles at `/debug/pprof/profile` (403), for a `--telemetry` address
    /// others can reach.
    #[arg(long)]
    no_profiling: bool,
    /// A Prometheus web config file: `tls_server_config` (the `--telemetry` port speaks
    /// HTTPS only) and `basic_auth_users` with bcrypt hashes (every path but `/healthz` and
    /// `/readyz` then needs the password).
    #[arg(long, value_name = "FILE")]
    web_config: Option<PathBuf>,
    /// A Prometheus statsd_exporter mapping file: dotted name parts become labels
    /// (reloaded on SIGHUP and when it changes; check it with `tessera check --mapping`).
    #[arg(long, value_name = "FILE")]
    mapping_config: Option<PathBuf>,
    /// Shards in the placement.
    #[arg(long, default_value_t = 64)]
    shards: u32,
    /// Storage policies, `resolution:retention`.
    #[arg(long = "policy", default_values = ["10s:2d"])]
    policies: Vec<String>,
    /// Print a status line every ten seconds even on a terminal.
    #[arg(long)]
    plain: bool,
    /// Default log level (RUST_LOG overrides it).
    #[arg(long, default_value = "warn")]
    log_level: String,
}

/// Runs `tessera local` until Ctrl-C or SIGTERM; exits 64 on flags that cannot work.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let configs = match Configs::from_args(&args) {
        Ok(configs) => configs,
        Err(error) => {
            eprintln!("tessera local: {error:#}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    logging::init(LogFormat::Text, &args.log_level).context("starting logging")?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("local-io").enable_all().build()?;
    runtime.block_on(run_async(args, configs))
}

/// The three daemons' configurations, built once from the flags and checked as each
/// daemon checks its own file. The aggregator's listen address and its ingester are set
/// at start, once they are bound.
pub struct Configs {
    ingester: tessera_ingester::Config,
    aggregator: tessera_aggregator::Config,
    collector: tessera_collector::Config,
}

impl Configs {
    /// The configurations `args` ask for.
    ///
    /// # Errors
    ///
    /// The first flag that cannot work, naming it (a remote-write flag, `--policy`,
    /// `--mapping-config`).
    pub fn from_args(args: &Args) -> anyhow::Result<Configs> {
        let mut ingester = ingester_config(args)?;
        // The one store takes every policy: with one (the default) its samples carry no
        // `resolution` label; with several the label keeps them apart.
        ingester.sink_policies = args.policies.iter().map(|policy| policy.trim().to_owned()).collect();
        // The mapping file's `help` texts become the families' HELP.
        ingester.mapping.file.clone_from(&args.mapping_config);
        let policies = args.policies.iter().map(|policy| policy.parse::<tessera_aggregator::StoragePolicy>());
        let policies = policies.collect::<Result<Vec<_>, _>>().context("--policy")?;
        let mut aggregator: tessera_aggregator::Config =
            toml_config("instance_id = \"local\"\n[ingester]\nendpoints = [\"127.0.0.1:0\"]\n")?;
        aggregator.policies = policies;
        aggregator.telemetry.listen = None;
        aggregator.validate_settings().context("--policy")?;
        let mut collector: tessera_collector::Config = toml_config(&format!(
            "instance_id = \"local\"\n[udp]\nlisten = \"{statsd}\"\n[tcp]\nlisten = \"{statsd}\"\n[telemetry]\nlisten = \"{telemetry}\"\n",
            statsd = args.statsd,
            telemetry = args.telemetry
        ))?;
        collector.telemetry.profiling = !args.no_profiling;
        collector.telemetry.web_config.clone_from(&args.web_config);
        collector.mapping.file.clone_from(&args.mapping_config);
        collector.validate_settings().context("--mapping-config")?;
        Ok(Configs { ingester, aggregator, collector })
    }
}

/// A running pipeline: the three daemons and their shutdown signals, in drain order.
pub struct Pipeline {
    collector: tessera_collector::Collector,
    aggregator: tessera_aggregator::Aggregator,
    ingester: tessera_ingester::Ingester,
    shutdowns: [Shutdown; 3],
    telemetry: Telemetry,
}

impl Pipeline {
    /// Starts ingester, aggregator and collector as `configs` say, wired together on
    /// loopback.
    pub async fn start(args: &Args, configs: Configs) -> anyhow::Result<Pipeline> {
        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
        let telemetry = Telemetry::new("local", env!("CARGO_PKG_VERSION"));
        let shutdowns = [Shutdown::new(), Shutdown::new(), Shutdown::new()];

        let Configs { ingester, aggregator: mut aggregator_config, collector: collector_config } = configs;
        let ingester = tessera_ingester::Ingester::start(ingester, telemetry.clone(), shutdowns[2].clone())
            .await
            .context("starting the ingester")?;

        let aggregator_address = free_loopback_port()?;
        let placement = Placement::init(&[("local", &aggregator_address.to_string())], args.shards, 1, 0)
            .context("building the local placement")?;
        let placement = PlacementHandle::fixed(placement);
        aggregator_config.listen = aggregator_address;
        aggregator_config.ingester.endpoints = vec![ingester.listen_addr().to_string()];
        let aggregator = tessera_aggregator::Aggregator::start_with_placement(
            aggregator_config,
            placement.clone(),
            telemetry.clone(),
            shutdowns[1].clone(),
        )
        .await
        .context("starting the aggregator")?;

        let collector =
            tessera_collector::Collector::start(collector_config, placement, telemetry.clone(), shutdowns[0].clone())
                .await
                .context("starting the collector")?;
        Ok(Pipeline { collector, aggregator, ingester, shutdowns, telemetry })
    }

    /// The collector's UDP address.
    pub fn statsd_addr(&self) -> Option<SocketAddr> {
        self.collector.udp_addr()
    }

    /// The shared telemetry of the three daemons.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Drains in order: collector, then aggregator, then ingester.
    pub async fn drain(self) {
        self.shutdowns[0].trigger();
        self.collector.wait().await;
        self.shutdowns[1].trigger();
        self.aggregator.wait().await;
        self.shutdowns[2].trigger();
        self.ingester.wait().await;
    }
}

/// The embedded ingester's configuration: the file sink under `--data-dir`, or remote
/// write as the flags say, checked as the ingester checks its file.
fn ingester_config(args: &Args) -> Result<tessera_ingester::Config, FlagError> {
    let mut config: tessera_ingester::Config =
        toml::from_str("listen = \"127.0.0.1:0\"\n[telemetry]\n").expect("the embedded ingester configuration parses");
    config.data_dir = args.data_dir.join("queue");
    config.telemetry.listen = None;
    let table = |entries: &[(&str, &str)]| -> toml::Table {
        entries.iter().map(|(key, value)| ((*key).to_owned(), toml::Value::from(*value))).collect()
    };
    if let Some(url) = &args.influxdb {
        let influx = table(&[("kind", "influxdb"), ("url", url), ("database", &args.influxdb_database)]);
        return per_tile_sink(config, influx, "--influxdb");
    }
    if let Some(address) = &args.graphite {
        let (naming, protocol) = (&args.graphite_naming, &args.graphite_protocol);
        let graphite = table(&[("kind", "graphite"), ("address", address), ("naming", naming), ("protocol", protocol)]);
        return per_tile_sink(config, graphite, "--graphite");
    }
    let sink = match args.remote_write.sink_table()? {
        Some(sink) => sink,
        None => {
            let mut file = toml::Table::new();
            file.insert("kind".into(), "file".into());
            file.insert("dir".into(), args.data_dir.join("openmetrics").display().to_string().into());
            file
        }
    };
    remote_write::ingester_sink(&mut config, sink)?;
    Ok(config)
}

/// `config` with `sink` as its `[sink]`, checked as the ingester checks its file; a refusal
/// names `flag`.
fn per_tile_sink(
    mut config: tessera_ingester::Config,
    sink: toml::Table,
    flag: &'static str,
) -> Result<tessera_ingester::Config, FlagError> {
    config.sink = sink
        .try_into()
        .map_err(|error: toml::de::Error| FlagError::Refused { flag, reason: error.message().to_owned() })?;
    config.validate().map_err(|invalid| FlagError::Refused { flag, reason: invalid.reason })?;
    Ok(config)
}

async fn run_async(args: Args, configs: Configs) -> anyhow::Result<ExitCode> {
    let signals = Shutdown::from_signals().context("installing signal handlers")?;
    let pipeline = Pipeline::start(&args, configs).await?;
    let interactive = std::io::stdout().is_terminal() && !args.plain;
    let sink = match (&args.remote_write.url, &args.graphite) {
        (Some(url), _) => format!("remote write {url}"),
        (None, Some(address)) => format!("Graphite at {address} ({} paths)", args.graphite_naming),
        (None, None) => match &args.influxdb {
            Some(url) => format!("InfluxDB at {url} (database {})", args.influxdb_database),
            None => format!("files in {}", args.data_dir.join("openmetrics").display()),
        },
    };
    let statsd = pipeline.statsd_addr().unwrap_or(args.statsd);
    println!(
        "tessera local: statsd on udp+tcp {statsd}, dashboard on http://{}/ (metrics at /metrics), writing {sink}. Ctrl-C drains and exits.",
        args.telemetry
    );
    let mut status = Status::default();
    let started = Instant::now();
    let mut last_plain = Instant::now();
    loop {
        tokio::select! {
            () = signals.wait() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let text = pipeline.telemetry().encode().unwrap_or_default();
        let line = status.update(&parse_metrics(&text));
        if interactive {
            print!("\r\x1b[2K{line}");
            let _ = std::io::stdout().flush();
        } else if last_plain.elapsed() >= Duration::from_secs(10) {
            println!("[{:>5}s] {line}", started.elapsed().as_secs());
            last_plain = Instant::now();
        }
    }
    if interactive {
        println!();
    }
    println!("draining: collector, then aggregator, then ingester");
    pipeline.drain().await;
    println!("stopped");
    Ok(ExitCode::SUCCESS)
}

fn toml_config<T: serde::de::DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    toml::from_str(text).with_context(|| format!("building an embedded configuration:\n{text}"))
}

fn free_loopback_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?)
}

/// Metric samples by `name{labels}`.
type Samples = HashMap<String, f64>;

fn parse_metrics(text: &str) -> Samples {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn sum(samples: &Samples, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(key, _)| key.as_str() == name || key.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
        .map(|(_, value)| value)
        .sum()
}

/// `sum` over the samples of `name` whose labels pass `keep`.
fn sum_where(samples: &Samples, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    samples
        .iter()
        .filter(|(key, _)| key.as_str() == name || key.strip_prefix(name).is_some_and(|rest| rest.starts_with('{')))
        .filter(|(key, _)| keep(&key[name.len()..]))
        .map(|(_, value)| value)
        .sum()
}

/// Everything lost or refused, each loss counted once, where it happened:
/// a batch the aggregator refuses is its refusal, not also the collector's
/// `rejected` drop; a retryable refusal (`buffer_full`) is sent again, so it
/// is no loss; the aggregator's dropped tiles count in series, not also in
/// batches; partials too late for one policy's tile (taken into the longer
/// policies') are missing from that tile.
fn drops_and_errors(samples: &Samples) -> f64 {
    let retryable =
        |labels: &str| labels.contains("reason=\"buffer_full\"") || labels.contains("reason=\"shutting_down\"");
    sum_where(samples, "tessera_collector_drops_total", |labels| !labels.contains("reason=\"rejected\""))
        + sum(samples, "tessera_collector_kernel_drops_total")
        + sum(samples, "tessera_collector_parse_errors_total")
        + sum_where(samples, "tessera_aggregator_drops_total", |labels| labels.contains("unit=\"series\""))
        + sum_where(samples, "tessera_aggregator_partials_rejected_total", |labels| !retryable(labels))
        + sum(samples, "tessera_aggregator_partials_late_for_policy_total")
}

/// What the status line shows, with the previous readings for rates.
#[derive(Default)]
struct Status {
    last_lines: f64,
    last_at: Option<Instant>,
    last_latency: Vec<(f64, f64)>,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl Status {
    fn update(&mut self, samples: &Samples) -> String {
        let now = Instant::now();
        let lines = sum(samples, "tessera_collector_lines_received_total");
        let rate = match self.last_at {
            Some(at) => (lines - self.last_lines) / now.duration_since(at).as_secs_f64(),
            None => 0.0,
        };
        self.last_lines = lines;
        self.last_at = Some(now);
        let series = sum(samples, "tessera_collector_active_series");
        let tiles = sum(samples, "tessera_aggregator_tiles_flushed_total");
        let written = sum(samples, "tessera_ingester_samples_written_total");
        let drops = drops_and_errors(samples);
        let buckets = latency_buckets(samples);
        let window: Vec<(f64, f64)> = if buckets.len() == self.last_latency.len() {
            buckets.iter().zip(&self.last_latency).map(|((le, now), (_, before))| (*le, now - before)).collect()
        } else {
            buckets.clone()
        };
        if window.last().is_some_and(|(_, count)| *count > 0.0) {
            self.p50 = quantile(&window, 0.5);
            self.p99 = quantile(&window, 0.99);
        }
        self.last_latency = buckets;
        let show = |value: Option<f64>| value.map_or("-".to_owned(), |seconds| format!("{seconds:.2}s"));
        format!(
            "in {:>9.0} lines/s | series {:>8.0} | tiles {:>8.0} | samples written {:>10.0} | drops+errors {:>6.0} | e2e latency p50 {} p99 {}",
            rate,
            series,
            tiles,
            written,
            drops,
            show(self.p50),
            show(self.p99)
        )
    }
}

/// Cumulative `(le, count)` of the end-to-end latency histogram, summed over resolutions.
fn latency_buckets(samples: &Samples) -> Vec<(f64, f64)> {
    let mut by_le: HashMap<String, f64> = HashMap::new();
    for (key, value) in samples {
        let Some(labels) = key.strip_prefix("tessera_ingester_end_to_end_latency_seconds_bucket{") else { continue };
        let Some(le) = labels.split(',').find_map(|pair| pair.trim_end_matches('}').strip_prefix("le=")) else {
            continue;
        };
        *by_le.entry(le.trim_matches('"').to_owned()).or_default() += value;
    }
    let mut buckets: Vec<(f64, f64)> = by_le
        .into_iter()
        .map(|(le, count)| (if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) }, count))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// Upper bound of the bucket holding quantile `q` of cumulative buckets.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    buckets.iter().find(|(_, count)| *count >= rank).map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_reads_rates_and_latency_quantiles_from_metrics() {
        let text = "\
tessera_collector_lines_received_total{listener=\"udp\"} 100
tessera_collector_lines_received_total{listener=\"tcp\"} 50
tessera_collector_active_series 7
tessera_ingester_end_to_end_latency_seconds_bucket{resolution=\"10s\",le=\"0.5\"} 10
tessera_ingester_end_to_end_latency_seconds_bucket{resolution=\"10s\",le=\"1.0\"} 99
tessera_ingester_end_to_end_latency_seconds_bucket{resolution=\"10s\",le=\"+Inf\"} 100
";
        let samples = parse_metrics(text);
        assert_eq!(sum(&samples, "tessera_collector_lines_received_total"), 150.0);
        let mut status = Status::default();
        let line = status.update(&samples);
        assert!(line.contains("series        7"), "{line}");
        assert!(line.contains("p50 1.00s p99 1.00s"), "{line}");
        assert_eq!(quantile(&latency_buckets(&samples), 0.05), Some(0.5));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_refused_partial_counts_once_in_drops_and_errors() {
        // 30 partials refused as too late: the aggregator's refusal and the
        // collector's `rejected` drop are one loss. 5 refused as buffer_full
        // are sent again: no loss. 2 tile batches of 9 series dropped.
        let text = "\
tessera_collector_drops_total{reason=\"rejected\",unit=\"partials\"} 30
tessera_collector_drops_total{reason=\"queue_full\",unit=\"partials\"} 4
tessera_collector_kernel_drops_total{socket=\"0\"} 1
tessera_collector_parse_errors_total{listener=\"udp\",reason=\"bad_value\"} 2
tessera_aggregator_partials_rejected_total{reason=\"too_late\"} 30
tessera_aggregator_partials_rejected_total{reason=\"buffer_full\"} 5
tessera_aggregator_drops_total{reason=\"queue_full\",unit=\"batches\"} 2
tessera_aggregator_drops_total{reason=\"queue_full\",unit=\"series\"} 9
";
        assert_eq!(drops_and_errors(&parse_metrics(text)), 30.0 + 4.0 + 1.0 + 2.0 + 9.0);
    }

    /// `local.<service>.hits` becomes `local_requests{service}`.
    const LOCAL_MAPPING: &str =
        "mappings:\n- match: local.*.hits\n  name: local_requests\n  labels:\n    service: $1\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_local_pipeline_writes_what_it_receives_to_openmetrics_files() {
        let dir = tempfile::tempdir().unwrap();
        let mapping = dir.path().join("mapping.yml");
        std::fs::write(&mapping, LOCAL_MAPPING).unwrap();
        let args = Args {
            statsd: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            remote_write: RemoteWriteFlags::default(),
            graphite: None,
            graphite_naming: "statsd".into(),
            graphite_protocol: "plaintext".into(),
            influxdb: None,
            influxdb_database: "telegraf".into(),
            mapping_config: Some(mapping),
            telemetry: "127.0.0.1:0".parse().unwrap(),
            no_profiling: false,
            web_config: None,
            shards: 8,
            policies: vec!["1s:1h".to_owned()],
            plain: true,
            log_level: "warn".to_owned(),
        };
        let configs = Configs::from_args(&args).unwrap();
        let pipeline = Pipeline::start(&args, configs).await.unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..10 {
            socket
                .send_to(b"local.hits:2|c|#env:test\nlocal.api.hits:1|c|#env:test", pipeline.statsd_addr().unwrap())
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while sum(&parse_metrics(&pipeline.telemetry().encode().unwrap()), "tessera_collector_lines_received_total")
            < 20.0
        {
            assert!(Instant::now() < deadline, "lines never counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pipeline.drain().await;
        let mut text = String::new();
        for entry in std::fs::read_dir(dir.path().join("data/openmetrics")).unwrap() {
            text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        // The last value written of `series` (a name and its labels, as written).
        let last_value = |series: &str| {
            text.lines()
                .filter(|line| line.starts_with(series))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<f64>().ok())
                .next_back()
        };
        // One policy: one resolution in the store, so no `resolution` label.
        assert_eq!(last_value("local_hits_total{env=\"test\"}"), Some(20.0), "{text}");
        assert_eq!(
            last_value("local_requests_total{env=\"test\",service=\"api\"}"),
            Some(10.0),
            "the mapping file named the dotted series: {text}"
        );
    }

    /// The dashboard page reads metrics by name: every name it reads is one the daemons
    /// declare, so a renamed metric cannot leave a chart silently empty.
    #[test]
    fn every_metric_the_dashboard_reads_is_declared_by_a_daemon() {
        let telemetry = tessera_runtime::Telemetry::new("local", "test");
        telemetry.with_registry(|registry| {
            tessera_collector::Metrics::default().register(registry, tessera_collector::METRIC_PREFIX);
            tessera_aggregator::Metrics::default().register(registry, tessera_aggregator::METRIC_PREFIX);
            tessera_ingester::Metrics::default().register(registry, tessera_ingester::METRIC_PREFIX);
        });
        let text = telemetry.encode().unwrap();
        let declared: Vec<&str> =
            text.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        let families = tessera_runtime::telemetry::dashboard::families();
        assert!(families.len() >= 20, "{families:?}");
        let missing: Vec<&&str> = families.iter().filter(|family| !declared.contains(family)).collect();
        assert!(missing.is_empty(), "the dashboard reads metrics no daemon declares: {missing:?}");
    }
}
