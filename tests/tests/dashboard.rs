//! The dashboard page of `tessera local`, loaded in a real headless Chromium
//! (Debian's `chromium`; `scripts/setup.sh` installs it) while statsd flows:
//! the charts fill from the daemon's own metrics, the rendered DOM shows
//! lines/s above zero and an end-to-end latency, no script error happens,
//! and a screenshot is saved as a test artifact
//! (`target/test-artifacts/dashboard.png`).

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_testkit::daemons::binary;
use tessera_testkit::process::{Server, system_binary};
use tessera_testkit::{free_port, http_get};

fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

/// Runs headless Chromium on `url` with `arguments`; returns stdout and stderr.
fn chromium(url: &str, arguments: &[&str]) -> (String, String) {
    let output = Command::new(system_binary("CHROMIUM", "chromium"))
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"])
        // Lets the page's timers and polls run for 6 s of page time.
        .arg("--virtual-time-budget=6000")
        .args(arguments)
        .arg(url)
        .output()
        .expect("run chromium (scripts/setup.sh installs Debian's `chromium`)");
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The value of `attribute` on the first tag of the DOM dump that holds `marker`.
fn attribute_near<'a>(dom: &'a str, marker: &str, attribute: &str) -> Option<&'a str> {
    let at = dom.find(marker)?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let value = tag.split(&format!("{attribute}=\"")).nth(1)?;
    value.split('"').next()
}

/// The legend entries (`data-line`, `data-latest`) inside one panel's section.
fn legend(dom: &str, panel: &str) -> Vec<(String, Option<f64>)> {
    let Some(start) = dom.find(&format!("data-panel=\"{panel}\"")) else { return Vec::new() };
    let section = &dom[start..start + dom[start..].find("</section>").unwrap_or(dom.len() - start)];
    section
        .split("<li ")
        .skip(1)
        .filter_map(|item| {
            let line = item.split("data-line=\"").nth(1)?.split('"').next()?;
            let latest = item.split("data-latest=\"").nth(1)?.split('"').next()?;
            Some((line.to_owned(), latest.parse().ok()))
        })
        .collect()
}

/// The DOM of the page at `url` in Chromium, checked to have run without a script error,
/// to show no error, and to be live (its data polls answered).
fn live_page(url: &str) -> String {
    live_page_with(url, &[])
}

/// [`live_page`] with more Chromium flags.
fn live_page_with(url: &str, flags: &[&str]) -> String {
    let (dom, log) = chromium(url, &[&["--dump-dom"][..], flags].concat());
    let uncaught: Vec<&str> = log.lines().filter(|line| line.contains("Uncaught")).collect();
    assert!(uncaught.is_empty(), "script errors on the page: {uncaught:?}");
    assert_eq!(attribute_near(&dom, "id=\"errors\"", "data-count"), Some("0"), "errors shown on the page:\n{dom}");
    assert_eq!(attribute_near(&dom, "id=\"status\"", "data-state"), Some("live"), "{dom}");
    dom
}

fn artifact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_dashboard_page_shows_live_rates_and_latency_in_a_real_browser() {
    let (statsd, telemetry) = (free_port(), free_port());
    let dir = Server::directory();
    let mut command = Command::new(binary("tessera"));
    command
        .args(["local", "--plain", "--log-level", "info"])
        .args(["--statsd", &loopback(statsd).to_string(), "--telemetry", &loopback(telemetry).to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // 1 s tiles: an end-to-end latency within seconds.
        .args(["--policy", "1s:1h", "--policy", "10s:1h"]);
    let mut local = Server::spawn("tessera local", command, dir, "");
    local.wait_ready(loopback(telemetry), "/readyz", Duration::from_secs(30)).unwrap();

    // Statsd flows for the whole test: 20 counters every 20 ms.
    let sending = Arc::new(AtomicBool::new(true));
    let sender = {
        let sending = sending.clone();
        std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            let datagram: String = (0..20).map(|series| format!("dash.hits:1|c|#series:s{series}\n")).collect();
            while sending.load(Ordering::Relaxed) {
                let _ = socket.send_to(datagram.as_bytes(), loopback(statsd));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // The data the page reads has a rate and a latency before the browser is pointed at it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(loopback(telemetry), "/dashboard/data?since=0").unwrap();
        assert_eq!(status, 200);
        let data: serde_json::Value = serde_json::from_str(&body).unwrap();
        let last = |panel: &str, line: &str| {
            let panels = data["panels"].as_array()?;
            let panel = panels.iter().find(|candidate| candidate["id"] == panel)?;
            let line = panel["lines"].as_array()?.iter().find(|candidate| candidate["name"] == line)?;
            line["points"].as_array()?.last()?[1].as_f64()
        };
        if last("lines_in", "lines").is_some_and(|rate| rate > 0.0) && last("end_to_end", "p99 1s").is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "no rate and latency in the dashboard data: {body}");
        std::thread::sleep(Duration::from_millis(250));
    }

    let url = format!("http://{}/", loopback(telemetry));
    let dom = live_page(&url);
    for panel in
        ["lines_in", "drops", "active_series", "tiles", "queues", "storage_latency", "end_to_end", "latency_breakdown"]
    {
        assert!(dom.contains(&format!("data-panel=\"{panel}\"")), "no `{panel}` chart:\n{dom}");
    }
    let lines_in = legend(&dom, "lines_in");
    let lines = lines_in.iter().find(|(name, _)| name == "lines").and_then(|(_, latest)| *latest);
    assert!(lines.is_some_and(|rate| rate > 0.0), "lines/s shown: {lines_in:?}");
    let end_to_end = legend(&dom, "end_to_end");
    let p99 = end_to_end.iter().find(|(name, _)| name == "p99 1s").and_then(|(_, latest)| *latest);
    assert!(p99.is_some_and(|latency| latency > 0.0 && latency < 10.0), "latency shown: {end_to_end:?}");
    let drawn =
        attribute_near(&dom, "data-panel=\"lines_in\"", "data-points").and_then(|count| count.parse::<u32>().ok());
    assert!(drawn.is_some_and(|count| count > 0), "the lines chart has points: {drawn:?}");
    assert!(dom.contains("<polyline"), "lines are drawn");

    let screenshot = artifact_dir().join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let (_, log) = chromium(&url, &["--window-size=1280,1100", &format!("--screenshot={}", screenshot.display())]);
    let png = std::fs::read(&screenshot).unwrap_or_else(|error| panic!("no screenshot ({error}): {log}"));
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of {} bytes", png.len());

    // The other paths are unchanged; unknown ones are 404.
    assert_eq!(http_get(loopback(telemetry), "/nope").unwrap().0, 404);
    let (status, metrics) = http_get(loopback(telemetry), "/metrics").unwrap();
    assert!(status == 200 && metrics.contains("tessera_collector_lines_received_total"));
    assert_eq!(http_get(loopback(telemetry), "/healthz").unwrap().0, 200);

    sending.store(false, Ordering::Relaxed);
    sender.join().unwrap();
    assert_eq!(local.terminate(), Some(0), "tessera local drains and exits cleanly");
}

/// The dashboard behind TLS and basic auth (`tessera local --web-config` with
/// `tls_server_config` and `basic_auth_users`): Chromium with the password in the URL loads
/// the page over HTTPS, and its data polls; without the password it gets the 401 page.
/// (Chromium is told to accept the test CA's certificate: it has no flag to trust a CA.)
#[test]
fn the_dashboard_loads_through_tls_and_basic_auth_in_a_real_browser_and_not_without_the_password() {
    use tessera_testkit::tls::{Pki, TEST_PASSWORD, TEST_PASSWORD_BCRYPT, https_get};
    let (statsd, telemetry) = (free_port(), free_port());
    let dir = Server::directory();
    let pki = Pki::create(dir.path());
    let web_config = dir.path().join("web.yml");
    let tls = format!(
        "tls_server_config:\n  cert_file: {:?}\n  key_file: {:?}\n",
        pki.server_cert.display().to_string(),
        pki.server_key.display().to_string()
    );
    std::fs::write(&web_config, format!("{tls}basic_auth_users:\n  tessera: {TEST_PASSWORD_BCRYPT}\n")).unwrap();
    let mut command = Command::new(binary("tessera"));
    command
        .args(["local", "--plain"])
        .args(["--statsd", &loopback(statsd).to_string(), "--telemetry", &loopback(telemetry).to_string()])
        .arg("--web-config")
        .arg(&web_config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--policy", "1s:1h"]);
    let ca = pki.ca.clone();
    let get = move |path: &str, auth| https_get(loopback(telemetry), path, &ca, auth);
    let right = Some(("tessera", TEST_PASSWORD));
    let mut local = Server::spawn("tessera local", command, dir, "");
    local.wait_ready_with(Duration::from_secs(30), || matches!(get("/readyz", None), Ok((200, _)))).unwrap();
    assert!(!matches!(http_get(loopback(telemetry), "/readyz"), Ok((200, _))), "HTTPS only");
    assert_eq!(get("/dashboard/data?since=0", None).unwrap().0, 401);
    assert_eq!(get("/dashboard/data?since=0", right).unwrap().0, 200);

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let datagram: String = (0..20).map(|series| format!("dash.hits:1|c|#series:s{series}\n")).collect();
    // A few seconds of statsd, so that the dashboard's sampler has points to show.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        socket.send_to(datagram.as_bytes(), loopback(statsd)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }

    let insecure = ["--ignore-certificate-errors"];
    let url = format!("https://tessera:{TEST_PASSWORD}@localhost:{}/", telemetry);
    let dom = live_page_with(&url, &insecure);
    let drawn =
        attribute_near(&dom, "data-panel=\"lines_in\"", "data-points").and_then(|count| count.parse::<u32>().ok());
    assert!(drawn.is_some_and(|count| count > 0), "the page's data polls went through: {drawn:?}\n{dom}");

    let missing = |metrics: &str| {
        let sample = "tessera_local_telemetry_auth_failures_total{reason=\"missing\"} ";
        metrics.lines().find_map(|line| line.strip_prefix(sample)?.parse::<f64>().ok()).unwrap_or(0.0)
    };
    let before = missing(&get("/metrics", right).unwrap().1);
    let (refused, _) =
        chromium(&format!("https://localhost:{telemetry}/"), &[&["--dump-dom"][..], &insecure[..]].concat());
    assert!(!refused.contains("data-panel="), "no dashboard without the password:\n{refused}");
    let after = missing(&get("/metrics", right).unwrap().1);
    assert!(after > before, "the browser's request without a password is counted: {before} -> {after}");
    assert_eq!(local.terminate(), Some(0), "tessera local drains and exits cleanly");
}
