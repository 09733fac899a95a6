//! The window stage's metrics: the series a window held, how long merging and routing
//! it took, and how late it went out.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tessera_runtime::telemetry::latency_histogram;

tessera_runtime::metrics! {
    /// The window stage's metrics.
    pub struct WindowMetrics {
        /// Series in the last window, merged over every reader
        pub active_series: Gauge,
        /// Gauge partials of several readers merged without knowing the order of every line
        /// (more than 16 delta stamps per gauge, reader and window, or two sets with one stamp)
        pub gauge_order_ambiguous: Counter,
        /// Timer, histogram and distribution partials of several readers that disagreed on their
        /// fixed buckets (a mapping reload that reached one reader first): the window's value has
        /// no buckets; its count, sum and sketch stay exact
        pub buckets_dropped: Counter,
        /// Time to merge and route one window
        pub flush_duration: Histogram [seconds] = latency_histogram(),
        /// Time from a window's end to its batches being queued
        pub flush_lag: Histogram [seconds] = latency_histogram(),
    }
}
