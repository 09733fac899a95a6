//! The `tessera-aggregator` binary: flags, then the library.

use std::process::ExitCode;

use clap::Parser;
use tessera_aggregator::{Aggregator, Config};
use tessera_runtime::{DaemonFlags, Telemetry, run_daemon};

/// tessera-aggregator: merges collectors' 1 s partials for the shards it
/// owns into 10 s and 1 min tiles and flushes each closed tile to an ingester.
/// `instance_id`, `[placement]` and `ingester.endpoints` (or
/// `[ingester.placement]`) are required in the configuration.
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
        Aggregator::start(config, telemetry, shutdown).await?.wait().await;
        Ok(())
    })
}
