//! Outbound: the sender towards ingesters, one bounded [`OutboundQueue`] and one long-lived
//! sender task ([`tessera_wire::run_sender`]) per ingester.
//!
//! Where tiles go depends on `[ingester]` in the config:
//!
//! - **`placement`** (the ingesters' own placement, static or in etcd):
//!   every series value of a tile goes to the one ingester owning the
//!   series' shard (`murmur3(series id) % num_shards` over the ingesters'
//!   shards, at the tile's start, cutover and cutoff applied), so one tile's
//!   batches may go to several ingesters and a series always has one writer.
//!   Queues are made as destinations appear. When a destination leaves the
//!   placement (an operator removed it, or the ingesters failed it over when
//!   its lease expired), [`run_rerouter`] takes the batches still queued for
//!   it, splits their series by the current placement and queues them for
//!   the new owners, so nothing that was not acknowledged is lost. A tile
//!   being sent ([`Ingesters::send_tile`]) re-routes them first, under the
//!   same lock: a departed ingester's older tile reaches the new owner before
//!   the newer tile routed to it (its total, adopted from the tile after a
//!   failover, takes a tile from before its first as the old owner's,
//!   written: rerouted after it, the older tile would go nowhere).
//! - **`endpoints`** (a fixed list): every batch of one tile goes to one
//!   endpoint, the connected one with the fewest bytes queued.
//!
//! ```text
//!  closed tile ──assign──▶ shard → owner ──▶ queue ing-1 ──▶ sender ──▶ ing-1
//!                                       └──▶ queue ing-2 ──▶ sender ──▶ ing-2
//!  ing-2 leaves the placement: queue ing-2 ──rerouter──▶ split ──▶ queues of the new owners
//! ```
//!
//! Backpressure: [`Ingesters::has_room`] is false once a queue that tiles
//! go to is at its bound (with a fixed list: once every queue is), and the
//! admission then refuses collectors' batches as `retryable` (`buffer_full`)
//! instead of accepting data it could not deliver. A tile that closes into
//! a full queue still goes in, pushing out the oldest batches (dropped and
//! counted).
//!
//! The queue and sender are the shared sending side
//! ([`tessera_wire::run_sender`]), as in the collector's forwarding.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLockReadGuard};
use std::time::Duration;

use tessera_core::shard::shard_of;
use tessera_proto::{Frame, SeriesValue, TileBatch, frame::Body, framing};
use tessera_runtime::Shutdown;
use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::count_drops;
use tessera_topology::{Destination, PlacementHandle, Routing};
use tessera_wire::{Batch, DestinationEntry, Destinations, Redirect, SenderSettings};

mod encode;
mod metrics;

pub use encode::{TileHead, encode_values};
pub use metrics::RoutingMetrics;

/// One ingester endpoint's bounded buffer of framed tile batches.
pub type OutboundQueue = tessera_wire::DestinationQueue;

/// One ingester's queue, and whether it left the placement.
type Entry = DestinationEntry<Destination>;

/// A heartbeat for an idle ingester connection: an empty tile batch, sequence 0. The
/// ingester acknowledges it without queueing anything.
pub fn heartbeat_frame() -> Vec<u8> {
    let frame =
        tessera_proto::Frame { body: Some(tessera_proto::frame::Body::Tiles(tessera_proto::TileBatch::default())) };
    tessera_proto::framing::encode_frame(&frame, tessera_proto::framing::DEFAULT_MAX_FRAME_BYTES)
        .expect("an empty tile batch is far under the frame limit")
}

struct Inner {
    /// The ingesters' placement; `None`: a fixed list of endpoints.
    placement: Option<PlacementHandle>,
    /// Every ingester's queue and sender, made as destinations appear; departed when
    /// the destination left the placement.
    destinations: Destinations<Destination>,
    next: AtomicUsize,
    /// Room a queue must have left to count as having room (one frame).
    headroom: AtomicUsize,
    /// The placement generation the queues were last matched against.
    seen_generation: AtomicU64,
    /// How a departed destination's batches are re-routed ([`Ingesters::rerouting`]).
    reroute: OnceLock<Reroute>,
    /// Held while batches are re-routed and while a tile is routed and queued, so that
    /// re-routed batches are queued before a newer tile's.
    routing_order: Mutex<()>,
    metrics: RoutingMetrics,
    /// Where series and batches that cannot be delivered are counted.
    drops: Drops,
}

/// The queues of every ingester, and where each tile's series go.
#[derive(Clone)]
pub struct Ingesters {
    inner: Arc<Inner>,
}

/// A tile's series values for one queue.
pub struct Share {
    /// Index of the queue (see [`Ingesters::queue`]).
    pub queue: usize,
    /// The values.
    pub values: Vec<SeriesValue>,
}

impl Ingesters {
    /// One queue per endpoint, each bounded at `max_queue_bytes`; a tile goes to one of
    /// them. What cannot be delivered is counted in `drops`.
    pub fn new(endpoints: &[String], max_queue_bytes: usize, metrics: &RoutingMetrics, drops: &Drops) -> Ingesters {
        let ingesters = Ingesters::with(None, max_queue_bytes, metrics, drops);
        for endpoint in endpoints {
            ingesters.queue_for(&Destination { instance_id: endpoint.clone(), endpoint: endpoint.clone() });
        }
        ingesters
    }

    /// Queues made as the ingesters' `placement` names them; each series goes to its owner.
    pub fn placed(
        placement: PlacementHandle,
        max_queue_bytes: usize,
        metrics: &RoutingMetrics,
        drops: &Drops,
    ) -> Ingesters {
        let ingesters = Ingesters::with(Some(placement.clone()), max_queue_bytes, metrics, drops);
        ingesters.current_routing(&placement);
        ingesters
    }

    fn with(
        placement: Option<PlacementHandle>,
        max_queue_bytes: usize,
        metrics: &RoutingMetrics,
        drops: &Drops,
    ) -> Ingesters {
        Ingesters {
            inner: Arc::new(Inner {
                placement,
                destinations: Destinations::new(max_queue_bytes, metrics.senders.clone(), drops.clone()),
                next: AtomicUsize::default(),
                headroom: AtomicUsize::default(),
                seen_generation: AtomicU64::default(),
                reroute: OnceLock::new(),
                routing_order: Mutex::new(()),
                metrics: metrics.clone(),
                drops: drops.clone(),
            }),
        }
    }

    /// A queue has room only while one more batch of `bytes` fits under its bound.
    /// Without it a queue kept just under its bound by dropping its oldest batches
    /// would never look full, and collectors would never be pushed back.
    pub fn reserving(self, bytes: usize) -> Ingesters {
        self.inner.headroom.store(bytes, Ordering::Relaxed);
        self
    }

    /// Spawns one sender per queue on the current runtime, and later one per queue
    /// made; they stop when `stop` fires.
    ///
    /// With a placement, a batch an ingester refuses as `placement_stale` is routed again
    /// ([`redirect`](Self::redirect)) rather than sent to it again.
    pub fn spawn_senders(&self, settings: &SenderSettings, stop: &Shutdown) {
        let mut settings = settings.clone();
        if self.inner.placement.is_some() {
            let ingesters = Arc::downgrade(&self.inner);
            settings.redirect = Some(Redirect(Arc::new(move |batch| match ingesters.upgrade() {
                Some(inner) => Ingesters { inner }.redirect(batch),
                None => Err(batch),
            })));
        }
        self.inner.destinations.start_senders(&settings, stop);
    }

    fn entries(&self) -> RwLockReadGuard<'_, Vec<Arc<Entry>>> {
        self.inner.destinations.entries()
    }

    /// The queue of `destination`, made (with its sender) if new; returns its index.
    fn queue_for(&self, destination: &Destination) -> usize {
        let (index, new) = self.inner.destinations.add(destination, &destination.endpoint, &destination.endpoint);
        if new {
            tracing::info!(instance = %destination.instance_id, endpoint = %destination.endpoint, "new ingester destination");
        }
        index
    }

    /// The placement's routing table; when the placement changed since the last look (one
    /// atomic load when it did not), the queues are matched against it first.
    fn current_routing(&self, placement: &PlacementHandle) -> Arc<Routing> {
        // The generation is read first: a change in between is taken in now and again next time.
        // Marked seen only after the refresh, so that a caller racing this one (the flusher
        // and the rerouter) refreshes too rather than going on with stale departed flags;
        // refreshing twice does no harm.
        let generation = placement.generation();
        let routing = placement.routing();
        if self.inner.seen_generation.load(Ordering::Acquire) != generation {
            self.refresh(&routing);
            self.inner.seen_generation.store(generation, Ordering::Release);
        }
        routing
    }

    /// Marks which queues' destinations are in `routing` and makes queues for new ones.
    fn refresh(&self, routing: &Routing) {
        for destination in routing.destinations() {
            self.queue_for(destination);
        }
        let mut current = 0;
        for entry in self.entries().iter() {
            let departed = !routing.destinations().contains(&entry.key);
            current += usize::from(!departed);
            if entry.set_departed(departed) {
                tracing::info!(
                    instance = %entry.key.instance_id,
                    endpoint = %entry.key.endpoint,
                    departed,
                    "ingester destination {}",
                    if departed { "left the placement" } else { "is back in the placement" }
                );
            }
        }
        self.inner.metrics.ingester_destinations.set(current as i64);
        self.inner.metrics.ingester_placement_version.set(routing.version() as i64);
    }

    /// Every queue, by index.
    #[cfg(test)]
    pub fn queues(&self) -> Vec<Arc<OutboundQueue>> {
        self.entries().iter().map(|entry| entry.queue.clone()).collect()
    }

    /// The queue at `index`.
    pub fn queue(&self, index: usize) -> Option<Arc<OutboundQueue>> {
        self.entries().get(index).map(|entry| entry.queue.clone())
    }

    /// Whether the next tile can be taken: with a placement, every queue of a
    /// destination in it has room for one more batch; with a fixed list, some queue has.
    pub fn has_room(&self) -> bool {
        let headroom = self.inner.headroom.load(Ordering::Relaxed);
        let entries = self.entries();
        let mut live = entries.iter().filter(|entry| !entry.is_departed());
        match self.inner.placement {
            Some(_) => live.all(|entry| entry.queue.has_room_for(headroom)),
            None => live.any(|entry| entry.queue.has_room_for(headroom)),
        }
    }

    /// Splits a tile's `values` by the queue each goes to; returns the shares and
    /// the values no ingester owns (placement without an owner for their shard).
    pub fn assign(&self, values: Vec<SeriesValue>, tile_start_ms: i64) -> (Vec<Share>, u64) {
        let Some(placement) = &self.inner.placement else {
            return (vec![Share { queue: self.pick_index(), values }], 0);
        };
        let routing = self.current_routing(placement);
        self.split(&routing, values, tile_start_ms)
    }

    fn split(&self, routing: &Routing, values: Vec<SeriesValue>, tile_start_ms: i64) -> (Vec<Share>, u64) {
        let num_shards = routing.num_shards();
        let mut by_destination: Vec<Vec<SeriesValue>> = vec![Vec::new(); routing.destinations().len()];
        let mut unowned = 0u64;
        for value in values {
            let shard = shard_of(&value.series_id, num_shards);
            match routing.owners(shard, tile_start_ms).next() {
                Some(owner) => by_destination[owner].push(value),
                None => unowned += 1,
            }
        }
        let shares = by_destination
            .into_iter()
            .enumerate()
            .filter(|(_, values)| !values.is_empty())
            .map(|(destination, values)| Share { queue: self.queue_for(&routing.destinations()[destination]), values })
            .collect();
        (shares, unowned)
    }

    /// Encodes `share` of the tile `head` describes into batches under `max_frame_bytes`
    /// and queues them; returns the queue and the last batch's sequence (`None` when
    /// nothing was queued). A value over the frame bound is dropped and counted.
    pub fn queue_share(
        &self,
        head: &TileHead<'_>,
        share: Share,
        source: &str,
        max_frame_bytes: usize,
    ) -> Option<(usize, u64)> {
        let queue = self.queue(share.queue)?;
        let (batches, too_large) =
            encode_values(head, share.values, source, max_frame_bytes, &mut || queue.next_sequence());
        count_drops(&self.inner.drops, "too_large", "series", too_large);
        let last_sequence = batches.last()?.sequence;
        queue.push_all(batches);
        Some((share.queue, last_sequence))
    }

    /// With a fixed list: the queue the next tile goes to, connected first, then
    /// fewest bytes, ties taken in turn.
    pub fn pick_index(&self) -> usize {
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let entries = self.entries();
        let count = entries.len();
        (0..count)
            .map(|offset| (start + offset) % count)
            .min_by_key(|&index| (!entries[index].queue.is_connected(), entries[index].queue.queued_bytes()))
            .expect("config validation requires at least one ingester endpoint")
    }

    /// Whether every queue is empty with nothing in flight.
    pub fn all_idle(&self) -> bool {
        self.inner.destinations.all_idle()
    }

    /// Drops what is still queued; returns the batches and series dropped.
    pub fn abandon_all(&self) -> (u64, u64) {
        self.inner.destinations.abandon_all()
    }

    /// Routes a tile's `values` (the tile `head` describes, starting at `tile_start_ms`) and
    /// queues each share; hands `queued` each queue and its last batch's sequence, and the
    /// placement version it routed by (0: a fixed list), and returns the values no ingester
    /// owns. With a placement and the re-router running, the
    /// batches still queued for departed destinations are re-routed first, by the same
    /// routing the tile is split by (see the [module docs](self)). `queued` runs under the
    /// same lock, before any re-routing can move the tile's batches: the flusher records
    /// them there for the flush marks, so a re-routing finds them recorded.
    pub fn send_tile(
        &self,
        head: &TileHead<'_>,
        values: Vec<SeriesValue>,
        tile_start_ms: i64,
        (source, max_frame_bytes): (&str, usize),
        queued: impl FnOnce(Vec<(usize, u64)>, u64),
    ) -> u64 {
        let _order = self.inner.routing_order.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (shares, unowned, version) = match &self.inner.placement {
            Some(placement) => {
                let routing = self.current_routing(placement);
                if let Some(reroute) = self.inner.reroute.get() {
                    self.reroute_departed_in_order(&routing, reroute);
                }
                let (shares, unowned) = self.split(&routing, values, tile_start_ms);
                (shares, unowned, routing.version())
            }
            None => {
                let (shares, unowned) = self.assign(values, tile_start_ms);
                (shares, unowned, 0)
            }
        };
        let head = TileHead { placement_version: version, ..*head };
        queued(
            shares.into_iter().filter_map(|share| self.queue_share(&head, share, source, max_frame_bytes)).collect(),
            version,
        );
        unowned
    }

    /// Sets how a departed destination's batches are re-routed, by [`run_rerouter`] and by
    /// [`send_tile`](Self::send_tile) before each tile; until then neither re-routes. The
    /// first call counts.
    pub fn rerouting(&self, reroute: Reroute) {
        let _ = self.inner.reroute.set(reroute);
    }

    /// Moves the batches queued for destinations that left the placement to the
    /// current owners of their series; returns the batches moved (none before
    /// [`rerouting`](Self::rerouting)).
    pub fn reroute_departed(&self) -> u64 {
        let (Some(placement), Some(reroute)) = (&self.inner.placement, self.inner.reroute.get()) else { return 0 };
        let _order = self.inner.routing_order.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let routing = self.current_routing(placement);
        self.reroute_departed_in_order(&routing, reroute)
    }

    /// [`reroute_departed`](Self::reroute_departed), under the routing order's lock.
    fn reroute_departed_in_order(&self, routing: &Routing, reroute: &Reroute) -> u64 {
        let departed: Vec<Arc<Entry>> = self.entries().iter().filter(|entry| entry.is_departed()).cloned().collect();
        let mut moved = 0;
        for entry in departed {
            for batch in entry.queue.take_queued() {
                moved += 1;
                self.reroute_batch(routing, batch, reroute);
            }
        }
        moved
    }

    fn reroute_batch(&self, routing: &Routing, batch: Batch, reroute: &Reroute) {
        if let Some(mut tiles) = self.decode_queued(&batch) {
            tiles.owner_refused |= batch.owner_refused;
            self.reroute_tiles(routing, tiles, reroute);
        }
    }

    /// The tile batch a queued frame holds; `None` (dropped and counted) if it does not decode.
    fn decode_queued(&self, batch: &Batch) -> Option<TileBatch> {
        match framing::decode_frame(&batch.frame, usize::MAX) {
            Ok(Some((Frame { body: Some(Body::Tiles(tiles)) }, _))) => Some(tiles),
            _ => {
                // Only this process encodes these frames: this is a bug, counted, not a peer's fault.
                tracing::error!(series = batch.items, "a queued tile batch does not decode; dropped");
                count_drops(&self.inner.drops, "unroutable", "series", batch.items);
                None
            }
        }
    }

    /// Routes a batch an ingester refused as `placement_stale` (routed under a placement
    /// that no longer gives it some of the batch's series) again, by the current placement,
    /// in the routing order: `Err` with the batch when this aggregator has not seen a newer
    /// placement than the one it was routed under yet (it waits, and goes again), or does
    /// not re-route.
    pub fn redirect(&self, batch: Batch) -> Result<(), Batch> {
        let (Some(placement), Some(reroute)) = (&self.inner.placement, self.inner.reroute.get()) else {
            return Err(batch);
        };
        let _order = self.inner.routing_order.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let routing = self.current_routing(placement);
        let Some(mut tiles) = self.decode_queued(&batch) else { return Ok(()) };
        if tiles.placement_version >= routing.version() {
            return Err(batch);
        }
        tiles.owner_refused |= batch.owner_refused;
        self.inner.metrics.redirected_batches.inc();
        self.reroute_tiles(&routing, tiles, reroute);
        Ok(())
    }

    fn reroute_tiles(&self, routing: &Routing, tiles: TileBatch, reroute: &Reroute) {
        let metrics = &self.inner.metrics;
        let TileBatch {
            storage_policy,
            resolution_ms,
            tile_end_ms,
            tiles: values,
            flushed_at_ms,
            incomplete,
            completes_version,
            owner_refused,
            ..
        } = tiles;
        let series = values.len() as u64;
        let tile_start_ms = tile_end_ms - i64::from(resolution_ms);
        let (shares, unowned) = self.split(routing, values, tile_start_ms);
        count_drops(&self.inner.drops, "no_ingester", "series", unowned);
        let head = TileHead {
            storage_policy: &storage_policy,
            resolution_ms,
            tile_end_ms,
            flushed_at_ms,
            incomplete,
            placement_version: routing.version(),
            completes_version,
            owner_refused,
        };
        for share in shares {
            if let Some((queue, last_sequence)) =
                self.queue_share(&head, share, &reroute.source, reroute.max_frame_bytes)
            {
                (reroute.on_rerouted)(&storage_policy, tile_end_ms, queue, last_sequence);
            }
        }
        metrics.rerouted("batches", 1);
        metrics.rerouted("series", series);
    }
}

/// Told of each re-routed share: storage policy, tile end, queue, last sequence.
pub type OnRerouted = Arc<dyn Fn(&str, i64, usize, u64) + Send + Sync>;

/// What re-routing encodes with.
#[derive(Clone)]
pub struct Reroute {
    /// This aggregator's id, written in every tile batch.
    pub source: String,
    /// Largest frame sent to an ingester.
    pub max_frame_bytes: usize,
    /// Told where re-routed tiles went (storage policy, tile end, queue, last sequence),
    /// for the flush marks ([`Leadership::rerouted`](crate::flush::Leadership::rerouted)).
    pub on_rerouted: OnRerouted,
}

/// How often the re-router looks for departed destinations.
pub const REROUTE_TICK: Duration = Duration::from_millis(250);

/// Re-routes departed destinations' batches every [`REROUTE_TICK`] until `stop` fires, as
/// [`Ingesters::rerouting`] says.
pub async fn run_rerouter(ingesters: Ingesters, stop: Shutdown) {
    loop {
        tokio::select! {
            () = stop.wait() => return,
            () = tokio::time::sleep(REROUTE_TICK) => {}
        }
        let ingesters = ingesters.clone();
        // Decoding and encoding a departed ingester's backlog is CPU work: off the async workers.
        let moved = tokio::task::spawn_blocking(move || ingesters.reroute_departed()).await.unwrap_or(0);
        if moved > 0 {
            tracing::info!(batches = moved, "re-routed tile batches of a departed ingester to the new owners");
        }
    }
}

#[cfg(test)]
mod tests;
