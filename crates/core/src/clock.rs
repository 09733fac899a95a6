//! The one wall clock every tessera crate reads, in the units the wire and the
//! metrics use: unix milliseconds (windows, tiles, placements), unix
//! nanoseconds (receive stamps) and unix seconds (Prometheus timestamps).
//!
//! ```
//! let (ms, ns) = (tessera_core::clock::now_ms(), tessera_core::clock::now_ns());
//! assert!(ms > 1_600_000_000_000 && ns / 1_000_000 >= ms);
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall clock, unix milliseconds (0 before 1970).
#[inline]
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Wall clock, unix nanoseconds (0 before 1970).
#[inline]
pub fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}

/// Wall clock, unix seconds with a fraction, as Prometheus reads timestamps (0 before 1970).
#[inline]
pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |elapsed| elapsed.as_secs_f64())
}
