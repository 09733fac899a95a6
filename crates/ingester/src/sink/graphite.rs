//! Graphite paths for a tile: the names statsd's Graphite backend, brubeck and tessera give
//! each statistic, so that dashboards built on them read tessera's values unchanged.
//!
//! [`Naming::write`] turns one series' tile into carbon plaintext lines, `path value
//! timestamp\n`, at ingest time ([`crate::admit::lines`]); [`super::carbon`] sends them.
//!
//! | statistic | `statsd` (`legacy_namespace = true`) | `brubeck` | `tessera` |
//! |---|---|---|---|
//! | counter | `stats.<key>` (per second), `stats_counts.<key>` (count) | `<key>` (count) | `<key>.count`, `<key>.rate` |
//! | gauge | `stats.gauges.<key>` | `<key>` | `<key>` |
//! | set | `stats.sets.<key>.count` | `<key>` | `<key>.count` |
//! | timer, histogram, distribution | `stats.timers.<key>.{count,count_ps,sum,sum_squares,mean,median,upper,lower,std}` and per threshold `count_90,mean_90,upper_90,sum_90,sum_squares_90` | `<key>.{count,count_ps,min,max,sum,mean,median}`, `<key>.percentile.{75,95,98,99,999}` | `<key>.{count,rate,sum,min,max,mean,std,median,p90,p99}` |
//!
//! With `legacy_namespace = false`, statsd's names are `<global_prefix>.<prefix_counter>.<key>.rate`
//! and `.count`, `<global_prefix>.<prefix_timer>.<key>.…`, `<global_prefix>.<prefix_gauge>.<key>`
//! and `<global_prefix>.<prefix_set>.<key>.count` (empty prefixes left out), each followed by
//! `.<global_suffix>` when one is set.
//!
//! **Values.** Counters and timer counts are weighted by the sample rate (statsd's
//! `count` and `count_ps` are too). A timer's values are written in the unit it was sent in:
//! [`Tile::timer_scale`] undoes the collector's `timer_unit`. statsd computes `sum`, `mean`,
//! `std` and the threshold statistics from the raw values, each once whatever its sample rate;
//! tessera weights them by the rate, so they agree when nothing is sampled. `count_90` is
//! exact. `median` (statsd's: the mean of the two middle values of an even count),
//! `upper_90`, `mean_90` and `sum_90` come from the sketch, within its
//! relative error `α` (1.08 % at the default schema); `sum_squares_90` within `2α + α²`
//! ([`tessera_core::sketch::Sketch::threshold`]). `upper`, `lower`, `sum`, `sum_squares`,
//! `mean` and `std` are exact.
//!
//! **Names and tags.** Keys are sanitized as statsd's `keyNameSanitize` does: whitespace runs
//! become `_`, `/` becomes `-`, anything outside `[A-Za-z0-9_.-]` is dropped. A `;` in a key
//! starts Graphite tags (`key;k=v`, statsd's own way to tag), which join the DogStatsD tags.
//! Tags are written as Graphite 1.1 tagged series (`path;k=v;…`, [`TagStyle::Tagged`]), as
//! path nodes `<path>.<k>_<v>` ([`TagStyle::Path`]) or not at all ([`TagStyle::Drop`]).
//! Carbon misparses a tag name holding `;!^=` or whitespace, an empty value, and a value
//! starting with `~`: those characters are dropped, a tag left empty is dropped, and each
//! change is counted in [`Changes`]. No line carbon would misparse is written.

use std::fmt::Write;

use tessera_core::aggregate::Distribution;
use tessera_core::parse::MetricKind;

/// Whose paths to write; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// Etsy statsd's Graphite backend.
    #[default]
    Statsd,
    /// GitHub's brubeck.
    Brubeck,
    /// tessera's own: one node per statistic under the key.
    Tessera,
}

/// How a series' tags are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TagStyle {
    /// Graphite 1.1 tagged series: `path;k=v;…`.
    #[default]
    Tagged,
    /// Path nodes after the whole path: `path.k_v.…`.
    Path,
    /// Not written.
    Drop,
}

/// statsd's Graphite backend options (its `graphite` config block, same names).
#[derive(Debug, Clone, PartialEq)]
pub struct StatsdOptions {
    /// `stats.<key>` and `stats_counts.<key>` for counters (statsd's default), or the
    /// prefixed `.rate` / `.count` names below.
    pub legacy_namespace: bool,
    /// `globalPrefix` (default `stats`).
    pub global_prefix: String,
    /// `prefixCounter` (default `counters`).
    pub prefix_counter: String,
    /// `prefixTimer` (default `timers`).
    pub prefix_timer: String,
    /// `prefixGauge` (default `gauges`).
    pub prefix_gauge: String,
    /// `prefixSet` (default `sets`).
    pub prefix_set: String,
    /// `globalSuffix` (default none).
    pub global_suffix: String,
    /// `percentThreshold` (default `[90]`); a negative one reads the top values
    /// (`lower_top10`).
    pub percent_thresholds: Vec<f64>,
}

impl Default for StatsdOptions {
    fn default() -> Self {
        StatsdOptions {
            legacy_namespace: true,
            global_prefix: "stats".into(),
            prefix_counter: "counters".into(),
            prefix_timer: "timers".into(),
            prefix_gauge: "gauges".into(),
            prefix_set: "sets".into(),
            global_suffix: String::new(),
            percent_thresholds: vec![90.0],
        }
    }
}

/// One series' tile, resolved to what Graphite stores.
#[derive(Debug, Clone, Copy)]
pub struct Tile<'a> {
    /// The canonical series id: the name, then `|#` and the tags.
    pub id: &'a [u8],
    /// The value.
    pub value: TileValue<'a>,
    /// The tile's length in seconds (for `count_ps` and counter rates).
    pub interval_secs: f64,
    /// What a timer's values are multiplied by to be in the unit they were sent in (1000
    /// when the collector kept `|ms` in seconds); 1 for histograms and distributions.
    pub timer_scale: f64,
}

/// A tile's value by type.
#[derive(Debug, Clone, Copy)]
pub enum TileValue<'a> {
    /// A counter's count over the tile.
    Counter(f64),
    /// A gauge's value at the tile's end.
    Gauge(f64),
    /// A set's distinct members in the tile.
    Set(f64),
    /// A timer's, histogram's or distribution's values in the tile.
    Distribution(MetricKind, &'a Distribution),
}

/// What [`Naming::write`] had to change to write a line carbon parses; counted by the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    /// Keys that lost or had characters replaced.
    pub keys_sanitized: u64,
    /// Tags that lost characters.
    pub tags_sanitized: u64,
    /// Tags dropped (empty name or value once sanitized).
    pub tags_dropped: u64,
}

/// A target's naming: scheme, tag style and statsd's options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Naming {
    /// Whose paths.
    pub scheme: Scheme,
    /// How tags are written.
    pub tags: TagStyle,
    /// statsd's options (the `statsd` scheme alone reads them).
    pub statsd: StatsdOptions,
}

/// brubeck's timer percentiles and their path nodes.
const BRUBECK_PERCENTILES: [(f64, &str); 5] = [(0.75, "75"), (0.95, "95"), (0.98, "98"), (0.99, "99"), (0.999, "999")];

impl Naming {
    /// Appends the carbon plaintext lines of `tile`, stamped `timestamp_secs`, to `out`.
    pub fn write(&self, tile: &Tile<'_>, timestamp_secs: i64, out: &mut String, changes: &mut Changes) {
        let (raw_name, raw_tags) = tessera_core::series::split_id(tile.id);
        let mut key = String::with_capacity(raw_name.len());
        let mut tags = Vec::new();
        sanitize_key(raw_name, &mut key, &mut tags, changes);
        for tag in raw_tags.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()) {
            // `key:value`, or a bare `key` (DogStatsD's valueless tag), written `key=true`.
            let (name, value) = match tag.iter().position(|byte| *byte == b':') {
                Some(colon) => (&tag[..colon], &tag[colon + 1..]),
                None => (tag, &b"true"[..]),
            };
            push_tag(name, value, &mut tags, changes);
        }
        if key.is_empty() {
            key.push('_');
            changes.keys_sanitized += 1;
        }
        tags.sort();
        let mut line = Line { out, tags: &tags, style: self.tags, timestamp_secs };
        match self.scheme {
            Scheme::Statsd => self.write_statsd(&key, tile, &mut line),
            Scheme::Brubeck => write_brubeck(&key, tile, &mut line),
            Scheme::Tessera => write_tessera(&key, tile, &mut line),
        }
    }

    fn write_statsd(&self, key: &str, tile: &Tile<'_>, line: &mut Line<'_>) {
        let options = &self.statsd;
        let end = [if options.global_suffix.is_empty() { "" } else { "." }, options.global_suffix.as_str()];
        let under = |legacy, prefix| statsd_base(options, legacy, prefix, key);
        let path = |base, node| statsd_path(base, node, end);
        match tile.value {
            TileValue::Counter(count) => {
                let rate = count / tile.interval_secs;
                if options.legacy_namespace {
                    line.write(&path(["stats.", key, "", "", ""], ["", ""]), rate);
                    line.write(&path(["stats_counts.", key, "", "", ""], ["", ""]), count);
                } else {
                    let base = under("", &options.prefix_counter);
                    line.write(&path(base, ["rate", ""]), rate);
                    line.write(&path(base, ["count", ""]), count);
                }
            }
            TileValue::Gauge(value) => {
                line.write(&path(under("stats.gauges.", &options.prefix_gauge), ["", ""]), value)
            }
            TileValue::Set(members) => {
                line.write(&path(under("stats.sets.", &options.prefix_set), ["count", ""]), members)
            }
            TileValue::Distribution(kind, distribution) => {
                let base = under("stats.timers.", &options.prefix_timer);
                let stats = Stats::of(kind, distribution, tile);
                let mut stat = |node: [&str; 2], value: f64| line.write(&statsd_path(base, node, end), value);
                for &pct in &options.percent_thresholds {
                    let Some((count, threshold)) = stats.threshold(distribution, pct) else { continue };
                    let clean = format!("{pct}").replace('.', "_").replace('-', "top");
                    stat(["count_", &clean], count);
                    stat(["mean_", &clean], threshold.sum / count);
                    stat([if pct > 0.0 { "upper_" } else { "lower_" }, &clean], threshold.boundary);
                    stat(["sum_", &clean], threshold.sum);
                    stat(["sum_squares_", &clean], threshold.sum_squares);
                }
                stat(["std", ""], stats.std);
                stat(["upper", ""], stats.max);
                stat(["lower", ""], stats.min);
                stat(["count", ""], stats.count);
                stat(["count_ps", ""], stats.count / tile.interval_secs);
                stat(["sum", ""], stats.sum);
                stat(["sum_squares", ""], stats.sum_squares);
                stat(["mean", ""], stats.mean);
                stat(["median", ""], stats.statsd_median(distribution));
            }
        }
    }
}

/// The path up to the key: statsd's fixed `legacy` one, or `<global_prefix>.<prefix>.<key>`
/// (empty prefixes left out).
fn statsd_base<'a>(options: &'a StatsdOptions, legacy: &'static str, prefix: &'a str, key: &'a str) -> [&'a str; 5] {
    if options.legacy_namespace {
        return [legacy, key, "", "", ""];
    }
    let dot = |node: &str| if node.is_empty() { "" } else { "." };
    [options.global_prefix.as_str(), dot(&options.global_prefix), prefix, dot(prefix), key]
}

/// A statsd path: the path up to the key, then `.<node>` (a statistic's name, in two parts:
/// `count_` and `90`) unless the node is empty, then `.<global_suffix>` if one is set.
fn statsd_path<'a>(base: [&'a str; 5], node: [&'a str; 2], end: [&'a str; 2]) -> [&'a str; 10] {
    let dot = if node[0].is_empty() { "" } else { "." };
    [base[0], base[1], base[2], base[3], base[4], dot, node[0], node[1], end[0], end[1]]
}

fn write_brubeck(key: &str, tile: &Tile<'_>, line: &mut Line<'_>) {
    match tile.value {
        TileValue::Counter(value) | TileValue::Gauge(value) | TileValue::Set(value) => line.write(&[key], value),
        TileValue::Distribution(kind, distribution) => {
            let stats = Stats::of(kind, distribution, tile);
            let median = stats.quantile(distribution, 0.5);
            let count_ps = stats.count / tile.interval_secs;
            let nodes = [("count", stats.count), ("count_ps", count_ps), ("min", stats.min), ("max", stats.max)];
            line.write_nodes(
                key,
                nodes.into_iter().chain([("sum", stats.sum), ("mean", stats.mean), ("median", median)]),
            );
            for (q, node) in BRUBECK_PERCENTILES {
                line.write(&[key, ".percentile.", node], stats.quantile(distribution, q));
            }
        }
    }
}

fn write_tessera(key: &str, tile: &Tile<'_>, line: &mut Line<'_>) {
    match tile.value {
        TileValue::Counter(count) => {
            line.write_nodes(key, [("count", count), ("rate", count / tile.interval_secs)]);
        }
        TileValue::Gauge(value) => line.write(&[key], value),
        TileValue::Set(members) => line.write(&[key, ".count"], members),
        TileValue::Distribution(kind, distribution) => {
            let stats = Stats::of(kind, distribution, tile);
            let quantile = |q| stats.quantile(distribution, q);
            line.write_nodes(
                key,
                [
                    ("count", stats.count),
                    ("rate", stats.count / tile.interval_secs),
                    ("sum", stats.sum),
                    ("min", stats.min),
                    ("max", stats.max),
                    ("mean", stats.mean),
                    ("std", stats.std),
                    ("median", quantile(0.5)),
                    ("p90", quantile(0.9)),
                    ("p99", quantile(0.99)),
                ],
            );
        }
    }
}

/// Exact powers of ten, for [`in_unit`].
const POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// `value` × `scale`, in the unit it was sent in: to 15 significant digits when a scale
/// applies. The collector's `ms` → s and back is exact to 15 digits but not to the last
/// bit, and merges that sum in another order differ there: ten timings of 100 … 1000 ms
/// have a sum of 5500, as statsd writes it, not 5499.999999999999.
fn in_unit(value: f64, scale: f64) -> f64 {
    let scaled = value * scale;
    if scale == 1.0 || scaled == 0.0 || !scaled.is_finite() {
        return scaled;
    }
    let digits = 14 - scaled.abs().log10().floor() as i32;
    match usize::try_from(digits).ok().and_then(|digits| POWERS_OF_TEN.get(digits)) {
        Some(power) => (scaled * power).round() / power,
        None => scaled,
    }
}

/// A distribution's statistics in the unit its values were sent in.
pub(super) struct Stats {
    scale: f64,
    pub(super) count: f64,
    pub(super) sum: f64,
    sum_squares: f64,
    pub(super) mean: f64,
    /// Population standard deviation, as statsd's and Telegraf's.
    pub(super) std: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

impl Stats {
    pub(super) fn of(kind: MetricKind, distribution: &Distribution, tile: &Tile<'_>) -> Stats {
        let scale = if kind == MetricKind::Timer { tile.timer_scale } else { 1.0 };
        let count = distribution.count;
        let sum = in_unit(distribution.sum, scale);
        let sum_squares = in_unit(distribution.sum_squares, scale * scale);
        let (mean, std) = if count > 0.0 {
            let mean = sum / count;
            (mean, (sum_squares / count - mean * mean).max(0.0).sqrt())
        } else {
            (0.0, 0.0)
        };
        let finite_or_zero = |value: f64| if value.is_finite() { in_unit(value, scale) } else { 0.0 };
        Stats {
            scale,
            count,
            sum,
            sum_squares,
            mean,
            std,
            min: finite_or_zero(distribution.min),
            max: finite_or_zero(distribution.max),
        }
    }

    pub(super) fn quantile(&self, distribution: &Distribution, q: f64) -> f64 {
        distribution.sketch.quantile(q).map_or(0.0, |value| in_unit(value, self.scale))
    }

    /// statsd's median: the middle value, or the mean of the two middle values of an even
    /// count (each read from the sketch, within its `α`).
    pub(super) fn statsd_median(&self, distribution: &Distribution) -> f64 {
        let count = self.count.round();
        if count < 2.0 || count % 2.0 == 1.0 {
            return self.quantile(distribution, 0.5);
        }
        let middle = count / 2.0;
        (self.quantile(distribution, middle / count) + self.quantile(distribution, (middle + 1.0) / count)) / 2.0
    }

    /// statsd's threshold `pct`: `round(|pct| / 100 × count)` values from the bottom (from
    /// the top when negative), none when that rounds to 0; with one value, that value.
    fn threshold(&self, distribution: &Distribution, pct: f64) -> Option<(f64, tessera_core::sketch::Threshold)> {
        let count = if self.count > 1.0 { (pct.abs() / 100.0 * self.count).round() } else { self.count };
        let threshold = distribution.sketch.threshold(count, pct < 0.0)?;
        let scaled = tessera_core::sketch::Threshold {
            weight: threshold.weight,
            sum: in_unit(threshold.sum, self.scale),
            sum_squares: in_unit(threshold.sum_squares, self.scale * self.scale),
            boundary: in_unit(threshold.boundary, self.scale),
        };
        Some((count, scaled))
    }
}

/// Writes lines with one series' tags and timestamp.
struct Line<'a> {
    out: &'a mut String,
    tags: &'a [(String, String)],
    style: TagStyle,
    timestamp_secs: i64,
}

impl Line<'_> {
    /// Writes `<key>.<node>` for each `(node, value)`.
    fn write_nodes(&mut self, key: &str, nodes: impl IntoIterator<Item = (&'static str, f64)>) {
        for (node, value) in nodes {
            self.write(&[key, ".", node], value);
        }
    }

    /// Writes one line whose path is `parts` joined, without building it first.
    fn write(&mut self, parts: &[&str], value: f64) {
        for part in parts {
            self.out.push_str(part);
        }
        match self.style {
            TagStyle::Tagged => {
                for (name, value) in self.tags {
                    let _ = write!(self.out, ";{name}={value}");
                }
            }
            TagStyle::Path => {
                for (name, value) in self.tags {
                    let _ = write!(self.out, ".{name}_{value}");
                }
            }
            TagStyle::Drop => {}
        }
        let value = if value.is_finite() { value } else { 0.0 };
        let _ = writeln!(self.out, " {value} {}", self.timestamp_secs);
    }
}

/// statsd's `keyNameSanitize` on a key, into `key`; `;k=v` parts of it go to `tags`.
fn sanitize_key(raw: &[u8], key: &mut String, tags: &mut Vec<(String, String)>, changes: &mut Changes) {
    let mut parts = raw.split(|byte| *byte == b';');
    let name = parts.next().unwrap_or_default();
    let mut changed = false;
    let mut in_whitespace = false;
    for &byte in name {
        if byte.is_ascii_whitespace() {
            if !in_whitespace {
                key.push('_');
            }
            in_whitespace = true;
            changed = true;
            continue;
        }
        in_whitespace = false;
        match byte {
            b'/' => {
                key.push('-');
                changed = true;
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => key.push(char::from(byte)),
            _ => changed = true,
        }
    }
    changes.keys_sanitized += u64::from(changed);
    for part in parts {
        match part.iter().position(|byte| *byte == b'=') {
            Some(equals) => push_tag(&part[..equals], &part[equals + 1..], tags, changes),
            None => changes.tags_dropped += 1,
        }
    }
}

/// Adds one tag, sanitized for carbon, or counts it dropped.
fn push_tag(name: &[u8], value: &[u8], tags: &mut Vec<(String, String)>, changes: &mut Changes) {
    let mut changed = false;
    let mut clean = |text: &[u8], forbidden: &[u8]| -> String {
        let mut out = String::with_capacity(text.len());
        for chunk in text.utf8_chunks() {
            changed |= !chunk.invalid().is_empty();
            for c in chunk.valid().chars() {
                if c.is_whitespace() {
                    out.push('_');
                    changed = true;
                } else if c.is_ascii() && forbidden.contains(&(c as u8)) {
                    changed = true;
                } else {
                    out.push(c);
                }
            }
        }
        out
    };
    let name = clean(name, b";!^=");
    let mut value = clean(value, b";");
    if value.starts_with('~') {
        value = value.trim_start_matches('~').to_owned();
        changed = true;
    }
    if name.is_empty() || value.is_empty() {
        changes.tags_dropped += 1;
        return;
    }
    changes.tags_sanitized += u64::from(changed);
    tags.push((name, value));
}

#[cfg(test)]
mod tests;
