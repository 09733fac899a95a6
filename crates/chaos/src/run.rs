//! One campaign: start the cluster, send the workload, apply the schedule, heal, wait
//! for the last tiles, read the store back and check every series.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_core::clock::now_ms;
use tessera_testkit::graphite::Carbon;

use crate::check::{
    Excuse, Observed, Report, Resolution, Samples, Writers, check, check_writers, resolutions_in, tile_end,
};
use crate::cluster::{Cluster, Settings, send_signal};
use crate::proxy::Mode;
use crate::schedule::{Daemon, Fault, LinkFault, Scheduled, Shape, StoreFault};
use crate::workload::{Kind, Round, Sender, Workload};

/// What a campaign runs.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The seed of the schedule.
    pub seed: u64,
    /// How long the workload is sent (faults end `QUIET_TAIL` before).
    pub duration: Duration,
    /// How many of each daemon.
    pub shape: Shape,
    /// The aggregators' storage policies.
    pub policies: Vec<String>,
    /// The policy written to a real carbon-cache through the Graphite target (and checked
    /// from its whisper files, per tile) instead of Prometheus, if any.
    pub graphite: Option<String>,
    /// The liveness lease TTL of aggregators and ingesters.
    pub ttl_secs: u64,
    /// The ingesters' lease TTL, when it differs from the aggregators' (`ttl_secs`).
    pub ingester_ttl_secs: Option<u64>,
    /// Series of each kind.
    pub series_per_kind: u64,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// The run's directory (configs, data, logs).
    pub dir: PathBuf,
    /// The faults, as drawn from the seed or given.
    pub schedule: Vec<Scheduled>,
    /// Start sending on a multiple of this many ms (a tile boundary), so that a
    /// scripted schedule's offsets fall where it means them.
    pub align_ms: Option<i64>,
    /// Busy processes to run beside the cluster, each spinning on a core.
    pub busy_neighbours: usize,
}

/// A fault as it was applied.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The fault.
    pub fault: Scheduled,
    /// When it began (unix ms).
    pub began_ms: i64,
    /// When it ended (unix ms): the restart, SIGCONT, or the proxy back to passing.
    pub ended_ms: i64,
    /// When a restarted collector was ready again.
    pub ready_ms: Option<i64>,
    /// Why it could not be applied as drawn, if so.
    pub note: Option<String>,
}

/// What a campaign found.
#[derive(Debug)]
pub struct Outcome {
    /// The checker's report.
    pub report: Report,
    /// Faults as applied.
    pub applied: Vec<Applied>,
    /// The followed counters, summed over the daemons and their lives.
    pub counters: Vec<(String, f64)>,
    /// Failures the checker does not see in the store: conflicting copies of a tile,
    /// a daemon that died by itself.
    pub failures: Vec<String>,
    /// Rounds sent.
    pub rounds: usize,
}

impl Outcome {
    /// No lost, doubled or wrong series and no other failure.
    pub fn passed(&self) -> bool {
        self.report.violations.is_empty() && self.failures.is_empty()
    }
}

enum Step {
    Begin(usize),
    End(usize),
}

/// Runs the campaign; errors are failures to run it, not violations.
pub fn run(campaign: &Campaign, log: &mut dyn FnMut(&str)) -> anyhow::Result<Outcome> {
    let resolutions = resolutions_in(&campaign.policies, campaign.graphite.as_deref())?;
    std::fs::create_dir_all(&campaign.dir)?;
    let mut cluster = Cluster::start(Settings {
        shape: campaign.shape,
        policies: campaign.policies.clone(),
        graphite: campaign.graphite.clone(),
        ttl_secs: campaign.ttl_secs,
        ingester_ttl_secs: campaign.ingester_ttl_secs,
        bin_dir: campaign.bin_dir.clone(),
        dir: campaign.dir.clone(),
    })?;
    log(&format!("cluster ready in {}", campaign.dir.display()));
    let workload = Workload { series_per_kind: campaign.series_per_kind, collectors: campaign.shape.collectors };
    let _neighbours = BusyNeighbours::start(campaign.busy_neighbours)?;
    if let Some(align_ms) = campaign.align_ms {
        let wait = align_ms - now_ms().rem_euclid(align_ms);
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    let sender = Sender::start(workload, cluster.statsd.clone())?;
    let started = Instant::now();

    let mut steps: Vec<(Duration, Step)> = Vec::new();
    for (n, fault) in campaign.schedule.iter().enumerate() {
        steps.push((fault.at, Step::Begin(n)));
        steps.push((fault.ends(), Step::End(n)));
    }
    steps.sort_by_key(|(at, step)| (*at, matches!(step, Step::Begin(_))));
    let mut applied: Vec<Applied> = campaign
        .schedule
        .iter()
        .map(|fault| Applied { fault: *fault, began_ms: 0, ended_ms: 0, ready_ms: None, note: None })
        .collect();
    let mut watch = Watch::default();
    watch.scrape(&mut cluster);
    let mut last_scrape = Instant::now();
    for (at, step) in steps {
        while started.elapsed() < at {
            std::thread::sleep((at - started.elapsed()).min(Duration::from_millis(200)));
            if last_scrape.elapsed() >= Duration::from_secs(2) {
                watch.scrape(&mut cluster);
                last_scrape = Instant::now();
            }
        }
        match step {
            Step::Begin(n) => {
                applied[n].began_ms = now_ms();
                applied[n].note = begin(&mut cluster, &applied[n].fault.fault).err().map(|error| format!("{error:#}"));
                log(&format!("{:>7.1}s begin {}", started.elapsed().as_secs_f64(), applied[n].fault.fault));
            }
            Step::End(n) => {
                applied[n].ended_ms = now_ms();
                match end(&mut cluster, &applied[n].fault.fault) {
                    Ok(ready) => applied[n].ready_ms = ready,
                    Err(error) => watch.failures.push(format!("ending `{}`: {error:#}", applied[n].fault.fault)),
                }
                log(&format!("{:>7.1}s end   {}", started.elapsed().as_secs_f64(), applied[n].fault.fault));
            }
        }
    }
    while started.elapsed() < campaign.duration {
        std::thread::sleep(Duration::from_millis(200).min(campaign.duration - started.elapsed()));
        if last_scrape.elapsed() >= Duration::from_secs(2) {
            watch.scrape(&mut cluster);
            last_scrape = Instant::now();
        }
    }
    let ledger = sender.finish();
    log(&format!("sent {} rounds; waiting for the last tiles", ledger.len()));

    let waited = wait_for_last_tiles(&mut cluster, &resolutions, &ledger, campaign)?;
    log(&format!("last tiles in after {:.1}s", waited.as_secs_f64()));
    watch.scrape(&mut cluster);
    let (observed, writers) = read_back(&cluster, &resolutions, &ledger, campaign.series_per_kind)?;
    let mut excuses = excuses(&applied);
    excuses.extend(watch.kernel_drops.iter().cloned());
    let mut report = check(&workload, &ledger, &resolutions, &excuses, &observed);
    report.violations.extend(check_writers(&writers));
    write_evidence(&campaign.dir, &report, &observed, &ledger, &applied, &excuses)?;
    let mut counters = Vec::new();
    for followed in crate::cluster::FOLLOWED {
        let total: f64 = cluster.processes_mut().map(|process| process.counter(followed)).sum();
        counters.push(((*followed).to_owned(), total));
    }
    let conflicts = counters.iter().find(|(name, _)| name.contains("conflict")).map_or(0.0, |(_, value)| *value);
    let mut failures = watch.failures;
    if conflicts > 0.0 {
        failures.push(format!(
            "{conflicts} tiles reached an ingester twice with different values (tiles_skipped{{reason=\"conflict\"}})"
        ));
    }
    cluster.shut_down();
    Ok(Outcome { report, applied, counters, failures, rounds: ledger.len() })
}

/// Processes that spin on a core each (`yes > /dev/null`), killed when dropped: the busy
/// neighbour a production host has.
struct BusyNeighbours(Vec<std::process::Child>);

impl BusyNeighbours {
    fn start(count: usize) -> anyhow::Result<BusyNeighbours> {
        let mut children = Vec::new();
        for _ in 0..count {
            let child = std::process::Command::new("yes")
                .stdout(std::process::Stdio::null())
                .spawn()
                .context("start a busy neighbour (`yes`)")?;
            children.push(child);
        }
        Ok(BusyNeighbours(children))
    }
}

impl Drop for BusyNeighbours {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the campaign learns from the daemons while it runs: any that died by itself, and
/// when a collector's kernel dropped datagrams (a full receive buffer: lost by design, and
/// excused for that collector's series around the scrape that saw it).
#[derive(Default)]
struct Watch {
    failures: Vec<String>,
    kernel_drops: Vec<Excuse>,
    last_ms: Option<i64>,
    last_drops: Vec<f64>,
}

impl Watch {
    fn scrape(&mut self, cluster: &mut Cluster) {
        for process in cluster.processes_mut() {
            if let Some(exit) = process.exited() {
                self.failures.push(exit);
            } else if process.pid().is_some() {
                process.scrape();
            }
        }
        let now = now_ms();
        let since = self.last_ms.unwrap_or(now) - 1_000;
        self.last_drops.resize(cluster.collectors.len(), 0.0);
        for (collector, process) in cluster.collectors.iter().enumerate() {
            let drops = process.counter("tessera_collector_kernel_drops_total");
            if drops > self.last_drops[collector] {
                self.kernel_drops.push(Excuse {
                    collector,
                    from_ms: since,
                    to_ms: now,
                    why: format!("{} datagrams dropped by the kernel", drops - self.last_drops[collector]),
                });
                self.last_drops[collector] = drops;
            }
        }
        self.last_ms = Some(now);
    }
}

fn begin(cluster: &mut Cluster, fault: &Fault) -> anyhow::Result<()> {
    match *fault {
        Fault::Kill(daemon) => cluster.process(daemon).kill(),
        Fault::Pause(daemon) => cluster.process(daemon).signal("STOP"),
        Fault::Starve(daemon, percent) => cluster.process(daemon).starve(percent)?,
        Fault::EtcdRestart => cluster.etcd.stop(),
        Fault::EtcdPause => send_signal(cluster.etcd.pid(), "STOP"),
        // Graphite beside Prometheus: its proxy slowed the same; for a refusal carbon-cache
        // is stopped (SIGSTOP: the kernel still takes what is written to it), then SIGKILLed
        // and restarted when the fault ends. Carbon's protocol has no answer to refuse with:
        // what the kernel took dies with it, and only the resend window brings it back.
        Fault::Store(StoreFault::Slow(delay)) => {
            cluster.store_proxy.set(Mode::Delay(delay));
            if let Some((_, proxy)) = &cluster.carbon {
                proxy.set(Mode::Delay(delay));
            }
        }
        Fault::Store(StoreFault::Refuse) => {
            cluster.store_proxy.set(Mode::Refuse503);
            if let Some((carbon, _)) = &cluster.carbon {
                carbon.pause();
            }
        }
        Fault::DiskFull(daemon) => cluster.process(daemon).fill_disk()?,
        Fault::Partition(daemon) => {
            cluster.etcd_proxy(daemon).context("no etcd proxy for that daemon")?.set(Mode::Stall)
        }
        Fault::Link(daemon, kind) => {
            let proxy = cluster.proxy(daemon).context("no proxy in front of that daemon")?;
            proxy.set(match kind {
                LinkFault::Delay(delay) => Mode::Delay(delay),
                LinkFault::Stall => Mode::Stall,
                LinkFault::Reset => Mode::Reset,
            });
        }
    }
    Ok(())
}

/// Ends a fault; a restarted collector is waited for, and when it was ready is returned.
fn end(cluster: &mut Cluster, fault: &Fault) -> anyhow::Result<Option<i64>> {
    match *fault {
        Fault::Kill(daemon) => {
            let process = cluster.process(daemon);
            process.spawn()?;
            if let Daemon::Collector(_) = daemon {
                process.wait_ready(Duration::from_secs(30))?;
                return Ok(Some(now_ms()));
            }
        }
        Fault::Pause(daemon) => cluster.process(daemon).signal("CONT"),
        Fault::Starve(daemon, _) => cluster.process(daemon).unstarve(),
        Fault::EtcdRestart => cluster.etcd.restart().context("restart etcd")?,
        Fault::EtcdPause => send_signal(cluster.etcd.pid(), "CONT"),
        Fault::Store(fault) => {
            cluster.store_proxy.set(Mode::Pass);
            if let Some((carbon, proxy)) = &mut cluster.carbon {
                proxy.set(Mode::Pass);
                if fault == StoreFault::Refuse {
                    carbon.kill();
                    carbon.restart();
                }
            }
        }
        Fault::DiskFull(daemon) => cluster.process(daemon).free_disk(),
        Fault::Link(daemon, _) => {
            if let Some(proxy) = cluster.proxy(daemon) {
                proxy.set(Mode::Pass);
            }
        }
        Fault::Partition(daemon) => {
            if let Some(proxy) = cluster.etcd_proxy(daemon) {
                proxy.set(Mode::Pass);
            }
        }
    }
    Ok(None)
}

/// How far before a collector's kill what it was sent may be lost: its open window,
/// the one it was about to flush, and the batch in flight.
pub const KILL_LOOKBACK_MS: i64 = 2_500;

/// The spans in which each collector's faults excuse a loss (README, *Guarantees*); the
/// spans in which a collector's kernel dropped datagrams are added as they are seen.
///
/// A killed collector loses what a replica had not acknowledged yet: with a healthy link,
/// the last [`KILL_LOOKBACK_MS`]; while the link into an aggregator is stalled, delayed or
/// cut, everything since that link fault began, which that aggregator never gets and may
/// flush without when it leads (found by seed 3 at 5 minutes: agg-1's link stalled from
/// 114.9 s, col-1 killed at 122.3 s before the stall ended, and agg-1, leading, flushed the
/// tile without col-1's last five seconds, which only agg-2 held).
pub fn excuses(applied: &[Applied]) -> Vec<Excuse> {
    let valid = || applied.iter().filter(|fault| fault.note.is_none());
    valid()
        .filter_map(|fault| match fault.fault.fault {
            Fault::Kill(Daemon::Collector(collector)) => {
                let lookback_from_ms = fault.began_ms - KILL_LOOKBACK_MS;
                let unacknowledged_since_ms = valid()
                    .filter(|link| matches!(link.fault.fault, Fault::Link(Daemon::Aggregator(_), _)))
                    .filter(|link| link.began_ms <= fault.began_ms && link.ended_ms >= lookback_from_ms)
                    .map(|link| link.began_ms - 1_000)
                    .min();
                Some(Excuse {
                    collector,
                    from_ms: unacknowledged_since_ms.map_or(lookback_from_ms, |since| since.min(lookback_from_ms)),
                    to_ms: fault.ready_ms.unwrap_or(fault.ended_ms) + 500,
                    why: fault.fault.fault.to_string(),
                })
            }
            Fault::Pause(Daemon::Collector(collector)) | Fault::Starve(Daemon::Collector(collector), _) => {
                Some(Excuse {
                    collector,
                    from_ms: fault.began_ms - 1_000,
                    to_ms: fault.ended_ms + 2_000,
                    why: fault.fault.fault.to_string(),
                })
            }
            _ => None,
        })
        .collect()
}

/// The store's name of each kind's checked series.
pub fn metric_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "chaos_counter_total",
        Kind::Gauge => "chaos_gauge",
        Kind::Timer => "chaos_timer_count",
        Kind::Set => "chaos_set",
    }
}

/// The carbon path of a checked series (brubeck's names, tags as path nodes): its count
/// for counters and timers, its value for gauges and sets, per tile.
fn graphite_path(kind: Kind, series: u64) -> String {
    match kind {
        Kind::Timer => format!("{}.count.series_{series}", kind.name()),
        _ => format!("{}.series_{series}", kind.name()),
    }
}

/// The samples of every checked series of `kind` in carbon's whisper files since `from_ms`,
/// as the checker reads Prometheus': per-tile counts summed into running totals (the
/// whisper slot of a tile is its end), per-tile values of gauges and sets as they are.
fn graphite_samples(carbon: &Carbon, kind: Kind, series_per_kind: u64, from_ms: i64) -> Samples {
    let mut samples = HashMap::new();
    for series in 0..series_per_kind {
        let points = carbon.points(&graphite_path(kind, series), from_ms.div_euclid(1_000));
        if points.is_empty() {
            continue;
        }
        let mut total = 0.0;
        let points = points
            .into_iter()
            .map(|(time, value)| match kind {
                Kind::Counter | Kind::Timer => {
                    total += value;
                    (time * 1_000, total)
                }
                Kind::Gauge | Kind::Set => (time * 1_000, value),
            })
            .collect();
        samples.insert(series, points);
    }
    samples
}

/// Waits until every checked series has a sample at its last tile, at every
/// resolution, or the longest tile plus a minute has passed since that tile ended.
fn wait_for_last_tiles(
    cluster: &mut Cluster,
    resolutions: &[Resolution],
    ledger: &[Round],
    campaign: &Campaign,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let Some(last) = ledger.last() else { return Ok(Duration::ZERO) };
    let longest = resolutions.iter().map(|resolution| resolution.tile_ms).max().unwrap_or(10_000);
    let deadline_ms = tile_end(last.after_ms, longest) + 60_000 + 3 * campaign.ttl_secs as i64 * 1_000;
    loop {
        let mut complete = true;
        for resolution in resolutions {
            let last_tile = tile_end(last.after_ms, resolution.tile_ms);
            for kind in Kind::ALL {
                if resolution.graphite {
                    let Some((carbon, _)) = &cluster.carbon else { anyhow::bail!("no carbon-cache for Graphite") };
                    let from_ms = ledger.first().map_or(last_tile, |round| round.before_ms);
                    let samples = graphite_samples(carbon, kind, campaign.series_per_kind, from_ms);
                    let at_last = samples.values().filter(|points| points.last().is_some_and(|p| p.0 >= last_tile));
                    complete &= at_last.count() as u64 >= campaign.series_per_kind;
                    continue;
                }
                let query = format!(
                    "count(timestamp({}{{{}}}) >= {})",
                    metric_name(kind),
                    resolution.matchers(),
                    last_tile as f64 / 1_000.0
                );
                let result = cluster.prometheus.query(&query, now_ms() as f64 / 1_000.0);
                let count = result[0]["value"][1].as_str().and_then(|value| value.parse::<f64>().ok()).unwrap_or(0.0);
                complete &= count as u64 >= campaign.series_per_kind;
            }
        }
        if complete || now_ms() > deadline_ms {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_secs(1));
        if started.elapsed().as_secs().is_multiple_of(10) {
            for process in cluster.processes_mut() {
                process.scrape();
            }
        }
    }
}

/// Reads every checked series' raw samples back from the store.
fn read_back(
    cluster: &Cluster,
    resolutions: &[Resolution],
    ledger: &[Round],
    series_per_kind: u64,
) -> anyhow::Result<(Observed, Writers)> {
    let mut observed = Observed::new();
    let mut writers = Writers::new();
    let first = ledger.first().map_or(now_ms(), |round| round.before_ms);
    let now = now_ms();
    let range_secs = (now - first) / 1_000 + 120;
    for kind in Kind::ALL {
        for resolution in resolutions {
            if resolution.graphite {
                let Some((carbon, _)) = &cluster.carbon else { anyhow::bail!("no carbon-cache for Graphite") };
                let samples = graphite_samples(carbon, kind, series_per_kind, first - resolution.tile_ms);
                observed.insert((kind, resolution.label.clone()), samples);
                continue;
            }
            let query = format!("{}{{{}}}[{range_secs}s]", metric_name(kind), resolution.matchers());
            let result = cluster.prometheus.query(&query, now as f64 / 1_000.0);
            let key = (kind, resolution.label.clone());
            let samples = observed.entry(key.clone()).or_default();
            let by_writer = writers.entry(key).or_default();
            for series in result.as_array().context("a result array")? {
                let Some(number) = series["metric"]["series"].as_str().and_then(|value| value.parse::<u64>().ok())
                else {
                    continue;
                };
                let points: Vec<(i64, f64)> = series["values"]
                    .as_array()
                    .context("values")?
                    .iter()
                    .filter_map(|point| {
                        let time_ms = (point[0].as_f64()? * 1_000.0).round() as i64;
                        Some((time_ms, point[1].as_str()?.parse().ok()?))
                    })
                    .collect();
                // Each ingester writes under its own `writer` label: one series of the store
                // is every writer's samples of it, in time order.
                let writer = series["metric"]["writer"].as_str().unwrap_or("").to_owned();
                by_writer
                    .entry(number)
                    .or_default()
                    .extend(points.iter().map(|&(time, value)| (writer.clone(), time, value)));
                merge_points(samples.entry(number).or_default(), points);
            }
        }
    }
    Ok((observed, writers))
}

/// Adds one writer's `points` of a series to the series' `merged` samples, in time order.
/// Two writers' samples at one time with one value are one sample, as they would be in a
/// store they both wrote without the harness's `writer` label: a second writer that only
/// repeats the first is reported as `two writers`, not also as a loss or a doubling where
/// the checker reads the merged series.
fn merge_points(merged: &mut Vec<(i64, f64)>, points: Vec<(i64, f64)>) {
    merged.extend(points);
    merged.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    merged.dedup();
}

/// Writes `violations.txt` in the run's directory: the spans excused for each collector,
/// the faults as applied (unix ms), the ledger's rounds, and every violation, with the
/// raw samples of the first ones' series.
fn write_evidence(
    dir: &std::path::Path,
    report: &Report,
    observed: &Observed,
    ledger: &[Round],
    applied: &[Applied],
    excuses: &[Excuse],
) -> anyhow::Result<()> {
    let mut text = String::new();
    for excuse in excuses {
        let _ = writeln!(
            text,
            "excused col-{}: {} to {} ({})",
            excuse.collector + 1,
            excuse.from_ms,
            excuse.to_ms,
            excuse.why
        );
    }
    for fault in applied {
        let _ = writeln!(
            text,
            "fault {} began {} ended {} ready {:?}",
            fault.fault.fault, fault.began_ms, fault.ended_ms, fault.ready_ms
        );
    }
    if let (Some(first), Some(last)) = (ledger.first(), ledger.last()) {
        let _ = writeln!(
            text,
            "rounds {}..={} sent from {} to {}",
            first.number, last.number, first.before_ms, last.after_ms
        );
    }
    for (n, violation) in report.violations.iter().enumerate() {
        let _ = writeln!(text, "{violation}");
        if n < 20
            && let Some(points) = observed
                .get(&(violation.kind, violation.resolution.clone()))
                .and_then(|samples| samples.get(&violation.series))
        {
            let points: Vec<String> = points.iter().map(|(time, value)| format!("{time}={value}")).collect();
            let _ = writeln!(text, "    samples: {}", points.join(" "));
        }
    }
    std::fs::write(dir.join("violations.txt"), text).context("write violations.txt")
}

/// The campaign's summary, for a person: the shape, the schedule as applied, what
/// was checked, the followed counters, and the first violations.
pub fn summary(campaign: &Campaign, outcome: &Outcome) -> String {
    let mut text = String::new();
    let shape = campaign.shape;
    let _ = writeln!(
        text,
        "seed {}: {} s, {} collectors, {} aggregators (RF {}), {} ingesters, policies {}, {} series per kind",
        campaign.seed,
        campaign.duration.as_secs(),
        shape.collectors,
        shape.aggregators,
        shape.replication_factor,
        shape.ingesters,
        campaign.policies.join(" "),
        campaign.series_per_kind,
    );
    let _ = writeln!(text, "faults ({}):", outcome.applied.len());
    for fault in &outcome.applied {
        let _ = write!(text, "  {}", fault.fault);
        if let Some(note) = &fault.note {
            let _ = write!(text, "  [not applied: {note}]");
        }
        text.push('\n');
    }
    let report = &outcome.report;
    let _ = writeln!(
        text,
        "checked: {} rounds, {} series x resolutions, {} written tiles; {} resets, {} short tiles made up later, {} lines excused by collector faults ({} units missing among them)",
        outcome.rounds,
        report.series_checked,
        report.tiles_checked,
        report.resets,
        report.late_tiles,
        report.excused_lines,
        report.excused_missing,
    );
    let counters: Vec<String> = outcome
        .counters
        .iter()
        .filter(|(_, value)| *value > 0.0)
        .map(|(name, value)| format!("{name} {value}"))
        .collect();
    let _ = writeln!(text, "daemon counters: {}", counters.join(", "));
    let counts: HashMap<String, usize> =
        report.counts().into_iter().map(|(problem, count)| (problem.to_string(), count)).collect();
    if outcome.passed() {
        let _ = writeln!(text, "PASS: no lost, doubled or wrong series");
    } else {
        let _ = writeln!(text, "FAIL: {} violations {counts:?}", report.violations.len());
        for failure in &outcome.failures {
            let _ = writeln!(text, "  {failure}");
        }
        for violation in report.violations.iter().take(10) {
            let _ = writeln!(text, "  {violation}");
        }
        let _ = writeln!(text, "run directory (configs, data, logs): {}", campaign.dir.display());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(fault: Fault, began_ms: i64, ended_ms: i64) -> Applied {
        let scheduled = Scheduled { at: Duration::ZERO, lasts: Duration::ZERO, fault };
        Applied { fault: scheduled, began_ms, ended_ms, ready_ms: None, note: None }
    }

    /// Seeds 22, 24 and 25 with partitions: two writers of one tile wrote the same samples,
    /// which the merged series read twice (a `lost` or `doubled` beside `two writers`).
    #[test]
    fn two_writers_identical_samples_merge_into_one_and_differing_ones_stay() {
        let mut merged = Vec::new();
        merge_points(&mut merged, vec![(10_000, 0.0), (20_000, 40.0), (30_000, 80.0)]);
        merge_points(&mut merged, vec![(19_999, 0.0), (20_000, 40.0), (30_000, 81.0)]);
        assert_eq!(merged, [(10_000, 0.0), (19_999, 0.0), (20_000, 40.0), (30_000, 80.0), (30_000, 81.0)]);
    }

    #[test]
    fn a_collector_killed_while_a_link_into_an_aggregator_is_down_is_excused_since_the_link_fault() {
        let kill = applied(Fault::Kill(Daemon::Collector(0)), 122_300, 128_200);
        let alone = excuses(std::slice::from_ref(&kill));
        assert_eq!((alone[0].from_ms, alone[0].to_ms), (122_300 - KILL_LOOKBACK_MS, 128_700));

        // Seed 3 at 5 minutes: the link into agg-1 stalled from 114.9 s to 122.5 s.
        let stall = applied(Fault::Link(Daemon::Aggregator(0), LinkFault::Stall), 114_900, 122_500);
        let both = excuses(&[stall.clone(), kill.clone()]);
        assert_eq!(both.len(), 1, "a link fault excuses nothing by itself");
        assert_eq!((both[0].collector, both[0].from_ms, both[0].to_ms), (0, 113_900, 128_700));

        // A link fault that ended before the kill's lookback, or one into an ingester,
        // widens nothing.
        let earlier = applied(Fault::Link(Daemon::Aggregator(0), LinkFault::Stall), 100_000, 110_000);
        let ingester = applied(Fault::Link(Daemon::Ingester(0), LinkFault::Stall), 114_900, 122_500);
        let unrelated = excuses(&[earlier, ingester, kill]);
        assert_eq!(unrelated[0].from_ms, 122_300 - KILL_LOOKBACK_MS);
    }
}
