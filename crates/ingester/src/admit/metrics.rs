//! The admit stage's metrics: tiles that gave no sample (late, duplicate, name
//! collision, ...) and the running totals held in memory.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{SkipReason, SkippedTiles};

/// `{reason}`: why tiles gave no sample.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReason {
    reason: &'static str,
}

tessera_runtime::metrics! {
    /// The admit stage's metrics.
    pub struct AdmitMetrics {
        /// Tiles that gave no sample, per reason
        tiles_skipped: Family<ByReason, Counter> = skip_reasons(),
        /// Series with a running total (counters, sums, counts) in memory
        pub cumulative_series: Gauge,
        /// Native histograms (cumulative sketches) in memory
        pub cumulative_histograms: Gauge,
    }
}

/// Skipped tiles, with every reason exported from the start at 0.
fn skip_reasons() -> Family<ByReason, Counter> {
    let skipped = Family::<ByReason, Counter>::default();
    for reason in SkipReason::ALL {
        let _ = skipped.get_or_create(&ByReason { reason: reason.as_str() });
    }
    skipped
}

impl AdmitMetrics {
    /// Counts the tiles of one batch skipped, per reason.
    pub fn tiles_skipped(&self, skipped: &SkippedTiles) {
        for (reason, tiles) in skipped.by_reason() {
            if tiles > 0 {
                self.tiles_skipped.get_or_create(&ByReason { reason: reason.as_str() }).inc_by(tiles);
            }
        }
    }
}
