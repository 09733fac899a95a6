//! Tags written in the metric name, read the way Prometheus' statsd_exporter
//! reads them (`pkg/line/line.go`, `parseNameAndTags`), so that clients
//! written for it keep their labels:
//!
//! | style | line | name | tags |
//! |---|---|---|---|
//! | InfluxDB / Telegraf | `api.hits,env=prod,host=a:1\|c` | `api.hits` | `env:prod`, `host:a` |
//! | Librato | `api.hits#env=prod:1\|c` | `api.hits` | `env:prod` |
//! | SignalFx | `api.[env=prod]hits:1\|c` | `api.hits` | `env:prod` |
//!
//! The rules, each style behind its switch in [`ParseOptions`] (all on by
//! default):
//!
//! - SignalFx first: with both a `[` and a `]` in the name, the tags are
//!   what lies between the first `[` and the first `]`, and that part,
//!   brackets included, is cut out of the name, wherever it sits; nothing
//!   else in the name is read as tags then. With only one of the two, the
//!   name is kept whole (brackets and all), nothing else is read as tags,
//!   and one tag error is counted.
//! - Otherwise the first `#` (Librato) or `,` (InfluxDB), whichever comes
//!   first among the styles switched on, ends the name, and the tags are
//!   everything after it.
//! - The tags are `key=value` separated by commas, split at the first `=`
//!   (the value may hold more). A tag without `=`, with an empty key or
//!   an empty value, or an empty tag between two commas is skipped and
//!   counted as a tag error; the line is kept. A comma at the very end is
//!   not an empty tag.
//! - A tag `key=value` is the DogStatsD tag `key:value`: the series id is
//!   the same whichever way a client writes its tags.
//! - A line that carries a well-formed name tag and a DogStatsD tag field
//!   (`|#`) is refused ([`RejectReason::MixedTagStyles`](super::RejectReason::MixedTagStyles));
//!   a name whose tags were all malformed mixes nothing.
//!
//! Where tessera differs from statsd_exporter:
//!
//! - spaces around a name tag are dropped (as around a DogStatsD tag), so
//!   a tag that is only spaces is empty, and ` =v` has an empty key;
//! - a `]` before the first `[` counts as one bracket alone (statsd_exporter
//!   slices the name backwards there and fails);
//! - a name left empty once its tags are cut out (`,env=prod:1|c`,
//!   `[env=prod]:1|c`) rejects the line
//!   ([`RejectReason::EmptyName`](super::RejectReason::EmptyName)) instead of
//!   making a metric without a name;
//! - name tags count towards [`MAX_TAGS`](super::MAX_TAGS), like DogStatsD
//!   tags;
//! - a line bad in its name (mixed styles, an empty name) and after it (a
//!   bad value, say) is rejected for what comes after; statsd_exporter
//!   reports `mixed_tagging_styles` first;
//! - keys are kept as written; the ingester makes them label names (as it
//!   does for DogStatsD keys) where statsd_exporter escapes them here.

use memchr::{memchr, memchr2};

use super::{ParseOptions, find_short};

/// A raw name with the tags written in it cut out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NameSplit<'a> {
    /// The name, or its part before SignalFx tags written inside it.
    pub name: &'a [u8],
    /// Where the tags begin, from the byte that opens them (see
    /// [`Line::name_tail`](super::Line::name_tail)).
    pub tail: &'a [u8],
    /// Tag errors: a SignalFx bracket alone (and, once the caller has
    /// counted the tags, the malformed ones).
    pub tag_errors: u32,
}

impl<'a> NameSplit<'a> {
    /// A name without tags in it.
    pub(super) fn whole(name: &'a [u8], tag_errors: u32) -> NameSplit<'a> {
        NameSplit { name, tail: b"", tag_errors }
    }
}

/// The raw tag list of a name tail (see [`split_name_tags`]): inside the
/// brackets of a SignalFx tail, after the `,` or `#` of the others.
pub(super) fn tags_of_tail(tail: &[u8]) -> &[u8] {
    match tail {
        [b'[', inside @ ..] => &inside[..find_short(inside, b']').unwrap_or(inside.len())],
        [_, tags @ ..] => tags,
        [] => b"",
    }
}

/// The part of the name after the tags of a SignalFx tail; empty for the
/// others.
pub(super) fn rest_of_tail(tail: &[u8]) -> &[u8] {
    match tail {
        [b'[', ..] => find_short(tail, b']').map_or(&b""[..], |close| &tail[close + 1..]),
        _ => b"",
    }
}

/// Cuts the tags written in `raw` (a whole name field, before its `:`) out
/// of it, per the styles `options` switches on. The tail is where the tags
/// begin to the end of the name field, except for SignalFx tags that open
/// the name: then it ends with their `]`, and the name is what follows.
pub(super) fn split_name_tags(raw: &[u8], options: ParseOptions) -> NameSplit<'_> {
    // The first `[` and the first `]`: a pair when the `[` comes first and a
    // `]` follows it; either alone (or a `]` first) is a tag error.
    if options.signalfx_tags
        && let Some(first) = memchr2(b'[', b']', raw)
    {
        let close = match raw[first] {
            b'[' => memchr(b']', &raw[first + 1..]).map(|close| first + 1 + close),
            _ => None,
        };
        return match close {
            Some(close) if first == 0 => NameSplit { name: &raw[close + 1..], tail: &raw[..=close], tag_errors: 0 },
            Some(_) => NameSplit { name: &raw[..first], tail: &raw[first..], tag_errors: 0 },
            None => NameSplit::whole(raw, 1),
        };
    }
    let start = match (options.librato_tags, options.influxdb_tags) {
        (true, true) => memchr2(b'#', b',', raw),
        (true, false) => memchr(b'#', raw),
        (false, true) => memchr(b',', raw),
        (false, false) => None,
    };
    match start {
        Some(at) => NameSplit { name: &raw[..at], tail: &raw[at..], tag_errors: 0 },
        None => NameSplit::whole(raw, 0),
    }
}

/// Appends the well-formed tags of a name tail to `out` as DogStatsD tags,
/// each as `,key:value`. `malformed` is how many are not well formed.
pub(super) fn append_as_dogstatsd_tags(tail: &[u8], malformed: u32, out: &mut Vec<u8>) {
    let list = tags_of_tail(tail);
    if list.is_empty() {
        return;
    }
    if malformed > 0 {
        for (key, value) in NameTags::new(list) {
            out.push(b',');
            out.extend_from_slice(key);
            out.push(b':');
            out.extend_from_slice(value);
        }
        return;
    }
    // Every tag is well formed: copy the list at once, and make the first
    // `=` of each tag its `:` (spaces around a tag are trimmed later, as
    // around any DogStatsD tag).
    out.push(b',');
    let start = out.len();
    out.extend_from_slice(list);
    let mut first_in_tag = true;
    for byte in &mut out[start..] {
        match *byte {
            b',' => first_in_tag = true,
            b'=' if first_in_tag => {
                *byte = b':';
                first_in_tag = false;
            }
            _ => {}
        }
    }
}

/// Counts the well-formed tags of a raw name tag list, and the malformed
/// ones (tag errors).
pub(super) fn count_name_tags(raw: &[u8]) -> (usize, u32) {
    let mut fields = NameTagFields { rest: raw };
    let (mut valid, mut malformed) = (0, 0);
    while let Some(field) = fields.next_field() {
        match field {
            Some(_) => valid += 1,
            None => malformed += 1,
        }
    }
    (valid, malformed)
}

/// Iterator over the well-formed tags written in a metric name, as
/// `(key, value)` (see [`Line::name_tags`](super::Line::name_tags));
/// malformed ones are skipped.
#[derive(Debug, Clone)]
pub struct NameTags<'a> {
    fields: NameTagFields<'a>,
}

impl<'a> NameTags<'a> {
    /// Iterates the tags of a raw name tag list (`key=value,...`).
    pub fn new(raw: &'a [u8]) -> NameTags<'a> {
        NameTags { fields: NameTagFields { rest: raw } }
    }
}

impl<'a> Iterator for NameTags<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        while let Some(field) = self.fields.next_field() {
            if field.is_some() {
                return field;
            }
        }
        None
    }
}

/// The comma-separated fields of a raw name tag list.
#[derive(Debug, Clone)]
struct NameTagFields<'a> {
    rest: &'a [u8],
}

impl<'a> NameTagFields<'a> {
    /// The next field: `None` at the end, `Some(None)` for a malformed tag.
    fn next_field(&mut self) -> Option<Option<(&'a [u8], &'a [u8])>> {
        if self.rest.is_empty() {
            // Also after a comma that ends the list: no empty tag there.
            return None;
        }
        let tag = match find_short(self.rest, b',') {
            Some(comma) => {
                let tag = &self.rest[..comma];
                self.rest = &self.rest[comma + 1..];
                tag
            }
            None => std::mem::take(&mut self.rest),
        };
        let tag = tag.trim_ascii();
        let Some(equals) = find_short(tag, b'=') else { return Some(None) };
        let (key, value) = (&tag[..equals], &tag[equals + 1..]);
        Some((!key.is_empty() && !value.is_empty()).then_some((key, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(raw: &[u8], options: ParseOptions) -> (String, String, String, u32) {
        let split = split_name_tags(raw, options);
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (text(split.name), text(rest_of_tail(split.tail)), text(tags_of_tail(split.tail)), split.tag_errors)
    }

    #[test]
    fn each_style_cuts_its_tags_out_of_the_name() {
        let all = ParseOptions::default();
        // (raw name, (name, name rest, tags, tag errors))
        type Case = (&'static [u8], (&'static str, &'static str, &'static str, u32));
        let cases: &[Case] = &[
            (b"api.hits", ("api.hits", "", "", 0)),
            (b"api.hits,env=prod,host=a", ("api.hits", "", "env=prod,host=a", 0)),
            (b"api.hits#env=prod", ("api.hits", "", "env=prod", 0)),
            (b"api.hits#a=1,b=2", ("api.hits", "", "a=1,b=2", 0)),
            (b"api.hits,a=1#b=2", ("api.hits", "", "a=1#b=2", 0)),
            (b"api.[env=prod]hits", ("api.", "hits", "env=prod", 0)),
            (b"[env=prod]api.hits", ("api.hits", "", "env=prod", 0)),
            (b"api.hits[env=prod]", ("api.hits", "", "env=prod", 0)),
            (b"api.[]hits", ("api.", "hits", "", 0)),
            (b"api.[a=1]hits,b=2", ("api.", "hits,b=2", "a=1", 0)),
            (b"[a=1,b=2bad", ("[a=1,b=2bad", "", "", 1)),
            (b"a=1,b=2]bad", ("a=1,b=2]bad", "", "", 1)),
            (b"a]b[c=d", ("a]b[c=d", "", "", 1)),
            (b",env=prod", ("", "", "env=prod", 0)),
        ];
        for (raw, (name, rest, tags, errors)) in cases {
            let want = (name.to_string(), rest.to_string(), tags.to_string(), *errors);
            assert_eq!(split(raw, all), want, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn each_switch_turns_its_style_off() {
        let all = ParseOptions::default();
        let no_influx = ParseOptions { influxdb_tags: false, ..all };
        let no_librato = ParseOptions { librato_tags: false, ..all };
        let no_signalfx = ParseOptions { signalfx_tags: false, ..all };
        let none = ParseOptions { influxdb_tags: false, librato_tags: false, signalfx_tags: false, ..all };
        let own = |text: &str| (text.to_owned(), String::new(), String::new(), 0);
        assert_eq!(split(b"a,x=1", no_influx), own("a,x=1"));
        assert_eq!(split(b"a#x=1,y=2", no_librato), ("a#x=1".into(), String::new(), "y=2".into(), 0));
        assert_eq!(split(b"a,x=1#y=2", no_influx), ("a,x=1".into(), String::new(), "y=2".into(), 0));
        assert_eq!(split(b"a.[x=1]b", no_signalfx), own("a.[x=1]b"));
        assert_eq!(split(b"a.[x=1,y=2]b", no_signalfx), ("a.[x=1".into(), String::new(), "y=2]b".into(), 0));
        assert_eq!(split(b"a]b", no_signalfx), own("a]b"), "a bracket alone is no error with SignalFx off");
        for raw in [&b"a,x=1"[..], b"a#x=1", b"a.[x=1]b", b"a]b"] {
            assert_eq!(split(raw, none), own(&String::from_utf8_lossy(raw)));
        }
    }

    #[test]
    fn tags_become_dogstatsd_tags_whether_or_not_some_are_malformed() {
        let cases: &[(&[u8], &[u8])] = &[
            (b",a=1,b=2=3", b",a:1,b:2=3"),
            (b"#a=1,", b",a:1,"),
            (b"[ a = 1 ,b=2]rest", b", a : 1 ,b:2"),
            (b",a=1,bad,c=", b",a:1"),
            (b",", b""),
            (b"", b""),
        ];
        for (tail, want) in cases {
            let (_, malformed) = count_name_tags(tags_of_tail(tail));
            let mut out = Vec::new();
            append_as_dogstatsd_tags(tail, malformed, &mut out);
            assert_eq!(out, want.to_vec(), "{}", String::from_utf8_lossy(tail));
        }
    }

    #[test]
    fn malformed_tags_are_skipped_and_counted() {
        // (raw tag list, well-formed tags, malformed tags)
        type Case = (&'static [u8], &'static [(&'static str, &'static str)], u32);
        let cases: &[Case] = &[
            (b"", &[], 0),
            (b"a=1", &[("a", "1")], 0),
            (b"a=1,", &[("a", "1")], 0),
            (b",", &[], 1),
            (b"a=1,,b=2", &[("a", "1"), ("b", "2")], 1),
            (b"a,b", &[], 2),
            (b"a=,=b,=", &[], 3),
            (b"url=http://x?a=b", &[("url", "http://x?a=b")], 0),
            (b" a=1 , b = 2", &[("a", "1"), ("b ", " 2")], 0),
            (b" , =1", &[], 2),
        ];
        for (raw, valid, malformed) in cases {
            let got: Vec<(String, String)> = NameTags::new(raw)
                .map(|(key, value)| (String::from_utf8_lossy(key).into(), String::from_utf8_lossy(value).into()))
                .collect();
            let want: Vec<(String, String)> = valid.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(got, want, "{}", String::from_utf8_lossy(raw));
            assert_eq!(count_name_tags(raw), (valid.len(), *malformed), "{}", String::from_utf8_lossy(raw));
        }
    }
}
