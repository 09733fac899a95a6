//! The label sets several stages or daemons count by, declared once: typed structs
//! (prometheus-client's `EncodeLabelSet`), encoded in field order, whose values come
//! from closed sets (a reason, a unit, a result) or from the configuration (a target,
//! a storage policy, a resolution). A label set only one place uses stays beside it.
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//! use prometheus_client::metrics::family::Family;
//! use tessera_runtime::telemetry::labels::ByReason;
//!
//! let refused = Family::<ByReason, Counter>::default();
//! refused.get_or_create(&ByReason { reason: "too_late" }).inc();
//! assert_eq!(refused.get_or_create(&ByReason { reason: "too_late" }).get(), 1);
//! ```

use prometheus_client::encoding::EncodeLabelSet;

/// `{reason}`: why something was refused, dropped, closed or skipped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByReason {
    /// The reason, from a closed set.
    pub reason: &'static str,
}

/// `{unit}`: what was counted (`batches`, `series`, `partials`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByUnit {
    /// The unit.
    pub unit: &'static str,
}

/// `{result}`: how an attempt ended (`won`, `lost`; `ok`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByResult {
    /// The result.
    pub result: &'static str,
}

/// `{target}`: a configured sink target of the ingester.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByTarget {
    /// The target's name.
    pub target: String,
}

/// `{resolution}`: a storage policy's resolution (`10s`), as a tile batch names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByResolution {
    /// The resolution.
    pub resolution: String,
}

/// `{reason, unit}`: what a daemon dropped, why, and in which unit it is counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByReasonUnit {
    /// Why (`queue_full`, `rejected`, ...).
    pub reason: &'static str,
    /// What is counted (`batches`, `partials`, `series`, ...).
    pub unit: &'static str,
}
