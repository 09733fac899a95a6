//! Origin detection on the real binaries, into a real Prometheus: metrics sent over the
//! collector's Unix socket carry the tags of the container that sent them.
//!
//! - **Real containers.** Docker Engine runs here with no registry, so the sender is a
//!   static C program (`tests/data/origin-sender.c`, `cc -static`) imported as an image of
//!   one file (`docker import`). Two containers, each with its own `app` label, send over
//!   the mounted socket directory; the collector reads each sender's PID from the socket
//!   (`SO_PASSCRED`), its container from `/proc/<pid>/cgroup`, and its tags from the
//!   Docker Engine API. Every line arrives (the sum is exact); every tagged series carries
//!   its own container's tags, never the other's; a line naming a container nobody knows
//!   (`|c:ci-<id>`) arrives untagged and is counted.
//! - **Failures never cost the metric.** A tag source that never answers, and a sender
//!   whose PID is not in `/proc` (a fake `/proc` stands in for it, so the test does not
//!   race a process' exit): every line arrives untagged, counted by reason.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    ONE_SECOND_SINK, ONE_SECOND_TILES, collector_config, scalar, start_daemon, start_ingester, start_lone_aggregator,
    wait_until,
};

/// Compiles the static sender into `dir`.
fn build_sender(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/origin-sender.c");
    let binary = dir.join("sender");
    let output = Command::new("cc").args(["-static", "-O2", "-o"]).arg(&binary).arg(&source).output().expect("run cc");
    assert!(output.status.success(), "cc -static: {}", String::from_utf8_lossy(&output.stderr));
    binary
}

/// A collector on a free UDP port with its Unix socket at `socket` (writable by every
/// user), origin detection on
/// with `origin` (keys of `[origin]`, then its sub-tables), forwarding to `placement`.
fn start_collector(placement: &str, socket: &Path, origin: &str) -> Daemon {
    let config = format!(
        "{}[unix]\npath = {:?}\nmode = 0o666\n[origin]\nenabled = true\n{origin}",
        collector_config("host-1", free_port(), placement, ""),
        socket.display().to_string()
    );
    start_daemon("collector", "tessera-collector", &config, free_port())
}

/// The whole pipeline into a fresh Prometheus (1 s tiles), the collector's socket at
/// `socket` and `origin` as in [`start_collector`].
struct Pipeline {
    prometheus: Prometheus,
    collector: Daemon,
    /// The ingester and the aggregator, held until the test ends (bind it by name: a
    /// pattern's `..` would drop them at once).
    _upstream: (Daemon, Daemon),
}

fn start_pipeline(dir: &Path, socket: &Path, origin: &str) -> Pipeline {
    let prometheus = Prometheus::start();
    let (ingester, ingester_port) = start_ingester(dir, &prometheus, ONE_SECOND_SINK);
    let (aggregator, placement) = start_lone_aggregator(dir, free_port(), ONE_SECOND_TILES, ingester_port, "");
    let collector = start_collector(&placement, socket, origin);
    Pipeline { prometheus, collector, _upstream: (ingester, aggregator) }
}

/// A fake `/proc` under `dir` in which this test process runs in the cgroup `cgroup`.
fn pretend_this_process_runs_in(dir: &Path, cgroup: &str) -> PathBuf {
    let proc_root = dir.join("proc");
    let me = std::process::id();
    std::fs::create_dir_all(proc_root.join(me.to_string())).unwrap();
    std::fs::write(proc_root.join(format!("{me}/cgroup")), format!("0::{cgroup}\n")).unwrap();
    proc_root
}

/// The image and the containers a test made, removed however it ends.
struct Containers {
    image: String,
    names: Vec<String>,
}

impl Drop for Containers {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
        let _ = Command::new("docker").args(["rmi", "-f", &self.image]).output();
    }
}

fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().expect("run docker (scripts/setup.sh installs it)");
    assert!(output.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The labels of every series `promql` selects, as `name=value` lists.
fn series_labels(prometheus: &Prometheus, promql: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let result = prometheus.query(promql, now);
    result
        .as_array()
        .map(|series| {
            series
                .iter()
                .map(|one| {
                    let mut labels: Vec<(String, String)> = one["metric"]
                        .as_object()
                        .map(|labels| {
                            labels.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect()
                        })
                        .unwrap_or_default();
                    labels.sort();
                    let value = one["value"][1].as_str().and_then(|value| value.parse().ok()).unwrap_or(f64::NAN);
                    (labels, value)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn label<'a>(labels: &'a [(String, String)], name: &str) -> Option<&'a str> {
    labels.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

#[test]
fn each_containers_metrics_carry_its_own_containers_tags() {
    let dir = tempfile::tempdir().unwrap();
    let sender = build_sender(dir.path());
    // An image of one file: the static sender.
    let image = format!("tessera-origin-sender:{}", std::process::id());
    let mut made = Containers { image: image.clone(), names: Vec::new() };
    let tar = Command::new("tar").arg("-C").arg(dir.path()).args(["-cf", "-", "sender"]).output().expect("run tar");
    assert!(tar.status.success());
    let mut import = Command::new("docker")
        .args(["import", "-", &image])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run docker import");
    std::io::Write::write_all(import.stdin.as_mut().unwrap(), &tar.stdout).unwrap();
    drop(import.stdin.take());
    assert!(import.wait().unwrap().success(), "docker import");
    assert!(sender.exists());

    let sockets = dir.path().join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    let Pipeline { prometheus, collector, _upstream } = start_pipeline(
        dir.path(),
        &sockets.join("statsd.sock"),
        "cardinality = \"orchestrator\"\n[origin.docker]\nlabels = [\"app\"]\n",
    );

    let suffix = std::process::id();
    let (alpha, beta, gamma) =
        (format!("origin-alpha-{suffix}"), format!("origin-beta-{suffix}"), format!("origin-gamma-{suffix}"));
    made.names = vec![alpha.clone(), beta.clone(), gamma.clone()];
    let mount = format!("{}:/run/tessera", sockets.display());
    let unknown = "9".repeat(64);
    let named_line = format!("origin.named:1|c|c:ci-{unknown}");
    for (name, app, line) in [
        (&alpha, "alpha", "origin.hits:1|c"),
        (&beta, "beta", "origin.hits:1|c"),
        (&gamma, "gamma", named_line.as_str()),
    ] {
        let label = format!("app={app}");
        docker(&[
            "run",
            "-d",
            "--name",
            name,
            "--label",
            &label,
            "-v",
            &mount,
            &image,
            "/sender",
            "/run/tessera/statsd.sock",
            "200",
            "25",
            line,
        ]);
    }
    for name in [&alpha, &beta, &gamma] {
        assert_eq!(docker(&["wait", name]), "0", "{name}: {}", docker(&["logs", name]));
    }

    // Every line arrives, tagged or not.
    wait_until("all 400 hits and 200 named lines in Prometheus", Duration::from_secs(60), || {
        scalar(&prometheus, "sum(origin_hits_total)") == Some(400.0)
            && scalar(&prometheus, "sum(origin_named_total)") == Some(200.0)
    });
    let series = series_labels(&prometheus, "origin_hits_total");
    let mut tagged = [0.0, 0.0];
    let mut untagged = 0.0;
    for (labels, value) in &series {
        match label(labels, "app") {
            Some("alpha") => {
                assert_eq!(label(labels, "container_name"), Some(alpha.as_str()), "{labels:?}");
                tagged[0] += value;
            }
            Some("beta") => {
                assert_eq!(label(labels, "container_name"), Some(beta.as_str()), "{labels:?}");
                tagged[1] += value;
            }
            Some(other) => panic!("a series tagged app={other}: {labels:?}"),
            None => {
                assert_eq!(label(labels, "container_name"), None, "{labels:?}");
                untagged += value;
            }
        }
        if label(labels, "app").is_some() {
            assert_eq!(label(labels, "short_image"), Some("tessera-origin-sender"), "{labels:?}");
            assert_eq!(label(labels, "image_tag"), Some(suffix.to_string().as_str()), "{labels:?}");
            assert_eq!(label(labels, "container_id"), None, "the container id is for `high` only: {labels:?}");
        }
    }
    // The first lines of a container may come before the listing that knows it (one is
    // asked for at once, at most once a second): 200 lines at 25 ms take 5 s.
    assert!(tagged[0] >= 100.0 && tagged[1] >= 100.0, "tagged {tagged:?}, untagged {untagged}: {series:?}");
    assert_eq!(collector.metric("tessera_collector_origin_tagged_lines_total", ""), tagged[0] + tagged[1]);

    // The line that named an unknown container: untagged, counted, and without the raw
    // `container_id` tag (that is for `high`).
    let named = series_labels(&prometheus, "origin_named_total");
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(label(&named[0].0, "container_id"), None, "{named:?}");
    assert_eq!(label(&named[0].0, "app"), None, "{named:?}");
    let untagged_counted: f64 = ["pending", "unknown_container", "source_error"]
        .iter()
        .map(|reason| collector.metric("tessera_collector_origin_untagged_total", &format!("reason=\"{reason}\"")))
        .sum();
    assert_eq!(untagged_counted, untagged + 200.0, "every untagged line is counted");
    assert!(collector.metric("tessera_collector_origin_lookups_total", "result=\"ok\"") >= 1.0);
}

#[test]
fn a_silent_tag_source_and_an_exited_sender_cost_the_tags_never_the_metric() {
    let dir = tempfile::tempdir().unwrap();
    let sender = build_sender(dir.path());
    // A fake /proc where this test process runs in a container, and the sender's PID
    // (a process that has exited, as far as the collector can tell) is not there.
    let proc_root = pretend_this_process_runs_in(dir.path(), &format!("/docker/{}", "a".repeat(64)));
    // A Docker API that takes connections and never answers.
    let silent = dir.path().join("docker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming().flatten() {
            held.push(connection);
        }
    });

    let socket = dir.path().join("statsd.sock");
    let Pipeline { prometheus, collector, _upstream } = start_pipeline(
        dir.path(),
        &socket,
        &format!(
            "lookup_timeout_ms = 300\nrefresh_secs = 1\nproc_root = {:?}\n[origin.docker]\nsocket = {:?}\n",
            proc_root.display().to_string(),
            silent.display().to_string()
        ),
    );

    let client = UnixDatagram::unbound().unwrap();
    for _ in 0..50 {
        client.send_to(b"silent.hits:1|c", &socket).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = Command::new(&sender).arg(&socket).args(["30", "0", "gone.hits:1|c"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    wait_until("every line in Prometheus", Duration::from_secs(60), || {
        scalar(&prometheus, "sum(silent_hits_total)") == Some(50.0)
            && scalar(&prometheus, "sum(gone_hits_total)") == Some(30.0)
    });
    for metric in ["silent_hits_total", "gone_hits_total"] {
        let series = series_labels(&prometheus, metric);
        assert_eq!(series.len(), 1, "one untagged series: {series:?}");
        assert!(series[0].0.iter().all(|(key, _)| key == "__name__"), "no tags: {series:?}");
    }
    let untagged =
        |reason: &str| collector.metric("tessera_collector_origin_untagged_total", &format!("reason=\"{reason}\""));
    assert_eq!(untagged("pending") + untagged("source_error"), 50.0, "the silent source's lines");
    assert_eq!(untagged("pid_gone"), 30.0, "the exited sender's lines");
    assert!(collector.metric("tessera_collector_origin_lookups_total", "result=\"timeout\"") >= 1.0);
    assert_eq!(collector.metric("tessera_collector_origin_tagged_lines_total", ""), 0.0);
}

/// Serves `body` at `/pods` to requests that carry `Authorization: Bearer <token>`
/// (401 to others), over plain HTTP on a free loopback port; returns the port and the
/// count of authorised requests.
fn serve_pods(body: Vec<u8>, token: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&served);
    std::thread::spawn(move || {
        for mut connection in listener.incoming().flatten() {
            let mut reader = BufReader::new(connection.try_clone().unwrap());
            let mut request = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                request.push_str(&line);
            }
            let authorised = request.starts_with("GET /pods ")
                && request.lines().any(|line| line.eq_ignore_ascii_case(&format!("authorization: Bearer {token}")));
            let (status, body) = if authorised {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                ("200 OK", body.as_slice())
            } else {
                ("401 Unauthorized", &b"Unauthorized"[..])
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = connection.write_all(head.as_bytes()).and_then(|()| connection.write_all(body));
        }
    });
    (port, served)
}

#[test]
fn the_kubelets_pod_list_tags_by_credentials_and_by_external_data() {
    let dir = tempfile::tempdir().unwrap();
    // A kubelet `/pods` response recorded from a cluster (names changed), served as is.
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/collector/tests/data/kubelet-pods.json");
    let (port, served) = serve_pods(std::fs::read(recorded).unwrap(), "s3cr3t");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cr3t\n").unwrap();
    // This test process runs, as far as the collector can tell, in the `app` container of
    // the recorded pod `web-7d4b9c8f6d-x2x9q`.
    let proc_root = pretend_this_process_runs_in(
        dir.path(),
        "/kubepods/burstable/pod0f1e2d3c-1111-2222-3333-444455556666/\
         4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c",
    );

    let socket = dir.path().join("statsd.sock");
    let Pipeline { prometheus, collector, _upstream } = start_pipeline(
        dir.path(),
        &socket,
        &format!(
            "proc_root = {:?}\n[origin.kubelet]\nurl = \"http://127.0.0.1:{port}/pods\"\ntoken_file = {:?}\nlabels = [\"app\"]\n",
            proc_root.display().to_string(),
            token.display().to_string()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "[unix] mode");
    wait_until("the first listing", Duration::from_secs(20), || {
        collector.metric("tessera_collector_origin_lookups_total", "result=\"ok\"") >= 1.0
    });
    assert!(served.load(std::sync::atomic::Ordering::Relaxed) >= 1, "the token went with the request");

    let client = UnixDatagram::unbound().unwrap();
    // By the sender's credentials; by external data (as a DogStatsD client in a pod the
    // admission controller set up sends it, here for the `db-0` pod's container); by
    // the container id a UDP client would send.
    client.send_to(b"kube.hits:1|c|#zone:a", &socket).unwrap();
    client.send_to(b"kube.hits:2|c|e:it-false,cn-postgres,pu-7a6b5c4d-1111-2222-3333-999988887777", &socket).unwrap();
    client
        .send_to(b"kube.hits:4|c|c:ci-5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d", &socket)
        .unwrap();
    wait_until("the three series", Duration::from_secs(60), || {
        scalar(&prometheus, "sum(kube_hits_total)") == Some(7.0)
    });
    let expect = |promql: &str, value: f64| assert_eq!(scalar(&prometheus, promql), Some(value), "{promql}");
    expect(
        "kube_hits_total{kube_namespace=\"shop\",kube_deployment=\"web\",kube_container_name=\"app\",\
         app=\"web\",short_image=\"web\",image_tag=\"2.0\",zone=\"a\"}",
        1.0,
    );
    expect(
        "kube_hits_total{kube_namespace=\"shop\",kube_statefulset=\"db\",kube_container_name=\"postgres\",app=\"db\"}",
        2.0,
    );
    expect("kube_hits_total{kube_deployment=\"web\",kube_container_name=\"proxy\",short_image=\"envoy\"}", 4.0);
    // `low`: neither the pod's name nor the container id.
    assert_eq!(scalar(&prometheus, "count(kube_hits_total{pod_name!=\"\"})"), None);
    assert_eq!(scalar(&prometheus, "count(kube_hits_total{container_id!=\"\"})"), None);
    assert_eq!(collector.metric("tessera_collector_origin_tagged_lines_total", ""), 3.0);
}
