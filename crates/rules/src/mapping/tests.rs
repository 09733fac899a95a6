//! Tests of the mapping module: statsd_exporter's documented examples, its
//! `pkg/mapper/mapper_test.go` cases, and tessera's errors and notes.
//!
//! "README" below is statsd_exporter's README.md, section "Metric Mapping and
//! Configuration" and its subsections; "mapper_test" is
//! `pkg/mapper/mapper_test.go` (`TestMetricMapperYAML`, `TestAction`,
//! `TestMultipleMatches`).
//!
//! The README examples' mapping files are in `tests/data/statsd_exporter_readme/`, read
//! here and by the end-to-end test (`tests/tests/rules.rs` at the workspace root).

use proptest::prelude::*;
use tessera_core::parse::MetricKind;

use std::sync::Arc;

use tessera_core::aggregate::Observer;

use super::{MapOutcome, Mapped, MappingError, MappingFile};

fn load(yaml: &str) -> MappingFile {
    match MappingFile::from_yaml(yaml) {
        Ok(file) => file,
        Err(error) => panic!("mapping file refused: {error}\n{yaml}"),
    }
}

/// A mapped name and its labels, or `None` when the name is unmapped.
type Outcome = Option<(String, Vec<(String, String)>)>;

/// Maps `name` as `kind`: `Some((name, labels))`, or `None` when unmapped.
fn map_kind(file: &MappingFile, name: &str, kind: MetricKind) -> Outcome {
    let mut out = Mapped::default();
    match file.map(name, kind, &mut out) {
        MapOutcome::Mapped { .. } => Some((out.name, out.labels)),
        _ => None,
    }
}

fn map(file: &MappingFile, name: &str) -> Outcome {
    map_kind(file, name, MetricKind::Counter)
}

/// Asserts what each `(name, due)` of `cases` maps to as a counter (`None`: unmapped).
fn assert_maps(file: &MappingFile, cases: &[(&str, Outcome)]) {
    for (name, due) in cases {
        assert_eq!(&map(file, name), due, "{name}");
    }
}

fn expect(name: &str, labels: &[(&str, &str)]) -> Outcome {
    let labels = labels.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
    Some((name.to_owned(), labels))
}

fn refused(yaml: &str) -> MappingError {
    match MappingFile::from_yaml(yaml) {
        Ok(_) => panic!("mapping file accepted:\n{yaml}"),
        Err(error) => error,
    }
}

/// The `(mapping, line, key)` of an `Invalid` error.
fn invalid_at(yaml: &str) -> (Option<usize>, Option<usize>, String) {
    match refused(yaml) {
        MappingError::Invalid { mapping, line, key, .. } => (mapping, line, key),
        other => panic!("expected an invalid value, got {other}"),
    }
}

/// README, "Metric Mapping and Configuration": the first example mapping
/// and its three documented translations.
#[test]
fn readme_first_example() {
    let file = load(include_str!("../../tests/data/statsd_exporter_readme/first.yml"));
    let dispatcher =
        [("processor", "FooProcessor"), ("action", "send"), ("outcome", "success"), ("job", "test_dispatcher")];
    let signup = [("provider", "facebook"), ("outcome", "failure"), ("job", "foo_product_server")];
    assert_maps(
        &file,
        &[
            ("test.dispatcher.FooProcessor.send.success", expect("dispatcher_events_total", &dispatcher)),
            ("foo_product.signup.facebook.failure", expect("signup_events_total", &signup)),
            // `test.web-server.foo.bar => test_web_server_foo_bar{}`: no rule, the
            // default name handling applies.
            ("test.web-server.foo.bar", None),
        ],
    );
}

/// README: dynamic names, glob (`"${2}_total"`) and the regex form of it.
#[test]
fn readme_dynamic_names_glob_and_regex() {
    let glob = load(include_str!("../../tests/data/statsd_exporter_readme/dynamic_names_glob.yml"));
    let regex = load(include_str!("../../tests/data/statsd_exporter_readme/dynamic_names_regex.yml"));
    for file in [&glob, &regex] {
        assert_eq!(map(file, "test.aws.requests.counter"), expect("requests_total", &[("provider", "aws")]));
    }
    // README: "Be aware about yaml escape rules": `\.` in double quotes is
    // invalid YAML.
    let error = refused(
        "mappings:\n- match: \"test\\.(\\w+)\\.(\\w+)\\.counter\"\n  match_type: regex\n  name: \"${2}_total\"\n",
    );
    assert!(matches!(error, MappingError::Yaml(_)), "{error}");
}

/// README, "Regular expression matching".
#[test]
fn readme_regex_example() {
    let file = load(include_str!("../../tests/data/statsd_exporter_readme/regex.yml"));
    assert_eq!(
        map(&file, "web1.api--http.status.200.count"),
        expect("request_total", &[("hostname", "web1"), ("exec", "api"), ("protocol", "http"), ("code", "200")])
    );
}

/// README, "StatsD timers" / "Global defaults": timer settings are read,
/// noted, and the labels map as documented.
#[test]
fn readme_timer_and_defaults_examples() {
    let file = load(include_str!("../../tests/data/statsd_exporter_readme/timers_and_defaults.yml"));
    assert_eq!(
        map_kind(&file, "test.timing.api.aws.ok", MetricKind::Timer),
        expect("my_timer", &[("provider", "aws"), ("outcome", "ok"), ("job", "api_server")])
    );
    assert_eq!(
        map_kind(&file, "other.timing.db.gcp.fail", MetricKind::Distribution),
        expect("other_timer", &[("provider", "gcp"), ("outcome", "fail"), ("job", "db_server_other")])
    );
    // "This will be a histogram using the buckets set in `defaults`"; "this will be a summary
    // timer", with its quantile.
    let mut scratch = Mapped::default();
    let defaults = Observer::Histogram(Arc::from([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]));
    assert_eq!(file.observer("test.timing.api.aws.ok", MetricKind::Timer, &mut scratch), Some(defaults.clone()));
    assert_eq!(
        file.observer("other.timing.db.gcp.fail", MetricKind::Timer, &mut scratch),
        Some(Observer::Summary(Arc::from([0.99])))
    );
    assert_eq!(
        file.observer("unmapped.timer", MetricKind::Histogram, &mut scratch),
        Some(defaults),
        "defaults apply to names no mapping matches"
    );
    assert_eq!(file.observer("test.timing.api.aws.ok", MetricKind::Counter, &mut scratch), None, "observers only");
    let notes = file.notes().join("\n");
    assert!(!notes.contains("buckets:") && !notes.contains("observer_type"), "both are used: {notes}");
    for wanted in [
        "defaults (line 7): ttl: `0ns`",
        "mappings[1] (line 24): summary_options: 1 quantile objectives: their `error` is not used",
        "mappings[1] (line 24): summary_options: max_age / age_buckets / buf_cap",
    ] {
        assert!(notes.contains(wanted), "missing note {wanted:?} in\n{notes}");
    }
}

/// README, "`drop` action", and mapper_test "Config that has a catch-all to
/// drop all".
#[test]
fn readme_drop_example() {
    let file = load(include_str!("../../tests/data/statsd_exporter_readme/drop.yml"));
    assert_eq!(
        map(&file, "test.timing.a.b.c"),
        expect("my_timer", &[("provider", "b"), ("outcome", "c"), ("job", "a_server")])
    );
    let mut out = Mapped::default();
    assert_eq!(file.map("anything.else", MetricKind::Gauge, &mut out), MapOutcome::Drop { rule: 1 });
    assert!(out.name.is_empty() && out.labels.is_empty());
    // A drop rule needs no name.
    let file = load("mappings:\n- match: debug.*\n  action: drop\n");
    assert_eq!(file.map("debug.x", MetricKind::Counter, &mut out), MapOutcome::Drop { rule: 0 });
}

/// README, "Explicit metric type mapping", and mapper_test "Config with
/// multiple explicit metric types".
#[test]
fn match_metric_type_selects_by_kind() {
    let file = load(include_str!("../../tests/data/statsd_exporter_readme/explicit_metric_type.yml"));
    assert_eq!(map_kind(&file, "test.foo.x", MetricKind::Counter), expect("test_foo_sum", &[]));
    assert_eq!(map_kind(&file, "test.foo.x", MetricKind::Gauge), expect("test_foo_current", &[]));
    for kind in [MetricKind::Timer, MetricKind::Histogram, MetricKind::Distribution] {
        assert_eq!(map_kind(&file, "test.foo.x", kind), expect("test_foo_seconds", &[]));
    }
    assert_eq!(map_kind(&file, "test.bar.x", MetricKind::Gauge), expect("bar_gauge", &[]));
    assert_eq!(map_kind(&file, "test.bar.x", MetricKind::Counter), None);
    // Older files say `timer`.
    let file = load("mappings:\n- match: t.*\n  name: t\n  match_metric_type: timer\n");
    assert_eq!(map_kind(&file, "t.x", MetricKind::Timer), expect("t", &[]));
    assert_eq!(map_kind(&file, "t.x", MetricKind::Counter), None);
}

/// statsd_exporter has no sets; no rule ever maps one.
#[test]
fn sets_are_never_mapped() {
    let file = load("mappings:\n- match: \"*.*\"\n  name: any\n- match: \".\"\n  match_type: regex\n  action: drop\n");
    let mut out = Mapped::default();
    assert_eq!(file.map("users.unique", MetricKind::Set, &mut out), MapOutcome::NoMatch);
}

/// mapper_test "Config with several mapping definitions".
#[test]
fn mapper_test_several_definitions() {
    let file = load(
        r#"---
mappings:
- match: test.dispatcher.*.*.*
  name: "dispatch_events"
  labels:
    processor: "$1"
    action: "$2"
    result: "$3"
    job: "test_dispatcher"
- match: test.my-dispatch-host01.name.dispatcher.*.*.*
  name: "host_dispatch_events"
  labels:
    processor: "$1"
    action: "$2"
    result: "$3"
    job: "test_dispatcher"
- match: request_time.*.*.*.*.*.*.*.*.*.*.*.*
  name: "tyk_http_request"
  labels:
    method_and_path: "${1}"
    response_code: "${2}"
    apikey: "${3}"
    apiversion: "${4}"
    apiname: "${5}"
    apiid: "${6}"
    ipv4_t1: "${7}"
    ipv4_t2: "${8}"
    ipv4_t3: "${9}"
    ipv4_t4: "${10}"
    orgid: "${11}"
    oauthid: "${12}"
- match: "*.*"
  name: "catchall"
  labels:
    first: "$1"
    second: "$2"
    third: "$3"
    job: "$1-$2-$3"
- match: (.*)\.(.*)-(.*)\.(.*)
  match_type: regex
  name: "proxy_requests_total"
  labels:
    job: "$1"
    protocol: "$2"
    endpoint: "$3"
    result: "$4"
"#,
    );
    let dispatch =
        [("processor", "FooProcessor"), ("action", "send"), ("result", "succeeded"), ("job", "test_dispatcher")];
    // The last component of the tyk line is empty: `*` matches it, and the empty
    // `oauthid` is left out (Prometheus: an empty label is an absent label).
    let tyk = [
        ("method_and_path", "get/threads/1/posts"),
        ("response_code", "200"),
        ("apikey", "00000000"),
        ("apiversion", "nonversioned"),
        ("apiname", "discussions"),
        ("apiid", "a11bbcdf0ac64ec243658dc64b7100fb"),
        ("ipv4_t1", "172"),
        ("ipv4_t2", "20"),
        ("ipv4_t3", "0"),
        ("ipv4_t4", "1"),
        ("orgid", "12ba97b7eaa1a50001000001"),
    ];
    let tyk_line = "request_time.get/threads/1/posts.200.00000000.nonversioned.discussions.\
                    a11bbcdf0ac64ec243658dc64b7100fb.172.20.0.1.12ba97b7eaa1a50001000001.";
    let proxy = [("job", "proxy-1"), ("protocol", "http"), ("endpoint", "goober"), ("result", "success")];
    assert_maps(
        &file,
        &[
            ("test.dispatcher.FooProcessor.send.succeeded", expect("dispatch_events", &dispatch)),
            (
                "test.my-dispatch-host01.name.dispatcher.FooProcessor.send.succeeded",
                expect("host_dispatch_events", &dispatch),
            ),
            (tyk_line, expect("tyk_http_request", &tyk)),
            ("foo.bar", expect("catchall", &[("first", "foo"), ("second", "bar"), ("job", "foo-bar-")])),
            ("foo.bar.baz", None),
            ("proxy-1.http-goober.success", expect("proxy_requests_total", &proxy)),
        ],
    );
    // `$3` of a two-wildcard glob is always empty: noted.
    assert!(
        file.notes().iter().any(|note| note.contains("mappings[3] (line 34): labels.third: `$3` refers to no capture"))
    );
}

/// mapper_test "Config with backtracking" and "Config with super sets,
/// disables ordering": with `glob_disable_ordering`, literal beats `*`.
#[test]
fn glob_disable_ordering_prefers_literals() {
    let file = load(
        r#"
defaults:
  glob_disable_ordering: true
mappings:
- match: backtrack.*.bbb
  name: "testb"
  labels:
    label: "${1}_foo"
- match: backtrack.justatest.aaa
  name: "testa"
  labels:
    label: "${1}_foo"
"#,
    );
    assert_eq!(map(&file, "backtrack.good.bbb"), expect("testb", &[("label", "good_foo")]));
    assert_eq!(map(&file, "backtrack.justatest.bbb"), expect("testb", &[("label", "justatest_foo")]));
    assert_eq!(map(&file, "backtrack.justatest.aaa"), expect("testa", &[("label", "_foo")]));

    let file = load(
        r#"
defaults:
  glob_disable_ordering: true
mappings:
- match: noorder.*.*
  name: "testa"
- match: noorder.*.bbb
  name: "testb"
- match: noorder.ccc.bbb
  name: "testc"
"#,
    );
    assert_eq!(map(&file, "noorder.good.bbb"), expect("testb", &[]));
    assert_eq!(map(&file, "noorder.ccc.bbb"), expect("testc", &[]));
    assert_eq!(map(&file, "noorder.ccc.zzz"), expect("testa", &[]));
}

/// mapper_test "Config with super sets, keeps ordering" and "Config with
/// backtracking, the non-matched rule has star(s)": by default the first
/// rule in the file wins, and a rule that fails late leaves no captures.
#[test]
fn glob_ordering_first_rule_wins() {
    let file = load(
        "mappings:\n- match: order.*.*\n  name: testa\n  labels:\n    label: \"${1}_foo\"\n- match: order.*.bbb\n  name: testb\n",
    );
    assert_eq!(map(&file, "order.good.bbb"), expect("testa", &[("label", "good_foo")]));

    let file = load(
        r#"
defaults:
  glob_disable_ordering: false
mappings:
- match: '*.dummy.*'
  name: metric_one
  labels:
    system: $1
    attribute: $2
- match: 'full.name.*'
  name: metric_two
  labels:
    system: static
    attribute: $1
"#,
    );
    assert_eq!(
        map(&file, "whatever.dummy.test"),
        expect("metric_one", &[("system", "whatever"), ("attribute", "test")])
    );
    assert_eq!(
        map(&file, "full.name.anothertest"),
        expect("metric_two", &[("system", "static"), ("attribute", "anothertest")])
    );

    // README "Choosing between glob or regex": the four-rule edge case.
    let file = load(
        "mappings:\n- match: a.*.*.*.*\n  name: r0\n- match: a.b.*.*.*\n  name: r1\n- match: a.b.c.*.*\n  name: r2\n- match: a.b.c.d.*\n  name: r3\n",
    );
    let mut out = Mapped::default();
    assert_eq!(file.map("a.b.c.d.e", MetricKind::Counter, &mut out), MapOutcome::Mapped { rule: 0 });
    assert_eq!(file.map("a.x.c.d.e", MetricKind::Counter, &mut out), MapOutcome::Mapped { rule: 0 });
}

/// Glob rules are tried before regex rules, wherever they are.
#[test]
fn globs_before_regexes() {
    let yaml =
        "mappings:\n- match: \"^a\\\\.\"\n  match_type: regex\n  name: by_regex\n- match: a.*\n  name: by_glob\n";
    let file = load(yaml);
    assert_eq!(map(&file, "a.b"), expect("by_glob", &[]));
    assert_eq!(map(&file, "a.b.c"), expect("by_regex", &[]));
    assert!(file.notes().iter().any(|note| note.starts_with("mappings[0] (line 3): match_type: glob rules are tried")));
    // Regex rules among themselves: file order.
    let file =
        load("defaults:\n  match_type: regex\nmappings:\n- match: x\n  name: first\n- match: xy\n  name: second\n");
    assert_eq!(map(&file, "xy"), expect("first", &[]));
}

/// mapper_test "Config with bad regex reference" / "good regex reference" /
/// "dynamic metric name" / "Config with labels from glob" /
/// `TestMultipleMatches`.
#[test]
fn templates_like_statsd_exporter() {
    let file = load("mappings:\n- match: test.*\n  name: \"name\"\n  labels:\n    label: \"$1_foo\"\n");
    // `$1_foo` is `${1_foo}`: always empty, so the label is left out.
    assert_eq!(map(&file, "test.a"), expect("name", &[]));
    let note = file.notes().join("\n");
    assert!(note.contains("write `${1}_foo` for capture 1"), "{note}");

    let file = load("mappings:\n- match: test.*\n  name: \"name\"\n  labels:\n    label: \"${1}_foo\"\n");
    assert_eq!(map(&file, "test.a"), expect("name", &[("label", "a_foo")]));

    let file = load(
        "mappings:\n- match: test1.*.*\n  name: \"$1\"\n  labels: {}\n- match: test2.*.*\n  name: \"${1}_$2\"\n- match: test3\\.(\\w+)\\.(\\w+)\n  match_type: regex\n  name: \"${2}_$1\"\n",
    );
    assert_eq!(map(&file, "test1.total_requests.count"), expect("total_requests", &[]));
    assert_eq!(map(&file, "test2.total_requests.count"), expect("total_requests_count", &[]));
    assert_eq!(map(&file, "test3.total_requests.count"), expect("count_total_requests", &[]));

    let file = load(
        "mappings:\n- match: p.*.*.c.*\n  match_type: glob\n  name: issue_256\n  labels:\n    one: $1\n    two: $2\n    three: $3\n",
    );
    assert_eq!(
        map(&file, "p.one.two.c.three"),
        expect("issue_256", &[("one", "one"), ("two", "two"), ("three", "three")])
    );

    let file = load("mappings:\n- match: aa.bb.*.*\n  name: \"aa_bb_${1}_total\"\n  labels:\n    app: \"$2\"\n");
    for (name, want) in [("aa.bb.aa.myapp", "aa_bb_aa_total"), ("aa.bb.cc.myapp", "aa_bb_cc_total")] {
        assert_eq!(map(&file, name), expect(want, &[("app", "myapp")]));
    }
    // Named regex groups, `$0` and `$$`.
    let file = load(
        "mappings:\n- match: \"^(?P<svc>\\\\w+)\\\\.hits$\"\n  match_type: regex\n  name: \"${1}_hits\"\n  labels:\n    svc: \"${svc}\"\n    whole: \"$0\"\n    cost: \"$$5\"\n",
    );
    assert_eq!(map(&file, "web.hits"), expect("web_hits", &[("svc", "web"), ("whole", "web.hits"), ("cost", "$5")]));
    // statsd_exporter allows only numbered references in a name.
    let (_, _, key) = invalid_at("mappings:\n- match: \"(?P<a>.)\"\n  match_type: regex\n  name: \"${a}\"\n");
    assert_eq!(key, "name");
}

/// Names are escaped like statsd_exporter's `EscapeMetricName`; label values
/// lose the characters that end a tag; an empty name is reported.
#[test]
fn output_is_usable_as_tags() {
    let file = load(
        "mappings:\n- match: \"*.x\"\n  name: \"m_$1\"\n  labels:\n    v: \"$1\"\n- match: \"*.y\"\n  name: \"$1\"\n",
    );
    assert_eq!(map(&file, "a--b.x"), expect("m_a_b", &[("v", "a--b")]));
    assert_eq!(map(&file, "a|b,c\nd.x"), expect("m_a_b_c_d", &[("v", "a_b_c_d")]));
    assert_eq!(map(&file, "ünï.x"), expect("m__n_", &[("v", "ünï")]));
    assert_eq!(map(&file, "9lives.y"), expect("_9lives", &[]));
    let mut out = Mapped::default();
    assert_eq!(file.map(".y", MetricKind::Counter, &mut out), MapOutcome::EmptyName { rule: 1 });
}

/// `honor_labels` and label values of other YAML types.
#[test]
fn honor_labels_and_scalar_values() {
    let file = load(
        "mappings:\n- match: a.*\n  name: a\n  honor_labels: true\n  labels:\n    code: 200\n    on: true\n    none:\n",
    );
    let mut out = Mapped::default();
    assert_eq!(file.map("a.b", MetricKind::Counter, &mut out), MapOutcome::Mapped { rule: 0 });
    assert!(out.honor_labels);
    assert_eq!(out.labels, [("code".to_owned(), "200".to_owned()), ("on".to_owned(), "true".to_owned())]);
}

#[test]
fn empty_files_and_rule_labels() {
    for yaml in ["", "---\n", "# nothing\n", "mappings:\n", "mappings: []\n"] {
        let file = load(yaml);
        assert_eq!(file.rules().len(), 0);
        assert_eq!(map(&file, "a.b"), None);
    }
    let file = load("mappings:\n- match: a.*\n  name: a\n- match: \"b$\"\n  match_type: regex\n  name: b\n");
    assert_eq!(file.rules().collect::<Vec<_>>(), ["a.*", "b$"]);
    assert_eq!(file.rules().len(), 2);
    assert!(file.notes().is_empty(), "{:?}", file.notes());
}

/// Several regex rules: the first of the right type in file order wins, and a name that
/// none matches maps to nothing (the one search of them all says so).
#[test]
fn several_regex_rules_keep_file_order_and_types() {
    let file = load(
        "mappings:\n\
         - match: '^a\\.(\\w+)$'\n  match_type: regex\n  match_metric_type: gauge\n  name: gauge_$1\n\
         - match: '^a\\.(\\w+)$'\n  match_type: regex\n  name: first_$1\n\
         - match: '^a\\.b$'\n  match_type: regex\n  name: second\n\
         - match: '^c\\.(\\w+)$'\n  match_type: regex\n  action: drop\n  name: dropped\n",
    );
    let mut out = Mapped::default();
    assert_eq!(file.map("a.b", MetricKind::Gauge, &mut out), MapOutcome::Mapped { rule: 0 });
    assert_eq!(out.name, "gauge_b");
    assert_eq!(file.map("a.b", MetricKind::Counter, &mut out), MapOutcome::Mapped { rule: 1 });
    assert_eq!(out.name, "first_b");
    assert_eq!(file.map("c.x", MetricKind::Counter, &mut out), MapOutcome::Drop { rule: 3 });
    assert_eq!(file.map("d.x", MetricKind::Counter, &mut out), MapOutcome::NoMatch);
    assert_eq!(file.map("a.b.c", MetricKind::Counter, &mut out), MapOutcome::NoMatch);
}

/// A mapped label tessera sets itself, or Prometheus reserves, is noted with its line and
/// what the ingester writes instead; other labels are not.
#[test]
fn reserved_label_names_are_noted() {
    let file = load(
        "mappings:\n- match: a.*\n  name: a\n  labels:\n    quantile: $1\n    route: $1\n\
         - match: b.*\n  name: b\n  labels:\n    __shard: $1\n    resolution: x\n",
    );
    let notes = file.notes().join("\n");
    assert!(notes.contains("mappings[0] (line 4): labels: `quantile` is a label tessera sets"), "{notes}");
    assert!(notes.contains("writes this label as `tag_quantile`"), "{notes}");
    assert!(notes.contains("`__shard`") && notes.contains("`resolution`"), "{notes}");
    assert!(!notes.contains("`route`"), "{notes}");
    assert_eq!(file.notes().len(), 3, "{notes}");
}

/// Every key statsd_exporter reads that tessera does not use is noted.
#[test]
fn noted_keys() {
    let file = load(
        r#"mappings:
- match: a.*
  name: a
  help: "A things"
  timer_type: histogram
  ttl: 1m20s
  histogram_options:
    buckets: [0.1, 1]
    native_histogram_bucket_factor: 1.1
    native_histogram_max_buckets: 256
- match: b.*
  name: b
  observer_type: summary
  quantiles:
    - quantile: 0.5
      error: 0.05
- match: c.*
  name: c
  buckets: [1, 2]
  scale: 1
"#,
    );
    let notes = file.notes();
    for wanted in [
        "mappings[0] (line 5): timer_type: `histogram` (`timer_type` is the deprecated name",
        "mappings[0] (line 6): ttl: `1m20s`",
        "mappings[0] (line 7): histogram_options: native_histogram_bucket_factor",
        "mappings[1] (line 14): quantiles: 1 quantile objectives: their `error` is not used",
        "mappings[2] (line 19): buckets: buckets apply to `observer_type: histogram` only",
    ] {
        assert!(notes.iter().any(|note| note.starts_with(wanted)), "missing {wanted:?} in {notes:#?}");
    }
    assert_eq!(notes.len(), 5, "{notes:#?}");
    assert_eq!(file.helps().collect::<Vec<_>>(), [("a", "A things")], "a literal name's help goes to the ingester");
    let templated = load("mappings:\n- match: a.*\n  name: x_$1\n  help: X\n");
    assert_eq!(templated.helps().count(), 0);
    assert!(templated.notes()[0].contains("help"), "{:?}", templated.notes());
    let observer = |name| file.observer(name, MetricKind::Timer, &mut Mapped::default());
    assert_eq!(observer("a.x"), Some(Observer::Histogram(Arc::from([0.1, 1.0]))), "histogram_options.buckets");
    assert_eq!(observer("b.x"), Some(Observer::Summary(Arc::from([0.5]))), "quantiles");
    assert_eq!(observer("c.x"), None, "buckets without observer_type: histogram");
    assert_eq!(observer("z.x"), None, "no default observer type");
}

/// Refused values name the mapping, the key and the line.
#[test]
fn refused_values_name_key_and_line() {
    let cases: &[(&str, Option<usize>, Option<usize>, &str)] = &[
        ("mappings:\n- match: bad--metric-line.*.*\n  name: foo\n", Some(0), Some(2), "match"),
        ("mappings:\n- match: a.b*.c\n  name: foo\n", Some(0), Some(2), "match"),
        ("mappings:\n- match: 1a.b\n  name: foo\n", Some(0), Some(2), "match"),
        ("mappings:\n- match: a.*\n  name: ok\n- match: test.*.*\n  name: \"0foo\"\n", Some(1), Some(5), "name"),
        ("mappings:\n- match: test.*.*\n  labels:\n    this: \"$1\"\n", Some(0), Some(2), "name"),
        ("mappings:\n- match: \"*\\\\.foo\"\n  match_type: regex\n  name: foo\n", Some(0), Some(2), "match"),
        ("mappings:\n- match: a.*\n  name: foo\n  match_type: blob\n", Some(0), Some(4), "match_type"),
        ("mappings:\n- match: a.*\n  name: foo\n  action: xyz\n", Some(0), Some(4), "action"),
        ("mappings:\n- match: a.*\n  name: foo\n  match_metric_type: wrong\n", Some(0), Some(4), "match_metric_type"),
        ("mappings:\n- match: a.*\n  name: foo\n  observer_type: wrong\n", Some(0), Some(4), "observer_type"),
        ("mappings:\n- match: a.*\n  name: foo\n  timer_type: wrong\n", Some(0), Some(4), "timer_type"),
        ("mappings:\n- match: a.*\n  name: foo\n  labels:\n    1bad: x\n", Some(0), Some(4), "labels"),
        ("mappings:\n- match: a.*\n  name: foo\n  labels:\n    x: [1]\n", Some(0), Some(4), "labels"),
        ("mappings:\n- match: a.*\n  name: foo\n  scale: 0.001\n", Some(0), Some(4), "scale"),
        ("mappings:\n- match: a.*\n  name: foo\n  ttl: soon\n", Some(0), Some(4), "ttl"),
        (
            "mappings:\n- match: a.*\n  name: foo\n  quantiles:\n  - quantile: 0.42\n    error: 0.04\n  summary_options:\n    quantiles:\n    - quantile: 0.42\n      error: 0.04\n",
            Some(0),
            Some(4),
            "quantiles",
        ),
        (
            "mappings:\n- match: a.*\n  name: foo\n  buckets: [1]\n  histogram_options:\n    buckets: [2]\n",
            Some(0),
            Some(4),
            "buckets",
        ),
        (
            "mappings:\n- match: a.*\n  name: foo\n  observer_type: histogram\n  summary_options:\n    max_age: 1m\n",
            Some(0),
            Some(5),
            "summary_options",
        ),
        (
            "defaults:\n  observer_type: summary\nmappings:\n- match: a.*\n  name: foo\n  histogram_options:\n    buckets: [1]\n",
            Some(0),
            Some(6),
            "histogram_options",
        ),
        ("defaults:\n  match_type: glob\n  observer_type: nope\n", None, Some(3), "observer_type"),
        ("defaults:\n  match_type: fuzzy\n", None, Some(2), "match_type"),
    ];
    for (yaml, mapping, line, key) in cases {
        assert_eq!(invalid_at(yaml), (*mapping, *line, (*key).to_owned()), "{yaml}");
    }
    let message = refused("mappings:\n- match: a.*\n  name: ok\n- match: a.b*.c\n  name: foo\n").to_string();
    assert!(message.starts_with("mappings[1] (line 4): `match`: `a.b*.c` is not a valid glob"), "{message}");
}

/// Unknown keys, YAML errors and wrong types are serde_yaml errors that
/// name the key and the line.
#[test]
fn unknown_keys_are_refused_with_their_line() {
    // mapper_test `TestMultipleMatches`: `app` is mis-indented, so it is a
    // key of the mapping; statsd_exporter ignored it, tessera refuses it.
    let cases = [
        (
            "mappings:\n- match: aa.bb.*.*\n  name: \"aa_bb_${1}_total\"\n  labels:\n  app: \"$2\"\n",
            "unknown field `app`",
            "line 5",
        ),
        ("defaults:\n  glob_ordering: true\n", "unknown field `glob_ordering`", "line 2"),
        (
            "mappings:\n- match: a.*\n  name: a\n  histogram_options:\n    bucket: [1]\n",
            "unknown field `bucket`",
            "line 5",
        ),
        (
            "mappings:\n- match: a.*\n  name: a\n  summary_options:\n    max_agee: 1m\n",
            "unknown field `max_agee`",
            "line 5",
        ),
        ("mappings:\n- name: a\n", "missing field `match`", "line 2"),
        ("mappings:\n- match: *.test.*\n  name: a\n", "", "line 2"),
        (
            "mappings:\n- match: a.*\n  name: a\n  glob_disable_ordering: true\n",
            "unknown field `glob_disable_ordering`",
            "line 4",
        ),
    ];
    for (yaml, wanted, line) in cases {
        let error = refused(yaml);
        let message = error.to_string();
        assert!(matches!(error, MappingError::Yaml(_)), "{message}");
        assert!(message.contains(wanted) && message.contains(line), "{yaml}: {message}");
    }
}

#[test]
fn unknown_top_level_keys_are_refused_with_their_line() {
    let error = refused("defaults: {}\nmapping:\n- match: a\n");
    let MappingError::UnknownKey { ref key, line } = error else {
        panic!("expected an unknown key, got {error}");
    };
    assert_eq!((key.as_str(), line), ("mapping", Some(2)));
    assert!(error.to_string().starts_with("line 2: unknown key `mapping`"), "{error}");
}

#[test]
fn load_names_the_file() {
    let error = MappingFile::load(std::path::Path::new("/nonexistent/statsd_mapping.yml"));
    let Err(MappingError::Read { path, .. }) = error else {
        panic!("expected a read error");
    };
    assert!(path.ends_with("statsd_mapping.yml"));
}

/// The cost per name does not depend on how many glob rules there are: a
/// file of 10 000 rules maps as the small one does.
#[test]
fn many_glob_rules() {
    let mut yaml = String::from("mappings:\n");
    for index in 0..10_000 {
        yaml.push_str(&format!(
            "- match: svc{index}.*.*.latency\n  name: svc{index}_latency\n  labels:\n    route: $1\n    code: $2\n"
        ));
    }
    yaml.push_str("- match: \"*.*.*.*\"\n  name: other\n");
    let file = load(&yaml);
    assert_eq!(
        map(&file, "svc9999.users.200.latency"),
        expect("svc9999_latency", &[("route", "users"), ("code", "200")])
    );
    assert_eq!(map(&file, "nope.users.200.latency"), expect("other", &[]));
    assert_eq!(map(&file, "svc1.a.b"), None);
}

proptest! {
    /// `map` never panics, whatever the name and kind.
    #[test]
    fn map_never_panics(name in "\\PC{0,80}|[a-z*.]{0,40}|(\\.){60,70}", kind in 0usize..6) {
        let file = load(
            "defaults:\n  glob_disable_ordering: false\nmappings:\n- match: \"*.*\"\n  name: \"$1_$2\"\n  labels:\n    a: \"${1}\"\n- match: a.*.c\n  action: drop\n- match: \"*\"\n  name: \"${1}\"\n- match: \"(.*)\\\\.(?P<x>.*)\"\n  match_type: regex\n  name: \"r_$2\"\n  labels:\n    x: \"${x}|$1,\"\n",
        );
        let mut out = Mapped::default();
        let outcome = file.map(&name, MetricKind::ALL[kind], &mut out);
        if let MapOutcome::Mapped { .. } = outcome {
            prop_assert!(!out.name.is_empty());
            prop_assert!(out.name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_'));
            for (_, value) in &out.labels {
                prop_assert!(!value.is_empty() && !value.contains(['|', ',', '\n', '\r']));
            }
        }
    }
}

/// A histogram without buckets gets the defaults' or Prometheus' default buckets, a last
/// `+Inf` is left out, and bounds Prometheus' client would refuse are refused.
#[test]
fn histogram_buckets_come_from_the_mapping_then_the_defaults_then_prometheus() {
    let file = load(
        "mappings:\n- match: a.*\n  name: a\n  observer_type: histogram\n- match: b.*\n  name: b\n  observer_type: histogram\n  buckets: [1, 2, .inf]\n- match: c.*\n  name: c\n  observer_type: histogram\n  buckets: []\n",
    );
    let mut scratch = Mapped::default();
    let mut bounds = |name| match file.observer(name, MetricKind::Timer, &mut scratch) {
        Some(Observer::Histogram(bounds)) => bounds.to_vec(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(bounds("a.x"), crate::mapping::DEFAULT_BUCKETS);
    assert_eq!(bounds("b.x"), [1.0, 2.0]);
    assert_eq!(bounds("c.x"), crate::mapping::DEFAULT_BUCKETS, "empty means the default");
    let file = load(
        "defaults:\n  observer_type: histogram\n  histogram_options:\n    buckets: [5]\n  quantiles:\n  - quantile: 0.75\n    error: 0.01\nmappings:\n- match: a.*\n  name: a\n- match: b.*\n  name: b\n  observer_type: summary\n- match: c.*\n  name: c\n  observer_type: summary\n  summary_options:\n    quantiles: []\n",
    );
    let observer = |name| file.observer(name, MetricKind::Distribution, &mut Mapped::default());
    assert_eq!(observer("a.x"), Some(Observer::Histogram(Arc::from([5.0]))));
    assert_eq!(observer("b.x"), Some(Observer::Summary(Arc::from([0.75]))), "the defaults' quantiles");
    assert_eq!(observer("c.x"), Some(Observer::Summary(Arc::from([0.75]))), "empty means the defaults'");
    let file = load("mappings:\n- match: a.*\n  name: a\n  observer_type: summary\n");
    assert_eq!(
        file.observer("a.x", MetricKind::Timer, &mut Mapped::default()),
        Some(Observer::Summary(crate::mapping::DEFAULT_QUANTILES.into())),
        "statsd_exporter's default quantiles"
    );
    for (text, why) in [
        ("mappings:\n- match: a.*\n  name: a\n  observer_type: histogram\n  buckets: [2, 1]\n", "increase"),
        ("mappings:\n- match: a.*\n  name: a\n  observer_type: histogram\n  buckets: [1, 1]\n", "increase"),
        ("mappings:\n- match: a.*\n  name: a\n  observer_type: histogram\n  buckets: [.nan]\n", "finite"),
    ] {
        let error = refused(text);
        assert!(error.to_string().contains(why), "{error}");
        assert!(matches!(error, MappingError::Invalid { key, .. } if key == "buckets"));
    }
}
