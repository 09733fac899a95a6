//! The `tessera` command: tools around the tessera pipeline.
//!
//! Subcommands live in their own modules; `main` only parses flags and
//! dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod loadgen;
mod local;
mod placement;

/// tessera: a statsd / DogStatsD metrics pipeline.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run collector, aggregator and ingester in one process on this
    /// machine (statsd on 127.0.0.1:8125, OpenMetrics files or remote
    /// write over http or https, with basic auth, a bearer token or
    /// headers), showing live rates and end-to-end latency.
    Local(Box<local::Args>),
    /// Parse statsd lines (from files or stdin) and show how tessera reads
    /// each one: series id, type, values, shard, or why it is rejected.
    Check(check::Args),
    /// Send statsd / DogStatsD lines at a set rate (or flat out) over UDP,
    /// a Unix datagram socket or TCP, and report what was sent and what a
    /// receiver should have aggregated.
    Loadgen(loadgen::Args),
    /// Read and change the aggregator placement in etcd: init, show, add,
    /// remove, replace, finalize.
    Placement(placement::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Local(args) => local::run(*args),
        Command::Check(args) => check::run(args),
        Command::Loadgen(args) => loadgen::run(args),
        Command::Placement(args) => placement::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tessera: {error:#}");
            ExitCode::FAILURE
        }
    }
}
