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
    let options = ParseOptions { max_line_bytes: 8 };
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
        line in "_?(e\\{1,1\\})?[a-z._é]{0,12}(:[-+]?[0-9.]{0,18}){0,2}(\\|(c|g|ms|h|d|s|x|@0\\.5|#a:b|T1|#[ab:,| é]{0,10}))*",
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

/// Whenever [`parse_simple`] accepts a line, the full parser reads it the same way.
fn assert_simple_agrees(line: &[u8]) {
    let Some(simple) = parse_simple(line) else { return };
    let Parsed::Metric(full) = parse_line(line) else {
        panic!("{:?}: simple accepted what the full parser does not: {simple:?}", String::from_utf8_lossy(line))
    };
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

#[test]
fn the_name_scanner_agrees_with_a_plain_search_at_every_offset() {
    for len in 0..40 {
        for at in 0..len {
            for separator in [b':', b'|'] {
                for high in [None, Some(0), Some(at / 2)] {
                    let mut line = vec![b'a'; len];
                    line[at] = separator;
                    if let Some(position) = high.filter(|position| *position < at) {
                        line[position] = 0xc3;
                    }
                    let got = scan_name(&line);
                    match (separator, got) {
                        (b':', NameEnd::Colon { at: found, non_ascii }) => {
                            assert_eq!(found, at);
                            assert_eq!(non_ascii, high.is_some_and(|position| position < at), "{line:?}");
                        }
                        (b'|', NameEnd::Pipe) => {}
                        _ => panic!("wrong end for {line:?}"),
                    }
                }
            }
        }
        assert!(matches!(scan_name(&vec![b'x'; len]), NameEnd::None));
    }
}

#[test]
fn the_newline_finder_agrees_with_a_plain_search() {
    for len in 0..40 {
        let mut bytes = vec![b'x'; len];
        assert_eq!(find_newline(&bytes), None);
        for at in (0..len).rev() {
            bytes[at] = b'\n';
            assert_eq!(find_newline(&bytes), Some(at), "len {len}");
        }
    }
}
