//! What the generator sends: the series, their lines, and the datagrams
//! packed from those lines.
//!
//! Series `i` (numbered from 0 across all types) is called
//! `loadgen.<type>.<i>`; its type comes from the [`super::mix::Mix`].
//! Its line at pass `p` is
//!
//! ```text
//! loadgen.<type>.<i>:<value>|<code>[|@<sample rate>][|#k0:v<i>,k1:v<i>,...]
//! ```
//!
//! where the value is 1 for counters, member `i * values_per_series + p`
//! for sets, and a number in `0..1000` derived from the seed, `i` and `p`
//! for gauges, timers, histograms and distributions. Only counters, timers
//! and histograms carry the sample rate. Values repeat every
//! `values_per_series` passes.
//!
//! Each sender owns a contiguous range of `n` series
//! ([`Workload::sender_series`]) and sends their lines in one fixed order
//! ([`super::order`]): its line `k` is at pass `(k / n) % values_per_series`
//! and, in the default sequential order, series `first + k % n`, so every
//! series gets an equal share (in random order too, zipf favours the first
//! series); in every order what arrived can be predicted from the number of
//! lines sent ([`super::expect`]). Lines are packed
//! greedily into datagrams of at most `max_datagram_bytes` (a longer line
//! goes alone).
//!
//! A [`LineSource`] hands a sender its datagrams batch by batch: from a
//! cycle of all its datagrams formatted once when that fits the memory
//! budget, else formatted on the fly into a reused buffer. Both give the
//! same lines in the same datagrams.

use std::ops::Range;
use std::sync::Arc;

use tessera_core::parse::MetricKind;

use super::mix::Mix;
use super::order::{Order, SenderOrder};

/// Series, line format and packing shared by all senders.
#[derive(Debug)]
pub struct Workload {
    kinds: Vec<MetricKind>,
    tags_per_line: u32,
    sample_rate: Option<SampleRate>,
    values_per_series: u32,
    seed: u64,
    max_datagram_bytes: usize,
    series_offset: u64,
    order: Order,
}

#[derive(Debug)]
struct SampleRate {
    value: f64,
    text: String,
}

/// The settings a [`Workload`] is built from.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Distinct series.
    pub series: u64,
    /// Type weights.
    pub mix: Mix,
    /// Tags on each line.
    pub tags_per_line: u32,
    /// Sample rate for counters, timers and histograms, in (0, 1].
    pub sample_rate: Option<f64>,
    /// Distinct values each series cycles through.
    pub values_per_series: u32,
    /// Seed of the gauge, timer and distribution values.
    pub seed: u64,
    /// Largest datagram payload, in bytes.
    pub max_datagram_bytes: usize,
    /// Added to every series number in names and tags: runs with different offsets
    /// send different series (churn).
    pub series_offset: u64,
    /// The order in which each sender visits its series.
    pub order: Order,
}

impl Workload {
    /// Assigns every series its type.
    pub fn new(config: &WorkloadConfig) -> Workload {
        Workload {
            kinds: config.mix.assign(config.series),
            tags_per_line: config.tags_per_line,
            sample_rate: config.sample_rate.map(|value| SampleRate { value, text: value.to_string() }),
            values_per_series: config.values_per_series.max(1),
            seed: config.seed,
            max_datagram_bytes: config.max_datagram_bytes.max(1),
            series_offset: config.series_offset,
            order: config.order,
        }
    }

    /// Number of series.
    pub fn series_count(&self) -> u64 {
        self.kinds.len() as u64
    }

    /// The type of series `series`.
    pub fn kind(&self, series: u64) -> MetricKind {
        self.kinds[index(series)]
    }

    /// The sample rate lines of `kind` carry, 1 when none.
    pub fn sample_rate_of(&self, kind: MetricKind) -> f64 {
        match &self.sample_rate {
            Some(rate) if takes_sample_rate(kind) => rate.value,
            _ => 1.0,
        }
    }

    /// The series range of sender `sender` out of `senders`: contiguous,
    /// sizes differing by at most one.
    pub fn sender_series(&self, sender: usize, senders: usize) -> Range<u64> {
        let total = self.series_count();
        let share = |sender: usize| total * sender as u64 / senders as u64;
        share(sender)..share(sender + 1)
    }

    /// How many of `total_lines` lines the sender owning `series` sends so
    /// that the senders together send exactly the lines one sender would in
    /// sequential order: series `i` gets `total_lines / n` lines plus one when
    /// `i < total_lines % n`. In random order each sender sends as many, but
    /// its last, partial pass reaches other series of its range.
    pub fn sender_total_lines(&self, series: &Range<u64>, total_lines: u64) -> u64 {
        let all = self.series_count();
        let extra = total_lines % all;
        let extra_here = extra.clamp(series.start, series.end) - series.start;
        total_lines / all * (series.end - series.start) + extra_here
    }

    /// The order of the sender owning `series`.
    pub fn sender_order(&self, series: &Range<u64>) -> SenderOrder {
        SenderOrder::new(self.order, self.seed, series, self.values_per_series)
    }

    /// The numeric value of `series` at `pass`: 1 for counters, the member
    /// for sets, else a number in `0..1000`.
    pub fn value(&self, series: u64, pass: u32) -> u64 {
        match self.kind(series) {
            MetricKind::Counter => 1,
            MetricKind::Set => series * u64::from(self.values_per_series) + u64::from(pass),
            _ => mix64(self.seed ^ mix64(series) ^ mix64(u64::from(pass).wrapping_add(0x5851_f42d_4c95_7f2d))) % 1000,
        }
    }

    /// Appends the metric name of `series`.
    pub fn write_name(&self, out: &mut Vec<u8>, series: u64) {
        out.extend_from_slice(b"loadgen.");
        out.extend_from_slice(self.kind(series).as_str().as_bytes());
        out.push(b'.');
        push_decimal(out, series + self.series_offset);
    }

    /// Appends the tags of `series`, comma-separated, without the `|#`.
    pub fn write_tags(&self, out: &mut Vec<u8>, series: u64) {
        for tag in 0..self.tags_per_line {
            if tag > 0 {
                out.push(b',');
            }
            out.push(b'k');
            push_decimal(out, u64::from(tag));
            out.extend_from_slice(b":v");
            push_decimal(out, series + self.series_offset);
        }
    }

    /// Appends the line of `series` at `pass`, ending in `\n`.
    pub fn write_line(&self, out: &mut Vec<u8>, series: u64, pass: u32) {
        let kind = self.kind(series);
        self.write_name(out, series);
        out.push(b':');
        push_decimal(out, self.value(series, pass));
        out.push(b'|');
        out.extend_from_slice(kind.code().as_bytes());
        if let Some(rate) = &self.sample_rate
            && takes_sample_rate(kind)
        {
            out.extend_from_slice(b"|@");
            out.extend_from_slice(rate.text.as_bytes());
        }
        if self.tags_per_line > 0 {
            out.extend_from_slice(b"|#");
            self.write_tags(out, series);
        }
        out.push(b'\n');
    }

    /// Formats lines `first_line..` of the sender owning `series` into
    /// `out`, packed into datagrams, until `max_lines` lines are packed,
    /// `max_datagrams` datagrams are full, or `out` holds more than
    /// `max_bytes` bytes (datagram table included). Returns the number of
    /// lines packed; a datagram is never left open.
    pub fn pack(&self, series: &Range<u64>, first_line: u64, limits: PackLimits, out: &mut Packed) -> u64 {
        let order = self.sender_order(series);
        let first_datagram = out.datagrams.len();
        let mut open = Datagram { start: out.bytes.len(), len: 0, lines: 0 };
        let mut packed = 0;
        while packed < limits.max_lines {
            let (line_series, pass) = order.line(first_line + packed);
            let line_start = out.bytes.len();
            self.write_line(&mut out.bytes, line_series, pass);
            let line_len = out.bytes.len() - line_start;
            // The payload drops the last line's newline.
            let fits = open.len as usize + line_len - 1 <= self.max_datagram_bytes;
            if open.lines > 0 && !fits {
                out.datagrams.push(open);
                if out.datagrams.len() - first_datagram >= limits.max_datagrams {
                    out.bytes.truncate(line_start);
                    return packed;
                }
                open = Datagram { start: line_start, len: 0, lines: 0 };
            }
            open.len += u32::try_from(line_len).expect("a line is shorter than 4 GiB");
            open.lines += 1;
            packed += 1;
            if out.bytes.len() + out.datagrams.len() * size_of::<Datagram>() > limits.max_bytes {
                break;
            }
        }
        if open.lines > 0 {
            out.datagrams.push(open);
        }
        packed
    }
}

/// When [`Workload::pack`] stops.
#[derive(Debug, Clone, Copy)]
pub struct PackLimits {
    /// Lines to pack at most.
    pub max_lines: u64,
    /// Datagrams to fill at most (at least one).
    pub max_datagrams: usize,
    /// Bytes of output at most, checked after each line.
    pub max_bytes: usize,
}

/// One datagram: `len` bytes at `start` of a buffer, `lines` lines, each
/// ending in `\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram {
    /// Offset of its first byte.
    pub start: usize,
    /// Length including every line's newline.
    pub len: u32,
    /// Number of lines.
    pub lines: u32,
}

impl Datagram {
    /// What goes in a UDP or Unix datagram: the lines without the last
    /// newline.
    pub fn payload<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.start..self.end() - 1]
    }

    /// One past its last byte.
    pub fn end(&self) -> usize {
        self.start + self.len as usize
    }

    /// Lines `skip..skip + take` of this datagram as a datagram of its own.
    fn sub(&self, bytes: &[u8], skip: u32, take: u32) -> Datagram {
        let mut line_ends = bytes[self.start..self.end()]
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte == b'\n')
            .map(|(offset, _)| self.start + offset + 1);
        let start = if skip == 0 { self.start } else { line_ends.nth(skip as usize - 1).expect("skip < lines") };
        let end = line_ends.nth(take as usize - 1).expect("skip + take <= lines");
        Datagram { start, len: (end - start) as u32, lines: take }
    }
}

/// Formatted lines and the datagrams they are packed into.
#[derive(Debug, Default)]
pub struct Packed {
    /// The lines, back to back.
    pub bytes: Vec<u8>,
    /// The datagrams, in order, covering `bytes`.
    pub datagrams: Vec<Datagram>,
}

/// Datagrams handed to a transport at once (sent with `sendmmsg`, or written to a stream).
#[derive(Debug, Clone, Copy)]
pub struct Burst<'a> {
    /// The buffer the datagrams point into.
    pub bytes: &'a [u8],
    /// The datagrams, consecutive in `bytes`.
    pub datagrams: &'a [Datagram],
    /// Their lines, in total.
    pub lines: u64,
}

/// Where one sender's datagrams come from.
#[derive(Debug)]
pub enum LineSource {
    /// Every datagram of the sender's cycle, formatted once.
    Cycle {
        /// The whole cycle.
        packed: Packed,
        /// Next datagram to hand out.
        next: usize,
        /// Lines of `packed.datagrams[next]` already handed out.
        lines_done: u32,
        /// The datagrams of the last batch.
        batch: Vec<Datagram>,
    },
    /// Lines formatted batch by batch into a reused buffer.
    Stream {
        /// The series and line format.
        workload: Arc<Workload>,
        /// The sender's series.
        series: Range<u64>,
        /// Position in the cycle.
        next_line: u64,
        /// The last batch.
        packed: Packed,
    },
}

impl LineSource {
    /// The source of the sender owning `series`: its whole cycle when that
    /// takes at most `max_cycle_bytes`, else a stream.
    pub fn new(workload: &Arc<Workload>, series: Range<u64>, max_cycle_bytes: usize) -> LineSource {
        let cycle_lines = cycle_lines(workload, &series);
        let mut packed = Packed::default();
        let limits = PackLimits { max_lines: cycle_lines, max_datagrams: usize::MAX, max_bytes: max_cycle_bytes };
        // The estimate spares formatting most of a cycle that cannot fit;
        // `max_bytes` catches one the estimate let through.
        if estimate_cycle_bytes(workload, &series) <= max_cycle_bytes as f64
            && workload.pack(&series, 0, limits, &mut packed) == cycle_lines
        {
            packed.bytes.shrink_to_fit();
            packed.datagrams.shrink_to_fit();
            return LineSource::Cycle { packed, next: 0, lines_done: 0, batch: Vec::new() };
        }
        LineSource::Stream { workload: Arc::clone(workload), series, next_line: 0, packed: Packed::default() }
    }

    /// Whether the whole cycle was formatted up front.
    pub fn is_precomputed(&self) -> bool {
        matches!(self, LineSource::Cycle { .. })
    }

    /// The next datagrams, at most `max_datagrams` (at least one) and
    /// `max_lines` lines (at least one; the last datagram is cut short to
    /// fit). A batch never wraps around the end of the cycle.
    pub fn next_batch(&mut self, max_datagrams: usize, max_lines: u64) -> Burst<'_> {
        let max_datagrams = max_datagrams.max(1);
        let max_lines = max_lines.max(1);
        match self {
            LineSource::Cycle { packed, next, lines_done, batch } => {
                batch.clear();
                let mut lines = 0;
                while batch.len() < max_datagrams && lines < max_lines && *next < packed.datagrams.len() {
                    let datagram = packed.datagrams[*next];
                    let left = datagram.lines - *lines_done;
                    let take = u32::try_from(u64::from(left).min(max_lines - lines)).expect("at most `left`");
                    if *lines_done == 0 && take == left {
                        batch.push(datagram);
                    } else {
                        batch.push(datagram.sub(&packed.bytes, *lines_done, take));
                    }
                    lines += u64::from(take);
                    if take == left {
                        *next += 1;
                        *lines_done = 0;
                    } else {
                        *lines_done += take;
                    }
                }
                if *next == packed.datagrams.len() {
                    *next = 0;
                }
                Burst { bytes: &packed.bytes, datagrams: batch, lines }
            }
            LineSource::Stream { workload, series, next_line, packed } => {
                packed.bytes.clear();
                packed.datagrams.clear();
                let cycle = cycle_lines(workload, series);
                let max_lines = max_lines.min(cycle - *next_line);
                let limits = PackLimits { max_lines, max_datagrams, max_bytes: usize::MAX };
                let lines = workload.pack(series, *next_line, limits, packed);
                *next_line = (*next_line + lines) % cycle;
                Burst { bytes: &packed.bytes, datagrams: &packed.datagrams, lines }
            }
        }
    }
}

/// About how many bytes the cycle of the sender owning `series` takes,
/// from the lines of up to 1024 of its series spread over the range.
fn estimate_cycle_bytes(workload: &Workload, series: &Range<u64>) -> f64 {
    let series_here = series.end - series.start;
    let samples = series_here.min(1024);
    let mut line = Vec::new();
    for sample in 0..samples {
        workload.write_line(&mut line, series.start + sample * series_here / samples, 0);
    }
    let bytes_per_line = line.len() as f64 / samples as f64;
    let lines_per_datagram = (workload.max_datagram_bytes as f64 / bytes_per_line).max(1.0);
    let per_line = bytes_per_line + size_of::<Datagram>() as f64 / lines_per_datagram;
    per_line * cycle_lines(workload, series) as f64
}

/// Lines in one cycle of the sender owning `series`.
fn cycle_lines(workload: &Workload, series: &Range<u64>) -> u64 {
    (series.end - series.start) * u64::from(workload.values_per_series)
}

fn takes_sample_rate(kind: MetricKind) -> bool {
    matches!(kind, MetricKind::Counter | MetricKind::Timer | MetricKind::Histogram)
}

fn index(series: u64) -> usize {
    usize::try_from(series).expect("series fit in memory")
}

/// Appends `value` in decimal.
fn push_decimal(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// SplitMix64's finaliser: a cheap, well-mixed hash of one word.
pub fn mix64(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}
