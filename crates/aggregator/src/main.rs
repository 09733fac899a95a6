//! The `tessera-aggregator` binary: flags, then the library.

use std::process::ExitCode;

use clap::Parser;
use tessera_aggregator::{Aggregator, Config, StartError};
use tessera_runtime::{DaemonFlags, EXIT_CONFIG, Telemetry, run_daemon};

/// tessera-aggregator: merges collectors' 1 s partials for the shards it
/// owns into 10 s and 1 min tiles and flushes each closed tile to an ingester.
/// `instance_id`, `[placement]` and `ingester.endpoints` are required in the
/// configuration.
#[derive(Debug, Parser)]
#[command(name = "tessera-aggregator", version, about)]
struct Flags {
    #[command(flatten)]
    daemon: DaemonFlags,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    run_daemon("tessera-aggregator", &flags.daemon, Config::validate, |config: Config, shutdown| async move {
        let telemetry = Telemetry::new("aggregator", env!("CARGO_PKG_VERSION"));
        match Aggregator::start(config, telemetry, shutdown).await {
            Ok(aggregator) => {
                aggregator.wait().await;
                ExitCode::SUCCESS
            }
            Err(error) => {
                let code = match error {
                    StartError::Config(_) | StartError::Placement(_) | StartError::IngesterPlacement(_) => {
                        ExitCode::from(EXIT_CONFIG)
                    }
                    _ => ExitCode::FAILURE,
                };
                tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "aggregator failed to start");
                code
            }
        }
    })
}
