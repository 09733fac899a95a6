//! OpenMetrics text for the file sink: journal lines, and closed files grouped by family.
//!
//! While a file is open, each request is appended as **journal lines**, one per sample, in
//! arrival order:
//!
//! ```text
//! <type> <family> <timestamp_ms> <value> <series>
//! counter hits 1700000010000 5.0 hits_total{env="prod",resolution="10s"}
//! ```
//!
//! The series comes last because label values may hold spaces. When the file is closed,
//! [`close_journal`] groups the lines into OpenMetrics: families in name order, per family
//! one `# TYPE` and one `# HELP` line (the help remote write's metadata carries,
//! [`help_text`]), then its samples contiguous, each series' samples together and in
//! time order (one sample per series and timestamp, the last one written winning; series
//! in the order of a hash of their text), timestamps in seconds with milliseconds as the
//! fraction, and `# EOF` at the end. That is the form `promtool tsdb
//! create-blocks-from openmetrics` imports.
//!
//! | sample kind | family | type | sample name |
//! |---|---|---|---|
//! | counter | name without `_total` | `counter` | `<family>_total` |
//! | gauge (gauges, sets, timer `_min`/`_max`) | name | `gauge` | `<family>` |
//! | summary quantile, `_sum`, `_count` | timer name | `summary` | `<family>{quantile=..}`, `<family>_sum`, `<family>_count` |
//! | classic histogram bucket, `_sum`, `_count` (a mapping's `observer_type: histogram`) | timer name | `histogram` | `<family>_bucket{le=..}`, `<family>_sum`, `<family>_count` |

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use crate::queue::series::{Label, visit_labels};
use crate::record::SampleKind;

/// The help text of a family of OpenMetrics type `type_name` ([`family`]): what statsd sent,
/// and who wrote it. The file sink's `# HELP` and remote write's metadata.
pub fn help_text(type_name: &str) -> &'static str {
    match type_name {
        "counter" => "statsd counter (c), written by tessera",
        "summary" => "statsd timer (ms, in seconds), histogram (h) or distribution (d), written by tessera",
        "histogram" => {
            "statsd timer (ms, in seconds), histogram (h) or distribution (d) as a histogram, written by tessera"
        }
        _ => "statsd gauge (g), set (s), or a timer's min or max, written by tessera",
    }
}

/// Help texts by metric family, from a mapping file's `help` (the ingester's
/// `[mapping] file`); a family without one gets the [`help_text`] of its type.
#[derive(Debug, Clone, Default)]
pub struct Helps(Arc<HashMap<String, String>>);

impl Helps {
    /// Help texts of `(family, help)` pairs; the first one of a family wins.
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Helps {
        let mut helps = HashMap::new();
        for (family, help) in pairs {
            helps.entry(family.to_owned()).or_insert_with(|| help.to_owned());
        }
        Helps(Arc::new(helps))
    }

    /// The help of `family`, of OpenMetrics type `type_name`.
    pub fn of(&self, family: &str, type_name: &str) -> &str {
        self.0.get(family).map_or_else(|| help_text(type_name), String::as_str)
    }

    /// Families with a help of their own.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no family has a help of its own.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The OpenMetrics family and type of a sample named `name` of `kind`.
pub fn family(name: &str, kind: SampleKind) -> (&str, &'static str) {
    match kind {
        SampleKind::Counter => (name.strip_suffix("_total").unwrap_or(name), "counter"),
        SampleKind::SummaryQuantile => (name, "summary"),
        SampleKind::SummarySum => (name.strip_suffix("_sum").unwrap_or(name), "summary"),
        SampleKind::SummaryCount => (name.strip_suffix("_count").unwrap_or(name), "summary"),
        SampleKind::Gauge | SampleKind::Unspecified => (name, "gauge"),
        // Remote write's metadata only: the file sink skips native histograms (OpenMetrics
        // 1.0 text has none).
        SampleKind::Histogram => (name, "histogram"),
        SampleKind::HistogramBucket => (name.strip_suffix("_bucket").unwrap_or(name), "histogram"),
        SampleKind::HistogramSum => (name.strip_suffix("_sum").unwrap_or(name), "histogram"),
        SampleKind::HistogramCount => (name.strip_suffix("_count").unwrap_or(name), "histogram"),
    }
}

/// Writes `name{label="value",...}` with OpenMetrics escaping; `__name__` is the name.
pub fn write_series(out: &mut String, labels: &[Label]) {
    let name = labels.iter().find(|label| label.name == "__name__").map_or("", |label| label.value.as_str());
    out.push_str(name);
    let mut first = true;
    for label in labels.iter().filter(|label| label.name != "__name__") {
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(&label.name);
        out.push_str("=\"");
        escape_value(out, &label.value);
        out.push('"');
    }
    if !first {
        out.push('}');
    }
}

/// Writes a value the way OpenMetrics spells it.
pub fn write_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value == f64::INFINITY {
        out.push_str("+Inf");
    } else if value == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        let _ = write!(out, "{value:?}");
    }
}

/// Writes unix milliseconds as seconds with a three-digit fraction.
pub fn write_timestamp(out: &mut String, timestamp_ms: i64) {
    let sign = if timestamp_ms < 0 { "-" } else { "" };
    let abs = timestamp_ms.unsigned_abs();
    let _ = write!(out, "{sign}{}.{:03}", abs / 1000, abs % 1000);
}

/// Appends one journal line for a sample.
pub fn write_journal_line(out: &mut String, labels: &[Label], kind: SampleKind, value: f64, timestamp_ms: i64) {
    let name = labels.iter().find(|label| label.name == "__name__").map_or("", |label| label.value.as_str());
    let (family, type_name) = family(name, kind);
    let _ = write!(out, "{type_name} {family} {timestamp_ms} ");
    write_value(out, value);
    out.push(' ');
    write_series(out, labels);
    out.push('\n');
}

/// Appends one journal line for a sample whose labels are pre-encoded
/// ([`crate::queue::series::encode_labels`]), without decoding them into strings.
pub fn write_journal_line_encoded(
    out: &mut String,
    labels: &[u8],
    kind: SampleKind,
    value: f64,
    timestamp_ms: i64,
) -> Result<(), prost::DecodeError> {
    let mut name = "";
    visit_labels(labels, |label, text| {
        if label == "__name__" {
            name = text;
        }
    })?;
    let (family, type_name) = family(name, kind);
    let _ = write!(out, "{type_name} {family} {timestamp_ms} ");
    write_value(out, value);
    out.push(' ');
    out.push_str(name);
    let mut first = true;
    visit_labels(labels, |label, text| {
        if label == "__name__" {
            return;
        }
        out.push(if first { '{' } else { ',' });
        first = false;
        out.push_str(label);
        out.push_str("=\"");
        escape_value(out, text);
        out.push('"');
    })?;
    if !first {
        out.push('}');
    }
    out.push('\n');
    Ok(())
}

fn escape_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// What [`close_journal`] produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// The OpenMetrics text, ending in `# EOF\n`.
    pub text: String,
    /// Samples written.
    pub samples: u64,
    /// Journal lines that could not be read (a torn last line after a crash).
    pub bad_lines: u64,
}

/// Groups journal lines into an OpenMetrics file, each family's `# HELP` from `helps`; see
/// the [module docs](self).
pub fn close_journal(journal: &str, helps: &Helps) -> Closed {
    struct Entry<'a> {
        family: &'a str,
        type_name: &'a str,
        series_hash: u64,
        series: &'a str,
        timestamp_ms: i64,
        index: usize,
        value: &'a str,
    }
    let mut entries = Vec::with_capacity(journal.len() / 64);
    let mut bad_lines = 0;
    for line in journal.split_terminator('\n') {
        let mut fields = line.splitn(5, ' ');
        let (Some(type_name), Some(family), Some(timestamp), Some(value), Some(series)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            bad_lines += 1;
            continue;
        };
        let Ok(timestamp_ms) = timestamp.parse::<i64>() else {
            bad_lines += 1;
            continue;
        };
        if series.is_empty() || !matches!(type_name, "counter" | "gauge" | "summary" | "histogram") {
            bad_lines += 1;
            continue;
        }
        let series_hash = xxhash_rust::xxh3::xxh3_64(series.as_bytes());
        let index = entries.len();
        entries.push(Entry { family, type_name, series_hash, series, timestamp_ms, index, value });
    }
    // Series are ordered by the hash of their text first, so that sorting rarely compares
    // long, similar label strings; the journal index breaks ties (the last write wins).
    entries.sort_unstable_by(|a, b| {
        (a.family, a.type_name, a.series_hash)
            .cmp(&(b.family, b.type_name, b.series_hash))
            .then_with(|| a.series.cmp(b.series))
            .then(a.timestamp_ms.cmp(&b.timestamp_ms))
            .then(a.index.cmp(&b.index))
    });
    fn key<'a>(entry: &Entry<'a>) -> (&'a str, &'a str, &'a str, i64) {
        (entry.family, entry.type_name, entry.series, entry.timestamp_ms)
    }
    let mut text = String::with_capacity(journal.len());
    let mut samples = 0;
    let mut current_family = None;
    for (index, entry) in entries.iter().enumerate() {
        if entries.get(index + 1).is_some_and(|next| key(next) == key(entry)) {
            continue;
        }
        if current_family != Some((entry.family, entry.type_name)) {
            let _ = writeln!(text, "# TYPE {} {}", entry.family, entry.type_name);
            let _ = writeln!(text, "# HELP {} {}", entry.family, helps.of(entry.family, entry.type_name));
            current_family = Some((entry.family, entry.type_name));
        }
        text.push_str(entry.series);
        text.push(' ');
        text.push_str(entry.value);
        text.push(' ');
        write_timestamp(&mut text, entry.timestamp_ms);
        text.push('\n');
        samples += 1;
    }
    text.push_str("# EOF\n");
    Closed { text, samples, bad_lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<Label> {
        pairs.iter().map(|(name, value)| Label { name: (*name).into(), value: (*value).into() }).collect()
    }

    #[test]
    fn formats_series_values_and_timestamps() {
        let mut out = String::new();
        write_series(&mut out, &labels(&[("__name__", "a"), ("path", "C:\\x \"q\"\nz")]));
        assert_eq!(out, r#"a{path="C:\\x \"q\"\nz"}"#);
        out.clear();
        write_series(&mut out, &labels(&[("__name__", "bare")]));
        assert_eq!(out, "bare");
        for (value, text) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5e-9, "-2.5e-9"),
            (1e21, "1e21"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            out.clear();
            write_value(&mut out, value);
            assert_eq!(out, text);
        }
        for (ms, text) in [
            (1_700_000_010_000, "1700000010.000"),
            (1_700_000_010_005, "1700000010.005"),
            (999, "0.999"),
            (-1500, "-1.500"),
        ] {
            out.clear();
            write_timestamp(&mut out, ms);
            assert_eq!(out, text);
        }
    }

    #[test]
    fn journal_lines_from_encoded_labels_match_decoded_ones() {
        let pairs = [("A", "up"), ("__name__", "lat"), ("path", "C:\\x \"q\"\nz"), ("quantile", "0.5")];
        let mut encoded = Vec::new();
        crate::queue::series::encode_labels(&mut encoded, &pairs);
        let (mut ours, mut theirs) = (String::new(), String::new());
        write_journal_line_encoded(&mut ours, &encoded, SampleKind::SummaryQuantile, 2.5, 10_000).unwrap();
        write_journal_line(&mut theirs, &labels(&pairs), SampleKind::SummaryQuantile, 2.5, 10_000);
        assert_eq!(ours, theirs);
        assert!(write_journal_line_encoded(&mut ours, b"\x0a\x09", SampleKind::Gauge, 1.0, 0).is_err());
    }

    #[test]
    fn closing_groups_families_sorts_and_ends_with_eof() {
        let mut journal = String::new();
        let hits = labels(&[("__name__", "hits_total"), ("resolution", "10s")]);
        let temp = labels(&[("__name__", "temp"), ("room", "a b")]);
        let lat = labels(&[("__name__", "lat"), ("quantile", "0.5")]);
        let lat_count = labels(&[("__name__", "lat_count")]);
        write_journal_line(&mut journal, &hits, SampleKind::Counter, 2.0, 20_000);
        write_journal_line(&mut journal, &temp, SampleKind::Gauge, 21.5, 10_000);
        write_journal_line(&mut journal, &hits, SampleKind::Counter, 1.0, 10_000);
        write_journal_line(&mut journal, &lat_count, SampleKind::SummaryCount, 3.0, 10_000);
        write_journal_line(&mut journal, &lat, SampleKind::SummaryQuantile, 7.0, 10_000);
        // A resend of the same sample collapses into one.
        write_journal_line(&mut journal, &temp, SampleKind::Gauge, 21.5, 10_000);
        journal.push_str("gauge torn 17000");
        let closed = close_journal(&journal, &Helps::default());
        let expected = "\
# TYPE hits counter
# HELP hits statsd counter (c), written by tessera
hits_total{resolution=\"10s\"} 1.0 10.000
hits_total{resolution=\"10s\"} 2.0 20.000
# TYPE lat summary
# HELP lat statsd timer (ms, in seconds), histogram (h) or distribution (d), written by tessera
lat{quantile=\"0.5\"} 7.0 10.000
lat_count 3.0 10.000
# TYPE temp gauge
# HELP temp statsd gauge (g), set (s), or a timer's min or max, written by tessera
temp{room=\"a b\"} 21.5 10.000
# EOF
";
        assert_eq!(closed.text, expected);
        assert_eq!(closed.samples, 5);
        assert_eq!(closed.bad_lines, 1);
    }
}
