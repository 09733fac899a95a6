//! Mergeable aggregates, one per metric type, and their wire form.
//!
//! | kind | what it keeps | merge |
//! |---|---|---|
//! | counter | sum of `value / sample_rate` | add |
//! | gauge | last value set and the deltas after it, by order stamp ([`gauge`]) | later set wins; deltas after it add |
//! | timer, histogram, distribution | count, sum, min, max, [`Sketch`], and [`FixedBuckets`] when a mapping asks for a classic histogram | add, min, max, sketch merge, add per bucket |
//! | set | [`HyperLogLog`] of members | register max (union) |
//!
//! Every merge is associative, so a 1 s partial from a hundred hosts folds
//! into one tile with the same meaning in any order. Gauges, whose sets and
//! deltas do not commute, carry order stamps so that their merge restores
//! the order the lines were sent in ([`gauge`]).
//!
//! ```
//! use tessera_core::aggregate::{Aggregate, Reading};
//! use tessera_core::parse::{parse_line, MetricKind, Parsed};
//!
//! let mut total = Aggregate::new(MetricKind::Counter);
//! for text in [&b"hits:1|c|@0.5"[..], b"hits:3|c"] {
//!     let Parsed::Metric(line) = parse_line(text) else { unreachable!() };
//!     total.observe(&line, 0, Reading::default());
//! }
//! assert_eq!(total.counter(), Some(5.0));
//! ```

use std::sync::Arc;

use tessera_proto as proto;

mod buckets;
mod gauge;

pub use buckets::{BucketsError, FixedBuckets, MAX_BUCKETS, check_bounds};
pub use gauge::{DeltaRun, Gauge, MAX_DELTA_RUNS, MergeOrder};

use crate::hll::{HllError, HyperLogLog};
use crate::parse::{Line, MetricKind};
use crate::sketch::{Sketch, SketchError};

/// How a gauge value written with an explicit sign (`+3`, `-3`) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GaugeDeltas {
    /// The statsd spec: a signed value changes the current value by that much.
    #[default]
    Statsd,
    /// A signed value is simply the new value (`-3` sets the gauge to -3).
    Absolute,
}

/// The unit `|ms` timer values are kept and written in. Prometheus names durations in
/// seconds, and statsd_exporter divides every `|ms` value by 1000; `|h` and `|d` values have
/// no unit and are kept as sent. The division happens here, as each value is folded into its
/// series at the collector, so every later hop (the aggregator's tiles, the ingester's
/// samples) already holds seconds. The sketch's relative accuracy is the same in any unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimerUnit {
    /// Each `|ms` value divided by 1000, as statsd_exporter does.
    #[default]
    Seconds,
    /// `|ms` values as sent.
    Milliseconds,
}

impl TimerUnit {
    /// A value of a line of `kind` in the unit it is kept in.
    #[inline(always)]
    pub fn convert(self, kind: MetricKind, value: f64) -> f64 {
        if kind == MetricKind::Timer && self == TimerUnit::Seconds { value / 1000.0 } else { value }
    }
}

/// How the values of a line are read as they are folded in ([`Aggregate::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// Whether a signed gauge value is a delta.
    pub gauge_deltas: GaugeDeltas,
    /// The unit `|ms` values are kept in.
    pub timer_unit: TimerUnit,
}

/// Summary of a timer, histogram or distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    /// Sum of weights (each sample counts `1 / sample_rate`).
    pub count: f64,
    /// Weighted sum of values.
    pub sum: f64,
    /// Weighted sum of the squares of the values: with `count` and `sum`, the standard
    /// deviation statsd's Graphite backend writes (`std`, `sum_squares`). Merges by addition.
    pub sum_squares: f64,
    /// Smallest value seen (`+inf` when empty).
    pub min: f64,
    /// Largest value seen (`-inf` when empty).
    pub max: f64,
    /// The quantile sketch.
    pub sketch: Sketch,
    /// Exact counts per fixed bucket, for a series a mapping makes a classic histogram.
    pub buckets: Option<Box<FixedBuckets>>,
    /// The quantiles to write, for a series a mapping makes a summary with quantiles of its
    /// own (the ingester's `[mapping] quantiles` otherwise).
    pub quantiles: Option<Arc<[f64]>>,
}

/// What a mapping makes of an observer series beyond its sketch (statsd_exporter's
/// `observer_type`), decided once when the series is new to a reader's table.
#[derive(Debug, Clone, PartialEq)]
pub enum Observer {
    /// A classic histogram with these bucket bounds, its values counted exactly.
    Histogram(Arc<[f64]>),
    /// A summary with these quantiles, read from the sketch.
    Summary(Arc<[f64]>),
}

impl Default for Distribution {
    fn default() -> Self {
        Distribution {
            count: 0.0,
            sum: 0.0,
            sum_squares: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sketch: Sketch::new(),
            buckets: None,
            quantiles: None,
        }
    }
}

impl Distribution {
    /// Records `value` with `weight`.
    #[inline]
    pub fn insert(&mut self, value: f64, weight: f64) {
        self.count += weight;
        self.sum += value * weight;
        self.sum_squares += value * value * weight;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.sketch.insert(value, weight);
        if let Some(buckets) = &mut self.buckets {
            buckets.insert(value, weight);
        }
    }

    /// An empty distribution that also counts its values into fixed buckets.
    pub fn with_buckets(bounds: Arc<[f64]>) -> Distribution {
        Distribution { buckets: Some(Box::new(FixedBuckets::new(bounds))), ..Distribution::default() }
    }

    /// An empty distribution written as `observer` says.
    pub fn for_observer(observer: Observer) -> Distribution {
        match observer {
            Observer::Histogram(bounds) => Distribution::with_buckets(bounds),
            Observer::Summary(quantiles) => Distribution { quantiles: Some(quantiles), ..Distribution::default() },
        }
    }

    /// Folds `other` into this summary. Fixed buckets add up when both sides have the
    /// same bounds; an empty side takes the other's. Partials that disagree (one counted
    /// buckets and the other did not, or with other bounds: a mapping reload that reached
    /// some hosts first) leave the result without buckets: its count, sum and sketch stay
    /// exact, and the ingester writes it from the sketch. Returns whether buckets were
    /// dropped: this side's, or `other`'s not taken in.
    pub fn merge(&mut self, other: &Distribution) -> bool {
        let (keep, dropped) = match (&mut self.buckets, &other.buckets) {
            (Some(buckets), Some(more)) => (buckets.merge(more), false),
            (Some(_), None) => (other.count == 0.0, false),
            (None, Some(more)) => {
                if self.count == 0.0 {
                    self.buckets = Some(more.clone());
                    (true, false)
                } else {
                    (true, other.count > 0.0)
                }
            }
            (None, None) => (true, false),
        };
        if !keep {
            self.buckets = None;
        }
        // Quantiles are only what to read from the sketch: any side's will do.
        if self.quantiles.is_none() {
            self.quantiles.clone_from(&other.quantiles);
        }
        self.count += other.count;
        self.sum += other.sum;
        self.sum_squares += other.sum_squares;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sketch.merge(&other.sketch);
        dropped || !keep
    }

    fn clear(&mut self) {
        self.count = 0.0;
        self.sum = 0.0;
        self.sum_squares = 0.0;
        self.min = f64::INFINITY;
        self.max = f64::NEG_INFINITY;
        self.sketch.clear();
        if let Some(buckets) = &mut self.buckets {
            buckets.clear();
        }
    }
}

/// One series' aggregate over a window.
#[derive(Debug, Clone, PartialEq)]
pub enum Aggregate {
    /// Sum of `value / sample_rate`.
    Counter(f64),
    /// Last value and the deltas after it (boxed: most series are counters).
    Gauge(Box<Gauge>),
    /// Timer, histogram or distribution summary (boxed: it is large).
    Distribution(Box<Distribution>),
    /// Distinct members.
    Set(Box<HyperLogLog>),
}

/// Why an aggregate could not be merged or decoded.
#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    /// Two aggregates of different kinds.
    #[error("cannot merge a {incoming} into a {existing}")]
    KindMismatch {
        /// What the series holds.
        existing: &'static str,
        /// What came in.
        incoming: &'static str,
    },
    /// The wire aggregate has no value.
    #[error("aggregate without a value")]
    Empty,
    /// The wire metric type is unknown.
    #[error("unknown metric type {0}")]
    UnknownType(i32),
    /// A value that must be finite is not.
    #[error("non-finite {field} in a {kind} aggregate")]
    NonFinite {
        /// Which field.
        field: &'static str,
        /// Aggregate kind.
        kind: &'static str,
    },
    /// The sketch is invalid.
    #[error("invalid sketch")]
    Sketch(#[from] SketchError),
    /// The set is invalid.
    #[error("invalid set")]
    Set(#[from] HllError),
    /// The fixed buckets are invalid.
    #[error("invalid histogram buckets")]
    Buckets(#[from] BucketsError),
    /// A summary quantile is outside 0..=1.
    #[error("a summary quantile is outside 0..=1")]
    Quantile,
    /// A gauge's deltas end before they start.
    #[error("gauge deltas end before they start")]
    BadDeltaRange,
    /// A distribution's sum of squares is below zero.
    #[error("negative sum of squares {0} in a distribution aggregate")]
    NegativeSumSquares(f64),
}

impl Aggregate {
    /// An empty aggregate for `kind`.
    pub fn new(kind: MetricKind) -> Aggregate {
        match kind {
            MetricKind::Counter => Aggregate::Counter(0.0),
            MetricKind::Gauge => Aggregate::Gauge(Box::default()),
            MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution => {
                Aggregate::Distribution(Box::default())
            }
            MetricKind::Set => Aggregate::Set(Box::new(HyperLogLog::new())),
        }
    }

    /// Folds one parsed line into the aggregate. `stamp_ns` (unix
    /// nanoseconds, when the line was received) orders gauge lines; a gauge
    /// set with a `|T` timestamp is ordered by it instead. The line's kind
    /// must match. `reading` says how signed gauge values and `|ms` values are read.
    #[inline]
    pub fn observe(&mut self, line: &Line<'_>, stamp_ns: i64, reading: Reading) {
        match self {
            Aggregate::Counter(sum) => {
                let rate = line.sample_rate;
                if !line.packed {
                    *sum += line.first.value / rate;
                } else {
                    for value in line.values() {
                        *sum += value.value / rate;
                    }
                }
            }
            Aggregate::Gauge(gauge) => {
                let set_stamp_ns =
                    line.timestamp.map_or(stamp_ns, |seconds| (seconds as i64).saturating_mul(1_000_000_000));
                for value in line.values() {
                    if value.signed && reading.gauge_deltas == GaugeDeltas::Statsd {
                        gauge.add_delta(value.value, stamp_ns);
                    } else {
                        gauge.set(value.value, set_stamp_ns);
                    }
                }
            }
            Aggregate::Distribution(summary) => {
                let weight = 1.0 / line.sample_rate;
                for value in line.values() {
                    summary.insert(reading.timer_unit.convert(line.kind, value.value), weight);
                }
            }
            Aggregate::Set(set) => set.insert(line.set_member()),
        }
    }

    /// Folds one plain value (unsigned, sample rate 1, no timestamp): what
    /// [`Aggregate::observe`] does with a line [`parse_simple`](crate::parse::parse_simple)
    /// recognised, which is never a set.
    #[inline]
    pub fn observe_value(&mut self, value: f64, stamp_ns: i64) {
        match self {
            Aggregate::Counter(sum) => *sum += value,
            Aggregate::Gauge(gauge) => gauge.set(value, stamp_ns),
            Aggregate::Distribution(summary) => summary.insert(value, 1.0),
            Aggregate::Set(_) => debug_assert!(false, "a set member is not a plain value"),
        }
    }

    /// Folds `other` into this aggregate. Only gauges can be
    /// [`MergeOrder::Ambiguous`] (see [`Gauge::merge`]), only distributions
    /// [`MergeOrder::BucketsDropped`] (see [`Distribution::merge`]).
    pub fn merge(&mut self, other: &Aggregate) -> Result<MergeOrder, AggregateError> {
        match (self, other) {
            (Aggregate::Counter(sum), Aggregate::Counter(more)) => *sum += more,
            (Aggregate::Gauge(gauge), Aggregate::Gauge(other)) => return Ok(gauge.merge(other)),
            (Aggregate::Distribution(summary), Aggregate::Distribution(more)) => {
                if summary.merge(more) {
                    return Ok(MergeOrder::BucketsDropped);
                }
            }
            (Aggregate::Set(set), Aggregate::Set(more)) => set.merge(more),
            (existing, incoming) => {
                return Err(AggregateError::KindMismatch {
                    existing: existing.kind_name(),
                    incoming: incoming.kind_name(),
                });
            }
        }
        Ok(MergeOrder::Exact)
    }

    /// Empties the aggregate, keeping its allocations for reuse.
    pub fn reset(&mut self) {
        match self {
            Aggregate::Counter(sum) => *sum = 0.0,
            Aggregate::Gauge(gauge) => gauge.clear(),
            Aggregate::Distribution(summary) => summary.clear(),
            Aggregate::Set(set) => set.clear(),
        }
    }

    /// A label for the aggregate's family.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Aggregate::Counter(_) => "counter",
            Aggregate::Gauge(_) => "gauge",
            Aggregate::Distribution(_) => "distribution",
            Aggregate::Set(_) => "set",
        }
    }

    /// The counter's sum, if this is a counter.
    pub fn counter(&self) -> Option<f64> {
        match self {
            Aggregate::Counter(sum) => Some(*sum),
            _ => None,
        }
    }

    /// Bytes held on the heap (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Aggregate::Counter(_) => 0,
            Aggregate::Gauge(gauge) => std::mem::size_of::<Gauge>() + std::mem::size_of_val(gauge.runs()),
            Aggregate::Distribution(summary) => {
                std::mem::size_of::<Distribution>()
                    + summary.sketch.heap_bytes()
                    + summary
                        .buckets
                        .as_ref()
                        .map_or(0, |buckets| std::mem::size_of::<FixedBuckets>() + buckets.heap_bytes())
            }
            Aggregate::Set(set) => std::mem::size_of::<HyperLogLog>() + set.heap_bytes(),
        }
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::Aggregate {
        use proto::aggregate::Value;
        let value = match self {
            Aggregate::Counter(sum) => Value::Counter(*sum),
            Aggregate::Gauge(gauge) => Value::Gauge(gauge_to_proto(gauge)),
            Aggregate::Distribution(summary) => Value::Distribution(proto::Distribution {
                count: summary.count,
                sum: summary.sum,
                sum_squares: summary.sum_squares,
                min: summary.min,
                max: summary.max,
                sketch: Some(summary.sketch.to_proto()),
                bucket_bounds: summary.buckets.as_ref().map(|buckets| buckets.bounds().to_vec()).unwrap_or_default(),
                bucket_counts: summary.buckets.as_ref().map(|buckets| buckets.counts().to_vec()).unwrap_or_default(),
                quantiles: summary.quantiles.as_deref().map(<[f64]>::to_vec).unwrap_or_default(),
            }),
            Aggregate::Set(set) => Value::Set(set.to_proto()),
        };
        proto::Aggregate { value: Some(value) }
    }

    /// Decodes and validates a wire aggregate.
    pub fn from_proto(aggregate: &proto::Aggregate) -> Result<Aggregate, AggregateError> {
        use proto::aggregate::Value;
        let value = aggregate.value.as_ref().ok_or(AggregateError::Empty)?;
        Ok(match value {
            Value::Counter(sum) => {
                finite(*sum, "sum", "counter")?;
                Aggregate::Counter(*sum)
            }
            Value::Gauge(gauge) => Aggregate::Gauge(Box::new(gauge_from_proto(gauge)?)),
            Value::Distribution(summary) => {
                finite(summary.count, "count", "distribution")?;
                finite(summary.sum, "sum", "distribution")?;
                finite(summary.sum_squares, "sum_squares", "distribution")?;
                if summary.sum_squares < 0.0 {
                    return Err(AggregateError::NegativeSumSquares(summary.sum_squares));
                }
                let sketch = match &summary.sketch {
                    Some(sketch) => Sketch::from_proto(sketch)?,
                    None => Sketch::new(),
                };
                let buckets = match summary.bucket_bounds.is_empty() && summary.bucket_counts.is_empty() {
                    true => None,
                    false => Some(Box::new(FixedBuckets::from_parts(&summary.bucket_bounds, &summary.bucket_counts)?)),
                };
                if summary.quantiles.iter().any(|quantile| !(0.0..=1.0).contains(quantile)) {
                    return Err(AggregateError::Quantile);
                }
                let quantiles = (!summary.quantiles.is_empty()).then(|| Arc::from(summary.quantiles.as_slice()));
                Aggregate::Distribution(Box::new(Distribution {
                    count: summary.count,
                    sum: summary.sum,
                    sum_squares: summary.sum_squares,
                    min: summary.min,
                    max: summary.max,
                    sketch,
                    buckets,
                    quantiles,
                }))
            }
            Value::Set(set) => Aggregate::Set(Box::new(HyperLogLog::from_proto(set)?)),
        })
    }
}

/// The wire type of a kind.
pub fn kind_to_proto(kind: MetricKind) -> proto::MetricType {
    match kind {
        MetricKind::Counter => proto::MetricType::Counter,
        MetricKind::Gauge => proto::MetricType::Gauge,
        MetricKind::Timer => proto::MetricType::Timer,
        MetricKind::Histogram => proto::MetricType::Histogram,
        MetricKind::Distribution => proto::MetricType::Distribution,
        MetricKind::Set => proto::MetricType::Set,
    }
}

/// The kind of a wire type.
pub fn kind_from_proto(metric_type: i32) -> Result<MetricKind, AggregateError> {
    match proto::MetricType::try_from(metric_type) {
        Ok(proto::MetricType::Counter) => Ok(MetricKind::Counter),
        Ok(proto::MetricType::Gauge) => Ok(MetricKind::Gauge),
        Ok(proto::MetricType::Timer) => Ok(MetricKind::Timer),
        Ok(proto::MetricType::Histogram) => Ok(MetricKind::Histogram),
        Ok(proto::MetricType::Distribution) => Ok(MetricKind::Distribution),
        Ok(proto::MetricType::Set) => Ok(MetricKind::Set),
        _ => Err(AggregateError::UnknownType(metric_type)),
    }
}

/// The wire form of a gauge: its set and its deltas joined into one run
/// (a window's partial; see [`Gauge::join_runs`]).
fn gauge_to_proto(gauge: &Gauge) -> proto::Gauge {
    let joined = gauge.joined_run();
    let run = joined.unwrap_or(DeltaRun { first_ns: 0, last_ns: 0, sum: 0.0 });
    proto::Gauge {
        has_value: gauge.has_value,
        value: gauge.value,
        timestamp_ns: gauge.timestamp_ns,
        delta: run.sum,
        has_delta: joined.is_some(),
        delta_first_ns: run.first_ns,
        delta_last_ns: run.last_ns,
    }
}

fn gauge_from_proto(wire: &proto::Gauge) -> Result<Gauge, AggregateError> {
    finite(wire.value, "value", "gauge")?;
    finite(wire.delta, "delta", "gauge")?;
    let mut gauge = if wire.has_value { Gauge::with_value(wire.value, wire.timestamp_ns) } else { Gauge::default() };
    if wire.has_delta {
        if wire.delta_first_ns > wire.delta_last_ns {
            return Err(AggregateError::BadDeltaRange);
        }
        let first_ns = if wire.has_value { wire.delta_first_ns.max(wire.timestamp_ns) } else { wire.delta_first_ns };
        gauge.set_run(Some(DeltaRun { first_ns, last_ns: wire.delta_last_ns.max(first_ns), sum: wire.delta }));
    }
    Ok(gauge)
}

fn finite(value: f64, field: &'static str, kind: &'static str) -> Result<(), AggregateError> {
    if value.is_finite() { Ok(()) } else { Err(AggregateError::NonFinite { field, kind }) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Parsed, parse_line};

    fn observe_all(kind: MetricKind, lines: &[&[u8]], reading: Reading) -> Aggregate {
        let mut aggregate = Aggregate::new(kind);
        for (i, text) in lines.iter().enumerate() {
            let Parsed::Metric(line) = parse_line(text) else { panic!("{text:?}") };
            aggregate.observe(&line, i as i64, reading);
        }
        aggregate
    }

    #[test]
    fn counters_sum_value_over_sample_rate() {
        let sum = observe_all(MetricKind::Counter, &[b"a:1|c|@0.1", b"a:2:3|c", b"a:-1|c|@0.5"], Reading::default());
        assert_eq!(sum, Aggregate::Counter(10.0 + 5.0 - 2.0));
    }

    #[test]
    fn gauges_follow_statsd_delta_semantics_or_absolute_values() {
        let statsd = observe_all(MetricKind::Gauge, &[b"g:10|g", b"g:+5|g", b"g:-3|g"], Reading::default());
        let Aggregate::Gauge(gauge) = statsd else { panic!() };
        assert_eq!(gauge.resolve(None), Some(12.0));

        let absolute = observe_all(
            MetricKind::Gauge,
            &[b"g:10|g", b"g:+5|g", b"g:-3|g"],
            Reading { gauge_deltas: GaugeDeltas::Absolute, ..Reading::default() },
        );
        let Aggregate::Gauge(gauge) = absolute else { panic!() };
        assert_eq!(gauge.resolve(None), Some(-3.0));

        let deltas_only = observe_all(MetricKind::Gauge, &[b"g:+5|g", b"g:-1|g"], Reading::default());
        let Aggregate::Gauge(gauge) = deltas_only else { panic!() };
        assert_eq!(gauge.resolve(Some(100.0)), Some(104.0));
    }

    #[test]
    fn gauge_merge_keeps_the_later_timestamp() {
        let early = Gauge::with_value(1.0, 1000);
        let late = Gauge::with_value(2.0, 2000);
        let mut a = early.clone();
        assert_eq!(a.merge(&late), MergeOrder::Exact);
        let mut b = late;
        assert_eq!(b.merge(&early), MergeOrder::Exact);
        assert_eq!(a.resolve(None), Some(2.0));
        assert_eq!(b.resolve(None), Some(2.0));
        // `|T` timestamps (seconds) order sets regardless of arrival.
        let stamped = observe_all(MetricKind::Gauge, &[b"g:5|g|T2000", b"g:7|g|T1000"], Reading::default());
        assert_eq!(stamped, Aggregate::Gauge(Box::new(Gauge::with_value(5.0, 2_000_000_000_000))));
    }

    #[test]
    fn distributions_keep_weighted_count_sum_min_max() {
        let milliseconds = Reading { timer_unit: TimerUnit::Milliseconds, ..Reading::default() };
        let timer = observe_all(MetricKind::Timer, &[b"t:10|ms|@0.5", b"t:2:30|ms"], milliseconds);
        let Aggregate::Distribution(summary) = &timer else { panic!() };
        assert_eq!((summary.count, summary.sum, summary.min, summary.max), (4.0, 52.0, 2.0, 30.0));
        assert_eq!(summary.sketch.count(), 4.0);
    }

    #[test]
    fn distributions_carry_the_weighted_sum_of_squares_through_merges_and_the_wire() {
        let milliseconds = Reading { timer_unit: TimerUnit::Milliseconds, ..Reading::default() };
        let lines: [&[u8]; 2] = [b"t:10|ms|@0.5", b"t:2:30|ms"];
        let timer = observe_all(MetricKind::Timer, &lines, milliseconds);
        let Aggregate::Distribution(summary) = &timer else { panic!() };
        // 10 counts twice (sample rate 0.5): 2 × 100 + 4 + 900.
        assert_eq!(summary.sum_squares, 1104.0);
        // statsd's `std` from count, sum and the squares: mean 13, variance 276 - 169.
        let mean = summary.sum / summary.count;
        assert_eq!(summary.sum_squares / summary.count - mean * mean, 107.0);
        // Two partials of the same lines merge to the same squares.
        let mut merged = observe_all(MetricKind::Timer, &lines[..1], milliseconds);
        assert_eq!(
            merged.merge(&observe_all(MetricKind::Timer, &lines[1..], milliseconds)).unwrap(),
            MergeOrder::Exact
        );
        let Aggregate::Distribution(merged_summary) = &merged else { panic!() };
        assert_eq!(merged_summary.sum_squares, 1104.0);
        // Across the wire, and refused when it cannot be a sum of squares.
        let wire = timer.to_proto();
        assert_eq!(Aggregate::from_proto(&wire).unwrap(), timer);
        for (bad, error) in [(-1.0, "negative sum of squares -1"), (f64::INFINITY, "non-finite sum_squares")] {
            let mut wire = wire.clone();
            let Some(proto::aggregate::Value::Distribution(distribution)) = &mut wire.value else { panic!() };
            distribution.sum_squares = bad;
            let refused = Aggregate::from_proto(&wire).unwrap_err().to_string();
            assert!(refused.starts_with(error), "{refused}");
        }
    }

    #[test]
    fn timers_are_kept_in_seconds_and_other_observers_as_sent() {
        // statsd_exporter's own example: six timings of 1 200 ms have a `_sum` of 7.2.
        let six = [&b"t:1200|ms"[..]; 6];
        let Aggregate::Distribution(timer) = observe_all(MetricKind::Timer, &six, Reading::default()) else { panic!() };
        assert_eq!((timer.count, timer.min, timer.max), (6.0, 1.2, 1.2));
        assert!((timer.sum - 7.2).abs() < 1e-12, "{}", timer.sum);
        let quantile = timer.sketch.quantile(0.5).unwrap();
        assert!((quantile - 1.2).abs() <= 1.2 * 0.011, "{quantile}");
        for (kind, text) in [(MetricKind::Histogram, &b"h:1200|h"[..]), (MetricKind::Distribution, b"d:1200|d")] {
            let Aggregate::Distribution(kept) = observe_all(kind, &[text], Reading::default()) else { panic!() };
            assert_eq!(kept.sum, 1200.0, "{kind:?}");
        }
        assert_eq!(TimerUnit::Seconds.convert(MetricKind::Timer, 250.0), 0.25);
        assert_eq!(TimerUnit::Milliseconds.convert(MetricKind::Timer, 250.0), 250.0);
    }

    /// Merging the aggregates of `lines` observed `chunk` lines at a time gives the
    /// aggregate of them all observed at once.
    fn assert_merged_chunks_equal_whole(kind: MetricKind, lines: &[Vec<u8>], chunk: usize) {
        let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        let whole = observe_all(kind, &refs, Reading::default());
        let mut merged = Aggregate::new(kind);
        for part in refs.chunks(chunk) {
            assert_eq!(merged.merge(&observe_all(kind, part, Reading::default())).unwrap(), MergeOrder::Exact);
        }
        assert_eq!(merged, whole);
    }

    #[test]
    fn merging_partials_equals_observing_everything() {
        let lines: Vec<Vec<u8>> = (0..300).map(|i| format!("t:{}|d|@0.5", i % 37 + 1).into_bytes()).collect();
        assert_merged_chunks_equal_whole(MetricKind::Distribution, &lines, 7);
        let members: Vec<Vec<u8>> = (0..2000).map(|i| format!("u:user{}|s", i % 1500).into_bytes()).collect();
        assert_merged_chunks_equal_whole(MetricKind::Set, &members, 100);
    }

    #[test]
    fn merging_different_kinds_is_an_error_not_a_panic() {
        let mut counter = Aggregate::new(MetricKind::Counter);
        let err = counter.merge(&Aggregate::new(MetricKind::Gauge)).unwrap_err();
        assert_eq!(err.to_string(), "cannot merge a gauge into a counter");
    }

    #[test]
    fn wire_round_trip_and_validation() {
        for (kind, lines) in [
            (MetricKind::Counter, vec![&b"a:3|c"[..]]),
            (MetricKind::Gauge, vec![b"a:3|g", b"a:+1|g"]),
            (MetricKind::Histogram, vec![b"a:3:4:0.001|h"]),
            (MetricKind::Set, vec![b"a:x|s", b"a:y|s"]),
        ] {
            let aggregate = observe_all(kind, &lines, Reading::default());
            assert_eq!(Aggregate::from_proto(&aggregate.to_proto()).unwrap(), aggregate, "{kind:?}");
            assert_eq!(kind_from_proto(kind_to_proto(kind) as i32).unwrap(), kind);
        }
        let bad = proto::Aggregate { value: Some(proto::aggregate::Value::Counter(f64::NAN)) };
        assert!(matches!(Aggregate::from_proto(&bad), Err(AggregateError::NonFinite { field: "sum", .. })));
        assert!(matches!(Aggregate::from_proto(&proto::Aggregate { value: None }), Err(AggregateError::Empty)));
        assert!(matches!(kind_from_proto(42), Err(AggregateError::UnknownType(42))));
    }
}
