//! The run's totals, as text for people or one JSON object for scripts.
//!
//! Both give lines, datagrams and bytes handed to the kernel, transient send
//! errors, the achieved rates, and per type the series, lines and the
//! expected statistic summed over its series (see [`super::expect`]; for
//! gauges the sum of the last values, a checksum).
//!
//! The JSON object, on one line:
//!
//! ```text
//! {"transport":"udp","target":"127.0.0.1:8125","senders":1,"series":1000,
//!  "target_lines_per_sec":null,"elapsed_secs":1.0,"lines":..,"datagrams":..,
//!  "bytes":..,"send_errors":0,"send_errors_by_reason":{"no_buffer_space":0,..},
//!  "lines_per_sec":..,"datagrams_per_sec":..,"bytes_per_sec":..,
//!  "lines_by_sender":[..],"precomputed_senders":1,
//!  "types":{"counter":{"series":700,"series_sent":700,"lines":..,"stat":"sum","expected":..},..},
//!  "error":null}
//! ```

use std::fmt::Write;
use std::time::Duration;

use tessera_core::parse::MetricKind;

use super::expect::{Stat, expected_totals};
use super::mix::kind_index;
use super::send::{SendErrors, Target};
use super::workload::Workload;

/// Everything the final report says.
#[derive(Debug)]
pub struct Summary {
    /// Where the lines went.
    pub target: Target,
    /// Sender threads.
    pub senders: usize,
    /// Distinct series.
    pub series: u64,
    /// The requested rate; flat out when `None`.
    pub target_lines_per_sec: Option<u64>,
    /// From the start of sending until the last sender finished.
    pub elapsed: Duration,
    /// Lines handed to the kernel.
    pub lines: u64,
    /// Datagrams (for TCP, packed chunks) handed to the kernel.
    pub datagrams: u64,
    /// Payload bytes handed to the kernel.
    pub bytes: u64,
    /// Transient send errors, each followed by a retry.
    pub errors: SendErrors,
    /// Lines each sender handed to the kernel.
    pub lines_by_sender: Vec<u64>,
    /// Senders that formatted their whole cycle up front.
    pub precomputed_senders: usize,
    /// Per type with at least one series.
    pub types: Vec<TypeTotals>,
    /// Why a sender stopped early, if one did.
    pub error: Option<String>,
}

/// What was sent of one metric type.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeTotals {
    /// The type.
    pub kind: MetricKind,
    /// Its series.
    pub series: u64,
    /// Its series sent at least once.
    pub series_sent: u64,
    /// Its lines handed to the kernel.
    pub lines: u64,
    /// The statistic to check.
    pub stat: Stat,
    /// The expected statistic summed over its series.
    pub expected: f64,
}

/// Totals per type (those with at least one series) of the run where
/// sender `s` sent `lines_by_sender[s]` lines.
pub fn type_totals(workload: &Workload, lines_by_sender: &[u64]) -> Vec<TypeTotals> {
    let mut totals = MetricKind::ALL.map(|kind| TypeTotals {
        kind,
        series: 0,
        series_sent: 0,
        lines: 0,
        stat: Stat::of(kind),
        expected: 0.0,
    });
    for series in 0..workload.series_count() {
        totals[kind_index(workload.kind(series))].series += 1;
    }
    for expected in expected_totals(workload, lines_by_sender) {
        let slot = &mut totals[kind_index(expected.kind)];
        slot.series_sent += 1;
        slot.lines += expected.lines;
        slot.expected += expected.value;
    }
    totals.into_iter().filter(|totals| totals.series > 0).collect()
}

impl Summary {
    fn per_sec(&self, count: u64) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 { count as f64 / secs } else { 0.0 }
    }

    /// The report for people, several lines.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let rate = match self.target_lines_per_sec {
            Some(rate) => format!("{rate} lines/s"),
            None => "flat out".to_owned(),
        };
        let _ = writeln!(
            out,
            "loadgen: {} {}, {} senders, {} series, {rate}",
            self.target.transport(),
            self.target.address(),
            self.senders,
            self.series
        );
        let _ = writeln!(
            out,
            "sent {} lines in {} datagrams ({} bytes) in {:.3} s, {} send errors",
            self.lines,
            self.datagrams,
            self.bytes,
            self.elapsed.as_secs_f64(),
            self.errors.total()
        );
        let _ = writeln!(
            out,
            "achieved {:.0} lines/s, {:.0} datagrams/s, {:.1} MB/s",
            self.per_sec(self.lines),
            self.per_sec(self.datagrams),
            self.per_sec(self.bytes) / 1e6
        );
        if self.errors.total() > 0 {
            let reasons: Vec<String> = self
                .errors
                .by_reason()
                .filter(|(_, count)| *count > 0)
                .map(|(reason, count)| format!("{} {count}", reason.as_str()))
                .collect();
            let _ = writeln!(out, "send errors (retried): {}", reasons.join(", "));
        }
        let _ =
            writeln!(out, "{:<13} {:>10} {:>14} {:<12} {:>16}", "type", "series", "lines", "stat", "expected (sum)");
        for totals in &self.types {
            let _ = writeln!(
                out,
                "{:<13} {:>10} {:>14} {:<12} {:>16}",
                totals.kind.as_str(),
                totals.series,
                totals.lines,
                totals.stat.as_str(),
                totals.expected
            );
        }
        if let Some(error) = &self.error {
            let _ = writeln!(out, "stopped early: {error}");
        }
        out
    }

    /// The report for scripts: one JSON object on one line.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        let _ = write!(out, "\"transport\":\"{}\"", self.target.transport());
        let _ = write!(out, ",\"target\":{}", json_string(&self.target.address()));
        let _ = write!(out, ",\"senders\":{},\"series\":{}", self.senders, self.series);
        match self.target_lines_per_sec {
            Some(rate) => _ = write!(out, ",\"target_lines_per_sec\":{rate}"),
            None => out.push_str(",\"target_lines_per_sec\":null"),
        }
        let _ = write!(out, ",\"elapsed_secs\":{}", self.elapsed.as_secs_f64());
        let _ = write!(out, ",\"lines\":{},\"datagrams\":{},\"bytes\":{}", self.lines, self.datagrams, self.bytes);
        let _ = write!(out, ",\"send_errors\":{},\"send_errors_by_reason\":{{", self.errors.total());
        for (index, (reason, count)) in self.errors.by_reason().enumerate() {
            let _ = write!(out, "{}\"{}\":{count}", if index > 0 { "," } else { "" }, reason.as_str());
        }
        let _ = write!(
            out,
            "}},\"lines_per_sec\":{},\"datagrams_per_sec\":{},\"bytes_per_sec\":{}",
            self.per_sec(self.lines),
            self.per_sec(self.datagrams),
            self.per_sec(self.bytes)
        );
        let lines_by_sender: Vec<String> = self.lines_by_sender.iter().map(u64::to_string).collect();
        let _ = write!(out, ",\"lines_by_sender\":[{}]", lines_by_sender.join(","));
        let _ = write!(out, ",\"precomputed_senders\":{},\"types\":{{", self.precomputed_senders);
        for (index, totals) in self.types.iter().enumerate() {
            let _ = write!(
                out,
                "{}\"{}\":{{\"series\":{},\"series_sent\":{},\"lines\":{},\"stat\":\"{}\",\"expected\":{}}}",
                if index > 0 { "," } else { "" },
                totals.kind.as_str(),
                totals.series,
                totals.series_sent,
                totals.lines,
                totals.stat.as_str(),
                totals.expected
            );
        }
        out.push('}');
        match &self.error {
            Some(error) => _ = write!(out, ",\"error\":{}", json_string(error)),
            None => out.push_str(",\"error\":null"),
        }
        out.push('}');
        out
    }
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            control if control < ' ' => _ = write!(out, "\\u{:04x}", u32::from(control)),
            other => out.push(other),
        }
    }
    out.push('"');
    out
}
