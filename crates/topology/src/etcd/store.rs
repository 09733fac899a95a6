//! Reading and writing the placement in etcd with compare-and-swap.
//!
//! Every writer reads the placement with its `mod_revision`, computes the
//! next one, and writes it only if the key still has that revision; a
//! writer that lost the race gets [`StoreError::Conflict`] and starts over.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::liveness::{self, Registration};
use super::{EtcdConfig, request};
use crate::error::StoreError;
use crate::placement::Placement;

/// The placement key of one environment in etcd, and the liveness keys
/// beside it.
#[derive(Clone)]
pub struct PlacementStore {
    client: Client,
    config: Arc<EtcdConfig>,
    placement_key: String,
}

impl std::fmt::Debug for PlacementStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PlacementStore")
            .field("endpoints", &self.config.endpoints)
            .field("placement_key", &self.placement_key)
            .finish_non_exhaustive()
    }
}

impl PlacementStore {
    /// Checks the config and opens a client. Connections are opened on the
    /// first request, so this succeeds while etcd is down.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        let client = super::connect(&config).await?;
        let placement_key = config.placement_key();
        Ok(Self { client, config: Arc::new(config), placement_key })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// `/tessera/<env>/placement`.
    pub fn placement_key(&self) -> &str {
        &self.placement_key
    }

    /// The underlying etcd client (for elections and other keys).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The stored placement and the key's `mod_revision` (to pass to
    /// [`compare_and_swap`](Self::compare_and_swap)). The placement is
    /// decoded but not validated; [`StoreError::NotFound`] when there is none.
    pub async fn get(&self) -> Result<(Placement, i64), StoreError> {
        let key = &self.placement_key;
        let mut client = self.client.clone();
        let response = request(&self.config, "get", key, client.get(key.as_str(), None)).await?;
        let Some(kv) = response.kvs().first() else {
            return Err(StoreError::NotFound { key: key.clone() });
        };
        let placement =
            Placement::decode(kv.value()).map_err(|source| StoreError::Decode { key: key.clone(), source })?;
        Ok((placement, kv.mod_revision()))
    }

    /// Writes `new` if the key's `mod_revision` is still `expected_mod_revision`
    /// (`None`: only if no placement exists yet). Returns the new
    /// `mod_revision`. `new` is validated first ([`StoreError::Invalid`]);
    /// [`StoreError::Conflict`] when another writer got there first.
    pub async fn compare_and_swap(
        &self,
        expected_mod_revision: Option<i64>,
        new: &Placement,
    ) -> Result<i64, StoreError> {
        let key = &self.placement_key;
        new.validate().map_err(|source| StoreError::Invalid { key: key.clone(), source })?;
        let condition = match expected_mod_revision {
            Some(revision) => Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
            None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
        };
        let transaction = Txn::new().when([condition]).and_then([TxnOp::put(key.as_str(), new.encode_to_vec(), None)]);
        let mut client = self.client.clone();
        let response = request(&self.config, "txn", key, client.txn(transaction)).await?;
        if !response.succeeded() {
            return Err(StoreError::Conflict { key: key.clone() });
        }
        Ok(response.header().map_or(0, |header| header.revision()))
    }

    /// Announces `instance_id` as alive: puts `/tessera/<env>/alive/<id>`
    /// with a lease of `ttl` (whole seconds, at least 1) and keeps the lease
    /// alive in a background task, re-registering after etcd outages. The
    /// key goes away when the [`Registration`] is dropped or revoked, or
    /// `ttl` after the process dies.
    ///
    /// If the key is still there from this instance's previous incarnation (a
    /// process that died within the TTL), it moves to the new lease, and the old
    /// lease is revoked: whatever else that process held with it, a shard set's
    /// leader key, is free at once. Instance ids must name one process each: a
    /// second live process with the same id loses its leases to the newer one.
    pub async fn register_instance(&self, instance_id: &str, ttl: Duration) -> Result<Registration, StoreError> {
        liveness::register(self.client.clone(), self.config.clone(), instance_id, ttl).await
    }

    /// The election of `shard_set`, as seen by replica `instance_id`.
    pub fn election(&self, shard_set: u32, instance_id: &str) -> super::Election {
        super::Election::new(self.client.clone(), self.config.clone(), shard_set, instance_id)
    }

    /// Every replicated shard set's leader: shard set id → instance id.
    pub async fn leaders(&self) -> Result<std::collections::BTreeMap<u32, String>, StoreError> {
        super::election::leaders(&self.client, &self.config).await
    }

    /// Ids of the instances with a live registration, sorted.
    pub async fn alive_instances(&self) -> Result<Vec<String>, StoreError> {
        let prefix = self.config.alive_prefix();
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_keys_only();
        let response = request(&self.config, "get", &prefix, client.get(prefix.as_str(), Some(options))).await?;
        let mut ids: Vec<String> = response
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(prefix.as_bytes()))
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }
}
