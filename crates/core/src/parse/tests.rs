use proptest::prelude::*;

use super::*;

fn metric(line: &[u8]) -> Line<'_> {
    match parse_line(line) {
        Parsed::Metric(metric) => metric,
        other => panic!("{:?} did not parse as a metric: {other:?}", String::from_utf8_lossy(line)),
    }
}

fn rejected(line: &[u8]) -> RejectReason {
    match parse_line(line) {
        Parsed::Rejected { reason, .. } => reason,
        other => panic!("{:?} was not rejected: {other:?}", String::from_utf8_lossy(line)),
    }
}

#[test]
fn accepts_every_type_and_field() {
    // (line, name, kind, values, sample rate, tags, timestamp)
    type Case = (&'static [u8], &'static [u8], MetricKind, &'static [f64], f64, &'static [&'static [u8]], Option<u64>);
    let cases: &[Case] = &[
        (b"a:1|c", b"a", MetricKind::Counter, &[1.0], 1.0, &[], None),
        (b"a.b-c_d:2.5|g", b"a.b-c_d", MetricKind::Gauge, &[2.5], 1.0, &[], None),
        (b"t:320|ms", b"t", MetricKind::Timer, &[320.0], 1.0, &[], None),
        (b"h:0.25|h", b"h", MetricKind::Histogram, &[0.25], 1.0, &[], None),
        (b"d:1:2:3|d", b"d", MetricKind::Distribution, &[1.0, 2.0, 3.0], 1.0, &[], None),
        (b"c:1|c|@0.1", b"c", MetricKind::Counter, &[1.0], 0.1, &[], None),
        (b"c:-4|c", b"c", MetricKind::Counter, &[-4.0], 1.0, &[], None),
        (b"c:1e3|c", b"c", MetricKind::Counter, &[1000.0], 1.0, &[], None),
        (b"c:.5|c", b"c", MetricKind::Counter, &[0.5], 1.0, &[], None),
        (b"t:1.5|ms|@0.5|#env:prod,az", b"t", MetricKind::Timer, &[1.5], 0.5, &[b"env:prod", b"az"], None),
        (b"g:7|g|#a:1|T1656581400", b"g", MetricKind::Gauge, &[7.0], 1.0, &[b"a:1"], Some(1_656_581_400)),
        (b"g:7|g|T1656581400|#a:1", b"g", MetricKind::Gauge, &[7.0], 1.0, &[b"a:1"], Some(1_656_581_400)),
        (b"g:7|g|c:abc123|#a:1", b"g", MetricKind::Gauge, &[7.0], 1.0, &[b"a:1"], None),
        (b"g:7|g|e:it-123|x:future|#a:1", b"g", MetricKind::Gauge, &[7.0], 1.0, &[b"a:1"], None),
        (b"c:1|c|#k: v ,, x:1:2", b"c", MetricKind::Counter, &[1.0], 1.0, &[b"k: v", b"x:1:2"], None),
        (b"c:1|c|#", b"c", MetricKind::Counter, &[1.0], 1.0, &[], None),
        (
            b"\xc3\xa9t\xc3\xa9:1|c|#caf\xc3\xa9:\xc3\xa0",
            "été".as_bytes(),
            MetricKind::Counter,
            &[1.0],
            1.0,
            &[b"caf\xc3\xa9:\xc3\xa0"],
            None,
        ),
    ];
    for (input, name, kind, values, rate, tags, timestamp) in cases {
        let line = metric(input);
        let shown = String::from_utf8_lossy(input);
        assert_eq!(line.name, *name, "{shown}");
        assert_eq!(line.kind, *kind, "{shown}");
        assert_eq!(line.values().map(|v| v.value).collect::<Vec<_>>(), *values, "{shown}");
        assert_eq!(line.sample_rate, *rate, "{shown}");
        assert_eq!(line.tags().collect::<Vec<_>>(), *tags, "{shown}");
        assert_eq!(line.timestamp, *timestamp, "{shown}");
    }
}

#[test]
fn gauge_signs_are_marked_for_delta_semantics() {
    let signs: Vec<_> = metric(b"g:+3:-2:4|g").values().map(|v| (v.value, v.signed)).collect();
    assert_eq!(signs, vec![(3.0, true), (-2.0, true), (4.0, false)]);
}

#[test]
fn set_members_are_taken_whole() {
    let line = metric(b"users:alice:smith|s|#app:x");
    assert_eq!(line.kind, MetricKind::Set);
    assert_eq!(line.set_member(), b"alice:smith");
    assert_eq!(line.values().count(), 0);
    assert_eq!(rejected(b"users:|s"), RejectReason::BadValue);
}

#[test]
fn rejects_each_bad_line_with_its_reason() {
    let cases: &[(&[u8], RejectReason)] = &[
        (b":1|c", RejectReason::EmptyName),
        (b"a", RejectReason::MissingValue),
        (b"a|c", RejectReason::MissingValue),
        (b"a:1", RejectReason::MissingType),
        (b"a:|c", RejectReason::BadValue),
        (b"a:x|c", RejectReason::BadValue),
        (b"a:1:|c", RejectReason::BadValue),
        (b"a:1:y|d", RejectReason::BadValue),
        (b"a:1.2.3|c", RejectReason::BadValue),
        (b"a:0x10|c", RejectReason::BadValue),
        (b"a:-|c", RejectReason::BadValue),
        (b"a:NaN|g", RejectReason::NonFiniteValue),
        (b"a:inf|ms", RejectReason::NonFiniteValue),
        (b"a:-Infinity|ms", RejectReason::NonFiniteValue),
        (b"a:1e400|c", RejectReason::NonFiniteValue),
        (b"a:1|x", RejectReason::UnknownType),
        (b"a:1|", RejectReason::UnknownType),
        (b"a:1|C", RejectReason::UnknownType),
        (b"a:1|c|@0", RejectReason::BadSampleRate),
        (b"a:1|c|@1.5", RejectReason::BadSampleRate),
        (b"a:1|c|@-0.5", RejectReason::BadSampleRate),
        (b"a:1|c|@", RejectReason::BadSampleRate),
        (b"a:1|c|@abc", RejectReason::BadSampleRate),
        (b"a:1|c|#:v", RejectReason::BadTags),
        (b"a:1|c|#ok,:v", RejectReason::BadTags),
        (b"a:1|c|#k:\xff\xfe", RejectReason::InvalidUtf8),
        (b"\xffname:1|c", RejectReason::InvalidUtf8),
        (b"a:1|c|T", RejectReason::BadTimestamp),
        (b"a:1|c|T12x", RejectReason::BadTimestamp),
        (b"a:1|c|T-5", RejectReason::BadTimestamp),
        (b"_e{5,4}title|text", RejectReason::BadEvent),
        (b"_e{x,4}:title|text", RejectReason::BadEvent),
        (b"_sc|name", RejectReason::BadEvent),
        (b"_sc||0", RejectReason::BadEvent),
    ];
    for (line, reason) in cases {
        assert_eq!(rejected(line), *reason, "{}", String::from_utf8_lossy(line));
    }
}

#[test]
fn too_many_tags_and_too_long_lines_are_rejected() {
    let mut line = b"a:1|c|#".to_vec();
    for i in 0..=MAX_TAGS {
        line.extend_from_slice(format!("t{i}:v,").as_bytes());
    }
    assert_eq!(rejected(&line), RejectReason::TooManyTags);

    let long = format!("a:1|c|#k:{}", "v".repeat(DEFAULT_MAX_LINE_BYTES));
    assert_eq!(rejected(long.as_bytes()), RejectReason::LineTooLong);
    let options = ParseOptions { max_line_bytes: 8, ..ParseOptions::default() };
    assert!(matches!(
        parse_line_with(b"abcdefgh:1|c", options),
        Parsed::Rejected { reason: RejectReason::LineTooLong, .. }
    ));
    assert!(matches!(parse_line_with(b"ab:1|c", options), Parsed::Metric(_)));
}

#[test]
fn events_and_service_checks_are_recognised_not_parsed_as_metrics() {
    assert!(matches!(parse_line(b"_e{5,4}:title|text|#env:prod"), Parsed::Event(_)));
    assert!(matches!(parse_line(b"_sc|db.up|0|#env:prod|m:ok"), Parsed::ServiceCheck(_)));
    // A metric whose name merely starts with an underscore is still a metric.
    assert_eq!(metric(b"_events:1|c").name, b"_events");
}

#[test]
fn a_datagram_of_good_and_bad_lines_keeps_every_good_line() {
    let datagram = b"a:1|c\r\n\n\nbad line\nb:2|g\r\n:3|c\nc:1:2|ms\n_e{1,1}:t|x\nd:\xff|s\ne:9|h|@0.5";
    let mut metrics = Vec::new();
    let mut reasons = Vec::new();
    let mut events = 0;
    parse_datagram(datagram, |parsed| match parsed {
        Parsed::Metric(line) => metrics.push(line.name.to_vec()),
        Parsed::Rejected { reason, .. } => reasons.push(reason),
        Parsed::Event(_) | Parsed::ServiceCheck(_) => events += 1,
    });
    assert_eq!(metrics, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec(), b"e".to_vec()]);
    assert_eq!(reasons, vec![RejectReason::MissingValue, RejectReason::EmptyName]);
    assert_eq!(events, 1);
}

#[test]
fn missing_final_newline_and_crlf_are_handled() {
    let mut names = Vec::new();
    parse_datagram(b"a:1|c\r\nb:1|c", |parsed| {
        if let Parsed::Metric(line) = parsed {
            names.push(line.name);
        }
    });
    assert_eq!(names, vec![&b"a"[..], b"b"]);
}

#[test]
fn fast_float_path_agrees_with_the_standard_parser() {
    for text in ["0", "1", "-1", "+1", "0.1", "123.456", "999999999999999", "0.000001", "1.", ".5", "12345678.87654321"]
    {
        let want: f64 = text.parse().unwrap();
        assert_eq!(parse_f64(text.as_bytes()), Some(want), "{text}");
    }
    for text in ["", ".", "-", "+", "1..2", "1-2", "abc"] {
        assert_eq!(parse_f64(text.as_bytes()), None, "{text}");
    }
}

fn name_strategy() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_.\\-]{0,30}"
}

fn tag_strategy() -> impl Strategy<Value = String> {
    ("[a-z][a-z0-9_]{0,10}", proptest::option::of("[a-zA-Z0-9_./\\-]{0,12}")).prop_map(|(key, value)| match value {
        Some(value) => format!("{key}:{value}"),
        None => key,
    })
}

proptest! {
    #[test]
    fn generated_lines_parse_back_to_what_generated_them(
        name in name_strategy(),
        kind_index in 0usize..5,
        values in proptest::collection::vec(-1.0e9f64..1.0e9, 1..5),
        rate in proptest::option::of(0.001f64..=1.0),
        tags in proptest::collection::vec(tag_strategy(), 0..6),
        timestamp in proptest::option::of(0u64..4_000_000_000),
    ) {
        let kind = [MetricKind::Counter, MetricKind::Gauge, MetricKind::Timer, MetricKind::Histogram, MetricKind::Distribution][kind_index];
        let packed: Vec<String> = values.iter().map(|v| format!("{v}")).collect();
        let mut text = format!("{name}:{}|{}", packed.join(":"), kind.code());
        if let Some(rate) = rate {
            text.push_str(&format!("|@{rate}"));
        }
        if !tags.is_empty() {
            text.push_str(&format!("|#{}", tags.join(",")));
        }
        if let Some(timestamp) = timestamp {
            text.push_str(&format!("|T{timestamp}"));
        }
        let line = metric(text.as_bytes());
        prop_assert_eq!(line.name, name.as_bytes());
        prop_assert_eq!(line.kind, kind);
        prop_assert_eq!(line.values().map(|v| v.value).collect::<Vec<_>>(), values);
        prop_assert_eq!(line.sample_rate, rate.unwrap_or(1.0));
        prop_assert_eq!(line.tags().collect::<Vec<_>>(), tags.iter().map(|t| t.as_bytes()).collect::<Vec<_>>());
        prop_assert_eq!(line.timestamp, timestamp);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut lines = 0;
        parse_datagram(&bytes, |_| lines += 1);
        prop_assert!(lines <= bytes.len());
    }

    #[test]
    fn the_simple_path_agrees_with_the_full_parser_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        assert_simple_agrees(&bytes);
    }

    #[test]
    fn the_simple_path_agrees_with_the_full_parser_on_near_simple_lines(
        line in "_?(e\\{1,1\\})?[a-z._é,#=\\[\\]]{0,12}(:[-+]?[0-9.]{0,18}){0,2}(\\|(c|g|ms|h|d|s|x|@0\\.5|#a:b|T1|c:x|#[ab:,| é]{0,10}))*",
    ) {
        assert_simple_agrees(line.as_bytes());
    }

    #[test]
    fn the_prefix_path_takes_exactly_the_first_line(
        lines in proptest::collection::vec(
            "_?[a-z._é]{0,12}(:[-+]?[0-9.]{0,18}){0,2}(\\|(c|g|ms|h|d|s|x|@0\\.5|#a:b|T1|#[ab:,| é]{0,10}))*\r?",
            1..4,
        ),
        max_line_bytes in 1usize..40,
    ) {
        let datagram = lines.join("\n");
        assert_prefix_agrees(datagram.as_bytes(), max_line_bytes);
    }

    #[test]
    fn the_prefix_path_agrees_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
        assert_prefix_agrees(&bytes, 16 * 1024);
    }

    #[test]
    fn a_bad_line_never_hides_its_neighbours(garbage in proptest::collection::vec(any::<u8>(), 0..64)) {
        let garbage: Vec<u8> = garbage.into_iter().filter(|b| *b != b'\n').collect();
        let mut datagram = b"before:1|c\n".to_vec();
        datagram.extend_from_slice(&garbage);
        datagram.extend_from_slice(b"\nafter:2|g");
        let mut names = Vec::new();
        parse_datagram(&datagram, |parsed| if let Parsed::Metric(line) = parsed { names.push(line.name.to_vec()) });
        prop_assert_eq!(names.first().map(Vec::as_slice), Some(&b"before"[..]));
        prop_assert_eq!(names.last().map(Vec::as_slice), Some(&b"after"[..]));
    }
}

/// Whenever [`parse_simple_prefix`] accepts the start of `bytes`, it used
/// exactly the first line and its newline, and [`parse_simple`] reads that
/// line the same way.
fn assert_prefix_agrees(bytes: &[u8], max_line_bytes: usize) {
    let Some((simple, used)) = parse_simple_prefix(bytes, max_line_bytes) else { return };
    let line_end = bytes.iter().position(|byte| *byte == b'\n').unwrap_or(bytes.len());
    assert_eq!(used, (line_end + 1).min(bytes.len()), "{:?}", String::from_utf8_lossy(bytes));
    let line = bytes[..line_end].strip_suffix(b"\r").unwrap_or(&bytes[..line_end]);
    assert!(line.len() <= max_line_bytes);
    assert_eq!(parse_simple(line), Some(simple), "{:?}", String::from_utf8_lossy(bytes));
    assert_simple_agrees(line);
}

/// Every combination of the name tag switches.
fn every_name_tag_option() -> impl Iterator<Item = ParseOptions> {
    (0..8).map(|bits| ParseOptions {
        influxdb_tags: bits & 1 != 0,
        librato_tags: bits & 2 != 0,
        signalfx_tags: bits & 4 != 0,
        ..ParseOptions::default()
    })
}

/// Whenever [`parse_simple`] accepts a line, the full parser reads it the
/// same way, whichever name tag styles are on.
fn assert_simple_agrees(line: &[u8]) {
    for options in every_name_tag_option() {
        assert_simple_agrees_with(line, options);
    }
}

fn assert_simple_agrees_with(line: &[u8], options: ParseOptions) {
    let Some(simple) = parse_simple(line) else { return };
    let Parsed::Metric(full) = parse_line_with(line, options) else {
        panic!("{:?}: simple accepted what the full parser does not: {simple:?}", String::from_utf8_lossy(line))
    };
    assert!(!full.has_tags_beyond_tag_field() && full.name_tag_errors == 0, "{full:?}");
    assert_eq!(
        (simple.name, simple.kind, simple.value.to_bits()),
        (full.name, full.kind, full.first.value.to_bits()),
        "{:?}",
        String::from_utf8_lossy(line)
    );
    assert!(!full.first.signed && !full.packed && full.sample_rate == 1.0, "{full:?}");
    assert!(full.timestamp.is_none() && full.kind != MetricKind::Set, "{full:?}");
    assert_eq!(simple.tags, full.tags);
    if !simple.tags.is_empty() {
        // Tags the simple path takes as they are must be what the key builder makes of them.
        let mut key = crate::series::SeriesKey::default();
        key.build(&full).unwrap();
        let mut expected = simple.name.to_vec();
        expected.extend_from_slice(b"|#");
        expected.extend_from_slice(simple.tags);
        assert_eq!(key.id(), expected.as_slice(), "{:?}", String::from_utf8_lossy(line));
    }
}

#[test]
fn the_simple_path_takes_plain_lines_and_leaves_the_rest_to_the_full_parser() {
    // Every line, and whether the simple path takes it (and agrees with the full parser)
    // or both the simple path and its prefix form leave it to the full parser.
    const SIMPLE: bool = true;
    const FULL_ONLY: bool = false;
    for (line, simple) in [
        (&b"a:1|c"[..], SIMPLE),
        (b"a.b_c-d:12.50|ms", SIMPLE),
        (b"g:0.5|g", SIMPLE),
        (b"h:3|h", SIMPLE),
        (b"d:.5|d", SIMPLE),
        (b"x:7.|c", SIMPLE),
        (b"t:1|c|#a", SIMPLE),
        (b"t:1|c|#a,a:,a:1,b:0,b:1", SIMPLE),
        (b"t:1|ms|#env:prod,host:h1,route:/api/v1", SIMPLE),
        (b"a:1|c|@0.5", FULL_ONLY),
        (b"a:-1|g", FULL_ONLY),
        (b"a:+1|g", FULL_ONLY),
        (b"a:1:2|c", FULL_ONLY),
        (b"a:u1|s", FULL_ONLY),
        (b"a:1e3|c", FULL_ONLY),
        (b"a:1234567890123456|c", FULL_ONLY),
        (b":1|c", FULL_ONLY),
        (b"\xc3\xa9:1|c", FULL_ONLY),
        (b"_e{1,1}:1|c", FULL_ONLY),
        (b"a:1|cc", FULL_ONLY),
        (b"a:|c", FULL_ONLY),
        (b"a:.|c", FULL_ONLY),
        (b"t:1|c|#", FULL_ONLY),
        (b"t:1|c|#b,a", FULL_ONLY),
        (b"t:1|c|#a:1,a", FULL_ONLY),
        (b"t:1|c|#a,a", FULL_ONLY),
        (b"t:1|c|#a,,b", FULL_ONLY),
        (b"t:1|c|#a, b", FULL_ONLY),
        (b"t:1|c|#:v", FULL_ONLY),
        (b"t:1|c|#a|@0.5", FULL_ONLY),
        (b"t:1|c|#a\xc3\xa9", FULL_ONLY),
        (b"t:1|c|@0.5|#a", FULL_ONLY),
        (b"t:1|c|c:abc", FULL_ONLY),
        (b"api.hits,env=prod:1|c", FULL_ONLY),
        (b"api.hits#env=prod:1|c", FULL_ONLY),
        (b"api.[env=prod]hits:1|c", FULL_ONLY),
        (b"api]hits:1|c", FULL_ONLY),
        (b"api.hits.and.a.long.name,env=prod:1|c", FULL_ONLY),
        (b"api hits:1|c", FULL_ONLY),
    ] {
        if simple {
            assert!(parse_simple(line).is_some(), "{:?}", String::from_utf8_lossy(line));
            assert_simple_agrees(line);
        } else {
            assert!(parse_simple(line).is_none(), "{:?}", String::from_utf8_lossy(line));
            assert!(parse_simple_prefix(line, 1024).is_none(), "{:?}", String::from_utf8_lossy(line));
        }
    }
    for datagram in [&b"a:1|c\nb"[..], b"a:1|c\r\nb", b"a:1|c", b"a:1|c\r", b"name.long.enough:12|ms\n"] {
        assert_prefix_agrees(datagram, 1024);
        assert!(parse_simple_prefix(datagram, 1024).is_some(), "{:?}", String::from_utf8_lossy(datagram));
    }
    assert!(parse_simple_prefix(b"abcdef:1|c", 9).is_none(), "longer than the bound");
    assert!(parse_simple_prefix(b"abcdef:1|c\n", 10).is_some());
    assert!(parse_simple_prefix(b"\na:1|c", 1024).is_none(), "a blank line is the full path's");
    assert!(parse_simple_prefix(b"ab\ncd:1|c", 1024).is_none(), "a line without a colon");
}

/// The series a line becomes under `options` (its name and its tags, from
/// the canonical id), or why it was rejected.
fn series_of(text: &[u8], options: ParseOptions) -> Result<(String, Vec<(String, String)>), RejectReason> {
    let lossy = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    match parse_line_with(text, options) {
        Parsed::Metric(line) => {
            let mut key = crate::series::SeriesKey::default();
            key.build(&line).expect("accepted lines fit the tag limit");
            let (name, _) = crate::series::split_id(key.id());
            let tags = crate::series::id_tags(key.id()).map(|(key, value)| (lossy(key), lossy(value))).collect();
            Ok((lossy(name), tags))
        }
        Parsed::Rejected { reason, .. } => Err(reason),
        other => panic!("{:?} is not a metric line: {other:?}", lossy(text)),
    }
}

/// `(name, [(key, value)])` as [`series_of`] gives it.
fn series(name: &str, tags: &[(&str, &str)]) -> Result<(String, Vec<(String, String)>), RejectReason> {
    Ok((name.to_owned(), tags.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()))
}

#[test]
fn tags_written_in_the_name_become_tags_of_the_series() {
    // (line, name, name rest, well-formed name tags, tag errors)
    type Case = (&'static [u8], &'static [u8], &'static [u8], &'static [(&'static [u8], &'static [u8])], u32);
    let cases: &[Case] = &[
        (b"api.hits,env=prod,host=a:1|c", b"api.hits", b"", &[(b"env", b"prod"), (b"host", b"a")], 0),
        (b"api.hits#env=prod:1|c", b"api.hits", b"", &[(b"env", b"prod")], 0),
        (b"api.[env=prod]hits:1|c", b"api.", b"hits", &[(b"env", b"prod")], 0),
        (b"[env=prod]api.hits:1|c", b"api.hits", b"", &[(b"env", b"prod")], 0),
        (b"api.hits[env=prod]:1|c", b"api.hits", b"", &[(b"env", b"prod")], 0),
        (b"api.hits[]:1|c", b"api.hits", b"", &[], 0),
        (b"api.hits,:1|c", b"api.hits", b"", &[], 0),
        (b"api.hits,env=prod,:1|c", b"api.hits", b"", &[(b"env", b"prod")], 0),
        (b"api.hits,env=prod,bad,=x,y=:1|c", b"api.hits", b"", &[(b"env", b"prod")], 3),
        (b"api.hits,,env=prod:1|c", b"api.hits", b"", &[(b"env", b"prod")], 1),
        (b"api.hits#path=/h?a=b:1|c", b"api.hits", b"", &[(b"path", b"/h?a=b")], 0),
        (b"api.hits, env=prod :1|c", b"api.hits", b"", &[(b"env", b"prod")], 0),
        (b"api]hits:1|c", b"api]hits", b"", &[], 1),
        (b"api[hits:1|c", b"api[hits", b"", &[], 1),
        (b"api.[a=1]hits,b=2:1|c", b"api.", b"hits,b=2", &[(b"a", b"1")], 0),
        (b"lat,env=prod:1:2:3|ms|@0.5|T1700000000", b"lat", b"", &[(b"env", b"prod")], 0),
        (b"users#app=web:alice|s", b"users", b"", &[(b"app", b"web")], 0),
        (b"\xc3\xa9t\xc3\xa9,lieu=caf\xc3\xa9:1|c", b"\xc3\xa9t\xc3\xa9", b"", &[(b"lieu", b"caf\xc3\xa9")], 0),
        (b"plain.name:1|c", b"plain.name", b"", &[], 0),
        (b"spaced name:1|c", b"spaced name", b"", &[], 0),
    ];
    for (input, name, name_rest, name_tags, errors) in cases {
        let line = metric(input);
        let shown = String::from_utf8_lossy(input);
        assert_eq!((line.name, line.name_rest()), (*name, *name_rest), "{shown}");
        assert_eq!(line.name_tags().collect::<Vec<_>>(), name_tags.to_vec(), "{shown}");
        assert_eq!(line.name_tag_errors, *errors, "{shown}");
        assert!(line.tags.is_empty(), "{shown}");
    }
}

#[test]
fn each_switch_leaves_its_style_in_the_name() {
    let all = ParseOptions::default();
    let no_influxdb = ParseOptions { influxdb_tags: false, ..all };
    let no_librato = ParseOptions { librato_tags: false, ..all };
    let no_signalfx = ParseOptions { signalfx_tags: false, ..all };
    let none = ParseOptions { influxdb_tags: false, librato_tags: false, signalfx_tags: false, ..all };
    assert_eq!(series_of(b"a,env=prod:1|c", no_influxdb), series("a,env=prod", &[]));
    assert_eq!(series_of(b"a#env=prod:1|c", no_librato), series("a#env=prod", &[]));
    assert_eq!(series_of(b"a.[env=prod]b:1|c", no_signalfx), series("a.[env=prod]b", &[]));
    assert_eq!(series_of(b"a#env=prod:1|c", no_influxdb), series("a", &[("env", "prod")]));
    assert_eq!(series_of(b"a,env=prod:1|c", no_librato), series("a", &[("env", "prod")]));
    for line in [&b"a,env=prod:1|c"[..], b"a#env=prod:1|c", b"a.[env=prod]b:1|c", b"a]b:1|c"] {
        let Parsed::Metric(parsed) = parse_line_with(line, none) else { panic!("{line:?}") };
        assert_eq!(parsed.name, &line[..line.iter().position(|byte| *byte == b':').unwrap()]);
        assert!(!parsed.has_tags_beyond_tag_field() && parsed.name_tag_errors == 0, "{parsed:?}");
    }
    // With every style off, a name tag and a tag field do not mix.
    assert_eq!(series_of(b"a,env=prod:1|c|#x:1", none), series("a,env=prod", &[("x", "1")]));
}

#[test]
fn name_tags_and_a_tag_field_on_one_line_are_refused() {
    for line in [
        &b"a,env=prod:1|c|#x:1"[..],
        b"a#env=prod:1|c|@0.5|#x:1",
        b"a[env=prod]:1|c|#x:1",
        b"a,env=prod:1|c|#",
        b"a,env=prod:1:2|d|T1|#x:1",
    ] {
        assert_eq!(rejected(line), RejectReason::MixedTagStyles, "{}", String::from_utf8_lossy(line));
    }
    // Name tags that are all malformed mix nothing: the line keeps its tag field.
    let line = metric(b"a,bad:1|c|#x:1");
    assert_eq!((line.name, line.tags, line.name_tag_errors), (&b"a"[..], &b"x:1"[..], 1));
    assert_eq!(series_of(b"a,bad:1|c|#x:1", ParseOptions::default()), series("a", &[("x", "1")]));
    // A container id is no tag style.
    assert_eq!(
        series_of(b"a,env=prod:1|c|c:f00d", ParseOptions::default()),
        series("a", &[("container_id", "f00d"), ("env", "prod")])
    );
}

#[test]
fn a_name_left_empty_by_its_tags_is_rejected() {
    for line in [&b",env=prod:1|c"[..], b"#env=prod:1|c", b"[env=prod]:1|c", b"[]:1|c", b",:1|c"] {
        assert_eq!(rejected(line), RejectReason::EmptyName, "{}", String::from_utf8_lossy(line));
    }
    let none =
        ParseOptions { influxdb_tags: false, librato_tags: false, signalfx_tags: false, ..ParseOptions::default() };
    assert!(matches!(parse_line_with(b",env=prod:1|c", none), Parsed::Metric(_)));
}

#[test]
fn the_container_id_becomes_a_tag() {
    let options = ParseOptions::default();
    assert_eq!(metric(b"a:1|c|c:f00d").container_id, b"f00d");
    assert_eq!(series_of(b"a:1|c|c:f00d", options), series("a", &[("container_id", "f00d")]));
    assert_eq!(series_of(b"a:1|c|#z:1|c:f00d", options), series("a", &[("container_id", "f00d"), ("z", "1")]));
    assert_eq!(series_of(b"a:1|c|c:f00d|#z:1", options), series("a", &[("container_id", "f00d"), ("z", "1")]));
    assert_eq!(series_of(b"a:1|c|c: f00d ", options), series("a", &[("container_id", "f00d")]));
    assert_eq!(series_of(b"a:1|c|c:ci-1:2", options), series("a", &[("container_id", "ci-1:2")]));
    // Empty, or a field that only starts with `c`: ignored, as before.
    for line in [&b"a:1|c|c:"[..], b"a:1|c|c", b"a:1|c|cx", b"a:1|c|c:  "] {
        let parsed = metric(line);
        assert!(parsed.container_id.is_empty() && !parsed.has_tags_beyond_tag_field(), "{parsed:?}");
    }
    assert_eq!(rejected(b"a:1|c|c:a,b"), RejectReason::BadTags);
    assert_eq!(rejected(b"a:1|c|c:\xff"), RejectReason::InvalidUtf8);
}

#[test]
fn name_tags_and_the_container_id_count_towards_the_tag_limit() {
    let many =
        |separator: char, count: usize| (0..count).map(|i| format!("t{i}{separator}v")).collect::<Vec<_>>().join(",");
    assert!(matches!(parse_line(format!("a,{}:1|c", many('=', MAX_TAGS)).as_bytes()), Parsed::Metric(_)));
    assert_eq!(rejected(format!("a,{}:1|c", many('=', MAX_TAGS + 1)).as_bytes()), RejectReason::TooManyTags);
    assert_eq!(rejected(format!("a,{}:1|c|c:f00d", many('=', MAX_TAGS)).as_bytes()), RejectReason::TooManyTags);
    assert_eq!(rejected(format!("a:1|c|#{}|c:f00d", many(':', MAX_TAGS)).as_bytes()), RejectReason::TooManyTags);
    assert!(matches!(parse_line(format!("a:1|c|#{}|c:f00d", many(':', MAX_TAGS - 1)).as_bytes()), Parsed::Metric(_)));
}

/// Cases of statsd_exporter's `pkg/line/line_test.go` that state names and
/// labels for tags written in names and for the container id, each under
/// the switches of the upstream test it comes from (the comment before each
/// group names it, and each case keeps its upstream name). Upstream labels
/// are escaped Prometheus label names (`_09digits`, `tag_with_dots`); here
/// the keys stay as written, and the ingester escapes them the same way.
#[test]
fn statsd_exporter_cases_give_the_same_names_and_labels() {
    let all = ParseOptions::default();
    let no_influxdb = ParseOptions { influxdb_tags: false, ..all };
    let no_librato = ParseOptions { librato_tags: false, ..all };
    let no_signalfx = ParseOptions { signalfx_tags: false, ..all };
    let none = ParseOptions { influxdb_tags: false, librato_tags: false, signalfx_tags: false, ..all };
    let tag12 = &[("tag1", "bar"), ("tag2", "baz")][..];
    let odd_keys = &[("09digits", "0"), ("tag.with.dots", "1")][..];
    type Expected = Result<(String, Vec<(String, String)>), RejectReason>;
    let cases: Vec<(&str, ParseOptions, &[u8], Expected)> = vec![
        // TestLineToEvents (every style on).
        ("librato tag extension", all, b"foo#tag1=bar,tag2=baz:100|c", series("foo", tag12)),
        (
            "librato tag extension with tag keys unsupported by prometheus",
            all,
            b"foo#09digits=0,tag.with.dots=1:100|c",
            series("foo", odd_keys),
        ),
        ("influxdb tag extension", all, b"foo,tag1=bar,tag2=baz:100|c", series("foo", tag12)),
        (
            "influxdb tag extension with tag keys unsupported by prometheus",
            all,
            b"foo,09digits=0,tag.with.dots=1:100|c",
            series("foo", odd_keys),
        ),
        ("SignalFx tag extension", all, b"foo.[tag1=bar,tag2=baz]test:100|c", series("foo.test", tag12)),
        (
            "SignalFx tag extension, tags at end of name",
            all,
            b"foo.test[tag1=bar,tag2=baz]:100|c",
            series("foo.test", tag12),
        ),
        (
            "SignalFx tag extension, tags at beginning of name",
            all,
            b"[tag1=bar,tag2=baz]foo.test:100|c",
            series("foo.test", tag12),
        ),
        ("SignalFx tag extension, no tags", all, b"foo.[]test:100|c", series("foo.test", &[])),
        ("SignalFx tag extension, non-kv tags", all, b"foo.[tag1,tag2]test:100|c", series("foo.test", &[])),
        (
            "SignalFx tag extension, missing closing bracket",
            all,
            b"[tag1=bar,tag2=bazfoo.test:100|c",
            series("[tag1=bar,tag2=bazfoo.test", &[]),
        ),
        (
            "SignalFx tag extension, missing opening bracket",
            all,
            b"tag1=bar,tag2=baz]foo.test:100|c",
            series("tag1=bar,tag2=baz]foo.test", &[]),
        ),
        (
            "librato/dogstatsd mixed tag styles without sampling",
            all,
            b"foo#tag1=foo,tag3=bing:100|c|#tag1:bar,#tag2:baz",
            Err(RejectReason::MixedTagStyles),
        ),
        (
            "signalfx/dogstatsd mixed tag styles without sampling",
            all,
            b"foo[tag1=foo,tag3=bing]:100|c|#tag1:bar,#tag2:baz",
            Err(RejectReason::MixedTagStyles),
        ),
        (
            "influxdb/dogstatsd mixed tag styles without sampling",
            all,
            b"foo,tag1=foo,tag3=bing:100|c|#tag1:bar,#tag2:baz",
            Err(RejectReason::MixedTagStyles),
        ),
        (
            "mixed tag styles with sampling",
            all,
            b"foo#tag1=foo,tag3=bing:100|c|@0.1|#tag1:bar,#tag2:baz",
            Err(RejectReason::MixedTagStyles),
        ),
        (
            "dogstatsd container ID extension",
            all,
            b"foo:100|c|#tag1:value|c:container123",
            series("foo", &[("container_id", "container123"), ("tag1", "value")]),
        ),
        (
            "dogstatsd container ID with tags",
            all,
            b"foo:100|c|#tag1:bar,tag2:baz|c:container456",
            series("foo", &[("container_id", "container456"), ("tag1", "bar"), ("tag2", "baz")]),
        ),
        (
            "dogstatsd container ID with gauge",
            all,
            b"foo:50|g|#tag1:value|c:gauge_container",
            series("foo", &[("container_id", "gauge_container"), ("tag1", "value")]),
        ),
        (
            "dogstatsd container ID with timer",
            all,
            b"foo:1000|ms|#tag1:value|c:timer_container",
            series("foo", &[("container_id", "timer_container"), ("tag1", "value")]),
        ),
        (
            "dogstatsd container ID with histogram",
            all,
            b"foo:500|h|#tag1:value|c:hist_container",
            series("foo", &[("container_id", "hist_container"), ("tag1", "value")]),
        ),
        (
            "dogstatsd container ID with complex value",
            all,
            b"foo:100|c|#tag1:value|c:sha256:abcd1234efgh5678",
            series("foo", &[("container_id", "sha256:abcd1234efgh5678"), ("tag1", "value")]),
        ),
        // Upstream drops these two lines (`malformed_container_id`); tessera ignores the field.
        (
            "dogstatsd container ID malformed - no colon",
            all,
            b"foo:100|c|#tag1:value|c",
            series("foo", &[("tag1", "value")]),
        ),
        (
            "dogstatsd container ID malformed - no value after colon",
            all,
            b"foo:100|c|#tag1:value|c:",
            series("foo", &[("tag1", "value")]),
        ),
        // TestDisableParsingLineToEvents (every style off; its DogStatsD cases need a switch tessera does not have).
        ("librato tag extension", none, b"foo#tag1=bar,tag2=baz:100|c", series("foo#tag1=bar,tag2=baz", &[])),
        (
            "librato tag extension with tag keys unsupported by prometheus",
            none,
            b"foo#09digits=0,tag.with.dots=1:100|c",
            series("foo#09digits=0,tag.with.dots=1", &[]),
        ),
        ("influxdb tag extension", none, b"foo,tag1=bar,tag2=baz:100|c", series("foo,tag1=bar,tag2=baz", &[])),
        (
            "SignalFx tag extension",
            none,
            b"foo.[tag1=bar,tag2=baz]test:100|c",
            series("foo.[tag1=bar,tag2=baz]test", &[]),
        ),
        (
            "SignalFx tag extension, tags at end of name",
            none,
            b"foo.test[tag1=bar,tag2=baz]:100|c",
            series("foo.test[tag1=bar,tag2=baz]", &[]),
        ),
        (
            "SignalFx tag extension, tags at beginning of name",
            none,
            b"[tag1=bar,tag2=baz]foo.test:100|c",
            series("[tag1=bar,tag2=baz]foo.test", &[]),
        ),
        ("SignalFx tag extension, no tags", none, b"foo.[]test:100|c", series("foo.[]test", &[])),
        ("SignalFx tag extension, non-kv tags", none, b"foo.[tag1,tag2]test:100|c", series("foo.[tag1,tag2]test", &[])),
        (
            "influxdb tag extension with tag keys unsupported by prometheus",
            none,
            b"foo,09digits=0,tag.with.dots=1:100|c",
            series("foo,09digits=0,tag.with.dots=1", &[]),
        ),
        // TestDisableParsingInfluxdbLineToEvents.
        ("librato tag extension", no_influxdb, b"foo#tag1=bar,tag2=baz:100|c", series("foo", tag12)),
        ("influxdb tag extension", no_influxdb, b"foo,tag1=bar,tag2=baz:100|c", series("foo,tag1=bar,tag2=baz", &[])),
        ("SignalFx tag extension", no_influxdb, b"foo.[tag1=bar,tag2=baz]test:100|c", series("foo.test", tag12)),
        ("SignalFx tag extension, non-kv tags", no_influxdb, b"foo.[tag1,tag2]test:100|c", series("foo.test", &[])),
        (
            "influxdb tag extension with tag keys unsupported by prometheus",
            no_influxdb,
            b"foo,09digits=0,tag.with.dots=1:100|c",
            series("foo,09digits=0,tag.with.dots=1", &[]),
        ),
        // TestDisableParsingLibratoLineToEvents: Librato's `#` stays in the name, the rest is InfluxDB's.
        (
            "librato tag extension",
            no_librato,
            b"foo#tag1=bar,tag2=baz:100|c",
            series("foo#tag1=bar", &[("tag2", "baz")]),
        ),
        (
            "librato tag extension with tag keys unsupported by prometheus",
            no_librato,
            b"foo#09digits=0,tag.with.dots=1:100|c",
            series("foo#09digits=0", &[("tag.with.dots", "1")]),
        ),
        ("influxdb tag extension", no_librato, b"foo,tag1=bar,tag2=baz:100|c", series("foo", tag12)),
        ("SignalFx tag extension", no_librato, b"foo.[tag1=bar,tag2=baz]test:100|c", series("foo.test", tag12)),
        // TestDisableParsingSignalfxLineToEvents: brackets are name bytes, commas InfluxDB's.
        (
            "SignalFx tag extension",
            no_signalfx,
            b"foo.[tag1=bar,tag2=baz]test:100|c",
            series("foo.[tag1=bar", &[("tag2", "baz]test")]),
        ),
        (
            "SignalFx tag extension, tags at end of name",
            no_signalfx,
            b"foo.test[tag1=bar,tag2=baz]:100|c",
            series("foo.test[tag1=bar", &[("tag2", "baz]")]),
        ),
        (
            "SignalFx tag extension, tags at beginning of name",
            no_signalfx,
            b"[tag1=bar,tag2=baz]foo.test:100|c",
            series("[tag1=bar", &[("tag2", "baz]foo.test")]),
        ),
        ("SignalFx tag extension, no tags", no_signalfx, b"foo.[]test:100|c", series("foo.[]test", &[])),
        ("SignalFx tag extension, non-kv tags", no_signalfx, b"foo.[tag1,tag2]test:100|c", series("foo.[tag1", &[])),
        (
            "SignalFx tag extension, missing closing bracket",
            no_signalfx,
            b"[tag1=bar,tag2=bazfoo.test:100|c",
            series("[tag1=bar", &[("tag2", "bazfoo.test")]),
        ),
        (
            "SignalFx tag extension, missing opening bracket",
            no_signalfx,
            b"tag1=bar,tag2=baz]foo.test:100|c",
            series("tag1=bar", &[("tag2", "baz]foo.test")]),
        ),
        ("librato tag extension", no_signalfx, b"foo#tag1=bar,tag2=baz:100|c", series("foo", tag12)),
        ("influxdb tag extension", no_signalfx, b"foo,tag1=bar,tag2=baz:100|c", series("foo", tag12)),
    ];
    for (upstream, options, line, expected) in cases {
        assert_eq!(series_of(line, options), expected, "{upstream}: {}", String::from_utf8_lossy(line));
    }
}

fn name_tag_strategy() -> impl Strategy<Value = (String, String)> {
    ("[a-z][a-z0-9_.]{0,10}", "[a-zA-Z0-9_./\\-]{1,12}")
}

proptest! {
    #[test]
    fn every_way_of_writing_a_tag_gives_the_same_series(
        name in name_strategy(),
        tags in proptest::collection::vec(name_tag_strategy(), 0..6),
        kind_index in 0usize..5,
        split in 0usize..32,
    ) {
        let code = ["c", "g", "ms", "h", "d"][kind_index];
        let written = |separator: &str| tags.iter().map(|(key, value)| format!("{key}{separator}{value}")).collect::<Vec<_>>().join(",");
        let (equals, colons) = (written("="), written(":"));
        // SignalFx tags sit anywhere in the name; the name keeps what surrounds them.
        let cut = split % (name.len() + 1);
        let lines = [
            format!("{name}:1|{code}|#{colons}"),
            format!("{name},{equals}:1|{code}"),
            format!("{name}#{equals}:1|{code}"),
            format!("{}[{equals}]{}:1|{code}", &name[..cut], &name[cut..]),
        ];
        let options = ParseOptions::default();
        let mut dogstatsd = (String::new(), Vec::new());
        for (index, line) in lines.iter().enumerate() {
            let got = series_of(line.as_bytes(), options);
            prop_assert!(got.is_ok(), "{line}: {got:?}");
            let got = got.unwrap_or_default();
            prop_assert_eq!(&got.0, &name, "{}", line);
            if index == 0 {
                dogstatsd = got;
            } else {
                prop_assert_eq!(&got, &dogstatsd, "{}", line);
            }
        }
        // One table, every way: one series.
        let mut table = crate::table::Table::new(crate::table::TableOptions::default());
        let datagram = lines.join("\n");
        table.fold_datagram(datagram.as_bytes(), options, 0, |_| {});
        prop_assert_eq!(table.len(), 1);
    }
}
