//! The flusher: merges every reader's cut of a window, routes each series
//! to the aggregators that own its shard, and queues one batch per
//! destination.
//!
//! Runs on its own thread. Cuts arrive as readers notice that their window
//! has turned: every reader hands in one cut per window it moves past,
//! empty or not, saying how far it has got. A window is flushed as soon as
//! every reader has moved past it, and at the latest `flush_delay` after it
//! ends. A cut that arrives later still goes out, as its own batch stamped
//! with its window. On shutdown (every reader gone) the flusher sends
//! everything it holds and returns.
//!
//! **Watermark.** The flusher's watermark is the end of the newest window
//! that every reader has moved past and that has been sent in full. Every
//! batch carries it (capped at the batch's own window), and when it moves
//! with nothing to send, every destination of the placement gets an empty
//! batch that carries it. The aggregator closes a tile once every connected
//! collector's watermark has passed the tile's end, so queueing in front of
//! a busy aggregator costs latency, not data, and a reader running late
//! holds the tile instead of losing its cut.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tessera_core::aggregate::{Aggregate, kind_to_proto};
use tessera_core::parse::MetricKind;
use tessera_core::shard::shard_of;
use tessera_core::table::{Table, TableOptions};
use tessera_proto::PartialBatch;
use tessera_proto::partials::{ShardSeries, cut_frames};
use tessera_runtime::shutdown::Shutdown;
use tessera_topology::{PlacementHandle, Routing};

use tessera_wire::outbound::{Batch, GenerationEnd, Refs, SenderSettings, run_sender};

use crate::intake::reader::{Cut, FlusherLinks};
use crate::metrics::Metrics;
use crate::outbound::DestinationQueue;
use crate::outbound::dictionary::{Dictionary, DictionaryWindow, Name};
use tessera_core::clock::now_ms;

/// Settings of the flusher.
#[derive(Clone)]
pub struct FlushSettings {
    /// Window length.
    pub window_ms: i64,
    /// Delay after a window's end before it is flushed.
    pub flush_delay_ms: i64,
    /// Largest frame to build.
    pub max_frame_bytes: usize,
    /// Bound of each destination queue.
    pub max_queue_bytes: usize,
    /// Name series by per-destination dictionary refs ([`dictionary`]).
    pub series_dictionary: bool,
    /// Sender settings.
    pub sender: SenderSettings,
    /// Reader threads handing in cuts: the watermark waits until each has
    /// reported how far it has got.
    pub readers: usize,
}

/// `(instance id, endpoint)`.
type DestinationKey = (String, String);

/// Every destination the flusher has routed to, shared with the daemon so
/// that shutdown can wait for their queues to drain.
#[derive(Clone, Default)]
pub struct Destinations {
    inner: Arc<Mutex<HashMap<DestinationKey, Arc<DestinationQueue>>>>,
}

impl Destinations {
    /// Whether every queue is empty with nothing in flight.
    pub fn all_idle(&self) -> bool {
        self.inner.lock().expect("destinations lock poisoned").values().all(|queue| queue.is_idle())
    }

    /// Drops what is still queued, returning the partials dropped.
    pub fn abandon_all(&self) -> u64 {
        self.inner.lock().expect("destinations lock poisoned").values().map(|queue| queue.abandon().1).sum()
    }
}

/// The routing table of one placement version and the queue of each of its destinations.
struct Routes {
    routing: Arc<Routing>,
    /// Destination queues, indexed like `routing.destinations()`.
    queues: Vec<Arc<DestinationQueue>>,
    /// Each destination's key, indexed the same way.
    keys: Vec<DestinationKey>,
}

/// What the flusher holds for one window: the first reader's cut as is
/// (with one reader, the common case on small hosts, nothing needs
/// merging), or a table merging the cuts of several readers.
enum Window {
    Single(Cut),
    Merged(Table),
}

/// The flusher thread's state.
pub struct Flusher {
    cuts: Receiver<Cut>,
    /// Flushed cuts go back to the readers for reuse.
    spare_cuts: Sender<Cut>,
    windows: BTreeMap<i64, Window>,
    spare_tables: Vec<Table>,
    settings: FlushSettings,
    placement: PlacementHandle,
    routes: Option<Routes>,
    /// Encoded series per destination of `routes`, reused window after window.
    outbound: Vec<Outbound>,
    /// Series dictionaries per destination of `routes`.
    dictionaries: Vec<Dictionary>,
    destinations: Destinations,
    runtime: tokio::runtime::Handle,
    stop_senders: Shutdown,
    metrics: Metrics,
    /// How far each reader has got (`Cut::through_ms`), by reader id.
    readers: HashMap<usize, i64>,
    /// The newest watermark sent to the destinations, unix ms.
    watermark_sent_ms: i64,
}

impl Flusher {
    /// A flusher reading `cuts`; sender tasks are spawned on `runtime` and
    /// stop when `stop_senders` fires.
    pub fn new(
        links: FlusherLinks,
        settings: FlushSettings,
        placement: PlacementHandle,
        destinations: Destinations,
        runtime: tokio::runtime::Handle,
        stop_senders: Shutdown,
        metrics: Metrics,
    ) -> Flusher {
        Flusher {
            cuts: links.cuts,
            spare_cuts: links.spares,
            windows: BTreeMap::new(),
            spare_tables: Vec::new(),
            settings,
            placement,
            routes: None,
            outbound: Vec::new(),
            dictionaries: Vec::new(),
            destinations,
            runtime,
            stop_senders,
            metrics,
            readers: HashMap::new(),
            watermark_sent_ms: i64::MIN,
        }
    }

    /// Runs until every reader has gone, then flushes what is left.
    pub fn run(mut self) {
        loop {
            let timeout = self.time_to_next_flush();
            match self.cuts.recv_timeout(timeout) {
                Ok(cut) => self.merge(cut),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush_due(i64::MAX);
                    return;
                }
            }
            self.flush_due(now_ms());
        }
    }

    fn time_to_next_flush(&self) -> Duration {
        let Some(oldest) = self.windows.keys().next() else { return Duration::from_millis(100) };
        let due = oldest + self.settings.window_ms + self.settings.flush_delay_ms;
        Duration::from_millis((due - now_ms()).clamp(1, 100) as u64)
    }

    fn merge(&mut self, cut: Cut) {
        let through = self.readers.entry(cut.reader).or_insert(cut.through_ms);
        *through = (*through).max(cut.through_ms);
        if cut.entries.is_empty() {
            let _ = self.spare_cuts.try_send(cut);
            return;
        }
        let start = cut.window_start_ms;
        let mut window = match self.windows.remove(&start) {
            None => Window::Single(cut),
            Some(Window::Single(first)) => {
                let mut table = self.spare_table();
                merge_cut(&mut table, &first);
                merge_cut(&mut table, &cut);
                // Merged cuts go back to the readers (or are freed when they hold enough).
                let _ = self.spare_cuts.try_send(first);
                let _ = self.spare_cuts.try_send(cut);
                Window::Merged(table)
            }
            Some(Window::Merged(mut table)) => {
                merge_cut(&mut table, &cut);
                let _ = self.spare_cuts.try_send(cut);
                Window::Merged(table)
            }
        };
        if let Window::Merged(table) = &mut window {
            self.metrics.gauge_order_ambiguous.inc_by(table.take_ambiguous_merges());
        }
        self.windows.insert(start, window);
    }

    fn spare_table(&mut self) -> Table {
        self.spare_tables.pop().unwrap_or_else(|| {
            Table::new(TableOptions { max_series: None, expire_after_idle_cuts: Some(2), ..TableOptions::default() })
        })
    }

    /// Where every reader has got: nothing stamped before it is left in a
    /// reader.
    fn readers_through_ms(&self) -> i64 {
        if self.readers.len() < self.settings.readers {
            return i64::MIN;
        }
        self.readers.values().copied().min().unwrap_or(i64::MIN)
    }

    fn flush_due(&mut self, now: i64) {
        let window_ms = self.settings.window_ms;
        let delay = self.settings.flush_delay_ms;
        let readers_through = self.readers_through_ms();
        while let Some((&start, _)) = self.windows.first_key_value() {
            let complete = start + window_ms <= readers_through;
            if now != i64::MAX && !complete && start + window_ms + delay > now {
                break;
            }
            match self.windows.remove(&start).expect("key just seen") {
                Window::Single(cut) => {
                    self.flush_window(start, |each| {
                        for entry in &cut.entries {
                            each(entry.kind, cut.id(entry), &entry.aggregate);
                        }
                        cut.entries.len()
                    });
                    // When the readers hold enough spares already, this one is freed.
                    let _ = self.spare_cuts.try_send(cut);
                }
                Window::Merged(mut table) => {
                    self.flush_window(start, |each| table.cut(|kind, id, aggregate| each(kind, id, aggregate)).emitted);
                    self.spare_tables.push(table);
                }
            }
        }
        if now == i64::MAX {
            return;
        }
        // Windows with nothing in them moved the watermark: say so, so that
        // the aggregators' watermark of this collector keeps moving.
        let watermark = self.watermark_ms();
        if watermark > self.watermark_sent_ms && watermark != i64::MAX {
            self.announce_window(watermark - window_ms);
        }
    }

    /// The end of the newest window that every reader has moved past and
    /// that has been sent (the oldest window still held bounds it).
    fn watermark_ms(&self) -> i64 {
        let window_ms = self.settings.window_ms;
        let readers_through = self.readers_through_ms();
        let held = self.windows.keys().next().copied().unwrap_or(i64::MAX);
        let through = readers_through.min(held);
        if through == i64::MAX || through == i64::MIN { through } else { through.div_euclid(window_ms) * window_ms }
    }

    /// Sends every destination an empty batch for the window at
    /// `window_start_ms`, carrying the watermark; no flush metrics.
    fn announce_window(&mut self, window_start_ms: i64) {
        self.route_window(window_start_ms, |_| 0);
    }

    /// Routes and queues one window, and records the flush.
    fn flush_window(
        &mut self,
        window_start_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) {
        let started = Instant::now();
        let emitted = self.route_window(window_start_ms, series);
        self.metrics.active_series.set(emitted as i64);
        self.metrics.flush_duration.observe(started.elapsed().as_secs_f64());
        let lag_ms = now_ms() - (window_start_ms + self.settings.window_ms);
        self.metrics.flush_lag.observe(lag_ms.max(0) as f64 / 1000.0);
    }

    /// Routes and queues one window; returns its series. `series` calls its argument once per
    /// series of the window and returns how many there were.
    ///
    /// Each series is encoded once, straight into the shard buffers of the
    /// destinations that own it; frames are then cut from whole buffers.
    fn route_window(
        &mut self,
        window_start_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) -> usize {
        self.refresh_routes();
        let routes = self.routes.as_ref().expect("routes refreshed");
        let num_shards = routes.routing.num_shards();
        let chunk_bytes = self.settings.max_frame_bytes / 2;
        let outbound = &mut self.outbound;
        outbound.resize_with(routes.queues.len(), Outbound::default);
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
                let shard_series = outbound[owner].shard(shard, num_shards);
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
            self.metrics.drop_partials("no_owner", unrouted);
        }
        let version = routes.routing.version();
        // This window is out of `windows` already: what is held now bounds the watermark.
        let watermark_ms = self.watermark_ms().min(window_start_ms + self.settings.window_ms);
        for (destination, outbound) in self.outbound.iter_mut().enumerate() {
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
            enqueue_batches(queue, outbound, header, refs, &self.settings);
            outbound.clear();
        }
        self.watermark_sent_ms = self.watermark_sent_ms.max(watermark_ms);
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
        let queues = keys.iter().map(|(instance, endpoint)| self.destination_queue(instance, endpoint)).collect();
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
            for (instance, endpoint) in previous.into_keys() {
                let queue = self.destination_queue(&instance, &endpoint);
                queue.end_generation(GenerationEnd::Rotated);
                queue.metrics().dictionary_series.set(0);
            }
        }
        tracing::info!(version = routing.version(), destinations = keys.len(), "routing with a new placement");
        self.routes = Some(Routes { routing, queues, keys });
    }

    fn destination_queue(&self, instance: &str, endpoint: &str) -> Arc<DestinationQueue> {
        let mut known = self.destinations.inner.lock().expect("destinations lock poisoned");
        let key = (instance.to_owned(), endpoint.to_owned());
        if let Some(queue) = known.get(&key) {
            return queue.clone();
        }
        let queue = Arc::new(DestinationQueue::new(
            endpoint.to_owned(),
            self.settings.max_queue_bytes,
            self.metrics.destination(instance),
        ));
        let sender = run_sender(queue.clone(), self.settings.sender.clone(), self.stop_senders.clone());
        self.runtime.spawn(sender);
        known.insert(key, queue.clone());
        queue
    }
}

/// One destination's share of the window being flushed: its series,
/// encoded, per shard. Kept between windows so that its buffers are reused.
#[derive(Default)]
struct Outbound {
    /// Indexed by shard number.
    shards: Vec<ShardSeries>,
    /// Shards with series, in the order first seen.
    touched: Vec<u32>,
}

impl Outbound {
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
    outbound: &mut Outbound,
    mut header: PartialBatch,
    refs: Option<Refs>,
    settings: &FlushSettings,
) {
    outbound.touched.sort_unstable();
    let refs = refs.filter(|_| !outbound.touched.is_empty());
    header.dictionary = refs.as_ref().map_or(0, |refs| refs.generation);
    let shards = outbound.touched.iter().map(|&shard| (shard, &outbound.shards[shard as usize]));
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

/// Folds one reader's cut into a window table.
fn merge_cut(table: &mut Table, cut: &Cut) {
    for entry in &cut.entries {
        // Both sides come from our own readers, so kinds always agree.
        if let Err(error) = table.merge(entry.kind, cut.id(entry), &entry.aggregate) {
            tracing::error!(%error, "merging a reader's partial failed");
        }
    }
}

#[cfg(test)]
mod tests;
