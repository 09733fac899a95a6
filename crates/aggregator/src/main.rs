//! The `tessera-aggregator` binary: flags, config, logging, then the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tessera_aggregator::{Aggregator, Config, StartError};
use tessera_runtime::{EXIT_CONFIG, LogFormat, Shutdown, Telemetry, config, logging};

/// tessera-aggregator: merges collectors' 1 s partials for the shards it
/// owns into 10 s and 1 min tiles and flushes each closed tile to an ingester.
#[derive(Debug, Parser)]
#[command(name = "tessera-aggregator", version, about)]
struct Flags {
    /// Configuration file (TOML). `instance_id`, `[placement]` and
    /// `ingester.endpoints` are required; see the crate docs for every key.
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
    /// Async worker threads (connections, ingester senders, etcd); merging
    /// runs on its own threads.
    #[arg(long, default_value_t = 2)]
    worker_threads: usize,
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
            eprintln!("tessera-aggregator: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = config.validate() {
        eprintln!("tessera-aggregator: {error}");
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
        eprintln!("tessera-aggregator: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(flags.worker_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tessera-aggregator: cannot start the async runtime: {error}");
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
    let telemetry = Telemetry::new("aggregator", env!("CARGO_PKG_VERSION"));
    match Aggregator::start(config, telemetry, shutdown).await {
        Ok(aggregator) => {
            aggregator.wait().await;
            ExitCode::SUCCESS
        }
        Err(error) => {
            let code = match error {
                StartError::Config(_) | StartError::Placement(_) => ExitCode::from(EXIT_CONFIG),
                _ => ExitCode::FAILURE,
            };
            tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "aggregator failed to start");
            code
        }
    }
}
