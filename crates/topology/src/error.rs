//! Error types, one per concern: the placement model, the static file, the
//! cache file, etcd, and starting a placement source.

use std::path::PathBuf;

/// A placement that breaks a rule, or an operation that cannot be applied.
///
/// Messages name the shard, instance or shard set at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// `num_shards` is zero.
    #[error("num_shards must be at least 1")]
    NoShards,
    /// `replication_factor` is zero.
    #[error("replication_factor must be at least 1")]
    NoReplication,
    /// An instance has an empty id.
    #[error("an instance has an empty id")]
    EmptyInstanceId,
    /// Two instances share an id.
    #[error("instance `{instance}` is listed twice")]
    DuplicateInstance {
        /// The repeated id.
        instance: String,
    },
    /// An instance has an empty endpoint.
    #[error("instance `{instance}` has an empty endpoint")]
    EmptyEndpoint {
        /// The instance id.
        instance: String,
    },
    /// A shard id is not below `num_shards`.
    #[error("instance `{instance}` lists shard {shard}, but num_shards is {num_shards}")]
    ShardOutOfRange {
        /// The instance id.
        instance: String,
        /// The shard id.
        shard: u32,
        /// The placement's shard count.
        num_shards: u32,
    },
    /// An instance lists one shard twice.
    #[error("instance `{instance}` lists shard {shard} twice")]
    DuplicateShard {
        /// The instance id.
        instance: String,
        /// The shard id.
        shard: u32,
    },
    /// A shard entry has an unspecified or unknown state.
    #[error("instance `{instance}` has shard {shard} in invalid state {state}")]
    InvalidShardState {
        /// The instance id.
        instance: String,
        /// The shard id.
        shard: u32,
        /// The raw state value.
        state: i32,
    },
    /// A LEAVING shard has no `cutoff_ms`.
    #[error("instance `{instance}` is leaving shard {shard} without a cutoff_ms")]
    LeavingWithoutCutoff {
        /// The instance id.
        instance: String,
        /// The shard id.
        shard: u32,
    },
    /// An INITIALIZING shard has no `cutover_ms`.
    #[error("instance `{instance}` is initializing shard {shard} without a cutover_ms")]
    InitializingWithoutCutover {
        /// The instance id.
        instance: String,
        /// The shard id.
        shard: u32,
    },
    /// A shard is not owned by exactly RF steady (available or initializing) instances.
    #[error("shard {shard} has {owners} available or initializing owners, replication factor is {replication_factor}")]
    WrongOwnerCount {
        /// The shard id.
        shard: u32,
        /// How many steady owners it has.
        owners: u32,
        /// The placement's replication factor.
        replication_factor: u32,
    },
    /// A shard's leaving owners are not matched one to one by initializing owners.
    #[error("shard {shard} has {leaving} leaving and {initializing} initializing owners; every move pairs one of each")]
    UnpairedMove {
        /// The shard id.
        shard: u32,
        /// LEAVING entries.
        leaving: u32,
        /// INITIALIZING entries.
        initializing: u32,
    },
    /// The owners of one shard (in one role: staying, or leaving) belong to two shard sets.
    #[error("shard {shard} is owned by both shard set {first} and shard set {second}")]
    ShardInTwoShardSets {
        /// The shard id.
        shard: u32,
        /// One shard set.
        first: u32,
        /// Another shard set.
        second: u32,
    },
    /// Two instances of one shard set own different shards.
    #[error("instances `{first}` and `{second}` of shard set {shard_set_id} own different shards")]
    ShardSetMismatch {
        /// The shard set.
        shard_set_id: u32,
        /// One instance.
        first: String,
        /// Another instance.
        second: String,
    },
    /// A shard set does not have RF instances that stay in it.
    #[error("shard set {shard_set_id} has {instances} staying instances, replication factor is {replication_factor}")]
    ShardSetSize {
        /// The shard set.
        shard_set_id: u32,
        /// Instances that are not leaving it.
        instances: u32,
        /// The placement's replication factor.
        replication_factor: u32,
    },
    /// Instances given to `init` or `add_instances` do not make whole shard sets.
    #[error("{count} instances cannot be grouped into shard sets of {replication_factor} (the replication factor)")]
    NotWholeShardSets {
        /// How many instances were given.
        count: usize,
        /// The replication factor.
        replication_factor: u32,
    },
    /// The operation names an instance that is not in the placement.
    #[error("instance `{instance}` is not in the placement")]
    UnknownInstance {
        /// The instance id.
        instance: String,
    },
    /// Removing the instances would leave part of a shard set behind.
    #[error(
        "instance `{instance}` is removed but other instances of its shard set {shard_set_id} are not; remove whole shard sets, or replace the instance"
    )]
    PartialShardSet {
        /// One instance being removed.
        instance: String,
        /// Its shard set.
        shard_set_id: u32,
    },
    /// Removing the instances would leave no shard set to own the shards.
    #[error("cannot remove every shard set of the placement")]
    NoShardSetsLeft,
    /// Failing over is for placements whose shards have one owner each.
    #[error("failing instances over needs replication factor 1, the placement has {replication_factor}")]
    FailOverReplicated {
        /// The replication factor.
        replication_factor: u32,
    },
    /// A change was asked for while shards are still moving.
    #[error("shards are still moving until {until_ms} (unix ms); finalize the placement after that first")]
    MovesPending {
        /// When the last pending move completes.
        until_ms: i64,
    },
    /// The move timing cannot produce a cutover time.
    #[error(
        "move boundary_ms must be positive and delay_ms non-negative, got boundary_ms {boundary_ms} and delay_ms {delay_ms}"
    )]
    InvalidTiming {
        /// The boundary given.
        boundary_ms: i64,
        /// The delay given.
        delay_ms: i64,
    },
    /// A static file lists shards for some instances but not for others.
    #[error("either every instance lists `shards` or none does")]
    MixedShardLists,
    /// A static file gives `shard_set_id` to an instance without `shards`.
    #[error("instance `{instance}` sets `shard_set_id` without `shards`")]
    ShardSetIdWithoutShards {
        /// The instance id.
        instance: String,
    },
}

/// Loading a static placement file failed.
#[derive(Debug, thiserror::Error)]
pub enum StaticFileError {
    /// The file could not be read.
    #[error("reading placement file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown or mistyped keys.
    #[error("parsing placement file `{}`", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML error (with line and column).
        #[source]
        source: toml::de::Error,
    },
    /// The file describes an invalid placement.
    #[error("invalid placement in `{}`", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: PlacementError,
    },
}

/// Reading or writing the local placement cache file failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file could not be read or written.
    #[error("accessing placement cache `{}`", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a protobuf placement.
    #[error("decoding placement cache `{}`", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },
    /// The file holds an invalid placement.
    #[error("invalid placement in cache `{}`", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: PlacementError,
    },
}

/// An etcd operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The etcd configuration is unusable.
    #[error("invalid etcd config: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
    /// The client could not be built.
    #[error("connecting to etcd at {endpoints}")]
    Connect {
        /// The endpoints, comma separated.
        endpoints: String,
        /// The client error (boxed: it is large).
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// A request failed.
    #[error("etcd {operation} on `{key}` failed")]
    Request {
        /// What was being done (`get`, `txn`, `watch`, ...).
        operation: &'static str,
        /// The key or prefix.
        key: String,
        /// The client error (boxed: it is large).
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// A request got no answer in time.
    #[error("etcd {operation} on `{key}` timed out after {timeout_ms} ms")]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// The key or prefix.
        key: String,
        /// The time allowed.
        timeout_ms: u64,
    },
    /// A watch or keep-alive stream ended or was cancelled by the server.
    #[error("etcd {operation} stream on `{key}` ended: {reason}")]
    StreamEnded {
        /// Which stream.
        operation: &'static str,
        /// The key.
        key: String,
        /// Why, as far as known.
        reason: String,
    },
    /// No placement is stored at the key.
    #[error("no placement at `{key}`")]
    NotFound {
        /// The key.
        key: String,
    },
    /// A compare-and-swap lost: the key changed since it was read.
    #[error("placement at `{key}` was changed by another writer; read it again and retry")]
    Conflict {
        /// The key.
        key: String,
    },
    /// The stored value is not a protobuf placement.
    #[error("decoding placement at `{key}`")]
    Decode {
        /// The key.
        key: String,
        /// The protobuf error.
        #[source]
        source: prost::DecodeError,
    },
    /// The placement (stored, or about to be written) is invalid.
    #[error("invalid placement at `{key}`")]
    Invalid {
        /// The key.
        key: String,
        /// What is wrong.
        #[source]
        source: PlacementError,
    },
}

impl StoreError {
    /// etcd answered that the lease named in the request does not exist
    /// (it expired, or was revoked): keeping it alive again cannot work, a
    /// new one must be granted.
    pub fn is_lease_not_found(&self) -> bool {
        match self {
            StoreError::Request { source, .. } => match source.as_ref() {
                etcd_client::Error::GRpcStatus(status) => status.message().contains("lease not found"),
                // Opening a keep-alive stream on an expired lease.
                etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
                _ => false,
            },
            _ => false,
        }
    }
}

/// Starting a [`Watcher`](crate::Watcher) failed.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The etcd configuration is unusable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Neither etcd nor the cache file gave a placement in time.
    #[error("no placement at `{key}` after {waited_ms} ms and no usable cache file (last error: {last_error})")]
    NoPlacement {
        /// The placement key.
        key: String,
        /// How long start waited.
        waited_ms: u64,
        /// The last etcd or cache error seen.
        last_error: String,
    },
}

/// Starting a [`PlacementSource`](crate::PlacementSource) failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The static file could not be loaded.
    #[error(transparent)]
    Static(#[from] StaticFileError),
    /// The etcd watcher could not start.
    #[error(transparent)]
    Etcd(#[from] WatchError),
}
