//! A zero-copy statsd / DogStatsD line parser.
//!
//! The grammar of one line:
//!
//! ```text
//! <name>:<value>[:<value>...]|<type>[|@<sample rate>][|#<tag>,<tag>...][|T<unix seconds>][|c:<container id>][|<other>]
//! ```
//!
//! - types `c` (counter), `g` (gauge), `ms` (timer), `h` (histogram),
//!   `d` (distribution), `s` (set);
//! - several values may be packed in one line (`latency:1:2:3|d`); a set's
//!   value is the member itself and is never split;
//! - a gauge value with an explicit sign (`+3`, `-3`) is marked
//!   [`Value::signed`] so that the aggregate can apply statsd's delta
//!   semantics when the listener asks for them;
//! - tags are `key:value` or a bare `key`, separated by commas; spaces around
//!   a tag are ignored, and empty tags are skipped;
//! - the DogStatsD container id (`|c:`) and any other optional field this
//!   parser does not know are skipped, never an error;
//! - events (`_e{...}`) and service checks (`_sc|...`) are recognised and
//!   reported as such, never parsed as metrics;
//! - lines are separated by `\n` (a `\r` before it is dropped); blank lines
//!   are skipped; the last line needs no newline.
//!
//! Parsing borrows from the input and allocates nothing. A bad line is
//! reported as [`Parsed::Rejected`] with a [`RejectReason`] and never affects
//! its neighbours.
//!
//! ```
//! use tessera_core::parse::{parse_datagram, MetricKind, Parsed, RejectReason};
//!
//! let mut got = Vec::new();
//! parse_datagram(b"a:1|c|@0.5\nbad\r\nt:2:3|ms|#env:prod", |parsed| match parsed {
//!     Parsed::Metric(line) => got.push((line.name.to_vec(), line.kind, line.values().count())),
//!     Parsed::Rejected { reason, .. } => assert_eq!(reason, RejectReason::MissingValue),
//!     _ => {}
//! });
//! assert_eq!(got, vec![(b"a".to_vec(), MetricKind::Counter, 1), (b"t".to_vec(), MetricKind::Timer, 2)]);
//! ```

use memchr::memchr;

/// Default maximum length of one line, in bytes.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024;

/// Most tags one line may carry.
pub const MAX_TAGS: usize = 64;

/// The type of a statsd metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetricKind {
    /// `c`: summed.
    Counter,
    /// `g`: last value wins (or deltas applied).
    Gauge,
    /// `ms`: a timer, summarised by a sketch.
    Timer,
    /// `h`: a histogram, summarised like a timer.
    Histogram,
    /// `d`: a DogStatsD distribution, summarised like a timer.
    Distribution,
    /// `s`: distinct members counted.
    Set,
}

impl MetricKind {
    /// Every kind, in a fixed order.
    pub const ALL: [MetricKind; 6] = [
        MetricKind::Counter,
        MetricKind::Gauge,
        MetricKind::Timer,
        MetricKind::Histogram,
        MetricKind::Distribution,
        MetricKind::Set,
    ];

    /// The statsd type code (`c`, `g`, `ms`, `h`, `d`, `s`).
    pub fn code(self) -> &'static str {
        match self {
            MetricKind::Counter => "c",
            MetricKind::Gauge => "g",
            MetricKind::Timer => "ms",
            MetricKind::Histogram => "h",
            MetricKind::Distribution => "d",
            MetricKind::Set => "s",
        }
    }

    /// A stable label for metrics and logs (`counter`, `gauge`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Timer => "timer",
            MetricKind::Histogram => "histogram",
            MetricKind::Distribution => "distribution",
            MetricKind::Set => "set",
        }
    }

    /// Whether values of this kind are summarised by a quantile sketch.
    pub fn is_distribution(self) -> bool {
        matches!(self, MetricKind::Timer | MetricKind::Histogram | MetricKind::Distribution)
    }

    fn from_code(code: &[u8]) -> Option<MetricKind> {
        match code {
            b"c" => Some(MetricKind::Counter),
            b"g" => Some(MetricKind::Gauge),
            b"ms" => Some(MetricKind::Timer),
            b"h" => Some(MetricKind::Histogram),
            b"d" => Some(MetricKind::Distribution),
            b"s" => Some(MetricKind::Set),
            _ => None,
        }
    }
}

/// Why a line was rejected. A closed set, so it can label a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Nothing before the first `:`.
    EmptyName,
    /// No `:` separating name and value.
    MissingValue,
    /// No `|` before the type.
    MissingType,
    /// A value is not a number, or is empty.
    BadValue,
    /// A value is NaN or infinite.
    NonFiniteValue,
    /// The type is not one of `c g ms h d s`.
    UnknownType,
    /// The sample rate is not a number in (0, 1].
    BadSampleRate,
    /// A tag is malformed (empty key).
    BadTags,
    /// More than [`MAX_TAGS`] tags.
    TooManyTags,
    /// The `T` timestamp is not unix seconds.
    BadTimestamp,
    /// The name or a tag is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than the configured maximum.
    LineTooLong,
    /// An event or service check whose header is malformed.
    BadEvent,
}

impl RejectReason {
    /// Every reason, in a fixed order (index with [`RejectReason::index`]).
    pub const ALL: [RejectReason; 13] = [
        RejectReason::EmptyName,
        RejectReason::MissingValue,
        RejectReason::MissingType,
        RejectReason::BadValue,
        RejectReason::NonFiniteValue,
        RejectReason::UnknownType,
        RejectReason::BadSampleRate,
        RejectReason::BadTags,
        RejectReason::TooManyTags,
        RejectReason::BadTimestamp,
        RejectReason::InvalidUtf8,
        RejectReason::LineTooLong,
        RejectReason::BadEvent,
    ];

    /// Position in [`RejectReason::ALL`], for per-reason counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable snake_case label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::EmptyName => "empty_name",
            RejectReason::MissingValue => "missing_value",
            RejectReason::MissingType => "missing_type",
            RejectReason::BadValue => "bad_value",
            RejectReason::NonFiniteValue => "non_finite_value",
            RejectReason::UnknownType => "unknown_type",
            RejectReason::BadSampleRate => "bad_sample_rate",
            RejectReason::BadTags => "bad_tags",
            RejectReason::TooManyTags => "too_many_tags",
            RejectReason::BadTimestamp => "bad_timestamp",
            RejectReason::InvalidUtf8 => "invalid_utf8",
            RejectReason::LineTooLong => "line_too_long",
            RejectReason::BadEvent => "bad_event",
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One numeric value of a line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Value {
    /// The value, always finite.
    pub value: f64,
    /// Whether the value was written with an explicit `+` or `-`
    /// (a gauge delta under statsd semantics).
    pub signed: bool,
}

/// A parsed metric line, borrowing from the datagram.
#[derive(Debug, Clone, PartialEq)]
pub struct Line<'a> {
    /// The metric name, non-empty, valid UTF-8.
    pub name: &'a [u8],
    /// The metric type.
    pub kind: MetricKind,
    /// The raw value field (`1`, `1:2:3`, or a set member).
    pub raw_value: &'a [u8],
    /// The first value, parsed (for sets: `0.0`; see [`Line::set_member`]).
    pub first: Value,
    /// Whether more than one value is packed in the line.
    pub packed: bool,
    /// Sample rate in (0, 1]; 1 when absent.
    pub sample_rate: f64,
    /// The raw tag field without its `#` (empty when there are no tags);
    /// already validated, iterate with [`Line::tags`].
    pub tags: &'a [u8],
    /// The DogStatsD timestamp, unix seconds.
    pub timestamp: Option<u64>,
}

impl<'a> Line<'a> {
    /// The values of the line; one unless values were packed. Empty for sets.
    pub fn values(&self) -> Values<'a> {
        if self.kind == MetricKind::Set {
            return Values { first: None, rest: b"" };
        }
        let rest = match memchr(b':', self.raw_value) {
            Some(colon) if self.packed => &self.raw_value[colon + 1..],
            _ => b"",
        };
        Values { first: Some(self.first), rest }
    }

    /// The member of a set line (the whole value field).
    pub fn set_member(&self) -> &'a [u8] {
        self.raw_value
    }

    /// The line's tags, trimmed, empty ones skipped.
    pub fn tags(&self) -> Tags<'a> {
        Tags { rest: self.tags }
    }
}

/// Iterator over the values of a [`Line`].
#[derive(Debug, Clone)]
pub struct Values<'a> {
    first: Option<Value>,
    rest: &'a [u8],
}

impl Iterator for Values<'_> {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        while !self.rest.is_empty() {
            let (field, rest) = split_once(self.rest, b':');
            self.rest = rest;
            // Validated when the line was parsed.
            if let Ok(value) = parse_value(field) {
                return Some(value);
            }
        }
        None
    }
}

/// Iterator over the tags of a [`Line`], each as `key` or `key:value`.
#[derive(Debug, Clone)]
pub struct Tags<'a> {
    rest: &'a [u8],
}

impl<'a> Tags<'a> {
    /// Iterates the tags of a raw, comma-separated tag list.
    pub fn new(raw: &'a [u8]) -> Tags<'a> {
        Tags { rest: raw }
    }
}

impl<'a> Iterator for Tags<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        while !self.rest.is_empty() {
            let (tag, rest) = split_once(self.rest, b',');
            self.rest = rest;
            let tag = tag.trim_ascii();
            if !tag.is_empty() {
                return Some(tag);
            }
        }
        None
    }
}

/// Splits a tag into key and value (empty for a bare key).
pub fn split_tag(tag: &[u8]) -> (&[u8], &[u8]) {
    match find_short(tag, b':') {
        Some(colon) => (&tag[..colon], &tag[colon + 1..]),
        None => (tag, b""),
    }
}

/// What one line of a datagram turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed<'a> {
    /// A metric line.
    Metric(Line<'a>),
    /// A DogStatsD event (`_e{...}`), recognised and not parsed further.
    Event(&'a [u8]),
    /// A DogStatsD service check (`_sc|...`), recognised and not parsed further.
    ServiceCheck(&'a [u8]),
    /// A line that could not be parsed.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The offending line (possibly cut at the maximum length).
        line: &'a [u8],
    },
}

/// Parser settings.
#[derive(Debug, Clone, Copy)]
pub struct ParseOptions {
    /// Lines longer than this are rejected with [`RejectReason::LineTooLong`].
    pub max_line_bytes: usize,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions { max_line_bytes: DEFAULT_MAX_LINE_BYTES }
    }
}

/// Parses every line of `datagram` with default options, calling `each` per
/// non-blank line.
pub fn parse_datagram<'a>(datagram: &'a [u8], each: impl FnMut(Parsed<'a>)) {
    parse_datagram_with(datagram, ParseOptions::default(), each)
}

/// Parses every line of `datagram`, calling `each` per non-blank line.
pub fn parse_datagram_with<'a>(datagram: &'a [u8], options: ParseOptions, mut each: impl FnMut(Parsed<'a>)) {
    for_each_line(datagram, |line| each(parse_line_with(line, options)));
}

/// Calls `each` with every non-blank line of `datagram`, without its
/// newline (`\n`, or `\r\n`).
#[inline]
pub fn for_each_line<'a>(datagram: &'a [u8], mut each: impl FnMut(&'a [u8])) {
    let mut rest = datagram;
    while !rest.is_empty() {
        let (line, after) = split_line(rest);
        rest = after;
        if !line.is_empty() {
            each(line);
        }
    }
}

/// Splits the first line off `bytes`: the line without its newline (`\n`
/// or `\r\n`; possibly blank), and the bytes after it.
#[inline]
pub fn split_line(bytes: &[u8]) -> (&[u8], &[u8]) {
    let (line, after) = match find_newline(bytes) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &b""[..]),
    };
    (line.strip_suffix(b"\r").unwrap_or(line), after)
}

/// The most common statsd line, `<name>:<value>|<type>[|#<tags>]`,
/// recognised by [`parse_simple`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimpleLine<'a> {
    /// The metric name: non-empty, ASCII.
    pub name: &'a [u8],
    /// The type; never [`MetricKind::Set`].
    pub kind: MetricKind,
    /// The value: unsigned, finite.
    pub value: f64,
    /// The tags, already in canonical order (see [`crate::series`]), or empty.
    pub tags: &'a [u8],
}

/// Recognises, in one pass, the shape most statsd traffic has:
/// `<ASCII name>:<digits>[.<digits>]|<c|g|ms|h|d>`, optionally followed by
/// `|#<tags>` when the tags are printable ASCII and already canonical
/// (sorted by key then value, no duplicates, no blanks: what a client that
/// sorts its tags sends), and nothing else: no sample rate, timestamp or
/// packed values, at most 15 digits.
///
/// Returns `None` for every other line; the caller then parses it with
/// [`parse_line_with`], which reads any line this accepts the same way (a
/// `Line` with that name, kind, first value and tags, unsigned, sample
/// rate 1, no timestamp; property tests and the parse fuzz target check
/// it). It does not check the line length bound: the caller does.
///
/// ```
/// use tessera_core::parse::{parse_simple, MetricKind};
///
/// let line = parse_simple(b"api.requests:12.5|ms|#env:prod,zone:a").unwrap();
/// assert_eq!((line.name, line.kind, line.value), (&b"api.requests"[..], MetricKind::Timer, 12.5));
/// assert_eq!(line.tags, b"env:prod,zone:a");
/// assert!(parse_simple(b"api.requests:1|c|#zone:a,env:prod").is_none(), "unsorted tags take the full parser");
/// ```
#[inline]
pub fn parse_simple(line: &[u8]) -> Option<SimpleLine<'_>> {
    parse_simple_at(line).and_then(|(simple, end)| (end == line.len()).then_some(simple))
}

/// [`parse_simple`] at the start of a datagram's remaining bytes, without
/// finding the line's end first: returns the line and the bytes it used,
/// its newline (`\n` or `\r\n`) included, or `None` when the first line
/// is not of the simple shape or is longer than `max_line_bytes` (the
/// caller then splits the line off and takes the full parser).
///
/// ```
/// use tessera_core::parse::{parse_simple_prefix, MetricKind};
///
/// let datagram = b"a.b:1|c\nx:2|ms";
/// let (line, used) = parse_simple_prefix(datagram, 1024).unwrap();
/// assert_eq!((line.name, line.kind, used), (&b"a.b"[..], MetricKind::Counter, 8));
/// let (line, used) = parse_simple_prefix(&datagram[used..], 1024).unwrap();
/// assert_eq!((line.name, line.kind, used), (&b"x"[..], MetricKind::Timer, 6));
/// ```
#[inline]
pub fn parse_simple_prefix(bytes: &[u8], max_line_bytes: usize) -> Option<(SimpleLine<'_>, usize)> {
    let (simple, end) = parse_simple_at(bytes)?;
    let used = match &bytes[end..] {
        [] => end,
        [b'\n', ..] => end + 1,
        [b'\r'] => end + 1,
        [b'\r', b'\n', ..] => end + 2,
        _ => return None,
    };
    if end > max_line_bytes {
        return None;
    }
    Some((simple, used))
}

/// The simple line at the start of `bytes` and where its content ends.
#[inline(always)]
fn parse_simple_at(bytes: &[u8]) -> Option<(SimpleLine<'_>, usize)> {
    // `_e{..}` events would otherwise pass for metrics; `_sc|` has no `:` first.
    if bytes.first() == Some(&b'_') {
        return None;
    }
    let colon = scan_simple_name(bytes)?;
    if colon == 0 {
        return None;
    }
    let Decimal { mantissa, digits, fraction_digits, end: at } = scan_decimal(bytes, colon + 1);
    if digits == 0 || digits > 15 || bytes.get(at) != Some(&b'|') {
        return None;
    }
    let (kind, code_len) = match bytes.get(at + 1) {
        Some(b'c') => (MetricKind::Counter, 1),
        Some(b'g') => (MetricKind::Gauge, 1),
        Some(b'm') if bytes.get(at + 2) == Some(&b's') => (MetricKind::Timer, 2),
        Some(b'h') => (MetricKind::Histogram, 1),
        Some(b'd') => (MetricKind::Distribution, 1),
        _ => return None,
    };
    let mut end = at + 1 + code_len;
    let mut tags: &[u8] = b"";
    if bytes.get(end) == Some(&b'|') {
        if bytes.get(end + 1) != Some(&b'#') {
            return None;
        }
        let tags_len = canonical_tags_len(&bytes[end + 2..])?;
        tags = &bytes[end + 2..end + 2 + tags_len];
        end += 2 + tags_len;
    }
    // The same exact computation as `parse_f64`'s fast path.
    let value = mantissa as f64 / POW10[fraction_digits];
    Some((SimpleLine { name: &bytes[..colon], kind, value, tags }, end))
}

/// Length of the tag list at the start of `bytes` (up to a `\r`, `\n` or
/// the end) if it is non-empty, printable ASCII without `|`, and in
/// canonical form: every tag non-empty with a non-empty key, tags strictly
/// increasing by key, a bare key before `key:value`, then value — the
/// order [`SeriesKey`](crate::series::SeriesKey) sorts them in, with
/// duplicates gone — and at most [`MAX_TAGS`] of them.
#[inline(never)]
pub(crate) fn canonical_tags_len(bytes: &[u8]) -> Option<usize> {
    let mut previous: Option<(&[u8], &[u8], bool)> = None;
    let mut count = 0;
    let mut start = 0;
    let mut key_end = None;
    let mut at = 0;
    loop {
        let byte = bytes.get(at).copied();
        match byte {
            Some(b',') | Some(b'\r' | b'\n') | None => {
                if at == start {
                    return None;
                }
                let tag = &bytes[start..at];
                let (key, value, has_value) = match key_end {
                    Some(colon) => (&bytes[start..colon], &bytes[colon + 1..at], true),
                    None => (tag, &b""[..], false),
                };
                if key.is_empty() {
                    return None;
                }
                if let Some(before) = previous {
                    let order = before.0.cmp(key).then(before.2.cmp(&has_value)).then_with(|| before.1.cmp(value));
                    if order != std::cmp::Ordering::Less {
                        return None;
                    }
                }
                previous = Some((key, value, has_value));
                count += 1;
                if count > MAX_TAGS {
                    return None;
                }
                if byte != Some(b',') {
                    return Some(at);
                }
                start = at + 1;
                key_end = None;
            }
            Some(b':') => {
                if key_end.is_none() {
                    key_end = Some(at);
                }
            }
            Some(b'|') => return None,
            Some(other) if !other.is_ascii_graphic() => return None,
            Some(_) => {}
        }
        at += 1;
    }
}

/// Parses one line (without its newline) with default options.
pub fn parse_line(line: &[u8]) -> Parsed<'_> {
    parse_line_with(line, ParseOptions::default())
}

/// Parses one line (without its newline).
pub fn parse_line_with(line: &[u8], options: ParseOptions) -> Parsed<'_> {
    if line.len() > options.max_line_bytes {
        return Parsed::Rejected { reason: RejectReason::LineTooLong, line: &line[..options.max_line_bytes] };
    }
    if line.starts_with(b"_e{") {
        return event_or_reject(line, Parsed::Event(line));
    }
    if line.starts_with(b"_sc|") {
        return event_or_reject(line, Parsed::ServiceCheck(line));
    }
    match parse_metric(line) {
        Ok(metric) => Parsed::Metric(metric),
        Err(reason) => Parsed::Rejected { reason, line },
    }
}

/// An event needs `_e{<title len>,<text len>}:`; a service check `_sc|name|status`.
/// Where a metric name ends.
enum NameEnd {
    /// At the `:` at `at`; `non_ascii` when a byte before it is not ASCII.
    Colon { at: usize, non_ascii: bool },
    /// A `|` came before any `:`.
    Pipe,
    /// Neither byte occurs.
    None,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in the lowest byte of `word` that is zero (bytes above the
/// first zero byte may also be marked; only the lowest mark is exact).
#[inline]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// Finds the first `:` or `|` of a line, SWAR style.
#[inline]
fn scan_name(line: &[u8]) -> NameEnd {
    let mut high = 0u64;
    let mut chunks = line.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        let marks = zero_bytes(word ^ (ONES * u64::from(b':'))) | zero_bytes(word ^ (ONES * u64::from(b'|')));
        if marks != 0 {
            let byte = (marks.trailing_zeros() / 8) as usize;
            let before = if byte == 0 { 0 } else { u64::MAX >> (64 - 8 * byte) };
            high |= word & HIGHS & before;
            return name_end(line, offset + byte, high != 0);
        }
        high |= word & HIGHS;
        offset += 8;
    }
    for (index, &byte) in chunks.remainder().iter().enumerate() {
        if byte == b':' || byte == b'|' {
            return name_end(line, offset + index, high != 0);
        }
        high |= u64::from(byte & 0x80);
    }
    NameEnd::None
}

/// Position of the first `:` of `bytes` if no `|`, `\n` or non-ASCII byte
/// comes before it, eight bytes at a time.
#[inline(always)]
fn scan_simple_name(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        let marks = zero_bytes(word ^ (ONES * u64::from(b':')))
            | zero_bytes(word ^ (ONES * u64::from(b'|')))
            | zero_bytes(word ^ (ONES * u64::from(b'\n')))
            | (word & HIGHS);
        if marks != 0 {
            let at = offset + (marks.trailing_zeros() / 8) as usize;
            return (bytes[at] == b':').then_some(at);
        }
        offset += 8;
    }
    for (index, &byte) in chunks.remainder().iter().enumerate() {
        match byte {
            b':' => return Some(offset + index),
            b'|' | b'\n' | 0x80..=0xff => return None,
            _ => {}
        }
    }
    None
}

/// Position of the first `\n`, eight bytes at a time: statsd lines are
/// short, so this beats `memchr`'s set-up for every line.
#[inline]
fn find_newline(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        let marks = zero_bytes(word ^ (ONES * u64::from(b'\n')));
        if marks != 0 {
            return Some(offset + (marks.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    find_short(chunks.remainder(), b'\n').map(|at| offset + at)
}

#[inline]
fn name_end(line: &[u8], at: usize, non_ascii: bool) -> NameEnd {
    if line[at] == b'|' { NameEnd::Pipe } else { NameEnd::Colon { at, non_ascii } }
}

/// Reads the type code and returns the fields after it.
#[inline]
fn parse_type(after_pipe: &[u8]) -> Result<(MetricKind, &[u8]), RejectReason> {
    // Fast path for one-letter codes followed by the end or a `|`.
    let code_len = match after_pipe {
        [_] | [_, b'|', ..] => 1,
        [b'm', b's'] | [b'm', b's', b'|', ..] => 2,
        _ => find_short(after_pipe, b'|').unwrap_or(after_pipe.len()),
    };
    let kind = MetricKind::from_code(&after_pipe[..code_len]).ok_or(RejectReason::UnknownType)?;
    let fields = after_pipe.get(code_len + 1..).unwrap_or_default();
    Ok((kind, fields))
}

fn event_or_reject<'a>(line: &'a [u8], parsed: Parsed<'a>) -> Parsed<'a> {
    let ok = match parsed {
        Parsed::Event(_) => {
            let header_end = memchr(b'}', line);
            let valid_lengths = header_end.is_some_and(|end| {
                let lengths = &line[3..end];
                let (title, text) = split_once(lengths, b',');
                !title.is_empty()
                    && !text.is_empty()
                    && title.iter().all(u8::is_ascii_digit)
                    && text.iter().all(u8::is_ascii_digit)
            });
            valid_lengths && header_end.is_some_and(|end| line.get(end + 1) == Some(&b':'))
        }
        _ => {
            let mut fields = line[4..].split(|byte| *byte == b'|');
            let name_ok = fields.next().is_some_and(|name| !name.is_empty());
            let status_ok = fields.next().is_some_and(|status| matches!(status, b"0" | b"1" | b"2" | b"3"));
            name_ok && status_ok
        }
    };
    if ok { parsed } else { Parsed::Rejected { reason: RejectReason::BadEvent, line } }
}

fn parse_metric(line: &[u8]) -> Result<Line<'_>, RejectReason> {
    // One pass over the name finds the `:`, and sees a `|` before it (a line
    // without a value) and any non-ASCII byte, eight bytes at a time.
    let (colon, non_ascii) = match scan_name(line) {
        NameEnd::Colon { at, non_ascii } => (at, non_ascii),
        NameEnd::Pipe | NameEnd::None => return Err(RejectReason::MissingValue),
    };
    let name = &line[..colon];
    if name.is_empty() {
        return Err(RejectReason::EmptyName);
    }
    if non_ascii && std::str::from_utf8(name).is_err() {
        return Err(RejectReason::InvalidUtf8);
    }
    let after_name = &line[colon + 1..];
    let pipe = find_short(after_name, b'|').ok_or(RejectReason::MissingType)?;
    let raw_value = &after_name[..pipe];
    let (kind, mut fields) = parse_type(&after_name[pipe + 1..])?;

    let (first, packed) = if kind == MetricKind::Set {
        if raw_value.is_empty() {
            return Err(RejectReason::BadValue);
        }
        (Value { value: 0.0, signed: false }, false)
    } else {
        parse_values(raw_value)?
    };

    let mut line = Line { name, kind, raw_value, first, packed, sample_rate: 1.0, tags: b"", timestamp: None };
    while !fields.is_empty() {
        let (field, rest) = split_once(fields, b'|');
        fields = rest;
        match field.first() {
            Some(b'@') => line.sample_rate = parse_sample_rate(&field[1..])?,
            Some(b'#') => line.tags = validate_tags(&field[1..])?,
            Some(b'T') => line.timestamp = Some(parse_timestamp(&field[1..])?),
            // `c:` container id, `e:` external data and whatever comes next.
            _ => {}
        }
    }
    Ok(line)
}

/// Parses and validates every packed value, returning the first and whether there are more.
fn parse_values(raw: &[u8]) -> Result<(Value, bool), RejectReason> {
    let Some(colon) = find_short(raw, b':') else {
        return Ok((parse_value(raw)?, false));
    };
    let first = parse_value(&raw[..colon])?;
    let mut rest = &raw[colon + 1..];
    if rest.is_empty() {
        return Err(RejectReason::BadValue);
    }
    while !rest.is_empty() {
        let (field, after) = split_once(rest, b':');
        rest = after;
        if field.is_empty() {
            return Err(RejectReason::BadValue);
        }
        parse_value(field)?;
    }
    Ok((first, true))
}

#[inline]
fn parse_value(field: &[u8]) -> Result<Value, RejectReason> {
    let signed = matches!(field.first(), Some(b'+' | b'-'));
    let value = parse_f64(field).ok_or(RejectReason::BadValue)?;
    if !value.is_finite() {
        return Err(RejectReason::NonFiniteValue);
    }
    Ok(Value { value, signed })
}

fn parse_sample_rate(field: &[u8]) -> Result<f64, RejectReason> {
    let rate = parse_f64(field).ok_or(RejectReason::BadSampleRate)?;
    if rate > 0.0 && rate <= 1.0 { Ok(rate) } else { Err(RejectReason::BadSampleRate) }
}

fn parse_timestamp(field: &[u8]) -> Result<u64, RejectReason> {
    if field.is_empty() || field.len() > 19 || !field.iter().all(u8::is_ascii_digit) {
        return Err(RejectReason::BadTimestamp);
    }
    Ok(field.iter().fold(0u64, |acc, digit| acc * 10 + u64::from(digit - b'0')))
}

/// Checks a tag list in one pass: valid UTF-8, no tag whose key is empty
/// (its first non-blank byte is `:`), at most [`MAX_TAGS`] non-blank tags.
fn validate_tags(raw: &[u8]) -> Result<&[u8], RejectReason> {
    if !raw.is_ascii() && std::str::from_utf8(raw).is_err() {
        return Err(RejectReason::InvalidUtf8);
    }
    let mut count = 0;
    let mut in_tag = false;
    for &byte in raw {
        match byte {
            b',' => {
                count += usize::from(in_tag);
                in_tag = false;
            }
            byte if byte.is_ascii_whitespace() => {}
            b':' if !in_tag => return Err(RejectReason::BadTags),
            _ => in_tag = true,
        }
    }
    count += usize::from(in_tag);
    if count > MAX_TAGS {
        return Err(RejectReason::TooManyTags);
    }
    Ok(raw)
}

/// Position of `byte` in a short slice. A plain loop beats `memchr` on the
/// few bytes of one statsd field (no dispatch, no vector set-up).
#[inline]
fn find_short(bytes: &[u8], byte: u8) -> Option<usize> {
    bytes.iter().position(|candidate| *candidate == byte)
}

#[inline]
fn split_once(bytes: &[u8], separator: u8) -> (&[u8], &[u8]) {
    match find_short(bytes, separator) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, b""),
    }
}

/// Exact powers of ten that f64 represents, for the fast path.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// Parses a decimal number. Plain `[+-]digits[.digits]` with at most 15
/// digits takes an exact fast path (Clinger's: an integer below 2^53
/// divided by an exact power of ten is correctly rounded); everything else
/// (exponents, long mantissas, `inf`, `nan`) goes through the standard
/// library's correctly rounded parser.
#[inline]
pub fn parse_f64(field: &[u8]) -> Option<f64> {
    let (negative, start) = match field.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let Decimal { mantissa, digits, fraction_digits, end } = scan_decimal(field, start);
    if end == field.len() && digits > 0 && digits <= 15 {
        let magnitude = mantissa as f64 / POW10[fraction_digits];
        return Some(if negative { -magnitude } else { magnitude });
    }
    parse_f64_slow(field)
}

/// The plain decimal `digits[.digits]` at the start of `bytes[start..]`.
struct Decimal {
    /// The digits as one integer (wrapped when there are more than 19).
    mantissa: u64,
    /// Digits before and after the point.
    digits: usize,
    /// Digits after the point.
    fraction_digits: usize,
    /// Where the number ends.
    end: usize,
}

#[inline(always)]
fn scan_decimal(bytes: &[u8], start: usize) -> Decimal {
    let mut at = start;
    let mut mantissa: u64 = 0;
    while at < bytes.len() && bytes[at].is_ascii_digit() {
        mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(bytes[at] - b'0'));
        at += 1;
    }
    let integer_digits = at - start;
    let mut fraction_digits = 0;
    if at < bytes.len() && bytes[at] == b'.' {
        at += 1;
        let fraction_start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(bytes[at] - b'0'));
            at += 1;
        }
        fraction_digits = at - fraction_start;
    }
    Decimal { mantissa, digits: integer_digits + fraction_digits, fraction_digits, end: at }
}

#[cold]
fn parse_f64_slow(field: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(field).ok()?;
    // Rust accepts `inf`, `infinity` and `nan` in any case; statsd clients
    // send them by mistake, and the caller rejects them as non-finite.
    text.parse::<f64>().ok()
}

#[cfg(test)]
mod tests;
