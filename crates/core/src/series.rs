//! Series identity: the canonical series id.
//!
//! A series is a metric name, a type and a set of tags. Its **canonical id**
//! is one byte string:
//!
//! ```text
//! <name>                                   when the series has no tags
//! <name>|#<tag>,<tag>,...                  otherwise
//! ```
//!
//! where the tags are trimmed of surrounding spaces, empty tags dropped,
//! exact duplicates collapsed, and the rest sorted by key, then by value
//! (bytewise; a bare `key` sorts before `key:value`). The name cannot hold
//! `|` and tags cannot hold `,` or `|`, so the id parses back unambiguously
//! ([`split_id`]). The type is not part of the id; it travels beside it
//! (`a:1|c` and `a:1|g` are two series with the same id and shard).
//!
//! The tags are the line's DogStatsD tag field, the tags written in its
//! name (`key=value` becomes `key:value`, see
//! [`name_tags`](crate::parse::name_tags)) and its container id (the tag
//! `container_id:<id>`), all in the one canonical form: however a client
//! writes a tag, the series is the same.
//!
//! [`SeriesKey`] builds ids into a reused buffer, so building the id of a
//! line allocates nothing once the buffer has grown to fit.
//!
//! ```
//! use tessera_core::{parse::{parse_line, Parsed}, series::SeriesKey};
//!
//! let mut key = SeriesKey::default();
//! let Parsed::Metric(line) = parse_line(b"req:1|c|#zone:b, zone:a ,app") else { unreachable!() };
//! key.build(&line).unwrap();
//! assert_eq!(key.id(), b"req|#app,zone:a,zone:b");
//!
//! let Parsed::Metric(line) = parse_line(b"req,zone=b,app=web:1|c|c:f00d") else { unreachable!() };
//! key.build(&line).unwrap();
//! assert_eq!(key.id(), b"req|#app:web,container_id:f00d,zone:b");
//! ```

use crate::parse::{Line, MAX_TAGS, MetricKind, RejectReason, Tags, split_tag};

/// Separates the name from the tags in a canonical id.
pub const TAGS_SEPARATOR: &[u8] = b"|#";

/// Label names tessera sets itself on what it writes to storage.
pub const RESERVED_LABELS: [&str; 3] = ["resolution", "quantile", "le"];

/// Whether a tag key, as a label name, is tessera's ([`RESERVED_LABELS`]) or reserved by
/// Prometheus (`__` first): the ingester writes such a tag as `tag_<key>`.
pub fn is_reserved_label(key: &str) -> bool {
    key.starts_with("__") || RESERVED_LABELS.contains(&key)
}

/// For a rule that gives series the tag `key`: what to tell its author when the key is
/// reserved ([`is_reserved_label`]), since the label will not be written under that name.
pub fn reserved_label_note(key: &str) -> Option<String> {
    is_reserved_label(key).then(|| {
        format!(
            "`{key}` is a label tessera sets itself (resolution, quantile, le) or Prometheus reserves (`__`): the \
             ingester writes this label as `tag_{key}`"
        )
    })
}

/// A reusable buffer holding one series' table key: a kind byte followed by
/// the canonical id.
#[derive(Debug, Clone, Default)]
pub struct SeriesKey {
    buf: Vec<u8>,
    /// `(start, key end, end)` of each tag in the raw tag list.
    ranges: Vec<(u32, u32, u32)>,
    /// The tags of a line that has tags beyond its tag field, gathered in
    /// DogStatsD form.
    gathered: Vec<u8>,
}

impl SeriesKey {
    /// Builds the key of `line` into this buffer.
    ///
    /// Fails only with [`RejectReason::TooManyTags`], which the parser has
    /// already ruled out for lines it accepted.
    #[inline]
    pub fn build(&mut self, line: &Line<'_>) -> Result<(), RejectReason> {
        self.buf.clear();
        self.buf.push(kind_byte(line.kind));
        self.buf.extend_from_slice(line.name);
        if line.has_tags_beyond_tag_field() {
            return self.append_tags_beyond_tag_field(line);
        }
        if line.tags.is_empty() {
            return Ok(());
        }
        append_sorted_tags(&mut self.buf, &mut self.ranges, line.tags, line.tags())
    }

    /// Appends the rest of the name and every tag of a line that has tags
    /// beyond its tag field: they are gathered, in DogStatsD form, into a
    /// reused buffer and sorted from there.
    #[inline(never)]
    fn append_tags_beyond_tag_field(&mut self, line: &Line<'_>) -> Result<(), RejectReason> {
        self.buf.extend_from_slice(line.name_rest());
        let gathered = &mut self.gathered;
        gathered.clear();
        gathered.extend_from_slice(line.tags);
        line.append_name_tags_as_dogstatsd(gathered);
        if !line.container_id.is_empty() {
            gathered.extend_from_slice(b",container_id:");
            gathered.extend_from_slice(line.container_id);
        }
        if !line.origin_tags.is_empty() {
            gathered.push(b',');
            gathered.extend_from_slice(line.origin_tags);
        }
        append_sorted_tags(&mut self.buf, &mut self.ranges, gathered, Tags::new(gathered))
    }

    /// Builds a key from a name and tags (`key` or `key:value`) joined by
    /// commas in `raw_tags`.
    pub fn build_from_parts(&mut self, kind: MetricKind, name: &[u8], raw_tags: &[u8]) -> Result<(), RejectReason> {
        self.buf.clear();
        self.buf.push(kind_byte(kind));
        self.buf.extend_from_slice(name);
        let tags = Tags::new(raw_tags);
        append_sorted_tags(&mut self.buf, &mut self.ranges, raw_tags, tags)
    }

    /// The canonical id.
    pub fn id(&self) -> &[u8] {
        self.buf.get(1..).unwrap_or_default()
    }

    /// The table key: kind byte, then the canonical id.
    pub fn table_key(&self) -> &[u8] {
        &self.buf
    }

    /// The kind this key was built for.
    pub fn kind(&self) -> Option<MetricKind> {
        self.buf.first().and_then(|byte| kind_from_byte(*byte))
    }
}

/// Appends `|#` and the tags in canonical order to `buf` (nothing when there
/// are none). `tags` iterates trimmed, non-empty sub-slices of `raw`;
/// `ranges` is a reused scratch vector.
fn append_sorted_tags<'t>(
    buf: &mut Vec<u8>,
    ranges: &mut Vec<(u32, u32, u32)>,
    raw: &'t [u8],
    tags: impl Iterator<Item = &'t [u8]>,
) -> Result<(), RejectReason> {
    // Offsets into `raw` in a reused vector: no allocation once grown,
    // and nothing to initialise per line.
    ranges.clear();
    let base = raw.as_ptr() as usize;
    for tag in tags {
        if ranges.len() == MAX_TAGS {
            return Err(RejectReason::TooManyTags);
        }
        let start = tag.as_ptr() as usize - base;
        let key_len = split_tag(tag).0.len();
        ranges.push((start as u32, (start + key_len) as u32, (start + tag.len()) as u32));
    }
    // Few tags per line: the standard library sorts short slices by
    // insertion, in place. Keys compare first, a bare key before
    // `key:value`, then values.
    let part = |from: u32, to: u32| &raw[from as usize..to as usize];
    ranges.sort_unstable_by(|a, b| {
        part(a.0, a.1)
            .cmp(part(b.0, b.1))
            .then((a.2 > a.1).cmp(&(b.2 > b.1)))
            .then_with(|| part(a.1, a.2).cmp(part(b.1, b.2)))
    });
    let mut previous: Option<&[u8]> = None;
    for &(start, _, end) in ranges.iter() {
        let tag = part(start, end);
        if previous == Some(tag) {
            continue;
        }
        let separator: &[u8] = if previous.is_none() { TAGS_SEPARATOR } else { b"," };
        buf.extend_from_slice(separator);
        buf.extend_from_slice(tag);
        previous = Some(tag);
    }
    Ok(())
}

/// The canonical order of two tags: by key, a bare key before `key:value`, then by value
/// (what [`SeriesKey`] sorts by).
fn tag_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let (a_key, a_value) = split_tag(a);
    let (b_key, b_value) = split_tag(b);
    a_key.cmp(b_key).then((a.len() > a_key.len()).cmp(&(b.len() > b_key.len()))).then_with(|| a_value.cmp(b_value))
}

/// Writes the tags of `raw` (comma-separated, any order) to `out` in canonical order,
/// without duplicates: the tag part of a canonical id, with no `|#`.
pub fn canonical_tags(raw: &[u8], out: &mut Vec<u8>) {
    let mut tags: Vec<&[u8]> = Tags::new(raw).collect();
    tags.sort_by(|a, b| tag_order(a, b));
    tags.dedup();
    out.clear();
    for (index, tag) in tags.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(tag);
    }
}

/// Merges two tag lists already in canonical order (see [`canonical_tags`]) into `out`,
/// in canonical order and without duplicates; returns how many tags `out` holds. Linear:
/// what the collector does for every line when it adds a sender's origin tags to lines
/// whose own tags are canonical.
pub fn merge_canonical_tags(a: &[u8], b: &[u8], out: &mut Vec<u8>) -> usize {
    let mut left = a.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()).peekable();
    let mut right = b.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()).peekable();
    let mut count = 0;
    loop {
        let next = match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => match tag_order(l, r) {
                std::cmp::Ordering::Less => left.next(),
                std::cmp::Ordering::Greater => right.next(),
                std::cmp::Ordering::Equal => {
                    right.next();
                    left.next()
                }
            },
            (Some(_), None) => left.next(),
            (None, Some(_)) => right.next(),
            (None, None) => return count,
        };
        if let Some(tag) = next {
            if count > 0 {
                out.push(b',');
            }
            out.extend_from_slice(tag);
            count += 1;
        }
    }
}

/// The byte that stands for `kind` at the front of a table key.
pub fn kind_byte(kind: MetricKind) -> u8 {
    match kind {
        MetricKind::Counter => b'c',
        MetricKind::Gauge => b'g',
        MetricKind::Timer => b'm',
        MetricKind::Histogram => b'h',
        MetricKind::Distribution => b'd',
        MetricKind::Set => b's',
    }
}

/// The kind a table key's first byte stands for.
pub fn kind_from_byte(byte: u8) -> Option<MetricKind> {
    match byte {
        b'c' => Some(MetricKind::Counter),
        b'g' => Some(MetricKind::Gauge),
        b'm' => Some(MetricKind::Timer),
        b'h' => Some(MetricKind::Histogram),
        b'd' => Some(MetricKind::Distribution),
        b's' => Some(MetricKind::Set),
        _ => None,
    }
}

/// Splits a canonical id into its name and its raw tag list (empty when untagged).
pub fn split_id(id: &[u8]) -> (&[u8], &[u8]) {
    match id.windows(2).position(|pair| pair == TAGS_SEPARATOR) {
        Some(at) => (&id[..at], &id[at + 2..]),
        None => (id, b""),
    }
}

/// Iterates the `(key, value)` pairs of a canonical id's tags.
pub fn id_tags(id: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let (_, tags) = split_id(id);
    tags.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()).map(split_tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Parsed, parse_line};

    fn id_of(line: &[u8]) -> Vec<u8> {
        let Parsed::Metric(line) = parse_line(line) else { panic!("{line:?} did not parse") };
        let mut key = SeriesKey::default();
        key.build(&line).unwrap();
        key.id().to_vec()
    }

    #[test]
    fn tag_order_spaces_and_duplicates_do_not_make_new_series() {
        let same = [
            &b"a:1|c|#x:1,y:2"[..],
            b"a:1|c|#y:2,x:1",
            b"a:1|c|# y:2 ,  x:1",
            b"a:1|c|#x:1,,y:2,",
            b"a:1|c|#x:1,y:2,x:1",
            b"a:5|c|@0.5|#y:2,x:1|T1700000000",
        ];
        for line in same {
            assert_eq!(id_of(line), b"a|#x:1,y:2", "{}", String::from_utf8_lossy(line));
        }
        assert_eq!(id_of(b"a:1|c"), b"a");
        assert_eq!(id_of(b"a:1|c|#"), b"a");
    }

    #[test]
    fn sorts_by_key_then_value_with_bare_keys_first() {
        assert_eq!(id_of(b"m:1|g|#a.b:1,a:2,a,a:1"), b"m|#a,a:1,a:2,a.b:1");
    }

    #[test]
    fn kind_travels_in_the_table_key_not_the_id() {
        let Parsed::Metric(counter) = parse_line(b"a:1|c") else { panic!() };
        let Parsed::Metric(gauge) = parse_line(b"a:1|g") else { panic!() };
        let (mut k1, mut k2) = (SeriesKey::default(), SeriesKey::default());
        k1.build(&counter).unwrap();
        k2.build(&gauge).unwrap();
        assert_eq!(k1.id(), k2.id());
        assert_ne!(k1.table_key(), k2.table_key());
        assert_eq!(k1.kind(), Some(MetricKind::Counter));
        assert_eq!(k2.kind(), Some(MetricKind::Gauge));
    }

    #[test]
    fn tags_written_in_the_name_or_the_tag_field_make_one_series() {
        let same = [
            &b"api.hits:1|c|#env:prod,host:a"[..],
            b"api.hits,env=prod,host=a:1|c",
            b"api.hits,host=a,env=prod:1|c",
            b"api.hits#env=prod,host=a:1|c",
            b"api.[env=prod,host=a]hits:1|c",
            b"api.hits[host=a,env=prod]:1|c",
            b"[env=prod,host=a]api.hits:1|c",
            b"api.hits,env=prod,host=a,host=a,bad:1|c",
            b"api.hits, env=prod ,host=a,:1|c",
        ];
        for line in same {
            let shown = String::from_utf8_lossy(line);
            let id = id_of(line);
            assert_eq!(id, b"api.hits|#env:prod,host:a", "{shown}: {}", String::from_utf8_lossy(&id));
        }
        assert_eq!(id_of(b"api.hits,bad:1|c"), b"api.hits", "no well-formed tag: no tags");
        assert_eq!(id_of(b"api.[]hits:1|c"), b"api.hits");
    }

    #[test]
    fn the_container_id_is_a_tag_in_canonical_order() {
        assert_eq!(id_of(b"a:1|c|c:f00d"), b"a|#container_id:f00d");
        assert_eq!(id_of(b"a:1|c|#z:1,b|c:f00d"), b"a|#b,container_id:f00d,z:1");
        assert_eq!(id_of(b"a,z=1:1|c|c:f00d"), b"a|#container_id:f00d,z:1");
        assert_eq!(id_of(b"a:1|c|#container_id:f00d|c:f00d"), b"a|#container_id:f00d", "an exact duplicate collapses");
    }

    #[test]
    fn ids_split_back_into_name_and_tags() {
        assert_eq!(split_id(b"a.b|#env:prod,x"), (&b"a.b"[..], &b"env:prod,x"[..]));
        assert_eq!(split_id(b"plain"), (&b"plain"[..], &b""[..]));
        let tags: Vec<_> = id_tags(b"a|#env:prod,x,url:http://h").collect();
        assert_eq!(tags, vec![(&b"env"[..], &b"prod"[..]), (b"x", b""), (b"url", b"http://h")]);
    }
}

#[cfg(test)]
mod merge_tests {
    use proptest::prelude::*;

    use super::{canonical_tags, merge_canonical_tags};

    fn tag() -> impl Strategy<Value = String> {
        // Few keys and values, so that equal keys, equal tags and bare keys all come up.
        ("[a-c]{1,2}", proptest::option::of("[x-z:]{0,2}"))
            .prop_map(|(key, value)| value.map_or(key.clone(), |value| format!("{key}:{value}")))
    }

    proptest! {
        /// Merging two canonical lists is the canonical form of both together: what the
        /// one-pass path builds for a line and its sender's origin tags is the id the full
        /// parser builds.
        #[test]
        fn merging_two_canonical_lists_is_the_canonical_form_of_their_union(
            a in proptest::collection::vec(tag(), 0..6),
            b in proptest::collection::vec(tag(), 0..6),
        ) {
            let (mut left, mut right, mut merged, mut whole) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            canonical_tags(a.join(",").as_bytes(), &mut left);
            canonical_tags(b.join(",").as_bytes(), &mut right);
            let count = merge_canonical_tags(&left, &right, &mut merged);
            canonical_tags(format!("{},{}", a.join(","), b.join(",")).as_bytes(), &mut whole);
            prop_assert_eq!(String::from_utf8(merged.clone()).unwrap(), String::from_utf8(whole).unwrap());
            prop_assert_eq!(count, merged.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()).count());
            // And the canonical form is what the series key sorts to.
            if !merged.is_empty() {
                let mut key = super::SeriesKey::default();
                key.build_from_parts(crate::parse::MetricKind::Counter, b"m", &merged).unwrap();
                let expected = [&b"m|#"[..], &merged].concat();
                prop_assert_eq!(key.id(), expected.as_slice());
            }
        }
    }
}
