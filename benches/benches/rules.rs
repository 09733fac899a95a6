//! The collector's rules: what a new series costs (a cache miss: the mapping file's glob
//! tree, then its regex rules, then the rules), and what a known series costs at each cut
//! (a cache hit), in series per second.
//!
//! The mapping file is the load benchmarks' (`RULES=1` in `benches/load/lib.sh`): 50 glob
//! rules that miss every name here, and one regex rule that maps them all, the worst case
//! for a series. A third figure takes a glob rule that matches, the common case. A fourth
//! takes a file of 50 regex rules that a name misses: what the one search of them all
//! (a `RegexSet`) costs a new series that no rule maps.
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::sync::Arc;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use tessera_core::parse::MetricKind;
use tessera_rules::RulesConfig;
use tessera_rules::{MappingFile, RuleCache, RuleMetrics, RuleSet, RulesHandle};

const SERIES: usize = 10_000;

/// The load benchmarks' mapping file, with one more glob rule that matches `app.*.*`.
fn mapping() -> MappingFile {
    let mut text = String::from("mappings:\n");
    for i in 1..=50 {
        text.push_str(&format!(
            "- match: \"app{i}.*.requests\"\n  name: \"app{i}_requests\"\n  labels:\n    route: \"$1\"\n"
        ));
    }
    text.push_str("- match: \"app.*.*\"\n  name: \"app_${1}\"\n  labels:\n    n: \"$2\"\n");
    text.push_str(
        "- match: 'loadgen\\.(counter|gauge)\\.(\\d+)'\n  match_type: regex\n  name: \"loadgen_${1}_${2}\"\n",
    );
    text.push_str("  labels:\n    mapped: \"regex\"\n");
    MappingFile::from_yaml(&text).expect("the benchmark's mapping file loads")
}

/// 50 regex rules, none of which maps `other.metric.N`.
fn regex_mapping() -> MappingFile {
    let mut text = String::from("mappings:\n");
    for i in 1..=50 {
        text.push_str(&format!(
            "- match: '^svc{i}\\.(\\w+)\\.latency$'\n  match_type: regex\n  name: \"svc{i}_latency\"\n  labels:\n    op: \"$1\"\n"
        ));
    }
    MappingFile::from_yaml(&text).expect("the regex mapping file loads")
}

fn ids(pattern: &str) -> Vec<Vec<u8>> {
    (0..SERIES).map(|i| pattern.replace("{}", &i.to_string()).into_bytes()).collect()
}

fn bench_rules(c: &mut Criterion) {
    let set = RuleSet::compile(Some(mapping()), &RulesConfig::default(), &RuleMetrics::default()).unwrap();
    let mut group = c.benchmark_group("rules");
    group.throughput(Throughput::Elements(SERIES as u64));
    for (what, pattern) in [("new_series_regex", "loadgen.counter.{}"), ("new_series_glob", "app.requests.{}")] {
        let ids = ids(pattern);
        group.bench_function(what, |b| {
            b.iter(|| {
                for id in &ids {
                    black_box(set.apply(MetricKind::Counter, black_box(id)));
                }
            })
        });
    }
    let regex_set = RuleSet::compile(Some(regex_mapping()), &RulesConfig::default(), &RuleMetrics::default()).unwrap();
    let misses = ids("other.metric.{}");
    group.bench_function("new_series_regex_miss_50", |b| {
        b.iter(|| {
            for id in &misses {
                black_box(regex_set.apply(MetricKind::Counter, black_box(id)));
            }
        })
    });
    let handle = Arc::new(RulesHandle::new(set));
    let mut cache = RuleCache::new(handle, RuleMetrics::default(), i64::MAX);
    let ids = ids("loadgen.counter.{}");
    let mut window = 0;
    group.bench_function("known_series", |b| {
        b.iter(|| {
            window += 1000;
            let mut cut = cache.begin(window).expect("rules in force");
            for id in &ids {
                cut.route(MetricKind::Counter, id, |target| {
                    black_box(target);
                });
            }
            cut.finish()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_rules);
criterion_main!(benches);
