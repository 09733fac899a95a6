//! The `tessera-collector` binary: flags, then the library.

use std::process::ExitCode;

use clap::Parser;
use tessera_collector::{Collector, Config};
use tessera_runtime::{DaemonFlags, EXIT_CONFIG, Telemetry, run_daemon};

/// tessera-collector: receives statsd / DogStatsD on this host, pre-aggregates
/// every second and forwards partials to the aggregators that own each shard.
/// See deploy/config/collector.toml for every key.
#[derive(Debug, Parser)]
#[command(name = "tessera-collector", version, about)]
struct Flags {
    #[command(flatten)]
    daemon: DaemonFlags,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    run_daemon("tessera-collector", &flags.daemon, Config::validate, |config: Config, shutdown| async move {
        let placement = match tessera_collector::start_placement(&config).await {
            Ok(placement) => placement,
            Err(error) => {
                tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "cannot load the placement");
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
    })
}
