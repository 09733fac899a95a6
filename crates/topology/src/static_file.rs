//! A placement written by hand in a TOML file, for single-host and test
//! setups with no etcd.
//!
//! ```toml
//! # How many shards series are hashed into.
//! num_shards = 64
//! # How many instances own each shard (default 1).
//! replication_factor = 1
//!
//! [[instances]]
//! id = "aggregator-1"
//! endpoint = "127.0.0.1:7400"
//!
//! [[instances]]
//! id = "aggregator-2"
//! endpoint = "127.0.0.1:7401"
//! ```
//!
//! When no instance lists `shards`, they are assigned as
//! [`Placement::init`] does. Otherwise every instance lists its `shards`
//! (all AVAILABLE) and may give its `shard_set_id`; instances without one
//! are put in shard sets by identical shard lists. Unknown keys are
//! rejected, and the result must pass [`Placement::validate`].

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use tessera_proto as proto;

use crate::error::{PlacementError, StaticFileError};
use crate::placement::{Instance, Placement, Shard, ShardState};

/// The contents of a static placement file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticFile {
    /// How many shards series are hashed into (at least 1).
    pub num_shards: u32,
    /// How many instances own each shard; instances form shard sets of this
    /// size. Default 1.
    #[serde(default = "default_replication_factor")]
    pub replication_factor: u32,
    /// The instances, in order (shard sets are formed in this order).
    pub instances: Vec<StaticInstance>,
}

/// One instance of a static placement file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticInstance {
    /// Unique instance id.
    pub id: String,
    /// `host:port` of the instance's wire listener.
    pub endpoint: String,
    /// Shard set of the instance; only with `shards`.
    #[serde(default)]
    pub shard_set_id: Option<u32>,
    /// Shards the instance owns; omit on every instance to assign them automatically.
    #[serde(default)]
    pub shards: Option<Vec<u32>>,
}

fn default_replication_factor() -> u32 {
    1
}

impl StaticFile {
    /// Parses TOML text (unknown keys are an error).
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// The validated placement (version 1) described by the file.
    pub fn to_placement(&self) -> Result<Placement, PlacementError> {
        let listed = self.instances.iter().filter(|instance| instance.shards.is_some()).count();
        if listed == 0 {
            if let Some(instance) = self.instances.iter().find(|instance| instance.shard_set_id.is_some()) {
                return Err(PlacementError::ShardSetIdWithoutShards { instance: instance.id.clone() });
            }
            let pairs: Vec<(&str, &str)> =
                self.instances.iter().map(|instance| (instance.id.as_str(), instance.endpoint.as_str())).collect();
            return Placement::init(&pairs, self.num_shards, self.replication_factor, 0);
        }
        if listed != self.instances.len() {
            return Err(PlacementError::MixedShardLists);
        }

        // Instances without a shard set id are grouped by identical shard lists.
        let mut next_set_id = self.instances.iter().filter_map(|instance| instance.shard_set_id).max().unwrap_or(0) + 1;
        let mut set_of_list: BTreeMap<Vec<u32>, u32> = BTreeMap::new();
        let mut instances = Vec::with_capacity(self.instances.len());
        for instance in &self.instances {
            let shards = instance.shards.clone().unwrap_or_default();
            let mut sorted = shards.clone();
            sorted.sort_unstable();
            let shard_set_id = match instance.shard_set_id {
                Some(id) => id,
                None => *set_of_list.entry(sorted).or_insert_with(|| {
                    next_set_id += 1;
                    next_set_id - 1
                }),
            };
            instances.push(Instance {
                id: instance.id.clone(),
                endpoint: instance.endpoint.clone(),
                shard_set_id,
                shards: shards
                    .iter()
                    .map(|id| Shard {
                        id: *id,
                        state: ShardState::Available as i32,
                        cutover_ms: 0,
                        cutoff_ms: 0,
                        since_version: 0,
                    })
                    .collect(),
            });
        }
        Placement::validated(proto::Placement {
            version: 1,
            num_shards: self.num_shards,
            replication_factor: self.replication_factor,
            instances,
            updated_at_ms: 0,
        })
    }
}

/// Reads, parses and validates a static placement file.
pub fn load_static(path: impl AsRef<Path>) -> Result<Placement, StaticFileError> {
    let path = path.as_ref();
    let text =
        std::fs::read_to_string(path).map_err(|source| StaticFileError::Read { path: path.to_owned(), source })?;
    let file =
        StaticFile::from_toml(&text).map_err(|source| StaticFileError::Parse { path: path.to_owned(), source })?;
    file.to_placement().map_err(|source| StaticFileError::Invalid { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        num_shards = 4
        replication_factor = 2

        [[instances]]
        id = "a"
        endpoint = "127.0.0.1:7400"

        [[instances]]
        id = "b"
        endpoint = "127.0.0.1:7401"
    "#;

    /// One `[[instances]]` table: `id`, endpoint `h:{port}`, then the `extra` lines.
    fn instance(id: &str, port: u16, extra: &str) -> String {
        format!("[[instances]]\nid = \"{id}\"\nendpoint = \"h:{port}\"\n{extra}")
    }

    #[test]
    fn automatic_shards_follow_init() {
        let placement = StaticFile::from_toml(GOOD).unwrap().to_placement().unwrap();
        assert_eq!(placement.version(), 1);
        assert_eq!(placement.replication_factor(), 2);
        for id in ["a", "b"] {
            assert_eq!(placement.shards_of(id).len(), 4);
            assert_eq!(placement.instance(id).unwrap().shard_set_id, 1);
        }
    }

    #[test]
    fn replication_factor_defaults_to_one() {
        let file = StaticFile::from_toml(&format!("num_shards = 3\n{}", instance("a", 1, ""))).unwrap();
        assert_eq!(file.replication_factor, 1);
        assert_eq!(file.to_placement().unwrap().shards_of("a").len(), 3);
    }

    #[test]
    fn explicit_shards_are_grouped_into_shard_sets() {
        let text = [
            "num_shards = 4\nreplication_factor = 2\n".to_owned(),
            instance("a", 1, "shards = [0, 1]\n"),
            instance("b", 2, "shards = [1, 0]\n"),
            instance("c", 3, "shards = [2, 3]\n"),
            instance("d", 4, "shard_set_id = 7\nshards = [2, 3]\n"),
        ]
        .concat();
        let err = StaticFile::from_toml(&text).unwrap().to_placement().unwrap_err();
        // c got an automatic set and d set 7: shards 2 and 3 span two sets.
        assert!(matches!(err, PlacementError::ShardInTwoShardSets { shard: 2, .. }), "{err}");

        let fixed = text.replace("shard_set_id = 7\n", "");
        let placement = StaticFile::from_toml(&fixed).unwrap().to_placement().unwrap();
        assert_eq!(placement.instance("a").unwrap().shard_set_id, placement.instance("b").unwrap().shard_set_id);
        assert_eq!(placement.instance("c").unwrap().shard_set_id, placement.instance("d").unwrap().shard_set_id);
        assert_ne!(placement.instance("a").unwrap().shard_set_id, placement.instance("c").unwrap().shard_set_id);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let top = format!("{GOOD}\nshards_per_instance = 3\n");
        let err = StaticFile::from_toml(&top).unwrap_err();
        assert!(err.to_string().contains("shards_per_instance"), "{err}");

        let nested = GOOD.replace("endpoint = \"127.0.0.1:7401\"", "endpoint = \"127.0.0.1:7401\"\nweight = 2");
        let err = StaticFile::from_toml(&nested).unwrap_err();
        assert!(err.to_string().contains("weight"), "{err}");
    }

    #[test]
    fn invalid_placements_are_rejected() {
        let odd = GOOD.replace("replication_factor = 2", "replication_factor = 3");
        let err = StaticFile::from_toml(&odd).unwrap().to_placement().unwrap_err();
        assert_eq!(err, PlacementError::NotWholeShardSets { count: 2, replication_factor: 3 });

        let missing = format!("num_shards = 3\n{}", instance("a", 1, "shards = [0, 1]\n"));
        let err = StaticFile::from_toml(&missing).unwrap().to_placement().unwrap_err();
        assert_eq!(err.to_string(), "shard 2 has 0 available or initializing owners, replication factor is 1");

        let mixed = format!("num_shards = 1\n{}{}", instance("a", 1, "shards = [0]\n"), instance("b", 2, ""));
        let err = StaticFile::from_toml(&mixed).unwrap().to_placement().unwrap_err();
        assert_eq!(err, PlacementError::MixedShardLists);

        let set_only = format!("num_shards = 1\n{}", instance("a", 1, "shard_set_id = 1\n"));
        let err = StaticFile::from_toml(&set_only).unwrap().to_placement().unwrap_err();
        assert_eq!(err, PlacementError::ShardSetIdWithoutShards { instance: "a".into() });
    }
}
