//! The live dashboard at `GET /`: charts of the daemon's own metrics over
//! the last 15 minutes, with no Prometheus and nothing fetched from outside.
//!
//! A sampler task encodes the registry every [`STEP`] (as a scrape would),
//! keeps the samples the panels need for the longest window a query looks
//! back over, and evaluates every panel's queries into points of a ring
//! spanning [`SPAN`]. The page (`index.html`, `dashboard.js`,
//! `dashboard.css`, compiled into the binary) polls `GET /dashboard/data?since=<ms>`
//! for the points after the last one it has and draws them as SVG.
//!
//! What is shown is one fixed set of panels (`PANELS`) for every daemon: a panel
//! appears when the registry exports at least one metric it reads, so the
//! collector's page shows intake and queues, the ingester's storage and
//! end-to-end latency, and `tessera local`'s page all of them.
//!
//! Queries are a small subset of PromQL's, evaluated over the in-process
//! ring: `sum by (label) (rate(counter[5s]))`, `sum by (label) (gauge)`, and
//! `histogram_quantile(q, sum by (le, label) (rate(histogram_bucket[w])))`
//! with Prometheus's linear interpolation inside a bucket.
//!
//! Cost: one registry encode and parse per second (the same as a 1 s
//! scrape), and at most 900 points per chart line.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tessera_core::clock::now_ms;

use super::Telemetry;
use crate::Shutdown;

/// How often the registry is sampled, and the step between points.
pub const STEP: Duration = Duration::from_secs(1);

/// How far back the charts go.
pub const SPAN: Duration = Duration::from_secs(15 * 60);

/// The window of rates.
const RATE_WINDOW_MS: i64 = 5_000;

/// The page and its assets.
pub const INDEX_HTML: &str = include_str!("dashboard/index.html");
/// The page's script.
pub const DASHBOARD_JS: &str = include_str!("dashboard/dashboard.js");
/// The page's style sheet.
pub const DASHBOARD_CSS: &str = include_str!("dashboard/dashboard.css");

/// What a chart line is computed from.
#[derive(Debug, Clone, Copy)]
enum Query {
    /// `sum by (by) (rate(counter[5s]))`: per second.
    Rate { counter: &'static str, by: Option<&'static str> },
    /// `sum by (by) (gauge)`.
    Sum { gauge: &'static str, by: Option<&'static str> },
    /// `histogram_quantile(q, sum by (le, by) (rate(histogram_bucket[window])))`.
    Quantile { histogram: &'static str, q: f64, by: Option<&'static str>, window_secs: i64 },
}

impl Query {
    /// The sample name the query reads.
    fn sample_name(&self) -> String {
        match self {
            Query::Rate { counter, .. } => (*counter).to_owned(),
            Query::Sum { gauge, .. } => (*gauge).to_owned(),
            Query::Quantile { histogram, .. } => format!("{histogram}_bucket"),
        }
    }

    /// How far back it looks, ms.
    fn window_ms(&self) -> i64 {
        match self {
            Query::Rate { .. } => RATE_WINDOW_MS,
            Query::Sum { .. } => 0,
            Query::Quantile { window_secs, .. } => window_secs * 1_000,
        }
    }
}

/// One query and how its lines are named: `{}` is replaced by the value of
/// the query's `by` label.
#[derive(Debug, Clone, Copy)]
struct Line {
    legend: &'static str,
    query: Query,
}

/// How a panel's values read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    PerSecond,
    Seconds,
    Bytes,
    Count,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::PerSecond => "per_second",
            Unit::Seconds => "seconds",
            Unit::Bytes => "bytes",
            Unit::Count => "count",
        }
    }
}

/// One chart.
#[derive(Debug)]
struct Panel {
    id: &'static str,
    title: &'static str,
    unit: Unit,
    lines: &'static [Line],
}

const fn rate(legend: &'static str, counter: &'static str, by: Option<&'static str>) -> Line {
    Line { legend, query: Query::Rate { counter, by } }
}

const fn sum(legend: &'static str, gauge: &'static str, by: Option<&'static str>) -> Line {
    Line { legend, query: Query::Sum { gauge, by } }
}

const fn quantile(legend: &'static str, histogram: &'static str, q: f64, by: Option<&'static str>) -> Line {
    Line { legend, query: Query::Quantile { histogram, q, by, window_secs: 60 } }
}

/// The charts, in page order.
const PANELS: &[Panel] = &[
    Panel {
        id: "lines_in",
        title: "Lines in",
        unit: Unit::PerSecond,
        lines: &[
            rate("lines", "tessera_collector_lines_received_total", None),
            rate("datagrams", "tessera_collector_datagrams_received_total", None),
        ],
    },
    Panel {
        id: "drops",
        title: "Parse errors and drops, by reason",
        unit: Unit::PerSecond,
        lines: &[
            rate("parse errors", "tessera_collector_parse_errors_total", None),
            rate("kernel drops (socket full)", "tessera_collector_kernel_drops_total", None),
            rate("collector: {}", "tessera_collector_drops_total", Some("reason")),
            rate("aggregator refused: {}", "tessera_aggregator_partials_rejected_total", Some("reason")),
            rate("aggregator: {}", "tessera_aggregator_drops_total", Some("reason")),
            rate("ingester skipped: {}", "tessera_ingester_tiles_skipped_total", Some("reason")),
            rate("storage rejected", "tessera_ingester_sink_rejected_samples_total", None),
        ],
    },
    Panel {
        id: "active_series",
        title: "Active series",
        unit: Unit::Count,
        lines: &[
            sum("collector", "tessera_collector_active_series", None),
            sum("aggregator {}", "tessera_aggregator_active_series", Some("policy")),
        ],
    },
    Panel {
        id: "tiles",
        title: "Tiles flushed (series values)",
        unit: Unit::PerSecond,
        lines: &[
            rate("{}", "tessera_aggregator_series_flushed_total", Some("policy")),
            rate("samples written to storage", "tessera_ingester_samples_written_total", None),
        ],
    },
    Panel {
        id: "queues",
        title: "Queued at each hop",
        unit: Unit::Bytes,
        lines: &[
            sum("collector → aggregators", "tessera_collector_queue_bytes", None),
            sum("aggregator → ingester", "tessera_aggregator_queue_bytes", None),
            sum("ingester queue", "tessera_ingester_queue_bytes", None),
        ],
    },
    Panel {
        id: "storage_latency",
        title: "Storage request latency",
        unit: Unit::Seconds,
        lines: &[
            quantile("p50", "tessera_ingester_sink_request_duration_seconds", 0.5, None),
            quantile("p99", "tessera_ingester_sink_request_duration_seconds", 0.99, None),
        ],
    },
    Panel {
        id: "end_to_end",
        title: "End-to-end latency (storage write − tile end)",
        unit: Unit::Seconds,
        lines: &[
            quantile("p50 {}", "tessera_ingester_end_to_end_latency_seconds", 0.5, Some("resolution")),
            quantile("p99 {}", "tessera_ingester_end_to_end_latency_seconds", 0.99, Some("resolution")),
        ],
    },
    Panel {
        id: "latency_breakdown",
        title: "Where the latency goes (p50 of each hop)",
        unit: Unit::Seconds,
        lines: &[
            quantile("collector flush lag", "tessera_collector_flush_lag_seconds", 0.5, None),
            quantile("waiting for tile close {}", "tessera_aggregator_flush_lag_seconds", 0.5, Some("policy")),
            quantile("ingester queue {}", "tessera_ingester_queue_time_seconds", 0.5, Some("resolution")),
            quantile("storage request", "tessera_ingester_sink_request_duration_seconds", 0.5, None),
        ],
    },
];

/// One sample of a scrape.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

/// The samples of one scrape that some panel reads, by sample name.
#[derive(Debug, Default)]
struct Snapshot {
    at_ms: i64,
    samples: HashMap<String, Vec<Sample>>,
}

/// A chart line's points, oldest first.
#[derive(Debug, Default)]
struct Points(VecDeque<(i64, f64)>);

/// What the sampler keeps.
#[derive(Debug, Default)]
struct State {
    /// Recent scrapes, oldest first, as far back as the longest query window.
    snapshots: VecDeque<Snapshot>,
    /// Per (panel index, line name).
    lines: BTreeMap<(usize, String), Points>,
    /// Panels whose metrics this registry exports.
    shown: Vec<bool>,
}

/// The dashboard's data: cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Dashboard {
    state: Arc<Mutex<State>>,
}

impl Dashboard {
    /// Starts sampling `telemetry` every [`STEP`] until `shutdown`.
    pub fn start(telemetry: Telemetry, shutdown: Shutdown) -> Dashboard {
        let dashboard = Dashboard::default();
        let sampler = dashboard.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(STEP);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while shutdown.tick(&mut ticks).await {
                match telemetry.encode() {
                    Ok(text) => sampler.record(now_ms(), &text),
                    Err(_) => tracing::warn!("dashboard: a metric failed to encode"),
                }
            }
        });
        dashboard
    }

    /// Takes one scrape's text, taken at `at_ms`, and adds a point to every line.
    pub fn record(&self, at_ms: i64, text: &str) {
        let (families, samples) = parse(text, wanted());
        let mut state = self.state();
        state.shown = PANELS
            .iter()
            .map(|panel| panel.lines.iter().any(|line| families.contains(family_of(&line.query))))
            .collect();
        state.snapshots.push_back(Snapshot { at_ms, samples });
        let longest = PANELS.iter().flat_map(|panel| panel.lines).map(|line| line.query.window_ms()).max();
        let keep_from = at_ms - longest.unwrap_or(0) - STEP.as_millis() as i64;
        while state.snapshots.front().is_some_and(|oldest| oldest.at_ms < keep_from) {
            state.snapshots.pop_front();
        }
        let mut points = Vec::new();
        for (index, panel) in PANELS.iter().enumerate() {
            for line in panel.lines {
                for (name, value) in evaluate(&state.snapshots, &line.query) {
                    points.push(((index, line.legend.replace("{}", &name)), value));
                }
            }
        }
        for (key, value) in points {
            state.lines.entry(key).or_default().0.push_back((at_ms, value));
        }
        let span_from = at_ms - SPAN.as_millis() as i64;
        state.lines.retain(|_, points| {
            while points.0.front().is_some_and(|(at, _)| *at <= span_from) {
                points.0.pop_front();
            }
            !points.0.is_empty()
        });
    }

    /// The panels shown and their points after `since_ms`, as JSON for the page.
    pub fn to_json(&self, daemon: &str, since_ms: i64) -> String {
        let state = self.state();
        let panels: Vec<serde_json::Value> = PANELS
            .iter()
            .enumerate()
            .filter(|(index, _)| state.shown.get(*index).copied().unwrap_or(false))
            .map(|(index, panel)| {
                let lines: Vec<serde_json::Value> = state
                    .lines
                    .range((index, String::new())..(index + 1, String::new()))
                    .map(|((_, name), points)| {
                        let points: Vec<(i64, Option<f64>)> = points
                            .0
                            .iter()
                            .filter(|(at, _)| *at > since_ms)
                            .map(|(at, value)| (*at, value.is_finite().then_some(*value)))
                            .collect();
                        serde_json::json!({ "name": name, "points": points })
                    })
                    .collect();
                serde_json::json!({ "id": panel.id, "title": panel.title, "unit": panel.unit.name(), "lines": lines })
            })
            .collect();
        serde_json::json!({
            "daemon": daemon,
            "now": now_ms(),
            "step_ms": STEP.as_millis() as u64,
            "span_ms": SPAN.as_millis() as u64,
            "panels": panels,
        })
        .to_string()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The sample names some panel reads, computed once.
fn wanted() -> &'static HashSet<String> {
    static WANTED: std::sync::OnceLock<HashSet<String>> = std::sync::OnceLock::new();
    WANTED.get_or_init(|| {
        PANELS.iter().flat_map(|panel| panel.lines.iter().map(|line| line.query.sample_name())).collect()
    })
}

/// Every metric family the panels read (the names in `# TYPE` lines), for the test that
/// checks them against the daemons' declarations.
pub fn families() -> Vec<&'static str> {
    PANELS.iter().flat_map(|panel| panel.lines.iter().map(|line| family_of(&line.query))).collect()
}

/// The metric family a query reads (the name in `# TYPE` lines).
fn family_of(query: &Query) -> &'static str {
    match query {
        Query::Rate { counter, .. } => counter.strip_suffix("_total").unwrap_or(counter),
        Query::Sum { gauge, .. } => gauge,
        Query::Quantile { histogram, .. } => histogram,
    }
}

/// The families the text declares, and its samples named in `wanted`.
fn parse(text: &str, wanted: &HashSet<String>) -> (HashSet<String>, HashMap<String, Vec<Sample>>) {
    let mut families = HashSet::new();
    let mut samples: HashMap<String, Vec<Sample>> = HashMap::new();
    for line in text.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            if let Some(family) = declaration.split(' ').next() {
                families.insert(family.to_owned());
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if !wanted.contains(name) {
            continue;
        }
        if let Some(sample) = parse_sample(&line[name_end..]) {
            samples.entry(name.to_owned()).or_default().push(sample);
        }
    }
    (families, samples)
}

/// `{a="x",b="y"} 1.5` (labels optional) after the name.
fn parse_sample(rest: &str) -> Option<Sample> {
    let mut labels = Vec::new();
    let mut rest = rest;
    if let Some(inside) = rest.strip_prefix('{') {
        let mut chars = inside.char_indices();
        let mut key = String::new();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '}' => break index,
                ',' => key.clear(),
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                c => key.push(c),
            }
        };
        rest = &inside[end + 1..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample { labels, value })
}

/// A query's value per line name (the `by` label's value, or "" without one), now.
fn evaluate(snapshots: &VecDeque<Snapshot>, query: &Query) -> Vec<(String, f64)> {
    let Some(now) = snapshots.back() else { return Vec::new() };
    let earliest = |window_ms: i64| snapshots.iter().find(|snapshot| snapshot.at_ms >= now.at_ms - window_ms);
    match *query {
        Query::Sum { gauge, by } => grouped(now, gauge, by).into_iter().collect(),
        Query::Rate { counter, by } => {
            let Some(then) = earliest(RATE_WINDOW_MS).filter(|then| then.at_ms < now.at_ms) else { return Vec::new() };
            let seconds = (now.at_ms - then.at_ms) as f64 / 1_000.0;
            let before = grouped(then, counter, by);
            grouped(now, counter, by)
                .into_iter()
                // A series absent before had not counted anything yet.
                .map(|(name, total)| {
                    let increase = (total - before.get(&name).copied().unwrap_or(0.0)).max(0.0);
                    (name, increase / seconds)
                })
                .collect()
        }
        Query::Quantile { histogram, q, by, window_secs } => {
            let Some(then) = earliest(window_secs * 1_000).filter(|then| then.at_ms < now.at_ms) else {
                return Vec::new();
            };
            let name = format!("{histogram}_bucket");
            let buckets = |snapshot: &Snapshot| {
                let mut groups: BTreeMap<String, BTreeMap<OrderedBound, f64>> = BTreeMap::new();
                for sample in snapshot.samples.get(&name).into_iter().flatten() {
                    let Some(le) = sample.label("le").and_then(parse_bound) else { continue };
                    let group = by.and_then(|label| sample.label(label)).unwrap_or_default().to_owned();
                    *groups.entry(group).or_default().entry(OrderedBound(le)).or_default() += sample.value;
                }
                groups
            };
            let before = buckets(then);
            buckets(now)
                .into_iter()
                .filter_map(|(group, counts)| {
                    let earlier = before.get(&group);
                    let increases: Vec<(f64, f64)> = counts
                        .iter()
                        .map(|(le, count)| {
                            let was = earlier.and_then(|buckets| buckets.get(le)).copied().unwrap_or(0.0);
                            (le.0, (count - was).max(0.0))
                        })
                        .collect();
                    Some((group, bucket_quantile(q, &increases)?))
                })
                .collect()
        }
    }
}

/// Sums the samples of `name` per value of label `by`.
fn grouped(snapshot: &Snapshot, name: &str, by: Option<&str>) -> HashMap<String, f64> {
    let mut groups = HashMap::new();
    for sample in snapshot.samples.get(name).into_iter().flatten() {
        let group = by.and_then(|label| sample.label(label)).unwrap_or_default().to_owned();
        *groups.entry(group).or_insert(0.0) += sample.value;
    }
    groups
}

fn parse_bound(text: &str) -> Option<f64> {
    if text == "+Inf" { Some(f64::INFINITY) } else { text.parse().ok() }
}

/// A bucket bound that sorts (bounds are never NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrderedBound(f64);

impl Eq for OrderedBound {}

impl PartialOrd for OrderedBound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedBound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Prometheus's `histogram_quantile` over cumulative `(upper bound,
/// count)` buckets in bound order: linear inside the bucket holding the
/// rank; a rank in the `+Inf` bucket gives the largest finite bound. `None`
/// without observations.
fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let in_bucket = count - lower.1;
            if in_bucket <= 0.0 {
                return Some(bound);
            }
            return Some(lower.0 + (bound - lower.0) * (rank - lower.1) / in_bucket);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests;
