//! Fuzzes the statsd parser, series ids and table folding on arbitrary
//! datagrams, and checks that the collector's fast path (simple lines
//! folded in place) folds every datagram into the same series as the full
//! parser does. Every accepted line's series also goes through a rule set
//! (a mapping file with glob and regex rules, allow/deny, tag rules, a
//! rollup, global tags, a prefix and a limit): rules never panic, and every
//! id they give parses back into a name and tags. The fast path is checked
//! with every name tag style on (the default) and with every one off.
//!
//! Seeds, one file per tag style (`fuzz/seeds/parse/`): run
//! `cargo fuzz run parse corpus/parse seeds/parse -s none` from `fuzz/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_core::aggregate::Aggregate;
use tessera_core::parse::{MetricKind, ParseOptions, Parsed, parse_datagram, parse_datagram_with};
use tessera_core::series::SeriesKey;
use tessera_core::table::{Table, TableOptions};
use tessera_rules::{MappingFile, RuleMetrics, RuleSet};

/// Every kind of rule once, shared with the rules' property test.
const MAPPING: &str = include_str!("../../crates/rules/tests/data/every_rule.yml");
const RULES: &str = include_str!("../../crates/rules/tests/data/every_rule.toml");

fn rules() -> &'static RuleSet {
    static RULES_SET: std::sync::OnceLock<RuleSet> = std::sync::OnceLock::new();
    RULES_SET.get_or_init(|| {
        let mapping = MappingFile::from_yaml(MAPPING).expect("the fuzz mapping file loads");
        let config = toml::from_str(RULES).expect("the fuzz rules parse");
        RuleSet::compile(Some(mapping), &config, &RuleMetrics::default()).expect("the fuzz rules compile")
    })
}

fn cut(table: &mut Table) -> Vec<(Vec<u8>, MetricKind, Aggregate)> {
    let mut out = Vec::new();
    table.cut(|kind, id, aggregate| {
        assert!(!id.is_empty());
        let _ = aggregate.to_proto();
        out.push((id.to_vec(), kind, aggregate.clone()));
    });
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

fuzz_target!(|data: &[u8]| {
    let mut key = SeriesKey::default();
    let options = TableOptions { max_series: Some(64), ..TableOptions::default() };
    let mut full = Table::new(options);
    parse_datagram(data, |parsed| {
        if let Parsed::Metric(line) = parsed {
            assert!(!line.name.is_empty());
            assert!(line.sample_rate > 0.0 && line.sample_rate <= 1.0);
            for value in line.values() {
                assert!(value.value.is_finite());
            }
            key.build(&line).expect("accepted lines have at most MAX_TAGS tags");
            let (name, _) = tessera_core::series::split_id(key.id());
            assert!(!name.is_empty(), "{:?}", String::from_utf8_lossy(key.id()));
            let outcome = rules().apply(line.kind, key.id());
            for id in outcome.targets.new_ids() {
                let (name, _) = tessera_core::series::split_id(id);
                assert!(name.starts_with(b"f_"), "{:?}", String::from_utf8_lossy(id));
            }
            rules().release_outcome(&outcome, key.id());
            let _ = full.observe(&line, 0);
        }
    });
    let mut fast = Table::new(options);
    fast.fold_datagram(data, ParseOptions::default(), 0, |_| {});
    let (fast, full) = (cut(&mut fast), cut(&mut full));
    // NaN sums never occur (values are finite), so equality is exact.
    assert_eq!(fast, full, "the fast path folds differently");

    // With every name tag style off, the bytes of name tags are name bytes.
    let styles_off =
        ParseOptions { influxdb_tags: false, librato_tags: false, signalfx_tags: false, ..ParseOptions::default() };
    let mut full = Table::new(options);
    parse_datagram_with(data, styles_off, |parsed| {
        if let Parsed::Metric(line) = parsed {
            assert!(!line.has_tags_beyond_tag_field() || !line.container_id.is_empty());
            let _ = full.observe(&line, 0);
        }
    });
    let mut fast = Table::new(options);
    fast.fold_datagram(data, styles_off, 0, |_| {});
    assert_eq!(cut(&mut fast), cut(&mut full), "the fast path folds differently with name tag styles off");
});
