//! Every daemon's `drops_total{reason, unit}`: what it dropped, why, and in which unit it
//! is counted; its senders, merge threads and readers count there alike.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::labels::ByReasonUnit;

/// A daemon's `drops_total{reason,unit}`.
pub type Drops = Family<ByReasonUnit, Counter>;

/// Adds `count` (when not 0) to `drops_total{reason, unit}`.
pub fn count_drops(drops: &Drops, reason: &'static str, unit: &'static str, count: u64) {
    if count > 0 {
        drops.get_or_create(&ByReasonUnit { reason, unit }).inc_by(count);
    }
}
