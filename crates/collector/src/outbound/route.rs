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

/// A destination's share of the window being routed is queued as frames once it holds
/// this much (or half a frame, if less): the window's series are then held here a few
/// megabytes at a time, beside the frames on their way.
const EARLY_FRAME_BYTES: usize = 2 << 20;

/// The routing table of one placement version and the queue of each of its destinations.
struct Routes {
    routing: Arc<Routing>,
    /// Destination queues, indexed like `routing.destinations()`.
    queues: Vec<Arc<DestinationQueue>>,
    /// Each destination's key, indexed the same way.
    keys: Vec<DestinationKey>,
}

/// Routes, encodes and queues windows for the aggregators of the current placement.
///
/// A window is routed as [`Router::open_window`], then [`Router::route_series`] (once, or
/// once a piece with [`Router::routes_in_pieces`]), then [`Router::close_window`]. Each
/// series is encoded once, straight into the shard buffers of the destinations that own
/// it; frames are cut from those buffers.
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
    /// Whether a window is open (between [`Router::open_window`] and [`Router::close_window`]).
    open: bool,
    /// The newest watermark queued: what frames queued before their window is done carry.
    claimed_ms: i64,
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
        Router {
            settings,
            placement,
            routes: None,
            shares: Vec::new(),
            dictionaries: Vec::new(),
            destinations,
            drops,
            open: false,
            claimed_ms: 0,
        }
    }

    /// The queue of `key`'s aggregator (its metrics labelled by instance id).
    fn queue(&self, key: &DestinationKey) -> Arc<DestinationQueue> {
        self.destinations.queue_of(key, &key.1, &key.0)
    }

    /// Whether a window may be routed in pieces ([`Router::route_series`] called more
    /// than once between [`Router::open_window`] and [`Router::close_window`]): not with
    /// series dictionaries, which open once per window.
    pub fn routes_in_pieces(&self) -> bool {
        !self.settings.series_dictionary
    }

    /// Starts a window: the placement in force now routes all of it. One window at a
    /// time: the shares hold its series until it is closed.
    pub fn open_window(&mut self) {
        debug_assert!(!self.open, "a window is open already: its series would go out with another");
        self.open = true;
        self.refresh_routes();
        let destinations = self.routes.as_ref().expect("routes refreshed").queues.len();
        self.shares.resize_with(destinations, Share::default);
    }

    /// Encodes series of the open window at `window_start_ms` into the destinations'
    /// shares (all of them, or with [`Router::routes_in_pieces`] one piece of them);
    /// returns how many `series` gave.
    ///
    /// Without series dictionaries, a destination's share that reaches a frame's budget
    /// is cut into frames and queued at once, so that a window is never held whole
    /// here as well as in its frames. Those frames claim no more than the watermark
    /// already sent: only the window's last frame moves it.
    pub fn route_series(
        &mut self,
        window_start_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) -> usize {
        let Router { settings, routes, shares, dictionaries, claimed_ms, .. } = self;
        let routes = routes.as_ref().expect("a window is open");
        let num_shards = routes.routing.num_shards();
        let version = routes.routing.version();
        let chunk_bytes = settings.max_frame_bytes / 2;
        let early_frame_bytes = chunk_bytes.min(EARLY_FRAME_BYTES);
        let mut windows: Vec<DictionaryWindow<'_>> = if settings.series_dictionary {
            dictionaries.iter_mut().zip(&routes.queues).map(|(dictionary, queue)| dictionary.open(queue)).collect()
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
                let share = &mut shares[owner];
                let shard_series = share.shard(shard, num_shards);
                share.bytes += match windows.get_mut(owner).and_then(|window| window.name(metric_type, id)) {
                    Some(Name { series_ref, define: true }) => {
                        shard_series.push(chunk_bytes, id, metric_type, &value, series_ref)
                    }
                    Some(Name { series_ref, define: false }) => {
                        shard_series.push(chunk_bytes, b"", 0, &value, series_ref)
                    }
                    None => shard_series.push(chunk_bytes, id, metric_type, &value, 0),
                };
                if share.bytes >= early_frame_bytes && windows.is_empty() {
                    let header = batch_header(settings, window_start_ms, version, (*claimed_ms).min(window_start_ms));
                    enqueue_batches(&routes.queues[owner], share, header, None, settings);
                }
            }
        });
        drop(windows);
        if unrouted > 0 {
            count_drops(&self.drops, "no_owner", "partials", unrouted);
        }
        emitted
    }

    /// Cuts the open window into frames and queues them, the last of each destination
    /// carrying `watermark_ms`.
    pub fn close_window(&mut self, window_start_ms: i64, watermark_ms: i64) {
        self.open = false;
        let routes = self.routes.as_ref().expect("a window is open");
        let version = routes.routing.version();
        for (destination, share) in self.shares.iter_mut().enumerate() {
            let queue = &routes.queues[destination];
            // Dictionaries exist only with `series_dictionary` on.
            let refs = self.dictionaries.get(destination).map(|dictionary| {
                queue.metrics().dictionary_series.set(dictionary.len() as i64);
                Refs { generation: dictionary.generation(), expand: dictionary.ids() }
            });
            let header = batch_header(&self.settings, window_start_ms, version, watermark_ms);
            enqueue_batches(queue, share, header, refs, &self.settings);
        }
        self.claimed_ms = self.claimed_ms.max(watermark_ms);
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
/// encoded, per shard. The chunks go with the window's frames (each freed once
/// framed); the table of shards is kept from one window to the next.
#[derive(Default)]
struct Share {
    /// Indexed by shard number.
    shards: Vec<ShardSeries>,
    /// Shards with series, in the order first seen.
    touched: Vec<u32>,
    /// Bytes of series held.
    bytes: usize,
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
        self.bytes = 0;
    }
}

/// The header of a batch of the window at `window_start_ms` routed with placement
/// `version`, carrying `watermark_ms`.
fn batch_header(settings: &OutboundSettings, window_start_ms: i64, version: u64, watermark_ms: i64) -> PartialBatch {
    PartialBatch {
        source: settings.sender.source.clone(),
        sequence: 0,
        window_start_ms,
        window_ms: settings.window_ms as u32,
        placement_version: version,
        shards: Vec::new(),
        // 0 on the wire: no watermark yet (no reader has reported).
        watermark_ms: watermark_ms.max(0),
        dictionary: 0,
        expanded_from: 0,
    }
}

/// One chunk of encoded series taken out of a share, and how many series it holds.
type OwnedChunk = (Vec<u8>, u64);

/// Cuts one destination's share of a window into frames of whole shard
/// chunks under the size budget, shards in order, queues them, and empties the
/// share; an empty share is one frame with no shards, which uses no refs.
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
    // The chunks are taken out, and each freed once framed: the window's encoded series
    // and its frames are never both held whole.
    let shards: Vec<(u32, Vec<OwnedChunk>)> =
        share.touched.iter().map(|&shard| (shard, share.shards[shard as usize].drain_chunks().collect())).collect();
    let mut batches = Vec::new();
    cut_frames(
        &header,
        shards,
        settings.max_frame_bytes / 2,
        &mut || queue.next_sequence(),
        |sequence, frame, items| {
            batches.push(Batch { sequence, frame, items, refs: refs.clone(), owner_refused: false });
        },
    );
    queue.push_all(batches);
    share.clear();
}
