//! Counters of a placement watcher, as plain atomics: the daemons export
//! them with whatever metrics library they use.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a placement source counts: the `event` label of
/// `<prefix>_placement_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// Placements swapped in (the first one included).
    UpdatesApplied,
    /// Failed etcd requests and broken watch streams.
    EtcdErrors,
    /// Times the watcher connected to etcd again after an error.
    Reconnects,
    /// Times a placement was loaded from the cache file (at start, with etcd unreachable).
    LoadedFromCache,
    /// Placements seen in etcd that failed to decode or validate, and were ignored.
    InvalidPlacements,
    /// Failed writes of the cache file.
    CacheWriteErrors,
}

impl WatchEvent {
    /// Every event, in label order.
    pub const ALL: [WatchEvent; 6] = [
        WatchEvent::UpdatesApplied,
        WatchEvent::EtcdErrors,
        WatchEvent::Reconnects,
        WatchEvent::LoadedFromCache,
        WatchEvent::InvalidPlacements,
        WatchEvent::CacheWriteErrors,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEvent::UpdatesApplied => "updates_applied",
            WatchEvent::EtcdErrors => "etcd_errors",
            WatchEvent::Reconnects => "reconnects",
            WatchEvent::LoadedFromCache => "loaded_from_cache",
            WatchEvent::InvalidPlacements => "invalid_placements",
            WatchEvent::CacheWriteErrors => "cache_write_errors",
        }
    }
}

/// What a placement source has been doing: a counter per [`WatchEvent`], each only grows.
#[derive(Debug, Default)]
pub struct WatchStats([AtomicU64; WatchEvent::ALL.len()]);

impl WatchStats {
    /// Times `event` happened so far.
    pub fn get(&self, event: WatchEvent) -> u64 {
        self.0[event as usize].load(Ordering::Relaxed)
    }

    /// Counts one `event`.
    pub(crate) fn bump(&self, event: WatchEvent) {
        self.0[event as usize].fetch_add(1, Ordering::Relaxed);
    }
}
