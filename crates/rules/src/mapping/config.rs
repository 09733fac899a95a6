//! The YAML of a statsd_exporter mapping file, key for key.
//!
//! Every key statsd_exporter reads is declared here and every struct denies
//! unknown keys, so a key that is misspelt or that tessera does not know is
//! an error naming the key and its line (serde_yaml's message), never
//! silently ignored. What each key does in tessera is decided in
//! `mapping.rs`: an effect, a note, or an error.
//!
//! Enumerated values (`match_type`, `action`, ...) are read as strings and
//! checked there, so that their errors name the mapping and the line too.

use serde::Deserialize;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    /// `defaults:`.
    #[serde(default)]
    pub defaults: Option<DefaultsConfig>,
    /// `mappings:`, in file order.
    #[serde(default)]
    pub mappings: Option<Vec<MappingConfig>>,
}

/// `defaults:` (statsd_exporter `mapperConfigDefaults`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DefaultsConfig {
    /// `glob` (default) or `regex`.
    pub match_type: Option<String>,
    /// Glob rules: most specific wins instead of first in file.
    pub glob_disable_ordering: Option<bool>,
    /// `histogram` or `summary`.
    pub observer_type: Option<String>,
    /// Deprecated name of `observer_type`.
    pub timer_type: Option<String>,
    /// Deprecated place of `histogram_options.buckets`.
    pub buckets: Option<Vec<f64>>,
    /// Deprecated place of `summary_options.quantiles`.
    pub quantiles: Option<Vec<Quantile>>,
    /// Series expiry (Go duration).
    pub ttl: Option<GoDuration>,
    /// Summary settings.
    pub summary_options: Option<SummaryOptions>,
    /// Histogram settings.
    pub histogram_options: Option<HistogramOptions>,
}

/// One item of `mappings:` (statsd_exporter `MetricMapping`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MappingConfig {
    /// The glob or regex.
    #[serde(rename = "match")]
    pub pattern: String,
    /// `glob` or `regex`; the default comes from `defaults`.
    pub match_type: Option<String>,
    /// The metric name template.
    pub name: Option<String>,
    /// Label name to value template, in file order.
    pub labels: Option<serde_yaml::Mapping>,
    /// The line's own tags win over mapped labels of the same name.
    pub honor_labels: Option<bool>,
    /// `map` (default) or `drop`.
    pub action: Option<String>,
    /// `counter`, `gauge` or `observer` (`timer` in older releases).
    pub match_metric_type: Option<String>,
    /// `histogram` or `summary`.
    pub observer_type: Option<String>,
    /// Deprecated name of `observer_type`.
    pub timer_type: Option<String>,
    /// Deprecated place of `histogram_options.buckets`.
    pub buckets: Option<Vec<f64>>,
    /// Deprecated place of `summary_options.quantiles`.
    pub quantiles: Option<Vec<Quantile>>,
    /// HELP text.
    pub help: Option<String>,
    /// Series expiry (Go duration).
    pub ttl: Option<GoDuration>,
    /// Summary settings.
    pub summary_options: Option<SummaryOptions>,
    /// Histogram settings.
    pub histogram_options: Option<HistogramOptions>,
    /// A factor applied to every value.
    pub scale: Option<f64>,
}

/// `summary_options:`. The README once documented `max_summary_age`,
/// `summary_age_buckets` and `stream_buffer_size`; statsd_exporter's code
/// reads `max_age`, `age_buckets` and `buf_cap`. Both spellings are read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SummaryOptions {
    /// Objectives.
    pub quantiles: Option<Vec<Quantile>>,
    /// Sliding window length (Go duration).
    #[serde(alias = "max_summary_age")]
    pub max_age: Option<GoDuration>,
    /// Sliding window buckets.
    #[serde(alias = "summary_age_buckets")]
    pub age_buckets: Option<u32>,
    /// Sample stream buffer.
    #[serde(alias = "stream_buffer_size")]
    pub buf_cap: Option<u32>,
}

/// `histogram_options:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HistogramOptions {
    /// Classic bucket bounds.
    pub buckets: Option<Vec<f64>>,
    /// Native histogram growth factor between buckets.
    pub native_histogram_bucket_factor: Option<f64>,
    /// Native histogram bucket limit.
    pub native_histogram_max_buckets: Option<u32>,
}

/// One summary objective.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Quantile {
    /// The quantile, in `0..=1`.
    pub quantile: f64,
    /// Its allowed rank error.
    pub error: f64,
}

/// A Go `time.Duration` as YAML gives it: a string such as `1m20s`, or a
/// plain integer (nanoseconds). Kept as written, for notes; checked by
/// [`GoDuration::check`].
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum GoDuration {
    /// An integer number of nanoseconds.
    Nanos(i64),
    /// A Go duration string.
    Text(String),
}

impl GoDuration {
    /// The duration as written, or an error saying why Go would refuse it.
    pub(super) fn check(&self) -> Result<String, String> {
        match self {
            GoDuration::Nanos(nanos) => Ok(format!("{nanos}ns")),
            GoDuration::Text(text) if is_go_duration(text) => Ok(text.clone()),
            GoDuration::Text(text) => {
                Err(format!("`{text}` is not a duration (e.g. `90s`, `1m30s`; units ns, us, µs, ms, s, m, h)"))
            }
        }
    }
}

/// Go's `time.ParseDuration` grammar: `[+-]` then one or more `<decimal><unit>`,
/// or a bare `0`.
fn is_go_duration(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if unsigned == "0" {
        return true;
    }
    let mut rest = unsigned;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return false;
        }
        rest = &rest[number_end..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .into_iter()
            .filter(|unit| rest.starts_with(unit))
            .max_by_key(|unit| unit.len());
        let Some(unit) = unit else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}
