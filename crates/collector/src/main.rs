//! The `tessera-collector` binary: flags, then the library.

use std::process::ExitCode;

use clap::Parser;
use tessera_collector::{Collector, Config, StartError};
use tessera_runtime::{DaemonFlags, Telemetry, run_daemon};

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
        let placement = tessera_collector::start_placement(&config)
            .await
            .map_err(|error| StartError::setup("cannot load the placement", error))?;
        let telemetry = Telemetry::new("collector", env!("CARGO_PKG_VERSION"));
        Collector::start(config, placement, telemetry, shutdown).await?.wait().await;
        Ok(())
    })
}
