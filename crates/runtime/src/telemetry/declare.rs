//! Metrics declared once: [`metrics!`](crate::metrics) turns one list of
//! fields, each with its help text, type, optional unit and constructor, into
//! the struct, its `Default` and its registration.
//! A metric is written in one place: add a field and it is exported, named by
//! the rule `<prefix><field>[_<unit>]` (counters get `_total` from the encoder).
//! Metrics a stage keeps handles of per label set (a target, a policy, a
//! destination) are declared with [`labelled_metrics!`](crate::labelled_metrics),
//! which also makes the handles struct and the call that fills it.
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//! use prometheus_client::metrics::family::Family;
//! use prometheus_client::metrics::histogram::Histogram;
//! use tessera_runtime::telemetry::labels::ByReason;
//! use tessera_runtime::telemetry::{Telemetry, latency_histogram};
//!
//! tessera_runtime::metrics! {
//!     /// A stage's metrics.
//!     pub struct StageMetrics {
//!         /// Lines accepted
//!         pub lines_received: Counter,
//!         /// Lines refused, per reason
//!         refused: Family<ByReason, Counter>,
//!         /// Time to flush one window
//!         pub flush_duration: Histogram [seconds] = latency_histogram(),
//!     }
//! }
//!
//! let telemetry = Telemetry::new("x", "test");
//! let metrics = StageMetrics::default();
//! telemetry.with_registry(|registry| metrics.register(registry, "tessera_x_"));
//! metrics.lines_received.inc();
//! let text = telemetry.encode().unwrap();
//! assert!(text.contains("# HELP tessera_x_lines_received Lines accepted."));
//! assert!(text.contains("tessera_x_lines_received_total 1"));
//! assert!(text.contains("# TYPE tessera_x_flush_duration_seconds histogram"));
//! ```

use std::hash::Hash;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// A family with a series for each of `label_sets` from the start, at 0: "nothing
/// dropped (refused, skipped)" reads as 0, not as no data, so alerts and dashboards need
/// no `or vector(0)`. Other label sets appear when they are first counted.
pub fn zeroed_family<S, M>(label_sets: impl IntoIterator<Item = S>) -> Family<S, M>
where
    S: Clone + Hash + Eq,
    M: Default,
{
    let family = Family::<S, M>::default();
    for labels in label_sets {
        let _ = family.get_or_create(&labels);
    }
    family
}

/// The buckets of every request, flush and acknowledgement time: 100 µs to about 26 s.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// The buckets of storage requests, fsyncs and checkpoints, slower than the wire's
/// acknowledgements: 1 ms to about 65 s.
pub fn storage_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// A histogram with the [`storage_buckets`].
pub fn storage_histogram() -> Histogram {
    Histogram::new(storage_buckets())
}

/// The buckets of every lag (end of a window to an event): 10 ms to about 164 s.
pub fn lag_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// Declares a set of metrics once; see the [module docs](crate::telemetry::declare).
///
/// Each field is `/// help` (one or more doc lines, no trailing period: the encoder adds
/// one), an optional visibility, `name: Type`, an optional unit in brackets appended to
/// the exported name (`[seconds]`, `[bytes]`), and an optional `= constructor` (else
/// `Default::default()`). After a `;`, fields in the same form without a unit are sets
/// declared elsewhere (a stage's, the wire's): each has `register(&mut Registry, &str)`
/// and is registered under the same prefix. The struct gets `Clone`, `Default`
/// and `register(registry, prefix)`.
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $help:literal])+
                $fvis:vis $field:ident : $ty:ty $([$unit:ident])? $(= $new:expr)?
            ),* $(,)?
            $(;
                $(
                    $(#[doc = $set_doc:literal])+
                    $set_vis:vis $set:ident : $set_ty:ty $(= $set_new:expr)?
                ),* $(,)?
            )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        $vis struct $name {
            $(
                $(#[doc = $help])+
                $fvis $field: $ty,
            )*
            $($(
                $(#[doc = $set_doc])+
                $set_vis $set: $set_ty,
            )*)?
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                Self {
                    $( $field: $crate::metrics!(@new $ty $(, $new)?), )*
                    $($( $set: $crate::metrics!(@new $set_ty $(, $set_new)?), )*)?
                }
            }
        }

        impl $name {
            /// Registers every metric in `registry` as `prefix` + its name.
            pub fn register(&self, registry: &mut $crate::telemetry::Registry, prefix: &str) {
                $(
                    registry.register(
                        format!("{prefix}{}", $crate::metrics!(@name $field $(, $unit)?)),
                        concat!($($help),+).trim(),
                        self.$field.clone(),
                    );
                )*
                $($( self.$set.register(registry, prefix); )*)?
            }
        }
    };
    (@new $ty:ty) => { <$ty as ::core::default::Default>::default() };
    (@new $ty:ty, $new:expr) => { $new };
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident, $unit:ident) => { concat!(stringify!($field), "_", stringify!($unit)) };
}

/// Declares a set of families that share one label set, and the handles of one label
/// set of them: the families struct (made by [`metrics!`](crate::metrics), so `Clone`,
/// `Default`, `register(registry, prefix)`, and `handles(&labels)`) and the handles struct
/// (`Clone`), from one list.
///
/// Each field is `/// help`, an optional visibility, `handle: Type = metric_name`, an
/// optional unit in brackets appended to the exported name, and an optional
/// `with constructor` (a `fn() -> Type`, for histograms). The families are named by the
/// rule of [`metrics!`](crate::metrics); a stage that keeps a label set's handles asks
/// the families' `handles` for them once, and its hot path holds them.
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// use prometheus_client::metrics::histogram::Histogram;
/// use tessera_runtime::telemetry::labels::ByTarget;
/// use tessera_runtime::telemetry::{Telemetry, storage_histogram};
///
/// tessera_runtime::labelled_metrics! {
///     /// A stage's metrics, per target.
///     pub struct TargetFamilies;
///     /// Handles of one target.
///     pub struct TargetHandles by ByTarget {
///         /// Records written, per target
///         pub written: Counter = records_written,
///         /// Time to write one record, per target
///         pub duration: Histogram = write_duration [seconds] with storage_histogram,
///     }
/// }
///
/// let telemetry = Telemetry::new("x", "test");
/// let families = TargetFamilies::default();
/// telemetry.with_registry(|registry| families.register(registry, "tessera_x_"));
/// let handles = families.handles(&ByTarget { target: "default".to_owned() });
/// handles.written.inc();
/// let text = telemetry.encode().unwrap();
/// assert!(text.contains(r#"tessera_x_records_written_total{target="default"} 1"#), "{text}");
/// assert!(text.contains("# TYPE tessera_x_write_duration_seconds histogram"), "{text}");
/// ```
#[macro_export]
macro_rules! labelled_metrics {
    (
        $(#[$families_meta:meta])*
        $families_vis:vis struct $families:ident;
        $(#[$meta:meta])*
        $vis:vis struct $handles:ident by $labels:ty {
            $(
                $(#[doc = $help:literal])+
                $fvis:vis $field:ident : $ty:ty = $metric:ident $([$unit:ident])? $(with $new:expr)?
            ),* $(,)?
        }
    ) => {
        $crate::metrics! {
            $(#[$families_meta])*
            $families_vis struct $families {
                $(
                    $(#[doc = $help])+
                    $metric: $crate::__prometheus_client::metrics::family::Family<$labels, $ty> $([$unit])?
                        = $crate::labelled_metrics!(@family $($new)?)
                ),*
            }
        }

        impl $families {
            /// The handles of `labels`' series (made, at 0, when first asked for).
            pub fn handles(&self, labels: &$labels) -> $handles {
                $handles { $( $field: self.$metric.get_or_create(labels).clone(), )* }
            }
        }

        $(#[$meta])*
        #[derive(Clone)]
        $vis struct $handles {
            $(
                $(#[doc = $help])+
                $fvis $field: $ty,
            )*
        }
    };
    (@family) => { $crate::__prometheus_client::metrics::family::Family::default() };
    (@family $new:expr) => { $crate::__prometheus_client::metrics::family::Family::new_with_constructor($new) };
}
