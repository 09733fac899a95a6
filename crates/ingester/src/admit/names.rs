//! statsd names and tags to Prometheus metric names and labels.
//!
//! | input | output |
//! |---|---|
//! | metric name | every character outside `[a-zA-Z0-9_:]` becomes `_`; a leading digit gets a `_` prefix; an empty name becomes `_` |
//! | tag `key:value` | label `key="value"`; the key keeps `[a-zA-Z0-9_]` (others, `:` included, become `_`), a leading digit gets a `_` prefix |
//! | bare tag `key` | label `key="true"` |
//! | tag with an empty value (`key:`) or an empty key | dropped (Prometheus treats an empty label as absent) |
//! | key starting with `__` (reserved), or named `resolution` or `quantile` (set by tessera) | prefixed with `tag_` |
//! | several tags with one key after the above | one label, the values joined with `,` in canonical tag order |
//! | a non-ASCII character (or a byte that is not UTF-8) in a name or key | one `_` |
//! | bytes that are not UTF-8 in a value | U+FFFD |

use std::borrow::Cow;

/// Appends `raw` to `out` with every byte outside `[a-zA-Z0-9_]` (and `:` when
/// `allow_colon`) replaced by `_`, one `_` per non-ASCII character (or invalid byte).
fn push_sanitized(out: &mut String, raw: &[u8], allow_colon: bool) {
    out.reserve(raw.len());
    for &byte in raw {
        let keep = byte.is_ascii_alphanumeric() || byte == b'_' || (allow_colon && byte == b':');
        if keep {
            out.push(byte as char);
        } else if !(0x80..0xc0).contains(&byte) {
            // ASCII punctuation, a UTF-8 leading byte, or an invalid byte; UTF-8
            // continuation bytes add nothing, so a character gives one `_`.
            out.push('_');
        }
    }
}

/// Appends the Prometheus metric name for statsd name `raw` to `out`.
pub fn metric_name(raw: &[u8], out: &mut String) {
    if raw.is_empty() {
        out.push('_');
        return;
    }
    if raw[0].is_ascii_digit() {
        out.push('_');
    }
    push_sanitized(out, raw, true);
}

/// Writes the Prometheus label name for tag key `raw` into `out` (cleared first); false
/// when the key is empty (the tag is dropped).
pub fn label_name(raw: &[u8], out: &mut String) -> bool {
    out.clear();
    if raw.is_empty() {
        return false;
    }
    push_sanitized(out, raw, false);
    if tessera_core::series::is_reserved_label(out) {
        out.insert_str(0, "tag_");
    } else if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    true
}

/// The label value for a tag value; a bare tag (`None`) is `"true"`.
pub fn label_value(raw: Option<&[u8]>) -> Cow<'_, str> {
    match raw {
        None => Cow::Borrowed("true"),
        // `from_utf8` is the fast check; the lossy pass only runs on invalid bytes.
        Some(value) => match std::str::from_utf8(value) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(value),
        },
    }
}

/// Splits a canonical tag into its key and value; a bare tag has no value.
pub fn split_tag(tag: &[u8]) -> (&[u8], Option<&[u8]>) {
    match tag.iter().position(|byte| *byte == b':') {
        Some(colon) => (&tag[..colon], Some(&tag[colon + 1..])),
        None => (tag, None),
    }
}

/// Reusable label buffers for [`tag_labels`], so that steady-state conversion does not
/// allocate per tag.
#[derive(Debug, Default)]
pub struct TagLabels {
    /// The labels, sorted by name.
    pub labels: Vec<(String, String)>,
    spare: Vec<(String, String)>,
}

/// Adds each of `external` (sorted by name) that `out` has no label of, keeping `out`
/// sorted: a target's `external_labels`, which a series' own tag overrides.
pub fn add_external(out: &mut TagLabels, external: &[(String, String)]) {
    let mut added = false;
    for (name, value) in external {
        if out.labels.binary_search_by(|(existing, _)| existing.as_str().cmp(name)).is_err() {
            let (mut label, mut text) = out.spare.pop().unwrap_or_default();
            label.push_str(name);
            text.push_str(value);
            out.labels.push((label, text));
            added = true;
        }
    }
    if added {
        out.labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
}

/// Fills `out` with the labels of a canonical id's raw tag list (see
/// `tessera_core::series::split_id`), sorted by name, with the rules of the
/// [module docs](self).
pub fn tag_labels(raw_tags: &[u8], out: &mut TagLabels) {
    for (mut name, mut value) in out.labels.drain(..) {
        name.clear();
        value.clear();
        out.spare.push((name, value));
    }
    for tag in raw_tags.split(|byte| *byte == b',').filter(|tag| !tag.is_empty()) {
        let (key, value) = split_tag(tag);
        let value = label_value(value);
        if value.is_empty() {
            continue;
        }
        let (mut name, mut text) = out.spare.pop().unwrap_or_default();
        if !label_name(key, &mut name) {
            out.spare.push((name, text));
            continue;
        }
        match out.labels.iter_mut().find(|(existing, _)| *existing == name) {
            Some((_, joined)) => {
                joined.push(',');
                joined.push_str(&value);
                out.spare.push((name, text));
            }
            None => {
                text.push_str(&value);
                out.labels.push((name, text));
            }
        }
    }
    out.labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
}

/// The `resolution` label value of a storage policy: the part before `:` (`10s:2d` →
/// `10s`), or, with no policy, `resolution_ms` written as `500ms`, `10s`, `1m` or `1h`.
pub fn resolution_label(storage_policy: &str, resolution_ms: u32) -> Option<String> {
    let policy = storage_policy.trim();
    if !policy.is_empty() {
        let resolution = policy.split(':').next().unwrap_or(policy).trim();
        if !resolution.is_empty() {
            return Some(resolution.to_owned());
        }
    }
    match resolution_ms {
        0 => None,
        ms if ms % 3_600_000 == 0 => Some(format!("{}h", ms / 3_600_000)),
        ms if ms % 60_000 == 0 => Some(format!("{}m", ms / 60_000)),
        ms if ms % 1_000 == 0 => Some(format!("{}s", ms / 1_000)),
        ms => Some(format!("{ms}ms")),
    }
}

/// Writes `value` as Go's `strconv.FormatFloat(value, 'g', -1, 64)` does, the form
/// Prometheus' client libraries (and so statsd_exporter) give an `le` label: the shortest
/// digits that read back exactly, in exponent form (`1e-05`, `1e+06`) when the exponent is
/// below -4 or at least 6.
pub fn write_go_float(out: &mut String, value: f64) {
    use std::fmt::Write;
    if !value.is_finite() {
        out.push_str(if value.is_nan() {
            "NaN"
        } else if value > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        });
        return;
    }
    if value == 0.0 {
        out.push_str(if value.is_sign_negative() { "-0" } else { "0" });
        return;
    }
    // Rust's `{:e}` gives the shortest digits that read back exactly: `-d.ddde-x`.
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` has an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` exponent is an integer");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if value < 0.0 {
        out.push('-');
    }
    if !(-4..6).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
        return;
    }
    let point = exponent + 1;
    let digit_count = digits.len() as i32;
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(&digits);
    } else if point >= digit_count {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (point - digit_count) as usize));
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
}

#[cfg(test)]
mod tests {
    /// The `le` values Go's client libraries write (strconv.FormatFloat(v, 'g', -1, 64)).
    #[test]
    fn floats_are_written_as_go_writes_an_le_label() {
        for (value, go) in [
            (0.005, "0.005"),
            (0.25, "0.25"),
            (1.0, "1"),
            (2.5, "2.5"),
            (10.0, "10"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e21, "1e+21"),
            (-0.5, "-0.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::INFINITY, "+Inf"),
        ] {
            let mut out = String::new();
            super::write_go_float(&mut out, value);
            assert_eq!(out, go, "{value}");
        }
    }
}
