//! The naming rule every exported metric follows, checked:
//! `tessera_<daemon>_<noun>[_<unit>]`, `_total` only on counters (the text
//! format adds it to a counter's samples, so no family name ends with it),
//! times in `_seconds` and sizes in `_bytes`. Each daemon's tests run its
//! whole registry through [`naming_violations`].
//!
//! ```
//! use tessera_runtime::telemetry::naming::naming_violations;
//!
//! let text = "# TYPE tessera_x_flush_duration_seconds histogram\n# TYPE tessera_x_queue_size gauge\n";
//! assert!(naming_violations(text, "x").is_empty());
//! let bad = "# TYPE tessera_y_flush_duration histogram\n# TYPE tessera_x_drops_total counter\n";
//! let violations = naming_violations(bad, "x");
//! // tessera_y_…: not the daemon's prefix, and a time without `_seconds`; tessera_x_drops_total: `_total`.
//! assert_eq!(violations.len(), 3, "{violations:?}");
//! ```

/// Families of a daemon exempt from the prefix: shared by every daemon.
const SHARED: [&str; 2] = ["tessera_build_info", "tessera_build"];

/// Words that make a family a time (it must end in `_seconds`) or a size (`_bytes`).
const TIME_WORDS: [&str; 5] = ["duration", "latency", "lag", "_age", "_time"];

/// Every family in `exposition` (Prometheus or OpenMetrics text, `# TYPE` lines) that
/// breaks the rule for `daemon`, with why; `process_*` families are the standard ones.
pub fn naming_violations(exposition: &str, daemon: &str) -> Vec<String> {
    let prefix = format!("tessera_{daemon}_");
    let mut violations = Vec::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        if name.starts_with("process_") || SHARED.contains(&name) {
            continue;
        }
        let mut broken = |why: &str| violations.push(format!("{name} ({kind}): {why}"));
        if !name.starts_with(&prefix) {
            broken(&format!("does not start with `{prefix}`"));
        }
        if name.ends_with("_total") {
            broken("ends with `_total` (a counter's samples get it; other kinds never)");
        }
        if !name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_') {
            broken("is not snake_case");
        }
        let noun = name.strip_prefix(&prefix).unwrap_or(name);
        if kind != "counter" && TIME_WORDS.iter().any(|word| noun.contains(word)) && !noun.ends_with("_seconds") {
            broken("measures a time but does not end in `_seconds`");
        }
        if noun.contains("bytes") && !noun.ends_with("_bytes") && kind != "counter" {
            broken("measures a size but does not end in `_bytes`");
        }
        if noun.starts_with(&format!("{daemon}_")) {
            broken(&format!("repeats `{daemon}`"));
        }
    }
    violations
}

/// For a daemon's tests: the families `telemetry` exports for `daemon`, or every family
/// that breaks the rule (see [`naming_violations`]).
pub fn check_registry(telemetry: &crate::Telemetry, daemon: &str) -> Result<usize, Vec<String>> {
    let text = telemetry.encode().map_err(|error| vec![format!("cannot encode the registry: {error}")])?;
    let violations = naming_violations(&text, daemon);
    if !violations.is_empty() {
        return Err(violations);
    }
    let prefix = format!("# TYPE tessera_{daemon}_");
    Ok(text.lines().filter(|line| line.starts_with(&prefix)).count())
}
