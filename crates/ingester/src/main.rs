//! The `tessera-ingester` binary: flags, then the library.

use std::process::ExitCode;

use clap::Parser;
use tessera_ingester::{Config, Ingester};
use tessera_runtime::{DaemonFlags, Telemetry, run_daemon};

/// tessera-ingester: takes the aggregators' tile batches, makes them durable in a disk
/// queue, and writes them to storage (Prometheus remote write or OpenMetrics files) at
/// the pace storage sustains. Every key is documented in crates/ingester/README.md.
#[derive(Debug, Parser)]
#[command(name = "tessera-ingester", version, about)]
struct Flags {
    #[command(flatten)]
    daemon: DaemonFlags,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    run_daemon("tessera-ingester", &flags.daemon, Config::validate, |config: Config, shutdown| async move {
        let telemetry = Telemetry::new("ingester", env!("CARGO_PKG_VERSION"));
        Ingester::start(config, telemetry, shutdown).await?.wait().await;
        Ok(())
    })
}
