use tessera_core::aggregate::{Distribution, Gauge};
use tessera_core::hll::HyperLogLog;
use tessera_proto::{MetricType, SeriesValue};

pub(super) use tessera_testkit::tiles::{batch, tile};

use super::*;
use crate::queue::series::decode_labels;

fn labels_text(sample: &StoredSample) -> String {
    let labels = decode_labels(&sample.labels).unwrap();
    labels.iter().map(|label| format!("{}={}", label.name, label.value)).collect::<Vec<_>>().join(" ")
}

fn converted(converter: &mut Converter, batch: &TileBatch) -> Vec<(String, f64)> {
    let conversion = converter.convert(batch, 0).unwrap();
    converter.commit();
    conversion.record.samples.iter().map(|sample| (labels_text(sample), sample.value)).collect()
}

#[test]
fn metric_names_are_sanitised() {
    let table: &[(&[u8], &str)] = &[
        (b"api.requests", "api_requests"),
        (b"api:requests", "api:requests"),
        (b"9lives", "_9lives"),
        (b"caf\xc3\xa9-hits", "caf__hits"),
        (b"bad\xffbyte", "bad_byte"),
        (b"", "_"),
        (b"Already_OK:1", "Already_OK:1"),
    ];
    for (raw, expected) in table {
        let mut out = String::new();
        names::metric_name(raw, &mut out);
        assert_eq!(&out, expected, "{}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn tags_become_sorted_sanitised_labels() {
    let table: &[(&str, &[(&str, &str)])] = &[
        ("env:prod,host:web-1", &[("env", "prod"), ("host", "web-1")]),
        ("canary", &[("canary", "true")]),
        ("a.b:1,a-b:2", &[("a_b", "1,2")]),
        ("zone:a,zone:b", &[("zone", "a,b")]),
        ("1st:x", &[("_1st", "x")]),
        ("__name__:evil,__x:y", &[("tag___name__", "evil"), ("tag___x", "y")]),
        ("-_x:1", &[("tag___x", "1")]),
        ("resolution:1h,quantile:0.5", &[("tag_quantile", "0.5"), ("tag_resolution", "1h")]),
        ("empty:,:novalue,ok:1", &[("ok", "1")]),
        ("url:http://x/y", &[("url", "http://x/y")]),
        ("k:v:w", &[("k", "v:w")]),
    ];
    let mut labels = names::TagLabels::default();
    for (tags, expected) in table {
        names::tag_labels(tags.as_bytes(), &mut labels);
        let got: Vec<(&str, &str)> = labels.labels.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(&got, expected, "{tags}");
    }
}

#[test]
fn external_labels_join_every_series_sorted_and_a_tag_of_the_same_name_wins() {
    let external = std::collections::BTreeMap::from([
        ("writer".to_owned(), "ing-1".to_owned()),
        ("cluster".to_owned(), "eu".to_owned()),
    ]);
    let mut converter = Converter::new(&[0.5], 3_600_000).with_resolution_label(false).with_external_labels(&external);
    let counter = |id, value| tile(id, MetricType::Counter, Aggregate::Counter(value));
    let batch = batch(10_000, vec![counter("hits|#env:prod", 2.0), counter("hits|#cluster:us,env:dev", 3.0)]);
    let samples = converted(&mut converter, &batch);
    assert_eq!(
        samples,
        [
            ("__name__=hits_total cluster=eu env=prod writer=ing-1".to_owned(), 2.0),
            ("__name__=hits_total cluster=us env=dev writer=ing-1".to_owned(), 3.0),
        ]
    );
}

#[test]
fn resolution_label_comes_from_the_policy_or_the_resolution() {
    assert_eq!(names::resolution_label("10s:2d", 10_000).as_deref(), Some("10s"));
    assert_eq!(names::resolution_label("1m:40d", 0).as_deref(), Some("1m"));
    assert_eq!(names::resolution_label("", 60_000).as_deref(), Some("1m"));
    assert_eq!(names::resolution_label("", 500).as_deref(), Some("500ms"));
    assert_eq!(names::resolution_label(" ", 7_200_000).as_deref(), Some("2h"));
    assert_eq!(names::resolution_label("", 0), None);
}

#[test]
fn counters_are_cumulative_per_series_and_resolution() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let first = batch(10_000, vec![tile("hits|#env:prod", MetricType::Counter, Aggregate::Counter(3.0))]);
    assert_eq!(
        converted(&mut converter, &first),
        vec![("__name__=hits_total env=prod resolution=10s".to_owned(), 3.0)]
    );
    let second = batch(20_000, vec![tile("hits|#env:prod", MetricType::Counter, Aggregate::Counter(2.5))]);
    assert_eq!(converted(&mut converter, &second)[0].1, 5.5);
    // Another resolution is another series with its own total.
    let mut minute = batch(60_000, vec![tile("hits|#env:prod", MetricType::Counter, Aggregate::Counter(1.0))]);
    minute.storage_policy = "1m:40d".into();
    assert_eq!(
        converted(&mut converter, &minute),
        vec![("__name__=hits_total env=prod resolution=1m".to_owned(), 1.0)]
    );
    // A name that already ends in _total keeps it.
    let named = batch(30_000, vec![tile("jobs_total", MetricType::Counter, Aggregate::Counter(1.0))]);
    assert_eq!(converted(&mut converter, &named)[0].0, "__name__=jobs_total resolution=10s");
}

#[test]
fn a_late_tile_shows_at_once_in_a_correction_after_the_newest_sample() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    converted(&mut converter, &batch(30_000, vec![tile("c", MetricType::Counter, Aggregate::Counter(1.0))]));
    // Two tiles never written, older than the newest: each adds, and the new total is
    // written one millisecond after the series' newest sample, so that a series that then
    // goes idle still shows it.
    for (late_end, total, at) in [(10_000, 5.0, 30_001), (20_000, 7.0, 30_002)] {
        let late = batch(
            late_end,
            vec![tile(
                "c",
                MetricType::Counter,
                Aggregate::Counter(total - 1.0 - if late_end == 20_000 { 4.0 } else { 0.0 }),
            )],
        );
        let conversion = converter.convert(&late, 0).unwrap();
        converter.commit();
        assert_eq!(conversion.skipped[SkipReason::Late], 1);
        assert_eq!(conversion.record.tiles, 0);
        let [sample] = conversion.record.samples.as_slice() else { panic!("{:?}", conversion.record.samples) };
        assert_eq!((labels_text(sample).as_str(), sample.value), ("__name__=c_total resolution=10s", total));
        assert_eq!((sample.timestamp_ms, sample.at(late_end)), (at, at));
    }
    let next = batch(40_000, vec![tile("c", MetricType::Counter, Aggregate::Counter(1.0))]);
    let conversion = converter.convert(&next, 0).unwrap();
    assert_eq!((conversion.record.samples[0].value, conversion.record.samples[0].at(40_000)), (8.0, 40_000));
}

#[test]
fn corrections_stop_before_the_next_tiles_reset_marker_and_the_total_shows_in_the_next_sample() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let two_ms = |tile_end_ms: i64| {
        let mut batch = batch(tile_end_ms, vec![tile("c", MetricType::Counter, Aggregate::Counter(1.0))]);
        (batch.storage_policy, batch.resolution_ms) = ("2ms:1h".into(), 2);
        batch
    };
    converted(&mut converter, &two_ms(10_000));
    // With 2 ms tiles there is no room between the newest sample and the next marker.
    let conversion = converter.convert(&two_ms(9_998), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Late], 1);
    assert!(conversion.record.samples.is_empty());
    assert_eq!(converted(&mut converter, &two_ms(10_002))[0].1, 3.0);
}

fn counter_batch(tile_end_ms: i64, source: &str, id: &str, value: f64) -> TileBatch {
    TileBatch {
        source: source.into(),
        ..batch(tile_end_ms, vec![tile(id, MetricType::Counter, Aggregate::Counter(value))])
    }
}

#[test]
fn a_tile_written_already_is_a_duplicate_whoever_sends_it_and_never_adds_twice() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    assert_eq!(converted(&mut converter, &counter_batch(20_000, "agg-1", "c", 3.0))[0].1, 3.0);
    assert_eq!(converted(&mut converter, &counter_batch(30_000, "agg-1", "c", 4.0))[0].1, 7.0);
    // The other replica's copies of both tiles, the newest and an older one.
    for tile_end in [30_000, 20_000] {
        let value = if tile_end == 30_000 { 4.0 } else { 3.0 };
        let conversion = converter.convert(&counter_batch(tile_end, "agg-2", "c", value), 0).unwrap();
        converter.commit();
        assert!(conversion.record.samples.is_empty());
        assert_eq!(conversion.skipped[SkipReason::Duplicate], 1, "tile at {tile_end}");
    }
    // A different value for the newest written tile: a conflict, not added either.
    let conversion = converter.convert(&counter_batch(30_000, "agg-2", "c", 2.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Conflict], 1);
    // A tile never written, older than the newest: late, folded into the next sample.
    let conversion = converter.convert(&counter_batch(10_000, "agg-2", "c", 5.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Late], 1);
    assert_eq!(converted(&mut converter, &counter_batch(40_000, "agg-1", "c", 1.0))[0].1, 3.0 + 4.0 + 5.0 + 1.0);
    // And once late, a second copy of it is a duplicate.
    let conversion = converter.convert(&counter_batch(10_000, "agg-1", "c", 5.0), 0).unwrap();
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 1);
}

#[test]
fn distributions_count_once_and_their_sum_follows_the_count() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let mut summary = Distribution::default();
    for value in [1.0, 2.0, 3.0] {
        summary.insert(value, 1.0);
    }
    let timer = |tile_end: i64| {
        batch(tile_end, vec![tile("t", MetricType::Timer, Aggregate::Distribution(Box::new(summary.clone())))])
    };
    converted(&mut converter, &timer(10_000));
    let conversion = converter.convert(&timer(10_000), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 1);
    assert!(conversion.record.samples.is_empty());
    let next = converted(&mut converter, &timer(20_000));
    let value = |name: &str| next.iter().find(|(labels, _)| labels.starts_with(name)).map(|(_, value)| *value);
    assert_eq!(value("__name__=t_count "), Some(6.0));
    assert_eq!(value("__name__=t_sum "), Some(12.0));
}

#[test]
fn two_statsd_series_with_one_prometheus_name_are_a_collision_not_late() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    assert_eq!(
        converted(&mut converter, &counter_batch(10_000, "agg-1", "a.b", 1.0))[0].0,
        "__name__=a_b_total resolution=10s"
    );
    let conversion = converter.convert(&counter_batch(10_000, "agg-1", "a_b", 5.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::NameCollision], 1);
    assert_eq!(conversion.skipped[SkipReason::Late], 0);
    // The first series keeps the name, and its total.
    assert_eq!(converted(&mut converter, &counter_batch(20_000, "agg-1", "a.b", 1.0))[0].1, 2.0);
}

#[test]
fn rollback_restores_totals() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    converted(&mut converter, &batch(10_000, vec![tile("c", MetricType::Counter, Aggregate::Counter(1.0))]));
    let refused = batch(
        20_000,
        vec![
            tile("c", MetricType::Counter, Aggregate::Counter(5.0)),
            tile("new", MetricType::Counter, Aggregate::Counter(1.0)),
        ],
    );
    converter.convert(&refused, 0).unwrap();
    converter.rollback();
    assert_eq!(converter.cumulative_series(), 1);
    // The retried batch computes the same values as if the refusal never happened.
    assert_eq!(converted(&mut converter, &refused).iter().map(|s| s.1).collect::<Vec<_>>(), vec![6.0, 1.0]);
}

#[test]
fn gauges_sets_and_distributions_map_as_documented() {
    let mut converter = Converter::new(&[0.5, 0.9, 0.99], 3_600_000);
    let mut summary = Distribution::default();
    for value in 1..=100 {
        summary.insert(value as f64, 1.0);
    }
    let mut set = HyperLogLog::new();
    for member in ["a", "b", "c"] {
        set.insert(member.as_bytes());
    }
    let tiles = vec![
        tile("temp|#room:1", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(21.5, 1)))),
        tile("queue", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_delta(-2.0, 1)))),
        tile("users", MetricType::Set, Aggregate::Set(Box::new(set))),
        tile("lat", MetricType::Timer, Aggregate::Distribution(Box::new(summary.clone()))),
    ];
    let samples = converted(&mut converter, &batch(10_000, tiles));
    let expect = |name: &str| samples.iter().find(|(labels, _)| labels == name).map(|s| s.1).unwrap_or(f64::NAN);
    assert_eq!(expect("__name__=temp resolution=10s room=1"), 21.5);
    assert_eq!(expect("__name__=queue resolution=10s"), -2.0);
    assert_eq!(expect("__name__=users resolution=10s"), 3.0);
    assert_eq!(expect("__name__=lat_count resolution=10s"), 100.0);
    assert_eq!(expect("__name__=lat_sum resolution=10s"), 5050.0);
    assert_eq!(expect("__name__=lat_min resolution=10s"), 1.0);
    assert_eq!(expect("__name__=lat_max resolution=10s"), 100.0);
    for (q, exact) in [("0.5", 50.0), ("0.9", 90.0), ("0.99", 99.0)] {
        let value = expect(&format!("__name__=lat quantile={q} resolution=10s"));
        assert!((value - exact).abs() / exact < 0.03, "q{q} = {value}");
    }
    assert_eq!(samples.len(), 3 + 7);
    // _count and _sum are cumulative.
    let again = converted(
        &mut converter,
        &batch(20_000, vec![tile("lat", MetricType::Timer, Aggregate::Distribution(Box::new(summary)))]),
    );
    assert_eq!(again.iter().find(|s| s.0 == "__name__=lat_count resolution=10s").unwrap().1, 200.0);
}

#[test]
fn bad_tiles_are_skipped_and_counted_and_bad_batches_refused() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let mut unknown = tile("x", MetricType::Counter, Aggregate::Counter(1.0));
    unknown.r#type = 99;
    let mut empty = tile("y", MetricType::Counter, Aggregate::Counter(1.0));
    empty.aggregate = None;
    let nan = SeriesValue {
        r#ref: 0,
        series_id: b"n".to_vec(),
        r#type: MetricType::Counter as i32,
        aggregate: Some(tessera_proto::Aggregate { value: Some(tessera_proto::aggregate::Value::Counter(f64::NAN)) }),
    };
    let mismatch = tile("z", MetricType::Gauge, Aggregate::Counter(1.0));
    let good = tile("ok", MetricType::Counter, Aggregate::Counter(1.0));
    let conversion = converter.convert(&batch(10_000, vec![unknown, empty, nan, mismatch, good]), 0).unwrap();
    let mut expected = SkippedTiles::default();
    for reason in
        [SkipReason::UnknownType, SkipReason::InvalidAggregate, SkipReason::InvalidAggregate, SkipReason::TypeMismatch]
    {
        expected.add(reason);
    }
    assert_eq!(conversion.skipped, expected);
    assert_eq!(conversion.record.samples.len(), 1);
    assert_eq!(conversion.record.tiles, 1);
    converter.commit();

    let mut no_resolution = batch(10_000, vec![]);
    no_resolution.storage_policy.clear();
    no_resolution.resolution_ms = 0;
    assert!(matches!(converter.convert(&no_resolution, 0), Err(BatchError::NoResolution { .. })));
    assert!(matches!(converter.convert(&batch(0, vec![]), 0), Err(BatchError::TileEnd { .. })));
}

#[test]
fn idle_totals_expire() {
    let mut converter = Converter::new(&[0.5], 60_000);
    converted(&mut converter, &batch(10_000, vec![tile("old", MetricType::Counter, Aggregate::Counter(1.0))]));
    converted(&mut converter, &batch(200_000, vec![tile("new", MetricType::Counter, Aggregate::Counter(1.0))]));
    assert_eq!(converter.cumulative_series(), 1);
}

#[test]
fn labels_are_strictly_sorted_by_name_for_every_sample() {
    let mut converter = Converter::new(&[0.5, 0.99], 3_600_000);
    let ids =
        ["t", "t|#Zone:x,a:1", "t|#A,Z:1,_x:2,__y:3,q:1,quantile:2,r:3,resolution:4,s:5,zz:6", "t|#ab,qa:1,re:2,rf:3"];
    for (n, id) in ids.iter().enumerate() {
        let mut summary = Distribution::default();
        summary.insert(1.0, 1.0);
        let tiles = vec![
            tile(id, MetricType::Timer, Aggregate::Distribution(Box::new(summary))),
            tile(id, MetricType::Counter, Aggregate::Counter(1.0)),
        ];
        let conversion = converter.convert(&batch(10_000 * (n as i64 + 1), tiles), 0).unwrap();
        converter.commit();
        assert_eq!(conversion.record.samples.len(), 7);
        for sample in &conversion.record.samples {
            let labels = decode_labels(&sample.labels).unwrap();
            let names: Vec<&str> = labels.iter().map(|label| label.name.as_str()).collect();
            assert!(names.windows(2).all(|pair| pair[0] < pair[1]), "{id}: {names:?}");
            assert!(names.contains(&"__name__") && names.contains(&"resolution"), "{id}: {names:?}");
        }
    }
}

fn timer_batch(tile_end_ms: i64, values: &[f64]) -> TileBatch {
    let mut distribution = Distribution::default();
    for value in values {
        distribution.insert(*value, 1.0);
    }
    batch(tile_end_ms, vec![tile("lat", MetricType::Timer, Aggregate::Distribution(Box::new(distribution)))])
}

/// The native histogram samples of a conversion, decoded, by their labels.
fn histograms(converter: &mut Converter, batch: &TileBatch) -> Vec<(String, crate::queue::series::Histogram)> {
    use prost::Message;
    let conversion = converter.convert(batch, 0).unwrap();
    converter.commit();
    let samples = conversion.record.samples.iter().filter(|sample| sample.sample_kind() == SampleKind::Histogram);
    samples
        .map(|sample| {
            (labels_text(sample), crate::queue::series::Histogram::decode(sample.histogram.as_ref()).unwrap())
        })
        .collect()
}

#[test]
fn native_histograms_are_cumulative_sketches_with_min_and_max_beside_them() {
    let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(HistogramMode::Native, 160);
    let first: Vec<f64> = (1..=100).map(f64::from).collect();
    let samples = converted(&mut converter, &timer_batch(20_000, &first));
    let names: Vec<&str> = samples.iter().map(|(labels, _)| labels.as_str()).collect();
    assert_eq!(
        names,
        ["__name__=lat resolution=10s", "__name__=lat_min resolution=10s", "__name__=lat_max resolution=10s"],
        "no quantile, _sum or _count series in native mode"
    );
    let [(_, histogram)] = histograms(&mut converter, &timer_batch(30_000, &[1.0, 1000.0])).try_into().unwrap();
    // Cumulative: both tiles' observations, the first sample's buckets plus the second's.
    assert_eq!((histogram.count_int, histogram.sum), (102, 5050.0 + 1001.0));
    assert_eq!(histogram.reset_hint, 0, "only the first sample is a reset");
    let mut expected = Sketch::new();
    for value in first.iter().chain(&[1.0, 1000.0]) {
        expected.insert(*value, 1.0);
    }
    let expected: Vec<(i32, u64)> = expected.positive_buckets().map(|(index, count)| (index, count as u64)).collect();
    assert_eq!(histogram.positive_buckets(), expected);

    // A duplicate adds nothing and writes nothing; a late tile adds, and the histogram
    // with it is written one millisecond after the newest sample.
    assert!(histograms(&mut converter, &timer_batch(30_000, &[1.0, 1000.0])).is_empty());
    let [(_, histogram)] = histograms(&mut converter, &timer_batch(10_000, &[7.0])).try_into().unwrap();
    assert_eq!((histogram.count_int, histogram.reset_hint), (103, 0));
    let [(_, histogram)] = histograms(&mut converter, &timer_batch(40_000, &[2.0])).try_into().unwrap();
    assert_eq!(histogram.count_int, 104);
}

#[test]
fn the_first_native_sample_of_a_series_is_a_reset_and_a_rollback_keeps_nothing() {
    let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(HistogramMode::Native, 160);
    converter.convert(&timer_batch(10_000, &[5.0, 6.0]), 0).unwrap();
    converter.rollback();
    assert_eq!(converter.cumulative_histograms(), 0);
    let [(labels, histogram)] = histograms(&mut converter, &timer_batch(10_000, &[5.0, 6.0])).try_into().unwrap();
    assert_eq!(labels, "__name__=lat resolution=10s");
    assert_eq!((histogram.count_int, histogram.reset_hint), (2, crate::queue::series::RESET_HINT_YES));
    // A refused batch leaves the running histogram as it was.
    converter.convert(&timer_batch(20_000, &[100.0; 50]), 0).unwrap();
    converter.rollback();
    let [(_, histogram)] = histograms(&mut converter, &timer_batch(20_000, &[7.0])).try_into().unwrap();
    assert_eq!((histogram.count_int, histogram.sum), (3, 18.0));
}

#[test]
fn a_histogram_over_max_buckets_lowers_its_schema_until_it_fits() {
    let max_buckets = 24;
    let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(HistogramMode::Native, max_buckets);
    // Ten decades, 20 values a decade: hundreds of buckets at schema 5.
    let values: Vec<f64> = (0..200).map(|step| 10f64.powf(f64::from(step) / 20.0 - 3.0)).collect();
    let [(_, histogram)] = histograms(&mut converter, &timer_batch(10_000, &values)).try_into().unwrap();
    let buckets = histogram.positive_buckets();
    assert!(buckets.len() <= max_buckets, "{} buckets", buckets.len());
    assert!(histogram.schema < 5 && histogram.schema >= MIN_SCHEMA, "schema {}", histogram.schema);
    // One schema finer would not have fitted: the schema is lowered no more than needed.
    let mut finer = Sketch::with_schema(histogram.schema + 1);
    for value in &values {
        finer.insert(*value, 1.0);
    }
    assert!(finer.bucket_count() > max_buckets);
    assert_eq!(histogram.count_int, 200);
    // The schema never goes back up, even for a tile that would fit finer.
    let [(_, next)] = histograms(&mut converter, &timer_batch(20_000, &[1.0])).try_into().unwrap();
    assert_eq!(next.schema, histogram.schema);
}

#[test]
fn both_writes_the_summary_and_the_histogram() {
    let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(HistogramMode::Both, 160);
    let samples = converted(&mut converter, &timer_batch(10_000, &[1.0, 2.0, 3.0]));
    let names: Vec<&str> = samples.iter().map(|(labels, _)| labels.as_str()).collect();
    assert_eq!(
        names,
        [
            "__name__=lat_count resolution=10s",
            "__name__=lat_sum resolution=10s",
            "__name__=lat quantile=0.5 resolution=10s",
            "__name__=lat resolution=10s",
            "__name__=lat_min resolution=10s",
            "__name__=lat_max resolution=10s",
        ]
    );
    // A duplicate is skipped once, for both.
    let conversion = converter.convert(&timer_batch(10_000, &[1.0, 2.0, 3.0]), 0).unwrap();
    converter.commit();
    assert!(conversion.record.samples.is_empty());
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 1);
}

fn incomplete(mut batch: TileBatch) -> TileBatch {
    batch.incomplete = true;
    batch
}

#[test]
fn a_complete_copy_replaces_an_incomplete_one_and_never_the_other_way_round() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    assert_eq!(converted(&mut converter, &counter_batch(10_000, "agg-1", "c", 5.0))[0].1, 5.0);
    // A replica restarted mid-tile flushes its part of tile 20 000 first.
    assert_eq!(converted(&mut converter, &incomplete(counter_batch(20_000, "agg-2", "c", 3.0)))[0].1, 8.0);
    // The whole copy replaces it: the corrected total, written as a correction.
    let conversion = converter.convert(&counter_batch(20_000, "agg-1", "c", 7.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Replaced], 1);
    let [sample] = conversion.record.samples.as_slice() else { panic!("{:?}", conversion.record.samples) };
    assert_eq!((sample.value, sample.timestamp_ms), (12.0, 20_001));
    // Once whole, another copy of it is a duplicate, and an incomplete one is refused.
    assert_eq!(
        converter.convert(&counter_batch(20_000, "agg-2", "c", 7.0), 0).unwrap().skipped[SkipReason::Duplicate],
        1
    );
    let late_part = converter.convert(&incomplete(counter_batch(20_000, "agg-2", "c", 3.0)), 0).unwrap();
    assert_eq!((late_part.skipped[SkipReason::Incomplete], late_part.record.samples.len()), (1, 0));
    assert_eq!(converted(&mut converter, &counter_batch(30_000, "agg-1", "c", 1.0))[0].1, 13.0);

    // Written whole first, an incomplete copy with another value adds nothing and is not
    // a conflict: a conflict is two whole copies that disagree.
    let conversion = converter.convert(&incomplete(counter_batch(30_000, "agg-2", "c", 0.5)), 0).unwrap();
    assert_eq!((conversion.skipped[SkipReason::Incomplete], conversion.skipped[SkipReason::Conflict]), (1, 0));
}

/// Fault campaign seed 34 (5 minutes): two faults cost each replica a different part of one
/// tile, and both copies came incomplete. The larger replaces the smaller (each replica's
/// copy sums whole batches, so the larger holds more), a smaller one after it changes
/// nothing, and a whole copy still replaces both.
#[test]
fn of_two_incomplete_copies_the_larger_replaces_the_other_and_a_whole_copy_still_replaces_it() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    assert_eq!(converted(&mut converter, &counter_batch(10_000, "agg-4", "c", 5.0))[0].1, 5.0);
    assert_eq!(converted(&mut converter, &incomplete(counter_batch(20_000, "agg-4", "c", 3.0)))[0].1, 8.0);
    let larger = converter.convert(&incomplete(counter_batch(20_000, "agg-3", "c", 6.0)), 0).unwrap();
    converter.commit();
    assert_eq!(larger.skipped[SkipReason::Replaced], 1);
    let [sample] = larger.record.samples.as_slice() else { panic!("{:?}", larger.record.samples) };
    assert_eq!((sample.value, sample.timestamp_ms), (11.0, 20_001));
    let smaller = converter.convert(&incomplete(counter_batch(20_000, "agg-4", "c", 3.0)), 0).unwrap();
    converter.commit();
    assert_eq!((smaller.skipped[SkipReason::Incomplete], smaller.record.samples.len()), (1, 0));
    let whole = converter.convert(&counter_batch(20_000, "agg-1", "c", 7.0), 0).unwrap();
    converter.commit();
    assert_eq!(whole.skipped[SkipReason::Replaced], 1);
    let [sample] = whole.record.samples.as_slice() else { panic!("{:?}", whole.record.samples) };
    assert_eq!((sample.value, sample.timestamp_ms), (12.0, 20_002));
    assert_eq!(converted(&mut converter, &counter_batch(30_000, "agg-1", "c", 1.0))[0].1, 13.0);
}

/// Fault campaign seed 61: a follower's larger incomplete copy replaced the leader's; its
/// gauges and sets were written again at the tile's end, where storage held the leader's
/// other values, and Prometheus refused each whole request (duplicate sample for
/// timestamp), the counters' corrections with it.
#[test]
fn a_second_incomplete_copy_writes_its_correction_and_no_gauge_or_set_where_the_first_one_wrote() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let copy = |source: &str, count: f64, gauge: f64, members: &[&str]| {
        let mut batch = gauge_and_set_batch(20_000, gauge, members);
        batch.tiles.push(tile("c", MetricType::Counter, Aggregate::Counter(count)));
        batch.source = source.to_owned();
        incomplete(batch)
    };
    assert_eq!(stamped(&mut converter, &copy("agg-2", 3.0, 20.0, &["a"])), [(20.0, 0), (1.0, 0), (3.0, 0)]);
    // Another batch of the same (leader's) copy, other series: written at the end too.
    let other_batch = incomplete(TileBatch {
        source: "agg-2".into(),
        ..batch(20_000, vec![tile("temp2", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(5.0, 1))))])
    });
    assert_eq!(stamped(&mut converter, &other_batch), [(5.0, 0)]);
    // The follower's larger copy: its counter replaces (the correction 1 ms after the end),
    // and nothing is written again at 20 000, where storage holds agg-2's values.
    let larger = converter.convert(&copy("agg-1", 6.0, 22.0, &["a", "b"]), 0).unwrap();
    converter.commit();
    let samples: Vec<(f64, i64)> =
        larger.record.samples.iter().map(|sample| (sample.value, sample.timestamp_ms)).collect();
    assert_eq!(samples, [(6.0, 20_001)], "only the counter's correction, after the tile's end");
    assert_eq!((larger.skipped[SkipReason::Replaced], larger.skipped[SkipReason::Incomplete]), (1, 2));
    // A gauge the leader's copy had nothing of (its collector's link into the leader
    // stalled) is written at the tile's end: storage holds no value there (the replay of
    // seed 61 with the first version of this fix lost 962 sets that way).
    let only_here = incomplete(TileBatch {
        source: "agg-1".into(),
        ..batch(20_000, vec![tile("temp3", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(7.0, 1))))])
    });
    assert_eq!(stamped(&mut converter, &only_here), [(7.0, 0)]);
}

/// Fault campaign seed 62, replayed with fix 17: a full disk refused the leader's incomplete
/// copy of a tile after it was converted; the copies remembered its sets as written all the
/// same, so the follower's copy skipped them, and the leader's, sent again once the disk
/// had room, skipped them too: 1 000 sets had no sample for that tile.
#[test]
fn a_copy_whose_conversion_was_rolled_back_is_not_remembered() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    let copy = |source: &str| {
        let mut batch = gauge_and_set_batch(20_000, 20.0, &["a"]);
        batch.source = source.to_owned();
        incomplete(batch)
    };
    assert_eq!(converter.convert(&copy("agg-2"), 0).unwrap().record.samples.len(), 2);
    converter.rollback();
    assert_eq!(stamped(&mut converter, &copy("agg-1")), [(20.0, 0), (1.0, 0)], "the follower's copy writes them");
    let again = converter.convert(&copy("agg-2"), 0).unwrap();
    converter.commit();
    assert!(again.record.samples.is_empty(), "written once: {:?}", again.record.samples);
}

#[test]
fn a_native_histogram_takes_the_larger_incomplete_copy_and_then_the_whole_one() {
    let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(HistogramMode::Native, 160);
    converted(&mut converter, &timer_batch(10_000, &[1.0, 2.0]));
    converted(&mut converter, &incomplete(timer_batch(20_000, &[4.0])));
    let [(_, larger)] = histograms(&mut converter, &incomplete(timer_batch(20_000, &[3.0, 4.0]))).try_into().unwrap();
    assert_eq!((larger.count_int, larger.sum), (4, 10.0), "1 and 2, then 3 and 4 instead of 4 alone");
    let [(_, whole)] = histograms(&mut converter, &timer_batch(20_000, &[3.0, 4.0, 5.0])).try_into().unwrap();
    assert_eq!((whole.count_int, whole.sum), (5, 15.0));
    let [(_, next)] = histograms(&mut converter, &timer_batch(30_000, &[6.0])).try_into().unwrap();
    assert_eq!((next.count_int, next.sum), (6, 21.0));
}

/// A batch of one gauge (`temp`) set to `value` and one set (`users`) of `members`.
fn gauge_and_set_batch(tile_end_ms: i64, value: f64, members: &[&str]) -> TileBatch {
    let mut set = HyperLogLog::new();
    for member in members {
        set.insert(member.as_bytes());
    }
    batch(
        tile_end_ms,
        vec![
            tile("temp", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(value, 1)))),
            tile("users", MetricType::Set, Aggregate::Set(Box::new(set))),
        ],
    )
}

/// `(value, timestamp)` of each sample of a conversion, committed.
fn stamped(converter: &mut Converter, batch: &TileBatch) -> Vec<(f64, i64)> {
    let conversion = converter.convert(batch, 0).unwrap();
    converter.commit();
    conversion.record.samples.iter().map(|sample| (sample.value, sample.timestamp_ms)).collect()
}

#[test]
fn a_whole_copy_after_an_incomplete_one_writes_its_gauges_and_sets_after_it_and_never_the_other_way_round() {
    let mut converter = Converter::new(&[0.5], 3_600_000);
    // The leader closed tile 20 000 without a collector's last windows: 1 member, 20.0.
    assert_eq!(stamped(&mut converter, &incomplete(gauge_and_set_batch(20_000, 20.0, &["a"]))), [(20.0, 0), (1.0, 0)]);
    // A replica's whole copy: written one millisecond later, where storage keeps it.
    assert_eq!(
        stamped(&mut converter, &gauge_and_set_batch(20_000, 22.0, &["a", "b"])),
        [(22.0, 20_001), (2.0, 20_001)]
    );
    // The next tile, and a whole copy of the one before it, now out of order: a correction
    // would be refused, and so would another value where the incomplete copy's are
    // stored (with the whole request). It is late.
    assert_eq!(stamped(&mut converter, &gauge_and_set_batch(30_000, 23.0, &["c"])), [(23.0, 0), (1.0, 0)]);
    assert_eq!(stamped(&mut converter, &incomplete(gauge_and_set_batch(40_000, 1.0, &["d"]))).len(), 2);
    assert_eq!(stamped(&mut converter, &gauge_and_set_batch(50_000, 2.0, &["e"])).len(), 2);
    let conversion = converter.convert(&gauge_and_set_batch(40_000, 3.0, &["d", "f"]), 0).unwrap();
    converter.commit();
    assert_eq!((conversion.record.samples.len(), conversion.skipped[SkipReason::Late]), (0, 2));
    // Written whole first, an incomplete copy writes nothing.
    let conversion = converter.convert(&incomplete(gauge_and_set_batch(30_000, 9.0, &["x"])), 0).unwrap();
    assert_eq!((conversion.record.samples.len(), conversion.skipped[SkipReason::Incomplete]), (0, 2));
}

#[test]
fn a_summary_and_a_native_histogram_are_replaced_whole() {
    for mode in [HistogramMode::Summary, HistogramMode::Native] {
        let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(mode, 160);
        converted(&mut converter, &timer_batch(10_000, &[1.0, 2.0]));
        converted(&mut converter, &incomplete(timer_batch(20_000, &[4.0])));
        let conversion = converter.convert(&timer_batch(20_000, &[3.0, 4.0, 5.0]), 0).unwrap();
        converter.commit();
        assert_eq!(conversion.skipped[SkipReason::Replaced], 1, "{mode:?}");
        assert!(conversion.record.samples.iter().all(|sample| sample.timestamp_ms == 20_001), "{mode:?}");
        let next = timer_batch(30_000, &[6.0]);
        match mode {
            HistogramMode::Native => {
                let [(_, histogram)] = histograms(&mut converter, &next).try_into().unwrap();
                assert_eq!((histogram.count_int, histogram.sum), (6, 21.0));
            }
            _ => {
                let samples = converted(&mut converter, &next);
                let value = |name: &str| samples.iter().find(|(labels, _)| labels.starts_with(name)).map(|(_, v)| *v);
                assert_eq!((value("__name__=lat_count "), value("__name__=lat_sum ")), (Some(6.0), Some(21.0)));
            }
        }
    }
}

/// A distribution with fixed buckets (a mapping's `observer_type: histogram`) is written
/// as statsd_exporter writes a classic histogram: `_bucket{le}` cumulative over `le` and
/// over time, `_sum` and `_count`, whatever the target's histogram mode; a duplicate adds
/// nothing and a late tile corrects every bucket.
#[test]
fn fixed_buckets_are_written_as_a_classic_cumulative_histogram() {
    for mode in [HistogramMode::Summary, HistogramMode::Native, HistogramMode::Both] {
        let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(mode, 160);
        let mut timings = Distribution::with_buckets(std::sync::Arc::from([0.01, 0.025]));
        // The tile of 10, 12, 20 and 30 ms.
        for value in [0.010, 0.012, 0.020, 0.030] {
            timings.insert(value, 1.0);
        }
        let timer = |tile_end: i64| {
            batch(
                tile_end,
                vec![tile("lat|#a:1", MetricType::Timer, Aggregate::Distribution(Box::new(timings.clone())))],
            )
        };
        let first = converted(&mut converter, &timer(10_000));
        let due = [
            ("__name__=lat_count a=1 resolution=10s", 4.0),
            ("__name__=lat_sum a=1 resolution=10s", 0.072),
            ("__name__=lat_bucket a=1 le=0.01 resolution=10s", 1.0),
            ("__name__=lat_bucket a=1 le=0.025 resolution=10s", 3.0),
            ("__name__=lat_bucket a=1 le=+Inf resolution=10s", 4.0),
        ];
        let first: Vec<(&str, f64)> = first.iter().map(|(labels, value)| (labels.as_str(), *value)).collect();
        assert_eq!(first.len(), due.len(), "{mode:?}: no quantiles, native histogram, min or max: {first:?}");
        for (labels, value) in due {
            let found = first.iter().find(|(written, _)| *written == labels).map(|(_, value)| *value);
            assert!(
                found.is_some_and(|found| (found - value).abs() < 1e-12),
                "{mode:?}: {labels} = {found:?}, due {value}"
            );
        }
        let conversion = converter.convert(&timer(10_000), 0).unwrap();
        converter.commit();
        assert!(conversion.record.samples.is_empty(), "a duplicate adds nothing");
        assert_eq!(conversion.skipped[SkipReason::Duplicate], 1);
        let next = converted(&mut converter, &timer(30_000));
        let value = |name: &str| next.iter().find(|(labels, _)| labels == name).map(|(_, value)| *value);
        assert_eq!(value("__name__=lat_bucket a=1 le=0.025 resolution=10s"), Some(6.0), "cumulative over time");
        let late = converter.convert(&timer(20_000), 0).unwrap();
        converter.commit();
        assert_eq!(late.skipped[SkipReason::Late], 1);
        let corrected: Vec<(String, f64, i64)> =
            late.record.samples.iter().map(|sample| (labels_text(sample), sample.value, sample.timestamp_ms)).collect();
        assert_eq!(corrected.len(), 5, "count, sum and three buckets corrected: {corrected:?}");
        assert!(corrected.iter().all(|(_, _, timestamp_ms)| *timestamp_ms == 30_001), "{corrected:?}");
        let inf = corrected.iter().find(|(labels, _, _)| labels.contains("le=+Inf")).map(|(_, value, _)| *value);
        assert_eq!(inf, Some(12.0));
        let kinds: Vec<SampleKind> = late.record.samples.iter().map(|sample| sample.sample_kind()).collect();
        assert!(kinds.contains(&SampleKind::HistogramBucket) && kinds.contains(&SampleKind::HistogramCount));
    }
}

/// A mapping's summary (`observer_type: summary` with its quantiles) is written with those
/// quantiles, `_sum` and `_count`, whatever the target's histogram mode.
#[test]
fn a_mappings_summary_is_written_with_its_own_quantiles() {
    for mode in [HistogramMode::Summary, HistogramMode::Native, HistogramMode::Both] {
        let mut converter = Converter::new(&[0.5], 3_600_000).with_histograms(mode, 160);
        let mut timings =
            Distribution::for_observer(tessera_core::aggregate::Observer::Summary(std::sync::Arc::from([0.25, 0.99])));
        for value in [0.010, 0.012, 0.020, 0.030] {
            timings.insert(value, 1.0);
        }
        let tiles = vec![tile("lat", MetricType::Timer, Aggregate::Distribution(Box::new(timings)))];
        let mut written = converted(&mut converter, &batch(10_000, tiles));
        written.sort_by(|a, b| a.0.cmp(&b.0));
        let labels: Vec<&str> = written.iter().map(|(labels, _)| labels.as_str()).collect();
        assert_eq!(
            labels,
            [
                "__name__=lat quantile=0.25 resolution=10s",
                "__name__=lat quantile=0.99 resolution=10s",
                "__name__=lat_count resolution=10s",
                "__name__=lat_sum resolution=10s",
            ],
            "{mode:?}"
        );
        // Nearest rank: the p99 of four timings is the largest, within the sketch's error.
        assert!((written[1].1 - 0.030).abs() <= 0.030 * 0.011, "{mode:?}: {written:?}");
    }
}

#[test]
fn every_family_written_is_noted_once_with_its_type_and_timers_with_their_unit() {
    use crate::sink::metadata::{Families, FamilyMeta};
    use prometheus_client::metrics::{counter::Counter, gauge};
    let families = Families::new(100, gauge::Gauge::default(), Counter::default());
    let mut converter = Converter::new(&[0.5], 3_600_000)
        .with_histograms(HistogramMode::Summary, 160)
        .with_families(families.clone(), "seconds");
    let mut histogram = Distribution::default();
    histogram.insert(3.0, 1.0);
    let tiles = vec![
        tile("api.hits|#env:a", MetricType::Counter, Aggregate::Counter(1.0)),
        tile("api.hits|#env:b", MetricType::Counter, Aggregate::Counter(2.0)),
        tile("temp", MetricType::Gauge, Aggregate::Gauge(Box::new(Gauge::with_value(20.0, 1)))),
        tile("sizes", MetricType::Histogram, Aggregate::Distribution(Box::new(histogram))),
    ];
    converted(&mut converter, &batch(10_000, tiles));
    converted(&mut converter, &timer_batch(10_000, &[0.2, 0.4]));
    let noted: Vec<(String, &str, &str)> = families
        .snapshot()
        .into_iter()
        .map(|(family, FamilyMeta { type_name, unit })| (family, type_name, unit))
        .collect();
    let expected = [
        ("api_hits", "counter", ""),
        ("lat", "summary", "seconds"),
        ("lat_max", "gauge", "seconds"),
        ("lat_min", "gauge", "seconds"),
        ("sizes", "summary", ""),
        ("sizes_max", "gauge", ""),
        ("sizes_min", "gauge", ""),
        ("temp", "gauge", ""),
    ];
    let expected: Vec<(String, &str, &str)> =
        expected.iter().map(|(family, type_name, unit)| ((*family).to_owned(), *type_name, *unit)).collect();
    assert_eq!(noted, expected);
}

#[test]
fn near_the_memory_limit_the_least_recently_written_totals_are_evicted_and_start_over_with_a_reset() {
    use prometheus_client::metrics::counter::Counter;
    use tessera_core::budget::MemoryBudget;
    let budget = Arc::new(MemoryBudget::new(1000));
    let evicted = Counter::default();
    let mut converter = Converter::new(&[0.5], 3_600_000).with_budget(budget.clone(), evicted.clone());
    let old: Vec<String> = (0..10).map(|n| format!("old.{n}")).collect();
    let recent: Vec<String> = (0..10).map(|n| format!("recent.{n}")).collect();
    let tiles = |ids: &[String], value: f64| {
        ids.iter().map(|id| tile(id, MetricType::Counter, Aggregate::Counter(value))).collect::<Vec<_>>()
    };
    converted(&mut converter, &batch(10_000, tiles(&old, 5.0)));
    converted(&mut converter, &batch(20_000, tiles(&recent, 5.0)));
    assert_eq!(converter.cumulative_series(), 20);
    budget.update(800, true);
    converted(&mut converter, &batch(30_000, tiles(&recent, 1.0)));
    assert_eq!((evicted.get(), converter.cumulative_series()), (2, 18), "a tenth, the least recently written");
    // Once a second at most: the next commit evicts nothing more.
    converted(&mut converter, &batch(40_000, tiles(&recent, 1.0)));
    assert_eq!(evicted.get(), 2);
    budget.update(600, false);
    // The old series come back: two of them start over, from an explicit reset.
    let conversion = converter.convert(&batch(50_000, tiles(&old, 1.0)), 0).unwrap();
    converter.commit();
    let samples: Vec<(f64, bool)> =
        conversion.record.samples.iter().map(|sample| (sample.value, sample.reset_before)).collect();
    assert_eq!(samples.iter().filter(|sample| **sample == (1.0, true)).count(), 2, "{samples:?}");
    assert_eq!(samples.iter().filter(|sample| **sample == (6.0, false)).count(), 8, "{samples:?}");
}
