//! The `tessera-aggregator` binary: flags, then the library.

use std::process::ExitCode;

use tessera_aggregator::{Aggregator, Config};

/// What `--help` says beside the package description.
const LONG_ABOUT: &str = "tessera-aggregator: merges collectors' 1 s partials for the shards it owns into 10 s and \
                          1 min tiles and flushes each closed tile to an ingester. `instance_id`, `[placement]` and \
                          `ingester.endpoints` (or `[ingester.placement]`) are required in the configuration.";

fn main() -> ExitCode {
    let about = [env!("CARGO_PKG_DESCRIPTION"), LONG_ABOUT];
    tessera_runtime::daemon_main(
        "tessera-aggregator",
        about,
        |config: &Config| {
            config.validate().map_err(|error| error.to_string())?;
            tessera_runtime::telemetry::web_config::check(config.telemetry.web_config.as_deref())
                .map_err(|error| error.to_string())?;
            Ok::<_, String>(Vec::new())
        },
        |config: Config, telemetry, shutdown, _config_file| async {
            Aggregator::start(config, telemetry, shutdown).await?.wait().await;
            Ok(())
        },
    )
}
