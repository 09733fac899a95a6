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
//! - tags may also be written in the name, as statsd_exporter reads them:
//!   InfluxDB (`api.hits,env=prod:1|c`), Librato (`api.hits#env=prod:1|c`)
//!   and SignalFx (`api.[env=prod]hits:1|c`), each behind a switch of
//!   [`ParseOptions`]; `key=value` there is the tag `key:value`, a malformed
//!   one is skipped and counted ([`Line::name_tag_errors`]), and a line that
//!   mixes them with a `|#` tag field is rejected (see [`name_tags`]);
//! - the DogStatsD container id (`|c:<id>`) is the tag `container_id:<id>`
//!   of the series, as statsd_exporter makes it a `container_id` label; an
//!   empty one is ignored (statsd_exporter drops that line), and one holding
//!   a comma, which separates tags, rejects the line as [`RejectReason::BadTags`];
//! - any other optional field this parser does not know is skipped, never
//!   an error;
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
//!
//! The modules: this one reads whole lines ([`parse_line_with`]); `scan`
//! holds the eight-bytes-at-a-time scans of names and newlines, `simple` the
//! one-pass path for the most common line ([`parse_simple`]), and
//! [`name_tags`] the tags written in names.

use memchr::memchr;

pub mod name_tags;
mod scan;
mod simple;

use name_tags::NameSplit;
pub use name_tags::NameTags;
use scan::{NameEnd, find_newline, scan_name};
pub(crate) use simple::canonical_tags_len;
pub use simple::{SimpleLine, parse_simple, parse_simple_prefix};

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
    /// A tag is malformed (empty key), or a container id holds a comma.
    BadTags,
    /// More than [`MAX_TAGS`] tags (name tags and a container id count).
    TooManyTags,
    /// The `T` timestamp is not unix seconds.
    BadTimestamp,
    /// The name or a tag is not valid UTF-8.
    InvalidUtf8,
    /// The line is longer than the configured maximum.
    LineTooLong,
    /// An event or service check whose header is malformed.
    BadEvent,
    /// Tags written in the name (InfluxDB, Librato, SignalFx) and a
    /// DogStatsD `|#` tag field on one line (statsd_exporter's
    /// `mixed_tagging_styles`).
    MixedTagStyles,
}

impl RejectReason {
    /// Every reason, in a fixed order (index with [`RejectReason::index`]).
    pub const ALL: [RejectReason; 14] = [
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
        RejectReason::MixedTagStyles,
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
            RejectReason::MixedTagStyles => "mixed_tag_styles",
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
    /// The metric name, non-empty, valid UTF-8, with the tags written in it
    /// cut out. When SignalFx tags sat inside it (`api.[env=prod]hits`),
    /// this is the part before them (`api.`) and [`Line::name_rest`] the
    /// part after them (`hits`): the name is the two joined.
    pub name: &'a [u8],
    /// The tags written in the name, as written, from the byte that opens
    /// them: `,env=prod` (InfluxDB), `#env=prod` (Librato), `[env=prod]`
    /// or `[env=prod]hits` (SignalFx: the tags, and the rest of the name
    /// when they sat inside it). Empty when there are none. Read it with
    /// [`Line::name_tags`] and [`Line::name_rest`]; one field rather than
    /// two keeps the line small, which the hot path feels.
    pub name_tail: &'a [u8],
    /// Malformed tags written in the name, skipped (statsd_exporter's tag
    /// errors; see [`name_tags`]). [`Line::append_name_tags_as_dogstatsd`]
    /// trusts it: at 0, it copies the tag list whole.
    pub name_tag_errors: u32,
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
    /// The DogStatsD container id (`|c:<id>`, trimmed), empty when absent;
    /// the series carries it as the tag `container_id:<id>`.
    pub container_id: &'a [u8],
    /// The DogStatsD timestamp, unix seconds.
    pub timestamp: Option<u64>,
    /// The DogStatsD external data (`|e:<data>`, trimmed), empty when absent: what a
    /// Kubernetes admission controller told the client about its pod and container
    /// (`it-false,cn-<container name>,pu-<pod uid>`). Not a tag; the collector's origin
    /// detection reads it.
    pub external_data: &'a [u8],
    /// Tags the receiver adds to the line (comma-separated, DogStatsD form): the origin
    /// tags of the container that sent it. The parser leaves it empty.
    pub origin_tags: &'a [u8],
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

    /// The tags of the line's tag field, trimmed, empty ones skipped.
    pub fn tags(&self) -> Tags<'a> {
        Tags { rest: self.tags }
    }

    /// The well-formed tags written in the name, as `(key, value)`.
    pub fn name_tags(&self) -> NameTags<'a> {
        NameTags::new(name_tags::tags_of_tail(self.name_tail))
    }

    /// The part of the name after SignalFx tags written inside it; empty
    /// otherwise.
    pub fn name_rest(&self) -> &'a [u8] {
        name_tags::rest_of_tail(self.name_tail)
    }

    /// Appends the well-formed tags written in the name to `out` in
    /// DogStatsD form, each as `,key:value`.
    pub fn append_name_tags_as_dogstatsd(&self, out: &mut Vec<u8>) {
        name_tags::append_as_dogstatsd_tags(self.name_tail, self.name_tag_errors, out);
    }

    /// Whether the series id holds more than [`Line::name`] and the tag
    /// field: tags written in the name, a name cut in two by SignalFx tags,
    /// a container id, or origin tags. The id of such a line is built by
    /// [`SeriesKey::build`](crate::series::SeriesKey::build), never found
    /// in the line as it lies.
    pub fn has_tags_beyond_tag_field(&self) -> bool {
        !self.name_tail.is_empty() || !self.container_id.is_empty() || !self.origin_tags.is_empty()
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

/// Parser settings. The three name tag styles (see [`name_tags`]) are on by
/// default, as in statsd_exporter; a style switched off leaves its bytes in
/// the name. The DogStatsD tag field is always read (statsd_exporter can
/// switch it off too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// Lines longer than this are rejected with [`RejectReason::LineTooLong`].
    pub max_line_bytes: usize,
    /// Read InfluxDB / Telegraf tags in the name: `api.hits,env=prod:1|c`.
    pub influxdb_tags: bool,
    /// Read Librato tags in the name: `api.hits#env=prod:1|c`.
    pub librato_tags: bool,
    /// Read SignalFx tags in the name: `api.[env=prod]hits:1|c`.
    pub signalfx_tags: bool,
}

impl ParseOptions {
    /// Whether any name tag style is on.
    #[inline]
    pub fn reads_name_tags(&self) -> bool {
        self.influxdb_tags || self.librato_tags || self.signalfx_tags
    }
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            influxdb_tags: true,
            librato_tags: true,
            signalfx_tags: true,
        }
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
    match parse_metric(line, options) {
        Ok(metric) => Parsed::Metric(metric),
        Err(reason) => Parsed::Rejected { reason, line },
    }
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

/// An event needs `_e{<title len>,<text len>}:`; a service check `_sc|name|status`.
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

fn parse_metric(line: &[u8], options: ParseOptions) -> Result<Line<'_>, RejectReason> {
    // One pass over the name finds the `:`, and sees a `|` before it (a line
    // without a value) and any unusual byte (non-ASCII, or one that may
    // start tags written in the name), eight bytes at a time.
    let (colon, unusual) = match scan_name(line) {
        NameEnd::Colon { at, unusual } => (at, unusual),
        NameEnd::Pipe | NameEnd::None => return Err(RejectReason::MissingValue),
    };
    let raw_name = &line[..colon];
    if raw_name.is_empty() {
        return Err(RejectReason::EmptyName);
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

    // The optional fields, in locals: the line is built once, at the end.
    let (mut sample_rate, mut tags, mut container_id, mut timestamp) = (1.0, &b""[..], &b""[..], None);
    let mut external_data = &b""[..];
    // Tags beyond the tag field: the container id (and the well-formed name tags, below).
    let mut more_tags = 0;
    let mut tag_field_count = 0;
    while !fields.is_empty() {
        let (field, rest) = split_once(fields, b'|');
        fields = rest;
        match field {
            [b'@', rate @ ..] => sample_rate = parse_sample_rate(rate)?,
            [b'#', field_tags @ ..] => (tags, tag_field_count) = validate_tags(field_tags)?,
            [b'T', seconds @ ..] => timestamp = Some(parse_timestamp(seconds)?),
            [b'c', b':', id @ ..] => {
                more_tags -= usize::from(!container_id.is_empty());
                container_id = parse_container_id(id)?;
                more_tags += usize::from(!container_id.is_empty());
            }
            [b'e', b':', data @ ..] => external_data = data.trim_ascii(),
            // Whatever comes next.
            _ => {}
        }
    }
    // The name's own checks last (UTF-8, name tags): a name is rarely more
    // than its bytes, and what it needs only then stays out of the loop
    // above (7 instructions a line on the full parser). A line that is bad
    // both in its name and after it is rejected for what comes after.
    let (name, name_tag_count) =
        if unusual { read_unusual_name(raw_name, after_name, options)? } else { (NameSplit::whole(raw_name, 0), 0) };
    more_tags += name_tag_count;
    if more_tags > 0 && tag_field_count + more_tags > MAX_TAGS {
        return Err(RejectReason::TooManyTags);
    }
    Ok(Line {
        name: name.name,
        name_tail: name.tail,
        name_tag_errors: name.tag_errors,
        kind,
        raw_value,
        first,
        packed,
        sample_rate,
        tags,
        container_id,
        timestamp,
        external_data,
        origin_tags: b"",
    })
}

/// Reads a name holding an unusual byte (see `scan`): checks that it is
/// UTF-8, and cuts the tags written in it out per `options` (see
/// [`name_tags`]). Returns the name and how many of its tags are well
/// formed; `after_name` is the rest of the line, where a `|#` tag field
/// beside well-formed name tags rejects the line.
#[inline(never)]
fn read_unusual_name<'a>(
    raw_name: &'a [u8],
    after_name: &[u8],
    options: ParseOptions,
) -> Result<(NameSplit<'a>, usize), RejectReason> {
    if !raw_name.is_ascii() && std::str::from_utf8(raw_name).is_err() {
        return Err(RejectReason::InvalidUtf8);
    }
    if !options.reads_name_tags() {
        return Ok((NameSplit::whole(raw_name, 0), 0));
    }
    let mut name = name_tags::split_name_tags(raw_name, options);
    let (well_formed, malformed) = name_tags::count_name_tags(name_tags::tags_of_tail(name.tail));
    name.tag_errors += malformed;
    if well_formed > 0 && after_name.windows(2).any(|pair| pair == b"|#") {
        return Err(RejectReason::MixedTagStyles);
    }
    if name.name.is_empty() {
        return Err(RejectReason::EmptyName);
    }
    Ok((name, well_formed))
}

/// Checks a container id (`|c:<id>`, the id given): trimmed, UTF-8, and
/// without a comma, since it becomes the tag `container_id:<id>`. Empty
/// when the field is (an empty id is ignored).
fn parse_container_id(raw: &[u8]) -> Result<&[u8], RejectReason> {
    let id = raw.trim_ascii();
    if !id.is_ascii() && std::str::from_utf8(id).is_err() {
        return Err(RejectReason::InvalidUtf8);
    }
    if find_short(id, b',').is_some() {
        return Err(RejectReason::BadTags);
    }
    Ok(id)
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
/// Returns the list and how many non-blank tags it holds.
fn validate_tags(raw: &[u8]) -> Result<(&[u8], usize), RejectReason> {
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
    Ok((raw, count))
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
