//! The start-up every daemon binary shares, so that its `main.rs` holds only
//! what is its own.
//!
//! [`DaemonFlags`] are the flags of every daemon (`--config`,
//! `--check-config`, `--log-format`, `--log-level`, `--worker-threads`);
//! [`run_daemon`] loads and validates the configuration (exit code 64 with
//! the file, key and reason when it is bad), answers `--check-config`,
//! starts logging and the async runtime, installs the SIGTERM/SIGINT
//! [`Shutdown`], and runs the daemon. A daemon that cannot start says why
//! with one [`StartError`], whose [`exit_code`](StartError::exit_code) is 64
//! when the configuration, or what it names (a placement), is at fault, and 1
//! otherwise: the same in every daemon.
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
//!     let validate = |_: &Config| Ok::<Vec<String>, String>(Vec::new());
//!     run_daemon("tessera-example", &flags.daemon, validate, |_config, shutdown| async move {
//!         shutdown.wait().await;
//!         Ok(())
//!     })
//! }
//! ```

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::config::{EXIT_CONFIG, InvalidSetting, load_toml};
use crate::logging::{self, LogFormat};
use crate::shutdown::Shutdown;
use crate::telemetry::Telemetry;

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

/// Why a daemon could not start: the same kinds in every daemon.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration cannot work (exit 64).
    #[error(transparent)]
    Config(#[from] InvalidSetting),
    /// What the configuration names could not be had, e.g. a placement (exit 64).
    #[error("{what}")]
    Setup {
        /// What was being set up.
        what: String,
        /// Why not.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A listener could not bind.
    #[error("cannot listen on {what}")]
    Bind {
        /// Which listener and address.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A thread could not start.
    #[error(transparent)]
    Thread(#[from] ThreadError),
    /// The telemetry endpoint could not start.
    #[error("cannot serve telemetry")]
    Telemetry(#[from] crate::telemetry::ServeError),
    /// The telemetry web config cannot be used (exit 64).
    #[error(transparent)]
    WebConfig(#[from] crate::telemetry::web_config::WebConfigError),
    /// A part of the daemon's own could not start (a queue, a sink).
    #[error("{what}")]
    Failed {
        /// What failed.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StartError {
    /// What the configuration names could not be had.
    pub fn setup(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> StartError {
        StartError::Setup { what: what.into(), source: Box::new(source) }
    }

    /// A part of the daemon's own failed.
    pub fn failed(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> StartError {
        StartError::Failed { what: what.into(), source: Box::new(source) }
    }

    /// A listener at `address` could not bind.
    pub fn bind(what: impl Display, source: std::io::Error) -> StartError {
        StartError::Bind { what: what.to_string(), source }
    }

    /// 64 when the configuration, or what it names, is at fault; 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            StartError::Config(_) | StartError::Setup { .. } | StartError::WebConfig(_) => ExitCode::from(EXIT_CONFIG),
            _ => ExitCode::FAILURE,
        }
    }
}

/// The whole `main` of the daemon binary `name` (`tessera-<daemon>`): parses the
/// [`DaemonFlags`] (`-h` shows `about`, `--help` also `long_about`), then [`run_daemon`]
/// with a fresh [`Telemetry`] registry for the daemon, handed to `start` with the
/// configuration, the shutdown, and the `--config` file it was read from (what reloads
/// from it needs the path; `None` on the embedded defaults).
pub fn daemon_main<C, E, Start, Fut>(
    name: &'static str,
    [about, long_about]: [&'static str; 2],
    validate: impl FnOnce(&C) -> Result<Vec<String>, E>,
    start: Start,
) -> ExitCode
where
    C: DeserializeOwned,
    E: Display,
    Start: FnOnce(C, Telemetry, Shutdown, Option<PathBuf>) -> Fut,
    Fut: Future<Output = Result<(), StartError>>,
{
    use clap::{Args, FromArgMatches};

    let daemon = name.trim_start_matches("tessera-");
    let command = DaemonFlags::augment_args(clap::Command::new(name));
    let command = command.version(env!("CARGO_PKG_VERSION")).about(about).long_about(long_about);
    let flags = match command.try_get_matches() {
        Ok(matches) => DaemonFlags::from_arg_matches(&matches),
        Err(error) => Err(error),
    };
    let flags = flags.unwrap_or_else(|error| error.exit());
    let config_file = flags.config.clone();
    run_daemon(name, &flags, validate, |config, shutdown| {
        start(config, Telemetry::new(daemon, env!("CARGO_PKG_VERSION")), shutdown, config_file)
    })
}

/// Loads and validates the configuration (`validate` returns its warnings: printed by
/// `--check-config`, logged at start), answers `--check-config`, starts
/// logging and the async runtime, and runs `run(config, shutdown)` with a
/// [`Shutdown`] wired to SIGTERM and SIGINT: it returns once the daemon has
/// stopped, or why it could not start (logged, and the exit code from
/// [`StartError::exit_code`]). `name` prefixes error messages.
pub fn run_daemon<C, E, Run, Fut>(
    name: &str,
    flags: &DaemonFlags,
    validate: impl FnOnce(&C) -> Result<Vec<String>, E>,
    run: Run,
) -> ExitCode
where
    C: DeserializeOwned,
    E: Display,
    Run: FnOnce(C, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), StartError>>,
{
    let config: C = match load_toml(flags.config.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let warnings = match validate(&config) {
        Ok(warnings) => warnings,
        Err(error) => {
            eprintln!("{name}: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if flags.check_config {
        for warning in &warnings {
            eprintln!("{name}: warning: {warning}");
        }
        println!("configuration ok");
        return ExitCode::SUCCESS;
    }
    if let Err(error) = logging::init(flags.log_format, &flags.log_level) {
        eprintln!("{name}: {error}");
        return ExitCode::from(EXIT_CONFIG);
    }
    for warning in warnings {
        tracing::warn!(warning, "configuration");
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
        match run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(error = %crate::logging::error_chain(&error), "{name} failed to start");
                error.exit_code()
            }
        }
    })
}

/// This host's name, for a default instance id; `fallback` when it cannot be read.
pub fn hostname(fallback: &str) -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| fallback.to_owned())
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
