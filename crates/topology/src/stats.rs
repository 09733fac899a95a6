//! Counters of a placement watcher, as plain atomics: the daemons export
//! them with whatever metrics library they use.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a placement source has been doing. Every field only grows.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Placements swapped in (the first one included).
    pub updates_applied: AtomicU64,
    /// Failed etcd requests and broken watch streams.
    pub etcd_errors: AtomicU64,
    /// Times the watcher connected to etcd again after an error.
    pub reconnects: AtomicU64,
    /// Times a placement was loaded from the cache file (at start, with etcd unreachable).
    pub loaded_from_cache: AtomicU64,
    /// Placements seen in etcd that failed to decode or validate, and were ignored.
    pub invalid_placements: AtomicU64,
    /// Failed writes of the cache file.
    pub cache_write_errors: AtomicU64,
}

/// A copy of [`WatchStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStatsSnapshot {
    /// See [`WatchStats::updates_applied`].
    pub updates_applied: u64,
    /// See [`WatchStats::etcd_errors`].
    pub etcd_errors: u64,
    /// See [`WatchStats::reconnects`].
    pub reconnects: u64,
    /// See [`WatchStats::loaded_from_cache`].
    pub loaded_from_cache: u64,
    /// See [`WatchStats::invalid_placements`].
    pub invalid_placements: u64,
    /// See [`WatchStats::cache_write_errors`].
    pub cache_write_errors: u64,
}

impl WatchStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> WatchStatsSnapshot {
        WatchStatsSnapshot {
            updates_applied: self.updates_applied.load(Ordering::Relaxed),
            etcd_errors: self.etcd_errors.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            loaded_from_cache: self.loaded_from_cache.load(Ordering::Relaxed),
            invalid_placements: self.invalid_placements.load(Ordering::Relaxed),
            cache_write_errors: self.cache_write_errors.load(Ordering::Relaxed),
        }
    }
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
