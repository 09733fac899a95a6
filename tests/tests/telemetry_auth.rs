//! The telemetry port behind basic auth and TLS from a Prometheus web config file
//! (`[telemetry] web_config`): a real Prometheus scrapes a real ingester with the password;
//! jobs with a wrong password or none get nothing and are counted; the probes stay open.
//! With `tls_server_config` and mutual TLS, a real Prometheus scrapes over HTTPS with its
//! client certificate and the password; a job without a certificate, and a plain-HTTP
//! client, get nothing and are counted. The port's certificate rotates without a restart
//! (a broken rotation keeps the old one, counted), and a client that never finishes its
//! handshake holds up no one and is counted when its deadline passes.

use std::time::Duration;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::prometheus::Prometheus;
use tessera_testkit::tls::{Pki, TEST_PASSWORD, TEST_PASSWORD_BCRYPT, https_get, https_get_as, server_certificate};
use tessera_testkit::{free_port, http_get};
use tessera_tests::{loopback, scalar, wait_until};

/// An ingester's config (file sink, data under `dir`) whose telemetry port, on a free
/// port, takes the web config at `web_config`; with that port's address.
fn ingester_with_web_config(dir: &std::path::Path, web_config: &std::path::Path) -> (String, std::net::SocketAddr) {
    let telemetry = loopback(free_port());
    let config = format!(
        "listen = \"127.0.0.1:{}\"\ndata_dir = {:?}\n[sink]\nkind = \"file\"\n\
         [telemetry]\nlisten = \"{telemetry}\"\nweb_config = {:?}\n",
        free_port(),
        dir.join("data").display().to_string(),
        web_config.display().to_string(),
    );
    (config, telemetry)
}

#[test]
fn prometheus_scrapes_through_basic_auth_and_wrong_or_missing_passwords_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let web_config = dir.path().join("web.yml");
    std::fs::write(&web_config, format!("basic_auth_users:\n  tessera: {TEST_PASSWORD_BCRYPT}\n")).unwrap();
    let (config, telemetry) = ingester_with_web_config(dir.path(), &web_config);
    // Started and found ready through /readyz, which needs no password.
    let _ingester = Daemon::start("ingester", "tessera-ingester", &config, telemetry);
    assert_eq!(http_get(telemetry, "/healthz").unwrap().0, 200);
    let (status, body) = http_get(telemetry, "/metrics").unwrap();
    assert_eq!(status, 401, "{body}");
    assert_eq!(http_get(telemetry, "/").unwrap().0, 401, "the dashboard needs the password too");

    let job = |name: &str, password: Option<&str>| {
        let auth = password.map_or(String::new(), |password| {
            format!("    basic_auth:\n      username: tessera\n      password: '{password}'\n")
        });
        format!("  - job_name: {name}\n{auth}    static_configs:\n      - targets: ['{telemetry}']\n")
    };
    let prometheus = Prometheus::start_with_config(&format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{}{}{}",
        job("right", Some(TEST_PASSWORD)),
        job("wrong", Some("not-the-password")),
        job("none", None),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let counted = |reason: &str| {
        scalar(
            &prometheus,
            &format!("tessera_ingester_telemetry_auth_failures_total{{job=\"right\",reason=\"{reason}\"}}"),
        )
    };
    loop {
        let up = ["right", "wrong", "none"].map(|job| scalar(&prometheus, &format!("up{{job=\"{job}\"}}")));
        let done = up == [Some(1.0), Some(0.0), Some(0.0)]
            && counted("wrong").is_some_and(|count| count >= 1.0)
            && counted("missing").is_some_and(|count| count >= 1.0);
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "up {up:?}, wrong {:?}, missing {:?}",
            counted("wrong"),
            counted("missing")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The scrape with the password reads the daemon's own metrics.
    assert_eq!(scalar(&prometheus, "tessera_ingester_up{job=\"right\"}"), Some(1.0));
}

#[test]
fn a_web_config_that_cannot_work_stops_the_daemon_at_start_and_fails_check_config_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let web_config = dir.path().join("web.yml");
    std::fs::write(&web_config, "tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\n").unwrap();
    let config_path = dir.path().join("ingester.toml");
    std::fs::write(
        &config_path,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n[sink]\nkind = \"file\"\n[telemetry]\nlisten = \"127.0.0.1:0\"\nweb_config = {:?}\n",
            dir.path().join("data").display().to_string(),
            web_config.display().to_string(),
        ),
    )
    .unwrap();
    let output = std::process::Command::new(tessera_testkit::daemons::binary("tessera-ingester"))
        .arg("--config")
        .arg(&config_path)
        .output()
        .expect("run tessera-ingester");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    // The certificate files named do not exist: said at start, where they were looked for.
    let missing = dir.path().join("a.pem").display().to_string();
    assert!(stderr.contains(&missing) && stderr.contains("web.yml"), "{stderr}");
    // And by --check-config, before anything starts.
    let checked = std::process::Command::new(tessera_testkit::daemons::binary("tessera-ingester"))
        .arg("--config")
        .arg(&config_path)
        .arg("--check-config")
        .output()
        .expect("run tessera-ingester --check-config");
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(&missing) && stderr.contains("web.yml"), "{stderr}");
}

#[test]
fn prometheus_scrapes_over_mutual_tls_with_basic_auth_and_clients_without_a_certificate_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let web_config = dir.path().join("web.yml");
    std::fs::write(
        &web_config,
        format!(
            "tls_server_config:\n  cert_file: {:?}\n  key_file: {:?}\n  client_ca_file: ca.pem\n  \
             client_auth_type: RequireAndVerifyClientCert\nbasic_auth_users:\n  tessera: {TEST_PASSWORD_BCRYPT}\n",
            pki.server_cert.display().to_string(),
            pki.server_key.display().to_string(),
        ),
    )
    .unwrap();
    let (config, telemetry) = ingester_with_web_config(dir.path(), &web_config);
    let client = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    let get = |path: &str, client, auth| https_get_as(telemetry, path, &pki.ca, client, auth);
    let ingester = Daemon::start_until("ingester", "tessera-ingester", &config, telemetry, || {
        matches!(get("/readyz", client, None), Ok((200, _)))
    });
    let right = Some(("tessera", TEST_PASSWORD));
    assert_eq!(get("/metrics", client, None).unwrap().0, 401, "TLS and the password, both");
    assert_eq!(get("/metrics", client, Some(("tessera", "guess"))).unwrap().0, 401);
    assert_eq!(get("/metrics", client, right).unwrap().0, 200);
    assert!(get("/metrics", None, right).is_err(), "no client certificate: no TLS session");
    assert!(!matches!(http_get(telemetry, "/healthz"), Ok((200, _))), "plain HTTP gets nothing");

    let job = |name: &str, tls: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {:?}\n      server_name: localhost\n{tls}\
             \x20   basic_auth:\n      username: tessera\n      password: '{TEST_PASSWORD}'\n\
             \x20   static_configs:\n      - targets: ['{telemetry}']\n",
            pki.ca.display().to_string()
        )
    };
    let certificate = format!(
        "      cert_file: {:?}\n      key_file: {:?}\n",
        pki.client_cert.display().to_string(),
        pki.client_key.display().to_string()
    );
    let prometheus = Prometheus::start_with_config(&format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{}{}",
        job("mutual", &certificate),
        job("no_certificate", ""),
    ));
    let failures = |reason: &str| {
        scalar(
            &prometheus,
            &format!("tessera_ingester_telemetry_tls_failures_total{{job=\"mutual\",reason=\"{reason}\"}}"),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let up = ["mutual", "no_certificate"].map(|job| scalar(&prometheus, &format!("up{{job=\"{job}\"}}")));
        if up == [Some(1.0), Some(0.0)] && failures("no_certificate").is_some_and(|count| count >= 2.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "up {up:?}, no_certificate {:?}\n{}",
            failures("no_certificate"),
            ingester.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(scalar(&prometheus, "tessera_ingester_up{job=\"mutual\"}"), Some(1.0));
    assert!(failures("tls").is_some_and(|count| count >= 1.0), "the plain-HTTP client: {:?}", failures("tls"));
}

#[test]
fn the_telemetry_certificate_rotates_without_a_restart_and_a_silent_client_holds_up_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path());
    let web_config = dir.path().join("web.yml");
    // TLS alone: no password asked.
    std::fs::write(&web_config, "tls_server_config:\n  cert_file: server.pem\n  key_file: server-key.pem\n").unwrap();
    let (config, telemetry) = ingester_with_web_config(dir.path(), &web_config);
    let get = |path: &str| https_get(telemetry, path, &pki.ca, None);
    let _ingester = Daemon::start_until("ingester", "tessera-ingester", &config, telemetry, || {
        matches!(get("/readyz"), Ok((200, _)))
    });
    let metric = |sample: &str| {
        let metrics = get("/metrics").unwrap().1;
        metrics.lines().find_map(|line| line.strip_prefix(sample)?.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    let timeouts = "tessera_ingester_telemetry_tls_failures_total{reason=\"timeout\"}";

    // A client that connects and never says a word: the others are served meanwhile, well
    // before its handshake deadline counts it (a listener that handshook in turn would
    // serve them only after that).
    let silent = std::net::TcpStream::connect(telemetry).unwrap();
    assert_eq!(get("/metrics").unwrap().0, 200);
    assert_eq!(metric(timeouts), 0.0, "served before the silent client's deadline");

    // A rotation: new connections get the new certificate, with no restart.
    let first = server_certificate(telemetry, &pki.ca, None).unwrap();
    pki.rotate_server();
    wait_until("the rotated certificate served", Duration::from_secs(30), || {
        server_certificate(telemetry, &pki.ca, None).unwrap() != first
    });
    let rotated = server_certificate(telemetry, &pki.ca, None).unwrap();

    // A rotation that does not load keeps the certificate served, and is counted.
    std::fs::write(&pki.server_cert, "not a certificate\n").unwrap();
    let reload_errors = "tessera_ingester_telemetry_web_config_reload_errors_total ";
    wait_until("the broken rotation counted", Duration::from_secs(30), || metric(reload_errors) >= 1.0);
    assert_eq!(server_certificate(telemetry, &pki.ca, None).unwrap(), rotated);

    wait_until("the silent client counted at its deadline", Duration::from_secs(30), || metric(timeouts) >= 1.0);
    drop(silent);
}
