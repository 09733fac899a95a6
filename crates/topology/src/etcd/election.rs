//! One leader per shard set, elected through etcd, and the leader's flush
//! marks.
//!
//! # Keys
//!
//! - `/tessera/<env>/leader/<shard set>`: the leader's instance id, put
//!   with the leader's liveness lease by a transaction that succeeds only
//!   if the key does not exist ([`Election::campaign`]). It goes away when
//!   the leader resigns, or when its lease expires (the process died, was
//!   paused, or lost etcd for longer than the TTL); then any replica may
//!   take it.
//! - `/tessera/<env>/flushed/<shard set>`: per storage policy, the end of
//!   the last tile the leader flushed and the ingester acknowledged (all
//!   tiles before it too), as text lines `<policy> <tile end ms>`. Written
//!   by a transaction that succeeds only while the leader key still names
//!   the writer with its lease ([`Election::record_flushed`]): a deposed
//!   leader cannot move the marks. One key per shard set, written once per
//!   flush round that moved a mark, not once per tile or series.
//!
//! Leadership is held with the lease: a replica is leader while the key
//! carries its id **and** its current lease. A restarted process revokes its
//! previous incarnation's lease as it registers
//! ([`PlacementStore::register_instance`](super::PlacementStore::register_instance)),
//! so a leader key that incarnation still held goes at once, and the shard
//! set's other replicas campaign on their next tick instead of waiting out
//! the TTL.

use std::collections::BTreeMap;
use std::sync::Arc;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdConfig, request};
use crate::error::StoreError;

/// Who holds a shard set's leader key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// This replica, with its current lease.
    Us,
    /// Another instance (or an earlier incarnation of this one): its id.
    Other(String),
    /// Nobody.
    Nobody,
}

/// The leader's flush marks: per storage policy, the end of the last tile
/// flushed and acknowledged (unix milliseconds), and the latest tiles among them
/// that the leader flushed *incomplete* (its copy may lack partials: a replica
/// holding the tile whole flushes its copy too, which the ingesters let replace
/// the incomplete one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushMarks {
    /// Policy → end of the last tile flushed and acknowledged.
    pub flushed: BTreeMap<String, i64>,
    /// Policy → recent tiles among those that were flushed incomplete, oldest first.
    pub incomplete: BTreeMap<String, Vec<IncompleteTile>>,
}

/// A tile the leader flushed incomplete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IncompleteTile {
    /// The tile's end, unix milliseconds.
    pub end_ms: i64,
    /// The ingesters' placement version the leader routed its copy under (0: not known, a
    /// leader of the version before these were recorded, or a fixed list of ingesters). A
    /// replica's completion carries it, so that an ingester that took the shard later
    /// knows the copy went to an earlier owner.
    pub routed_version: u64,
}

/// The first word of a line of incomplete tile ends. A decoder from before these
/// lines skips them (its `<policy> <end>` parse fails), so replicas of mixed versions
/// share the marks.
const INCOMPLETE: &str = "incomplete";

/// The first word of a line of the versions the incomplete tiles of a policy were routed
/// under, one per end of its `incomplete` line. A decoder from before these lines skips
/// them too; one that finds none (marks of a leader from before them) reads versions of 0.
const ROUTED: &str = "incomplete-routed";

impl FlushMarks {
    /// Marks with no incomplete tiles.
    pub fn flushed(flushed: BTreeMap<String, i64>) -> FlushMarks {
        FlushMarks { flushed, incomplete: BTreeMap::new() }
    }

    /// `<policy> <tile end ms>` lines, then `incomplete <policy> <end>,<end>…` lines, each
    /// followed by `incomplete-routed <policy> <version>,<version>…` unless every version
    /// is 0 (a fixed list of ingesters).
    pub fn encode(&self) -> String {
        let mut text: String = self.flushed.iter().map(|(policy, end)| format!("{policy} {end}\n")).collect();
        for (policy, tiles) in self.incomplete.iter().filter(|(_, tiles)| !tiles.is_empty()) {
            let ends: Vec<String> = tiles.iter().map(|tile| tile.end_ms.to_string()).collect();
            let versions: Vec<String> = tiles.iter().map(|tile| tile.routed_version.to_string()).collect();
            text.push_str(&format!("{INCOMPLETE} {policy} {}\n", ends.join(",")));
            if tiles.iter().any(|tile| tile.routed_version != 0) {
                text.push_str(&format!("{ROUTED} {policy} {}\n", versions.join(",")));
            }
        }
        text
    }

    /// Parses what [`encode`](Self::encode) wrote; lines that do not parse are skipped, and
    /// versions that do not match their ends one for one are read as 0.
    pub fn decode(text: &str) -> FlushMarks {
        let mut marks = FlushMarks::default();
        let mut routed: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for line in text.lines() {
            let Some((first, rest)) = line.split_once(' ') else { continue };
            if first == INCOMPLETE || first == ROUTED {
                let Some((policy, list)) = rest.split_once(' ') else { continue };
                let list = list.trim().split(',');
                if first == INCOMPLETE {
                    let ends: Option<Vec<i64>> = list.map(|end| end.parse().ok()).collect();
                    if let Some(ends) = ends {
                        let tiles = ends.into_iter().map(|end_ms| IncompleteTile { end_ms, routed_version: 0 });
                        marks.incomplete.insert(policy.to_owned(), tiles.collect());
                    }
                } else if let Some(versions) = list.map(|version| version.parse().ok()).collect() {
                    routed.insert(policy, versions);
                }
            } else if let Ok(end) = rest.trim().parse() {
                marks.flushed.insert(first.to_owned(), end);
            }
        }
        for (policy, tiles) in &mut marks.incomplete {
            if let Some(versions) = routed.get(policy.as_str()).filter(|versions| versions.len() == tiles.len()) {
                for (tile, version) in tiles.iter_mut().zip(versions) {
                    tile.routed_version = *version;
                }
            }
        }
        marks
    }
}

/// What [`Election::observe`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Who leads.
    pub leader: Leader,
    /// The marks the shard set's leaders recorded (empty before any).
    pub marks: FlushMarks,
    /// Instances holding a liveness lease, in key order.
    pub alive: Vec<String>,
}

/// One replica's view of its shard set's election.
#[derive(Clone)]
pub struct Election {
    client: Client,
    config: Arc<EtcdConfig>,
    instance_id: String,
    leader_key: String,
    flushed_key: String,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Election")
            .field("instance_id", &self.instance_id)
            .field("leader_key", &self.leader_key)
            .finish_non_exhaustive()
    }
}

impl Election {
    pub(crate) fn new(client: Client, config: Arc<EtcdConfig>, shard_set: u32, instance_id: &str) -> Election {
        Election {
            leader_key: config.leader_key(shard_set),
            flushed_key: config.flushed_key(shard_set),
            client,
            config,
            instance_id: instance_id.to_owned(),
        }
    }

    /// `/tessera/<env>/leader/<shard set>`.
    pub fn leader_key(&self) -> &str {
        &self.leader_key
    }

    /// One look at the shard set, in one request: who leads (as seen by
    /// this replica holding `lease_id`), the recorded marks, and which
    /// instances hold a liveness lease.
    pub async fn observe(&self, lease_id: i64) -> Result<Observed, StoreError> {
        let alive_prefix = self.config.alive_prefix();
        let transaction = Txn::new().and_then([
            TxnOp::get(self.leader_key.as_str(), None),
            TxnOp::get(self.flushed_key.as_str(), None),
            TxnOp::get(alive_prefix.as_str(), Some(GetOptions::new().with_prefix().with_keys_only())),
        ]);
        let mut client = self.client.clone();
        let response = request(&self.config, "txn", &self.leader_key, client.txn(transaction)).await?;
        let mut gets = response.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        });
        let (Some(leader), Some(flushed), Some(alive)) = (gets.next(), gets.next(), gets.next()) else {
            return Err(StoreError::StreamEnded {
                operation: "txn",
                key: self.leader_key.clone(),
                reason: "fewer answers than requests".into(),
            });
        };
        let leader = self.leader_of(leader.kvs().first().map(|kv| (kv.value(), kv.lease())), lease_id);
        let marks = flushed.kvs().first().map(|kv| FlushMarks::decode(&String::from_utf8_lossy(kv.value())));
        let alive = alive
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(alive_prefix.as_bytes()))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .collect();
        Ok(Observed { leader, marks: marks.unwrap_or_default(), alive })
    }

    /// Takes the leader key with `lease_id` if nobody holds it; returns who
    /// leads afterwards.
    pub async fn campaign(&self, lease_id: i64) -> Result<Leader, StoreError> {
        let key = self.leader_key.as_str();
        let put = TxnOp::put(key, self.instance_id.as_str(), Some(PutOptions::new().with_lease(lease_id)));
        let transaction = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([put])
            .or_else([TxnOp::get(key, None)]);
        let mut client = self.client.clone();
        let response = request(&self.config, "txn", key, client.txn(transaction)).await?;
        if response.succeeded() {
            return Ok(Leader::Us);
        }
        let held = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease())),
            _ => None,
        });
        Ok(self.leader_of(held.as_ref().map(|(value, lease)| (value.as_slice(), *lease)), lease_id))
    }

    /// Gives up the leader key if this replica holds it with `lease_id`.
    pub async fn resign(&self, lease_id: i64) -> Result<(), StoreError> {
        let key = self.leader_key.as_str();
        let transaction = Txn::new().when(self.held_by_us(lease_id)).and_then([TxnOp::delete(key, None)]);
        let mut client = self.client.clone();
        request(&self.config, "txn", key, client.txn(transaction)).await?;
        Ok(())
    }

    /// Records `marks` if this replica still leads with `lease_id`; returns
    /// whether it did (false: deposed, nothing written).
    pub async fn record_flushed(&self, lease_id: i64, marks: &FlushMarks) -> Result<bool, StoreError> {
        let transaction = Txn::new().when(self.held_by_us(lease_id)).and_then([TxnOp::put(
            self.flushed_key.as_str(),
            marks.encode(),
            None,
        )]);
        let mut client = self.client.clone();
        let response = request(&self.config, "txn", &self.flushed_key, client.txn(transaction)).await?;
        Ok(response.succeeded())
    }

    fn held_by_us(&self, lease_id: i64) -> [Compare; 2] {
        let key = self.leader_key.as_str();
        [
            Compare::value(key, CompareOp::Equal, self.instance_id.as_str()),
            Compare::lease(key, CompareOp::Equal, lease_id),
        ]
    }

    fn leader_of(&self, held: Option<(&[u8], i64)>, lease_id: i64) -> Leader {
        match held {
            None => Leader::Nobody,
            Some((value, lease)) if value == self.instance_id.as_bytes() && lease == lease_id => Leader::Us,
            Some((value, _)) => Leader::Other(String::from_utf8_lossy(value).into_owned()),
        }
    }
}

/// Every shard set's leader: shard set id → instance id.
pub(crate) async fn leaders(client: &Client, config: &EtcdConfig) -> Result<BTreeMap<u32, String>, StoreError> {
    let prefix = config.leader_prefix();
    let mut client = client.clone();
    let options = GetOptions::new().with_prefix();
    let response = request(config, "get", &prefix, client.get(prefix.as_str(), Some(options))).await?;
    Ok(response
        .kvs()
        .iter()
        .filter_map(|kv| {
            let shard_set = std::str::from_utf8(kv.key().strip_prefix(prefix.as_bytes())?).ok()?.parse().ok()?;
            Some((shard_set, String::from_utf8_lossy(kv.value()).into_owned()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_marks_round_trip_as_text_lines() {
        let mut marks = FlushMarks::flushed(
            [("10s:2d".to_owned(), 1_700_000_010_000), ("1m:40d".to_owned(), 1_700_000_040_000)].into(),
        );
        assert_eq!(marks.encode(), "10s:2d 1700000010000\n1m:40d 1700000040000\n");
        assert_eq!(FlushMarks::decode(&marks.encode()), marks);
        assert_eq!(FlushMarks::decode("garbage\n10s:2d x\n1m:40d 5\n").flushed, [("1m:40d".to_owned(), 5)].into());
        let tile = |end_ms, routed_version| IncompleteTile { end_ms, routed_version };
        marks.incomplete.insert("10s:2d".to_owned(), vec![tile(1_700_000_000_000, 7), tile(1_700_000_010_000, 9)]);
        assert_eq!(
            marks.encode(),
            "10s:2d 1700000010000\n1m:40d 1700000040000\nincomplete 10s:2d 1700000000000,1700000010000\n\
             incomplete-routed 10s:2d 7,9\n"
        );
        assert_eq!(FlushMarks::decode(&marks.encode()), marks);
        // A leader from before the routed versions: the ends, with versions of 0; and a
        // versions line that does not match its ends one for one is not believed.
        let without: FlushMarks = FlushMarks::decode("10s:2d 5\nincomplete 10s:2d 3,4\n");
        assert_eq!(without.incomplete["10s:2d"], [tile(3, 0), tile(4, 0)]);
        let mismatched = FlushMarks::decode("10s:2d 5\nincomplete 10s:2d 3,4\nincomplete-routed 10s:2d 7\n");
        assert_eq!(mismatched.incomplete["10s:2d"], [tile(3, 0), tile(4, 0)]);
        // What a replica of the version before incomplete lines made of them: the marks alone.
        let before: BTreeMap<String, i64> = marks
            .encode()
            .lines()
            .filter_map(|line| {
                let (policy, end) = line.split_once(' ')?;
                Some((policy.to_owned(), end.trim().parse().ok()?))
            })
            .collect();
        assert_eq!(before, marks.flushed);
    }
}
