//! Routing and encoding: one window's series, each encoded once into the
//! shard buffers of every aggregator that owns its shard, then cut into
//! frames and queued per destination.
//!
//! ```text
//!  series (kind, id, aggregate) ──shard_of(id)──▶ owners in the placement (every replica)
//!        │                                                 │
//!        ▼                                                 ▼
//!  one destination's Share: shard ─▶ ShardSeries   (id, or a dictionary ref)
//!        │ window done
//!        ▼
//!  frames of whole shard chunks (≤ max_frame_bytes) ──▶ that destination's queue
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use tessera_core::aggregate::{Aggregate, kind_to_proto};
use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_proto::PartialBatch;
use tessera_proto::partials::{ShardSeries, cut_frames};
use tessera_topology::{PlacementHandle, Routing};
use tessera_wire::{Batch, GenerationEnd, Refs};

use super::dictionary::{Dictionary, DictionaryWindow, Name};
use super::{DestinationKey, DestinationQueue, Destinations, OutboundSettings};
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::count_drops;

/// The routing table of one placement version and the queue of each of its destinations.
struct Routes {
    routing: Arc<Routing>,
    /// Destination queues, indexed like `routing.destinations()`.
    queues: Vec<Arc<DestinationQueue>>,
    /// Each destination's key, indexed the same way.
    keys: Vec<DestinationKey>,
}

/// Routes, encodes and queues windows for the aggregators of the current placement.
pub struct Router {
    settings: OutboundSettings,
    placement: PlacementHandle,
    routes: Option<Routes>,
    /// Encoded series per destination of `routes`, reused window after window.
    shares: Vec<Share>,
    /// Series dictionaries per destination of `routes`.
    dictionaries: Vec<Dictionary>,
    destinations: Destinations,
    /// Where partials no aggregator owns are counted.
    drops: Drops,
}

impl Router {
    /// A router for the destinations of `placement`; their queues and senders go into
    /// `destinations` as they are routed to, and partials no aggregator owns are counted
    /// in `drops`.
    pub fn new(
        settings: OutboundSettings,
        placement: PlacementHandle,
        destinations: Destinations,
        drops: Drops,
    ) -> Router {
        Router { settings, placement, routes: None, shares: Vec::new(), dictionaries: Vec::new(), destinations, drops }
    }

    /// The queue of `key`'s aggregator (its metrics labelled by instance id).
    fn queue(&self, key: &DestinationKey) -> Arc<DestinationQueue> {
        self.destinations.queue_of(key, &key.1, &key.0)
    }

    /// Routes and queues the window at `window_start_ms`, its batches
    /// carrying `watermark_ms`; returns its series. `series` calls its
    /// argument once per series of the window and returns how many there were.
    ///
    /// Each series is encoded once, straight into the shard buffers of the
    /// destinations that own it; frames are then cut from whole buffers.
    pub fn route_window(
        &mut self,
        window_start_ms: i64,
        watermark_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) -> usize {
        self.refresh_routes();
        let routes = self.routes.as_ref().expect("routes refreshed");
        let num_shards = routes.routing.num_shards();
        let chunk_bytes = self.settings.max_frame_bytes / 2;
        let shares = &mut self.shares;
        shares.resize_with(routes.queues.len(), Share::default);
        let mut windows: Vec<DictionaryWindow<'_>> = if self.settings.series_dictionary {
            self.dictionaries.iter_mut().zip(&routes.queues).map(|(dictionary, queue)| dictionary.open(queue)).collect()
        } else {
            Vec::new()
        };
        let mut unrouted = 0u64;
        let emitted = series(&mut |kind, id, aggregate| {
            let shard = shard_of(id, num_shards);
            let mut owners = routes.routing.owners(shard, window_start_ms).peekable();
            if owners.peek().is_none() {
                unrouted += 1;
                return;
            }
            let value = aggregate.to_proto();
            let metric_type = kind_to_proto(kind) as i32;
            for owner in owners {
                let shard_series = shares[owner].shard(shard, num_shards);
                match windows.get_mut(owner).and_then(|window| window.name(metric_type, id)) {
                    Some(Name { series_ref, define: true }) => {
                        shard_series.push(chunk_bytes, id, metric_type, &value, series_ref)
                    }
                    Some(Name { series_ref, define: false }) => {
                        shard_series.push(chunk_bytes, b"", 0, &value, series_ref)
                    }
                    None => shard_series.push(chunk_bytes, id, metric_type, &value, 0),
                }
            }
        });
        drop(windows);
        if unrouted > 0 {
            count_drops(&self.drops, "no_owner", "partials", unrouted);
        }
        let version = routes.routing.version();
        for (destination, share) in self.shares.iter_mut().enumerate() {
            let queue = &routes.queues[destination];
            // Dictionaries exist only with `series_dictionary` on.
            let refs = self.dictionaries.get(destination).map(|dictionary| {
                queue.metrics().dictionary_series.set(dictionary.len() as i64);
                Refs { generation: dictionary.generation(), expand: dictionary.ids() }
            });
            let header = PartialBatch {
                source: self.settings.sender.source.clone(),
                sequence: 0,
                window_start_ms,
                window_ms: self.settings.window_ms as u32,
                placement_version: version,
                shards: Vec::new(),
                // 0 on the wire: no watermark yet (no reader has reported).
                watermark_ms: watermark_ms.max(0),
                dictionary: 0,
            };
            enqueue_batches(queue, share, header, refs, &self.settings);
            share.clear();
        }
        emitted
    }

    /// Rebuilds the routing table when the placement version changed.
    fn refresh_routes(&mut self) {
        let routing = self.placement.routing();
        if self.routes.as_ref().is_some_and(|routes| Arc::ptr_eq(&routes.routing, &routing)) {
            return;
        }
        let keys: Vec<DestinationKey> = routing
            .destinations()
            .iter()
            .map(|destination| (destination.instance_id.clone(), destination.endpoint.clone()))
            .collect();
        let queues = keys.iter().map(|key| self.queue(key)).collect();
        let old = self.routes.take();
        if self.settings.series_dictionary {
            // Dictionaries follow their destinations from one placement to the next.
            let mut previous: HashMap<DestinationKey, Dictionary> = match old {
                Some(old) => old.keys.into_iter().zip(self.dictionaries.drain(..)).collect(),
                None => HashMap::new(),
            };
            let max_frame_bytes = self.settings.max_frame_bytes;
            self.dictionaries = keys
                .iter()
                .map(|key| previous.remove(key).unwrap_or_else(|| Dictionary::new(max_frame_bytes)))
                .collect();
            // A destination that left takes its dictionary (and its memory) with it;
            // should it come back, its refs start over in a new generation.
            for key in previous.into_keys() {
                let queue = self.queue(&key);
                queue.end_generation(GenerationEnd::Rotated);
                queue.metrics().dictionary_series.set(0);
            }
        }
        tracing::info!(version = routing.version(), destinations = keys.len(), "routing with a new placement");
        self.routes = Some(Routes { routing, queues, keys });
    }
}

/// One destination's share of the window being flushed: its series,
/// encoded, per shard. Kept between windows so that its buffers are reused.
#[derive(Default)]
struct Share {
    /// Indexed by shard number.
    shards: Vec<ShardSeries>,
    /// Shards with series, in the order first seen.
    touched: Vec<u32>,
}

impl Share {
    #[inline]
    fn shard(&mut self, shard: u32, num_shards: u32) -> &mut ShardSeries {
        if self.shards.len() < num_shards as usize {
            self.shards.resize_with(num_shards as usize, ShardSeries::default);
        }
        let series = &mut self.shards[shard as usize];
        if series.is_empty() {
            self.touched.push(shard);
        }
        series
    }

    fn clear(&mut self) {
        for shard in self.touched.drain(..) {
            self.shards[shard as usize].clear();
        }
    }
}

/// Cuts one destination's share of a window into frames of whole shard
/// chunks under the size budget, shards in order, and queues them; an
/// empty share is one frame with no shards, which uses no refs.
fn enqueue_batches(
    queue: &DestinationQueue,
    share: &mut Share,
    mut header: PartialBatch,
    refs: Option<Refs>,
    settings: &OutboundSettings,
) {
    share.touched.sort_unstable();
    let refs = refs.filter(|_| !share.touched.is_empty());
    header.dictionary = refs.as_ref().map_or(0, |refs| refs.generation);
    let shards = share.touched.iter().map(|&shard| (shard, &share.shards[shard as usize]));
    let mut batches = Vec::new();
    cut_frames(
        &header,
        shards,
        settings.max_frame_bytes / 2,
        &mut || queue.next_sequence(),
        |sequence, frame, items| {
            batches.push(Batch { sequence, frame, items, refs: refs.clone() });
        },
    );
    queue.push_all(batches);
}
