//! The `tessera-collector` binary: flags, then the library.

use std::process::ExitCode;

use tessera_collector::{Collector, Config, StartError};

/// What `--help` says beside the package description.
const LONG_ABOUT: &str = "tessera-collector: receives statsd / DogStatsD on this host, pre-aggregates every second and \
                          forwards partials to the aggregators that own each shard. See deploy/config/collector.toml for \
                          every key.";

fn main() -> ExitCode {
    tessera_collector::return_large_buffers_when_freed();
    let about = [env!("CARGO_PKG_DESCRIPTION"), LONG_ABOUT];
    tessera_runtime::daemon_main(
        "tessera-collector",
        about,
        |config: &Config| {
            config.validate().map_err(|error| error.to_string())?;
            tessera_runtime::telemetry::web_config::check(config.telemetry.web_config.as_deref())
                .map_err(|error| error.to_string())?;
            Ok::<_, String>(Vec::new())
        },
        |mut config: Config, telemetry, shutdown, config_file| async {
            config.config_file = config_file;
            let placement = tessera_collector::start_placement(&config)
                .await
                .map_err(|error| StartError::setup("cannot load the placement", error))?;
            Collector::start(config, placement, telemetry, shutdown).await?.wait().await;
            Ok(())
        },
    )
}
