//! What every tessera daemon shares, so that each daemon's `main.rs` stays short: parse
//! flags, load config, start telemetry, run the library, drain on SIGTERM.
//!
//! - [`telemetry`]: a [`Telemetry`] handle owning the Prometheus registry (with
//!   `tessera_build_info`, `tessera_<daemon>_up` and the `process_*` metrics already in it),
//!   a [`Readiness`] flag made of named conditions, and [`serve`], the HTTP endpoint with
//!   `/metrics`, `/healthz`, `/readyz` and `/debug/pprof/profile`.
//! - [`daemon`]: [`run_daemon`] with [`DaemonFlags`], and the one [`StartError`].
//! - [`logging`]: [`logging::init`] (text or JSON to stderr, `RUST_LOG` overrides the
//!   default level) and [`RateLimitedLog`] for bad input on hot paths.
//! - [`shutdown`]: [`Shutdown`], one cloneable signal triggered by SIGTERM / SIGINT or by
//!   code, awaited by tasks and polled by plain threads.
//! - [`config`]: [`config::load_toml`] and [`EXIT_CONFIG`], the exit code for bad config.
//! - [`failpoint`]: named waits a test can switch on (`TESSERA_FAILPOINTS`) to force a race.
//!
//! The wire between daemons (inbound and outbound sides, the exchange, the backoff) is
//! its own crate, `tessera-wire`.
//!
//! # Example
//!
//! A daemon's `main.rs` (a collector here):
//!
//! ```no_run
//! use std::process::ExitCode;
//! use tessera_runtime::{EXIT_CONFIG, LogFormat, Readiness, Shutdown, Telemetry, config, logging};
//!
//! #[derive(Default, serde::Deserialize)]
//! #[serde(default, deny_unknown_fields)]
//! struct Config {
//!     /// Where `/metrics`, `/healthz` and `/readyz` are served.
//!     telemetry_listen_address: Option<std::net::SocketAddr>,
//! }
//!
//! #[tokio::main]
//! async fn main() -> ExitCode {
//!     let config_path: Option<std::path::PathBuf> = std::env::args_os().nth(1).map(Into::into);
//!     let config: Config = match config::load_toml(config_path.as_deref()) {
//!         Ok(config) => config,
//!         Err(error) => {
//!             eprintln!("error: {error}");
//!             return ExitCode::from(EXIT_CONFIG);
//!         }
//!     };
//!     logging::init(LogFormat::Text, "info").expect("logging is initialised once, first");
//!     let shutdown = Shutdown::from_signals().expect("signal handlers install at start-up");
//!     let telemetry = Telemetry::new("collector", env!("CARGO_PKG_VERSION"));
//!     let readiness = Readiness::new();
//!     let listening = readiness.condition("listening");
//!     let address = config.telemetry_listen_address.unwrap_or(([127, 0, 0, 1], 9125).into());
//!     let server = tessera_runtime::serve(address, telemetry.clone(), readiness.clone(), shutdown.clone())
//!         .await
//!         .expect("telemetry address is free");
//!     tracing::info!(address = %server.local_addr(), "telemetry endpoint up");
//!     listening.mark_ready();
//!     shutdown.wait().await; // the daemon's library would run here, taking `shutdown`
//!     let _ = server.stopped().await;
//!     ExitCode::SUCCESS
//! }
//! ```

pub mod backoff;
pub mod config;
pub mod daemon;
pub mod failpoint;
pub mod logging;
pub mod memory;
pub mod shutdown;
pub mod telemetry;
pub mod tls;

pub use backoff::{Backoff, sleep_or_stop};
pub use config::{ConfigError, EXIT_CONFIG, file_stamp};
pub use daemon::{DaemonFlags, StartError, daemon_main, run_daemon};
pub use logging::{LogFormat, RateLimitedLog};
#[doc(hidden)]
pub use prometheus_client as __prometheus_client;
pub use shutdown::Shutdown;
pub use telemetry::{Readiness, ReadinessCondition, ServeError, ServerHandle, Telemetry, serve};
