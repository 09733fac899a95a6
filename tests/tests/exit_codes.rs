//! The three daemons fail the same way: a configuration that cannot work,
//! found when it is read or when the daemon starts (a placement file that is
//! not there), exits 64 naming the problem; `--help` exits 0. So do
//! `tessera local`'s remote-write flags that cannot work.

use std::process::Command;

use tessera_testkit::daemons::binary;

const DAEMONS: [&str; 3] = ["tessera-collector", "tessera-aggregator", "tessera-ingester"];

fn run(daemon: &str, config_text: &str, check_only: bool) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config_text).unwrap();
    let mut command = Command::new(binary(daemon));
    command.arg("--config").arg(&path);
    if check_only {
        command.arg("--check-config");
    }
    let output = command.output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn bad_configurations_exit_64_in_every_daemon() {
    for daemon in DAEMONS {
        let (code, stderr) = run(daemon, "no_such_key = 1\n", true);
        assert_eq!(code, Some(64), "{daemon}: {stderr}");
        assert!(stderr.contains("no_such_key"), "{daemon}: {stderr}");
        let missing = Command::new(binary(daemon)).args(["--config", "/nonexistent/tessera.toml"]).output().unwrap();
        assert_eq!(missing.status.code(), Some(64), "{daemon}");
        assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/tessera.toml"), "{daemon}");
        let help = Command::new(binary(daemon)).arg("--help").output().unwrap();
        assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("--check-config"));
    }
}

#[test]
fn a_placement_missing_at_start_exits_64_in_every_daemon_that_reads_one() {
    let placement = "[placement]\nkind = \"static\"\npath = \"/nonexistent/placement.toml\"\n";
    let dir = tempfile::tempdir().unwrap();
    let aggregators = dir.path().join("aggregators.toml");
    std::fs::write(&aggregators, "num_shards = 4\n[[instances]]\nid = \"agg-1\"\nendpoint = \"127.0.0.1:1\"\n")
        .unwrap();
    let cases = [
        (
            "tessera-collector",
            "/nonexistent/placement.toml",
            format!("[udp]\nlisten = \"127.0.0.1:0\"\n[telemetry]\n{placement}"),
        ),
        (
            "tessera-aggregator",
            "/nonexistent/placement.toml",
            format!(
                "instance_id = \"agg-1\"\nlisten = \"127.0.0.1:0\"\n{placement}[ingester]\nendpoints = [\"127.0.0.1:1\"]\n"
            ),
        ),
        (
            "tessera-aggregator",
            "cannot load the ingesters' placement",
            format!(
                "instance_id = \"agg-1\"\nlisten = \"127.0.0.1:0\"\n[placement]\nkind = \"static\"\npath = {:?}\n\
                 [ingester.placement]\nkind = \"static\"\npath = \"/nonexistent/ingesters.toml\"\n",
                aggregators.display().to_string()
            ),
        ),
    ];
    for (daemon, expected, text) in cases {
        let (code, stderr) = run(daemon, &text, false);
        assert_eq!(code, Some(64), "{daemon}: {stderr}");
        assert!(stderr.contains("failed to start"), "{daemon}: {stderr}");
        assert!(stderr.contains(expected), "{daemon}: {stderr}");
    }
}

#[test]
fn tessera_local_exits_64_on_remote_write_flags_that_cannot_work() {
    let url = "http://127.0.0.1:1/api/v1/write";
    let cases: [(&[&str], &str); 4] = [
        (&["--remote-write-header", "X-Scope-OrgID=team-a"], "--remote-write-header needs --remote-write"),
        (&["--remote-write", url, "--remote-write-basic-auth", "alice"], "expected USER:PASSWORD_FILE"),
        (&["--remote-write", url, "--remote-write-header", "no-equals-sign"], "expected NAME=VALUE"),
        (&["--remote-write", url, "--remote-write-bearer-token-file", "/nonexistent/token"], "/nonexistent/token"),
    ];
    for (flags, expected) in cases {
        let output = Command::new(binary("tessera")).arg("local").args(flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

#[test]
fn rules_that_cannot_load_exit_64_naming_the_file_or_key() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yml");
    std::fs::write(&broken, "mappings:\n- match: a.*\n  name: a\n  no_such_key: 1\n").unwrap();
    let placement = "[placement]\nkind = \"static\"\npath = \"p.toml\"\n";
    let cases = [
        (format!("[mapping]\nfile = \"/nonexistent/map.yml\"\n{placement}"), "/nonexistent/map.yml".to_owned()),
        (format!("[mapping]\nfile = {:?}\n{placement}", broken.display().to_string()), "no_such_key".to_owned()),
        (format!("[rules]\ndeny = [\"a|b\"]\n{placement}"), "rules.deny".to_owned()),
        (
            format!("[[rules.limit]]\nmatch = \"a\"\nmax_series = 0\n{placement}"),
            "rules.limit[0].max_series".to_owned(),
        ),
    ];
    for (text, expected) in cases {
        let (code, stderr) = run("tessera-collector", &text, true);
        assert_eq!(code, Some(64), "{text}: {stderr}");
        assert!(stderr.contains(&expected), "{text}: {stderr}");
    }
    let local =
        Command::new(binary("tessera")).args(["local", "--mapping-config", "/nonexistent/m.yml"]).output().unwrap();
    assert_eq!(local.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&local.stderr).contains("/nonexistent/m.yml"));
    let local = Command::new(binary("tessera")).args(["local", "--policy", "10s"]).output().unwrap();
    assert_eq!(local.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&local.stderr).contains("--policy: storage policy `10s`"));
    let check = Command::new(binary("tessera"))
        .args(["check", "--mapping", &broken.display().to_string(), "--line", "a.b:1|c"])
        .output()
        .unwrap();
    assert!(!check.status.success());
    assert!(
        String::from_utf8_lossy(&check.stderr).contains("no_such_key"),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn tessera_check_shows_what_the_rules_make_of_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let mapping = dir.path().join("mapping.yml");
    std::fs::write(
        &mapping,
        "mappings:\n- match: api.*.*\n  name: api_requests\n  labels:\n    method: $1\n    code: $2\n",
    )
    .unwrap();
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, "[rules]\ndeny = [\"debug.*\"]\nglobal_tags = { region = \"eu\" }\n").unwrap();
    let check = Command::new(binary("tessera"))
        .args(["check", "--mapping", &mapping.display().to_string(), "--rules", &config.display().to_string()])
        .args(["--line", "api.GET.200:1|c", "--line", "debug.x:1|c", "--line", "other:1|g"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{stdout}{}", String::from_utf8_lossy(&check.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "rules ok");
    assert!(lines[1].contains("-> api_requests|#code:200,method:GET,region:eu\tshard="), "{}", lines[1]);
    assert!(lines[1].ends_with("rules=mapping[0]:api.*.* mapped"), "{}", lines[1]);
    assert!(lines[2].ends_with("-> dropped\trules=deny[0]:debug.* dropped"), "{}", lines[2]);
    assert!(lines[3].contains("-> other|#region:eu\tshard="), "{}", lines[3]);
}

/// Two resolutions into one target keep the `resolution` label: `--check-config` accepts
/// the file and warns that queries without a `resolution` matcher count both; one
/// resolution per target gets no warning.
#[test]
fn check_config_warns_when_one_target_stores_two_resolutions() {
    let (code, stderr) = run("tessera-ingester", "sink_policies = [\"10s\", \"1m:40d\"]\n", true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("warning:") && stderr.contains("`resolution` label"), "{stderr}");
    let (code, stderr) = run("tessera-ingester", "[policy_sinks.\"1m:40d\"]\nkind = \"file\"\n", true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning:"), "{stderr}");
}
