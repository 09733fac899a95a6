//! The naming rule every exported metric follows, checked:
//! `tessera_<daemon>_<noun>[_<unit>]`, `_total` only on counters (the text
//! format adds it to a counter's samples, so no family name ends with it),
//! times in `_seconds` and sizes in `_bytes`. Each daemon's tests run its
//! whole registry through [`assert_exports`]: the rule, and the daemon's list of
//! every family it exports (`docs/metrics/<daemon>.txt`).
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

/// Every family `exposition` declares, as `name type` lines, sorted; `process_*`
/// families left out (the standard ones, platform-dependent).
pub fn exported_families(exposition: &str) -> Vec<String> {
    let mut families: Vec<String> = exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter(|family| !family.starts_with("process_"))
        .map(str::to_owned)
        .collect();
    families.sort();
    families
}

/// For a daemon's tests: registers the daemon's metrics through `register`, then checks
/// that every exported family follows the rule (see [`naming_violations`]) and that the
/// families are exactly those of `listed` (a `name type` line each, `#` comments and
/// blank lines skipped: the daemon's list in `docs/metrics/`), so that a metric added,
/// renamed or lost (a stage's whole set forgotten at registration) shows in review.
///
/// # Panics
///
/// On a violation or a difference, with the families exported.
pub fn assert_exports(daemon: &str, register: impl FnOnce(&mut crate::telemetry::Registry), listed: &str) {
    let telemetry = crate::Telemetry::new(daemon, "test");
    telemetry.with_registry(register);
    let text = telemetry.encode().expect("the registry encodes");
    let violations = naming_violations(&text, daemon);
    assert!(violations.is_empty(), "metrics that break the naming rule:\n{}", violations.join("\n"));
    let exported = exported_families(&text);
    let mut expected: Vec<&str> =
        listed.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')).collect();
    expected.sort_unstable();
    let missing: Vec<&&str> = expected.iter().filter(|line| !exported.iter().any(|family| family == **line)).collect();
    let unlisted: Vec<&String> = exported.iter().filter(|family| !expected.contains(&family.as_str())).collect();
    assert!(
        missing.is_empty() && unlisted.is_empty(),
        "the {daemon}'s metrics differ from its list\nlisted, not exported: {missing:#?}\nexported, not listed: \
         {unlisted:#?}\nevery family exported:\n{}",
        exported.join("\n")
    );
}
