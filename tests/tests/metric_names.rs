//! Every metric name the project mentions is one a daemon exports: the live page's
//! charts, the Grafana dashboards, the compose test, the load scripts, the README and
//! the tests all name metrics as text, and a rename that forgets one of them leaves a
//! chart empty or a check that can never fail. The daemons' own tests hold each daemon
//! to its list in `docs/metrics/<daemon>.txt`; this test holds every mention to the lists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const DAEMONS: [&str; 3] = ["collector", "aggregator", "ingester"];

/// What the text format adds to a family's name on its samples.
const SAMPLE_SUFFIXES: [&str; 5] = ["_total", "_bucket", "_count", "_sum", "_created"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The families each daemon's list names.
fn listed_families() -> BTreeSet<String> {
    let mut families = BTreeSet::new();
    for daemon in DAEMONS {
        let path = root().join(format!("docs/metrics/{daemon}.txt"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let names = text.lines().filter(|line| !line.trim().is_empty() && !line.starts_with('#'));
        families.extend(names.filter_map(|line| line.split_whitespace().next()).map(str::to_owned));
    }
    families
}

/// Every `tessera_<daemon>_<noun>` in `text`: a name written in full, not a pattern
/// (`tessera_collector_{a,b}_total` and `..._` stop before the brace or at the underscore).
fn mentioned_names(text: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for daemon in DAEMONS {
        let prefix = format!("tessera_{daemon}_");
        let mut rest = text;
        while let Some(at) = rest.find(&prefix) {
            let preceded = text.len() - rest.len() + at;
            let tail = &rest[at..];
            let len =
                tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
            let name = &tail[..len];
            let word_start = preceded == 0
                || !(text.as_bytes()[preceded - 1].is_ascii_alphanumeric() || text.as_bytes()[preceded - 1] == b'_');
            if word_start && name.len() > prefix.len() && !name.ends_with('_') {
                names.push(name);
            }
            rest = &tail[len.max(1)..];
        }
    }
    names
}

/// Whether `name` is a listed family or one of its samples.
fn is_exported(name: &str, families: &BTreeSet<String>) -> bool {
    families.contains(name)
        || SAMPLE_SUFFIXES
            .iter()
            .any(|suffix| name.strip_suffix(suffix).is_some_and(|family| families.contains(family)))
}

/// The files that may mention metrics: everything git tracks that is text, except the
/// lists themselves, BENCHMARKS.md (figures as measured then, under the names of then)
/// and test data.
fn mentioning_files() -> Vec<PathBuf> {
    let output = std::process::Command::new("git")
        .args(["ls-files"])
        .current_dir(root())
        .output()
        .expect("git runs in the checkout");
    assert!(output.status.success(), "git ls-files failed");
    String::from_utf8(output.stdout)
        .expect("git prints paths as UTF-8")
        .lines()
        .filter(|path| !path.starts_with("docs/metrics/") && *path != "BENCHMARKS.md" && !path.contains("/tests/data/"))
        .map(|path| root().join(path))
        .collect()
}

#[test]
fn every_metric_the_project_mentions_is_exported_by_a_daemon() {
    let families = listed_families();
    assert!(families.len() > 100, "{} families listed", families.len());
    let mut unknown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut mentions = 0;
    for file in mentioning_files() {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for line in text.lines() {
            // The README's table of renames names the old names in its first column.
            let checked = match line.strip_prefix("| `tessera_") {
                Some(_) => line.splitn(3, '|').nth(2).unwrap_or_default(),
                None => line,
            };
            for name in mentioned_names(checked) {
                mentions += 1;
                if !is_exported(name, &families) {
                    let relative = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
                    unknown.entry(relative).or_default().insert(name.to_owned());
                }
            }
        }
    }
    assert!(mentions > 300, "only {mentions} mentions found");
    assert!(
        unknown.is_empty(),
        "metrics mentioned that no daemon exports (docs/metrics lists what they do):\n{unknown:#?}"
    );
}

#[test]
fn names_are_found_whole_and_samples_count_as_their_family() {
    let text = "rate(tessera_collector_lines_received_total[1m]) tessera_collector_{a,b}_total \
                my_tessera_ingester_x `..._queue_bytes` tessera_aggregator_flush_lag_seconds_bucket";
    assert_eq!(
        mentioned_names(text),
        ["tessera_collector_lines_received_total", "tessera_aggregator_flush_lag_seconds_bucket"]
    );
    let families: BTreeSet<String> =
        ["tessera_collector_lines_received", "tessera_aggregator_flush_lag_seconds"].map(str::to_owned).into();
    assert!(mentioned_names(text).iter().all(|name| is_exported(name, &families)));
    // Built from pieces, so that the scan of this file does not read it as a mention.
    let unknown = ["tessera_collector", "_lines_received_seconds"].concat();
    assert!(!is_exported(&unknown, &families));
}
