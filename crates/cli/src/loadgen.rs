//! `tessera loadgen`: a statsd / DogStatsD load generator for measuring
//! tessera and its peers (brubeck, statsd) on one machine.
//!
//! It sends lines of `--series` distinct series, typed by `--mix`, to a UDP
//! address, a Unix datagram socket or a TCP address, from `--senders`
//! threads with a socket each, flat out or at `--rate-lines-per-sec`, for
//! `--duration-secs`, exactly `--total-lines` lines, or until interrupted.
//! At the end it prints what it handed to the kernel and, per type, what a
//! receiver should have aggregated; `--expect-out` writes that per series.
//!
//! - [`workload`]: series names, line format, packing into datagrams, and
//!   the per-sender line sources (precomputed cycle or on-the-fly);
//! - [`order`]: which series each line carries (`--order`: sequential,
//!   random or zipf) and what each series got after a number of lines;
//! - [`send`]: one sender thread: socket, pacing, `sendmmsg`, error counts;
//! - [`expect`]: the expected counter sums, gauge last values, set
//!   cardinalities and timer counts;
//! - [`report`]: the final text or JSON report;
//! - [`verify`]: with `--verify`, reads the counters back from the sink and
//!   compares them with [`expect`]'s table.
//!
//! ```text
//! tessera loadgen --target 127.0.0.1:8125 --series 10000 --senders 2 \
//!     --rate-lines-per-sec 2000000 --duration-secs 10 --tags 3 --json --expect-out expected.tsv
//! ```

use std::io::Write;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

mod expect;
mod mix;
mod order;
mod report;
mod send;
mod sendmmsg;
#[cfg(test)]
mod tests;
mod verify;
mod workload;

use mix::Mix;
use order::{Order, OrderName};
use report::Summary;
use send::{Connection, SenderPlan, SenderProgress, Target};
use tessera_core::parse::MetricKind;
use workload::{Workload, WorkloadConfig};

/// The largest payload of a UDP datagram over IPv4.
const MAX_UDP_PAYLOAD_BYTES: usize = 65_507;

/// Flags of `tessera loadgen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to send to, `host:port`: UDP, or TCP with `--tcp`.
    #[arg(long, default_value = "127.0.0.1:8125")]
    target: String,
    /// Send to this Unix datagram socket instead of `--target`.
    #[arg(long, value_name = "PATH", conflicts_with = "tcp")]
    unix: Option<PathBuf>,
    /// Send newline-terminated lines over one TCP connection per sender.
    #[arg(long)]
    tcp: bool,
    /// Lines per second across all senders; 0 or absent sends flat out.
    #[arg(long, value_name = "N")]
    rate_lines_per_sec: Option<u64>,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, value_name = "SECS")]
    duration_secs: Option<f64>,
    /// Stop after exactly this many lines. With neither this nor
    /// `--duration-secs`, run until interrupted (Ctrl-C, SIGTERM).
    #[arg(long, value_name = "N")]
    total_lines: Option<u64>,
    /// Distinct series, named `loadgen.<type>.<i>`, sent in a fixed cycle
    /// so that each gets an equal share of the lines.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    series: u64,
    /// Number the series from N: `loadgen.<type>.<N + i>`. Runs with different offsets send
    /// different series, so a sequence of runs makes series churn (new ones appear, old ones
    /// go idle and expire).
    #[arg(long, value_name = "N", default_value_t = 0)]
    series_offset: u64,
    /// Relative weights of the metric types among the series
    /// (counter, gauge, timer, histogram, distribution, set).
    #[arg(long, default_value_t = Mix::default())]
    mix: Mix,
    /// DogStatsD tags per line, `|#k0:v<i>,k1:v<i>,...` for series `i`.
    #[arg(long, value_name = "N", default_value_t = 0)]
    tags: u32,
    /// Sample rate for counters, timers and histograms (`|@R`), in (0, 1].
    #[arg(long, value_name = "R")]
    sample_rate: Option<f64>,
    /// Pack lines into datagrams of at most this many bytes; a longer line
    /// goes alone, so 1 sends one line per datagram.
    #[arg(long, value_name = "BYTES", default_value_t = 1400)]
    datagram_bytes: usize,
    /// Sender threads, each with its own socket (source port), an equal
    /// share of the rate and its own range of the series.
    #[arg(long, value_name = "N", default_value_t = 1)]
    senders: usize,
    /// Order in which each sender visits its series: `sequential` (insertion
    /// order, which flatters the receiver's cache), `random` or `zipf`.
    ///
    /// Real traffic does not arrive in the order its series were first seen,
    /// but `sequential` sends them in that order in every pass (0, 1, 2, ...),
    /// which flatters a receiver that keeps its series in arrival order: every
    /// pass reads its slots front to back, as they were filled, from the cache
    /// or prefetched. `random` sends the lines of each pass in a seeded
    /// permutation (each pass of a cycle its own), every series once; `zipf`
    /// draws each line's series from a Zipf distribution over the sender's
    /// series (its first is the most frequent): a few hot series and a long
    /// cold tail.
    #[arg(long, value_enum, default_value_t = OrderName::Sequential)]
    order: OrderName,
    /// Exponent `s` of `--order zipf`: series of rank `r` gets a share of
    /// the lines proportional to `1 / r^s`.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    zipf_exponent: f64,
    /// Seed of the gauge, timer and distribution values and of the random
    /// and zipf orders.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct values (gauge values, timer samples, set members) each
    /// series cycles through.
    #[arg(long, value_name = "N", default_value_t = 4)]
    values_per_series: u32,
    /// Memory for precomputed datagrams, across senders; a sender whose
    /// cycle does not fit its share formats lines on the fly instead.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    max_cycle_bytes: usize,
    /// Send buffer of each socket (SO_SNDBUF); the kernel default if absent.
    #[arg(long, value_name = "BYTES")]
    send_buffer_bytes: Option<usize>,
    /// Print the totals so far every second, on stderr.
    #[arg(long)]
    progress: bool,
    /// Print the final report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the expected statistic of every series sent (TSV) to this file.
    #[arg(long, value_name = "FILE")]
    expect_out: Option<PathBuf>,
    /// After the run, read the counters back from the sink and report loss:
    /// `prometheus=http://host:port` or `files=DIR` (the file sink's
    /// OpenMetrics directory, e.g. tessera-data/openmetrics).
    #[arg(long, value_name = "SINK", value_parser = verify::parse_sink)]
    verify: Option<verify::VerifySink>,
    /// Resolution whose series `--verify` reads, where the store holds several (their
    /// samples carry a `resolution` label); by default the series with no such label, as a
    /// store of one resolution (the default) has them.
    #[arg(long, value_name = "RESOLUTION")]
    verify_resolution: Option<String>,
    /// How long `--verify` waits for the sink to show everything.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    verify_timeout_secs: u64,
}

/// A validated run.
#[derive(Debug)]
pub struct Config {
    target: Target,
    workload: Arc<Workload>,
    senders: usize,
    lines_per_sec: Option<u64>,
    duration: Option<Duration>,
    total_lines: Option<u64>,
    max_cycle_bytes: usize,
    send_buffer_bytes: Option<usize>,
    progress: bool,
}

impl Config {
    /// Checks the flags and builds the workload.
    pub fn from_args(args: &Args) -> anyhow::Result<Config> {
        ensure!(args.series > 0, "--series must be at least 1");
        ensure!(args.senders > 0, "--senders must be at least 1");
        ensure!(
            args.senders as u64 <= args.series,
            "--senders {} exceeds --series {}: each sender needs a series of its own",
            args.senders,
            args.series
        );
        ensure!(args.datagram_bytes > 0, "--datagram-bytes must be at least 1");
        ensure!(args.values_per_series > 0, "--values-per-series must be at least 1");
        ensure!(
            args.tags as usize <= tessera_core::parse::MAX_TAGS,
            "--tags {} exceeds the {} tags a line may carry",
            args.tags,
            tessera_core::parse::MAX_TAGS
        );
        if let Some(rate) = args.sample_rate {
            ensure!(rate > 0.0 && rate <= 1.0, "invalid sample rate `{rate}`: expected a number in (0, 1]");
        }
        let order = match args.order {
            OrderName::Sequential => Order::Sequential,
            OrderName::Random => Order::Random,
            OrderName::Zipf => {
                ensure!(
                    args.zipf_exponent > 0.0 && args.zipf_exponent.is_finite(),
                    "invalid --zipf-exponent `{}`: expected a number above 0",
                    args.zipf_exponent
                );
                Order::Zipf { exponent: args.zipf_exponent }
            }
        };
        let duration = match args.duration_secs {
            Some(secs) if !(secs > 0.0 && secs.is_finite()) => bail!("invalid --duration-secs `{secs}`"),
            Some(secs) => Some(Duration::from_secs_f64(secs)),
            None => None,
        };
        let target = match (&args.unix, args.tcp) {
            (Some(path), _) => Target::Unix(path.clone()),
            (None, tcp) => {
                let address = args
                    .target
                    .to_socket_addrs()
                    .with_context(|| format!("invalid --target `{}`", args.target))?
                    .next()
                    .with_context(|| format!("--target `{}` resolves to no address", args.target))?;
                if tcp {
                    Target::Tcp(address)
                } else {
                    ensure!(
                        args.datagram_bytes <= MAX_UDP_PAYLOAD_BYTES,
                        "--datagram-bytes {} exceeds the largest UDP payload, {MAX_UDP_PAYLOAD_BYTES} bytes",
                        args.datagram_bytes
                    );
                    Target::Udp(address)
                }
            }
        };
        let workload = Workload::new(&WorkloadConfig {
            series: args.series,
            mix: args.mix.clone(),
            tags_per_line: args.tags,
            sample_rate: args.sample_rate,
            values_per_series: args.values_per_series,
            seed: args.seed,
            max_datagram_bytes: args.datagram_bytes,
            series_offset: args.series_offset,
            order,
        });
        Ok(Config {
            target,
            workload: Arc::new(workload),
            senders: args.senders,
            lines_per_sec: args.rate_lines_per_sec.filter(|rate| *rate > 0),
            duration,
            total_lines: args.total_lines,
            max_cycle_bytes: args.max_cycle_bytes,
            send_buffer_bytes: args.send_buffer_bytes,
            progress: args.progress,
        })
    }
}

/// Runs `tessera loadgen`: exits 64 on bad flags, 1 when a sender failed.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = match Config::from_args(&args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("tessera loadgen: {error:#}");
            return Ok(ExitCode::from(64));
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let _signals = stop_on_signal(&stop)?;
    let baseline = match &args.verify {
        Some(sink) => {
            Some(verify::counter_total(sink, args.verify_resolution.as_deref()).context("reading the baseline")?)
        }
        None => None,
    };
    let summary = execute(&config, &stop)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", summary.to_json())?;
    } else {
        write!(out, "{}", summary.to_text())?;
    }
    if let Some(path) = &args.expect_out {
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut file = std::io::BufWriter::new(file);
        expect::write_tsv(&mut file, &config.workload, &summary.lines_by_sender)
            .and_then(|()| file.flush())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let (Some(sink), Some(baseline)) = (&args.verify, baseline) {
        let expected: f64 = summary
            .types
            .iter()
            .filter(|totals| totals.kind == MetricKind::Counter)
            .map(|totals| totals.expected)
            .sum();
        let timeout = Duration::from_secs(args.verify_timeout_secs);
        let verdict = verify::wait_for(sink, args.verify_resolution.as_deref(), baseline, expected, timeout)?;
        writeln!(out, "{}", verdict.to_text())?;
        if verdict.lost() > 0.0 {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(if summary.error.is_some() { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Opens the sockets, runs the senders until done or `stop` is set, and
/// sums up what they sent.
pub fn execute(config: &Config, stop: &Arc<AtomicBool>) -> anyhow::Result<Summary> {
    let senders = config.senders;
    let series_count = config.workload.series_count();
    let mut plans = Vec::with_capacity(senders);
    let mut connections = Vec::with_capacity(senders);
    for sender in 0..senders {
        let series = config.workload.sender_series(sender, senders);
        let share = (series.end - series.start) as f64 / series_count as f64;
        plans.push(SenderPlan {
            lines_per_sec: config.lines_per_sec.map(|rate| rate as f64 * share),
            total_lines: config.total_lines.map(|total| config.workload.sender_total_lines(&series, total)),
            duration: config.duration,
            max_cycle_bytes: (config.max_cycle_bytes as f64 * share) as usize,
            series,
        });
        let connection = Connection::open(&config.target, config.send_buffer_bytes).with_context(|| {
            format!("opening sender {sender}'s socket to {} {}", config.target.transport(), config.target.address())
        })?;
        connections.push(connection);
    }
    let progress: Arc<[SenderProgress]> = (0..senders).map(|_| SenderProgress::default()).collect();
    let start = Arc::new(Barrier::new(senders + 1));
    let (done_sender, done) = mpsc::channel();
    let mut threads = Vec::with_capacity(senders);
    for (sender, (plan, connection)) in plans.into_iter().zip(connections).enumerate() {
        let (workload, start, stop, progress) =
            (Arc::clone(&config.workload), Arc::clone(&start), Arc::clone(stop), Arc::clone(&progress));
        let done_sender = done_sender.clone();
        let thread = std::thread::Builder::new()
            .name(format!("loadgen-{sender}"))
            .spawn(move || {
                let report = send::run_sender(&workload, &plan, connection, &start, &stop, &progress[sender]);
                let _ = done_sender.send(());
                report
            })
            .context("spawning a sender thread")?;
        threads.push(thread);
    }
    drop(done_sender);
    start.wait();
    let started = Instant::now();
    let mut running = senders;
    let mut next_tick = started + Duration::from_secs(1);
    let mut last_lines = 0;
    while running > 0 {
        match done.recv_timeout(next_tick.saturating_duration_since(Instant::now())) {
            Ok(()) => running -= 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if config.progress {
                    last_lines = print_progress(&progress, started, last_lines);
                }
                next_tick += Duration::from_secs(1);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let elapsed = started.elapsed();
    let mut summary = Summary {
        target: config.target.clone(),
        senders,
        series: series_count,
        target_lines_per_sec: config.lines_per_sec,
        elapsed,
        lines: 0,
        datagrams: 0,
        bytes: 0,
        errors: send::SendErrors::default(),
        lines_by_sender: Vec::with_capacity(senders),
        precomputed_senders: 0,
        types: Vec::new(),
        error: None,
    };
    for (sender, thread) in threads.into_iter().enumerate() {
        let report = thread.join().map_err(|_| anyhow::anyhow!("sender {sender} panicked"))?;
        summary.lines += report.lines;
        summary.datagrams += report.datagrams;
        summary.bytes += report.bytes;
        summary.errors.add(&report.errors);
        summary.lines_by_sender.push(report.lines);
        summary.precomputed_senders += usize::from(report.precomputed);
        if let Some(error) = report.failure {
            summary.error.get_or_insert_with(|| format!("sender {sender}: {error}"));
        }
    }
    summary.types = report::type_totals(&config.workload, &summary.lines_by_sender);
    Ok(summary)
}

/// Prints one progress line on stderr; returns the lines sent so far.
fn print_progress(progress: &[SenderProgress], started: Instant, last_lines: u64) -> u64 {
    let sum = |field: fn(&SenderProgress) -> u64| progress.iter().map(field).sum::<u64>();
    let lines = sum(|p| p.lines.load(Ordering::Relaxed));
    eprintln!(
        "loadgen: {:.1} s, {lines} lines ({} lines/s), {} datagrams, {} bytes, {} send errors",
        started.elapsed().as_secs_f64(),
        lines - last_lines,
        sum(|p| p.datagrams.load(Ordering::Relaxed)),
        sum(|p| p.bytes.load(Ordering::Relaxed)),
        sum(|p| p.errors.load(Ordering::Relaxed)),
    );
    lines
}

/// Sets `stop` on SIGINT or SIGTERM, so an interrupted run still reports.
/// The returned runtime thread lives as long as the process.
fn stop_on_signal(stop: &Arc<AtomicBool>) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_io().build().context("starting signal runtime")?;
    let (mut interrupt, mut terminate) = {
        let _entered = runtime.enter();
        let interrupt = signal(SignalKind::interrupt()).context("watching SIGINT")?;
        let terminate = signal(SignalKind::terminate()).context("watching SIGTERM")?;
        (interrupt, terminate)
    };
    let stop = Arc::clone(stop);
    std::thread::Builder::new()
        .name("loadgen-signals".to_owned())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
            stop.store(true, Ordering::Relaxed);
        })
        .context("spawning the signal thread")
}
