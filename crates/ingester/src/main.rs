//! The `tessera-ingester` binary: flags, then the library.

use std::process::ExitCode;

use tessera_ingester::{Config, Ingester};

/// What `--help` says beside the package description.
const LONG_ABOUT: &str = "tessera-ingester: takes the aggregators' tile batches, makes them durable in a disk queue, \
                          and writes them to storage (Prometheus remote write or OpenMetrics files) at the pace storage \
                          sustains. Every key is documented in crates/ingester/README.md.";

fn main() -> ExitCode {
    let about = [env!("CARGO_PKG_DESCRIPTION"), LONG_ABOUT];
    tessera_runtime::daemon_main(
        "tessera-ingester",
        about,
        |config: &Config| {
            config.validate().map_err(|error| error.to_string())?;
            tessera_runtime::telemetry::web_config::check(config.telemetry.web_config.as_deref())
                .map_err(|error| error.to_string())?;
            Ok::<_, String>(config.warnings())
        },
        |config: Config, telemetry, shutdown, _config_file| async {
            Ingester::start(config, telemetry, shutdown).await?.wait().await;
            Ok(())
        },
    )
}
