//! A memory budget as the hot paths see it: whether to shed new series, and whether a
//! table may grow. The runtime's memory guard (`tessera_runtime::memory`) reads the
//! process' resident memory and updates it; tables and registries only read it.
//!
//! ```
//! use tessera_core::budget::MemoryBudget;
//!
//! let budget = MemoryBudget::new(1000);
//! budget.update(700, false);
//! assert!(!budget.shedding());
//! assert!(budget.would_exceed(201), "700 + 201 is over 90 % of 1000");
//! assert!(!budget.would_exceed(100));
//!
//! // Admission by count: 1000 bytes, 75 % of them, 250 bytes a series: 3 at once.
//! let budget = MemoryBudget::new(1000).with_series_cost(250);
//! assert!((0..3).all(|_| budget.admit_series()) && !budget.admit_series());
//! budget.release_series(1);
//! assert!(budget.admit_series());
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Growth is refused when it would take the resident memory past this share of the limit.
pub const GROWTH_CEILING: f64 = 0.9;

/// The budget's state; see the [module docs](self).
#[derive(Debug)]
pub struct MemoryBudget {
    limit_bytes: u64,
    used_bytes: AtomicU64,
    shedding: AtomicBool,
    /// Most series admitted at once ([`MemoryBudget::with_series_cost`]; `usize::MAX`: no cap).
    series_cap: usize,
    /// Series admitted and not yet released.
    series_held: AtomicUsize,
}

/// With a cost per series, the series admitted at once may take this share of the limit.
pub const SERIES_SHARE: f64 = 0.75;

impl MemoryBudget {
    /// A budget of `limit_bytes`, nothing used, not shedding.
    pub fn new(limit_bytes: u64) -> MemoryBudget {
        MemoryBudget {
            limit_bytes,
            used_bytes: AtomicU64::new(0),
            shedding: AtomicBool::new(false),
            series_cap: usize::MAX,
            series_held: AtomicUsize::new(0),
        }
    }

    /// Caps the series admitted at once at what [`SERIES_SHARE`] of the limit holds at
    /// `bytes_per_series` each: admission by count, for a daemon whose memory per series
    /// comes after it is admitted (an aggregator's tiles fill and flush seconds later), so
    /// that the resident memory read a few times a second warns too late. Tables take a
    /// place with [`MemoryBudget::admit_series`] and give it back with
    /// [`MemoryBudget::release_series`].
    pub fn with_series_cost(mut self, bytes_per_series: u64) -> MemoryBudget {
        self.series_cap = (self.limit_bytes as f64 * SERIES_SHARE / bytes_per_series.max(1) as f64) as usize;
        self
    }

    /// The most series admitted at once, if capped.
    pub fn series_cap(&self) -> Option<usize> {
        (self.series_cap != usize::MAX).then_some(self.series_cap)
    }

    /// Series admitted and not released.
    pub fn series_held(&self) -> usize {
        self.series_held.load(Ordering::Relaxed)
    }

    /// Takes a place for a new series: `false` (and nothing taken) when the cap is reached.
    pub fn admit_series(&self) -> bool {
        self.series_held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| (held < self.series_cap).then_some(held + 1))
            .is_ok()
    }

    /// Gives back the places of `count` series that left.
    pub fn release_series(&self, count: usize) {
        let _ = self
            .series_held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| Some(held.saturating_sub(count)));
    }

    /// The limit, bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// The guard's latest reading: `used_bytes` resident, and whether to shed.
    pub fn update(&self, used_bytes: u64, shedding: bool) {
        self.used_bytes.store(used_bytes, Ordering::Relaxed);
        self.shedding.store(shedding, Ordering::Relaxed);
    }

    /// Whether new series are to be refused now.
    #[inline]
    pub fn shedding(&self) -> bool {
        self.shedding.load(Ordering::Relaxed)
    }

    /// Whether `extra` more bytes (a table about to double) would take the resident
    /// memory past [`GROWTH_CEILING`] of the limit.
    pub fn would_exceed(&self, extra: u64) -> bool {
        let used = self.used_bytes.load(Ordering::Relaxed).saturating_add(extra);
        used as f64 > self.limit_bytes as f64 * GROWTH_CEILING
    }
}
