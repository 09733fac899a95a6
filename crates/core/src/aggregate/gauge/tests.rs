use proptest::prelude::*;

use super::*;

/// One gauge line: set to a value, or change by a delta.
#[derive(Debug, Clone, Copy)]
enum Op {
    Set(f64),
    Delta(f64),
}

fn apply_in_order(ops: &[Op]) -> Option<f64> {
    let mut value: Option<f64> = None;
    for op in ops {
        value = Some(match op {
            Op::Set(set) => *set,
            Op::Delta(delta) => value.unwrap_or(0.0) + delta,
        });
    }
    value
}

fn observe(gauge: &mut Gauge, op: Op, stamp_ns: i64) {
    match op {
        Op::Set(value) => gauge.set(value, stamp_ns),
        Op::Delta(delta) => gauge.add_delta(delta, stamp_ns),
    }
}

#[test]
fn the_issue_sequences_merge_exactly_in_every_split_and_order() {
    for ops in [[Op::Set(70.0), Op::Delta(5.0), Op::Delta(-2.0)], [Op::Set(1.0), Op::Set(2.0), Op::Set(3.0)]] {
        let due = apply_in_order(&ops);
        // Every assignment of the three lines to three readers, merged in every order.
        for assignment in 0..27 {
            let mut readers = vec![Gauge::default(); 3];
            for (i, op) in ops.iter().enumerate() {
                let reader = (assignment / 3usize.pow(i as u32)) % 3;
                observe(&mut readers[reader], *op, 1_000 + i as i64);
            }
            for first in 0..3 {
                let mut merged = readers[first].clone();
                for (index, reader) in readers.iter().enumerate() {
                    if index != first {
                        assert_eq!(merged.merge(reader), MergeOrder::Exact);
                    }
                }
                assert_eq!(merged.resolve(None), due, "{ops:?} split {assignment}, first {first}");
            }
        }
    }
}

#[test]
fn deltas_before_a_later_set_from_another_reader_are_superseded() {
    // +5 (reader a), 70 (reader b), -2 (reader a): 68.
    let mut a = Gauge::with_delta(5.0, 10);
    a.add_delta(-2.0, 30);
    let b = Gauge::with_value(70.0, 20);
    let mut ab = a.clone();
    assert_eq!(ab.merge(&b), MergeOrder::Exact);
    let mut ba = b.clone();
    assert_eq!(ba.merge(&a), MergeOrder::Exact);
    assert_eq!(ab.resolve(None), Some(68.0));
    assert_eq!(ba.resolve(None), Some(68.0));
    assert_eq!(ab, ba, "the merge is commutative");
}

#[test]
fn a_joined_run_spanning_a_set_is_reported_ambiguous() {
    let mut deltas = Gauge::with_delta(1.0, 10);
    deltas.add_delta(1.0, 30);
    deltas.join_runs();
    let mut merged = Gauge::with_value(100.0, 20);
    assert_eq!(merged.merge(&deltas), MergeOrder::Ambiguous);
    assert_eq!(merged.resolve(None), Some(102.0), "the run ending after the set is kept");

    let mut first = Gauge::with_value(1.0, 5);
    assert_eq!(first.merge(&Gauge::with_value(2.0, 5)), MergeOrder::Ambiguous);
    assert_eq!(first.resolve(None), Some(2.0), "two sets with one stamp keep the larger");
    assert_eq!(first.merge(&Gauge::with_value(2.0, 5)), MergeOrder::Exact, "the same value twice is no conflict");
}

#[test]
fn an_older_timestamped_set_does_not_override_a_newer_one() {
    let mut gauge = Gauge::with_value(5.0, 2_000);
    gauge.set(7.0, 1_000);
    assert_eq!(gauge.resolve(None), Some(5.0));
    // A delta after a set stamped in the future still follows it.
    gauge.add_delta(1.0, 1_500);
    assert_eq!(gauge.runs()[0].first_ns, 2_000);
    assert_eq!(gauge.resolve(None), Some(6.0));
}

#[test]
fn runs_are_bounded_and_keep_their_sum() {
    let mut gauge = Gauge::default();
    for stamp in 0..1_000 {
        gauge.add_delta(1.0, stamp);
    }
    assert!(gauge.runs().len() <= MAX_DELTA_RUNS);
    assert_eq!(gauge.delta(), 1_000.0);
    assert_eq!((gauge.runs()[0].first_ns, gauge.runs().last().unwrap().last_ns), (0, 999));
    assert_eq!(gauge.resolve(Some(5.0)), Some(1_005.0));
    assert_eq!(Gauge::default().resolve(Some(5.0)), Some(5.0), "an empty partial keeps the previous value");
}

/// Lines of one sender (in order, stamps increasing), the window each
/// belongs to (a cut after any line), the reader each went to, and the
/// order in which the readers' window partials reach the merge.
fn sender_lines() -> impl Strategy<Value = (Vec<(Op, usize)>, Vec<bool>, usize, u64)> {
    let op = prop_oneof![
        (-50i32..50).prop_map(|v| Op::Set(f64::from(v))),
        (-50i32..50).prop_map(|v| Op::Delta(f64::from(v))),
    ];
    (1usize..=8).prop_flat_map(move |readers| {
        let lines = prop::collection::vec((op.clone(), 0..readers), 1..80);
        lines.prop_flat_map(move |lines| {
            let cuts = prop::collection::vec(any::<bool>(), lines.len());
            (Just(lines), cuts, Just(readers), any::<u64>())
        })
    })
}

proptest! {
    /// Any interleaving of one sender's gauge lines, cut into windows at any
    /// point and split over any number of readers, folds to the value of
    /// applying the lines in order: readers fold their lines, each window's
    /// reader partials merge (in the collector's flusher), the window's
    /// runs are joined for the wire, and windows merge in any order (at the
    /// aggregator).
    #[test]
    fn any_split_of_one_senders_lines_folds_to_the_in_order_value(
        (lines, cuts, readers, shuffle) in sender_lines()
    ) {
        let ops: Vec<Op> = lines.iter().map(|(op, _)| *op).collect();
        let mut windows: Vec<Vec<Gauge>> = vec![vec![Gauge::default(); readers]];
        for (index, (op, reader)) in lines.iter().enumerate() {
            observe(&mut windows.last_mut().unwrap()[*reader], *op, 1_000 + index as i64 * 7);
            // At most MAX_DELTA_RUNS stamps per window, the bound of exactness.
            if cuts[index] || (index + 1) % MAX_DELTA_RUNS == 0 {
                windows.push(vec![Gauge::default(); readers]);
            }
        }
        let mut partials = Vec::new();
        for window in &windows {
            let mut merged = Gauge::default();
            for reader in window {
                prop_assert_eq!(merged.merge(reader), MergeOrder::Exact);
            }
            merged.join_runs();
            partials.push(merged);
        }
        // A deterministic shuffle of the windows' arrival order.
        let mut state = shuffle | 1;
        for i in (1..partials.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            partials.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut tile = Gauge::default();
        for partial in &partials {
            prop_assert_eq!(tile.merge(partial), MergeOrder::Exact);
        }
        prop_assert_eq!(tile.resolve(None), apply_in_order(&ops));
    }
}
