//! The `tessera-ingester` binary: flags, config, logging, then the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tessera_ingester::{Config, Ingester};
use tessera_runtime::{EXIT_CONFIG, LogFormat, Shutdown, Telemetry, config, logging};

/// tessera-ingester: takes the aggregators' tile batches, makes them durable in a disk
/// queue, and writes them to storage (Prometheus remote write or OpenMetrics files) at
/// the pace storage sustains.
#[derive(Debug, Parser)]
#[command(name = "tessera-ingester", version, about)]
struct Flags {
    /// Configuration file (TOML); every key is optional and documented in crates/ingester/README.md.
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
            eprintln!("tessera-ingester: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = config.validate() {
        eprintln!("tessera-ingester: {error}");
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
        eprintln!("tessera-ingester: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tessera-ingester: cannot start the async runtime: {error}");
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
    let telemetry = Telemetry::new("ingester", env!("CARGO_PKG_VERSION"));
    match Ingester::start(config, telemetry, shutdown).await {
        Ok(ingester) => {
            ingester.wait().await;
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "ingester failed to start");
            ExitCode::FAILURE
        }
    }
}
