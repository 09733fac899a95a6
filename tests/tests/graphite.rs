//! What a statsd or brubeck user meets, end to end: `tessera local --graphite` into a real
//! carbon-cache (Debian's `graphite-carbon`) with the schemas in `deploy/graphite/`, read
//! back from its whisper files.
//!
//! - **statsd's paths and values** for one 10 s tile of counters, `|ms` timers and a gauge:
//!   `stats_counts.<key>` (the count), `stats.<key>` (per second), `stats.timers.<key>.
//!   {count,sum,mean,lower,upper}` in ms, exact, and `upper_90` within the sketch's bound;
//!   `stats.gauges.<key>`.
//! - **brubeck's**: `<key>` for counters and gauges, `<key>.{count,min,max,sum,mean}` for
//!   timers.
//! - **tagged series** (Graphite 1.1's `path;k=v`, the default) read back as dashboards
//!   read them, through graphite-web's `/render?target=seriesByTag(…)`, graphite-web
//!   started before carbon-cache; sample rates applied; tags carbon would misparse (`!` in a
//!   name, a value starting with `~`, an empty value) sanitized or dropped, and counted.
//! - **carbon-cache stopped, SIGKILLed and restarted mid-run**: every tile's count is in
//!   whisper afterwards, the tiles the kernel took for the dead process included (the
//!   resend window), through the pickle receiver as well. Without the window the test
//!   fails (checked by setting it to 0).

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_core::sketch::{DEFAULT_SCHEMA, relative_error};
use tessera_testkit::daemons::binary;
use tessera_testkit::free_port;
use tessera_testkit::graphite::Carbon;
use tessera_testkit::process::Server;
use tessera_tests::{loopback, wait_until};

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// `tessera local` writing to `address` with `flags`, ready; returns it with its statsd and
/// telemetry ports.
fn local(address: std::net::SocketAddr, flags: &[&str]) -> (Server, u16, u16) {
    let dir = Server::directory();
    let (statsd, telemetry) = (free_port(), free_port());
    let mut command = Command::new(binary("tessera"));
    command
        .args(["local", "--plain", "--graphite", &address.to_string()])
        .args(flags)
        .args(["--statsd", &loopback(statsd).to_string(), "--telemetry", &loopback(telemetry).to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let mut local = Server::spawn("tessera local", command, dir, "");
    local.wait_ready(loopback(telemetry), "/readyz", Duration::from_secs(30)).unwrap();
    (local, statsd, telemetry)
}

/// Waits until the clock is 1 to 6 s into a 10 s tile, so that lines sent now all land in it.
fn early_in_a_tile() {
    loop {
        let into = now_secs() % 10.0;
        if (1.0..6.0).contains(&into) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The one value stored for `path` since `from`, once there is one.
fn one_value(carbon: &Carbon, path: &str, from: i64) -> f64 {
    wait_until(&format!("{path} in whisper"), Duration::from_secs(60), || !carbon.fetch(path, from).is_empty());
    let values = carbon.fetch(path, from);
    assert_eq!(values.len(), 1, "{path}: one tile, one slot: {values:?}");
    values[0].1
}

fn send(statsd: u16, datagrams: &[String]) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for datagram in datagrams {
        socket.send_to(datagram.as_bytes(), loopback(statsd)).unwrap();
    }
}

/// Ten timings of 100, 200, … 1000 ms, and 30 increments of 5 with a sample rate of 0.5.
fn one_tile_of_statsd(key: &str) -> Vec<String> {
    let mut datagrams: Vec<String> = (1..=10).map(|n| format!("{key}.latency:{}|ms", n * 100)).collect();
    datagrams.extend((0..30).map(|_| format!("{key}.hits:5|c|@0.5")));
    datagrams.push(format!("{key}.depth:7|g\n{key}.depth:42|g"));
    datagrams
}

#[test]
fn tessera_local_gives_carbon_statsds_and_brubecks_paths_and_values_for_one_tile() {
    // The schemas tessera ships: the first archive's step is the 10 s tile.
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/graphite/");
    let read = |name: &str| std::fs::read_to_string(format!("{deploy}{name}")).unwrap();
    let carbon = Carbon::start_with(&read("storage-schemas.conf"), &read("storage-aggregation.conf"));
    let alpha = relative_error(DEFAULT_SCHEMA);
    for (naming, key) in [("statsd", "api"), ("brubeck", "web")] {
        let (local, statsd, _) = local(carbon.plaintext, &["--graphite-naming", naming]);
        early_in_a_tile();
        let from = now_secs() as i64 - 10;
        send(statsd, &one_tile_of_statsd(key));
        let value = |path: &str| one_value(&carbon, path, from);
        // 30 increments of 5 at @0.5: a count of 300 in the tile, 30 per second.
        let (count, sum, mean) = (10.0, 5500.0, 550.0);
        if naming == "statsd" {
            assert_eq!(value("stats_counts.api.hits"), 300.0);
            assert_eq!(value("stats.api.hits"), 30.0);
            assert_eq!(value("stats.gauges.api.depth"), 42.0);
            assert_eq!(value("stats.timers.api.latency.count"), count);
            assert_eq!(value("stats.timers.api.latency.sum"), sum, "in ms, as sent");
            assert_eq!(value("stats.timers.api.latency.mean"), mean);
            assert_eq!(value("stats.timers.api.latency.lower"), 100.0);
            assert_eq!(value("stats.timers.api.latency.upper"), 1000.0);
            assert_eq!(value("stats.timers.api.latency.count_90"), 9.0);
            let upper_90 = value("stats.timers.api.latency.upper_90");
            assert!((upper_90 - 900.0).abs() <= 900.0 * alpha, "upper_90 {upper_90}: 900 within {alpha}");
        } else {
            assert_eq!(value("web.hits"), 300.0, "brubeck writes a counter's count");
            assert_eq!(value("web.depth"), 42.0);
            assert_eq!(value("web.latency.count"), count);
            assert_eq!(value("web.latency.sum"), sum);
            assert_eq!(value("web.latency.mean"), mean);
            assert_eq!(value("web.latency.min"), 100.0);
            assert_eq!(value("web.latency.max"), 1000.0);
        }
        drop(local);
    }
}

/// The value of the metric whose line starts with `prefix` in `tessera local`'s telemetry.
fn metric(telemetry: u16, prefix: &str) -> Option<f64> {
    let metrics = tessera_testkit::http_get(loopback(telemetry), "/metrics").unwrap().1;
    metrics.lines().find(|line| line.starts_with(prefix)).and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

#[test]
fn tagged_series_read_back_through_graphite_webs_series_by_tag() {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/graphite/");
    let read = |name: &str| std::fs::read_to_string(format!("{deploy}{name}")).unwrap();
    let carbon = Carbon::start_tagged(&read("storage-schemas.conf"), &read("storage-aggregation.conf"));
    let (local, statsd, telemetry) = local(carbon.plaintext, &[]);
    early_in_a_tile();
    let from = now_secs() as i64 - 10;
    let mut datagrams: Vec<String> = (0..4).map(|_| "api.hits:5|c|@0.5|#env:prod,region:eu".to_owned()).collect();
    datagrams.extend((0..2).map(|_| "api.hits:1|c|#env:dev".to_owned()));
    datagrams.extend(["api.latency:100|ms|#env:prod".to_owned(), "api.latency:300|ms|#env:prod".to_owned()]);
    // `!` is not allowed in a tag name, nor `~` first in a value; an empty value is no tag.
    datagrams.push("temp:21.5|g|#room:~lab,bad!name:1,empty:".to_owned());
    send(statsd, &datagrams);
    let one = |target: &str| {
        let target = format!("seriesByTag({target})");
        wait_until(&format!("{target} in graphite-web"), Duration::from_secs(60), || {
            carbon.render(&target, from).iter().any(|series| !series.points.is_empty())
        });
        let found = carbon.render(&target, from);
        assert_eq!(found.len(), 1, "{target}: one series: {found:?}");
        assert_eq!(found[0].points.len(), 1, "{target}: one tile, one slot: {found:?}");
        (found[0].target.clone(), found[0].points[0].1)
    };
    // 4 × 5 at @0.5: a count of 40 in the tile, 4 per second.
    assert_eq!(
        one("'name=stats_counts.api.hits','env=prod'"),
        ("stats_counts.api.hits;env=prod;region=eu".to_owned(), 40.0)
    );
    assert_eq!(one("'name=stats.api.hits','env=prod'").1, 4.0);
    assert_eq!(one("'name=stats_counts.api.hits','env=dev'"), ("stats_counts.api.hits;env=dev".to_owned(), 2.0));
    assert_eq!(one("'name=stats.timers.api.latency.upper','env=prod'").1, 300.0, "in ms, as sent");
    assert_eq!(one("'name=stats.timers.api.latency.mean','env=prod'").1, 200.0);
    assert_eq!(one("'name=stats.gauges.temp','room=lab'"), ("stats.gauges.temp;badname=1;room=lab".to_owned(), 21.5));
    let both = carbon.render("seriesByTag('name=stats_counts.api.hits')", from);
    assert_eq!(both.len(), 2, "one series per tag set: {both:?}");
    let counted = |name: &str| metric(telemetry, &format!("tessera_ingester_names_{name}_total")).unwrap_or(0.0);
    assert!(counted("tags_sanitized") >= 2.0, "`bad!name` and `~lab`: {}", counted("tags_sanitized"));
    assert!(counted("tags_dropped") >= 1.0, "`empty:`: {}", counted("tags_dropped"));
    drop(local);
}

#[test]
fn carbon_killed_and_restarted_mid_run_loses_no_tile() {
    for protocol in ["plaintext", "pickle"] {
        let mut carbon = Carbon::start("1s:1h");
        let address = if protocol == "pickle" { carbon.pickle } else { carbon.plaintext };
        let (mut local, statsd, telemetry) =
            local(address, &["--policy", "1s:1h", "--graphite-protocol", protocol, "--graphite-naming", "brubeck"]);
        let from = now_secs() as i64 - 2;
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut sent = 0u64;
        let started = std::time::Instant::now();
        let (mut paused, mut killed, mut restarted) = (false, false, false);
        while started.elapsed() < Duration::from_secs(16) {
            socket.send_to(b"kill.test:1|c", loopback(statsd)).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_millis(20));
            // Stopped first, so that the kernel takes writes carbon never reads: the
            // lines a crash loses, which no error tells the sender about.
            if !paused && started.elapsed() > Duration::from_secs(4) {
                carbon.pause();
                paused = true;
            }
            if !killed && started.elapsed() > Duration::from_secs(7) {
                carbon.kill();
                killed = true;
            }
            if !restarted && started.elapsed() > Duration::from_secs(9) {
                carbon.restart();
                restarted = true;
            }
        }
        let stored = || carbon.fetch("kill.test", from).iter().map(|(_, value)| value).sum::<f64>();
        wait_until(&format!("{sent} increments in whisper ({protocol})"), Duration::from_secs(60), || {
            stored() == sent as f64
        });
        let resends = metric(telemetry, "tessera_ingester_carbon_resends_total");
        assert!(resends.is_some_and(|resends| resends >= 1.0), "the window was resent: {resends:?}\n{}", carbon.log());
        local.terminate();
    }
}
