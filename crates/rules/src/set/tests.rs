use std::sync::Arc;

use tessera_core::parse::{MetricKind, Parsed, parse_line};
use tessera_core::series::SeriesKey;

use super::*;
use crate::{RuleCache, RulesHandle};

fn rules(toml_text: &str) -> RulesConfig {
    toml::from_str(toml_text).expect("rules parse")
}

fn set(toml_text: &str) -> RuleSet {
    RuleSet::compile(None, &rules(toml_text), &RuleMetrics::default()).expect("rules compile")
}

fn ids(outcome: &Outcome) -> Vec<String> {
    match &outcome.targets {
        Targets::Same => vec!["<same>".to_owned()],
        Targets::Dropped => Vec::new(),
        targets => targets.new_ids().map(|id| String::from_utf8_lossy(id).into_owned()).collect(),
    }
}

fn apply(set: &RuleSet, id: &str) -> Vec<String> {
    ids(&set.apply(MetricKind::Counter, id.as_bytes()))
}

#[test]
fn no_rules_leave_every_series_as_it_is() {
    let set = set("");
    assert!(set.is_empty());
    assert_eq!(apply(&set, "api.hits|#a:1"), ["<same>"]);
}

#[test]
fn allow_and_deny_drop_by_name() {
    let set = set(r#"allow = ["api.*", "db.*"]
deny = ["api.debug.*"]"#);
    assert_eq!(apply(&set, "api.hits"), ["<same>"]);
    assert!(apply(&set, "web.hits").is_empty(), "matches no allow glob");
    assert!(apply(&set, "api.debug.x|#a:1").is_empty(), "denied");
    let outcome = set.apply(MetricKind::Counter, b"web.hits");
    assert_eq!(outcome.hits, vec![set.allow_slot], "the drop is counted under `allow`");
}

#[test]
fn tag_rules_drop_rename_and_keep_in_order() {
    let set = set(r#"
[[tags]]
match = "api.*"
drop = ["request_id"]
rename = { env = "environment" }
[[tags]]
keep = ["environment", "route"]
"#);
    assert_eq!(apply(&set, "api.hits|#env:prod,host:a,request_id:9,route:/x"), ["api.hits|#environment:prod,route:/x"]);
    assert_eq!(apply(&set, "db.q|#env:prod,host:a"), ["db.q"], "only the second rule matches db.*: env is not kept");
    assert_eq!(apply(&set, "db.q|#route:/y"), ["<same>"], "nothing to change");
}

#[test]
fn a_rollup_folds_a_tag_away_so_series_meet_under_one_id() {
    let set = set(r#"
[[rollup]]
match = "api.latency"
aggregate_without = ["user_id"]
"#);
    let first = apply(&set, "api.latency|#route:/a,user_id:1");
    let second = apply(&set, "api.latency|#route:/a,user_id:2");
    assert_eq!(first, ["api.latency|#route:/a"]);
    assert_eq!(first, second);
    assert_eq!(apply(&set, "api.other|#user_id:1"), ["<same>"]);
}

#[test]
fn a_rollup_that_keeps_the_original_gives_both_and_needs_its_own_name() {
    let set = set(r#"
[[rollup]]
match = "api.*"
aggregate_without = ["user_id"]
keep_original = true
name = "api.by_route"
"#);
    assert_eq!(
        apply(&set, "api.latency|#route:/a,user_id:1"),
        ["api.latency|#route:/a,user_id:1", "api.by_route|#route:/a"]
    );
    let error = RuleSet::compile(
        None,
        &rules("[[rollup]]\nmatch = \"a\"\naggregate_without = [\"u\"]\nkeep_original = true\n"),
        &RuleMetrics::default(),
    )
    .err()
    .expect("refused");
    assert!(error.to_string().starts_with("rules.rollup[0]: `keep_original = true` needs a `name`"), "{error}");
}

#[test]
fn global_tags_are_added_where_absent_and_the_prefix_goes_on_every_name() {
    let set = set(r#"
global_tags = { region = "eu", host = "h1" }
name_prefix = "app."
"#);
    assert_eq!(apply(&set, "hits"), ["app.hits|#host:h1,region:eu"]);
    assert_eq!(apply(&set, "hits|#host:other"), ["app.hits|#host:other,region:eu"], "the series' own tag wins");
}

#[test]
fn a_limit_folds_series_past_it_into_the_overflow_series_and_frees_places() {
    let set = set(r#"
global_tags = { region = "eu" }
[[limit]]
match = "api.*"
max_series = 2
"#);
    let first = set.apply(MetricKind::Counter, b"api.hits|#user:1");
    let second = set.apply(MetricKind::Counter, b"api.hits|#user:2");
    let again = set.apply(MetricKind::Counter, b"api.hits|#user:1");
    let third = set.apply(MetricKind::Counter, b"api.hits|#user:3");
    assert_eq!(ids(&first), ["api.hits|#region:eu,user:1"]);
    assert_eq!(ids(&second), ["api.hits|#region:eu,user:2"]);
    assert_eq!(ids(&again), ids(&first), "an admitted id shares its place");
    assert_eq!(ids(&third), ["api.hits|#region:eu,tessera_overflow:true"]);
    assert_eq!(apply(&set, "db.q|#user:9"), ["db.q|#region:eu,user:9"], "names the glob misses are not limited");
    let other_name = set.apply(MetricKind::Counter, b"api.errors|#user:1");
    assert_eq!(ids(&other_name), ["api.errors|#region:eu,user:1"], "each name has its own limit");
    assert_eq!(set.limits[0].series.get(), 2, "the most series of one name");
    for outcome in [&first, &again] {
        let id = outcome.targets.new_ids().next().expect("one new id");
        assert_eq!(outcome.admissions, [Some(Admission::new(0)), None]);
        set.release(outcome.admissions[0].expect("admitted"), id);
    }
    assert_eq!(set.limits[0].series.get(), 1);
    assert_eq!(apply(&set, "api.hits|#user:3"), ["api.hits|#region:eu,user:3"], "a freed place is taken");
}

#[test]
fn a_global_tag_or_a_rename_to_a_reserved_label_is_noted_with_its_key() {
    let set = set(r#"
global_tags = { quantile = "x", region = "eu" }
[[tags]]
rename = { host = "__name__", dc = "zone" }
"#);
    assert_eq!(set.notes().len(), 2, "{:?}", set.notes());
    assert!(set.notes()[0].starts_with("rules.global_tags.quantile: `quantile` is a label tessera sets itself"));
    assert!(set.notes()[1].starts_with("rules.tags[0].rename.host: `__name__` is a label"), "{:?}", set.notes());
    assert!(set.notes()[1].ends_with("the ingester writes this label as `tag___name__`"), "{:?}", set.notes());
}

#[test]
fn a_dropping_limit_drops_series_past_it() {
    let set = set("[[limit]]\nmatch = \"*\"\nmax_series = 1\noverflow = \"drop\"\n");
    assert_eq!(apply(&set, "a|#u:1"), ["<same>"]);
    assert!(apply(&set, "a|#u:2").is_empty(), "a's second series");
    assert_eq!(apply(&set, "b|#u:2"), ["<same>"], "b's first");
}

#[test]
fn bad_rules_name_their_key() {
    let cases = [
        ("allow = [\"\"]", "rules.allow"),
        ("deny = [\"a|b\"]", "rules.deny"),
        ("[[tags]]\nmatch = \"a\"", "rules.tags[0]"),
        ("[[tags]]\ndrop = [\"a,b\"]", "rules.tags[0].drop"),
        ("[[rollup]]\nmatch = \"a\"\naggregate_without = []", "rules.rollup[0]"),
        ("[[limit]]\nmatch = \"a\"\nmax_series = 0", "rules.limit[0].max_series"),
        ("name_prefix = \"a:b\"", "rules.name_prefix"),
        ("global_tags = { \"a\" = \"x,y\" }", "rules.global_tags.a"),
    ];
    for (text, key) in cases {
        let error = RuleSet::compile(None, &rules(text), &RuleMetrics::default()).err().expect(text);
        assert!(error.to_string().starts_with(&format!("{key}:")), "{text}: {error}");
    }
}

#[test]
fn the_cache_keeps_outcomes_counts_hits_once_per_cut_and_switches_sets_at_the_window() {
    let metrics = RuleMetrics::default();
    let first = RuleSet::compile(None, &rules("deny = [\"x\"]"), &metrics).unwrap();
    let handle = Arc::new(RulesHandle::new(first));
    let mut cache = RuleCache::new(handle.clone(), metrics.clone(), 2000);
    // (may the cut hold an id twice, the ids it goes out under)
    let route = |cache: &mut RuleCache, window: i64, id: &[u8]| {
        let mut cut = cache.begin(window).expect("rules in force");
        let mut out = Vec::new();
        cut.route(MetricKind::Counter, id, |target| out.push(target.to_vec()));
        (cut.finish(), out)
    };
    assert_eq!(route(&mut cache, 0, b"x"), (false, vec![]));
    assert_eq!(route(&mut cache, 1000, b"x"), (false, vec![]));
    assert_eq!(route(&mut cache, 1000, b"y"), (false, vec![b"y".to_vec()]));
    assert_eq!(cache.cached(), 2);
    assert_eq!(metrics.partials("deny[0]:x", Action::Dropped).get(), 2, "one hit per series per cut");

    let second = RuleSet::compile(None, &rules("name_prefix = \"p.\""), &metrics).unwrap();
    handle.replace(second, 3000);
    assert_eq!(route(&mut cache, 2000, b"x"), (false, vec![]), "the old set holds until its window ends");
    assert_eq!(route(&mut cache, 3000, b"x"), (false, vec![b"p.x".to_vec()]));
    assert_eq!(cache.cached(), 1, "the cache starts again with the new set");
    assert_eq!(route(&mut cache, 2000, b"x"), (false, vec![]), "a late window still gets its own set");
}

#[test]
fn a_cut_needs_merging_only_once_two_series_may_give_one_id() {
    let metrics = RuleMetrics::default();
    let set =
        RuleSet::compile(None, &rules("[[rollup]]\nmatch = \"a\"\naggregate_without = [\"u\"]"), &metrics).unwrap();
    let mut cache = RuleCache::new(Arc::new(RulesHandle::new(set)), metrics, 1000);
    let cut_of = |cache: &mut RuleCache, window: i64, ids: &[&[u8]]| {
        let mut cut = cache.begin(window).unwrap();
        for id in ids {
            cut.route(MetricKind::Counter, id, |_| {});
        }
        cut.finish()
    };
    assert!(!cut_of(&mut cache, 0, &[b"a|#u:1", b"b|#u:1"]), "a rewritten id that no other series gives");
    assert!(!cut_of(&mut cache, 1000, &[b"a|#u:1", b"c"]));
    assert!(cut_of(&mut cache, 2000, &[b"a|#u:2"]), "a|#u:2 gives `a` too");
    assert!(cut_of(&mut cache, 3000, &[b"a"]), "so does the series `a` itself");
    assert!(cut_of(&mut cache, 4000, &[b"z"]), "colliding stays until the cache empties");
}

/// A rollup that keeps the original gives a series two ids, each of which may hold a
/// limit's place: both are handed back when the series leaves the cache, each under its
/// own id (the second id's offset in the entry is the one that counts).
#[test]
fn a_series_under_a_limit_with_two_ids_hands_back_both_places() {
    let metrics = RuleMetrics::default();
    let text = r#"
[[rollup]]
match = "api.*"
aggregate_without = ["user"]
keep_original = true
name = "api.by_route"
[[limit]]
match = "api.*"
max_series = 10
"#;
    let set = RuleSet::compile(None, &rules(text), &metrics).unwrap();
    let outcome = set.apply(MetricKind::Counter, b"api.hits|#route:/a,user:1");
    assert_eq!(ids(&outcome), ["api.hits|#route:/a,user:1", "api.by_route|#route:/a"]);
    assert_eq!(outcome.admissions, [Some(Admission::new(0)), Some(Admission::new(0))]);
    set.release_outcome(&outcome, b"api.hits|#route:/a,user:1");
    assert_eq!(metrics.limited_series("limit[0]:api.*").get(), 0);
    let handle = Arc::new(RulesHandle::new(set));
    let mut cache = RuleCache::new(handle.clone(), metrics.clone(), 1000);
    let mut cut = cache.begin(0).unwrap();
    for user in 1..=3 {
        let id = format!("api.hits|#route:/a,user:{user}");
        cut.route(MetricKind::Counter, id.as_bytes(), |_| {});
    }
    cut.finish();
    // Three originals of `api.hits` and one rollup of `api.by_route` shared by all three.
    assert_eq!(metrics.limited_series("limit[0]:api.*").get(), 3);
    let mut cut = cache.begin(1000).unwrap();
    cut.route(MetricKind::Counter, b"api.hits|#route:/a,user:1", |_| {});
    cut.finish();
    for window in 2..=16 {
        cache.begin(window * 1000).unwrap().finish();
    }
    assert_eq!(cache.cached(), 0);
    assert_eq!(metrics.limited_series("limit[0]:api.*").get(), 0, "every place of both ids is handed back");
    let limit = handle.for_window(0).limits[0].state.lock().unwrap().admitted.len();
    assert_eq!(limit, 0, "no id still holds a place");
}

#[test]
fn idle_series_leave_the_cache_and_hand_back_their_places() {
    let metrics = RuleMetrics::default();
    let set = RuleSet::compile(None, &rules("[[limit]]\nmatch = \"*\"\nmax_series = 10"), &metrics).unwrap();
    let handle = Arc::new(RulesHandle::new(set));
    let mut cache = RuleCache::new(handle.clone(), metrics.clone(), 1000);
    let mut cut = cache.begin(0).unwrap();
    cut.route(MetricKind::Counter, b"a", |_| {});
    cut.finish();
    assert_eq!(metrics.limited_series("limit[0]:*").get(), 1);
    for window in 1..=16 {
        cache.begin(window * 1000).unwrap().finish();
    }
    assert_eq!(cache.cached(), 0);
    assert_eq!(metrics.limited_series("limit[0]:*").get(), 0);
}

proptest::proptest! {
    #[test]
    fn rules_never_panic_on_a_line_the_parser_accepts(
        line in "[a-z.*_]{1,12}(\\.status\\.[0-9]{3}|\\.latency)?:[0-9]{1,3}\\|(c|g|ms|s)(\\|#[a-z_:.,]{0,20})?"
    ) {
        let Parsed::Metric(parsed) = parse_line(line.as_bytes()) else { return Ok(()) };
        let mut key = SeriesKey::default();
        key.build(&parsed).unwrap();
        let mapping = MappingFile::from_yaml(include_str!("../../tests/data/every_rule.yml")).unwrap();
        let config = rules(include_str!("../../tests/data/every_rule.toml"));
        let set = RuleSet::compile(Some(mapping), &config, &RuleMetrics::default()).unwrap();
        let outcome = set.apply(parsed.kind, key.id());
        proptest::prop_assert!(outcome.targets != Targets::Same, "the prefix renames every series");
        let name = std::str::from_utf8(parsed.name).unwrap();
        if !name.starts_with("denied") && !name.starts_with("drop.") {
            proptest::prop_assert!(outcome.targets.new_ids().next().is_some(), "{} was dropped", line);
        }
        for id in outcome.targets.new_ids() {
            let text = std::str::from_utf8(id).unwrap();
            proptest::prop_assert!(text.starts_with("f_"), "{}", text);
        }
    }
}

#[test]
fn tags_past_what_a_line_may_carry_are_cut_and_counted() {
    let metrics = RuleMetrics::default();
    let global_tags: Vec<String> = (0..MAX_TAGS).map(|index| format!("g{index:02} = \"x\"")).collect();
    let text = format!("global_tags = {{ {} }}", global_tags.join(", "));
    let set = RuleSet::compile(None, &rules(&text), &metrics).unwrap();
    let outcome = set.apply(MetricKind::Counter, b"a|#own:1");
    let kept = ids(&outcome)[0].split(',').count();
    assert_eq!(kept, MAX_TAGS, "the first {MAX_TAGS} tags stay");
    assert_eq!(metrics.rule_truncated_series.get(), 1);
    set.apply(MetricKind::Counter, b"b");
    assert_eq!(metrics.rule_truncated_series.get(), 1, "exactly MAX_TAGS tags fit");
}
