use std::collections::BTreeMap;

use super::*;
use crate::placement::ops::MoveTiming;

const NOW: i64 = 1_700_000_012_345;

fn timing() -> MoveTiming {
    MoveTiming::new(NOW)
}

fn cutover() -> i64 {
    timing().cutover_ms().unwrap()
}

fn instances(count: usize) -> Vec<(String, String)> {
    (0..count).map(|index| (format!("i{index}"), format!("10.0.0.{index}:7400"))).collect()
}

fn entry(id: u32, state: ShardState, cutover_ms: i64, cutoff_ms: i64) -> Shard {
    Shard { id, state: state as i32, cutover_ms, cutoff_ms, since_version: 0 }
}

fn instance(id: &str, shard_set_id: u32, shards: Vec<Shard>) -> Instance {
    Instance { id: id.into(), endpoint: format!("{id}:7400"), shard_set_id, shards }
}

fn placement(num_shards: u32, replication_factor: u32, instances: Vec<Instance>) -> Placement {
    Placement::from_proto(proto::Placement { version: 1, num_shards, replication_factor, instances, updated_at_ms: 0 })
}

/// Two shards on `a` (shard set 1), shard 1 moving to `b` (shard set 2):
/// `b` owns it from `cutover_ms`, `a` keeps it until `cutoff_ms`.
fn shard_one_moving_to_b(cutover_ms: i64, cutoff_ms: i64) -> Placement {
    use ShardState::{Available, Initializing, Leaving};
    placement(
        2,
        1,
        vec![
            instance("a", 1, vec![entry(0, Available, 0, 0), entry(1, Leaving, 0, cutoff_ms)]),
            instance("b", 2, vec![entry(1, Initializing, cutover_ms, 0)]),
        ],
    )
}

fn ids(placement: &Placement, instance_id: &str) -> Vec<u32> {
    placement.shards_of(instance_id).iter().map(|shard| shard.id).collect()
}

/// Shards owned (AVAILABLE) by each shard set of a settled placement.
fn set_loads(placement: &Placement) -> BTreeMap<u32, usize> {
    placement.shard_sets().into_iter().map(|(set, members)| (set, members[0].shards.len())).collect()
}

/// Shard → owning shard set, for a settled placement.
fn owner_sets(placement: &Placement) -> BTreeMap<u32, u32> {
    let mut owners = BTreeMap::new();
    for instance in placement.instances() {
        for shard in &instance.shards {
            owners.insert(shard.id, instance.shard_set_id);
        }
    }
    owners
}

fn settle(placement: &Placement) -> Placement {
    let settled = placement.finalize(placement.pending_until_ms().expect("moves pending")).expect("moves are due");
    settled.validate().unwrap();
    assert!(!settled.has_pending_moves());
    settled
}

// ----- validation -----

#[test]
fn init_makes_valid_balanced_placements() {
    for (count, rf, shards) in [(1, 1, 1), (3, 1, 64), (4, 2, 64), (6, 3, 10), (5, 1, 3)] {
        let placement = Placement::init(&instances(count), shards, rf, NOW).unwrap();
        placement.validate().unwrap();
        assert_eq!((placement.version(), placement.updated_at_ms()), (1, NOW));
        let loads: Vec<usize> = set_loads(&placement).into_values().collect();
        assert_eq!(loads.len(), count / rf as usize);
        assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1, "{loads:?}");
        for shard in 0..shards {
            assert_eq!(placement.owners(shard, NOW).count(), rf as usize);
        }
    }
}

#[test]
fn init_rejects_bad_arguments() {
    assert_eq!(Placement::init(&instances(2), 0, 1, 0), Err(PlacementError::NoShards));
    assert_eq!(Placement::init(&instances(2), 4, 0, 0), Err(PlacementError::NoReplication));
    assert_eq!(
        Placement::init(&instances(3), 4, 2, 0),
        Err(PlacementError::NotWholeShardSets { count: 3, replication_factor: 2 })
    );
    assert_eq!(
        Placement::init(&[("a", "h:1"), ("a", "h:2")], 4, 1, 0),
        Err(PlacementError::DuplicateInstance { instance: "a".into() })
    );
    assert_eq!(Placement::init(&[("a", " ")], 4, 1, 0), Err(PlacementError::EmptyEndpoint { instance: "a".into() }));
    assert_eq!(Placement::init(&[("", "h:1")], 4, 1, 0), Err(PlacementError::EmptyInstanceId));
}

#[test]
fn validation_names_what_is_wrong() {
    use ShardState::{Available, Initializing, Leaving, Unspecified};
    let available = |id| entry(id, Available, 0, 0);
    let cases: Vec<(Placement, &str)> = vec![
        (placement(0, 1, vec![]), "num_shards must be at least 1"),
        (placement(1, 0, vec![]), "replication_factor must be at least 1"),
        (
            placement(2, 1, vec![instance("a", 1, vec![available(0), available(2)])]),
            "instance `a` lists shard 2, but num_shards is 2",
        ),
        (
            placement(2, 1, vec![instance("a", 1, vec![available(0), available(1), available(0)])]),
            "instance `a` lists shard 0 twice",
        ),
        (
            placement(1, 1, vec![instance("a", 1, vec![entry(0, Unspecified, 0, 0)])]),
            "instance `a` has shard 0 in invalid state 0",
        ),
        (
            placement(1, 1, vec![instance("a", 1, vec![entry(0, Leaving, 0, 0)])]),
            "instance `a` is leaving shard 0 without a cutoff_ms",
        ),
        (
            placement(1, 1, vec![instance("a", 1, vec![entry(0, Initializing, 0, 0)])]),
            "instance `a` is initializing shard 0 without a cutover_ms",
        ),
        (
            placement(2, 1, vec![instance("a", 1, vec![available(0)])]),
            "shard 1 has 0 available or initializing owners, replication factor is 1",
        ),
        (
            placement(1, 1, vec![instance("a", 1, vec![available(0)]), instance("a", 2, vec![])]),
            "instance `a` is listed twice",
        ),
        (
            placement(
                1,
                2,
                vec![instance("a", 1, vec![available(0)]), instance("b", 1, vec![available(0)]), {
                    instance("c", 1, vec![available(0)])
                }],
            ),
            "shard 0 has 3 available or initializing owners, replication factor is 2",
        ),
        (
            placement(
                1,
                1,
                vec![instance("a", 1, vec![available(0)]), instance("b", 2, vec![entry(0, Leaving, 0, 60)])],
            ),
            "shard 0 has 1 leaving and 0 initializing owners; every move pairs one of each",
        ),
        (
            placement(1, 2, vec![instance("a", 1, vec![available(0)]), instance("b", 2, vec![available(0)])]),
            "shard 0 is owned by both shard set 1 and shard set 2",
        ),
        (
            placement(
                2,
                2,
                vec![
                    instance("a", 1, vec![available(0), available(1)]),
                    instance("b", 1, vec![available(0)]),
                    instance("c", 2, vec![available(1)]),
                ],
            ),
            "shard 1 is owned by both shard set 1 and shard set 2",
        ),
        (
            placement(
                2,
                1,
                vec![
                    instance("a", 1, vec![available(0)]),
                    instance("b", 2, vec![available(1)]),
                    instance("c", 2, vec![]),
                ],
            ),
            "instances `b` and `c` of shard set 2 own different shards",
        ),
        (
            placement(
                1,
                1,
                vec![instance("a", 1, vec![available(0)]), instance("b", 2, vec![]), instance("c", 2, vec![])],
            ),
            "shard set 2 has 2 staying instances, replication factor is 1",
        ),
    ];
    for (placement, message) in cases {
        assert_eq!(placement.validate().unwrap_err().to_string(), message);
    }
}

#[test]
fn a_move_counts_once() {
    let moving = shard_one_moving_to_b(60_000, 60_000);
    moving.validate().unwrap();
    assert_eq!(moving.pending_until_ms(), Some(60_000));
}

#[test]
fn encoding_round_trips() {
    let placement = Placement::init(&instances(4), 16, 2, NOW).unwrap();
    assert_eq!(Placement::decode(&placement.encode_to_vec()).unwrap(), placement);
    assert_eq!(Placement::validated(placement.clone().into_proto()).unwrap(), placement);
}

// ----- ownership in time -----

#[test]
fn owners_respect_cutover_and_cutoff() {
    let moving = shard_one_moving_to_b(60_000, 60_000);
    let owners = |shard, time| moving.owners(shard, time).map(|instance| instance.id.as_str()).collect::<Vec<_>>();
    assert_eq!(owners(0, 0), ["a"]);
    assert_eq!(owners(0, 120_000), ["a"]);
    assert_eq!(owners(1, 0), ["a"]);
    assert_eq!(owners(1, 59_999), ["a"]);
    assert_eq!(owners(1, 60_000), ["b"]);
    assert_eq!(owners(1, 70_000), ["b"]);
    assert!(owners(2, 0).is_empty());

    assert!(moving.owns("a", 1, 50_000));
    assert!(!moving.owns("a", 1, 60_000));
    assert!(moving.owns("b", 1, 60_000));
    assert!(!moving.owns("b", 1, 50_000));
    assert!(!moving.owns("nobody", 0, 0));
    assert_eq!(ids(&moving, "a"), [0, 1]);
    assert!(moving.shards_of("nobody").is_empty());
    assert_eq!(moving.owned_shards("a", 60_000).collect::<Vec<_>>(), [0]);
    assert_eq!(moving.owned_shards("b", 60_000).collect::<Vec<_>>(), [1]);
}

#[test]
fn cutover_is_the_next_boundary_after_the_delay() {
    let at = |now_ms, delay_ms, boundary_ms| MoveTiming { now_ms, delay_ms, boundary_ms }.cutover_ms();
    assert_eq!(at(120_000, 0, 60_000), Ok(120_000));
    assert_eq!(at(120_001, 0, 60_000), Ok(180_000));
    assert_eq!(at(100_000, 20_000, 60_000), Ok(120_000));
    assert_eq!(at(100_000, 20_001, 10_000), Ok(130_000));
    assert!(at(100_000, 0, 0).is_err());
    assert!(at(100_000, -1, 60_000).is_err());
    assert!(at(0, 0, 60_000).is_err(), "0 means `no cutover` in a shard entry");
}

// ----- add -----

#[test]
fn add_moves_only_enough_shards_to_balance() {
    for (sets, shards) in [(1, 64), (2, 64), (3, 12), (3, 64), (5, 7), (7, 1024)] {
        let before = Placement::init(&instances(sets), shards, 1, 0).unwrap();
        let added = before.add_instance("new", "10.1.0.1:7400", timing()).unwrap();
        assert_eq!((added.version(), added.updated_at_ms()), (2, NOW));
        assert_eq!(added.pending_until_ms(), Some(cutover()));
        let after = settle(&added);

        let loads = set_loads(&after);
        let (max, min) = (loads.values().max().unwrap(), loads.values().min().unwrap());
        assert!(max - min <= 1, "{sets} sets, {shards} shards: {loads:?}");
        // Every shard that moved went to the new instance: nothing else was shuffled.
        let (old_owners, new_owners) = (owner_sets(&before), owner_sets(&after));
        let new_set = after.instance("new").unwrap().shard_set_id;
        let moved: Vec<u32> = (0..shards).filter(|shard| old_owners[shard] != new_owners[shard]).collect();
        assert!(moved.iter().all(|shard| new_owners[shard] == new_set));
        assert_eq!(moved.len(), shards as usize / (sets + 1), "{sets} sets, {shards} shards");
    }
}

#[test]
fn add_hands_shards_over_at_the_cutover() {
    let before = Placement::init(&instances(2), 8, 1, 0).unwrap();
    let added = before.add_instance("new", "10.1.0.1:7400", timing()).unwrap();
    let moving = ids(&added, "new");
    assert!(!moving.is_empty());
    for shard in &moving {
        let owners_before: Vec<&str> = added.owners(*shard, cutover() - 10_000).map(|i| i.id.as_str()).collect();
        let owners_after: Vec<&str> = added.owners(*shard, cutover()).map(|i| i.id.as_str()).collect();
        assert_eq!(owners_before.len(), 1);
        assert_ne!(owners_before, ["new"]);
        assert_eq!(owners_after, ["new"]);
    }
}

#[test]
fn add_with_replication_takes_whole_shard_sets() {
    let before = Placement::init(&instances(4), 12, 2, 0).unwrap();
    assert_eq!(
        before.add_instance("x", "h:1", timing()),
        Err(PlacementError::NotWholeShardSets { count: 1, replication_factor: 2 })
    );
    let added = before.add_instances(&[("x", "h:1"), ("y", "h:2")], timing()).unwrap();
    let after = settle(&added);
    assert_eq!(after.instance("x").unwrap().shard_set_id, after.instance("y").unwrap().shard_set_id);
    assert_eq!(ids(&after, "x"), ids(&after, "y"));
    assert_eq!(set_loads(&after).into_values().collect::<Vec<_>>(), [4, 4, 4]);
    for shard in 0..12 {
        assert_eq!(after.owners(shard, 0).count(), 2);
    }
}

#[test]
fn changes_wait_for_pending_moves() {
    let before = Placement::init(&instances(2), 8, 1, 0).unwrap();
    let added = before.add_instance("new", "h:1", timing()).unwrap();
    let pending = Err(PlacementError::MovesPending { until_ms: cutover() });
    assert_eq!(added.add_instance("other", "h:2", timing()), pending);
    assert_eq!(added.remove_instance("i0", timing()), pending);
    assert_eq!(added.replace_instance("i0", "x", "h:3", timing()), pending);
    assert_eq!(
        before.add_instance("i1", "h:1", timing()),
        Err(PlacementError::DuplicateInstance { instance: "i1".into() })
    );
}

// ----- remove -----

#[test]
fn remove_hands_only_the_removed_shards_to_the_least_loaded() {
    let before = Placement::init(&instances(4), 14, 1, 0).unwrap();
    let removed = before.remove_instance("i1", timing()).unwrap();
    removed.validate().unwrap();
    assert!(ids(&removed, "i1").iter().all(|shard| !removed.owns("i1", *shard, cutover())));
    let after = settle(&removed);
    assert!(after.instance("i1").is_none(), "a removed instance goes away once its shards have moved");

    let (old_owners, new_owners) = (owner_sets(&before), owner_sets(&after));
    for shard in 0..14 {
        if old_owners[&shard] != before.instance("i1").unwrap().shard_set_id {
            assert_eq!(old_owners[&shard], new_owners[&shard], "shard {shard} moved needlessly");
        }
    }
    let loads: Vec<usize> = set_loads(&after).into_values().collect();
    assert_eq!(loads.iter().sum::<usize>(), 14);
    assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1, "{loads:?}");
}

#[test]
fn remove_checks_whole_shard_sets() {
    let before = Placement::init(&instances(4), 8, 2, 0).unwrap();
    assert_eq!(
        before.remove_instance("i0", timing()),
        Err(PlacementError::PartialShardSet { instance: "i0".into(), shard_set_id: 1 })
    );
    assert_eq!(
        before.remove_instance("ghost", timing()),
        Err(PlacementError::UnknownInstance { instance: "ghost".into() })
    );
    assert_eq!(before.remove_instances(&["i0", "i1", "i2", "i3"], timing()), Err(PlacementError::NoShardSetsLeft));
    let after = settle(&before.remove_instances(&["i0", "i1"], timing()).unwrap());
    assert_eq!(after.instances().len(), 2);
    assert_eq!(ids(&after, "i2"), (0..8).collect::<Vec<_>>());
}

#[test]
fn removing_an_empty_shard_set_is_immediate() {
    let before = Placement::init(&instances(3), 2, 1, 0).unwrap();
    assert!(before.shards_of("i2").is_empty());
    let after = before.remove_instance("i2", timing()).unwrap();
    assert!(after.instance("i2").is_none());
    assert!(!after.has_pending_moves());
}

// ----- replace -----

#[test]
fn replace_swaps_one_replica_at_the_cutover() {
    let before = Placement::init(&instances(4), 8, 2, 0).unwrap();
    let replaced = before.replace_instance("i1", "fresh", "10.9.9.9:7400", timing()).unwrap();
    assert_eq!(replaced.instance("fresh").unwrap().shard_set_id, before.instance("i1").unwrap().shard_set_id);
    assert_eq!(ids(&replaced, "fresh"), ids(&before, "i1"));
    for shard in ids(&before, "i1") {
        let at = |time| {
            let mut owners: Vec<&str> = replaced.owners(shard, time).map(|i| i.id.as_str()).collect();
            owners.sort_unstable();
            owners
        };
        assert_eq!(at(cutover() - 1), ["i0", "i1"]);
        assert_eq!(at(cutover()), ["fresh", "i0"]);
    }

    let after = settle(&replaced);
    assert!(after.instance("i1").is_none());
    assert_eq!(ids(&after, "fresh"), ids(&before, "i1"));
    assert!(after.shards_of("fresh").iter().all(|shard| shard.state == ShardState::Available as i32));
    assert_eq!(
        before.replace_instance("i1", "i2", "h:1", timing()),
        Err(PlacementError::DuplicateInstance { instance: "i2".into() })
    );
    assert_eq!(
        before.replace_instance("ghost", "x", "h:1", timing()),
        Err(PlacementError::UnknownInstance { instance: "ghost".into() })
    );
}

// ----- finalize -----

#[test]
fn finalize_completes_only_due_moves() {
    let before = Placement::init(&instances(2), 8, 1, 0).unwrap();
    assert_eq!(before.finalize(i64::MAX), None, "nothing to finalize");
    let added = before.add_instance("new", "h:1", timing()).unwrap();
    assert_eq!(added.finalize(cutover() - 1), None);

    let done = added.finalize(cutover()).unwrap();
    assert_eq!((done.version(), done.updated_at_ms()), (added.version() + 1, cutover()));
    done.validate().unwrap();
    for instance in done.instances() {
        for shard in &instance.shards {
            assert_eq!(
                (shard.state, shard.cutover_ms, shard.cutoff_ms),
                (ShardState::Available as i32, 0, 0),
                "{instance:?}"
            );
        }
    }
    assert_eq!(ids(&done, "new"), ids(&added, "new"));
}

#[test]
fn finalize_waits_for_every_side_of_a_shard() {
    let skewed = shard_one_moving_to_b(60_000, 120_000);
    skewed.validate().unwrap();
    assert_eq!(skewed.finalize(90_000), None);
    let done = skewed.finalize(120_000).unwrap();
    done.validate().unwrap();
    assert_eq!(ids(&done, "a"), [0]);
    assert_eq!(ids(&done, "b"), [1]);
}

#[test]
fn fail_over_hands_a_dead_instances_shards_to_the_least_loaded_live_ones() {
    let before = Placement::init(&instances(3), 9, 1, 0).unwrap();
    let dead = before.instances()[1].id.clone();
    let after = before.fail_over(&[dead.as_str()], 5_000).unwrap();
    after.validate().unwrap();
    assert!(after.instance(&dead).is_none());
    assert_eq!((after.version(), after.updated_at_ms()), (before.version() + 1, 5_000));
    let counts: Vec<usize> = after.instances().iter().map(|instance| instance.shards.len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 9);
    assert!(counts.iter().all(|count| (4..=5).contains(count)), "{counts:?}");
    for instance in after.instances() {
        for shard in &instance.shards {
            assert_eq!((shard.cutover_ms, shard.cutoff_ms), (0, 0), "owned at once, for every tile");
        }
    }
    let kept: Vec<u32> = ids(&before, &before.instances()[0].id);
    assert!(kept.iter().all(|shard| ids(&after, &before.instances()[0].id).contains(shard)), "live shards stay");
}

#[test]
fn fail_over_mid_move_keeps_the_live_side() {
    let moving = shard_one_moving_to_b(120_000, 120_000);
    let receiver_dead = moving.fail_over(&["b"], 1).unwrap();
    assert_eq!(ids(&receiver_dead, "a"), [0, 1]);
    assert!(!receiver_dead.has_pending_moves());
    let giver_dead = moving.fail_over(&["a"], 1).unwrap();
    assert_eq!(ids(&giver_dead, "b"), [0, 1]);
    assert!(!giver_dead.has_pending_moves());
    assert!(matches!(moving.fail_over(&["a", "b"], 1), Err(PlacementError::NoShardSetsLeft)));
    assert!(matches!(moving.fail_over(&["zed"], 1), Err(PlacementError::UnknownInstance { .. })));
    let replicated = Placement::init(&instances(4), 4, 2, 0).unwrap();
    let one = replicated.instances()[0].id.clone();
    assert!(matches!(replicated.fail_over(&[one], 1), Err(PlacementError::FailOverReplicated { .. })));
}

/// `since_version`: an entry records the version whose change gave its instance the shard,
/// so that an instance that missed versions still sees a shard given away and back.
#[test]
fn every_entry_records_the_version_that_gave_its_instance_the_shard() {
    let since = |placement: &Placement, id: &str| -> Vec<(u32, u64)> {
        placement.shards_of(id).iter().map(|entry| (entry.id, entry.since_version)).collect()
    };
    let first = Placement::init(&[("a", "a:1"), ("b", "b:1")], 4, 1, 0).unwrap();
    assert_eq!(since(&first, "a"), [(0, 1), (2, 1)]);
    let failed = first.fail_over(&["b"], 1).unwrap();
    assert_eq!(since(&failed, "a"), [(0, 1), (1, 2), (2, 1), (3, 2)], "b's shards are a's from version 2");
    let joined = failed.add_instance("b", "b:1", timing()).unwrap();
    let moved: Vec<(u32, u64)> = since(&joined, "b");
    assert!(!moved.is_empty() && moved.iter().all(|(_, version)| *version == 3), "{moved:?}");
    assert_eq!(since(&joined, "a"), since(&failed, "a"), "the giver's entries keep theirs");
    let settled = joined.finalize(cutover()).unwrap();
    assert_eq!(since(&settled, "b"), moved, "finalizing a move is not a new tenure");
    // A receiver whose giver dies mid-move goes on with its tenure, begun with the move.
    let giver_dead = joined.fail_over(&["a"], 1).unwrap();
    for &(shard, version) in &moved {
        assert!(since(&giver_dead, "b").contains(&(shard, version)), "shard {shard}");
    }
    // A giver whose receiver dies mid-move begins a new tenure of the shards it was giving
    // away (the receiver may have written them after the cutoff); it keeps the others'.
    let receiver_dead = joined.fail_over(&["b"], 1).unwrap();
    let given_back = receiver_dead.version();
    for (shard, version) in since(&receiver_dead, "a") {
        let was_moving = moved.iter().any(|(moving, _)| *moving == shard);
        let kept = since(&joined, "a").into_iter().find(|(id, _)| *id == shard).map(|(_, version)| version);
        assert_eq!(version, if was_moving { given_back } else { kept.unwrap() }, "shard {shard}");
    }
}
