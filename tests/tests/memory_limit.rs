//! `memory_limit = "N%"` is a share of the limit of the cgroup the daemon runs in: each
//! daemon started inside a real memory cgroup (v1, as this machine has; a cgroup made for
//! the test under /sys/fs/cgroup/memory, with a 1 GiB limit) budgets a quarter of it. The
//! daemon sees the whole cgroup tree here, as one run by systemd or put in a cgroup by hand
//! does, so the limit is read from its own cgroup, not from the root of the mount (which has
//! none: reading the root was the first version, and it refused such a daemon's config).
//! Without `memory_limit`, a daemon in a cgroup with a limit budgets 80 % of it.

use std::path::PathBuf;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;

/// A memory cgroup made for the test, removed on drop.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    fn new(limit_bytes: u64) -> MemoryCgroup {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/memory/tessera-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|error| {
            panic!(
                "creating {} failed ({error}): this test needs root and cgroup v1's memory controller",
                dir.display()
            )
        });
        std::fs::write(dir.join("memory.limit_in_bytes"), limit_bytes.to_string()).expect("set the cgroup's limit");
        MemoryCgroup(dir)
    }

    /// A shell that joins the cgroup and execs the command after it.
    fn wrapper(&self) -> [String; 4] {
        let procs = self.0.join("cgroup.procs");
        ["sh".into(), "-c".into(), format!("echo $$ > {} && exec \"$@\"", procs.display()), "sh".into()]
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its processes are gone by now (the daemons are dropped first); a cgroup with
        // none left can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn a_share_of_the_limit_is_a_share_of_the_daemon_s_own_cgroup() {
    let cgroup = MemoryCgroup::new(1 << 30);
    let wrapper = cgroup.wrapper();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(&placement, "num_shards = 4\n[[instances]]\nid = \"agg-1\"\nendpoint = \"127.0.0.1:1\"\n").unwrap();
    let placement = format!("[placement]\nkind = \"static\"\npath = \"{}\"\n", placement.display());
    let configs = |telemetry: u16| {
        let telemetry = format!("[telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n");
        [
            (
                "tessera-collector",
                "tessera_collector_memory_limit_bytes",
                format!("memory_limit = \"25%\"\n[udp]\nlisten = \"127.0.0.1:0\"\n{telemetry}{placement}"),
            ),
            (
                "tessera-aggregator",
                "tessera_aggregator_memory_limit_bytes",
                format!(
                    "memory_limit = \"25%\"\ninstance_id = \"agg-1\"\nlisten = \"127.0.0.1:0\"\n{telemetry}\
                     [ingester]\nendpoints = [\"127.0.0.1:1\"]\n{placement}"
                ),
            ),
            (
                "tessera-ingester",
                "tessera_ingester_memory_limit_bytes",
                format!(
                    "memory_limit = \"25%\"\ninstance_id = \"ing-1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\
                     {telemetry}[sink]\nkind = \"file\"\ndir = \"{}\"\n",
                    dir.path().join("ingester").display(),
                    dir.path().join("sink").display()
                ),
            ),
        ]
    };
    let port = free_port();
    let telemetry = format!("127.0.0.1:{port}").parse().unwrap();
    for (binary, gauge, config) in configs(port) {
        let mut daemon = Daemon::start_wrapped(binary, binary, &config, telemetry, &[], &wrapper);
        assert_eq!(daemon.metric(gauge, ""), (256u64 << 20) as f64, "{binary}: {}", daemon.log());
        daemon.terminate();
        // Without `memory_limit`, 80 % of the cgroup's limit is the budget; "none" is none.
        let unset = config.replace("memory_limit = \"25%\"\n", "");
        let mut daemon = Daemon::start_wrapped(binary, binary, &unset, telemetry, &[], &wrapper);
        assert_eq!(daemon.metric(gauge, ""), ((1u64 << 30) as f64 * 0.8).floor(), "{binary}: {}", daemon.log());
        daemon.terminate();
        let none = config.replace("memory_limit = \"25%\"", "memory_limit = \"none\"");
        let mut daemon = Daemon::start_wrapped(binary, binary, &none, telemetry, &[], &wrapper);
        assert_eq!(daemon.metric(gauge, ""), 0.0, "{binary}: {}", daemon.log());
        daemon.terminate();
    }
}

#[test]
fn without_memory_limit_the_budget_follows_the_cgroup_the_daemon_runs_in() {
    let dir = tempfile::tempdir().unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(&placement, "num_shards = 4\n[[instances]]\nid = \"agg-1\"\nendpoint = \"127.0.0.1:1\"\n").unwrap();
    let port = free_port();
    let config = format!(
        "[udp]\nlisten = \"127.0.0.1:0\"\n[telemetry]\nlisten = \"127.0.0.1:{port}\"\n\
         [placement]\nkind = \"static\"\npath = \"{}\"\n",
        placement.display()
    );
    // Run where the test runs: the machine's root memory cgroup here, with no limit (a
    // container with one would give 80 % of it).
    let inherited = tessera_runtime::memory::process_cgroup_limit_bytes();
    let due = inherited.map_or(0.0, |limit| (limit as f64 * 0.8).floor());
    let telemetry = format!("127.0.0.1:{port}").parse().unwrap();
    let mut daemon = Daemon::start("tessera-collector", "tessera-collector", &config, telemetry);
    assert_eq!(daemon.metric("tessera_collector_memory_limit_bytes", ""), due, "{}", daemon.log());
    daemon.terminate();
}
