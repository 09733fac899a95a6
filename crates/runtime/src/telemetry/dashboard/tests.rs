use super::*;

/// A scrape of a pipeline that has read `lines` lines, dropped `queue_full`
/// partials, and written `tiles` tiles with end-to-end latencies in the
/// buckets `[(le, cumulative count)]` of resolution 10s.
fn scrape(lines: u64, queue_full: u64, e2e: &[(&str, u64)]) -> String {
    let mut text = String::from(
        "# HELP tessera_collector_lines_received Statsd lines received.\n\
         # TYPE tessera_collector_lines_received counter\n",
    );
    text.push_str(&format!("tessera_collector_lines_received_total {lines}\n"));
    text.push_str("# TYPE tessera_collector_drops counter\n");
    if queue_full > 0 {
        text.push_str(&format!(
            "tessera_collector_drops_total{{reason=\"queue_full\",unit=\"partials\"}} {queue_full}\n"
        ));
    }
    text.push_str("# TYPE tessera_collector_queue_bytes gauge\n");
    text.push_str(
        "tessera_collector_queue_bytes{destination=\"a\"} 100\ntessera_collector_queue_bytes{destination=\"b\"} 50\n",
    );
    text.push_str("# TYPE tessera_ingester_end_to_end_latency_seconds histogram\n");
    for (le, count) in e2e {
        text.push_str(&format!(
            "tessera_ingester_end_to_end_latency_seconds_bucket{{resolution=\"10s\",le=\"{le}\"}} {count}\n"
        ));
    }
    text.push_str("# EOF\n");
    text
}

fn points(dashboard: &Dashboard, panel: &str, line: &str) -> Vec<(i64, f64)> {
    let index = PANELS.iter().position(|candidate| candidate.id == panel).unwrap();
    dashboard
        .state()
        .lines
        .get(&(index, line.to_owned()))
        .map(|points| points.0.iter().copied().collect())
        .unwrap_or_default()
}

#[test]
fn rates_sums_and_quantiles_come_from_successive_scrapes() {
    let dashboard = Dashboard::default();
    let buckets = |fast: u64, slow: u64| [("0.5", fast), ("1.0", fast), ("2.0", fast + slow), ("+Inf", fast + slow)];
    dashboard.record(10_000, &scrape(1_000, 0, &buckets(0, 0)));
    assert!(points(&dashboard, "lines_in", "lines").is_empty(), "one scrape is no rate");
    dashboard.record(11_000, &scrape(3_000, 0, &buckets(10, 0)));
    dashboard.record(12_000, &scrape(5_000, 4, &buckets(10, 10)));

    assert_eq!(points(&dashboard, "lines_in", "lines"), [(11_000, 2_000.0), (12_000, 2_000.0)]);
    // A drop reason appears when it first counts: from nothing to 4 over the 2 s window.
    assert_eq!(points(&dashboard, "drops", "collector: queue_full"), [(12_000, 2.0)]);
    assert_eq!(
        points(&dashboard, "queues", "collector → aggregators"),
        [(10_000, 150.0), (11_000, 150.0), (12_000, 150.0)]
    );
    // 10 tiles in (0, 0.5], then 10 in (1, 2]: the median is the top of the first bucket,
    // p99 interpolated in the last finite one.
    let p50 = points(&dashboard, "end_to_end", "p50 10s");
    assert_eq!(p50.first(), Some(&(11_000, 0.25)), "{p50:?}");
    assert_eq!(p50.last(), Some(&(12_000, 0.5)));
    let p99 = points(&dashboard, "end_to_end", "p99 10s").last().unwrap().1;
    assert!((p99 - 1.98).abs() < 1e-9, "{p99}");
}

#[test]
fn panels_show_only_what_the_registry_exports() {
    let dashboard = Dashboard::default();
    dashboard.record(1_000, &scrape(0, 0, &[("+Inf", 0)]));
    let json: serde_json::Value = serde_json::from_str(&dashboard.to_json("collector", 0)).unwrap();
    let ids: Vec<&str> = json["panels"].as_array().unwrap().iter().map(|panel| panel["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["lines_in", "drops", "queues", "end_to_end"]);
    assert_eq!(json["daemon"], "collector");
    assert_eq!(json["step_ms"], 1_000);
}

#[test]
fn the_json_carries_only_points_after_since_and_the_ring_keeps_fifteen_minutes() {
    let dashboard = Dashboard::default();
    let step = STEP.as_millis() as i64;
    let steps = SPAN.as_millis() as i64 / step + 10;
    for n in 0..=steps {
        dashboard.record(n * step, &scrape(n as u64 * 10, 0, &[("+Inf", 0)]));
    }
    let kept = points(&dashboard, "lines_in", "lines");
    assert_eq!(kept.len() as i64, SPAN.as_millis() as i64 / step, "one point a step over the span");
    assert_eq!(kept.last().unwrap(), &(steps * step, 10.0));
    assert!(dashboard.state().snapshots.len() <= 62, "raw scrapes only as far back as the longest window");

    let json: serde_json::Value = serde_json::from_str(&dashboard.to_json("local", (steps - 2) * step)).unwrap();
    let lines_in = &json["panels"][0]["lines"];
    let line = lines_in.as_array().unwrap().iter().find(|line| line["name"] == "lines").unwrap();
    assert_eq!(line["points"], serde_json::json!([[(steps - 1) * step, 10.0], [steps * step, 10.0]]));
}

#[test]
fn samples_parse_with_escaped_labels_and_infinities() {
    let sample = parse_sample(r#"{path="a\"b\\c",le="+Inf"} 7"#).unwrap();
    assert_eq!(sample.labels, [("path".to_owned(), "a\"b\\c".to_owned()), ("le".to_owned(), "+Inf".to_owned())]);
    assert_eq!(sample.value, 7.0);
    assert_eq!(parse_sample(" 1.5e3").unwrap().value, 1_500.0);
    assert_eq!(parse_sample(" +Inf").unwrap().value, f64::INFINITY);
    assert!(parse_sample(r#"{path="unterminated} 1"#).is_none());
    assert!(parse_sample(" not-a-number").is_none());
}

#[test]
fn bucket_quantiles_follow_prometheus() {
    assert_eq!(bucket_quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None, "no observations");
    assert_eq!(bucket_quantile(0.5, &[(1.0, 2.0), (2.0, 4.0), (f64::INFINITY, 4.0)]), Some(1.0));
    assert_eq!(bucket_quantile(0.75, &[(1.0, 2.0), (2.0, 4.0), (f64::INFINITY, 4.0)]), Some(1.5));
    assert_eq!(bucket_quantile(0.99, &[(1.0, 2.0), (2.0, 2.0), (f64::INFINITY, 4.0)]), Some(2.0), "+Inf bucket");
}
