//! The `tessera-collector` binary: flags, config, logging, then the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tessera_collector::{Collector, Config};
use tessera_runtime::{EXIT_CONFIG, LogFormat, Shutdown, Telemetry, config, logging};

/// tessera-collector: receives statsd / DogStatsD on this host, pre-aggregates
/// every second and forwards partials to the aggregators that own each shard.
#[derive(Debug, Parser)]
#[command(name = "tessera-collector", version, about)]
struct Flags {
    /// Configuration file (TOML); every key is optional. See deploy/config/collector.toml.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Validate the configuration and exit.
    #[arg(long)]
    check_config: bool,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormatFlag,
    /// Default log level (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormatFlag {
    Text,
    Json,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let config: Config = match config::load_toml(flags.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("tessera-collector: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = config.validate() {
        eprintln!("tessera-collector: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if flags.check_config {
        println!("configuration ok");
        return ExitCode::SUCCESS;
    }
    let format = match flags.log_format {
        LogFormatFlag::Text => LogFormat::Text,
        LogFormatFlag::Json => LogFormat::Json,
    };
    if let Err(error) = logging::init(format, &flags.log_level) {
        eprintln!("tessera-collector: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tessera-collector: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: Config) -> ExitCode {
    let shutdown = match Shutdown::from_signals() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
    };
    let placement = match tessera_collector::start_placement(&config).await {
        Ok(placement) => placement,
        Err(error) => {
            tracing::error!(error = %format!("{error:#}"), "cannot load the placement");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let telemetry = Telemetry::new("collector", env!("CARGO_PKG_VERSION"));
    match Collector::start(config, placement, telemetry, shutdown).await {
        Ok(collector) => {
            collector.wait().await;
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "collector failed to start");
            ExitCode::FAILURE
        }
    }
}
