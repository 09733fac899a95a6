//! `$1` / `${1}` templates, and the name and label checks statsd_exporter
//! makes.
//!
//! One syntax serves glob and regex rules, Go's `Regexp.Expand` (which the
//! regex crate's `Captures::expand` copies): `$name` takes the longest run of
//! `[A-Za-z0-9_]` after the `$`, `${name}` is delimited, `$$` is a literal
//! `$`, and a `$` followed by anything else is literal. A name made only of
//! digits is a group number; another name is a named regex group. So
//! `$1_total` is the reference `${1_total}`, which is always empty (write
//! `${1}_total`), exactly as in statsd_exporter. A reference that can never
//! resolve expands to nothing and is reported when the file loads.

/// One piece of a compiled template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    /// Text copied as is.
    Literal(Box<str>),
    /// A capture: for a glob rule the 0-based wildcard index, for a regex
    /// rule the group index (0 is the whole match).
    Capture(usize),
}

/// A compiled template.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Template {
    pieces: Vec<Piece>,
}

/// A reference as written, before it is resolved against a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reference<'a> {
    Number(usize),
    Name(&'a str),
}

impl Template {
    /// Compiles `text`; `resolve` turns each reference into a capture index,
    /// or `None` when it can never match (the reference then expands to
    /// nothing, and `unresolved` receives its text, e.g. `$1_foo`).
    pub(super) fn compile<'a>(
        text: &'a str,
        mut resolve: impl FnMut(&Reference<'a>) -> Option<usize>,
        mut unresolved: impl FnMut(&'a str),
    ) -> Template {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(dollar) = rest.find('$') {
            literal.push_str(&rest[..dollar]);
            let after = &rest[dollar + 1..];
            match split_reference(after) {
                Some((reference, consumed)) => {
                    let written = &rest[dollar..dollar + 1 + consumed];
                    rest = &after[consumed..];
                    match resolve(&reference) {
                        Some(index) => {
                            if !literal.is_empty() {
                                pieces.push(Piece::Literal(std::mem::take(&mut literal).into()));
                            }
                            pieces.push(Piece::Capture(index));
                        }
                        None => unresolved(written),
                    }
                }
                None if after.starts_with('$') => {
                    literal.push('$');
                    rest = &after[1..];
                }
                None => {
                    literal.push('$');
                    rest = after;
                }
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal.into()));
        }
        Template { pieces }
    }

    /// Appends the expansion to `out`; `capture(i)` gives capture `i`.
    pub(super) fn expand<'s>(&self, out: &mut String, capture: impl Fn(usize) -> Option<&'s str>) {
        for piece in &self.pieces {
            match piece {
                Piece::Literal(text) => out.push_str(text),
                Piece::Capture(index) => out.push_str(capture(*index).unwrap_or("")),
            }
        }
    }
}

/// Reads the reference after a `$`: the reference and the bytes it used.
fn split_reference(after: &str) -> Option<(Reference<'_>, usize)> {
    let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
        let close = braced.find('}')?;
        (&braced[..close], close + 2)
    } else {
        let end = after.find(|c: char| !is_name_char(c)).unwrap_or(after.len());
        (&after[..end], end)
    };
    if name.is_empty() || !name.chars().all(is_name_char) {
        return None;
    }
    let reference = if name.bytes().all(|byte| byte.is_ascii_digit()) {
        match name.parse::<usize>() {
            Ok(number) => Reference::Number(number),
            Err(_) => Reference::Name(name),
        }
    } else {
        Reference::Name(name)
    };
    Some((reference, consumed))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Writes `raw` as a Prometheus metric name into `out`, as statsd_exporter's
/// `EscapeMetricName` does: every character outside `[A-Za-z0-9_]` becomes
/// `_`, a `-` right after a `-` is dropped, and a leading digit gets a `_`
/// in front.
pub(super) fn escape_metric_name(raw: &str, out: &mut String) {
    out.clear();
    if raw.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = '\0';
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == '-') {
            out.push('_');
        }
        previous = c;
    }
}

/// Makes `value` usable as a tessera tag value in place: `|`, `,`, `\r` and
/// `\n` end a tag or a line on the wire, so each becomes `_`.
pub(super) fn sanitize_tag_value(value: &mut String) {
    if value.contains(is_tag_breaking) {
        *value = value.replace(is_tag_breaking, "_");
    }
}

fn is_tag_breaking(c: char) -> bool {
    matches!(c, '|' | ',' | '\r' | '\n')
}

/// A Prometheus label name: `[A-Za-z_][A-Za-z0-9_]*`.
///
/// statsd_exporter's own check (`^[a-zA-Z_][a-zA-Z0-9_]+$`) also refuses
/// one-character names, which Prometheus accepts; tessera accepts them.
pub(super) fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_') && chars.all(is_name_char)
}

/// statsd_exporter's `metricNameRE`: `[A-Za-z0-9_]` and `$n` / `${n}`
/// references, not starting with a digit.
pub(super) fn is_metric_name_template(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return false;
    }
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'$' {
            at += 1;
            if bytes.get(at) == Some(&b'{') {
                at += 1;
            }
            let digits = bytes[at..].iter().take_while(|byte| byte.is_ascii_digit()).count();
            if digits == 0 {
                return false;
            }
            at += digits;
            if bytes.get(at) == Some(&b'}') {
                at += 1;
            }
        } else if bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_' {
            if at == 0 && bytes[at].is_ascii_digit() {
                return false;
            }
            at += 1;
        } else {
            return false;
        }
    }
    true
}

/// statsd_exporter's `metricLineRE` for a glob `match`: components separated
/// by `.`, each `*` or `[A-Za-z0-9_]` runs joined by single `-`, the first
/// not starting with a digit.
pub(super) fn is_glob_pattern(pattern: &str) -> bool {
    pattern
        .split('.')
        .enumerate()
        .all(|(index, component)| component == "*" || is_glob_component(component, index == 0))
}

fn is_glob_component(component: &str, first: bool) -> bool {
    let bytes = component.as_bytes();
    let Some(&head) = bytes.first() else {
        return false;
    };
    if !(head.is_ascii_alphanumeric() || head == b'_') || (first && head.is_ascii_digit()) {
        return false;
    }
    let mut previous_dash = false;
    for &byte in &bytes[1..] {
        if byte == b'-' {
            if previous_dash {
                return false;
            }
            previous_dash = true;
        } else if byte.is_ascii_alphanumeric() || byte == b'_' {
            previous_dash = false;
        } else {
            return false;
        }
    }
    !previous_dash
}
