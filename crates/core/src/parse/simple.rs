//! The one-pass path for the most common statsd line, `name:value|type`
//! with optional canonical DogStatsD tags: [`parse_simple`] and
//! [`parse_simple_prefix`]. Every line it does not take goes to the full
//! parser ([`parse_line_with`](super::parse_line_with)), which reads the
//! lines this takes the same way.

use super::scan::scan_simple_name;
use super::{Decimal, MAX_TAGS, MetricKind, POW10, scan_decimal};

/// The most common statsd line, `<name>:<value>|<type>[|#<tags>]`,
/// recognised by [`parse_simple`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimpleLine<'a> {
    /// The metric name: non-empty, ASCII, without tags written in it.
    pub name: &'a [u8],
    /// The type; never [`MetricKind::Set`].
    pub kind: MetricKind,
    /// The value: unsigned, finite.
    pub value: f64,
    /// The tags, already in canonical order (see [`crate::series`]), or empty.
    pub tags: &'a [u8],
}

/// Recognises, in one pass, the shape most statsd traffic has:
/// `<name>:<digits>[.<digits>]|<c|g|ms|h|d>`, optionally followed by
/// `|#<tags>` when the tags are printable ASCII and already canonical
/// (sorted by key then value, no duplicates, no blanks: what a client that
/// sorts its tags sends), and nothing else: no sample rate, timestamp,
/// container id or packed values, at most 15 digits.
///
/// The name is ASCII from `-` (0x2D) up, without `[ \ ] { | }`: so a name
/// that may carry tags written in it (`,` InfluxDB, `#` Librato, `[` and
/// `]` SignalFx) is never taken here, whatever the
/// [`ParseOptions`](super::ParseOptions), and the few other bytes this
/// leaves out (control bytes, space, `!"$%&'()*+`) are rare in names.
///
/// Returns `None` for every other line; the caller then parses it with
/// [`parse_line_with`](super::parse_line_with), which reads any line this
/// accepts the same way, under any options (a `Line` with that name, kind,
/// first value and tags, unsigned, sample rate 1, no timestamp, nothing
/// else; property tests and the parse fuzz target check it). It does not
/// check the line length bound: the caller does.
///
/// ```
/// use tessera_core::parse::{parse_simple, MetricKind};
///
/// let line = parse_simple(b"api.requests:12.5|ms|#env:prod,zone:a").unwrap();
/// assert_eq!((line.name, line.kind, line.value), (&b"api.requests"[..], MetricKind::Timer, 12.5));
/// assert_eq!(line.tags, b"env:prod,zone:a");
/// assert!(parse_simple(b"api.requests:1|c|#zone:a,env:prod").is_none(), "unsorted tags take the full parser");
/// assert!(parse_simple(b"api.requests,env=prod:1|c").is_none(), "so do tags written in the name");
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
    // Events (`_e{..}`) and service checks (`_sc|`) never pass: `{` and `|`
    // come before any `:`, and the name scan stops at both.
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
