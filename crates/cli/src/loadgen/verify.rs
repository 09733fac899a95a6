//! `--verify`: after a run, read back what reached the sink and report loss.
//!
//! Verification compares counters, whose expected total is exact: loadgen
//! sends `1` per counter line, so the pipeline must add `lines / rate` to
//! the cumulative `loadgen_counter_<i>_total` series of the chosen
//! resolution. The baseline is read before sending (the ingester's totals
//! are cumulative since it started), then the sink is polled until the
//! increase reaches what was sent or the timeout ends; the report gives the
//! increase seen, the loss and its share.
//!
//! Sinks: a Prometheus-compatible query API (`--verify prometheus=URL`), or
//! the file sink's directory of OpenMetrics files (`--verify files=DIR`; only
//! files the ingester has closed are read, in DIR and in its subdirectories
//! one level down, e.g. one per ingester of a tier).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Where to read back from.
#[derive(Debug, Clone)]
pub enum VerifySink {
    /// A Prometheus query API at `host:port`.
    Prometheus(String),
    /// A directory of OpenMetrics files written by the file sink.
    Files(PathBuf),
}

/// Parses `prometheus=http://host:port` or `files=DIR`.
pub fn parse_sink(text: &str) -> Result<VerifySink, String> {
    match text.split_once('=') {
        Some(("prometheus", url)) => {
            let authority = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') {
                return Err(format!("invalid Prometheus address `{url}`: expected http://host:port"));
            }
            Ok(VerifySink::Prometheus(authority.to_owned()))
        }
        Some(("files", dir)) if !dir.is_empty() => Ok(VerifySink::Files(PathBuf::from(dir))),
        _ => Err(format!("invalid sink `{text}`: expected prometheus=http://host:port or files=DIR")),
    }
}

/// Sum over every `loadgen_counter_<i>_total` series of `resolution` (`None`: the series with
/// no `resolution` label, as a store of one resolution has them), as the sink has it now.
pub fn counter_total(sink: &VerifySink, resolution: Option<&str>) -> anyhow::Result<f64> {
    match sink {
        VerifySink::Prometheus(authority) => {
            let resolution = resolution.unwrap_or_default();
            let query = format!("sum({{__name__=~\"loadgen_counter_[0-9]+_total\",resolution=\"{resolution}\"}})");
            prometheus_scalar(authority, &query)
        }
        VerifySink::Files(dir) => file_total(dir, resolution),
    }
}

/// What verification found.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The counter increase the run should have caused.
    pub expected: f64,
    /// The increase the sink shows.
    pub seen: f64,
}

impl Verdict {
    /// Expected minus seen (never negative).
    pub fn lost(&self) -> f64 {
        (self.expected - self.seen).max(0.0)
    }

    /// One line for the report.
    pub fn to_text(&self) -> String {
        let share = if self.expected > 0.0 { 100.0 * self.lost() / self.expected } else { 0.0 };
        format!(
            "verify: expected counter increase {:.0}, seen {:.0}, lost {:.0} ({share:.3} %)",
            self.expected,
            self.seen,
            self.lost()
        )
    }
}

/// Polls the sink until the increase over `baseline` reaches `expected` or
/// `timeout` passes.
pub fn wait_for(
    sink: &VerifySink,
    resolution: Option<&str>,
    baseline: f64,
    expected: f64,
    timeout: Duration,
) -> anyhow::Result<Verdict> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = counter_total(sink, resolution)? - baseline;
        // Float totals: allow rounding of the sums, not loss.
        if seen >= expected - expected.abs() * 1e-9 || Instant::now() >= deadline {
            return Ok(Verdict { expected, seen });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn prometheus_scalar(authority: &str, query: &str) -> anyhow::Result<f64> {
    let mut encoded = String::new();
    for byte in query.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    let mut stream = TcpStream::connect(authority).with_context(|| format!("connecting to {authority}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET /api/v1/query?query={encoded} HTTP/1.0\r\nHost: {authority}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let json: serde_json::Value =
        serde_json::from_str(body).with_context(|| format!("reading the answer of {authority}: {body}"))?;
    if json["status"] != "success" {
        bail!("query `{query}` failed: {body}");
    }
    let Some(result) = json["data"]["result"].as_array() else { bail!("unexpected answer: {body}") };
    let Some(first) = result.first() else { return Ok(0.0) };
    first["value"][1]
        .as_str()
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("unexpected sample in {body}"))
}

/// The closed OpenMetrics files in `dir` and in its subdirectories one level down.
fn om_files(dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).with_context(|| format!("reading {}", path.display()))? {
                files.push(inner?.path());
            }
        } else {
            files.push(path);
        }
    }
    files.retain(|path| path.extension().is_some_and(|extension| extension == "om"));
    Ok(files)
}

/// Last value of every loadgen counter series in the closed OpenMetrics files, summed.
fn file_total(dir: &std::path::Path, resolution: Option<&str>) -> anyhow::Result<f64> {
    let mut last: HashMap<String, (f64, f64)> = HashMap::new();
    let wanted = |line: &str| match resolution {
        Some(resolution) => line.contains(&format!("resolution=\"{resolution}\"")),
        None => !line.contains("resolution=\""),
    };
    for path in om_files(dir)? {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().filter(|line| line.starts_with("loadgen_counter_") && wanted(line)) {
            let mut fields = line.rsplitn(3, ' ');
            let (Some(timestamp), Some(value), Some(series)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            let (Ok(timestamp), Ok(value)) = (timestamp.parse::<f64>(), value.parse::<f64>()) else { continue };
            let slot = last.entry(series.to_owned()).or_insert((f64::NEG_INFINITY, 0.0));
            if timestamp >= slot.0 {
                *slot = (timestamp, value);
            }
        }
    }
    Ok(last.values().map(|(_, value)| value).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sinks_and_refuses_others() {
        assert!(
            matches!(parse_sink("prometheus=http://127.0.0.1:9090"), Ok(VerifySink::Prometheus(a)) if a == "127.0.0.1:9090")
        );
        assert!(matches!(parse_sink("files=/tmp/x"), Ok(VerifySink::Files(_))));
        assert!(parse_sink("influx=x").unwrap_err().contains("expected prometheus="));
        assert!(parse_sink("prometheus=http://h:1/api").is_err());
    }

    #[test]
    fn file_totals_take_each_series_last_sample() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.om"),
            "# TYPE loadgen_counter_1 counter\n\
             loadgen_counter_1_total{resolution=\"10s\"} 4.0 100.000\n\
             loadgen_counter_1_total{resolution=\"10s\"} 9.0 110.000\n\
             loadgen_counter_1_total{resolution=\"1m\"} 9.0 120.000\n\
             loadgen_counter_2_total{resolution=\"10s\"} 3.0 110.000\n# EOF\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("b.om"), "loadgen_counter_2_total{resolution=\"10s\"} 5.0 120.000\n# EOF\n")
            .unwrap();
        std::fs::write(dir.path().join("open.journal"), "loadgen_counter_2_total{resolution=\"10s\"} 99.0 130.000\n")
            .unwrap();
        assert_eq!(file_total(dir.path(), Some("10s")).unwrap(), 14.0);
        // A store of one resolution: its series carry no label.
        std::fs::write(
            dir.path().join("c.om"),
            "loadgen_counter_3_total 7.0 100.000\nloadgen_counter_3_total 8.0 110.000\n# EOF\n",
        )
        .unwrap();
        assert_eq!(file_total(dir.path(), None).unwrap(), 8.0);
        let verdict = Verdict { expected: 20.0, seen: 14.0 };
        assert_eq!(verdict.lost(), 6.0);
        assert!(verdict.to_text().contains("lost 6 (30.000 %)"), "{}", verdict.to_text());
    }
}
