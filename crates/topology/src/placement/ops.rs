//! Operations that produce the next placement: `init`, `add`, `remove`,
//! `replace`, and `finalize`.
//!
//! # Model: shard sets of mirrored instances (as M3's aggregator placement)
//!
//! Instances are grouped into **shard sets** of exactly RF instances each
//! (`shard_set_id`). A shard set owns a set of shards, and every instance of
//! the set owns the same shards: the instances of a set are replicas of each
//! other. Each shard is owned by exactly one shard set, hence by RF
//! instances. The aggregator relies on this: the replicas of a shard set
//! receive the same partials and elect one leader per shard set to flush.
//!
//! - [`Placement::init`] groups the given instances, in order, into shard
//!   sets of RF (ids 1, 2, …) and deals shard `s` to set `s % sets`.
//! - [`Placement::add_instances`] adds whole shard sets (a multiple of RF
//!   instances) and moves shards from the most loaded sets to the least
//!   loaded ones until no two sets differ by more than one shard: only as
//!   many shards move as balancing needs.
//! - [`Placement::remove_instances`] removes whole shard sets and hands each
//!   of their shards to the least loaded remaining set; no other shard moves.
//! - [`Placement::replace_instance`] swaps one instance of a set for a new
//!   one with the same shards.
//!
//! A move never happens at once: the giving instances keep the shard as
//! LEAVING with `cutoff_ms = T`, the receiving ones get it as INITIALIZING
//! with `cutover_ms = T`, where T is a tile boundary (see [`MoveTiming`]).
//! [`Placement::finalize`] later drops the LEAVING entries and marks the
//! INITIALIZING ones AVAILABLE. While anything is still moving, `add`,
//! `remove` and `replace` refuse ([`PlacementError::MovesPending`]).
//!
//! Every operation returns a new, validated placement with `version + 1`
//! and `updated_at_ms` set; the original is left alone.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use tessera_proto as proto;

use super::{Instance, Placement, Shard, ShardState};
use crate::error::PlacementError;

/// When a move takes effect: the first multiple of `boundary_ms` at or
/// after `now_ms + delay_ms`.
///
/// The delay gives every collector and aggregator time to see the new
/// placement before it takes effect; the boundary must be a multiple of
/// every tile size (60 000 suits both 10 s and 1 min tiles).
///
/// ```
/// use tessera_topology::MoveTiming;
///
/// let timing = MoveTiming::new(1_000_030_000).with_delay_ms(45_000);
/// assert_eq!(timing.cutover_ms().unwrap(), 1_000_080_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveTiming {
    /// The current time, unix milliseconds; also becomes `updated_at_ms`.
    pub now_ms: i64,
    /// How long after `now_ms` a move may take effect at the earliest.
    pub delay_ms: i64,
    /// Moves take effect on multiples of this (unix ms since the epoch).
    pub boundary_ms: i64,
}

impl MoveTiming {
    /// Default `delay_ms`: one minute.
    pub const DEFAULT_DELAY_MS: i64 = 60_000;
    /// Default `boundary_ms`: one minute, a multiple of 10 s and 1 min tiles.
    pub const DEFAULT_BOUNDARY_MS: i64 = 60_000;

    /// Timing at `now_ms` with the default delay and boundary.
    pub fn new(now_ms: i64) -> Self {
        Self { now_ms, delay_ms: Self::DEFAULT_DELAY_MS, boundary_ms: Self::DEFAULT_BOUNDARY_MS }
    }

    /// Sets `delay_ms`.
    pub fn with_delay_ms(self, delay_ms: i64) -> Self {
        Self { delay_ms, ..self }
    }

    /// Sets `boundary_ms`.
    pub fn with_boundary_ms(self, boundary_ms: i64) -> Self {
        Self { boundary_ms, ..self }
    }

    /// The cutover (and cutoff) time T of moves made now.
    pub fn cutover_ms(&self) -> Result<i64, PlacementError> {
        let invalid = PlacementError::InvalidTiming { boundary_ms: self.boundary_ms, delay_ms: self.delay_ms };
        if self.boundary_ms <= 0 || self.delay_ms < 0 {
            return Err(invalid);
        }
        let earliest = self.now_ms.saturating_add(self.delay_ms);
        let remainder = earliest.rem_euclid(self.boundary_ms);
        let cutover = if remainder == 0 { earliest } else { earliest.saturating_add(self.boundary_ms - remainder) };
        // 0 means "no cutover" in a shard entry, so a move needs a positive time.
        if cutover <= 0 {
            return Err(invalid);
        }
        Ok(cutover)
    }
}

/// One shard handed from one shard set to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Move {
    shard: u32,
    from_set: u32,
    to_set: u32,
}

impl Placement {
    /// A first placement (version 1): `instances` (id, endpoint), in order,
    /// are grouped into shard sets of `replication_factor`, and shards are
    /// dealt round-robin to the sets, all AVAILABLE.
    ///
    /// ```
    /// use tessera_topology::Placement;
    ///
    /// let placement = Placement::init(&[("a", "10.0.0.1:7400"), ("b", "10.0.0.2:7400")], 4, 1, 0).unwrap();
    /// assert_eq!(placement.shards_of("a").iter().map(|s| s.id).collect::<Vec<_>>(), [0, 2]);
    /// ```
    pub fn init<I: AsRef<str>, E: AsRef<str>>(
        instances: &[(I, E)],
        num_shards: u32,
        replication_factor: u32,
        now_ms: i64,
    ) -> Result<Placement, PlacementError> {
        if num_shards == 0 {
            return Err(PlacementError::NoShards);
        }
        if replication_factor == 0 {
            return Err(PlacementError::NoReplication);
        }
        let rf = replication_factor as usize;
        if instances.is_empty() || !instances.len().is_multiple_of(rf) {
            return Err(PlacementError::NotWholeShardSets { count: instances.len(), replication_factor });
        }
        let set_count = (instances.len() / rf) as u32;
        let mut placement = proto::Placement {
            version: 1,
            num_shards,
            replication_factor,
            instances: Vec::with_capacity(instances.len()),
            updated_at_ms: now_ms,
        };
        for (index, (id, endpoint)) in instances.iter().enumerate() {
            let set_index = (index / rf) as u32;
            let shards = (0..num_shards).filter(|shard| shard % set_count == set_index).map(available).collect();
            placement.instances.push(Instance {
                id: id.as_ref().to_owned(),
                endpoint: endpoint.as_ref().to_owned(),
                shard_set_id: set_index + 1,
                shards,
            });
        }
        stamp_tenures(&mut placement);
        Placement::validated(placement)
    }

    /// Adds one instance: with replication factor 1 it forms a new shard
    /// set; otherwise use [`add_instances`](Self::add_instances) with a
    /// whole set.
    pub fn add_instance(
        &self,
        instance_id: &str,
        endpoint: &str,
        timing: MoveTiming,
    ) -> Result<Placement, PlacementError> {
        self.add_instances(&[(instance_id, endpoint)], timing)
    }

    /// Adds new shard sets made of `instances` (id, endpoint; a multiple of
    /// RF, grouped in order) and moves just enough shards to them to balance
    /// the sets.
    pub fn add_instances<I: AsRef<str>, E: AsRef<str>>(
        &self,
        instances: &[(I, E)],
        timing: MoveTiming,
    ) -> Result<Placement, PlacementError> {
        let mut next = self.start_change()?;
        let cutover_ms = timing.cutover_ms()?;
        let rf = next.replication_factor;
        if instances.is_empty() || !instances.len().is_multiple_of(rf as usize) {
            return Err(PlacementError::NotWholeShardSets { count: instances.len(), replication_factor: rf });
        }
        for (id, _) in instances {
            if self.instance(id.as_ref()).is_some() {
                return Err(PlacementError::DuplicateInstance { instance: id.as_ref().to_owned() });
            }
        }

        let before = set_shards(&next);
        let mut after = before.clone();
        let mut new_sets = HashSet::new();
        let first_new_set_id = before.keys().next_back().map_or(1, |last| last + 1);
        for (next_set_id, group) in (first_new_set_id..).zip(instances.chunks(rf as usize)) {
            for (id, endpoint) in group {
                next.instances.push(Instance {
                    id: id.as_ref().to_owned(),
                    endpoint: endpoint.as_ref().to_owned(),
                    shard_set_id: next_set_id,
                    shards: Vec::new(),
                });
            }
            after.insert(next_set_id, BTreeSet::new());
            new_sets.insert(next_set_id);
        }

        loop {
            let fullest = after
                .iter()
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .map(|(set, shards)| (*set, shards.len()))
                .expect("a placement being added to has shard sets");
            let emptiest = after
                .iter()
                .min_by(|a, b| {
                    a.1.len()
                        .cmp(&b.1.len())
                        .then(new_sets.contains(b.0).cmp(&new_sets.contains(a.0)))
                        .then(a.0.cmp(b.0))
                })
                .map(|(set, shards)| (*set, shards.len()))
                .expect("a placement being added to has shard sets");
            if fullest.1 <= emptiest.1 + 1 {
                break;
            }
            let shard = after
                .get_mut(&fullest.0)
                .and_then(|shards| shards.pop_last())
                .expect("the fullest set owns more shards than the emptiest");
            after.get_mut(&emptiest.0).expect("the emptiest set exists").insert(shard);
        }

        apply_moves(&mut next, &diff_moves(&before, &after), cutover_ms);
        finish_change(next, timing.now_ms)
    }

    /// Removes one instance: with replication factor 1 that removes its
    /// shard set; otherwise use [`remove_instances`](Self::remove_instances)
    /// with a whole set, or [`replace_instance`](Self::replace_instance).
    pub fn remove_instance(&self, instance_id: &str, timing: MoveTiming) -> Result<Placement, PlacementError> {
        self.remove_instances(&[instance_id], timing)
    }

    /// Removes the shard sets made up of `instance_ids` (every instance of
    /// each set must be named). Each of their shards moves to the least
    /// loaded remaining set; the removed instances stay, LEAVING, until
    /// [`finalize`](Self::finalize) (at once when they own no shard).
    pub fn remove_instances<S: AsRef<str>>(
        &self,
        instance_ids: &[S],
        timing: MoveTiming,
    ) -> Result<Placement, PlacementError> {
        let mut next = self.start_change()?;
        let cutover_ms = timing.cutover_ms()?;
        let removed_ids: HashSet<&str> = instance_ids.iter().map(|id| id.as_ref()).collect();
        let mut removed_sets = BTreeSet::new();
        for id in instance_ids {
            let id = id.as_ref();
            let instance =
                self.instance(id).ok_or_else(|| PlacementError::UnknownInstance { instance: id.to_owned() })?;
            removed_sets.insert(instance.shard_set_id);
        }
        for instance in &next.instances {
            if removed_sets.contains(&instance.shard_set_id) && !removed_ids.contains(instance.id.as_str()) {
                let named = next
                    .instances
                    .iter()
                    .find(|member| {
                        member.shard_set_id == instance.shard_set_id && removed_ids.contains(member.id.as_str())
                    })
                    .map(|member| member.id.clone())
                    .unwrap_or_default();
                return Err(PlacementError::PartialShardSet { instance: named, shard_set_id: instance.shard_set_id });
            }
        }

        let before = set_shards(&next);
        let mut after = before.clone();
        let mut orphans = BTreeSet::new();
        for set in &removed_sets {
            orphans.extend(after.remove(set).unwrap_or_default());
        }
        if after.is_empty() {
            return Err(PlacementError::NoShardSetsLeft);
        }
        for shard in orphans {
            let (_, shards) = after
                .iter_mut()
                .min_by(|a, b| a.1.len().cmp(&b.1.len()).then(a.0.cmp(b.0)))
                .expect("checked that a shard set remains");
            shards.insert(shard);
        }

        // Instances of removed sets that own nothing leave at once.
        next.instances
            .retain(|instance| !(removed_sets.contains(&instance.shard_set_id) && instance.shards.is_empty()));
        apply_moves(&mut next, &diff_moves(&before, &after), cutover_ms);
        finish_change(next, timing.now_ms)
    }

    /// Replaces `old_id` by a new instance in the same shard set: the old
    /// one leaves its shards at the cutover, the new one takes them then.
    pub fn replace_instance(
        &self,
        old_id: &str,
        new_id: &str,
        new_endpoint: &str,
        timing: MoveTiming,
    ) -> Result<Placement, PlacementError> {
        let mut next = self.start_change()?;
        let cutover_ms = timing.cutover_ms()?;
        if self.instance(new_id).is_some() {
            return Err(PlacementError::DuplicateInstance { instance: new_id.to_owned() });
        }
        let position = next
            .instances
            .iter()
            .position(|instance| instance.id == old_id)
            .ok_or_else(|| PlacementError::UnknownInstance { instance: old_id.to_owned() })?;

        let old = &mut next.instances[position];
        let incoming = Instance {
            id: new_id.to_owned(),
            endpoint: new_endpoint.to_owned(),
            shard_set_id: old.shard_set_id,
            shards: old.shards.iter().map(|entry| initializing(entry.id, cutover_ms)).collect(),
        };
        if old.shards.is_empty() {
            next.instances[position] = incoming;
        } else {
            for entry in &mut old.shards {
                entry.state = ShardState::Leaving as i32;
                entry.cutoff_ms = cutover_ms;
            }
            next.instances.insert(position + 1, incoming);
        }
        finish_change(next, timing.now_ms)
    }

    /// Completes every move whose time has come: for each shard whose
    /// LEAVING cutoffs and INITIALIZING cutovers are all at or before
    /// `now_ms`, drops the LEAVING entries and marks the INITIALIZING ones
    /// AVAILABLE; instances left with no shard by that are removed.
    ///
    /// Returns `None` when nothing was due. The result is not validated (it
    /// is valid when `self` is).
    ///
    /// A tile that started before the cutoff may still be open on the
    /// leaving instance after the cutoff (until it closes and flushes), so
    /// call this once the largest tile plus its `buffer_past` has passed
    /// after [`pending_until_ms`](Self::pending_until_ms).
    pub fn finalize(&self, now_ms: i64) -> Option<Placement> {
        let mut blocked = HashSet::new();
        let mut due = HashSet::new();
        for entry in self.inner.instances.iter().flat_map(|instance| &instance.shards) {
            let time = match ShardState::try_from(entry.state) {
                Ok(ShardState::Leaving) => entry.cutoff_ms,
                Ok(ShardState::Initializing) => entry.cutover_ms,
                _ => continue,
            };
            if time <= now_ms {
                due.insert(entry.id);
            } else {
                blocked.insert(entry.id);
            }
        }
        due.retain(|shard| !blocked.contains(shard));
        if due.is_empty() {
            return None;
        }

        let mut next = self.inner.clone();
        next.instances.retain_mut(|instance| {
            let had_shards = !instance.shards.is_empty();
            instance.shards.retain_mut(|entry| {
                if !due.contains(&entry.id) {
                    return true;
                }
                if entry.state == ShardState::Leaving as i32 {
                    return false;
                }
                if entry.state == ShardState::Initializing as i32 {
                    entry.state = ShardState::Available as i32;
                    entry.cutover_ms = 0;
                }
                true
            });
            !(had_shards && instance.shards.is_empty())
        });
        next.version += 1;
        next.updated_at_ms = now_ms;
        Some(Placement::from_proto(next))
    }

    /// Fails dead instances over at once, for a placement of replication
    /// factor 1 (the ingesters'): every shard a dead instance owned goes to
    /// a live instance with no time bound, and the dead instances leave.
    ///
    /// A shard in the middle of a move keeps its live side (a live giver
    /// keeps it, a live receiver takes it now); any other shard goes to the
    /// live instance owning the fewest shards. Moves between live instances
    /// are left as they are. Unlike the other changes this may run while
    /// moves are pending: a dead owner cannot wait for a cutover.
    ///
    /// ```
    /// use tessera_topology::Placement;
    ///
    /// let placement = Placement::init(&[("a", "a:1"), ("b", "b:1"), ("c", "c:1")], 6, 1, 0).unwrap();
    /// let next = placement.fail_over(&["b"], 1_000).unwrap();
    /// assert!(next.instance("b").is_none());
    /// assert_eq!(next.shards_of("a").len() + next.shards_of("c").len(), 6);
    /// ```
    pub fn fail_over<S: AsRef<str>>(&self, dead_ids: &[S], now_ms: i64) -> Result<Placement, PlacementError> {
        self.validate()?;
        let dead: HashSet<&str> = dead_ids.iter().map(|id| id.as_ref()).collect();
        for id in &dead {
            if self.instance(id).is_none() {
                return Err(PlacementError::UnknownInstance { instance: (*id).to_owned() });
            }
        }
        let mut next = self.inner.clone();
        if next.replication_factor != 1 {
            return Err(PlacementError::FailOverReplicated { replication_factor: next.replication_factor });
        }
        let orphans: BTreeSet<u32> = next
            .instances
            .iter()
            .filter(|instance| dead.contains(instance.id.as_str()))
            .flat_map(|instance| instance.shards.iter().map(|entry| entry.id))
            .collect();
        next.instances.retain(|instance| !dead.contains(instance.id.as_str()));
        if next.instances.is_empty() {
            return Err(PlacementError::NoShardSetsLeft);
        }
        let mut homeless = Vec::new();
        for shard in orphans {
            let mut kept = false;
            for entry in next.instances.iter_mut().flat_map(|instance| instance.shards.iter_mut()) {
                if entry.id == shard {
                    // A live receiver goes on with its tenure, begun when the move did. A
                    // live giver's tenure of the shard was ending at its cutoff, after which
                    // the receiver may have written it: it begins again now, as its
                    // ingester reads it (a cutoff taken back is a new tenure there), and as
                    // a restart must read it too, from the placement alone.
                    let since_version = if entry.cutoff_ms > 0 { NEW_TENURE } else { entry.since_version };
                    *entry = Shard { since_version, ..available(shard) };
                    kept = true;
                }
            }
            if !kept {
                homeless.push(shard);
            }
        }
        for shard in homeless {
            let least = next
                .instances
                .iter_mut()
                .min_by_key(|instance| instance.shards.len())
                .expect("checked that an instance remains");
            least.shards.push(available(shard));
        }
        finish_change(next, now_ms)
    }

    /// Checks that a change may start and returns the message to change.
    fn start_change(&self) -> Result<proto::Placement, PlacementError> {
        self.validate()?;
        if let Some(until_ms) = self.pending_until_ms() {
            return Err(PlacementError::MovesPending { until_ms });
        }
        Ok(self.inner.clone())
    }
}

/// The `since_version` of an entry made by a change, until [`finish_change`] writes the
/// change's version into it.
const NEW_TENURE: u64 = u64::MAX;

/// An AVAILABLE entry for `shard`, a tenure that begins with this change.
fn available(shard: u32) -> Shard {
    Shard { id: shard, state: ShardState::Available as i32, cutover_ms: 0, cutoff_ms: 0, since_version: NEW_TENURE }
}

/// An INITIALIZING entry for `shard` taking effect at `cutover_ms`, a tenure that begins with
/// this change.
fn initializing(shard: u32, cutover_ms: i64) -> Shard {
    Shard { id: shard, state: ShardState::Initializing as i32, cutover_ms, cutoff_ms: 0, since_version: NEW_TENURE }
}

/// Writes `version` into the entries this change made ([`NEW_TENURE`]).
fn stamp_tenures(placement: &mut proto::Placement) {
    let version = placement.version;
    for entry in placement.instances.iter_mut().flat_map(|instance| instance.shards.iter_mut()) {
        if entry.since_version == NEW_TENURE {
            entry.since_version = version;
        }
    }
}

/// Shard ids owned by each shard set (taken from one member: members are identical).
fn set_shards(placement: &proto::Placement) -> BTreeMap<u32, BTreeSet<u32>> {
    let mut sets: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for instance in &placement.instances {
        sets.entry(instance.shard_set_id).or_insert_with(|| instance.shards.iter().map(|entry| entry.id).collect());
    }
    sets
}

/// The moves that turn `before` into `after` (sets absent from `after` give
/// all their shards away; sets absent from `before` start empty).
fn diff_moves(before: &BTreeMap<u32, BTreeSet<u32>>, after: &BTreeMap<u32, BTreeSet<u32>>) -> Vec<Move> {
    let mut owner_before = BTreeMap::new();
    for (set, shards) in before {
        for shard in shards {
            owner_before.insert(*shard, *set);
        }
    }
    let mut moves = Vec::new();
    for (set, shards) in after {
        for shard in shards {
            if let Some(from_set) = owner_before.get(shard).copied().filter(|from_set| from_set != set) {
                moves.push(Move { shard: *shard, from_set, to_set: *set });
            }
        }
    }
    moves
}

/// Marks the giving side of each move LEAVING and adds INITIALIZING entries
/// to the receiving side, both at `cutover_ms`.
fn apply_moves(placement: &mut proto::Placement, moves: &[Move], cutover_ms: i64) {
    let by_shard: HashMap<u32, Move> = moves.iter().map(|step| (step.shard, *step)).collect();
    for instance in &mut placement.instances {
        for entry in &mut instance.shards {
            if by_shard.get(&entry.id).is_some_and(|step| step.from_set == instance.shard_set_id) {
                entry.state = ShardState::Leaving as i32;
                entry.cutoff_ms = cutover_ms;
            }
        }
        for step in moves.iter().filter(|step| step.to_set == instance.shard_set_id) {
            instance.shards.push(initializing(step.shard, cutover_ms));
        }
    }
}

/// Bumps the version, stamps the time, orders shard lists, and validates.
fn finish_change(mut placement: proto::Placement, now_ms: i64) -> Result<Placement, PlacementError> {
    placement.version += 1;
    placement.updated_at_ms = now_ms;
    stamp_tenures(&mut placement);
    for instance in &mut placement.instances {
        instance.shards.sort_by_key(|entry| entry.id);
    }
    Placement::validated(placement)
}
