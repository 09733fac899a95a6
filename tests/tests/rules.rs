//! Rules before sharding (issue 26), end to end on the real binaries: collectors with a
//! statsd_exporter mapping file (`[mapping] file`) and `[rules]` → aggregator (1 s tiles) →
//! ingester (remote write) → a real Prometheus. Every value is read back from Prometheus,
//! with the exact label set of its series (the documented labels and no other: the store
//! holds the one resolution, so the ingester adds no `resolution` label; a counter's name
//! gets `_total` unless it ends so already). `|ms` values arrive in seconds, as
//! statsd_exporter writes them.
//!
//! - **statsd_exporter's README examples**, each mapping file the one
//!   `crates/rules/src/mapping/tests.rs` reads (`crates/rules/tests/data/statsd_exporter_readme/`,
//!   each citing its README section), on a collector of its own: each line
//!   arrives under the documented name and labels with its exact value; the `drop`
//!   example's line never arrives and is counted in `rule_partials_total{action="dropped"}`.
//! - **allow, deny, tag rules, global tags and the name prefix**: exact names, labels and
//!   values; denied and not-allowed names never arrive and are counted.
//! - **reload**: with a counter sent every 20 ms, a broken mapping file keeps the old rules
//!   (`rules_reloads_total{result="failed"}`, data still under the old name), a good one
//!   applies (`result="applied"`, data under the new name), and the two names together hold
//!   exactly what was sent; a SIGHUP reloads a change the once-a-second poll cannot see
//!   (same size, same modification time).

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};
use tessera_core::clock::now_secs;

use tessera_testkit::daemons::Daemon;
use tessera_testkit::free_port;
use tessera_testkit::prometheus::Prometheus;
use tessera_tests::{
    FAST_RECONNECT, ONE_SECOND_SINK, ONE_SECOND_TILES, collector_config, loopback, scalar, start_daemon,
    start_ingester, start_lone_aggregator, wait_for_scalar, wait_until,
};

/// How long values, counters and reloads may take to show.
const WAIT: Duration = Duration::from_secs(40);

/// One collector's rules: a mapping file's YAML, and `[rules]` text.
struct CollectorRules<'a> {
    mapping: Option<&'a str>,
    rules: &'a str,
}

impl<'a> CollectorRules<'a> {
    fn mapping(yaml: &'a str) -> CollectorRules<'a> {
        CollectorRules { mapping: Some(yaml), rules: "" }
    }
}

struct Stack {
    prometheus: Prometheus,
    _ingester: Daemon,
    _aggregator: Daemon,
    /// (collector, its statsd address, its mapping file), in the order of their rules.
    collectors: Vec<(Daemon, SocketAddr, PathBuf)>,
    socket: UdpSocket,
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Prometheus, an ingester, an aggregator with 1 s tiles, and one collector per entry of
    /// `collectors` (started at once), each with its mapping file and `[rules]`.
    fn start(collectors: &[CollectorRules]) -> Stack {
        let prometheus = Prometheus::start();
        let dir = tempfile::tempdir().unwrap();
        let aggregator_port = free_port();
        let (ingester, ingester_port) = start_ingester(dir.path(), &prometheus, ONE_SECOND_SINK);
        let (aggregator, placement) =
            start_lone_aggregator(dir.path(), aggregator_port, ONE_SECOND_TILES, ingester_port, FAST_RECONNECT);
        let configs: Vec<(String, u16, PathBuf)> = collectors
            .iter()
            .enumerate()
            .map(|(index, rules)| {
                let statsd_port = free_port();
                let mapping_path = dir.path().join(format!("mapping-{index}.yml"));
                let mut text = collector_config(&format!("host-{index}"), statsd_port, &placement, "");
                if let Some(yaml) = rules.mapping {
                    std::fs::write(&mapping_path, yaml).unwrap();
                    text += &format!("[mapping]\nfile = {:?}\n", mapping_path.display().to_string());
                }
                if !rules.rules.is_empty() {
                    text += rules.rules;
                }
                (text, statsd_port, mapping_path)
            })
            .collect();
        let collectors = std::thread::scope(|scope| {
            let starting: Vec<_> = configs
                .into_iter()
                .enumerate()
                .map(|(index, (text, statsd_port, mapping_path))| {
                    scope.spawn(move || {
                        let name = format!("collector-{index}");
                        let collector = start_daemon(&name, "tessera-collector", &text, free_port());
                        (collector, loopback(statsd_port), mapping_path)
                    })
                })
                .collect();
            starting.into_iter().map(|thread| thread.join().expect("a collector starts")).collect()
        });
        Stack {
            prometheus,
            _ingester: ingester,
            _aggregator: aggregator,
            collectors,
            socket: UdpSocket::bind("127.0.0.1:0").unwrap(),
            _dir: dir,
        }
    }

    /// Sends `lines` (one datagram) to collector `index`.
    fn send(&self, index: usize, lines: &[&str]) {
        self.socket.send_to(lines.join("\n").as_bytes(), self.collectors[index].1).unwrap();
    }

    fn collector(&self, index: usize) -> &Daemon {
        &self.collectors[index].0
    }

    /// Waits until collector `index`'s `tessera_collector_<name>{labels}` is `expected`.
    fn wait_for_collector_metric(&self, index: usize, name: &str, labels: &str, expected: f64) {
        let full = format!("tessera_collector_{name}");
        let mut last = 0.0;
        wait_until(&format!("collector-{index} {full}{{{labels}}} == {expected}"), WAIT, || {
            last = self.collector(index).metric(&full, labels);
            last == expected
        });
    }

    /// The value of the one series `promql` selects now, 0 when none.
    fn value_or_zero(&self, promql: &str) -> f64 {
        scalar(&self.prometheus, promql).unwrap_or(0.0)
    }

    /// The label sets (`__name__` included) of every series `selector` selects now.
    fn label_sets(&self, selector: &str) -> Vec<BTreeMap<String, String>> {
        let result = self.prometheus.query(selector, now_secs());
        let series = result.as_array().unwrap_or_else(|| panic!("{selector}: {result}"));
        series
            .iter()
            .map(|one| {
                let labels = one["metric"].as_object().unwrap_or_else(|| panic!("{selector}: {result}"));
                labels.iter().map(|(key, value)| (key.clone(), value.as_str().unwrap().to_owned())).collect()
            })
            .collect()
    }

    /// Waits until the series `name{labels}` holds `value`, then checks that it carries
    /// exactly `labels`, no other.
    fn expect_sample(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        let selector = selector(name, labels);
        wait_for_scalar(&self.prometheus, &selector, value, WAIT);
        assert_eq!(self.label_sets(&selector), [expected_labels(name, labels)], "{selector}");
    }

    /// Waits until the native histogram `name{labels}` counts `count` observations, then
    /// checks their sum and that it carries exactly `labels`.
    fn expect_histogram(&self, name: &str, labels: &[(&str, &str)], count: f64, sum: f64) {
        let selector = selector(name, labels);
        wait_for_scalar(&self.prometheus, &format!("histogram_count({selector})"), count, WAIT);
        assert_eq!(scalar(&self.prometheus, &format!("histogram_sum({selector})")), Some(sum), "{selector}");
        assert_eq!(self.label_sets(&selector), [expected_labels(name, labels)], "{selector}");
    }

    /// Asserts that no series' name matches the regex `names`.
    fn assert_absent(&self, names: &str) {
        let found = self.label_sets(&format!("{{__name__=~\"{names}\"}}"));
        assert!(found.is_empty(), "no series named like `{names}` should exist: {found:?}");
    }
}

/// `{__name__="name",labels...}`.
fn selector(name: &str, labels: &[(&str, &str)]) -> String {
    let mut matchers = vec![format!("__name__=\"{name}\"")];
    matchers.extend(labels.iter().map(|(key, value)| format!("{key}=\"{value}\"")));
    format!("{{{}}}", matchers.join(","))
}

fn expected_labels(name: &str, labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut expected: BTreeMap<String, String> =
        labels.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
    expected.insert("__name__".to_owned(), name.to_owned());
    expected
}

// statsd_exporter's README examples: the mapping files the rules crate's unit tests read.

/// README, "Metric Mapping and Configuration": the first example mapping.
const README_FIRST: &str = include_str!("../../crates/rules/tests/data/statsd_exporter_readme/first.yml");

/// README: dynamic names, glob form.
const README_DYNAMIC_GLOB: &str =
    include_str!("../../crates/rules/tests/data/statsd_exporter_readme/dynamic_names_glob.yml");

/// README: dynamic names, regex form.
const README_DYNAMIC_REGEX: &str =
    include_str!("../../crates/rules/tests/data/statsd_exporter_readme/dynamic_names_regex.yml");

/// README, "Regular expression matching".
const README_REGEX: &str = include_str!("../../crates/rules/tests/data/statsd_exporter_readme/regex.yml");

/// README, "StatsD timers" / "Global defaults".
const README_TIMERS: &str =
    include_str!("../../crates/rules/tests/data/statsd_exporter_readme/timers_and_defaults.yml");

/// README, "`drop` action".
const README_DROP: &str = include_str!("../../crates/rules/tests/data/statsd_exporter_readme/drop.yml");

/// README, "Explicit metric type mapping".
const README_METRIC_TYPE: &str =
    include_str!("../../crates/rules/tests/data/statsd_exporter_readme/explicit_metric_type.yml");

#[test]
fn statsd_exporter_readme_examples_arrive_with_the_documented_names_and_labels() {
    let stack = Stack::start(&[
        CollectorRules::mapping(README_FIRST),
        CollectorRules::mapping(README_DYNAMIC_GLOB),
        CollectorRules::mapping(README_DYNAMIC_REGEX),
        CollectorRules::mapping(README_REGEX),
        CollectorRules::mapping(README_TIMERS),
        CollectorRules::mapping(README_DROP),
        CollectorRules::mapping(README_METRIC_TYPE),
    ]);
    stack.send(
        0,
        &[
            "test.dispatcher.FooProcessor.send.success:3|c",
            "foo_product.signup.facebook.failure:4|c",
            "test.web-server.foo.bar:5|c",
        ],
    );
    stack.send(1, &["test.aws.requests.counter:6|c"]);
    stack.send(3, &["web1.api--http.status.200.count:8|c"]);
    stack.send(4, &["test.timing.api.aws.ok:20|ms", "test.timing.api.aws.ok:30|ms", "other.timing.db.gcp.fail:40|d"]);
    stack.send(5, &["test.timing.a.b.c:12|ms", "anything.else:9|g"]);
    stack.send(6, &["test.foo.x:2|c", "test.foo.x:11|g", "test.foo.x:7|ms", "test.bar.x:13|g", "test.bar.x:1|c"]);

    // `test.dispatcher.FooProcessor.send.success` =>
    // `dispatcher_events_total{processor="FooProcessor",action="send",outcome="success",job="test_dispatcher"}`
    stack.expect_sample(
        "dispatcher_events_total",
        &[("processor", "FooProcessor"), ("action", "send"), ("outcome", "success"), ("job", "test_dispatcher")],
        3.0,
    );
    // `foo_product.signup.facebook.failure` =>
    // `signup_events_total{provider="facebook",outcome="failure",job="foo_product_server"}`
    stack.expect_sample(
        "signup_events_total",
        &[("provider", "facebook"), ("outcome", "failure"), ("job", "foo_product_server")],
        4.0,
    );
    // `test.web-server.foo.bar` => `test_web_server_foo_bar{}`: no rule, the default name
    // (a counter, so `_total`).
    stack.expect_sample("test_web_server_foo_bar_total", &[], 5.0);

    // The glob and the regex form give the same series: the regex collector's line adds
    // to what the glob collector's made.
    stack.expect_sample("requests_total", &[("provider", "aws")], 6.0);
    stack.send(2, &["test.aws.requests.counter:7|c"]);
    stack.expect_sample("requests_total", &[("provider", "aws")], 13.0);

    stack.expect_sample(
        "request_total",
        &[("hostname", "web1"), ("exec", "api"), ("protocol", "http"), ("code", "200")],
        8.0,
    );

    // Timers: "a histogram using the buckets set in `defaults`" (classic, exact buckets) and
    // "a summary timer" with its quantile. `|ms` values are kept in seconds (20 ms + 30 ms:
    // 0.05 s); `|d` values as sent.
    let my_timer = [("provider", "aws"), ("outcome", "ok"), ("job", "api_server")];
    stack.expect_sample("my_timer_count", &my_timer, 2.0);
    stack.expect_sample("my_timer_sum", &my_timer, 0.05);
    for (le, count) in [("0.01", 0.0), ("0.025", 1.0), ("0.05", 2.0), ("2.5", 2.0), ("+Inf", 2.0)] {
        let bucket = [my_timer.as_slice(), &[("le", le)]].concat();
        stack.expect_sample("my_timer_bucket", &bucket, count);
    }
    assert!(
        stack.label_sets("{__name__=~\"my_timer_min|my_timer_max\",job=\"api_server\"}").is_empty(),
        "a classic histogram has no min or max"
    );
    let other_timer = [("provider", "gcp"), ("outcome", "fail"), ("job", "db_server_other")];
    stack.expect_sample("other_timer_count", &other_timer, 1.0);
    stack.expect_sample("other_timer", &[other_timer.as_slice(), &[("quantile", "0.99")]].concat(), 40.0);

    // `drop`: the mapped line arrives; the other, sent in the same datagram, is dropped
    // at the collector and counted there.
    stack.expect_histogram("my_timer", &[("provider", "b"), ("outcome", "c"), ("job", "a_server")], 1.0, 0.012);
    let rule_partials = "rule_partials_total";
    stack.wait_for_collector_metric(5, rule_partials, "rule=\"mapping[1]:.\",action=\"dropped\"", 1.0);
    stack.wait_for_collector_metric(5, rule_partials, "rule=\"mapping[0]:test.timing.*.*.*\",action=\"mapped\"", 1.0);

    // `match_metric_type`: one name, a rule per kind; the regex rule maps gauges only.
    stack.expect_sample("test_foo_sum_total", &[], 2.0);
    stack.expect_sample("test_foo_current", &[], 11.0);
    stack.expect_histogram("test_foo_seconds", &[], 1.0, 0.007);
    stack.expect_sample("bar_gauge", &[], 13.0);
    stack.expect_sample("test_bar_x_total", &[], 1.0);

    stack.assert_absent("anything.*|dropped.*");
}

const TAG_RULES: &str = r#"[rules]
allow = ["app.*"]
deny = ["app.debug.*"]
global_tags = { region = "eu-west-1" }
name_prefix = "edge_"

[[rules.tags]]
match = "app.requests"
drop = ["request_id"]
rename = { env = "environment" }

[[rules.tags]]
match = "app.latency"
keep = ["route"]
"#;

#[test]
fn allow_deny_tag_rules_global_tags_and_prefix_shape_what_arrives() {
    let stack = Stack::start(&[CollectorRules { mapping: None, rules: TAG_RULES }]);
    stack.send(
        0,
        &[
            // Two series until `request_id` is dropped: one after, summed.
            "app.requests:2|c|#env:prod,request_id:abc123,route:/users",
            "app.requests:5|c|#env:prod,request_id:def456,route:/users",
            // Only `route` is kept; `region` then comes from the global tags.
            "app.latency:10|ms|#route:/a,user:bob,region:us-east-1",
            "app.latency:30|ms|#route:/a,user:eve",
            // A tag the series carries wins over a global tag.
            "app.queue_depth:17|g|#queue:mail,region:us-east-1",
            // Denied, and not allowed.
            "app.debug.trace:1|c|#env:prod",
            "other.requests:1|c",
        ],
    );

    stack.expect_sample(
        "edge_app_requests_total",
        &[("environment", "prod"), ("route", "/users"), ("region", "eu-west-1")],
        7.0,
    );
    // 10 ms and 30 ms, kept in seconds.
    let latency = [("route", "/a"), ("region", "eu-west-1")];
    stack.expect_histogram("edge_app_latency", &latency, 2.0, 0.04);
    stack.expect_sample("edge_app_latency_min", &latency, 0.01);
    stack.expect_sample("edge_app_latency_max", &latency, 0.03);
    stack.expect_sample("edge_app_queue_depth", &[("queue", "mail"), ("region", "us-east-1")], 17.0);

    let rule_partials = "rule_partials_total";
    stack.wait_for_collector_metric(0, rule_partials, "rule=\"deny[0]:app.debug.*\",action=\"dropped\"", 1.0);
    stack.wait_for_collector_metric(0, rule_partials, "rule=\"allow\",action=\"dropped\"", 1.0);
    stack.wait_for_collector_metric(0, rule_partials, "rule=\"tags[0]:app.requests\",action=\"rewritten\"", 2.0);
    stack.wait_for_collector_metric(0, rule_partials, "rule=\"tags[1]:app.latency\",action=\"rewritten\"", 2.0);
    stack.assert_absent(".*debug.*|.*other.*");
    assert_eq!(stack.label_sets("{__name__=~\".+\",request_id!=\"\"}"), [] as [BTreeMap<String, String>; 0]);
    assert_eq!(stack.label_sets("{__name__=~\".+\",env!=\"\"}"), [] as [BTreeMap<String, String>; 0]);
}

/// A counter line sent every 20 ms from a thread of its own until stopped.
struct Sender {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Sender {
    fn start(target: SocketAddr, line: &'static str) -> Sender {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut sent = 0;
            while !stopping.load(Ordering::Relaxed) {
                socket.send_to(line.as_bytes(), target).unwrap();
                sent += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            sent
        });
        Sender { stop, thread }
    }

    /// Stops sending; how many lines were sent.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sender thread")
    }
}

/// A mapping file naming `reload.<svc>.hits` `name` with a `svc` label.
fn hits_mapping(name: &str) -> String {
    format!("mappings:\n- match: \"reload.*.hits\"\n  name: \"{name}\"\n  labels:\n    svc: \"$1\"\n")
}

/// The series the web service's hits arrive as once mapped to `name` (a counter: `_total`).
fn hits_series(name: &str) -> String {
    selector(&format!("{name}_total"), &[("svc", "web")])
}

/// Waits until the web service's hits arrive under `name`.
fn wait_for_hits_under(stack: &Stack, name: &str) {
    let series = hits_series(name);
    wait_until(&format!("{series} > 0"), WAIT, || stack.value_or_zero(&series) > 0.0);
}

/// One collector whose mapping file names the hits `first_name`, and a [`Sender`] of
/// `reload.web.hits:1|c` to it, started once the hits arrive under `first_name`.
fn start_sending_hits(first_name: &str) -> (Stack, Sender) {
    let stack = Stack::start(&[CollectorRules::mapping(&hits_mapping(first_name))]);
    let sender = Sender::start(stack.collectors[0].1, "reload.web.hits:1|c");
    wait_for_hits_under(&stack, first_name);
    (stack, sender)
}

/// Replaces `path` at once (written beside it, then renamed over it), so the collector
/// never reads a half-written file; with `modified`, the new file keeps that time.
fn replace_file(path: &Path, text: &str, modified: Option<SystemTime>) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    if let Some(time) = modified {
        std::fs::File::options().write(true).open(&next).unwrap().set_modified(time).unwrap();
    }
    std::fs::rename(&next, path).unwrap();
}

/// `(modified, size)`: what the collector's once-a-second poll compares.
fn stamp(path: &Path) -> (SystemTime, u64) {
    let metadata = std::fs::metadata(path).unwrap();
    (metadata.modified().unwrap(), metadata.len())
}

/// `tessera_collector_rules_reloads_total{result}` of collector 0.
fn reloads(stack: &Stack, result: &str) -> f64 {
    stack.collector(0).metric("tessera_collector_rules_reloads_total", &format!("result=\"{result}\""))
}

/// Stops `sender` and waits until the hits under `names` (see [`hits_series`]) hold,
/// together, exactly what was sent, which the collector received whole.
fn assert_every_line_arrived_once(stack: &Stack, sender: Sender, names: &[&str]) {
    let sent = sender.stop() as f64;
    stack.wait_for_collector_metric(0, "lines_received_total", "", sent);
    let queries: Vec<String> = names.iter().map(|name| hits_series(name)).collect();
    let mut last = Vec::new();
    wait_until(&format!("{names:?} to hold {sent} together"), WAIT, || {
        last = queries.iter().map(|query| stack.value_or_zero(query)).collect();
        last.iter().sum::<f64>() == sent
    });
    assert!(last.iter().all(|value| *value > 0.0), "each name holds a part: {names:?} = {last:?}");
    eprintln!("sent {sent}: {names:?} = {last:?}");
}

#[test]
fn a_broken_mapping_file_keeps_the_rules_and_a_good_one_applies_without_losing_a_partial() {
    let (stack, sender) = start_sending_hits("hits_a");
    let path = stack.collectors[0].2.clone();
    let a = hits_series("hits_a");

    // Broken YAML: refused, counted, and A's rules stay.
    replace_file(&path, "mappings:\n- match: [unclosed\n", None);
    stack.wait_for_collector_metric(0, "rules_reloads_total", "result=\"failed\"", 1.0);
    let before = stack.value_or_zero(&a);
    wait_until(&format!("{a} > {before} after the failed reload"), WAIT, || stack.value_or_zero(&a) > before);
    assert_eq!(reloads(&stack, "applied"), 0.0);

    // A good file: applied, from the next window on.
    replace_file(&path, &hits_mapping("hits_b"), None);
    stack.wait_for_collector_metric(0, "rules_reloads_total", "result=\"applied\"", 1.0);
    wait_for_hits_under(&stack, "hits_b");

    assert_every_line_arrived_once(&stack, sender, &["hits_a", "hits_b"]);
    assert_eq!((reloads(&stack, "failed"), reloads(&stack, "applied")), (1.0, 1.0));
    // Nothing went through unmapped (as an empty or half-read file would have made it).
    stack.assert_absent("reload.*");
}

#[test]
fn sighup_reloads_a_mapping_file_whose_change_the_poll_cannot_see() {
    let (stack, sender) = start_sending_hits("hup_aa");
    let path = stack.collectors[0].2.clone();

    // Same size, same modification time: only a SIGHUP makes the collector read it.
    let before = stamp(&path);
    replace_file(&path, &hits_mapping("hup_bb"), Some(before.0));
    assert_eq!(stamp(&path), before, "the poll sees no change");
    stack.collector(0).signal("HUP");
    stack.wait_for_collector_metric(0, "rules_reloads_total", "result=\"applied\"", 1.0);
    wait_for_hits_under(&stack, "hup_bb");

    assert_every_line_arrived_once(&stack, sender, &["hup_aa", "hup_bb"]);
    assert_eq!((reloads(&stack, "failed"), reloads(&stack, "applied")), (0.0, 1.0));
    let log = stack.collector(0).log();
    assert!(log.contains("why=\"SIGHUP\""), "the reload names the signal: {log}");
    assert!(!log.contains("why=\"a file changed\""), "no reload came from the poll: {log}");
}
