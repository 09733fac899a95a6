//! Exports a placement source's [`WatchStats`] as Prometheus counters.
//!
//! Every daemon that watches a placement registers one
//! [`WatchStatsCollector`], so the collector and the aggregator report the
//! same counters under their own prefix:
//! `<prefix>_placement_events_total{event="updates_applied"|"etcd_errors"|...}`
//! and `<prefix>_placement_version`.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::handle::PlacementHandle;
use crate::stats::{WatchEvent, WatchStats};

/// `{event}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByEvent {
    event: &'static str,
}

/// A scrape-time view of a placement source's counters and version.
#[derive(Debug)]
pub struct WatchStatsCollector {
    prefix: String,
    stats: Arc<WatchStats>,
    handle: PlacementHandle,
}

impl WatchStatsCollector {
    /// Reports `handle`'s counters as `<prefix>_placement_*`.
    fn new(prefix: &str, handle: PlacementHandle) -> WatchStatsCollector {
        WatchStatsCollector { prefix: prefix.to_owned(), stats: handle.stats(), handle }
    }

    /// Registers `handle`'s counters and version in `registry` under a daemon's metric
    /// prefix (`tessera_collector_`: its trailing `_` is the separator).
    pub fn register(registry: &mut Registry, metric_prefix: &str, handle: &PlacementHandle) {
        let collector = WatchStatsCollector::new(metric_prefix.trim_end_matches('_'), handle.clone());
        registry.register_collector(Box::new(collector));
    }
}

impl Collector for WatchStatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let name = format!("{}_placement_events", self.prefix);
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            &name,
            "Placement source events: updates applied, etcd errors, reconnects, cold starts from the cache file",
            None,
            counter.metric_type(),
        )?;
        for event in WatchEvent::ALL {
            let labels = ByEvent { event: event.as_str() };
            let metric = family.encode_family(&labels)?;
            ConstCounter::new(self.stats.get(event)).encode(metric)?;
        }
        let version = ConstGauge::new(self.handle.version() as i64);
        let version_name = format!("{}_placement_version", self.prefix);
        let gauge =
            encoder.encode_descriptor(&version_name, "Version of the placement in use", None, version.metric_type())?;
        version.encode(gauge)?;
        Ok(())
    }
}
