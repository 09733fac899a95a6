//! What a receiver should have seen, given how many lines each sender
//! handed to the kernel.
//!
//! Sender `s` owning series `first..first + n` sends its lines in a fixed
//! order ([`super::order`]), so after `L` lines it is known how many lines
//! each series got, the pass of its last line and how many distinct passes
//! its lines had: in sequential order series `first + j` got
//! `L / n + (j < L % n)` lines, in random order the same counts went to the
//! series the last pass's permutation reached first, and in zipf order the
//! sender's draws are replayed ([`super::order::SenderOrder::tallies`]).
//! From that [`expected_totals`] gives, per series that was sent at least
//! once, one statistic a verifier can check:
//!
//! | type | [`Stat`] | expected value |
//! |---|---|---|
//! | counter | `sum` | lines / sample rate (each line counts 1) |
//! | gauge | `last` | the value of the last line sent |
//! | set | `cardinality` | distinct members: the distinct passes, min(lines, values per series) unless zipf |
//! | timer, histogram | `count` | lines / sample rate |
//! | distribution | `count` | lines (distributions carry no sample rate) |
//!
//! Values scaled by a sample rate are floating point, as a receiver's sums
//! are: compare them with a relative tolerance. [`write_tsv`] writes the
//! table for `--expect-out`.
//!
//! ```ignore
//! for expected in expected_totals(&workload, &[lines_sent_by_sender_0]) {
//!     println!("{} {} {}", expected.series, expected.stat.as_str(), expected.value);
//! }
//! ```

use std::io::{self, Write};

use tessera_core::parse::MetricKind;
use tessera_core::series::SeriesKey;

use super::workload::Workload;

/// The statistic a verifier checks for a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    /// A counter's sum.
    Sum,
    /// A gauge's last value.
    Last,
    /// A set's number of distinct members.
    Cardinality,
    /// A timer's, histogram's or distribution's number of samples.
    Count,
}

impl Stat {
    /// The statistic of a series of type `kind`.
    pub fn of(kind: MetricKind) -> Stat {
        match kind {
            MetricKind::Counter => Stat::Sum,
            MetricKind::Gauge => Stat::Last,
            MetricKind::Set => Stat::Cardinality,
            MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution => Stat::Count,
        }
    }

    /// `sum`, `last`, `cardinality` or `count`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stat::Sum => "sum",
            Stat::Last => "last",
            Stat::Cardinality => "cardinality",
            Stat::Count => "count",
        }
    }
}

/// What should have arrived for one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpectedSeries {
    /// The series index (its name is `loadgen.<type>.<series>`).
    pub series: u64,
    /// Its type.
    pub kind: MetricKind,
    /// Lines of it handed to the kernel.
    pub lines: u64,
    /// The statistic to check.
    pub stat: Stat,
    /// Its expected value.
    pub value: f64,
}

/// The expected statistic of every series sent at least once, in series
/// order, when sender `s` (of `lines_by_sender.len()`) handed
/// `lines_by_sender[s]` lines to the kernel.
pub fn expected_totals<'a>(
    workload: &'a Workload,
    lines_by_sender: &'a [u64],
) -> impl Iterator<Item = ExpectedSeries> + 'a {
    let senders = lines_by_sender.len();
    lines_by_sender.iter().enumerate().flat_map(move |(sender, &lines_sent)| {
        let series_range = workload.sender_series(sender, senders);
        let tallies = workload.sender_order(&series_range).tallies(lines_sent);
        series_range.filter_map(move |series| {
            let tally = tallies.get(series);
            if tally.lines == 0 {
                return None;
            }
            let kind = workload.kind(series);
            let value = match Stat::of(kind) {
                Stat::Sum | Stat::Count => tally.lines as f64 / workload.sample_rate_of(kind),
                Stat::Last => workload.value(series, tally.last_pass) as f64,
                Stat::Cardinality => f64::from(tally.passes),
            };
            Some(ExpectedSeries { series, kind, lines: tally.lines, stat: Stat::of(kind), value })
        })
    })
}

/// Writes [`expected_totals`] as tab-separated values with a header:
/// `id` (tessera's canonical series id), `name`, `tags` (as sent), `type`,
/// `lines`, `stat`, `expected`.
pub fn write_tsv(out: &mut impl Write, workload: &Workload, lines_by_sender: &[u64]) -> io::Result<()> {
    writeln!(out, "id\tname\ttags\ttype\tlines\tstat\texpected")?;
    let (mut name, mut tags, mut key) = (Vec::new(), Vec::new(), SeriesKey::default());
    for expected in expected_totals(workload, lines_by_sender) {
        name.clear();
        tags.clear();
        workload.write_name(&mut name, expected.series);
        workload.write_tags(&mut tags, expected.series);
        key.build_from_parts(expected.kind, &name, &tags).expect("loadgen writes at most MAX_TAGS tags");
        out.write_all(key.id())?;
        out.write_all(b"\t")?;
        out.write_all(&name)?;
        out.write_all(b"\t")?;
        out.write_all(&tags)?;
        writeln!(
            out,
            "\t{}\t{}\t{}\t{}",
            expected.kind.as_str(),
            expected.lines,
            expected.stat.as_str(),
            expected.value
        )?;
    }
    Ok(())
}
