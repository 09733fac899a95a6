//! The campaign's cluster: a real etcd, a real Prometheus, and the real tessera
//! binaries as child processes, each behind the proxies the faults act on.
//!
//! ```text
//!  sender ──UDP──▶ col-1, col-2 ──▶ proxy ──▶ agg-1 … agg-N   (shard sets of RF replicas)
//!                                                 │
//!                                    proxy ──▶ ing-1 … ing-M  (the ingesters' placement)
//!                                                 │
//!                                    proxy ──▶ Prometheus (remote write)
//!                                    proxy ──▶ carbon-cache (the Graphite policy, if any)
//!  every daemon ──▶ its own proxy ──▶ etcd   (a partition stalls one daemon's)
//! ```
//!
//! Each ingester labels what it writes `writer="ing-N"` (`external_labels`), so that the
//! checker sees who wrote every sample.
//!
//! The aggregators' placement names each aggregator by its proxy's address, and so does
//! the ingesters' placement (`advertise`), so every wire connection goes through the
//! proxy of the daemon it goes to. Every process keeps its config, data and log in the
//! run's directory, so a killed one restarts where it was, and a failed run leaves
//! everything to read.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tessera_testkit::free_port;
use tessera_testkit::graphite::Carbon;
use tessera_testkit::prometheus::{NO_SCRAPES, Prometheus};
use tessera_topology::testing::EtcdServer;

use crate::check::resolutions;
use crate::proxy::Proxy;
use crate::schedule::{Daemon, Shape};

/// The etcd environment of the campaign's placements.
pub const ENV: &str = "chaos";

/// Settings of the cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How many of each daemon.
    pub shape: Shape,
    /// The aggregators' storage policies (`10s:1h`); the ingesters store them all in the one
    /// Prometheus, each with its `resolution` label.
    pub policies: Vec<String>,
    /// The policy whose tiles the ingesters write to a real carbon-cache (the Graphite
    /// target, brubeck's paths with tags as nodes) instead of Prometheus, if any.
    pub graphite: Option<String>,
    /// The liveness lease TTL of aggregators and ingesters.
    pub ttl_secs: u64,
    /// The ingesters' lease TTL, when it differs from the aggregators' (`ttl_secs`).
    pub ingester_ttl_secs: Option<u64>,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// The run's directory.
    pub dir: PathBuf,
}

/// A daemon as a child process, restartable on the same config and data.
pub struct Process {
    /// `col-1`, `agg-2`, ...
    pub name: String,
    program: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Its `/metrics` and `/readyz` address.
    pub telemetry: SocketAddr,
    /// Counter values scraped before each kill, added to what it exports after.
    banked: HashMap<String, f64>,
    /// The last scrape of the counters the campaign follows.
    last: HashMap<String, f64>,
    cgroup: Option<PathBuf>,
    /// Stopped with SIGSTOP: not scraped (it would not answer).
    paused: bool,
    /// A tmpfs mounted on its data directory (ingesters, when the campaign runs as root),
    /// which [`Process::fill_disk`] fills.
    disk: Option<PathBuf>,
}

/// Counters the campaign follows in every daemon, summed over each label set.
pub const FOLLOWED: &[&str] = &[
    "tessera_ingester_tiles_skipped_total{reason=\"conflict\"}",
    "tessera_ingester_tiles_skipped_total{reason=\"late\"}",
    "tessera_ingester_tiles_skipped_total{reason=\"duplicate\"}",
    "tessera_ingester_series_adopted_total",
    "tessera_ingester_tiles_of_earlier_tenure_total",
    "tessera_ingester_completions_of_earlier_owner_total",
    "tessera_aggregator_partials_rejected_total",
    "tessera_aggregator_partials_late_for_policy_total",
    "tessera_aggregator_incomplete_tiles_total",
    "tessera_aggregator_unconfirmed_tiles_total",
    "tessera_aggregator_tiles_completed_total",
    "tessera_ingester_tiles_skipped_total{reason=\"replaced\"}",
    "tessera_aggregator_tiles_discarded_total",
    "tessera_aggregator_resent_batches_total",
    "tessera_aggregator_elections_total",
    "tessera_aggregator_fenced_total",
    "tessera_collector_drops_total",
    "tessera_collector_kernel_drops_total",
    "tessera_aggregator_drops_total",
    "tessera_ingester_carbon_resends_total",
    "tessera_ingester_carbon_resent_lines_total",
];

impl Process {
    fn new(
        name: &str,
        program: PathBuf,
        dir: &Path,
        config_text: &str,
        telemetry: SocketAddr,
    ) -> anyhow::Result<Process> {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, format!("{config_text}[telemetry]\nlisten = \"{telemetry}\"\n"))
            .with_context(|| format!("write {}", config.display()))?;
        Ok(Process {
            name: name.to_owned(),
            program,
            config,
            log: dir.join(format!("{name}.log")),
            child: None,
            telemetry,
            banked: HashMap::new(),
            last: HashMap::new(),
            cgroup: None,
            paused: false,
            disk: None,
        })
    }

    /// Starts it (appending to its log).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.program)
            .arg("--config")
            .arg(&self.config)
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("run {}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Polls `/readyz` until it answers 200, the process exits, or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!("{} exited with {status} while starting (log: {})", self.name, self.log.display());
            }
            if matches!(http_get(self.telemetry, "/readyz"), Ok((200, _))) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{} not ready after {timeout:?} (log: {})",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it exited by itself since the last look (with how), which no fault does.
    pub fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(format!("{} exited by itself with {status} (log: {})", self.name, self.log.display()))
    }

    /// The pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash; what its counters had counted is kept.
    pub fn kill(&mut self) {
        self.scrape();
        for (name, value) in self.last.drain() {
            *self.banked.entry(name).or_insert(0.0) += value;
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.unstarve();
        self.paused = false;
    }

    /// Sends `signal` (`STOP`, `CONT`).
    pub fn signal(&mut self, signal: &str) {
        self.paused = signal == "STOP";
        send_signal(self.pid(), signal);
    }

    /// Scrapes the followed counters (while it answers).
    pub fn scrape(&mut self) {
        if self.paused {
            return;
        }
        let Ok((200, text)) = http_get(self.telemetry, "/metrics") else { return };
        for followed in FOLLOWED {
            let (name, labels) =
                followed.split_once('{').map_or((*followed, ""), |(name, rest)| (name, rest.trim_end_matches('}')));
            self.last.insert((*followed).to_owned(), sum_of(&text, name, labels));
        }
    }

    /// A followed counter over every life of the process.
    pub fn counter(&self, followed: &str) -> f64 {
        self.banked.get(followed).copied().unwrap_or(0.0) + self.last.get(followed).copied().unwrap_or(0.0)
    }

    /// Puts it under a CPU quota of `percent` of one core (cgroup v1), until
    /// [`unstarve`](Self::unstarve).
    pub fn starve(&mut self, percent: u32) -> anyhow::Result<()> {
        let pid = self.pid().context("not running")?;
        // Unique in the process: two campaigns may run side by side, each with a `col-1`.
        static NEXT_GROUP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let number = NEXT_GROUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let group =
            PathBuf::from(format!("/sys/fs/cgroup/cpu/tessera-chaos-{}-{number}-{}", std::process::id(), self.name));
        std::fs::create_dir_all(&group).with_context(|| format!("create the cgroup {}", group.display()))?;
        std::fs::write(group.join("cpu.cfs_period_us"), "100000")?;
        std::fs::write(group.join("cpu.cfs_quota_us"), (percent * 1_000).to_string())?;
        std::fs::write(group.join("cgroup.procs"), pid.to_string())?;
        self.cgroup = Some(group);
        Ok(())
    }

    /// Mounts a tmpfs of `bytes` on `dir` (its data directory), to be filled by
    /// [`fill_disk`](Self::fill_disk); unmounted when the process is dropped.
    fn mount_disk(&mut self, dir: &Path, bytes: u64) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .context("run mount")?;
        ensure!(status.success(), "mounting a tmpfs on {} failed (the disk fault needs root)", dir.display());
        self.disk = Some(dir.to_path_buf());
        Ok(())
    }

    /// Fills its disk with a file (until the file system refuses a write).
    pub fn fill_disk(&self) -> anyhow::Result<()> {
        use std::io::Write;
        let dir = self.disk.as_ref().context("no disk of its own (the campaign needs root to mount one)")?;
        let mut file = std::fs::File::create(dir.join(FILLER))?;
        let block = vec![0u8; 1 << 20];
        while file.write_all(&block).is_ok() {}
        let _ = file.flush();
        Ok(())
    }

    /// Frees its disk again.
    pub fn free_disk(&self) {
        if let Some(dir) = &self.disk {
            let _ = std::fs::remove_file(dir.join(FILLER));
        }
    }

    /// Lifts the CPU quota.
    pub fn unstarve(&mut self) {
        if let Some(group) = self.cgroup.take() {
            if let Some(pid) = self.pid() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", pid.to_string());
            }
            let _ = std::fs::remove_dir(&group);
        }
    }

    /// Stops it with SIGTERM and waits (for the end of a run).
    pub fn terminate(&mut self) {
        self.unstarve();
        if let Some(mut child) = self.child.take() {
            send_signal(Some(child.id()), "CONT");
            send_signal(Some(child.id()), "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.unstarve();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.disk.take() {
            // The disk goes with the unmount: keep what the daemon wrote on it (its queue and
            // checkpoints) beside it, for the run directory a failed run leaves (found
            // missing when seed 10 lost a 1 min tile across an ingester restart).
            let _ = copy_dir(&dir, &dir.with_extension("kept"));
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

/// Copies the files below `from` to `to`, the disk filler left out.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if entry.file_name() != FILLER {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The file that fills a disk.
const FILLER: &str = "chaos-filler";

/// Each ingester's disk: room for its queue and checkpoints, and quick to fill.
const INGESTER_DISK_BYTES: u64 = 512 << 20;

/// Everything a campaign runs.
pub struct Cluster {
    /// etcd.
    pub etcd: EtcdServer,
    /// The store.
    pub prometheus: Prometheus,
    /// The proxy in front of the store.
    pub store_proxy: Proxy,
    /// The carbon-cache of the Graphite policy, and the proxy in front of it.
    pub carbon: Option<(Carbon, Proxy)>,
    /// Collectors, in order.
    pub collectors: Vec<Process>,
    /// Each collector's statsd address.
    pub statsd: Vec<SocketAddr>,
    /// Aggregators, in order (shard set `n / RF`).
    pub aggregators: Vec<Process>,
    /// The proxy in front of each aggregator.
    pub aggregator_proxies: Vec<Proxy>,
    /// Ingesters, in order.
    pub ingesters: Vec<Process>,
    /// The proxy in front of each ingester.
    pub ingester_proxies: Vec<Proxy>,
    /// Each daemon's own proxy in front of etcd, which a partition stalls.
    pub etcd_proxies: HashMap<Daemon, Proxy>,
    /// The settings it was started with.
    pub settings: Settings,
}

fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

impl Cluster {
    /// Starts etcd, Prometheus, the proxies, the placements and every daemon, and waits
    /// until each is ready and each shard set has a leader.
    pub fn start(settings: Settings) -> anyhow::Result<Cluster> {
        let shape = settings.shape;
        ensure!(
            shape.replication_factor > 0 && shape.aggregators.is_multiple_of(shape.replication_factor),
            "{} aggregators do not make whole shard sets of {}",
            shape.aggregators,
            shape.replication_factor
        );
        let etcd = EtcdServer::start().context("start etcd (Debian's etcd-server; scripts/setup.sh installs it)")?;
        let prometheus = Prometheus::start_with_config(&format!(
            "{NO_SCRAPES}storage:\n  tsdb:\n    out_of_order_time_window: 2h\n"
        ));
        let store_proxy = Proxy::start(prometheus.address)?;
        let remote_write = format!("http://{}/api/v1/write", store_proxy.address());
        let mut carbon = None;
        let mut graphite_sink = String::new();
        if let Some(policy) = &settings.graphite {
            // Whisper's first archive steps by the tile, as deploy/graphite's schemas do.
            let tile = policy.split(':').next().unwrap_or_default();
            let store = Carbon::start(&format!("{tile}:1d"));
            let proxy = Proxy::start(store.plaintext)?;
            graphite_sink = format!(
                "[policy_sinks.{policy:?}]\nkind = \"graphite\"\naddress = \"{}\"\nnaming = \"brubeck\"\ntags = \"path\"\n",
                proxy.address()
            );
            carbon = Some((store, proxy));
        }
        let prometheus_policies: Vec<&String> =
            settings.policies.iter().filter(|policy| Some(*policy) != settings.graphite.as_ref()).collect();
        // Every daemon reaches etcd through a proxy of its own, so that a partition can cut
        // one off while the others still reach it.
        let etcd_address: SocketAddr =
            etcd.endpoint().trim_start_matches("http://").parse().context("etcd's endpoint is not a socket address")?;
        let daemons = (0..shape.ingesters)
            .map(Daemon::Ingester)
            .chain((0..shape.aggregators).map(Daemon::Aggregator))
            .chain((0..shape.collectors).map(Daemon::Collector));
        let etcd_proxies: HashMap<Daemon, Proxy> =
            daemons.map(|daemon| Ok((daemon, Proxy::start(etcd_address)?))).collect::<std::io::Result<_>>()?;
        let etcd_section = |table: &str, daemon: Daemon| {
            let endpoint = etcd_proxies[&daemon].address();
            format!("[{table}]\nendpoints = [\"http://{endpoint}\"]\nenv = \"{ENV}\"\nrequest_timeout_ms = 1000\n")
        };
        // As every documented deployment has it (deploy/config/): a daemon restarted while
        // etcd is down starts from its last placement instead of waiting for etcd.
        let cached = |table: &str, daemon: Daemon, file: &str| {
            let path = settings.dir.join(format!("{daemon}-{file}.pb"));
            format!(
                "{}cache_path = {:?}\n",
                etcd_section(table, daemon).trim_start_matches(&format!("[{table}]\n")),
                path.display().to_string()
            )
        };
        let binary = |name: &str| settings.bin_dir.join(name);
        let ttl = settings.ttl_secs;
        let ingester_ttl = settings.ingester_ttl_secs.unwrap_or(ttl);

        // Ingesters and their placement.
        let ingester_ports: Vec<u16> = (0..shape.ingesters).map(|_| free_port()).collect();
        let ingester_proxies =
            ingester_ports.iter().map(|port| Proxy::start(loopback(*port))).collect::<std::io::Result<Vec<_>>>()?;
        let mut init = Command::new(binary("tessera"));
        init.args(["placement", "--etcd", &etcd.endpoint(), "--environment", ENV, "--tier", "ingesters", "init"]);
        init.args(["--shards", "16"]);
        for (n, proxy) in ingester_proxies.iter().enumerate() {
            init.args(["--instance", &format!("{}={}", Daemon::Ingester(n), proxy.address())]);
        }
        run_quietly(&mut init)?;
        let mut ingesters = Vec::new();
        for (n, port) in ingester_ports.iter().enumerate() {
            let name = Daemon::Ingester(n).to_string();
            let text = format!(
                "instance_id = \"{name}\"\nlisten = \"127.0.0.1:{port}\"\ndata_dir = {:?}\n\
                 sink_policies = {:?}\n\
                 [placement]\nadvertise = \"{}\"\nliveness_ttl_secs = {ingester_ttl}\n{}\
                 [sink]\nkind = \"remote_write\"\nurl = \"{remote_write}\"\nhistograms = \"summary\"\n\
                 external_labels = {{ writer = \"{name}\" }}\n\
                 {graphite_sink}",
                settings.dir.join(&name).display().to_string(),
                prometheus_policies,
                ingester_proxies[n].address(),
                etcd_section("placement.etcd", Daemon::Ingester(n)),
            );
            let mut process =
                Process::new(&name, binary("tessera-ingester"), &settings.dir, &text, loopback(free_port()))?;
            if let Err(error) = process.mount_disk(&settings.dir.join(&name), INGESTER_DISK_BYTES) {
                eprintln!("tessera-chaos: {name}: {error:#}; its disk will not be filled");
            }
            process.spawn()?;
            ingesters.push(process);
        }

        // Aggregators and their placement.
        let aggregator_ports: Vec<u16> = (0..shape.aggregators).map(|_| free_port()).collect();
        let aggregator_proxies =
            aggregator_ports.iter().map(|port| Proxy::start(loopback(*port))).collect::<std::io::Result<Vec<_>>>()?;
        let mut init = Command::new(binary("tessera"));
        init.args(["placement", "--etcd", &etcd.endpoint(), "--environment", ENV, "init", "--shards", "64"]);
        init.args(["--replication-factor", &shape.replication_factor.to_string()]);
        for (n, proxy) in aggregator_proxies.iter().enumerate() {
            init.args(["--instance", &format!("{}={}", Daemon::Aggregator(n), proxy.address())]);
        }
        run_quietly(&mut init)?;
        let policies = settings.policies.iter().map(|policy| format!("{policy:?}")).collect::<Vec<_>>().join(", ");
        let mut aggregators = Vec::new();
        for (n, port) in aggregator_ports.iter().enumerate() {
            let name = Daemon::Aggregator(n).to_string();
            let text = format!(
                "instance_id = \"{name}\"\nlisten = \"127.0.0.1:{port}\"\npolicies = [{policies}]\n\
                 liveness_ttl_secs = {ttl}\nmerge_threads = 1\n[placement]\nkind = \"etcd\"\n{}\
                 [ingester]\nreconnect_min_ms = 20\nreconnect_max_ms = 500\n[ingester.placement]\nkind = \"etcd\"\n{}",
                cached("placement", Daemon::Aggregator(n), "placement"),
                cached("ingester.placement", Daemon::Aggregator(n), "ingester-placement"),
            );
            let mut process =
                Process::new(&name, binary("tessera-aggregator"), &settings.dir, &text, loopback(free_port()))?;
            process.spawn()?;
            aggregators.push(process);
        }

        let mut collectors = Vec::new();
        let mut statsd = Vec::new();
        for n in 0..shape.collectors {
            let name = Daemon::Collector(n).to_string();
            let port = free_port();
            let text = format!(
                "instance_id = \"{name}\"\n[udp]\nlisten = \"127.0.0.1:{port}\"\nreader_threads = 1\n\
                 recv_buffer_bytes = 16777216\n[placement]\nkind = \"etcd\"\n{}\
                 [forward]\nreconnect_min_ms = 20\nreconnect_max_ms = 500\n",
                cached("placement", Daemon::Collector(n), "placement"),
            );
            let mut process =
                Process::new(&name, binary("tessera-collector"), &settings.dir, &text, loopback(free_port()))?;
            process.spawn()?;
            collectors.push(process);
            statsd.push(loopback(port));
        }

        let mut cluster = Cluster {
            etcd,
            prometheus,
            store_proxy,
            carbon,
            collectors,
            statsd,
            aggregators,
            aggregator_proxies,
            ingesters,
            ingester_proxies,
            etcd_proxies,
            settings,
        };
        for process in cluster.processes_mut() {
            process.wait_ready(Duration::from_secs(30))?;
        }
        // Replicas started together mid-tile saw none of their first tiles whole: they elect
        // a leader once etcd has said "no leader" for the longest tile plus max_buffer_past.
        let longest = resolutions(&cluster.settings.policies)?.iter().map(|r| r.tile_ms).max().unwrap_or(0);
        cluster.wait_for_leaders(Duration::from_millis(longest as u64 + 8_000) + Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Every daemon.
    pub fn processes_mut(&mut self) -> impl Iterator<Item = &mut Process> {
        self.ingesters.iter_mut().chain(self.aggregators.iter_mut()).chain(self.collectors.iter_mut())
    }

    /// One daemon.
    pub fn process(&mut self, daemon: Daemon) -> &mut Process {
        match daemon {
            Daemon::Collector(n) => &mut self.collectors[n],
            Daemon::Aggregator(n) => &mut self.aggregators[n],
            Daemon::Ingester(n) => &mut self.ingesters[n],
        }
    }

    /// The proxy in front of a daemon's wire port (none for a collector).
    pub fn proxy(&self, daemon: Daemon) -> Option<&Proxy> {
        match daemon {
            Daemon::Collector(_) => None,
            Daemon::Aggregator(n) => self.aggregator_proxies.get(n),
            Daemon::Ingester(n) => self.ingester_proxies.get(n),
        }
    }

    /// The proxy between a daemon and etcd.
    pub fn etcd_proxy(&self, daemon: Daemon) -> Option<&Proxy> {
        self.etcd_proxies.get(&daemon)
    }

    /// Waits until every shard set has exactly one leader.
    pub fn wait_for_leaders(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let rf = self.settings.shape.replication_factor;
        loop {
            let leaders: Vec<usize> = self
                .aggregators
                .chunks(rf)
                .map(|set| {
                    set.iter().filter(|process| gauge(process.telemetry, "tessera_aggregator_leader") == 1.0).count()
                })
                .collect();
            if leaders.iter().all(|count| *count == 1) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "shard sets without exactly one leader after {timeout:?}: {leaders:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Ends every daemon (SIGTERM), then etcd and Prometheus when dropped.
    pub fn shut_down(&mut self) {
        for process in self.processes_mut() {
            process.terminate();
        }
    }
}

/// The sum of every sample of `name` a daemon exports now (0 when it does not answer).
pub fn gauge(telemetry: SocketAddr, name: &str) -> f64 {
    let Ok((200, text)) = http_get(telemetry, "/metrics") else { return 0.0 };
    sum_of(&text, name, "")
}

/// The sum of the samples of `name` in Prometheus text whose labels contain `labels`.
fn sum_of(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#') && line.contains(labels))
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Sends `signal` (`STOP`, `CONT`, `TERM`) to `pid` with kill(1), as the test kit does:
/// no `unsafe` outside the one module the workspace allows it in.
pub fn send_signal(pid: Option<u32>, signal: &str) {
    if let Some(pid) = pid {
        let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    }
}

/// `GET path` with short deadlines (a daemon under a fault may not answer): status and body.
pub fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    Ok((status, body.to_owned()))
}

fn run_quietly(command: &mut Command) -> anyhow::Result<()> {
    let output = command.output().with_context(|| format!("run {command:?}"))?;
    ensure!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}
