//! The tessera placement: which aggregator instance owns which shard, and
//! how collectors, aggregators and the `tessera placement` tool get it.
//!
//! - [`Placement`] wraps the wire type [`tessera_proto::Placement`]:
//!   [`validate`](Placement::validate), ownership queries in time
//!   ([`owners`](Placement::owners), [`owns`](Placement::owns)), and the
//!   changes `init`, `add`, `remove`, `replace` and `finalize` (the shard
//!   set model and how shards move at a tile boundary: [`MoveTiming`]).
//! - [`Routing`] is the hot-path table built from a placement: shard →
//!   destination indices, with cutover and cutoff applied per call.
//! - [`StaticFile`]: a placement written in TOML ([`load_static`]).
//! - The placement in etcd: [`PlacementStore`] (get,
//!   compare-and-swap, liveness leases) and [`Watcher`] (watch, survive
//!   outages, cache file: [`read_cache`], [`write_cache`]).
//! - [`PlacementSource`] is what a daemon's config names; it starts into a
//!   [`PlacementHandle`] with a cheap [`current`](PlacementHandle::current)
//!   placement, change notifications and [`WatchStats`] counters.
//! - `testing` (feature `testing`) runs a real etcd for tests, for this and other crates.
//!
//! # Example
//!
//! ```
//! use tessera_topology::{MoveTiming, Placement, PlacementHandle, StaticFile};
//!
//! let file = StaticFile::from_toml(r#"
//!     num_shards = 8
//!     replication_factor = 1
//!     [[instances]]
//!     id = "agg-1"
//!     endpoint = "127.0.0.1:7400"
//! "#).unwrap();
//! let placement = file.to_placement().unwrap();
//! assert!(placement.owns("agg-1", 5, 0));
//!
//! // Add an instance: half the shards move to it at the next minute
//! // boundary at least a minute from now.
//! let now_ms = 1_700_000_000_000;
//! let timing = MoveTiming::new(now_ms);
//! let next = placement.add_instance("agg-2", "127.0.0.1:7401", timing).unwrap();
//! let cutover = timing.cutover_ms().unwrap();
//! assert_eq!(next.owned_shards("agg-2", cutover - 1).count(), 0);
//! assert_eq!(next.owned_shards("agg-2", cutover).count(), 4);
//! let settled = next.finalize(cutover).unwrap();
//! assert!(!settled.has_pending_moves());
//!
//! // Daemons read through a handle; the routing table is rebuilt once per change.
//! let handle = PlacementHandle::fixed(settled);
//! let routing = handle.routing();
//! let owners: Vec<&str> = routing
//!     .owners(3, now_ms)
//!     .map(|index| routing.destinations()[index].endpoint.as_str())
//!     .collect();
//! assert_eq!(owners.len(), 1);
//! ```

mod cache;
mod error;
mod etcd;
mod handle;
mod placement;
mod routing;
mod source;
mod static_file;
mod stats;
mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

pub use cache::{read_cache, write_cache};
pub use error::{CacheError, PlacementError, SourceError, StaticFileError, StoreError, WatchError};
pub use etcd::{
    Election, EtcdConfig, FENCE_MARGIN, FlushMarks, IncompleteTile, Leader, LeaseDeadline, Observed, PlacementStore,
    Registration, Tier, Watcher,
};
pub use etcd_client;
pub use handle::PlacementHandle;
pub use placement::ops::MoveTiming;
pub use placement::{Instance, Placement, Shard, ShardState, shard_owned_at};
pub use routing::{Destination, Routing};
pub use source::PlacementSource;
pub use static_file::{StaticFile, StaticInstance, load_static};
pub use stats::{WatchEvent, WatchStats};
pub use telemetry::WatchStatsCollector;
