//! Cross-crate integration tests live in `tests/`; this is what several of them share.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
