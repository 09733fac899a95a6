//! tessera's metric model, shared by every daemon.
//!
//! - [`parse`]: a zero-copy statsd / DogStatsD line parser;
//! - [`series`]: the canonical series id (name plus tags sorted by key);
//! - [`shard`]: `murmur3_32(canonical_id, 0) % num_shards`;
//! - [`sketch`]: a DDSketch-style quantile sketch whose buckets are
//!   Prometheus native-histogram buckets;
//! - [`hll`]: a HyperLogLog cardinality sketch, exact while small;
//! - [`aggregate`]: the mergeable per-type aggregates and their
//!   serialisation to the wire types of `tessera-proto`;
//! - [`index`]: a hash index of positions whose lookups can be prefetched;
//! - [`table`]: a series table that folds parsed lines into aggregates
//!   without allocating for series it already knows.
//!
//! ```
//! use tessera_core::{parse::{parse_datagram, Parsed}, series::SeriesKey, shard::shard_of};
//!
//! let mut key = SeriesKey::default();
//! let mut seen = Vec::new();
//! parse_datagram(b"api.hits:1|c|#route:/a,env:prod\napi.hits:1|c|#env:prod,route:/a", |parsed| {
//!     if let Parsed::Metric(line) = parsed {
//!         key.build(&line).unwrap();
//!         seen.push(key.id().to_vec());
//!     }
//! });
//! assert_eq!(seen[0], seen[1]);
//! assert_eq!(seen[0], b"api.hits|#env:prod,route:/a");
//! let _shard = shard_of(&seen[0], 64);
//! ```

pub mod aggregate;
pub mod base64;
pub mod budget;
pub mod clock;
pub mod hll;
pub mod index;
pub mod parse;
pub mod prehashed;
pub mod series;
pub mod shard;
pub mod sketch;
pub mod table;
