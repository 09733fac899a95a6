//! Gauges whose partials merge in the order their lines were sent.
//!
//! A gauge line either **sets** the value (`g:70|g`) or, with the statsd
//! semantic, **changes** it (`g:+5|g`, `g:-2|g`). Sets and deltas do not
//! commute: `70, +5, -2` is 73, `+5, 70, -2` is 68. Whenever the lines of
//! one gauge are split between partials (reader threads of one collector,
//! windows, collectors) the merge must know which came first.
//!
//! Every observation therefore carries an **order stamp**, unix nanoseconds:
//! the kernel's receive time of the datagram (`SO_TIMESTAMPNS`), the read
//! time for stream intake, or the line's own `|T` timestamp for sets that
//! carry one. A [`Gauge`] partial keeps
//!
//! - the last value set and its stamp, and
//! - the deltas after it (all deltas if nothing was set), as a list of
//!   [`DeltaRun`]s sorted by stamp: each run is the sum of deltas whose
//!   stamps lie in `first_ns..=last_ns`, with no line of this partial in
//!   between that is not part of the run.
//!
//! [`Gauge::merge`] keeps the later set, and of the other side's runs those
//! stamped after it. That is exact whenever no run of one side spans the
//! other side's set: a reader's runs are single datagrams (or stamps), so
//! the merge of reader cuts is exact up to [`MAX_DELTA_RUNS`] delta stamps
//! per gauge, reader and window. Past that, neighbouring runs are joined;
//! a later merge that needs to split a joined run, or two sets with the same
//! stamp and different values, is reported as [`MergeOrder::Ambiguous`], and
//! callers count it (`tessera_collector_gauge_order_ambiguous_total`,
//! `tessera_aggregator_gauge_order_ambiguous_total`). The resolution it then
//! takes is documented on [`Gauge::merge`].
//!
//! ```
//! use tessera_core::aggregate::{Gauge, MergeOrder};
//!
//! // One sender: 70, then +5, then -2, read by three different threads.
//! let mut reader_a = Gauge::default();
//! reader_a.set(70.0, 1_000);
//! let mut reader_b = Gauge::default();
//! reader_b.add_delta(5.0, 1_001);
//! let mut reader_c = Gauge::default();
//! reader_c.add_delta(-2.0, 1_002);
//! // Merged in any order, the value is 73.
//! let mut merged = reader_c.clone();
//! assert_eq!(merged.merge(&reader_a), MergeOrder::Exact);
//! assert_eq!(merged.merge(&reader_b), MergeOrder::Exact);
//! assert_eq!(merged.resolve(None), Some(73.0));
//! ```

/// Most delta runs a gauge partial keeps; past that, neighbouring runs are
/// joined (see the [module docs](self)).
pub const MAX_DELTA_RUNS: usize = 16;

/// Deltas of a gauge between two order stamps: their sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaRun {
    /// Stamp of the first delta, unix nanoseconds.
    pub first_ns: i64,
    /// Stamp of the last delta.
    pub last_ns: i64,
    /// Sum of the deltas.
    pub sum: f64,
}

/// Whether a merge knew the order of everything it combined.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOrder {
    /// The result is what applying every line in stamp order gives.
    Exact,
    /// Some deltas could not be placed before or after a set, or two sets
    /// had one stamp; the result is one of the possible orders.
    Ambiguous,
    /// Not a gauge: two partials of a distribution disagreed on their fixed buckets (one
    /// counted buckets and the other did not, or other bounds), so the result has none
    /// ([`Distribution::merge`](crate::aggregate::Distribution::merge)).
    BucketsDropped,
}

impl MergeOrder {
    /// `Ambiguous` if either is.
    pub fn and(self, other: MergeOrder) -> MergeOrder {
        if self == MergeOrder::Ambiguous { self } else { other }
    }
}

/// A gauge partial: the last value set and the deltas after it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Gauge {
    /// Whether a value was set.
    pub has_value: bool,
    /// The value set (without the deltas after it).
    pub value: f64,
    /// Order stamp of the set, unix nanoseconds.
    pub timestamp_ns: i64,
    /// Deltas after the set (all deltas without a set), sorted by stamp.
    runs: Vec<DeltaRun>,
}

impl Gauge {
    /// A gauge set to `value` at `stamp_ns`.
    pub fn with_value(value: f64, stamp_ns: i64) -> Gauge {
        Gauge { has_value: true, value, timestamp_ns: stamp_ns, runs: Vec::new() }
    }

    /// A gauge holding only `delta`, applied at `stamp_ns`.
    pub fn with_delta(delta: f64, stamp_ns: i64) -> Gauge {
        let mut gauge = Gauge::default();
        gauge.add_delta(delta, stamp_ns);
        gauge
    }

    /// Sets the value, unless the current one has a later stamp (a line with
    /// an older `|T` timestamp). Deltas seen before are superseded.
    #[inline]
    pub fn set(&mut self, value: f64, stamp_ns: i64) {
        if !self.has_value || stamp_ns >= self.timestamp_ns {
            self.has_value = true;
            self.value = value;
            self.timestamp_ns = stamp_ns;
            self.runs.clear();
        }
    }

    /// Adds a delta observed after everything this partial holds (lines are
    /// observed in the order one thread received them). A stamp at or
    /// before the last run's joins that run: nothing of this partial lies
    /// between them.
    #[inline]
    pub fn add_delta(&mut self, delta: f64, stamp_ns: i64) {
        let floor = if self.has_value { self.timestamp_ns } else { i64::MIN };
        match self.runs.last_mut() {
            Some(last) if stamp_ns <= last.last_ns => last.sum += delta,
            _ => {
                let stamp_ns = stamp_ns.max(floor);
                self.runs.push(DeltaRun { first_ns: stamp_ns, last_ns: stamp_ns, sum: delta });
                if self.runs.len() > MAX_DELTA_RUNS {
                    join_neighbours(&mut self.runs);
                }
            }
        }
    }

    /// The delta runs after the set (all runs without one), by stamp.
    pub fn runs(&self) -> &[DeltaRun] {
        &self.runs
    }

    /// Sum of the deltas after the set.
    pub fn delta(&self) -> f64 {
        self.runs.iter().map(|run| run.sum).sum()
    }

    /// Every run as one: from the first delta's stamp to the last's, their
    /// sum. What the wire carries of a window's partial.
    pub fn joined_run(&self) -> Option<DeltaRun> {
        let first = self.runs.first()?;
        let last_ns = self.runs.iter().map(|run| run.last_ns).max().unwrap_or(first.last_ns);
        Some(DeltaRun { first_ns: first.first_ns, last_ns, sum: self.delta() })
    }

    /// Joins every run into one ([`Gauge::joined_run`]), as a partial that
    /// has gone over the wire holds them.
    pub fn join_runs(&mut self) {
        if self.runs.len() > 1 {
            let joined = self.joined_run();
            self.set_run(joined);
        }
    }

    /// Replaces the runs with one run (decoding the wire form).
    pub fn set_run(&mut self, run: Option<DeltaRun>) {
        self.runs.clear();
        self.runs.extend(run);
    }

    /// Empties the gauge, keeping its allocation.
    pub fn clear(&mut self) {
        self.has_value = false;
        self.value = 0.0;
        self.timestamp_ns = 0;
        self.runs.clear();
    }

    /// Folds `other` (another partial of the same series, of any time) into
    /// this gauge, by order stamp: the later set wins, and the deltas kept
    /// are those stamped after it.
    ///
    /// When a run spans the winning set's stamp, it is kept if it ends at or
    /// after the set; two sets with one stamp keep the larger value. Both
    /// are reported as [`MergeOrder::Ambiguous`]. The merge is commutative.
    pub fn merge(&mut self, other: &Gauge) -> MergeOrder {
        match (self.has_value, other.has_value) {
            (false, false) => insert_runs(&mut self.runs, &other.runs, None),
            (true, false) => insert_runs(&mut self.runs, &other.runs, Some(self.timestamp_ns)),
            (false, true) => self.adopt_set(other),
            (true, true) => {
                let tie = other.timestamp_ns == self.timestamp_ns;
                let other_wins = other.timestamp_ns > self.timestamp_ns || (tie && other.value > self.value);
                let tie_order =
                    if tie && other.value != self.value { MergeOrder::Ambiguous } else { MergeOrder::Exact };
                let merged = if other_wins {
                    self.adopt_set(other)
                } else {
                    insert_runs(&mut self.runs, &other.runs, Some(self.timestamp_ns))
                };
                tie_order.and(merged)
            }
        }
    }

    /// Takes `other`'s set and runs, keeping this gauge's runs stamped after it.
    fn adopt_set(&mut self, other: &Gauge) -> MergeOrder {
        let mine = std::mem::take(&mut self.runs);
        self.has_value = true;
        self.value = other.value;
        self.timestamp_ns = other.timestamp_ns;
        self.runs.extend_from_slice(&other.runs);
        let order = insert_runs(&mut self.runs, &mine, Some(other.timestamp_ns));
        // Keep the allocation that is larger for next time.
        if mine.capacity() > self.runs.capacity() {
            let mut reuse = mine;
            reuse.clear();
            reuse.extend_from_slice(&self.runs);
            self.runs = reuse;
        }
        order
    }

    /// The gauge's value given the value it had before this partial.
    pub fn resolve(&self, previous: Option<f64>) -> Option<f64> {
        if self.has_value {
            return Some(self.value + self.delta());
        }
        if self.runs.is_empty() {
            return previous;
        }
        Some(previous.unwrap_or(0.0) + self.delta())
    }
}

/// Inserts `incoming` runs into sorted `runs`, skipping those that end
/// before `after_ns` (deltas before a set). A run that spans `after_ns` is
/// kept if it ends at or after it, and the merge is ambiguous.
fn insert_runs(runs: &mut Vec<DeltaRun>, incoming: &[DeltaRun], after_ns: Option<i64>) -> MergeOrder {
    let mut order = MergeOrder::Exact;
    for run in incoming {
        if let Some(set_ns) = after_ns {
            if run.last_ns < set_ns {
                continue;
            }
            if run.first_ns <= set_ns {
                order = MergeOrder::Ambiguous;
            }
        }
        let at = runs.partition_point(|held| held.first_ns <= run.first_ns);
        runs.insert(at, *run);
    }
    while runs.len() > MAX_DELTA_RUNS {
        join_neighbours(runs);
    }
    order
}

/// Halves the number of runs by joining neighbours pairwise.
fn join_neighbours(runs: &mut Vec<DeltaRun>) {
    let mut kept = 0;
    let mut index = 0;
    while index < runs.len() {
        let mut run = runs[index];
        if let Some(next) = runs.get(index + 1) {
            run.last_ns = run.last_ns.max(next.last_ns);
            run.sum += next.sum;
        }
        runs[kept] = run;
        kept += 1;
        index += 2;
    }
    runs.truncate(kept);
}

#[cfg(test)]
mod tests;
