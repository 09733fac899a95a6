//! A routing table precomputed from a placement for the hot path.
//!
//! [`Routing`] answers "where do the partials of shard `s` for the window
//! starting at `t` go?" with a few loads from flat arrays: destinations
//! (instance id, endpoint) are deduplicated and numbered once, and each
//! shard keeps a short slice of owners with the time span in which each
//! owns it (both sides of a pending move are kept, so one table serves
//! before and after the cutover).
//!
//! ```
//! use tessera_topology::{MoveTiming, Placement, Routing};
//!
//! let placement = Placement::init(&[("a", "10.0.0.1:7400")], 2, 1, 0).unwrap();
//! let moved = placement.add_instance("b", "10.0.0.2:7400", MoveTiming::new(0)).unwrap();
//! let routing = Routing::new(&moved);
//! let cutover = MoveTiming::new(0).cutover_ms().unwrap();
//! let before: Vec<&str> = routing.owners(1, cutover - 1).map(|d| routing.destinations()[d].instance_id.as_str()).collect();
//! let after: Vec<&str> = routing.owners(1, cutover).map(|d| routing.destinations()[d].instance_id.as_str()).collect();
//! assert_eq!((before, after), (vec!["a"], vec!["b"]));
//! ```

use std::collections::HashMap;

use crate::placement::Placement;

/// Where partials go: one instance at one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The instance id.
    pub instance_id: String,
    /// Its wire listener, `host:port`.
    pub endpoint: String,
}

/// One owner of one shard and the span of tile starts it owns it for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RouteOwner {
    destination: u32,
    /// Owns tiles starting at or after this (`i64::MIN` when unbounded).
    from_ms: i64,
    /// Owns tiles starting before this (`i64::MAX` when unbounded).
    until_ms: i64,
}

/// The routing table of one placement version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    version: u64,
    destinations: Vec<Destination>,
    /// `owners[offsets[s]..offsets[s + 1]]` are the owners of shard `s`.
    offsets: Vec<u32>,
    owners: Vec<RouteOwner>,
}

impl Routing {
    /// Builds the table. Shard entries at or past `num_shards` (an invalid
    /// placement) are ignored.
    pub fn new(placement: &Placement) -> Self {
        let num_shards = placement.num_shards() as usize;
        let mut destinations = Vec::new();
        let mut destination_index: HashMap<(&str, &str), u32> = HashMap::new();
        let mut per_shard: Vec<Vec<RouteOwner>> = vec![Vec::new(); num_shards];
        for instance in placement.instances() {
            let destination = *destination_index.entry((&instance.id, &instance.endpoint)).or_insert_with(|| {
                destinations
                    .push(Destination { instance_id: instance.id.clone(), endpoint: instance.endpoint.clone() });
                (destinations.len() - 1) as u32
            });
            for entry in &instance.shards {
                let Some(owners) = per_shard.get_mut(entry.id as usize) else { continue };
                let owner = RouteOwner {
                    destination,
                    from_ms: if entry.cutover_ms == 0 { i64::MIN } else { entry.cutover_ms },
                    until_ms: if entry.cutoff_ms == 0 { i64::MAX } else { entry.cutoff_ms },
                };
                if !owners.contains(&owner) {
                    owners.push(owner);
                }
            }
        }
        let mut offsets = Vec::with_capacity(num_shards + 1);
        let mut owners = Vec::with_capacity(per_shard.iter().map(Vec::len).sum());
        offsets.push(0);
        for shard_owners in per_shard {
            owners.extend(shard_owners);
            offsets.push(owners.len() as u32);
        }
        Self { version: placement.version(), destinations, offsets, owners }
    }

    /// The placement version the table was built from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Number of shards.
    pub fn num_shards(&self) -> u32 {
        (self.offsets.len() - 1) as u32
    }

    /// Every destination, deduplicated; owners are indices into this.
    pub fn destinations(&self) -> &[Destination] {
        &self.destinations
    }

    /// Indices (into [`destinations`](Self::destinations)) of the owners of
    /// `shard` for the tile or window starting at `tile_start_ms`; empty for
    /// an unknown shard.
    pub fn owners(&self, shard: u32, tile_start_ms: i64) -> impl Iterator<Item = usize> + '_ {
        self.all_owners(shard)
            .iter()
            .filter(move |owner| owner.from_ms <= tile_start_ms && tile_start_ms < owner.until_ms)
            .map(|owner| owner.destination as usize)
    }

    /// Whether no owner has a time bound: routing is the same at every time.
    pub fn is_steady(&self) -> bool {
        self.owners.iter().all(|owner| owner.from_ms == i64::MIN && owner.until_ms == i64::MAX)
    }

    /// The first time after `after_ms` at which some shard changes owners,
    /// if any: a caller may cache per-shard answers until then.
    pub fn next_change_after(&self, after_ms: i64) -> Option<i64> {
        self.owners
            .iter()
            .flat_map(|owner| [owner.from_ms, owner.until_ms])
            .filter(|time| *time > after_ms && *time != i64::MAX)
            .min()
    }

    fn all_owners(&self, shard: u32) -> &[RouteOwner] {
        let shard = shard as usize;
        if shard + 1 >= self.offsets.len() {
            return &[];
        }
        &self.owners[self.offsets[shard] as usize..self.offsets[shard + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MoveTiming;

    #[test]
    fn steady_routing_lists_every_replica() {
        let placement =
            Placement::init(&[("a", "h1:1"), ("b", "h2:1"), ("c", "h3:1"), ("d", "h4:1")], 8, 2, 0).unwrap();
        let routing = Routing::new(&placement);
        assert!(routing.is_steady());
        assert_eq!(routing.num_shards(), 8);
        assert_eq!(routing.destinations().len(), 4);
        for shard in 0..8 {
            let mut ids: Vec<&str> =
                routing.owners(shard, 123).map(|index| routing.destinations()[index].instance_id.as_str()).collect();
            ids.sort_unstable();
            let mut expected: Vec<&str> = placement.owners(shard, 123).map(|instance| instance.id.as_str()).collect();
            expected.sort_unstable();
            assert_eq!(ids, expected, "shard {shard}");
            assert_eq!(ids.len(), 2);
        }
        assert_eq!(routing.owners(8, 0).count(), 0);
        assert_eq!(routing.next_change_after(0), None);
    }

    #[test]
    fn routing_follows_cutover_and_cutoff() {
        let timing = MoveTiming::new(1_700_000_000_000);
        let cutover = timing.cutover_ms().unwrap();
        let placement = Placement::init(&[("a", "h1:1"), ("b", "h2:1")], 6, 1, 0).unwrap();
        let replaced = placement.replace_instance("a", "c", "h3:1", timing).unwrap();
        let routing = Routing::new(&replaced);
        assert!(!routing.is_steady());
        assert_eq!(routing.next_change_after(0), Some(cutover));
        assert_eq!(routing.next_change_after(cutover), None);
        for shard in 0..6 {
            for time in [cutover - 10_000, cutover, cutover + 10_000] {
                let got: Vec<&str> = routing
                    .owners(shard, time)
                    .map(|index| routing.destinations()[index].instance_id.as_str())
                    .collect();
                let expected: Vec<&str> = replaced.owners(shard, time).map(|instance| instance.id.as_str()).collect();
                assert_eq!(got, expected, "shard {shard} at {time}");
                assert_eq!(got.len(), 1);
            }
        }
    }

    #[test]
    fn destinations_are_deduplicated() {
        let placement = Placement::init(&[("a", "h1:1"), ("b", "h2:1")], 64, 1, 0).unwrap();
        let routing = Routing::new(&placement);
        assert_eq!(routing.destinations().len(), 2);
        assert_eq!(routing.version(), 1);
    }
}
