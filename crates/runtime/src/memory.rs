//! A memory budget: the daemon's resident memory against a limit, read a few times a
//! second, and a flag the hot paths read to shed new work before the limit is reached.
//!
//! ```text
//! MemoryGuard (a thread, every 250 ms): RSS from /proc/self/statm
//!   RSS ≥ 75 % of the limit  ─▶ shedding = true   (new series are refused, counted)
//!   RSS < 65 % of the limit  ─▶ shedding = false
//! ```
//!
//! The limit is `memory_limit` in a daemon's configuration: bytes (`536870912`, or with a
//! unit, `"512MiB"`, `"2GiB"`), or a share of the cgroup's memory limit (`"80%"`: cgroup v2's
//! `memory.max`, else v1's `memory.limit_in_bytes`, the smallest of the process' own cgroup
//! and its parents, [`own_cgroup_limit_bytes`]). What a daemon sheds is its own
//! business (the collector: lines of new series, `drops_total{reason="memory_limit"}`,
//! while known series go on); the guard only says when. Like Datadog's ADP memory limiter,
//! it reads the process' real use rather than an estimate per series, so every structure
//! counts, the allocator's slack included.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
pub use tessera_core::budget::MemoryBudget;

/// Shedding starts at this share of the limit: what a daemon admitted just before still
/// grows its buffers for a window or two (the collector's cuts and merged table), so the
/// margin is wide (measured: `benches/load/bomb.sh`, BENCHMARKS.md).
pub const SHED_AT: f64 = 0.75;
/// And stops below this share.
pub const RESUME_AT: f64 = 0.65;
/// How often the resident memory is read.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// `memory_limit` as written: bytes, or a share of the cgroup's limit.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "LimitText")]
pub enum MemoryLimit {
    /// This many bytes.
    Bytes(u64),
    /// This share (0 to 1) of the cgroup's memory limit.
    CgroupShare(f64),
    /// No budget (`"none"`), not even the default one in a cgroup with a limit.
    Off,
}

/// A daemon without `memory_limit` whose cgroup has a memory limit (a container or a pod
/// with limits, a systemd unit with `MemoryMax=`) takes this share of it as its budget.
pub const DEFAULT_CGROUP_SHARE: f64 = 0.8;

#[derive(Deserialize)]
#[serde(untagged)]
enum LimitText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<LimitText> for MemoryLimit {
    type Error = String;

    fn try_from(text: LimitText) -> Result<MemoryLimit, String> {
        match text {
            LimitText::Bytes(bytes) => Ok(MemoryLimit::Bytes(bytes)),
            LimitText::Text(text) => text.parse(),
        }
    }
}

impl std::str::FromStr for MemoryLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<MemoryLimit, String> {
        let text = text.trim();
        if text == "none" {
            return Ok(MemoryLimit::Off);
        }
        if let Some(percent) = text.strip_suffix('%') {
            let share: f64 = percent.trim().parse().map_err(|_| format!("`{text}` is not a percentage"))?;
            if !(share > 0.0 && share <= 100.0) {
                return Err(format!("`{text}`: a share of the cgroup's limit is above 0 % and at most 100 %"));
            }
            return Ok(MemoryLimit::CgroupShare(share / 100.0));
        }
        let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let number: u64 =
            number.parse().map_err(|_| format!("`{text}` is not a size (bytes, KiB, MiB, GiB or a %)"))?;
        let scale: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => return Err(format!("`{text}`: unknown unit `{other}` (B, KiB, MiB, GiB, or a %)")),
        };
        number.checked_mul(scale).map(MemoryLimit::Bytes).ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl MemoryLimit {
    /// The limit in bytes: a share of the cgroup's limit needs one (an error names the
    /// files read when there is none).
    pub fn resolve(self) -> Result<u64, String> {
        match self {
            MemoryLimit::Bytes(bytes) if bytes > 0 => Ok(bytes),
            MemoryLimit::Bytes(_) => Err("memory_limit must be above 0".to_owned()),
            MemoryLimit::Off => Ok(0),
            MemoryLimit::CgroupShare(share) => match process_cgroup_limit_bytes() {
                Some(limit) => Ok((limit as f64 * share) as u64),
                None => Err(format!(
                    "memory_limit = {}% is a share of the cgroup's memory limit, and this process has none \
                         (memory.max or memory/memory.limit_in_bytes under /sys/fs/cgroup, in this process' \
                         cgroup of /proc/self/cgroup and its parents): give bytes instead",
                    share * 100.0
                )),
            },
        }
    }
}

/// The memory limit that holds for this process: the smallest that its own cgroup (named
/// in `membership`, the text of /proc/self/cgroup) or any of its parents sets, under the
/// cgroup file systems mounted at `root`.
///
/// A daemon in a container usually sees its own cgroup at the root of the mount (a cgroup
/// namespace, or Docker's v1 bind mount), and the path named in /proc/self/cgroup does not
/// exist there; one run by systemd with `MemoryMax=`, or put in a cgroup by hand, sees the
/// whole tree, and its limit is in its own directory, not at the root.
pub fn own_cgroup_limit_bytes(root: &Path, membership: &str) -> Option<u64> {
    let mut limits = vec![cgroup_limit_bytes(root)];
    for line in membership.lines() {
        // `hierarchy:controllers:path`: v2's line is `0::path`, v1's memory line names `memory`.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let (mount, file) = match controllers {
            "" => (root.to_path_buf(), "memory.max"),
            _ if controllers.split(',').any(|controller| controller == "memory") => {
                (root.join("memory"), "memory.limit_in_bytes")
            }
            _ => continue,
        };
        let mut dir = Path::new(path.trim_start_matches('/'));
        while !dir.as_os_str().is_empty() {
            limits.push(read_limit(&mount.join(dir).join(file)));
            dir = dir.parent().unwrap_or(Path::new(""));
        }
    }
    limits.into_iter().flatten().min()
}

/// [`own_cgroup_limit_bytes`] of this process, under /sys/fs/cgroup.
pub fn process_cgroup_limit_bytes() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    own_cgroup_limit_bytes(Path::new("/sys/fs/cgroup"), &membership)
}

/// The memory limit of the cgroup mounted at `root` (v2's `memory.max`, else v1's
/// `memory/memory.limit_in_bytes`), if it sets one.
pub fn cgroup_limit_bytes(root: &Path) -> Option<u64> {
    let v2 = root.join("memory.max");
    if v2.exists() { read_limit(&v2) } else { read_limit(&root.join("memory/memory.limit_in_bytes")) }
}

/// A limit file's bytes; `None` when it is missing or says there is no limit.
fn read_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let limit: u64 = text.trim().parse().ok()?;
    // v1 says "no limit" with a huge number (a page-rounded i64::MAX); v2 says "max".
    (limit < (1 << 60)).then_some(limit)
}

/// This process' resident memory, bytes (`VmRSS` of /proc/self/status; 0 where /proc
/// cannot tell).
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

crate::metrics! {
    /// A daemon's memory budget.
    pub struct MemoryMetrics {
        /// The memory budget (memory_limit); 0 without one
        pub memory_limit: Gauge [bytes],
        /// Resident memory as the budget reads it, every 250 ms while there is a budget
        pub memory_used: Gauge [bytes],
        /// 1 while new series are shed near the budget (from 75 % of it until under 65 %)
        pub memory_shedding: Gauge,
        /// Most series admitted at once under the budget (memory_limit over the cost of a
        /// series; the aggregator's); 0 without such a cap
        pub memory_series_cap: Gauge,
        /// Series admitted under the budget's series cap, every 250 ms
        pub memory_series_held: Gauge,
    }
}

/// The budget's state, shared by the guard thread and the paths that shed.
#[derive(Clone)]
pub struct MemoryGuard {
    limit_bytes: u64,
    budget: Arc<MemoryBudget>,
    metrics: MemoryMetrics,
}

impl MemoryGuard {
    /// A guard of `limit_bytes`, not shedding yet, reporting into `metrics`.
    pub fn new(limit_bytes: u64, metrics: MemoryMetrics) -> MemoryGuard {
        MemoryGuard::with_budget(MemoryBudget::new(limit_bytes), metrics)
    }

    /// A guard of `budget` (a [`MemoryBudget::with_series_cost`], say).
    pub fn with_budget(budget: MemoryBudget, metrics: MemoryMetrics) -> MemoryGuard {
        metrics.memory_limit.set(budget.limit_bytes() as i64);
        metrics.memory_series_cap.set(budget.series_cap().map_or(0, |cap| cap as i64));
        MemoryGuard { limit_bytes: budget.limit_bytes(), budget: Arc::new(budget), metrics }
    }

    /// What the hot paths read: whether to shed new work, and whether a table may grow.
    pub fn budget(&self) -> Arc<MemoryBudget> {
        Arc::clone(&self.budget)
    }

    /// Takes one reading of `used_bytes`: shedding starts at [`SHED_AT`] of the limit and
    /// stops below [`RESUME_AT`]; returns whether it sheds now.
    pub fn observe(&self, used_bytes: u64) -> bool {
        self.metrics.memory_used.set(used_bytes as i64);
        self.metrics.memory_series_held.set(self.budget.series_held() as i64);
        let was = self.budget.shedding();
        let used = used_bytes as f64;
        let limit = self.limit_bytes as f64;
        let now = if was { used >= limit * RESUME_AT } else { used >= limit * SHED_AT };
        self.budget.update(used_bytes, now);
        if now != was {
            if now {
                tracing::warn!(
                    used_bytes,
                    limit_bytes = self.limit_bytes,
                    "memory near its limit: shedding new series"
                );
            } else {
                tracing::info!(
                    used_bytes,
                    limit_bytes = self.limit_bytes,
                    "memory back under its limit: taking new series"
                );
            }
        }
        self.metrics.memory_shedding.set(i64::from(now));
        now
    }

    /// A daemon's budget from its `memory_limit` (without one, [`DEFAULT_CGROUP_SHARE`] of
    /// its cgroup's limit when there is one; none with `"none"`): resolved, its guard
    /// thread started, reporting into `metrics`; returns the flag to shed by.
    ///
    /// With `series_cost` (bytes a series costs the daemon, all told), the budget also caps
    /// the series admitted at once ([`MemoryBudget::with_series_cost`]).
    pub fn start(
        limit: Option<MemoryLimit>,
        series_cost: Option<u64>,
        metrics: &MemoryMetrics,
    ) -> Result<Option<Arc<MemoryBudget>>, crate::StartError> {
        let limit = match limit {
            Some(MemoryLimit::Off) => return Ok(None),
            Some(limit) => limit,
            None => {
                if process_cgroup_limit_bytes().is_none() {
                    return Ok(None);
                }
                tracing::info!(
                    share = DEFAULT_CGROUP_SHARE,
                    "no memory_limit set and the cgroup has a memory limit: a share of it is the budget \
                     (memory_limit = \"none\" for none)"
                );
                MemoryLimit::CgroupShare(DEFAULT_CGROUP_SHARE)
            }
        };
        let limit_bytes =
            limit.resolve().map_err(|reason| crate::config::InvalidSetting::new("memory_limit", reason))?;
        let budget = match series_cost {
            Some(bytes) => MemoryBudget::new(limit_bytes).with_series_cost(bytes),
            None => MemoryBudget::new(limit_bytes),
        };
        let guard = MemoryGuard::with_budget(budget, metrics.clone());
        guard.spawn().map_err(|error| crate::StartError::setup("cannot start the memory guard", error))?;
        tracing::info!(limit_bytes, series_cap = guard.budget.series_cap(), "memory budget");
        Ok(Some(guard.budget()))
    }

    /// Reads the resident memory every [`CHECK_INTERVAL`] on a thread of its own, for the
    /// life of the process.
    pub fn spawn(&self) -> std::io::Result<()> {
        let guard = self.clone();
        std::thread::Builder::new().name("memory-guard".into()).spawn(move || {
            loop {
                guard.observe(resident_bytes());
                std::thread::sleep(CHECK_INTERVAL);
            }
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_as_bytes_units_or_a_share_of_the_cgroup() {
        assert_eq!("536870912".parse(), Ok(MemoryLimit::Bytes(536_870_912)));
        assert_eq!("512MiB".parse(), Ok(MemoryLimit::Bytes(512 << 20)));
        assert_eq!("2 GiB".parse(), Ok(MemoryLimit::Bytes(2 << 30)));
        assert_eq!("80%".parse(), Ok(MemoryLimit::CgroupShare(0.8)));
        assert_eq!("none".parse(), Ok(MemoryLimit::Off));
        for bad in ["", "x", "12 parsecs", "0%", "150%", "-5"] {
            assert!(bad.parse::<MemoryLimit>().is_err(), "{bad}");
        }
        #[derive(Deserialize)]
        struct Config {
            memory_limit: MemoryLimit,
        }
        let config: Config = toml::from_str("memory_limit = 1048576").unwrap();
        assert_eq!(config.memory_limit, MemoryLimit::Bytes(1 << 20));
        let config: Config = toml::from_str("memory_limit = \"50%\"").unwrap();
        assert_eq!(config.memory_limit, MemoryLimit::CgroupShare(0.5));
        assert!(toml::from_str::<Config>("memory_limit = \"lots\"").is_err());
    }

    #[test]
    fn a_cgroup_limit_is_read_from_v2_or_v1_and_none_is_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(cgroup_limit_bytes(dir.path()), None);
        std::fs::create_dir(dir.path().join("memory")).unwrap();
        std::fs::write(dir.path().join("memory/memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit_bytes(dir.path()), None, "v1's no-limit value");
        std::fs::write(dir.path().join("memory/memory.limit_in_bytes"), "1073741824\n").unwrap();
        assert_eq!(cgroup_limit_bytes(dir.path()), Some(1 << 30));
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_bytes(dir.path()), None, "v2's max");
        std::fs::write(dir.path().join("memory.max"), "536870912\n").unwrap();
        assert_eq!(cgroup_limit_bytes(dir.path()), Some(512 << 20));
    }

    #[test]
    fn the_limit_is_the_smallest_of_the_process_cgroup_and_its_parents() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |path: &str, text: &str| {
            std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
            std::fs::write(root.join(path), text).unwrap();
        };
        // cgroup v1, the whole tree seen (a daemon put in a cgroup by hand on this host).
        write("memory/memory.limit_in_bytes", "9223372036854771712\n");
        write("memory/bench/memory.limit_in_bytes", "1073741824\n");
        write("memory/bench/collector/memory.limit_in_bytes", "9223372036854771712\n");
        let v1 = "12:pids:/\n9:memory:/bench/collector\n1:name=systemd:/user.slice\n";
        assert_eq!(own_cgroup_limit_bytes(root, v1), Some(1 << 30), "the parent's limit holds");
        write("memory/bench/collector/memory.limit_in_bytes", "268435456\n");
        assert_eq!(own_cgroup_limit_bytes(root, v1), Some(256 << 20), "its own, smaller one");
        // A container: its cgroup is mounted at the root and the named path is not there.
        let container = "9:memory:/docker/0123abcd\n";
        assert_eq!(own_cgroup_limit_bytes(root, container), None);
        write("memory/memory.limit_in_bytes", "536870912\n");
        assert_eq!(own_cgroup_limit_bytes(root, container), Some(512 << 20));
        // cgroup v2 under systemd (`MemoryMax=`).
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("system.slice/tessera.service")).unwrap();
        std::fs::write(root.join("memory.max"), "max\n").unwrap();
        std::fs::write(root.join("system.slice/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("system.slice/tessera.service/memory.max"), "2147483648\n").unwrap();
        assert_eq!(own_cgroup_limit_bytes(root, "0::/system.slice/tessera.service\n"), Some(2 << 30));
        assert_eq!(own_cgroup_limit_bytes(root, "0::/\n"), None, "the root's max");
        assert_eq!(own_cgroup_limit_bytes(root, ""), None);
    }

    #[test]
    fn shedding_starts_near_the_limit_and_stops_well_under_it() {
        let guard = MemoryGuard::new(1000, MemoryMetrics::default());
        let budget = guard.budget();
        assert!(!guard.observe(740));
        assert!(guard.observe(750) && budget.shedding());
        assert!(guard.observe(700), "still above the resume mark");
        assert!(!guard.observe(649) && !budget.shedding());
        assert!(budget.would_exceed(252) && !budget.would_exceed(250), "growth past 90 % of the limit");
        let metrics = &guard.metrics;
        assert_eq!(
            (metrics.memory_limit.get(), metrics.memory_used.get(), metrics.memory_shedding.get()),
            (1000, 649, 0)
        );
        assert!(resident_bytes() > 0, "this test's own process has resident memory");
    }
}
