use tessera_core::aggregate::{Aggregate, Distribution, Gauge};
use tessera_core::hll::HyperLogLog;
use tessera_core::parse::MetricKind;
use tessera_proto::aggregate::Value;

use super::*;

/// A time on a minute boundary.
const T0: i64 = 1_700_000_040_000;

fn settings(policies: &[&str]) -> TilerSettings {
    TilerSettings {
        policies: policies.iter().map(|text| text.parse().unwrap()).collect(),
        buffer_past_ms: 500,
        max_buffer_past_ms: 500,
        buffer_future_ms: 500,
        expire_after_empty_tiles: Some(30),
        max_series_per_policy: None,
    }
}

fn counter(id: &str, value: f64) -> Partial {
    Partial {
        via: Via::Id,
        kind: MetricKind::Counter,
        id: id.as_bytes().to_vec(),
        aggregate: Aggregate::Counter(value),
    }
}

fn gauge(id: &str, gauge: Gauge) -> Partial {
    Partial {
        via: Via::Id,
        kind: MetricKind::Gauge,
        id: id.as_bytes().to_vec(),
        aggregate: Aggregate::Gauge(Box::new(gauge)),
    }
}

fn batch(window_start_ms: i64, window_ms: i64, partials: Vec<Partial>) -> WindowPartials {
    WindowPartials { connection: 0, window_start_ms, window_ms, partials }
}

/// `partial`, also defining dictionary slot `slot` as its series.
fn defining(slot: u32, partial: Partial) -> Partial {
    Partial { via: Via::Define { slot }, ..partial }
}

/// A counter partial naming its series by dictionary slot `slot` alone.
fn counter_by_slot(slot: u32, value: f64) -> Partial {
    Partial { via: Via::Ref { slot }, id: Vec::new(), ..counter("", value) }
}

/// Non-empty closed tiles, in the order they closed.
#[derive(Default)]
struct Sink {
    tiles: Vec<ClosedTile>,
    expired: usize,
}

impl Sink {
    fn emit(&mut self) -> impl FnMut(ClosedTile) + '_ {
        |tile| {
            self.expired += tile.expired;
            if !tile.values.is_empty() {
                self.tiles.push(tile);
            }
        }
    }

    fn value(&self, policy_index: usize, tile_end_ms: i64, id: &str) -> Option<Value> {
        let tile =
            self.tiles.iter().find(|tile| tile.policy_index == policy_index && tile.tile_end_ms == tile_end_ms)?;
        let value = tile.values.iter().find(|value| value.series_id == id.as_bytes())?;
        value.aggregate.clone()?.value
    }

    fn counter(&self, policy_index: usize, tile_end_ms: i64, id: &str) -> Option<f64> {
        match self.value(policy_index, tile_end_ms, id)? {
            Value::Counter(sum) => Some(sum),
            other => panic!("{id} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, policy_index: usize, tile_end_ms: i64, id: &str) -> Option<f64> {
        match self.value(policy_index, tile_end_ms, id)? {
            Value::Gauge(gauge) => {
                assert!(gauge.has_value && gauge.delta == 0.0, "{gauge:?}");
                Some(gauge.value)
            }
            other => panic!("{id} is not a gauge: {other:?}"),
        }
    }
}

#[test]
fn policies_tile_independently_and_exactly_on_epoch_boundaries() {
    let mut tiler = Tiler::new(settings(&["1s:1h", "5s:1h"]), T0);
    let mut sink = Sink::default();
    // 40 windows of 250 ms, each sent 100 ms after it ends.
    for index in 0..40 {
        let start = T0 + index * 250;
        let partials = vec![counter("a", index as f64), counter("b", 1.0)];
        let applied = tiler.accept(&batch(start, 250, partials), start + 350, &mut sink.emit()).unwrap();
        assert_eq!(applied.partials, 2);
    }
    tiler.close_due(T0 + 60_000, &mut sink.emit());

    for second in 0..10 {
        let end = T0 + (second + 1) * 1000;
        let expected: f64 = (second * 4..second * 4 + 4).map(|index| index as f64).sum();
        assert_eq!(sink.counter(0, end, "a"), Some(expected), "1 s tile ending at {end}");
        assert_eq!(sink.counter(0, end, "b"), Some(4.0));
    }
    for five in 0..2 {
        let end = T0 + (five + 1) * 5000;
        let expected: f64 = (five * 20..five * 20 + 20).map(|index| index as f64).sum();
        assert_eq!(sink.counter(1, end, "a"), Some(expected), "5 s tile ending at {end}");
    }
    for tile in &sink.tiles {
        assert_eq!(tile.tile_end_ms % tile.policy.resolution_ms(), 0, "epoch aligned");
        assert_eq!(tile.tile_end_ms - tile.tile_start_ms, tile.policy.resolution_ms());
    }
    // Tiles of a policy close in order.
    let ends: Vec<i64> = sink.tiles.iter().filter(|tile| tile.policy_index == 0).map(|tile| tile.tile_end_ms).collect();
    assert!(ends.windows(2).all(|pair| pair[0] < pair[1]), "{ends:?}");
}

#[test]
fn a_tile_closes_at_end_plus_buffer_past_and_a_late_window_goes_into_the_coarser_tiles_still_open() {
    let mut tiler = Tiler::new(settings(&["1s:1h", "5s:1h"]), T0);
    let mut sink = Sink::default();
    tiler.accept(&batch(T0, 250, vec![counter("a", 1.0)]), T0 + 300, &mut sink.emit()).unwrap();
    // The (empty) tile before T0 closes first, then ours.
    assert_eq!(tiler.next_close_ms(), T0 + 500);
    tiler.close_due(T0 + 500, &mut sink.emit());
    assert_eq!(tiler.next_close_ms(), T0 + 1500);
    // Just before the close: still accepted.
    tiler.accept(&batch(T0 + 750, 250, vec![counter("a", 2.0)]), T0 + 1499, &mut sink.emit()).unwrap();
    tiler.close_due(T0 + 1499, &mut sink.emit());
    assert!(sink.tiles.is_empty());
    tiler.close_due(T0 + 1500, &mut sink.emit());
    assert_eq!(sink.counter(0, T0 + 1000, "a"), Some(3.0));

    // Too late for the 1 s tile, whose 5 s tile is open: it goes whole into the 5 s tile.
    let late = batch(T0 + 750, 250, vec![counter("a", 100.0), counter("new", 1.0)]);
    let admitted = tiler.check(late.window_start_ms, late.window_ms, T0 + 1600).unwrap();
    assert_eq!(admitted.late, ["1s:1h".parse().unwrap()]);
    tiler.accept(&late, T0 + 1600, &mut sink.emit()).unwrap();
    // Too late for the 5 s tile as well: refused whole, named by the coarsest policy.
    tiler.close_due(T0 + 5500, &mut sink.emit());
    let refusal =
        tiler.accept(&batch(T0 + 750, 250, vec![counter("a", 1e6)]), T0 + 5600, &mut sink.emit()).unwrap_err();
    assert_eq!(refusal.reason(), AckReason::TooLate);
    assert!(refusal.to_string().contains("`5s:1h` tile ending at"), "{refusal}");
    tiler.close_all(&mut sink.emit());
    let first_tiles = sink.tiles.iter().filter(|tile| tile.policy_index == 0 && tile.tile_end_ms == T0 + 1000).count();
    assert_eq!(first_tiles, 1, "a closed tile is never opened again");
    assert_eq!(sink.counter(0, T0 + 1000, "a"), Some(3.0), "the closed 1 s tile took nothing more");
    assert_eq!(sink.counter(0, T0 + 1000, "new"), None);
    assert_eq!(sink.counter(1, T0 + 5000, "a"), Some(103.0), "the 5 s tile holds the late window");
    assert_eq!(sink.counter(1, T0 + 5000, "new"), Some(1.0));
}

#[test]
fn windows_too_far_ahead_or_across_a_boundary_are_refused() {
    let mut tiler = Tiler::new(settings(&["1s:1h"]), T0);
    let mut sink = Sink::default();
    let now = T0 + 100;
    // Ends exactly at now + buffer_future: accepted; 1 ms more: too early.
    tiler.accept(&batch(T0 + 350, 250, vec![counter("a", 1.0)]), now, &mut sink.emit()).unwrap();
    let refusal = tiler.accept(&batch(T0 + 351, 250, vec![counter("a", 1.0)]), now, &mut sink.emit()).unwrap_err();
    assert_eq!(refusal.reason(), AckReason::TooEarly);
    for (start, length) in [(T0 + 900, 200), (T0, 0), (T0, -5), (i64::MAX - 10, 100)] {
        let refusal = tiler.check(start, length, now).unwrap_err();
        assert_eq!(refusal.reason(), AckReason::Malformed, "{start} +{length}");
    }
}

#[test]
fn gauges_resolve_deltas_against_the_previous_tile_and_keep_the_latest_set() {
    let mut tiler = Tiler::new(settings(&["1s:1h"]), T0);
    let mut sink = Sink::default();
    let set = |value, at_ms: i64| Gauge::with_value(value, at_ms * 1_000_000);
    let delta = |delta, at_ms: i64| Gauge::with_delta(delta, at_ms * 1_000_000);
    let sends = [
        (0, vec![gauge("g", set(10.0, T0 + 200)), gauge("d", delta(5.0, T0 + 300))]),
        // A later set arriving first still wins over an earlier one.
        (
            1,
            vec![
                gauge("g", set(7.0, T0 + 1_900)),
                gauge("g", set(3.0, T0 + 1_100)),
                gauge("d", delta(2.0, T0 + 1_300)),
            ],
        ),
        (2, vec![gauge("g", delta(5.0, T0 + 2_100)), gauge("d", delta(-1.0, T0 + 2_200))]),
        (4, vec![gauge("g", delta(-2.0, T0 + 4_500))]),
    ];
    for (second, partials) in sends {
        let start = T0 + second * 1000;
        tiler.accept(&batch(start, 1000, partials), start + 1100, &mut sink.emit()).unwrap();
    }
    tiler.close_due(T0 + 10_000, &mut sink.emit());
    let g: Vec<Option<f64>> = (1..=5).map(|second| sink.gauge(0, T0 + second * 1000, "g")).collect();
    assert_eq!(g, [Some(10.0), Some(7.0), Some(12.0), None, Some(10.0)]);
    let d: Vec<Option<f64>> = (1..=3).map(|second| sink.gauge(0, T0 + second * 1000, "d")).collect();
    assert_eq!(d, [Some(5.0), Some(7.0), Some(6.0)], "a delta-only gauge starts at 0");
}

#[test]
fn gauge_windows_merge_in_the_order_their_lines_were_sent_whatever_order_they_arrive_in() {
    let set = |value, at_ms: i64| Gauge::with_value(value, at_ms * 1_000_000);
    let delta = |delta, at_ms: i64| Gauge::with_delta(delta, at_ms * 1_000_000);
    // One 10 s tile; collector A sets 70 in its second window and sends +5
    // and -2 in its fourth; collector B sent a delta before the set (it is
    // superseded) and one after it.
    let windows = [
        (1, gauge("g", delta(100.0, T0 + 1_500))),
        (2, gauge("g", set(70.0, T0 + 2_100))),
        (3, gauge("g", delta(4.0, T0 + 3_200))),
        (
            4,
            gauge("g", {
                let mut deltas = delta(5.0, T0 + 4_100);
                deltas.add_delta(-2.0, (T0 + 4_200) * 1_000_000);
                deltas
            }),
        ),
    ];
    // Every arrival order of the four windows gives 70 + 4 + 5 - 2.
    let orders = [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2], [3, 0, 1, 2]];
    for order in orders {
        let mut tiler = Tiler::new(settings(&["10s:1h"]), T0);
        let mut sink = Sink::default();
        let mut ambiguous = 0;
        for index in order {
            let (second, partial) = windows[index].clone();
            let start = T0 + second * 1000;
            let applied = tiler.accept(&batch(start, 1000, vec![partial]), T0 + 5_000, &mut sink.emit()).unwrap();
            ambiguous += applied.gauge_order_ambiguous;
        }
        tiler.close_due(T0 + 20_000, &mut sink.emit());
        assert_eq!(sink.gauge(0, T0 + 10_000, "g"), Some(77.0), "arrival order {order:?}");
        assert_eq!(ambiguous, 0);
    }

    // A delta window that spans another collector's set cannot be placed: counted.
    let mut tiler = Tiler::new(settings(&["10s:1h"]), T0);
    let mut sink = Sink::default();
    let mut spanning = delta(1.0, T0 + 1_100);
    spanning.add_delta(1.0, (T0 + 1_900) * 1_000_000);
    spanning.join_runs();
    tiler
        .accept(&batch(T0 + 1_000, 1000, vec![gauge("g", set(10.0, T0 + 1_500))]), T0 + 2_000, &mut sink.emit())
        .unwrap();
    let applied =
        tiler.accept(&batch(T0 + 1_000, 1000, vec![gauge("g", spanning)]), T0 + 2_000, &mut sink.emit()).unwrap();
    assert_eq!(applied.gauge_order_ambiguous, 1);
}

#[test]
fn distributions_and_sets_merge_exactly() {
    let mut tiler = Tiler::new(settings(&["1s:1h"]), T0);
    let mut sink = Sink::default();
    let mut expected = Distribution::default();
    let mut members = HyperLogLog::new();
    let mut distinct = std::collections::HashSet::new();
    for sender in 0..5 {
        let mut timer = Distribution::default();
        let mut set = HyperLogLog::new();
        for value in 1..=20 {
            let value = f64::from(value * (sender + 1));
            timer.insert(value, 1.0);
            expected.insert(value, 1.0);
            set.insert(format!("user{}", value as u64 % 37).as_bytes());
            members.insert(format!("user{}", value as u64 % 37).as_bytes());
            distinct.insert(value as u64 % 37);
        }
        let partials = vec![
            Partial {
                via: Via::Id,
                kind: MetricKind::Timer,
                id: b"t".to_vec(),
                aggregate: Aggregate::Distribution(Box::new(timer)),
            },
            Partial {
                via: Via::Id,
                kind: MetricKind::Set,
                id: b"s".to_vec(),
                aggregate: Aggregate::Set(Box::new(set)),
            },
        ];
        tiler.accept(&batch(T0, 1000, partials), T0 + 1100, &mut sink.emit()).unwrap();
    }
    tiler.close_due(T0 + 2000, &mut sink.emit());
    let Some(Value::Distribution(timer)) = sink.value(0, T0 + 1000, "t") else { panic!("no timer") };
    assert_eq!((timer.count, timer.sum, timer.min, timer.max), (expected.count, expected.sum, 1.0, 100.0));
    assert_eq!(timer.sketch, Some(expected.sketch.to_proto()));
    // The squares add up across senders too (statsd's `std`, for per-tile stores).
    assert_eq!(timer.sum_squares, expected.sum_squares);
    assert!(timer.sum_squares > 0.0);
    let Some(Value::Set(set)) = sink.value(0, T0 + 1000, "s") else { panic!("no set") };
    assert_eq!(HyperLogLog::from_proto(&set).unwrap().estimate(), members.estimate());
    assert_eq!(members.estimate(), distinct.len() as f64, "exact while small");
}

#[test]
fn timers_whose_collectors_disagree_on_buckets_merge_without_them_and_are_counted() {
    let mut tiler = Tiler::new(settings(&["1s:1h", "5s:1h"]), T0);
    let mut sink = Sink::default();
    let timer = |bounds: &[f64]| {
        let mut timer = Distribution::with_buckets(std::sync::Arc::from(bounds));
        timer.insert(0.5, 1.0);
        Partial {
            via: Via::Id,
            kind: MetricKind::Timer,
            id: b"t".to_vec(),
            aggregate: Aggregate::Distribution(Box::new(timer)),
        }
    };
    let first = tiler.accept(&batch(T0, 1000, vec![timer(&[1.0])]), T0 + 1100, &mut sink.emit()).unwrap();
    let agreeing = tiler.accept(&batch(T0, 1000, vec![timer(&[1.0])]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((first.buckets_dropped, agreeing.buckets_dropped), (0, 0));
    // A collector that took a reloaded mapping first: other bounds.
    let reloaded = tiler.accept(&batch(T0, 1000, vec![timer(&[2.0])]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!(reloaded.buckets_dropped, 2, "once per policy");
    tiler.close_due(T0 + 2000, &mut sink.emit());
    let Some(Value::Distribution(merged)) = sink.value(0, T0 + 1000, "t") else { panic!("no timer") };
    assert!(merged.bucket_bounds.is_empty() && merged.bucket_counts.is_empty());
    assert_eq!(merged.count, 3.0, "the count stays whole");
}

#[test]
fn idle_series_expire_after_the_configured_empty_tiles() {
    let mut tiler = Tiler::new(TilerSettings { expire_after_empty_tiles: Some(4), ..settings(&["1s:1h"]) }, T0);
    assert_eq!(tiler.tables_of(0), 2);
    let mut sink = Sink::default();
    tiler.accept(&batch(T0, 1000, vec![counter("idle", 1.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    for empty_tiles in 1..4 {
        // Empty tile number `empty_tiles` ends at T0 + (empty_tiles + 1) s and closes 500 ms later.
        tiler.close_due(T0 + (empty_tiles + 1) * 1000 + 500, &mut sink.emit());
        assert_eq!(tiler.series_held(0), 1, "kept after {empty_tiles} empty tiles");
    }
    tiler.close_due(T0 + 6_500, &mut sink.emit());
    assert_eq!((tiler.series_held(0), sink.expired), (0, 1), "gone after 4 empty tiles");
}

#[test]
fn shutdown_flushes_open_tiles_and_a_clock_jump_does_not_spin() {
    let mut tiler = Tiler::new(settings(&["1s:1h", "1m:1d"]), T0);
    let mut sink = Sink::default();
    tiler.accept(&batch(T0 + 500, 500, vec![counter("a", 1.0)]), T0 + 1000, &mut sink.emit()).unwrap();
    tiler.accept(&batch(T0 + 1000, 500, vec![counter("a", 2.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    tiler.close_all(&mut sink.emit());
    assert_eq!(sink.counter(0, T0 + 1000, "a"), Some(1.0));
    assert_eq!(sink.counter(0, T0 + 2000, "a"), Some(2.0));
    assert_eq!(sink.counter(1, T0 + 60_000, "a"), Some(3.0));

    // Closed by the shutdown flush: the 1 min tile takes nothing more, and so neither does
    // a 1 s tile that had not opened (no finer tile may hold what its coarser one lacks).
    let refused = tiler.accept(&batch(T0 + 2000, 500, vec![counter("b", 1.0)]), T0 + 2100, &mut sink.emit());
    assert_eq!(refused.unwrap_err().reason(), AckReason::TooLate);

    let mut tiler = Tiler::new(settings(&["1s:1h", "1m:1d"]), T0);
    let year_ms = 365 * 86_400_000;
    tiler.accept(&batch(T0 + 2000, 500, vec![counter("b", 1.0)]), T0 + 2100, &mut sink.emit()).unwrap();
    let started = std::time::Instant::now();
    tiler.close_due(T0 + year_ms, &mut sink.emit());
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(sink.counter(0, T0 + 3000, "b"), Some(1.0));
    let next = tiler.next_close_ms();
    assert!(next > T0 + year_ms && next <= T0 + year_ms + 1000, "{next}");
}

#[test]
fn a_full_table_refuses_new_series_and_counts_them() {
    let mut tiler = Tiler::new(TilerSettings { max_series_per_policy: Some(2), ..settings(&["1s:1h", "5s:1h"]) }, T0);
    let mut sink = Sink::default();
    let partials = vec![counter("a", 1.0), counter("b", 1.0), counter("c", 1.0)];
    let applied = tiler.accept(&batch(T0, 1000, partials), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!(
        applied,
        Applied {
            partials: 3,
            new_series: 2,
            series_limit: 1,
            gauge_order_ambiguous: 0,
            buckets_dropped: 0,
            memory_limit: 0,
            unknown_refs: 0
        }
    );
}

#[test]
fn tables_cover_every_tile_that_can_be_open_at_once() {
    let policy: StoragePolicy = "10s:1d".parse().unwrap();
    assert_eq!(tables_per_policy(&policy, 2_000, 2_000), 2);
    assert_eq!(tables_per_policy(&policy, 10_000, 0), 2);
    assert_eq!(tables_per_policy(&policy, 10_000, 1), 3);
    assert_eq!(tables_per_policy(&policy, 25_000, 5_000), 4);
    // Exhaustively: no two open tiles ever share a table, and every window lands once.
    for (past, future) in [(500, 500), (900, 300), (2_500, 700), (0, 100)] {
        let custom = TilerSettings { buffer_past_ms: past, buffer_future_ms: future, ..settings(&["1s:1h"]) };
        let mut tiler = Tiler::new(custom, T0);
        let mut sink = Sink::default();
        let mut accepted = std::collections::HashSet::new();
        for now in (T0..T0 + 20_000).step_by(70) {
            for start in ((now - past - 1_000) / 100 * 100..now + future).step_by(100) {
                if !accepted.contains(&start) && tiler.check(start, 100, now).is_ok() {
                    tiler.accept(&batch(start, 100, vec![counter("x", 1.0)]), now, &mut sink.emit()).unwrap();
                    accepted.insert(start);
                }
            }
        }
        tiler.close_all(&mut sink.emit());
        let ends: Vec<i64> = sink.tiles.iter().map(|tile| tile.tile_end_ms).collect();
        let mut unique = ends.clone();
        unique.dedup();
        assert_eq!(ends, unique, "past {past} future {future}: a tile was flushed twice");
        for tile in sink.tiles.iter().filter(|tile| tile.tile_start_ms >= T0 && tile.tile_end_ms <= T0 + 19_000) {
            let sum = sink.counter(0, tile.tile_end_ms, "x");
            assert_eq!(sum, Some(10.0), "past {past} future {future}: tile ending {}", tile.tile_end_ms);
        }
    }
}

#[test]
fn dictionary_slots_reach_their_series_and_pin_them_until_forgotten() {
    let mut tiler = Tiler::new(TilerSettings { expire_after_empty_tiles: Some(2), ..settings(&["1s:1h"]) }, T0);
    let mut sink = Sink::default();
    // A batch may name some series by id alone before it defines slots.
    let first = vec![counter("plain", 1.0), defining(0, counter("named", 2.0))];
    tiler.accept(&WindowPartials { connection: 7, ..batch(T0, 1000, first) }, T0 + 1100, &mut sink.emit()).unwrap();
    let by_ref = WindowPartials {
        connection: 7,
        ..batch(T0 + 1000, 1000, vec![counter_by_slot(0, 3.0), counter_by_slot(1, 4.0)])
    };
    let applied = tiler.accept(&by_ref, T0 + 2100, &mut sink.emit()).unwrap();
    assert_eq!((applied.partials, applied.unknown_refs), (2, 1), "slot 1 was never defined");
    tiler.close_due(T0 + 3_000, &mut sink.emit());
    assert_eq!(sink.counter(0, T0 + 1000, "named"), Some(2.0));
    assert_eq!(sink.counter(0, T0 + 2000, "named"), Some(3.0));
    // Idle for long enough, `plain` expires; `named` stays while connection 7 names it.
    tiler.close_due(T0 + 10_000, &mut sink.emit());
    assert_eq!((tiler.series_held(0), sink.expired), (1, 1));
    tiler.forget_dictionary(7);
    tiler.close_due(T0 + 11_000, &mut sink.emit());
    assert_eq!((tiler.series_held(0), sink.expired), (0, 2));
}

#[test]
fn a_slot_defined_while_the_series_cap_is_reached_counts_its_refs_as_series_limit() {
    let mut tiler = Tiler::new(TilerSettings { max_series_per_policy: Some(1), ..settings(&["1s:1h"]) }, T0);
    let mut sink = Sink::default();
    let define = vec![defining(0, counter("in", 1.0)), defining(1, counter("over", 1.0))];
    let applied = tiler
        .accept(&WindowPartials { connection: 3, ..batch(T0, 1000, define) }, T0 + 1100, &mut sink.emit())
        .unwrap();
    assert_eq!((applied.series_limit, applied.unknown_refs), (1, 0));
    let refs = WindowPartials {
        connection: 3,
        ..batch(T0 + 1000, 1000, vec![counter_by_slot(0, 2.0), counter_by_slot(1, 2.0)])
    };
    let applied = tiler.accept(&refs, T0 + 2100, &mut sink.emit()).unwrap();
    assert_eq!((applied.series_limit, applied.unknown_refs), (1, 0), "a capped slot is not an unknown ref");
    // Definitions of a refused batch bind the same way, and count nothing more.
    let refused = WindowPartials { connection: 4, ..batch(T0, 1000, vec![defining(0, counter("x", 1.0))]) };
    tiler.bind_definitions(&refused);
    let refs = WindowPartials { connection: 4, ..batch(T0 + 2000, 1000, vec![counter_by_slot(0, 1.0)]) };
    let applied = tiler.accept(&refs, T0 + 3100, &mut sink.emit()).unwrap();
    assert_eq!((applied.series_limit, applied.unknown_refs), (1, 0));
}

#[test]
fn near_the_memory_limit_new_series_are_refused_and_known_ones_go_on() {
    use std::sync::Arc;
    use tessera_core::budget::MemoryBudget;
    let budget = Arc::new(MemoryBudget::new(1000));
    let mut tiler = Tiler::new(settings(&["1s:1h"]), T0).with_budget(budget.clone());
    let mut sink = Sink::default();
    let applied = tiler.accept(&batch(T0, 1000, vec![counter("known", 1.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (1, 0));
    budget.update(800, true);
    let partials = vec![counter("known", 2.0), counter("new", 1.0)];
    let applied = tiler.accept(&batch(T0, 1000, partials), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (0, 1));
    budget.update(600, false);
    let applied = tiler.accept(&batch(T0, 1000, vec![counter("new", 5.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (1, 0));
    tiler.close_due(T0 + 2000, &mut sink.emit());
    assert_eq!(sink.counter(0, T0 + 1000, "known"), Some(3.0), "the known series went on exactly");
    assert_eq!(sink.counter(0, T0 + 1000, "new"), Some(5.0), "only what came after the shedding");
}

#[test]
fn a_series_cap_from_the_budget_refuses_new_series_until_others_expire() {
    use std::sync::Arc;
    use tessera_core::budget::MemoryBudget;
    // 75 % of 1000 bytes at 250 bytes a series: two merge threads share three places.
    let budget = Arc::new(MemoryBudget::new(1000).with_series_cost(250));
    let mut first = Tiler::new(settings(&["1s:1h"]), T0).with_budget(budget.clone());
    let mut second = Tiler::new(settings(&["1s:1h"]), T0).with_budget(budget.clone());
    let mut sink = Sink::default();
    let partials = vec![counter("a", 1.0), counter("b", 1.0)];
    let applied = first.accept(&batch(T0, 1000, partials), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (2, 0));
    let partials = vec![counter("c", 1.0), counter("d", 1.0)];
    let applied = second.accept(&batch(T0, 1000, partials), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (1, 1), "one place left between the two");
    assert_eq!(budget.series_held(), 3);
    let applied = first.accept(&batch(T0, 1000, vec![counter("a", 2.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (0, 0), "a known series goes on");
    first.close_due(T0 + 2000, &mut sink.emit());
    assert_eq!(sink.counter(0, T0 + 1000, "a"), Some(3.0));
    drop(first);
    assert_eq!(budget.series_held(), 1, "a tiler that goes gives its places back");
    let applied = second.accept(&batch(T0, 1000, vec![counter("d", 1.0)]), T0 + 1100, &mut sink.emit()).unwrap();
    assert_eq!((applied.new_series, applied.memory_limit), (1, 0));
}

/// RELIABILITY.md, fix 16: a close that passed several tiles of one policy with nothing in
/// them reported only the first, so a leader never recorded the others incomplete and a
/// follower holding them whole let them go.
#[test]
fn one_close_reports_every_tile_that_received_nothing() {
    let mut tiler = Tiler::new(settings(&["1s:1h", "1m:1d"]), T0 + 500);
    tiler.accept(&batch(T0, 1000, vec![counter("a", 1.0)]), T0 + 900, &mut |_| {}).unwrap();
    let mut closed = Vec::new();
    tiler.close_through(T0 + 4_000, &mut |tile| closed.push((tile.policy_index, tile.tile_end_ms, tile.values.len())));
    assert_eq!(closed, [(0, T0 + 1_000, 1), (0, T0 + 2_000, 0), (0, T0 + 3_000, 0), (0, T0 + 4_000, 0)]);
    // After a long pause (or a clock step), only the last 16 empty tiles of a policy.
    let mut closed = Vec::new();
    tiler.close_through(T0 + 3_600_000, &mut |tile| closed.push((tile.policy_index, tile.tile_end_ms)));
    let seconds: Vec<i64> = closed.iter().filter(|(policy, _)| *policy == 0).map(|(_, end)| end - T0).collect();
    assert_eq!(seconds, (3_585..=3_600).map(|second| second * 1000).collect::<Vec<_>>());
}
