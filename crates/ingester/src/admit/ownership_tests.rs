//! Running totals in an ingesters' placement: epochs per shard, explicit resets for
//! adopted series.

use prometheus_client::metrics::counter::Counter;
use tessera_testkit::tiles::counter;
use tessera_topology::Placement;

use super::tests::batch;
use super::*;
use crate::tier::OwnershipView;

const SHARDS: u32 = 4;

/// (value, reset_before) of the one sample of a one-counter batch.
fn one(converter: &mut Converter, tile_end_ms: i64, id: &str, delta: f64) -> (f64, bool) {
    let conversion = converter.convert(&batch(tile_end_ms, vec![counter(id, delta)]), 0).unwrap();
    converter.commit();
    let sample = &conversion.record.samples[0];
    (sample.value, sample.reset_before)
}

fn view(owned: &[bool], version: u64) -> OwnershipView {
    OwnershipView {
        num_shards: owned.len() as u32,
        owned: owned.to_vec(),
        joining: vec![false; owned.len()],
        cutoff_ms: vec![0; owned.len()],
        cutover_ms: vec![0; owned.len()],
        tenure: vec![0; owned.len()],
        since: vec![1; owned.len()],
        version,
        rejoined: false,
    }
}

/// Version `version` of the view, every shard owned.
fn all_owned(version: u64) -> OwnershipView {
    view(&[true; SHARDS as usize], version)
}

/// Version `version` of the view, every shard owned but `shard`.
fn all_owned_but(shard: usize, version: u64) -> OwnershipView {
    let mut owned = [true; SHARDS as usize];
    owned[shard] = false;
    view(&owned, version)
}

/// A series in a shard other than `shard`.
fn series_outside(shard: usize) -> String {
    (0..100)
        .map(|n| format!("other|#n:{n}"))
        .find(|other| tessera_core::shard::shard_of(other.as_bytes(), SHARDS) as usize != shard)
        .expect("a series in another shard")
}

fn setup() -> (Converter, Arc<Ownership>, Counter, String, usize) {
    let ownership = Arc::new(Ownership::default());
    let metrics = crate::tier::TierMetrics::default();
    let adopted = metrics.series_adopted.clone();
    let converter = Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &metrics);
    let id = "hits|#series:a".to_owned();
    let shard = tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize;
    (converter, ownership, adopted, id, shard)
}

/// A total restored before the first view (as a single ingester): a first view that owns
/// its shard counts as owned all along, one that joins the shard makes the total stale.
#[test]
fn the_first_view_keeps_restored_totals_unless_it_joins_their_shard() {
    // (joining the shard, next tile end, next delta, due (value, reset_before), adopted, why)
    // (joining the shard, rejoined, next tile end, next delta, due (value, reset_before),
    // adopted, why)
    let cases = [
        (false, false, 20_000, 3.0, (5.0, false), 0, "the restored total goes on"),
        (true, false, 60_000, 4.0, (4.0, true), 1, "taken back at a cutover: starts over"),
        // Found failed over at start, then given the shard at once by a failover of another
        // (found by the fault campaign, seed 2: the restored total went on, counting twice
        // what the owner meanwhile had written).
        (false, true, 60_000, 4.0, (4.0, true), 1, "failed over while down: starts over"),
    ];
    for (joining, rejoined, tile_end_ms, delta, due, adopted_due, why) in cases {
        let (mut converter, ownership, adopted, id, shard) = setup();
        assert_eq!(
            one(&mut converter, 10_000, &id, 2.0),
            (2.0, true),
            "a new total in a placement starts with a reset, view or not"
        );
        let mut first = all_owned(1);
        first.joining[shard] = joining;
        first.rejoined = rejoined;
        ownership.publish(first);
        assert_eq!(one(&mut converter, tile_end_ms, &id, delta), due, "{why}");
        assert_eq!(adopted.get(), adopted_due, "{why}");
    }
}

#[test]
fn a_shard_lost_and_gained_again_starts_its_series_over_with_a_reset() {
    let (mut converter, ownership, adopted, id, shard) = setup();
    ownership.publish(all_owned(1));
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
    ownership.publish(all_owned_but(shard, 2));
    let other = series_outside(shard);
    assert_eq!(one(&mut converter, 20_000, &other, 1.0), (1.0, true), "a new series in another shard");
    ownership.publish(all_owned(3));
    assert_eq!(one(&mut converter, 60_000, &id, 4.0), (4.0, true), "the stale total of 2 is dropped, reset first");
    assert_eq!(one(&mut converter, 70_000, &id, 1.0), (5.0, false), "then cumulative again");
    assert_eq!(adopted.get(), 1);
}

#[test]
fn a_tile_ahead_of_the_view_gains_the_shard_once() {
    let (mut converter, ownership, adopted, id, shard) = setup();
    let mut none = [false; SHARDS as usize];
    ownership.publish(view(&none, 1));
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true), "an aggregator saw the move first");
    none[shard] = true;
    ownership.publish(view(&none, 2));
    assert_eq!(one(&mut converter, 20_000, &id, 1.0), (3.0, false), "the view catching up is not a second move");
    assert_eq!(adopted.get(), 1);
}

#[test]
fn an_adopted_series_refused_by_the_queue_is_not_counted() {
    let (mut converter, ownership, adopted, id, _) = setup();
    ownership.publish(view(&[false; SHARDS as usize], 1));
    let conversion = converter.convert(&batch(10_000, vec![counter(&id, 2.0)]), 0).unwrap();
    assert!(conversion.record.samples[0].reset_before);
    converter.rollback();
    assert_eq!(adopted.get(), 0);
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true), "the retry is adopted again");
    assert_eq!(adopted.get(), 1);
}

#[test]
fn views_follow_the_placement() {
    let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], SHARDS, 1, 0).unwrap();
    let a = OwnershipView::of(&placement, "a");
    assert_eq!(a.owned.iter().filter(|owned| **owned).count(), 2);
}

#[test]
fn only_current_totals_are_checkpointed() {
    let (mut converter, ownership, _, id, shard) = setup();
    ownership.publish(all_owned(1));
    one(&mut converter, 10_000, &id, 2.0);
    let current = *converter.totals.values().next().unwrap();
    assert!(converter.total_is_current(&current));
    ownership.publish(all_owned_but(shard, 2));
    converter.convert(&batch(20_000, Vec::new()), 0).unwrap();
    converter.commit();
    assert!(!converter.total_is_current(&current), "a lost shard's totals are not kept");
    let unknown = Total { shard: 0, ..current };
    assert!(!converter.total_is_current(&unknown), "an unknown shard after a change may be stale");
}

#[test]
fn a_checkpoint_leaves_out_the_totals_of_a_lost_shard_and_keeps_the_shard_of_the_rest() {
    let (mut converter, ownership, _, id, shard) = setup();
    ownership.publish(all_owned(1));
    let other = series_outside(shard);
    one(&mut converter, 10_000, &id, 2.0);
    one(&mut converter, 10_000, &other, 5.0);
    ownership.publish(all_owned_but(shard, 2));
    converter.convert(&batch(20_000, Vec::new()), 0).unwrap();
    converter.commit();
    let bytes = converter.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();
    let mut restarted = Converter::new(&[0.5], 3_600_000);
    restarted.restore_checkpoint(&bytes).unwrap();
    assert_eq!(restarted.cumulative_series(), 1, "only the series of the shard still owned");
    let kept = restarted.totals.values().next().unwrap();
    assert_eq!((kept.value, kept.shard), (5.0, tessera_core::shard::shard_of(other.as_bytes(), SHARDS) + 1));
}

/// A shard being moved away, then given back by a failover of its receiver (found by the
/// fault campaign, seed 3 at 5 minutes): the receiver wrote the series from an explicit
/// reset after the cutoff, so the giver, owning it again, must start over too rather than
/// go on from its old total (which storage reads as every tile since counted twice). The
/// views come from real placement changes: a join, then a failover of the joiner.
#[test]
fn a_shard_given_away_then_back_by_a_failover_starts_its_total_over() {
    let (mut converter, ownership, adopted, _, _) = setup();
    let (placement, joined, view, moving) = b_joins_at_20s(&ownership);
    assert_eq!(view.owned_count(), SHARDS as usize, "a shard being given away is still listed until finalized");
    let id = (0..1000)
        .map(|n| format!("hits|#n:{n}"))
        .find(|id| tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize == moving)
        .expect("a series in the moving shard");

    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
    ownership.publish(view);
    assert_eq!(one(&mut converter, 20_000, &id, 3.0), (5.0, false), "before the cutoff the total goes on");
    // After the cutoff `b` writes the series from a reset; then `b` dies and `a` gets the
    // shard back.
    let failed_over = joined.fail_over(&["b"], 45_000).unwrap();
    let back = OwnershipView::of(&failed_over, "a");
    assert!(back.owned[moving] && back.cutoff_ms[moving] == 0, "given back with no cutoff");
    ownership.publish(back);
    assert_eq!(one(&mut converter, 50_000, &id, 4.0), (4.0, true), "owned anew: starts over after a reset");
    assert_eq!(adopted.get(), 1);

    // A move whose receiver dies before the cutoff: the giver owned it all along, and the
    // new epoch costs one explicit reset, which storage reads exactly. The converter takes
    // in neither view before the next tile (it skips the one with the cutoff): the tenure
    // kept across views still tells it.
    let (mut converter, ownership, _, _, _) = setup();
    ownership.publish(OwnershipView::of(&placement, "a"));
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
    ownership.publish(OwnershipView::of(&joined, "a"));
    ownership.publish(OwnershipView::of(&joined.fail_over(&["b"], 15_000).unwrap(), "a"));
    assert_eq!(one(&mut converter, 20_000, &id, 3.0), (3.0, true));
}

/// An ingester paused past its lease with a batch taken in (found by the fault campaign,
/// seeds 10 and 15 at 5 minutes): failed over meanwhile, it joins again at a later cutover,
/// then converts the stale batch. That tile is of its old tenure and goes on the old total;
/// the new tenure starts over at the cutover. Converted as the new tenure, the stale tile's
/// total was carried past the cutover and read as doubled. Both orders of the views are
/// covered: the failover view skipped (still paused) or taken in before the stale tile.
#[test]
fn a_stale_tile_from_before_a_failover_goes_on_the_old_tenure_not_the_new_one() {
    let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], SHARDS, 1, 0).unwrap();
    let failed_over = placement.fail_over(&["a"], 25_000).unwrap();
    let timing = tessera_topology::MoveTiming::new(40_000).with_delay_ms(1).with_boundary_ms(60_000);
    let rejoined = failed_over.add_instance("a", "a:1", timing).unwrap();
    let back = OwnershipView::of(&rejoined, "a");
    let shard = (0..SHARDS as usize).find(|shard| back.owned[*shard]).expect("a joins with some shards");
    assert_eq!(back.cutover_ms[shard], 60_000, "taken back at the next boundary");
    assert!(OwnershipView::of(&placement, "a").owned[shard], "a owned it before the failover");
    let id = (0..1000)
        .map(|n| format!("hits|#n:{n}"))
        .find(|id| tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize == shard)
        .expect("a series in that shard");
    let other = series_outside(shard);

    // (the failover view taken in before the stale batch, the rejoin view too, due)
    let cases = [
        (false, true, (9.0, false)),
        (true, true, (9.0, false)),
        // Taken in between the two views, the stale tile gains the shard ahead of any view,
        // as a new total after a reset (exact: `b` adopts the series with a reset of its own
        // at its first tile); the rejoin view then shows its tenure starts later.
        (true, false, (4.0, true)),
    ];
    for (failover_seen, rejoin_seen, stale) in cases {
        let why = format!("failover view seen: {failover_seen}, rejoin view seen: {rejoin_seen}");
        let (mut converter, ownership, _, _, _) = setup();
        ownership.publish(OwnershipView::of(&placement, "a"));
        assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
        assert_eq!(one(&mut converter, 20_000, &id, 3.0), (5.0, false));
        ownership.publish(OwnershipView::of(&failed_over, "a"));
        if failover_seen {
            one(&mut converter, 20_000, &other, 1.0);
        }
        if rejoin_seen {
            ownership.publish(OwnershipView::of(&rejoined, "a"));
        }
        assert_eq!(one(&mut converter, 30_000, &id, 4.0), stale, "the stale tile; {why}");
        ownership.publish(OwnershipView::of(&rejoined, "a"));
        assert_eq!(one(&mut converter, 70_000, &id, 1.0), (1.0, true), "the new tenure starts over; {why}");
        assert_eq!(one(&mut converter, 80_000, &id, 2.0), (3.0, false), "and goes on; {why}");
    }
}

/// Found by the fault campaign (seed 10 at 5 minutes): an ingester given a shard back by a
/// failover (a new tenure: its totals of the shard are stale and left out of the
/// checkpoint) is killed before it writes the shard again, and restarts. Its first tile of
/// a series it had written starts a new total, which must start with an explicit reset:
/// without one, a total equal to the last one written (or above it) reads as no increase.
#[test]
fn a_total_a_restart_did_not_keep_starts_over_with_a_reset() {
    let (mut converter, ownership, adopted, id, shard) = setup();
    let take_in = |converter: &mut Converter| {
        converter.convert(&batch(60_000, Vec::new()), 0).unwrap();
        converter.commit();
    };
    ownership.publish(all_owned_but(shard, 1));
    take_in(&mut converter);
    ownership.publish(all_owned(2));
    assert_eq!(one(&mut converter, 60_000, &id, 240.0), (240.0, true), "adopted");
    ownership.publish(all_owned_but(shard, 3));
    take_in(&mut converter);
    ownership.publish(all_owned(4));
    take_in(&mut converter);
    let bytes = converter.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();

    let (mut restarted, ownership, _, _, _) = setup();
    restarted.restore_checkpoint(&bytes).unwrap();
    assert_eq!(restarted.cumulative_series(), 0, "the total of the ended tenure is not kept");
    ownership.publish(all_owned(5));
    assert_eq!(one(&mut restarted, 120_000, &id, 240.0), (240.0, true), "storage reads 0 then 240: an increase of 240");
    assert_eq!(adopted.get(), 1);
}

/// A series of `shard`.
fn series_in(shard: usize) -> String {
    (0..1000)
        .map(|n| format!("hits|#n:{n}"))
        .find(|id| tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize == shard)
        .expect("a series in the shard")
}

/// Found by the fault campaign, seed 38 at 5 minutes. `a` checkpoints its totals, dies and is
/// failed over; a first restart finds it missing, joins again (its shards at a cutover a
/// minute out) and dies before writing a checkpoint; a second restart, within the lease,
/// restores the same totals and finds itself in the placement as a joiner. A joiner converts
/// nothing before its cutover, and meanwhile `b` dies and `a` fails it over: the current
/// view then shows every shard owned from the start. Taken in as the converter's first view,
/// it kept the restored totals of the ended tenure: the next tile went on from them (doubled
/// where they were above what `b` had written, lost where they matched it). The first view
/// taken in is now the one of the start.
#[test]
fn a_restart_that_joins_and_then_fails_the_giver_over_keeps_no_restored_total() {
    let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], SHARDS, 1, 0).unwrap();
    // `a` dies; `b` fails it over; `a`'s first restart joins at a cutover of 60 s.
    let failed_over = placement.fail_over(&["a"], 25_000).unwrap();
    let timing = tessera_topology::MoveTiming::new(30_000).with_delay_ms(1).with_boundary_ms(60_000);
    let joined = failed_over.add_instance("a", "a:1", timing).unwrap();
    let joining = OwnershipView::of(&joined, "a");
    let taken = (0..SHARDS as usize).find(|shard| joining.owned[*shard] && joining.joining[*shard]);
    let left = (0..SHARDS as usize).find(|shard| !joining.owned[*shard]);
    let (x, y) = (series_in(taken.expect("a joins a shard")), series_in(left.expect("a shard stays b's")));

    // Incarnation 0 of `a`, before all that: it owned every shard (`b` failed over), wrote
    // both series and checkpointed.
    let (mut a0, ownership0, _, _, _) = setup();
    ownership0.publish(OwnershipView::of(&placement.fail_over(&["b"], 5_000).unwrap(), "a"));
    assert_eq!(one(&mut a0, 10_000, &x, 2.0), (2.0, true));
    assert_eq!(one(&mut a0, 10_000, &y, 2.0), (2.0, true));
    let bytes = a0.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();

    for convert_between in [false, true] {
        // The second restart: the same checkpoint, in the placement, not rejoined.
        let (mut a2, ownership2, _, _, _) = setup();
        a2.restore_checkpoint(&bytes).unwrap();
        ownership2.publish(joining.clone());
        if convert_between {
            // A tile from before the cutover, converted before the failover view: it is
            // the giver's tenure, which this process never held (fix 9's "tenure before"
            // would be the restored totals).
            assert_eq!(one(&mut a2, 40_000, &x, 3.0), (3.0, true), "no restored total goes on before the cutover");
        }
        // `b` dies before the cutover, and `a` fails it over: it owns every shard.
        ownership2.publish(OwnershipView::of(&joined.fail_over(&["b"], 45_000).unwrap(), "a"));
        let due = if convert_between { (6.0, false) } else { (3.0, true) };
        assert_eq!(
            one(&mut a2, 50_000, &x, 3.0),
            due,
            "no restored total goes on (converted between: {convert_between})"
        );
        assert_eq!(one(&mut a2, 50_000, &y, 3.0), (3.0, true), "nor on a shard gained by the failover");
    }
}

/// A view that says `rejoined` after a first that did not (the tier published before it
/// had looked): every total restored from the checkpoint is stale.
#[test]
fn rejoined_said_late_makes_every_restored_total_stale() {
    let (mut converter, ownership, _, id, _) = setup();
    ownership.publish(all_owned(1));
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
    let bytes = converter.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();
    let (mut restarted, ownership, _, _, _) = setup();
    restarted.restore_checkpoint(&bytes).unwrap();
    ownership.publish(all_owned(1));
    assert_eq!(one(&mut restarted, 20_000, &id, 3.0), (5.0, false), "owned all along: the restored total goes on");
    let mut late = all_owned(3);
    late.rejoined = true;
    ownership.publish(late);
    assert_eq!(one(&mut restarted, 30_000, &id, 4.0), (4.0, true), "rejoined after all: starts over");
}

/// Found by the fault campaign (seed 31 at 5 minutes, twice). `a` is paused past its lease with
/// the batch of a tile in flight to it; `b` fails it over. `a` resumes: its tier publishes the
/// failover view, its converter converts the stale batch (a shard it no longer owns: a new
/// total after a reset, exact), then `a` joins again for other shards at a cutover a minute
/// out and converts nothing. `b` writes the series from a reset of its own, dies, and `a`
/// fails it over: owned again, with no cutover. Taken for the view catching up with a gain
/// ahead, it kept the stale tile's total, and the next tile went on from it over what `b` had
/// written (storage read it as doubled).
#[test]
fn a_stale_tile_of_a_lost_shard_is_not_a_gain_that_a_later_failover_goes_on_from() {
    let placement = Placement::init(&[("a", "a:1"), ("b", "b:1")], SHARDS, 1, 0).unwrap();
    let failed_over = placement.fail_over(&["a"], 32_000).unwrap();
    let timing = tessera_topology::MoveTiming::new(38_000).with_delay_ms(30_000).with_boundary_ms(60_000);
    let rejoined = failed_over.add_instance("a", "a:1", timing).unwrap();
    let back = rejoined.fail_over(&["b"], 45_000).unwrap();
    let joining = OwnershipView::of(&rejoined, "a");
    let shard = (0..SHARDS as usize)
        .find(|shard| OwnershipView::of(&placement, "a").owned[*shard] && !joining.owned[*shard])
        .expect("a shard `a` owned before the failover and does not join again");
    let given_back = OwnershipView::of(&back, "a");
    assert!(given_back.owned[shard] && given_back.cutover_ms[shard] == 0, "given back by a failover");
    let id = series_in(shard);

    for join_seen in [false, true] {
        let why = format!("join view taken in: {join_seen}");
        let (mut a, ownership, _, _, _) = setup();
        ownership.publish(OwnershipView::of(&placement, "a"));
        assert_eq!(one(&mut a, 10_000, &id, 2.0), (2.0, true));
        assert_eq!(one(&mut a, 20_000, &id, 3.0), (5.0, false));
        // The tile ending 30 000 was in flight when `a` stopped; failed over at 32 000; resumed.
        ownership.publish(OwnershipView::of(&failed_over, "a"));
        assert_eq!(one(&mut a, 30_000, &id, 4.0), (4.0, true), "the stale tile: a new total after a reset");
        ownership.publish(joining.clone());
        if join_seen {
            a.convert(&batch(40_000, Vec::new()), 0).unwrap();
            a.commit();
        }
        // `b` wrote the series from a reset of its own at 40 000, then died.
        ownership.publish(given_back.clone());
        assert_eq!(one(&mut a, 50_000, &id, 1.0), (1.0, true), "owned anew by a failover: starts over; {why}");
        assert_eq!(one(&mut a, 60_000, &id, 2.0), (3.0, false), "then goes on; {why}");
    }
}

/// `a` gives a shard to `b` at 20 000 (writing a series of it before), `b` writes the tiles
/// after the cutoff, is paused with the tile ending 50 000 in flight, and `a` fails it over:
/// owned anew, the tile ending 60 000 starts the series over after a reset. Returns `a`'s
/// converter and the series.
fn adopted_at_60s() -> (Converter, String) {
    let (mut converter, ownership, _, _, _) = setup();
    let (_, joined, view, moving) = b_joins_at_20s(&ownership);
    let id = series_in(moving);
    assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
    ownership.publish(view);
    assert_eq!(one(&mut converter, 20_000, &id, 3.0), (5.0, false), "before the cutoff the total goes on");
    ownership.publish(OwnershipView::of(&joined.fail_over(&["b"], 55_000).unwrap(), "a"));
    assert_eq!(one(&mut converter, 60_000, &id, 4.0), (4.0, true), "adopted from the tile ending 60 000");
    (converter, id)
}

/// Found by the fault campaign, seed 62 at 5 minutes (989 counters and timers counted one
/// 10 s tile twice). `b` took a shard from `a` at a cutover and was paused past its lease
/// with the leader's incomplete copy of a tile in flight to it; `a` failed it over and wrote
/// the next tile from an explicit reset. `b` resumed, wrote the stale tile from a reset of
/// its own and acknowledged it; the follower's completion of that tile, routed by the new
/// placement, reached `a` after its newer tile and was folded into `a`'s new total as a
/// late tile: storage counted the tile twice.
#[test]
fn a_copy_of_a_tile_from_before_an_adopted_total_is_a_duplicate_not_late() {
    let (mut converter, id) = adopted_at_60s();
    // The follower's completion of the tile ending 50 000 (`b` wrote the leader's copy).
    let mut completion = batch(50_000, vec![counter(&id, 6.0)]);
    completion.incomplete = true;
    let conversion = converter.convert(&completion, 0).unwrap();
    converter.commit();
    assert!(conversion.record.samples.is_empty(), "no correction: {:?}", conversion.record.samples);
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 1);
    assert_eq!(conversion.skipped[SkipReason::Late], 0);
    assert_eq!(one(&mut converter, 70_000, &id, 1.0), (5.0, false), "the total goes on without it");
}

/// A tile from before an adopted total's first, re-routed after the ingester it was routed
/// to refused it for good (`owner_refused`: fenced, paused past its lease; found tracing the
/// fault campaign's seed 16 with partitions): nobody wrote it, so it is late, added with a
/// correction, where a copy nobody refused is the earlier owner's (above).
#[test]
fn a_tile_from_before_an_adopted_total_that_its_owner_refused_is_late() {
    let (mut converter, id) = adopted_at_60s();
    let mut refused = batch(50_000, vec![counter(&id, 6.0)]);
    refused.owner_refused = true;
    let conversion = converter.convert(&refused, 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Late], 1);
    let samples: Vec<_> = conversion.record.samples.iter().map(|sample| (sample.value, sample.timestamp_ms)).collect();
    assert_eq!(samples, [(10.0, 60_001)], "added, as a correction after the newest sample");
    let again = converter.convert(&refused, 0).unwrap();
    converter.commit();
    assert_eq!(again.skipped[SkipReason::Duplicate], 1, "once written, a copy of it is a duplicate");
    // A refused tile further back leaves the ones between the earlier writer's.
    let mut further = batch(30_000, vec![counter(&id, 1.0)]);
    further.owner_refused = true;
    assert_eq!(converter.convert(&further, 0).unwrap().skipped[SkipReason::Late], 1);
    converter.commit();
    let between = converter.convert(&batch(40_000, vec![counter(&id, 5.0)]), 0).unwrap();
    converter.commit();
    assert_eq!(between.skipped[SkipReason::Duplicate], 1, "the earlier owner's still");
    assert_eq!(one(&mut converter, 70_000, &id, 1.0), (12.0, false));
}

/// Found by the fault campaign, seed 65 at 5 minutes (989 counters and timers doubled in one
/// 10 s tile). `a` gave a shard to `b` at a cutoff and checkpointed after it, with its totals
/// of the shard (the shard stays listed until the move is finalized). `b` wrote the shard from
/// an explicit reset, was paused past its lease and failed over by `a` (the shard given back,
/// a view `a`'s converter never took in), and joined again to take the shard at a later
/// cutoff. `a`, killed and restarted within its lease, restored the checkpoint; its first view
/// showed the shard owned (given away again), so the restored total counted as owned all along
/// and the next tile went on from it over what `b` had written.
#[test]
fn a_checkpoint_keeps_no_total_of_a_shard_given_away_past_its_cutoff() {
    let GivenBackAndAway { placement, giving, again, moving, kept, .. } = given_back_and_away();
    let (id, own) = (series_in(moving), series_in(kept));

    let (mut a1, ownership1, _, _, _) = setup();
    ownership1.publish(OwnershipView::of(&placement, "a"));
    assert_eq!(one(&mut a1, 10_000, &id, 2.0), (2.0, true));
    ownership1.publish(giving);
    assert_eq!(one(&mut a1, 20_000, &id, 3.0), (5.0, false), "before the cutoff the total goes on");
    // After the cutoff `b` writes the shard from a reset; `a` writes its own and checkpoints.
    for end_ms in [30_000, 40_000, 50_000] {
        one(&mut a1, end_ms, &own, 1.0);
    }
    let bytes = a1.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();

    // The restart within the lease: not rejoined; its first view gives the shard away again.
    let (mut a2, ownership2, _, _, _) = setup();
    a2.restore_checkpoint(&bytes).unwrap();
    assert_eq!(a2.cumulative_series(), 1, "only the total of the shard `a` keeps");
    ownership2.publish(again);
    assert_eq!(one(&mut a2, 60_000, &id, 4.0), (4.0, true), "the shard's series start over with a reset");
    // The placement changed since the checkpoint: the restart cannot tell that the kept shard
    // was not given away and back meanwhile, so it starts over too (a reset too many, exact).
    assert_eq!(one(&mut a2, 60_000, &own, 1.0), (1.0, true), "the shard kept starts over too");
}

/// `a` alone in its placement, `giving` a shard (`moving`) to `b` at a cutoff at 20 000 and
/// keeping another (`kept`); `b` then paused past its lease and failed over at 52 000 (the
/// shard given back), and joining `again` at 53 000 to take it at 60 000: `a`'s views.
struct GivenBackAndAway {
    placement: Placement,
    giving: OwnershipView,
    /// After the failover, before the second join.
    back: OwnershipView,
    again: OwnershipView,
    moving: usize,
    kept: usize,
}

fn given_back_and_away() -> GivenBackAndAway {
    let placement = Placement::init(&[("a", "a:1")], SHARDS, 1, 0).unwrap();
    let timing = tessera_topology::MoveTiming::new(0).with_delay_ms(1).with_boundary_ms(20_000);
    let joined = placement.add_instance("b", "b:1", timing).unwrap();
    let giving = OwnershipView::of(&joined, "a");
    let moving = (0..SHARDS as usize).find(|shard| giving.cutoff_ms[*shard] > 0).expect("the join moves a shard away");
    let kept = (0..SHARDS as usize)
        .find(|shard| giving.owned[*shard] && giving.cutoff_ms[*shard] == 0)
        .expect("`a` keeps a shard");
    assert_eq!(giving.cutoff_ms[moving], 20_000);
    let failed_over = joined.fail_over(&["b"], 52_000).unwrap();
    let back = OwnershipView::of(&failed_over, "a");
    assert!(back.owned[moving] && back.cutoff_ms[moving] == 0, "given back, with no cutoff");
    let timing = tessera_topology::MoveTiming::new(53_000).with_delay_ms(1).with_boundary_ms(20_000);
    let again = OwnershipView::of(&failed_over.add_instance("b", "b:1", timing).unwrap(), "a");
    assert!(again.owned[moving] && !again.joining[moving] && again.cutoff_ms[moving] == 60_000);
    assert!(again.owned[kept] && again.cutoff_ms[kept] == 0);
    GivenBackAndAway { placement, giving, back, again, moving, kept }
}

/// Fix 19's gap: the same history as
/// [`a_checkpoint_keeps_no_total_of_a_shard_given_away_past_its_cutoff`], with `a`'s last
/// checkpoint taken before it converted any tile past the cutoff (the shard's totals still
/// current and in it), or even before the move was announced. The checkpoint records the
/// placement's version and the cutoff it was taken under; a restart whose first view shows
/// another cutoff, or no cutoff under another version (given back by the failover: the
/// cutoff went from 0 to 20 000 and back to 0 while `a` was down), starts the series over.
/// A restart under the placement of the checkpoint goes on.
#[test]
fn a_restart_whose_first_view_moved_a_shard_since_the_checkpoint_starts_its_series_over() {
    let GivenBackAndAway { placement, giving, back, again, moving, kept } = given_back_and_away();
    let (id, own) = (series_in(moving), series_in(kept));
    let alone = OwnershipView::of(&placement, "a");

    // (the view the checkpoint is taken under, the restart's first view, the moved series'
    // next tile and due (value, reset), the kept series' due, why)
    let cases = [
        (&giving, &giving, 20_000, (5.0, false), (2.0, false), "the same move: the totals go on"),
        (&giving, &again, 60_000, (3.0, true), (1.0, true), "given back and away again: both start over"),
        (&alone, &alone, 20_000, (5.0, false), (2.0, false), "the same placement: the totals go on"),
        (&alone, &back, 60_000, (3.0, true), (1.0, true), "given away and back while down: both start over"),
    ];
    for (checkpointed, first_view, tile_end_ms, due, due_kept, why) in cases {
        let (mut a1, ownership1, _, _, _) = setup();
        ownership1.publish(alone.clone());
        assert_eq!(one(&mut a1, 10_000, &own, 1.0), (1.0, true));
        ownership1.publish(checkpointed.clone());
        assert_eq!(one(&mut a1, 10_000, &id, 2.0), (2.0, true));
        let bytes = a1.encode_checkpoint(checkpoint::CheckpointMeta::default()).into_bytes();

        let (mut a2, ownership2, adopted, _, _) = setup();
        a2.restore_checkpoint(&bytes).unwrap();
        assert_eq!(a2.cumulative_series(), 2, "{why}: both totals were current when saved");
        ownership2.publish(first_view.clone());
        assert_eq!(one(&mut a2, tile_end_ms, &id, 3.0), due, "{why}");
        assert_eq!(one(&mut a2, 60_000, &own, 1.0), due_kept, "{why}: the kept shard");
        assert_eq!(adopted.get(), u64::from(due.1) + u64::from(due_kept.1), "{why}");
    }
}

/// A checkpoint taken in steps while a new view came in records the placement it began
/// under: the shard owned outright (cutoff 0); it ended giving the shard away at 20 000. A
/// restart that finds the shard given back (cutoff 0 again: `b` took it, wrote it from a
/// reset and was failed over) sees another version of the placement, and the restored total
/// is not taken for current.
#[test]
fn a_view_taken_in_while_a_checkpoint_was_taken_leaves_no_restored_total_current_after_a_move() {
    let (mut a1, ownership1, _, _, _) = setup();
    let (_, joined, giving, moving) = b_joins_at_20s(&ownership1);
    let (id, own) = (series_in(moving), series_outside(moving));
    assert_eq!(one(&mut a1, 10_000, &id, 2.0), (2.0, true));
    one(&mut a1, 10_000, &own, 1.0);
    let mut encoder = a1.begin_checkpoint(checkpoint::CheckpointMeta::default());
    a1.continue_checkpoint(&mut encoder, 1);
    ownership1.publish(giving);
    one(&mut a1, 20_000, &own, 1.0);
    let bytes = a1.finish_checkpoint(encoder).into_bytes();

    let back = OwnershipView::of(&joined.fail_over(&["b"], 52_000).unwrap(), "a");
    assert!(back.owned[moving] && back.cutoff_ms[moving] == 0, "given back");
    let (mut a2, ownership2, _, _, _) = setup();
    a2.restore_checkpoint(&bytes).unwrap();
    ownership2.publish(back);
    assert_eq!(one(&mut a2, 60_000, &id, 3.0), (3.0, true), "the restored total is not trusted");
}

/// `a` alone in its placement (its view published to `ownership`), then `b` joining with a
/// move at 20 000: both placements, `a`'s view of the second (not yet published), and a
/// shard `a` gives away.
fn b_joins_at_20s(ownership: &Ownership) -> (Placement, Placement, OwnershipView, usize) {
    let placement = Placement::init(&[("a", "a:1")], SHARDS, 1, 0).unwrap();
    ownership.publish(OwnershipView::of(&placement, "a"));
    let timing = tessera_topology::MoveTiming::new(0).with_delay_ms(1).with_boundary_ms(20_000);
    let joined = placement.add_instance("b", "b:1", timing).unwrap();
    let view = OwnershipView::of(&joined, "a");
    let moving = (0..SHARDS as usize).find(|shard| view.cutoff_ms[*shard] > 0).expect("the join moves a shard away");
    (placement, joined, view, moving)
}

/// An ingester cut off from etcd is failed over and, back, joins again: the first view it
/// sees after is a later version in which it owns some of its old shards again, with no
/// view between in which it did not. Their tenure (`since`) tells: their totals start over
/// (found by the partition scenario: it went on from its old totals, after the other had
/// written the series from an explicit reset).
#[test]
fn a_shard_given_away_and_back_in_versions_never_seen_starts_over() {
    let (mut converter, ownership, adopted, id, shard) = setup();
    let other = series_outside(shard);
    ownership.publish(all_owned(1));
    one(&mut converter, 10_000, &id, 2.0);
    one(&mut converter, 10_000, &other, 1.0);
    assert_eq!(one(&mut converter, 20_000, &id, 3.0), (5.0, false));
    assert_eq!(one(&mut converter, 20_000, &other, 1.0), (2.0, false));
    let mut back = all_owned(4);
    back.since[shard] = 3;
    ownership.publish(back);
    assert_eq!(one(&mut converter, 30_000, &id, 4.0), (4.0, true), "given back: starts over");
    assert_eq!(one(&mut converter, 30_000, &other, 1.0), (3.0, false), "kept all along: goes on");
    assert_eq!(adopted.get(), 1);
}

/// A converter with every shard owned but `shard` (owned by another ingester) at version 1;
/// that ingester then fails over and this one owns `shard` from version 2. Returns the
/// converter, the count of completions skipped as the owner before's, and a series in `shard`.
fn failed_over_to_us() -> (Converter, Counter, String) {
    let (converter, skipped, id, _) = failed_over_to_us_with_gauge();
    (converter, skipped, id)
}

/// [`failed_over_to_us`], and a gauge series in the same shard.
fn failed_over_to_us_with_gauge() -> (Converter, Counter, String, String) {
    let ownership = Arc::new(Ownership::default());
    let metrics = crate::tier::TierMetrics::default();
    let skipped = metrics.completions_of_earlier_owner.clone();
    let mut converter = Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &metrics);
    let id = "hits|#series:a".to_owned();
    let shard = tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize;
    ownership.publish(all_owned_but(shard, 1));
    let other = series_outside(shard);
    assert_eq!(one(&mut converter, 50_000, &other, 1.0), (1.0, true), "this ingester writes its own shards");
    let mut failed_over = all_owned(2);
    failed_over.since[shard] = 2;
    ownership.publish(failed_over);
    let gauge_id = (0..100)
        .map(|n| format!("level|#series:{n}"))
        .find(|gauge| tessera_core::shard::shard_of(gauge.as_bytes(), SHARDS) as usize == shard)
        .expect("a gauge in the same shard");
    (converter, skipped, id, gauge_id)
}

/// A follower's completion of the tile ending `end_ms` for a leader copy routed under
/// `version`: the counter `ids.0` at `delta` and the gauge `ids.1` at `gauge`.
fn completion(end_ms: i64, version: u64, ids: (&str, &str), delta: f64, gauge: f64) -> TileBatch {
    let mut completion = batch(end_ms, vec![counter(ids.0, delta), tessera_testkit::tiles::gauge(ids.1, gauge)]);
    completion.completes_version = version;
    completion
}

/// Found by the fault campaign, seeds 24 and 25 at 5 minutes with partitions (two writers on
/// 1 000 counters and timers at 1 min). The leader flushed an incomplete tile to the shard's
/// owner, which acknowledged it and was then killed and failed over. The follower's
/// completion reached the new owner before any newer tile of those series: it began the new
/// owner's total from a reset while the old owner wrote the short copy it had acknowledged.
/// The completion says its leader copy went under version 1, before this ingester's tenure
/// (from version 2): it is skipped, the counter and the gauge, and the next tile begins the
/// total. The same tile as a leader's batch (not a completion) is still written from a
/// reset: fix 18's rule for a copy nobody acknowledged.
#[test]
fn a_completion_of_a_copy_routed_to_the_owner_before_is_skipped_though_it_comes_first() {
    let (mut converter, skipped, id, gauge) = failed_over_to_us_with_gauge();
    let conversion = converter.convert(&completion(60_000, 1, (&id, &gauge), 6.0, 3.0), 0).unwrap();
    converter.commit();
    assert!(conversion.record.samples.is_empty(), "no sample: {:?}", conversion.record.samples);
    assert_eq!(conversion.skipped[SkipReason::Duplicate], 2, "the counter and the gauge");
    assert_eq!(skipped.get(), 2);
    assert_eq!(one(&mut converter, 70_000, &id, 1.0), (1.0, true), "the next tile begins the total");

    // Routed under this tenure's version, the completion is the tile's only copy here.
    let (mut converter, skipped, id, gauge) = failed_over_to_us_with_gauge();
    let conversion = converter.convert(&completion(60_000, 2, (&id, &gauge), 6.0, 3.0), 0).unwrap();
    converter.commit();
    let samples: Vec<_> = conversion.record.samples.iter().map(|sample| (sample.value, sample.reset_before)).collect();
    assert_eq!(samples, [(6.0, true), (3.0, false)]);
    assert_eq!(skipped.get(), 0);

    // Not a completion: a leader's copy nobody acknowledged, re-routed from the dead owner.
    let (mut converter, skipped, id) = failed_over_to_us();
    assert_eq!(one(&mut converter, 60_000, &id, 4.0), (4.0, true));
    assert_eq!(skipped.get(), 0);
}

/// The leader's incomplete copy went under version 1 to the owner before, was not delivered
/// before it was failed over, and was re-routed here: this ingester wrote it. The completion
/// routed under version 1 replaces it here as anywhere (its counter's corrected total, its
/// gauge's correction), and a completion of a tile before this tenure's first is still a
/// duplicate (fix 18).
#[test]
fn a_completion_of_a_copy_re_routed_here_replaces_it() {
    let (mut converter, skipped, id, gauge) = failed_over_to_us_with_gauge();
    let mut short = batch(60_000, vec![counter(&id, 4.0), tessera_testkit::tiles::gauge(&gauge, 2.0)]);
    short.incomplete = true;
    let conversion = converter.convert(&short, 0).unwrap();
    converter.commit();
    assert_eq!(conversion.record.samples[0].value, 4.0);
    let conversion = converter.convert(&completion(60_000, 1, (&id, &gauge), 6.0, 3.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.skipped[SkipReason::Replaced], 1, "{:?}", conversion.skipped);
    let samples: Vec<_> = conversion.record.samples.iter().map(|sample| (sample.value, sample.timestamp_ms)).collect();
    assert_eq!(samples, [(6.0, 60_001), (3.0, 60_001)], "corrections after the short copy's samples");
    assert_eq!(skipped.get(), 0);
    assert_eq!(one(&mut converter, 70_000, &id, 1.0), (7.0, false), "the total goes on from the whole copy");

    let conversion = converter.convert(&completion(50_000, 1, (&id, &gauge), 6.0, 3.0), 0).unwrap();
    converter.commit();
    assert!(conversion.record.samples.is_empty(), "{:?}", conversion.record.samples);
    assert_eq!(
        conversion.skipped[SkipReason::Duplicate],
        2,
        "before the adopted total's first tile: the owner before's"
    );
    assert_eq!(skipped.get(), 1, "the gauge; the counter's total holds the tile as written before it began");
}

/// The same gap through a move: `a` gives a shard to `b` at a cutoff; the leader's
/// incomplete copy of a tile after it goes to `b` (version 2), which writes it and is failed
/// over. The shard comes back to `a` in a new tenure: the completion of that tile is `b`'s,
/// skipped, and the next tile starts over after a reset. The placement stamps the new
/// tenure (a restart reads it there); a cutoff taken back that it did not stamp is read as a
/// tenure begun at the view that showed it.
#[test]
fn a_completion_of_a_copy_the_receiver_of_a_move_wrote_is_skipped_when_the_shard_comes_back() {
    for stamped in [true, false] {
        let ownership = Arc::new(Ownership::default());
        let metrics = crate::tier::TierMetrics::default();
        let mut converter = Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &metrics);
        let (_, joined, view, moving) = b_joins_at_20s(&ownership);
        let id = series_in(moving);
        assert_eq!(one(&mut converter, 10_000, &id, 2.0), (2.0, true));
        ownership.publish(view.clone());
        assert_eq!(one(&mut converter, 20_000, &id, 3.0), (5.0, false), "before the cutoff the total goes on");
        let back = if stamped {
            let back = OwnershipView::of(&joined.fail_over(&["b"], 45_000).unwrap(), "a");
            assert_eq!(back.since[moving], back.version, "a cutoff taken back by a failover is a new tenure");
            back
        } else {
            let mut back = view;
            back.cutoff_ms[moving] = 0;
            back.version += 1;
            back
        };
        ownership.publish(back);
        let mut completion = batch(30_000, vec![counter(&id, 6.0)]);
        completion.completes_version = joined.version();
        let conversion = converter.convert(&completion, 0).unwrap();
        converter.commit();
        assert!(conversion.record.samples.is_empty(), "stamped {stamped}: {:?}", conversion.record.samples);
        assert_eq!(metrics.completions_of_earlier_owner.get(), 1);
        assert_eq!(one(&mut converter, 50_000, &id, 1.0), (1.0, true), "the next tile starts over");
    }
}

/// The receiver's side of a move whose giver dies (found by review): `b` takes a shard at a
/// cutover, `a` writes the leader's incomplete copy of the tile before it and is failed
/// over, and `b` owns the shard whole from then (cutover 0, its tenure's `since` kept). The
/// completion of that tile reaches `b`, routed under a version of its own tenure: the tile
/// is from before its cutover, so the copy went to `a`, which wrote it. Skipped; the tile
/// after the cutover is `b`'s as before.
#[test]
fn a_completion_of_a_tile_before_the_receivers_cutover_is_the_givers() {
    let ownership = Arc::new(Ownership::default());
    let metrics = crate::tier::TierMetrics::default();
    let mut converter = Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &metrics);
    let placement = Placement::init(&[("a", "a:1")], SHARDS, 1, 0).unwrap();
    let timing = tessera_topology::MoveTiming::new(0).with_delay_ms(1).with_boundary_ms(20_000);
    let joined = placement.add_instance("b", "b:1", timing).unwrap();
    let view = OwnershipView::of(&joined, "b");
    let moving = (0..SHARDS as usize).find(|shard| view.cutover_ms[*shard] > 0).expect("b takes a shard");
    ownership.publish(view);
    let id = series_in(moving);
    let giver_dead = joined.fail_over(&["a"], 25_000).unwrap();
    ownership.publish(OwnershipView::of(&giver_dead, "b"));
    let mut completion = batch(20_000, vec![counter(&id, 6.0)]);
    completion.completes_version = joined.version();
    let conversion = converter.convert(&completion, 0).unwrap();
    converter.commit();
    assert!(conversion.record.samples.is_empty(), "{:?}", conversion.record.samples);
    assert_eq!(metrics.completions_of_earlier_owner.get(), 1);
    let mut after = batch(30_000, vec![counter(&id, 4.0)]);
    after.completes_version = joined.version();
    let conversion = converter.convert(&after, 0).unwrap();
    converter.commit();
    assert_eq!(conversion.record.samples[0].value, 4.0, "a completion of a tile of b's tenure is written");
    assert_eq!(metrics.completions_of_earlier_owner.get(), 1);
}

/// A converter that reads a gain's view late (it converted nothing meanwhile) still knows
/// the tenure began at the version that gave the shard, not at the view it read: a
/// completion of a copy routed to it under that version is its own (found by review).
#[test]
fn a_gain_read_late_begins_its_tenure_at_the_version_that_gave_it() {
    let (mut converter, skipped, id) = {
        let ownership = Arc::new(Ownership::default());
        let metrics = crate::tier::TierMetrics::default();
        let skipped = metrics.completions_of_earlier_owner.clone();
        let converter = Converter::new(&[0.5], 3_600_000).with_ownership(ownership.clone(), &metrics);
        let id = "hits|#series:a".to_owned();
        let shard = tessera_core::shard::shard_of(id.as_bytes(), SHARDS) as usize;
        ownership.publish(all_owned_but(shard, 1));
        let mut converter = converter;
        one(&mut converter, 10_000, &series_outside(shard), 1.0);
        let mut gained = all_owned(2);
        gained.since[shard] = 2;
        ownership.publish(gained.clone());
        let mut later = gained;
        later.version = 5;
        ownership.publish(later);
        (converter, skipped, id)
    };
    let conversion = converter.convert(&completion(60_000, 2, (&id, "level|#series:x"), 6.0, 3.0), 0).unwrap();
    converter.commit();
    assert_eq!(conversion.record.samples[0].value, 6.0, "{:?}", conversion.record.samples);
    assert_eq!(skipped.get(), 0);
}
