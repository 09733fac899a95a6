//! The placement: which instance owns which shard, and from when to when.
//!
//! [`Placement`] wraps the wire type [`tessera_proto::Placement`] with
//! queries ([`owners`](Placement::owners), [`owns`](Placement::owns),
//! [`shards_of`](Placement::shards_of)), [`validate`](Placement::validate),
//! and the operations that produce the next placement (see [`ops`]'s
//! model: shard sets of RF mirrored instances).
//!
//! # Ownership in time
//!
//! Each shard entry of an instance carries a state and two times. An
//! instance owns a shard for the tile (or 1 s window) starting at
//! `tile_start_ms` when
//!
//! ```text
//! (cutover_ms == 0 || tile_start_ms >= cutover_ms) && (cutoff_ms == 0 || tile_start_ms < cutoff_ms)
//! ```
//!
//! so a move with `cutoff_ms == cutover_ms == T` (T a tile boundary) hands
//! the shard over between two tiles, never inside one.

use std::collections::{BTreeMap, HashSet};

use tessera_proto as proto;
pub use tessera_proto::{Instance, Shard, ShardState};

use crate::error::PlacementError;

pub mod ops;

/// A placement: `num_shards`, the replication factor, and the instances
/// with the shards each owns.
///
/// It is a thin wrapper over the protobuf message stored in etcd; it is
/// not necessarily valid (call [`validate`](Self::validate), or build it
/// with [`validated`](Self::validated)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Placement {
    inner: proto::Placement,
}

/// Whether a shard entry gives ownership of the tile starting at `tile_start_ms`.
///
/// ```
/// use tessera_topology::{shard_owned_at, Shard, ShardState};
///
/// let leaving = Shard { id: 3, state: ShardState::Leaving as i32, cutover_ms: 0, cutoff_ms: 60_000, since_version: 1 };
/// assert!(shard_owned_at(&leaving, 50_000));
/// assert!(!shard_owned_at(&leaving, 60_000));
/// ```
pub fn shard_owned_at(shard: &Shard, tile_start_ms: i64) -> bool {
    (shard.cutover_ms == 0 || tile_start_ms >= shard.cutover_ms)
        && (shard.cutoff_ms == 0 || tile_start_ms < shard.cutoff_ms)
}

impl Placement {
    /// Wraps a protobuf placement without checking it.
    pub fn from_proto(proto: proto::Placement) -> Self {
        Self { inner: proto }
    }

    /// Wraps a protobuf placement after checking it with [`validate`](Self::validate).
    pub fn validated(proto: proto::Placement) -> Result<Self, PlacementError> {
        let placement = Self::from_proto(proto);
        placement.validate()?;
        Ok(placement)
    }

    /// Decodes a placement from protobuf bytes (as stored in etcd and the cache file).
    ///
    /// The result is not validated.
    pub fn decode(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        <proto::Placement as prost::Message>::decode(bytes).map(Self::from_proto)
    }

    /// Encodes the placement as protobuf bytes.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.inner)
    }

    /// The wrapped protobuf message.
    pub fn as_proto(&self) -> &proto::Placement {
        &self.inner
    }

    /// Unwraps the protobuf message.
    pub fn into_proto(self) -> proto::Placement {
        self.inner
    }

    /// Bumped by every change.
    pub fn version(&self) -> u64 {
        self.inner.version
    }

    /// Number of shards series are hashed into.
    pub fn num_shards(&self) -> u32 {
        self.inner.num_shards
    }

    /// How many instances own each shard.
    pub fn replication_factor(&self) -> u32 {
        self.inner.replication_factor
    }

    /// When the placement was last changed, unix milliseconds (0 when never set).
    pub fn updated_at_ms(&self) -> i64 {
        self.inner.updated_at_ms
    }

    /// Every instance, in placement order.
    pub fn instances(&self) -> &[Instance] {
        &self.inner.instances
    }

    /// The instance with this id.
    pub fn instance(&self, instance_id: &str) -> Option<&Instance> {
        self.inner.instances.iter().find(|instance| instance.id == instance_id)
    }

    /// The instances that own `shard` for the tile starting at `tile_start_ms`
    /// (replicas, and both sides of a move when their times overlap).
    pub fn owners(&self, shard: u32, tile_start_ms: i64) -> impl Iterator<Item = &Instance> + '_ {
        self.inner.instances.iter().filter(move |instance| {
            instance.shards.iter().any(|entry| entry.id == shard && shard_owned_at(entry, tile_start_ms))
        })
    }

    /// Whether `instance_id` owns `shard` for the tile starting at `tile_start_ms`.
    pub fn owns(&self, instance_id: &str, shard: u32, tile_start_ms: i64) -> bool {
        self.shards_of(instance_id).iter().any(|entry| entry.id == shard && shard_owned_at(entry, tile_start_ms))
    }

    /// Every shard entry of `instance_id` (any state); empty when the instance is unknown.
    pub fn shards_of(&self, instance_id: &str) -> &[Shard] {
        self.instance(instance_id).map(|instance| instance.shards.as_slice()).unwrap_or(&[])
    }

    /// The shard ids `instance_id` owns for the tile starting at `tile_start_ms`.
    pub fn owned_shards(&self, instance_id: &str, tile_start_ms: i64) -> impl Iterator<Item = u32> + '_ {
        self.shards_of(instance_id)
            .iter()
            .filter(move |entry| shard_owned_at(entry, tile_start_ms))
            .map(|entry| entry.id)
    }

    /// Instances grouped by shard set id, each group in placement order.
    pub fn shard_sets(&self) -> BTreeMap<u32, Vec<&Instance>> {
        let mut sets: BTreeMap<u32, Vec<&Instance>> = BTreeMap::new();
        for instance in &self.inner.instances {
            sets.entry(instance.shard_set_id).or_default().push(instance);
        }
        sets
    }

    /// Whether any shard is INITIALIZING or LEAVING.
    pub fn has_pending_moves(&self) -> bool {
        self.pending_until_ms().is_some()
    }

    /// The latest cutover or cutoff of a moving (INITIALIZING or LEAVING)
    /// shard: once [`finalize`](Self::finalize) is given a time at or past
    /// it, every move is complete. `None` when nothing moves.
    pub fn pending_until_ms(&self) -> Option<i64> {
        let mut until: Option<i64> = None;
        for entry in self.inner.instances.iter().flat_map(|instance| &instance.shards) {
            let time = match ShardState::try_from(entry.state) {
                Ok(ShardState::Leaving) => entry.cutoff_ms,
                Ok(ShardState::Initializing) => entry.cutover_ms,
                _ => continue,
            };
            until = Some(until.map_or(time, |previous| previous.max(time)));
        }
        until
    }

    /// Checks every rule of a placement:
    ///
    /// - `num_shards` ≥ 1 and `replication_factor` ≥ 1;
    /// - instance ids non-empty and unique, endpoints non-empty;
    /// - every shard id below `num_shards`, no shard twice in one instance,
    ///   every state AVAILABLE, INITIALIZING (with `cutover_ms`) or LEAVING
    ///   (with `cutoff_ms`);
    /// - every shard has exactly RF steady owners (AVAILABLE or
    ///   INITIALIZING: a move counts once, on its receiving side), and as
    ///   many LEAVING owners as INITIALIZING ones;
    /// - the steady owners of a shard belong to one shard set, and so do its
    ///   leaving owners;
    /// - instances of one shard set own the same shard ids, and each shard
    ///   set has RF instances that stay (or none, when the whole set leaves).
    pub fn validate(&self) -> Result<(), PlacementError> {
        let placement = &self.inner;
        if placement.num_shards == 0 {
            return Err(PlacementError::NoShards);
        }
        if placement.replication_factor == 0 {
            return Err(PlacementError::NoReplication);
        }
        let num_shards = placement.num_shards;
        let rf = placement.replication_factor;

        let mut ids = HashSet::with_capacity(placement.instances.len());
        for instance in &placement.instances {
            validate_instance(instance, num_shards)?;
            if !ids.insert(instance.id.as_str()) {
                return Err(PlacementError::DuplicateInstance { instance: instance.id.clone() });
            }
        }

        let mut tallies = vec![ShardTally::default(); num_shards as usize];
        for instance in &placement.instances {
            for entry in &instance.shards {
                let tally = &mut tallies[entry.id as usize];
                if entry.state == ShardState::Initializing as i32 {
                    tally.initializing += 1;
                }
                let set = if entry.state == ShardState::Leaving as i32 {
                    tally.leaving += 1;
                    &mut tally.leaving_set
                } else {
                    tally.steady += 1;
                    &mut tally.steady_set
                };
                match *set {
                    Some(first) if first != instance.shard_set_id => {
                        return Err(PlacementError::ShardInTwoShardSets {
                            shard: entry.id,
                            first,
                            second: instance.shard_set_id,
                        });
                    }
                    _ => *set = Some(instance.shard_set_id),
                }
            }
        }
        for (shard, tally) in tallies.iter().enumerate() {
            let shard = shard as u32;
            if tally.steady != rf {
                return Err(PlacementError::WrongOwnerCount { shard, owners: tally.steady, replication_factor: rf });
            }
            if tally.leaving != tally.initializing {
                return Err(PlacementError::UnpairedMove {
                    shard,
                    leaving: tally.leaving,
                    initializing: tally.initializing,
                });
            }
        }

        for (shard_set_id, members) in self.shard_sets() {
            let first = members[0];
            let first_ids = sorted_shard_ids(first);
            let mut staying = 0;
            for member in &members {
                if sorted_shard_ids(member) != first_ids {
                    return Err(PlacementError::ShardSetMismatch {
                        shard_set_id,
                        first: first.id.clone(),
                        second: member.id.clone(),
                    });
                }
                let leaving_everything = !member.shards.is_empty()
                    && member.shards.iter().all(|entry| entry.state == ShardState::Leaving as i32);
                if !leaving_everything {
                    staying += 1;
                }
            }
            if staying != 0 && staying != rf {
                return Err(PlacementError::ShardSetSize { shard_set_id, instances: staying, replication_factor: rf });
            }
        }
        Ok(())
    }
}

impl From<proto::Placement> for Placement {
    fn from(proto: proto::Placement) -> Self {
        Self::from_proto(proto)
    }
}

/// Owner counts of one shard, gathered by `validate`.
#[derive(Debug, Clone, Copy, Default)]
struct ShardTally {
    steady: u32,
    leaving: u32,
    initializing: u32,
    steady_set: Option<u32>,
    leaving_set: Option<u32>,
}

fn validate_instance(instance: &Instance, num_shards: u32) -> Result<(), PlacementError> {
    if instance.id.is_empty() {
        return Err(PlacementError::EmptyInstanceId);
    }
    if instance.endpoint.trim().is_empty() {
        return Err(PlacementError::EmptyEndpoint { instance: instance.id.clone() });
    }
    let mut seen = HashSet::with_capacity(instance.shards.len());
    for entry in &instance.shards {
        if entry.id >= num_shards {
            return Err(PlacementError::ShardOutOfRange { instance: instance.id.clone(), shard: entry.id, num_shards });
        }
        if !seen.insert(entry.id) {
            return Err(PlacementError::DuplicateShard { instance: instance.id.clone(), shard: entry.id });
        }
        match ShardState::try_from(entry.state) {
            Ok(ShardState::Available) => {}
            Ok(ShardState::Leaving) if entry.cutoff_ms == 0 => {
                return Err(PlacementError::LeavingWithoutCutoff { instance: instance.id.clone(), shard: entry.id });
            }
            Ok(ShardState::Leaving) => {}
            Ok(ShardState::Initializing) if entry.cutover_ms == 0 => {
                return Err(PlacementError::InitializingWithoutCutover {
                    instance: instance.id.clone(),
                    shard: entry.id,
                });
            }
            Ok(ShardState::Initializing) => {}
            Ok(ShardState::Unspecified) | Err(_) => {
                return Err(PlacementError::InvalidShardState {
                    instance: instance.id.clone(),
                    shard: entry.id,
                    state: entry.state,
                });
            }
        }
    }
    Ok(())
}

fn sorted_shard_ids(instance: &Instance) -> Vec<u32> {
    let mut ids: Vec<u32> = instance.shards.iter().map(|entry| entry.id).collect();
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests;
