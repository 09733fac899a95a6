use std::collections::BTreeMap;

use tessera_core::aggregate::Distribution;
use tessera_core::parse::MetricKind;
use tessera_core::sketch::relative_error;

use super::*;

const T: i64 = 1_700_000_010;

/// The lines of `tiles` under `naming`, as path -> value; every line must end in `T`.
fn lines(naming: &Naming, tiles: &[Tile<'_>]) -> (BTreeMap<String, f64>, Changes) {
    let mut out = String::new();
    let mut changes = Changes::default();
    for tile in tiles {
        naming.write(tile, T, &mut out, &mut changes);
    }
    let mut paths = BTreeMap::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line:?}");
        assert_eq!(fields[2], T.to_string(), "{line:?}");
        assert!(paths.insert(fields[0].to_owned(), fields[1].parse::<f64>().unwrap()).is_none(), "{line:?} twice");
    }
    (paths, changes)
}

fn tile<'a>(id: &'a str, value: TileValue<'a>) -> Tile<'a> {
    Tile { id: id.as_bytes(), value, interval_secs: 10.0, timer_scale: 1000.0 }
}

/// Ten `|ms` timings of 100, 200, … 1000 ms, as the collector keeps them (in seconds).
fn timings() -> Distribution {
    let mut distribution = Distribution::default();
    for ms in (1..=10).map(|n| f64::from(n) * 100.0) {
        distribution.insert(ms / 1000.0, 1.0);
    }
    distribution
}

fn within(value: f64, exact: f64, bound: f64) -> bool {
    ((value - exact) / exact).abs() <= bound + 1e-9
}

#[test]
fn statsd_legacy_names_and_values_are_statsds() {
    let timer = timings();
    let (paths, changes) = lines(
        &Naming::default(),
        &[
            tile("api.hits", TileValue::Counter(50.0)),
            tile("queue.depth", TileValue::Gauge(42.0)),
            tile("users.online", TileValue::Set(3.0)),
            tile("api.latency", TileValue::Distribution(MetricKind::Timer, &timer)),
        ],
    );
    assert_eq!(changes, Changes::default());
    assert_eq!(paths["stats.api.hits"], 5.0, "per second over the 10 s tile");
    assert_eq!(paths["stats_counts.api.hits"], 50.0);
    assert_eq!(paths["stats.gauges.queue.depth"], 42.0);
    assert_eq!(paths["stats.sets.users.online.count"], 3.0);
    // Exact statistics, in ms as sent.
    let stat = |name: &str| paths[&format!("stats.timers.api.latency.{name}")];
    assert_eq!(stat("count"), 10.0);
    assert_eq!(stat("count_ps"), 1.0);
    assert_eq!(stat("lower"), 100.0);
    assert_eq!(stat("upper"), 1000.0);
    assert!((stat("sum") - 5500.0).abs() < 1e-9, "{}", stat("sum"));
    assert!((stat("mean") - 550.0).abs() < 1e-9);
    assert!((stat("sum_squares") - 3_850_000.0).abs() < 1e-6);
    // Population standard deviation, as statsd's: sqrt(385 000 - 550²).
    assert!((stat("std") - 82_500f64.sqrt()).abs() < 1e-6, "{}", stat("std"));
    // The 90th percentile threshold: the lowest 9 of 10 values; count exact, the rest
    // from the sketch within its bound.
    let alpha = relative_error(tessera_core::sketch::DEFAULT_SCHEMA);
    assert_eq!(stat("count_90"), 9.0);
    assert!(within(stat("upper_90"), 900.0, alpha), "{}", stat("upper_90"));
    assert!(within(stat("sum_90"), 4500.0, alpha), "{}", stat("sum_90"));
    assert!(within(stat("mean_90"), 500.0, alpha), "{}", stat("mean_90"));
    assert!(within(stat("sum_squares_90"), 2_850_000.0, 2.0 * alpha + alpha * alpha));
    // statsd's median of an even count: the mean of the two middle values, (500 + 600) / 2.
    assert!(within(stat("median"), 550.0, alpha), "{}", stat("median"));
    assert_eq!(paths.len(), 4 + 14, "{paths:#?}");
}

#[test]
fn statsd_prefixes_suffix_and_thresholds_name_as_statsd_does() {
    let timer = timings();
    let mut naming = Naming::default();
    naming.statsd.legacy_namespace = false;
    naming.statsd.global_suffix = "sfx".into();
    naming.statsd.percent_thresholds = vec![99.9, -10.0];
    let (paths, _) = lines(
        &naming,
        &[
            tile("api.hits", TileValue::Counter(50.0)),
            tile("queue.depth", TileValue::Gauge(42.0)),
            tile("users", TileValue::Set(3.0)),
            tile("t", TileValue::Distribution(MetricKind::Timer, &timer)),
        ],
    );
    assert_eq!(paths["stats.counters.api.hits.rate.sfx"], 5.0);
    assert_eq!(paths["stats.counters.api.hits.count.sfx"], 50.0);
    assert_eq!(paths["stats.gauges.queue.depth.sfx"], 42.0);
    assert_eq!(paths["stats.sets.users.count.sfx"], 3.0);
    // 99.9 % of 10 rounds to 10: every value; -10 is the top value.
    assert_eq!(paths["stats.timers.t.count_99_9.sfx"], 10.0);
    assert_eq!(paths["stats.timers.t.count_top10.sfx"], 1.0);
    let alpha = relative_error(tessera_core::sketch::DEFAULT_SCHEMA);
    assert!(within(paths["stats.timers.t.lower_top10.sfx"], 1000.0, alpha));
    assert!(within(paths["stats.timers.t.upper_99_9.sfx"], 1000.0, alpha));
    // Empty prefixes are left out.
    naming.statsd.global_prefix.clear();
    naming.statsd.global_suffix.clear();
    let (paths, _) = lines(&naming, &[tile("api.hits", TileValue::Counter(50.0))]);
    assert_eq!(paths.keys().collect::<Vec<_>>(), ["counters.api.hits.count", "counters.api.hits.rate"]);
}

#[test]
fn brubeck_and_tessera_names() {
    let timer = timings();
    let tiles = [
        tile("api.hits", TileValue::Counter(50.0)),
        tile("queue.depth", TileValue::Gauge(42.0)),
        tile("sizes", TileValue::Distribution(MetricKind::Histogram, &timer)),
    ];
    let brubeck = Naming { scheme: Scheme::Brubeck, ..Naming::default() };
    let (paths, _) = lines(&brubeck, &tiles);
    assert_eq!(paths["api.hits"], 50.0, "brubeck writes the count of the flush");
    assert_eq!(paths["queue.depth"], 42.0);
    // A histogram is not a timer: its values are written as they are held.
    assert_eq!((paths["sizes.min"], paths["sizes.max"], paths["sizes.count"]), (0.1, 1.0, 10.0));
    assert_eq!(paths["sizes.count_ps"], 1.0, "per second of the flush interval, as brubeck's `.count_ps`");
    for node in
        ["sum", "mean", "median", "percentile.75", "percentile.95", "percentile.98", "percentile.99", "percentile.999"]
    {
        assert!(paths.contains_key(&format!("sizes.{node}")), "{node}: {paths:#?}");
    }
    assert_eq!(paths.len(), 2 + 12);
    let tessera = Naming { scheme: Scheme::Tessera, ..Naming::default() };
    let (paths, _) = lines(&tessera, &tiles);
    assert_eq!((paths["api.hits.count"], paths["api.hits.rate"], paths["queue.depth"]), (50.0, 5.0, 42.0));
    assert_eq!(paths["sizes.count"], 10.0);
    assert_eq!(paths.len(), 3 + 10);
}

#[test]
fn tags_are_names_tags_sanitized_for_carbon_and_every_change_counted() {
    let tiles = [
        tile("api.hits|#env:prod,route:/users", TileValue::Counter(10.0)),
        // statsd's own tags in the key, and a key with whitespace and a slash.
        tile("my  key/x;dc=eu", TileValue::Gauge(1.0)),
        // A name carbon would split on, an empty value, a value starting with `~`, a bare tag.
        tile("odd|#bad!name:v,empty:,tilde:~x,flag", TileValue::Gauge(2.0)),
        tile("novalue;dc", TileValue::Gauge(3.0)),
    ];
    let (paths, changes) = lines(&Naming::default(), &tiles);
    assert_eq!(paths["stats_counts.api.hits;env=prod;route=/users"], 10.0);
    assert_eq!(paths["stats.gauges.my_key-x;dc=eu"], 1.0);
    assert_eq!(paths["stats.gauges.odd;badname=v;flag=true;tilde=x"], 2.0);
    assert_eq!(paths["stats.gauges.novalue"], 3.0);
    assert_eq!(changes, Changes { keys_sanitized: 1, tags_sanitized: 2, tags_dropped: 2 });
    // No line carbon would misparse: one space-free path, each tag `name=value`.
    for path in paths.keys() {
        for tag in path.split(';').skip(1) {
            let (name, value) = tag.split_once('=').unwrap();
            assert!(!name.is_empty() && !value.is_empty() && !value.starts_with('~'), "{path}");
            assert!(!name.contains(['!', '^', '=']), "{path}");
        }
    }
    let as_nodes = Naming { tags: TagStyle::Path, ..Naming::default() };
    let (paths, _) = lines(&as_nodes, &tiles[..1]);
    assert_eq!(paths["stats_counts.api.hits.env_prod.route_/users"], 10.0);
    let dropped = Naming { tags: TagStyle::Drop, ..Naming::default() };
    let (paths, _) = lines(&dropped, &tiles[..1]);
    assert_eq!(paths["stats_counts.api.hits"], 10.0);
}

#[test]
fn an_empty_timer_and_a_single_value_write_numbers_carbon_takes() {
    let empty = Distribution::default();
    let (paths, _) = lines(&Naming::default(), &[tile("t", TileValue::Distribution(MetricKind::Timer, &empty))]);
    assert!(paths.values().all(|value| value.is_finite()), "{paths:#?}");
    let mut one = Distribution::default();
    one.insert(0.25, 1.0);
    let (paths, _) = lines(&Naming::default(), &[tile("t", TileValue::Distribution(MetricKind::Timer, &one))]);
    // statsd: with one value, every threshold is that value.
    assert_eq!(paths["stats.timers.t.count_90"], 1.0);
    assert_eq!(paths["stats.timers.t.std"], 0.0);
    assert_eq!((paths["stats.timers.t.upper"], paths["stats.timers.t.lower"]), (250.0, 250.0));
}

#[test]
fn timer_statistics_scaled_back_to_ms_keep_15_significant_digits() {
    // The sum of 0.1 … 1.0 s summed in two orders: the last bit differs, the ms do not.
    assert_eq!(in_unit(5.499999999999999, 1000.0), 5500.0);
    assert_eq!(in_unit(5.5, 1000.0), 5500.0);
    assert_eq!(in_unit(0.1 + 0.2, 1000.0), 300.0);
    assert_eq!(in_unit(1.234_567_891_234_5e-4, 1000.0), 0.123_456_789_123_45, "15 digits kept");
    assert_eq!(in_unit(-2.5e-7, 1000.0), -2.5e-4);
    assert_eq!(in_unit(0.1 + 0.2, 1.0), 0.1 + 0.2, "no scale, no rounding: the value as merged");
    assert_eq!(in_unit(f64::INFINITY, 1000.0), f64::INFINITY);
    assert_eq!(in_unit(1e300, 1e6), 1e306, "beyond the table: as multiplied");
}
