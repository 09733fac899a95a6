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
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Growth is refused when it would take the resident memory past this share of the limit.
pub const GROWTH_CEILING: f64 = 0.9;

/// The budget's state; see the [module docs](self).
#[derive(Debug)]
pub struct MemoryBudget {
    limit_bytes: u64,
    used_bytes: AtomicU64,
    shedding: AtomicBool,
}

impl MemoryBudget {
    /// A budget of `limit_bytes`, nothing used, not shedding.
    pub fn new(limit_bytes: u64) -> MemoryBudget {
        MemoryBudget { limit_bytes, used_bytes: AtomicU64::new(0), shedding: AtomicBool::new(false) }
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
