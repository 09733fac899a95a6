//! The aggregator's own stage: decoded partials in, closed tiles out.
//!
//! ```text
//! decoder ──SplitBatch──▶ admission ──shares──▶ merge threads ──parts──▶ flusher (crate::flush)
//!    ▲                       │ shadow Tiler,       one Tiler each,
//!    └──────── ack ◀─────────┘ watermarks          a share of the shards
//!      too_late, too_early, buffer_full, ok
//! ```
//!
//! - [`admission`]: one thread admits each batch whole into the tiles of its
//!   window still open, or refuses it whole, and decides when tiles close, with a shadow [`Tiler`] and the collectors'
//!   watermarks;
//! - [`watermark`]: when a tile may close: every connected collector's
//!   watermark, `max_buffer_past` after its end at the latest;
//! - [`merge`]: the merge threads, each owning a share of the shards;
//! - [`tiler`]: the tiles themselves, one set per storage policy (late and
//!   early data, gauge resolution, expiry);
//! - [`policy`]: storage policies, `resolution:retention`;
//! - [`ownership`]: the shards this instance owns, watched in the placement.

mod admission;
mod merge;
mod metrics;
mod ownership;
mod policy;
mod resends;
mod tiler;
mod watermark;

pub use admission::run_admission;
pub use merge::{MERGE_QUEUE_JOBS, MergeOutput, MergeTier, run_merge_thread};
pub use metrics::TileMetrics;
pub use ownership::watch_ownership;
pub use policy::{DEFAULT_POLICIES, StoragePolicy};
pub use tiler::{ClosedTile, Tiler, TilerSettings, WindowPartials, tables_per_policy};
pub use watermark::{Trigger, Watermarks};
