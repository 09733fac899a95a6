//! The start-up every daemon binary shares, so that its `main.rs` holds only
//! what is its own.
//!
//! [`DaemonFlags`] are the flags of every daemon (`--config`,
//! `--check-config`, `--log-format`, `--log-level`, `--worker-threads`);
//! [`run_daemon`] loads and validates the configuration (exit code 64 with
//! the file, key and reason when it is bad), answers `--check-config`,
//! starts logging and the async runtime, installs the SIGTERM/SIGINT
//! [`Shutdown`], and runs the daemon.
//!
//! ```no_run
//! use std::process::ExitCode;
//! use clap::Parser;
//! use tessera_runtime::{DaemonFlags, run_daemon};
//!
//! #[derive(Default, serde::Deserialize)]
//! struct Config {}
//!
//! #[derive(Parser)]
//! struct Flags {
//!     #[command(flatten)]
//!     daemon: DaemonFlags,
//! }
//!
//! fn main() -> ExitCode {
//!     let flags = Flags::parse();
//!     let validate = |_: &Config| Ok::<(), String>(());
//!     run_daemon("tessera-example", &flags.daemon, validate, |_config, shutdown| async move {
//!         shutdown.wait().await;
//!         ExitCode::SUCCESS
//!     })
//! }
//! ```

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::config::{EXIT_CONFIG, load_toml};
use crate::logging::{self, LogFormat};
use crate::shutdown::Shutdown;

/// Flags every daemon binary takes (`#[command(flatten)]` them).
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonFlags {
    /// Configuration file (TOML; unknown keys are rejected, every key is
    /// optional unless its documentation says otherwise). Commented examples
    /// are in deploy/config/.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Validate the configuration and exit (0 when it is good, 64 when not).
    #[arg(long)]
    pub check_config: bool,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    pub log_format: LogFormat,
    /// Default log level (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Async worker threads (connections, senders, etcd); hot loops run on
    /// threads of their own.
    #[arg(long, default_value_t = 2)]
    pub worker_threads: usize,
}

/// Loads and validates the configuration, answers `--check-config`, starts
/// logging and the async runtime, and runs `run(config, shutdown)` with a
/// [`Shutdown`] wired to SIGTERM and SIGINT. `name` prefixes error messages.
pub fn run_daemon<C, E, Run, Fut>(
    name: &str,
    flags: &DaemonFlags,
    validate: impl FnOnce(&C) -> Result<(), E>,
    run: Run,
) -> ExitCode
where
    C: DeserializeOwned,
    E: Display,
    Run: FnOnce(C, Shutdown) -> Fut,
    Fut: Future<Output = ExitCode>,
{
    let config: C = match load_toml(flags.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(error) = validate(&config) {
        eprintln!("{name}: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if flags.check_config {
        println!("configuration ok");
        return ExitCode::SUCCESS;
    }
    if let Err(error) = logging::init(flags.log_format, &flags.log_level) {
        eprintln!("{name}: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    // `tessera-collector` -> `collector-io`: every thread is named after its stage, in
    // profiles too; the async workers move bytes on and off the network.
    let io_name = format!("{}-io", name.trim_start_matches("tessera-"));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(flags.worker_threads.max(1))
        .thread_name(io_name)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{name}: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = match Shutdown::from_signals() {
            Ok(shutdown) => shutdown,
            Err(error) => {
                tracing::error!(%error, "cannot install signal handlers");
                return ExitCode::FAILURE;
            }
        };
        run(config, shutdown).await
    })
}

/// A daemon's named thread could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start thread {name}")]
pub struct ThreadError {
    /// The thread's name.
    pub name: String,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Starts a named OS thread (the name shows in `top -H` and in panics).
pub fn spawn_thread(
    name: impl Into<String>,
    body: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, ThreadError> {
    let name = name.into();
    std::thread::Builder::new().name(name.clone()).spawn(body).map_err(|source| ThreadError { name, source })
}
