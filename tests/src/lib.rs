//! Cross-crate integration tests live in `tests/`; this is what several of them share.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

/// The single value of an instant query now, if it has exactly one series.
pub fn scalar(prometheus: &Prometheus, promql: &str) -> Option<f64> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let result = prometheus.query(promql, now);
    let series = result.as_array()?;
    (series.len() == 1).then(|| series[0]["value"][1].as_str()?.parse().ok())?
}

/// Polls `promql` every 200 ms until its single value is `expected`; fails after
/// `timeout` with the value it last had.
pub fn wait_for_scalar(prometheus: &Prometheus, promql: &str, expected: f64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while scalar(prometheus, promql) != Some(expected) {
        assert!(Instant::now() < deadline, "{promql} = {:?}, expected {expected}", scalar(prometheus, promql));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `check` every 200 ms until it holds; fails with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writes a static placement (8 shards, all owned by `agg-1` at `aggregator_port`) in
/// `dir`; returns the `[placement]` section that collectors and the aggregator use.
pub fn static_placement(dir: &Path, aggregator_port: u16) -> String {
    let path = dir.join("placement.toml");
    std::fs::write(
        &path,
        format!("num_shards = 8\n[[instances]]\nid = \"agg-1\"\nendpoint = \"127.0.0.1:{aggregator_port}\"\n"),
    )
    .unwrap();
    format!("[placement]\nkind = \"static\"\npath = {:?}\n", path.display().to_string())
}

/// Starts the binary `binary` as `name` with `config` and a `[telemetry]` table
/// listening on `telemetry_port`; waits until it is ready.
pub fn start_daemon(name: &str, binary: &str, config: &str, telemetry_port: u16) -> Daemon {
    let telemetry = loopback(telemetry_port);
    Daemon::start(name, binary, &format!("{config}[telemetry]\nlisten = \"{telemetry}\"\n"), telemetry)
}

/// Writes the ingesters' placement of environment `env` in the etcd at `etcd_endpoint` with
/// `tessera placement --tier ingesters init`: `num_shards` shards, one instance per
/// `(id, port)` on loopback.
pub fn init_ingester_placement(etcd_endpoint: &str, env: &str, num_shards: u32, instances: &[(&str, u16)]) {
    let mut init = std::process::Command::new(tessera_testkit::daemons::binary("tessera"));
    init.args(["placement", "--etcd", etcd_endpoint, "--environment", env, "--tier", "ingesters", "init"]);
    init.args(["--shards", &num_shards.to_string()]);
    for (id, port) in instances {
        init.args(["--instance", &format!("{id}=127.0.0.1:{port}")]);
    }
    assert!(init.status().unwrap().success(), "tessera placement --tier ingesters init failed");
}

/// Ingester `id` of an ingesters' placement in etcd (environment `env`, lease `ttl_secs`):
/// it listens on `port`, queues in `data/<id>`, writes to the file sink and serves telemetry
/// on `telemetry`; `etcd_settings` go into `[placement.etcd]`.
pub fn tier_ingester_config(
    id: &str,
    port: u16,
    (etcd_endpoint, env, ttl_secs): (&str, &str, u64),
    data: &Path,
    telemetry: u16,
    etcd_settings: &str,
) -> String {
    format!(
        "instance_id = \"{id}\"\nlisten = \"127.0.0.1:{port}\"\ndata_dir = {:?}\n\
         [placement]\nadvertise = \"127.0.0.1:{port}\"\nliveness_ttl_secs = {ttl_secs}\n\
         [placement.etcd]\nendpoints = [\"{etcd_endpoint}\"]\nenv = \"{env}\"\nrequest_timeout_ms = 500\n{etcd_settings}\
         [sink]\nkind = \"file\"\n[telemetry]\nlisten = \"127.0.0.1:{telemetry}\"\n",
        data.join(id).display().to_string(),
    )
}

/// An ingester's config: it listens on `port`, queues in `data_dir` and writes
/// to `remote_write_url`. `settings` (top-level keys, then tables) come before
/// the `[sink]` table, `sink_settings` go into it.
pub fn ingester_config(
    port: u16,
    data_dir: &Path,
    remote_write_url: &str,
    settings: &str,
    sink_settings: &str,
) -> String {
    format!(
        "listen = \"127.0.0.1:{port}\"\ndata_dir = {:?}\n{settings}\
         [sink]\nkind = \"remote_write\"\nurl = \"{remote_write_url}\"\n{sink_settings}",
        data_dir.display().to_string()
    )
}

/// Starts an ingester on a free port that queues in `dir/ingester` and writes to
/// `prometheus`, with `settings` as in [`ingester_config`]; returns it and its port.
pub fn start_ingester(dir: &Path, prometheus: &Prometheus, settings: &str) -> (Daemon, u16) {
    let port = free_port();
    let config = ingester_config(port, &dir.join("ingester"), &prometheus.remote_write_url(), settings, "");
    (start_daemon("ingester", "tessera-ingester", &config, free_port()), port)
}

/// Aggregator `id`'s config: it listens on `port` with `settings` (top-level
/// keys, `policies` among them), finds its shards in `placement` and sends to
/// the ingester on `ingester_port`; `ingester_settings` go into `[ingester]`.
pub fn aggregator_config(
    id: &str,
    port: u16,
    settings: &str,
    placement: &str,
    ingester_port: u16,
    ingester_settings: &str,
) -> String {
    format!(
        "instance_id = \"{id}\"\nlisten = \"127.0.0.1:{port}\"\n{settings}{placement}\
         [ingester]\nendpoints = [\"127.0.0.1:{ingester_port}\"]\n{ingester_settings}"
    )
}

/// Aggregator settings for 1 s tiles kept an hour, so that a test sees its data in
/// Prometheus within seconds.
pub const ONE_SECOND_TILES: &str = "policies = [\"1s:1h\"]\n";

/// Ingester settings that store the 1 s tiles of [`ONE_SECOND_TILES`] (its default store
/// takes the 10 s tiles only). One resolution in the store: its samples carry no
/// `resolution` label. A top-level key, so it comes before any table.
pub const ONE_SECOND_SINK: &str = "sink_policies = [\"1s\"]\n";

/// Sender settings that reconnect after 20 ms to 200 ms, so that a test does not wait on
/// the default backoff.
pub const FAST_RECONNECT: &str = "reconnect_min_ms = 20\nreconnect_max_ms = 200\n";

/// Starts aggregator `agg-1` on `aggregator_port`, alone in a static placement written in
/// `dir` (see [`static_placement`]), with `settings` and `ingester_settings` as in
/// [`aggregator_config`]; returns it and the `[placement]` section its collectors use.
pub fn start_lone_aggregator(
    dir: &Path,
    aggregator_port: u16,
    settings: &str,
    ingester_port: u16,
    ingester_settings: &str,
) -> (Daemon, String) {
    let placement = static_placement(dir, aggregator_port);
    let config = aggregator_config("agg-1", aggregator_port, settings, &placement, ingester_port, ingester_settings);
    let aggregator = start_daemon("aggregator", "tessera-aggregator", &config, free_port());
    (aggregator, placement)
}

/// Collector `id`'s config: statsd on UDP `statsd_port`, aggregators found in
/// `placement`, reconnecting to them after 20 ms to 200 ms; `forward_settings`
/// go into `[forward]`, which comes last.
pub fn collector_config(id: &str, statsd_port: u16, placement: &str, forward_settings: &str) -> String {
    format!(
        "instance_id = \"{id}\"\n[udp]\nlisten = \"127.0.0.1:{statsd_port}\"\n{placement}\
         [forward]\n{FAST_RECONNECT}{forward_settings}"
    )
}
