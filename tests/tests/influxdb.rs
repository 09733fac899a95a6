//! What a Telegraf user meets, end to end: `tessera local --influxdb` into a real InfluxDB
//! 1.x (Debian's `influxdb`): one 10 s tile of counters, `|ms` timers, a gauge and a set
//! gives the measurements, tags and fields Telegraf's statsd input writes, with timers in
//! ms as sent, sample rates applied, and tags with line protocol's special characters read
//! back as sent.

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera_core::sketch::{DEFAULT_SCHEMA, relative_error};
use tessera_testkit::daemons::binary;
use tessera_testkit::free_port;
use tessera_testkit::influx::Influx;
use tessera_testkit::process::Server;
use tessera_tests::{loopback, wait_until};

#[test]
fn tessera_local_gives_influxdb_telegrafs_measurements_and_fields_for_one_tile() {
    let influx = Influx::start();
    influx.query("CREATE DATABASE statsd");
    let dir = Server::directory();
    let (statsd, telemetry) = (free_port(), free_port());
    let mut command = Command::new(binary("tessera"));
    command
        .args(["local", "--plain", "--influxdb", &format!("http://{}", influx.address)])
        .args(["--influxdb-database", "statsd"])
        .args(["--statsd", &loopback(statsd).to_string(), "--telemetry", &loopback(telemetry).to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let mut local = Server::spawn("tessera local", command, dir, "");
    local.wait_ready(loopback(telemetry), "/readyz", Duration::from_secs(30)).unwrap();

    // 1 to 6 s into a 10 s tile, so that every line lands in it.
    while !(1.0..6.0).contains(&(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() % 10.0)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut lines: Vec<String> = (1..=10).map(|n| format!("api.latency:{}|ms|#route:users", n * 100)).collect();
    lines.extend((0..30).map(|_| "api.hits:5|c|@0.5".to_owned()));
    lines.extend(["queue.depth:7|g".to_owned(), "queue.depth:42|g".to_owned()]);
    lines.extend(["users.online:alice|s", "users.online:bob|s", "users.online:alice|s"].map(str::to_owned));
    // Line protocol's special characters in a tag value and a tag key (escaped, read back
    // as sent), and an empty tag (dropped).
    lines.push("disk.used:3|g|#mount:/var/a b,k=v:1,empty:".to_owned());
    for line in &lines {
        socket.send_to(line.as_bytes(), loopback(statsd)).unwrap();
    }
    let row = |measurement: &str| {
        wait_until(&format!("{measurement} in InfluxDB"), Duration::from_secs(60), || {
            !influx.rows("statsd", &format!("SELECT * FROM {measurement}")).is_empty()
        });
        let rows = influx.rows("statsd", &format!("SELECT * FROM {measurement}"));
        assert_eq!(rows.len(), 1, "one tile, one point: {rows:?}");
        rows.into_iter().next().unwrap()
    };
    let hits = row("api_hits");
    assert_eq!((hits["value"].as_f64(), hits["metric_type"].as_str()), (Some(300.0), Some("counter")));
    let depth = row("queue_depth");
    assert_eq!((depth["value"].as_f64(), depth["metric_type"].as_str()), (Some(42.0), Some("gauge")));
    let online = row("users_online");
    assert_eq!((online["value"].as_f64(), online["metric_type"].as_str()), (Some(2.0), Some("set")));
    let disk = row("disk_used");
    assert_eq!(
        (disk["mount"].as_str(), disk["k=v"].as_str(), disk["value"].as_f64()),
        (Some("/var/a b"), Some("1"), Some(3.0))
    );
    assert!(disk.get("empty").is_none_or(serde_json::Value::is_null), "{disk:?}");
    let latency = row("api_latency");
    assert_eq!((latency["route"].as_str(), latency["metric_type"].as_str()), (Some("users"), Some("timing")));
    let field = |name: &str| latency[name].as_f64().unwrap_or_else(|| panic!("{name}: {latency:?}"));
    assert_eq!((field("count"), field("lower"), field("upper")), (10.0, 100.0, 1000.0), "in ms, as sent");
    assert_eq!((field("sum"), field("mean")), (5500.0, 550.0));
    assert!((field("stddev") - 82_500f64.sqrt()).abs() < 1e-6);
    let alpha = relative_error(DEFAULT_SCHEMA);
    assert!((field("90_percentile") - 900.0).abs() <= 900.0 * alpha, "{}", field("90_percentile"));
    assert!((field("median") - 550.0).abs() <= 550.0 * alpha, "{}", field("median"));
    drop(local);
}
