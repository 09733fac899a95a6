//! The window stage: the flusher merges every reader's cut of a window,
//! takes its series through the rules (`tessera_rules`: mapping, allow/deny,
//! tag rules, rollups, limits), decides when the window is done, and hands it
//! to the outbound side with the watermark.
//!
//! **Rules.** A window's only cut is rewritten in place with the ids the rules
//! give each series; cuts of several readers are merged into a table under
//! those ids. When two series may now share an id (a rollup, two names mapped
//! to one), the rewritten cut is merged too, so each id goes out once.
//!
//! ```text
//!  readers ──Cut (window, through_ms)──▶ merge ──▶ windows: start ─▶ Single(cut) | Merged(table)
//!     ▲                                                        │
//!     │                                          flush_due: every reader is past it,
//!     │                                          or flush_delay after its end
//!     │                                                        ▼
//!     └──────── emptied cuts (spares) ◀──────────── Router (outbound): route, encode, queue
//! ```
//!
//! Runs on its own thread. Cuts arrive as readers notice that their window
//! has turned: every reader hands in one cut per window it moves past,
//! empty or not, saying how far it has got, in pieces of at most
//! 16 384 series (the readers' `PIECE_SERIES`). With one reader and
//! no rules in force, the pieces of a window are routed as they come and given
//! back at once (the window is never held whole here); otherwise they are put
//! together into the reader's cut first. A window is flushed as soon as
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
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tessera_core::aggregate::Aggregate;
use tessera_core::clock::now_ms;
use tessera_core::parse::MetricKind;
use tessera_core::table::{MergeError, Table, TableOptions};
use tessera_rules::{RuleCache, RuleMetrics, RulesHandle};

use crate::intake::{Cut, CutEntry, FlusherLinks};
use crate::outbound::Router;
pub use metrics::WindowMetrics;

mod metrics;

/// Settings of the flusher.
#[derive(Clone)]
pub struct FlushSettings {
    /// Window length.
    pub window_ms: i64,
    /// Delay after a window's end before it is flushed.
    pub flush_delay_ms: i64,
    /// Reader threads handing in cuts: the watermark waits until each has
    /// reported how far it has got.
    pub readers: usize,
    /// The rules in force, taken for each window.
    pub rules: Arc<RulesHandle>,
    /// How long the rules keep the outcome of a series that is out of the windows, ms.
    pub rules_idle_ms: i64,
}

/// What the flusher holds for one window: the first reader's cut as is
/// (with one reader, the common case on small hosts, nothing needs
/// merging), or a table merging the cuts of several readers.
enum Window {
    Single(Cut),
    Merged(Table),
}

/// A window being routed piece by piece.
struct Stream {
    reader: usize,
    window_start_ms: i64,
    /// Series routed so far.
    emitted: usize,
    /// When its first piece came.
    started: Instant,
}

/// The flusher thread's state.
pub struct Flusher {
    cuts: Receiver<Cut>,
    /// Flushed cuts go back to the readers for reuse.
    spare_cuts: Sender<Cut>,
    windows: BTreeMap<i64, Window>,
    spare_tables: Vec<Table>,
    settings: FlushSettings,
    /// Where each flushed window goes.
    router: Router,
    metrics: WindowMetrics,
    /// How far each reader has got (`Cut::through_ms`), by reader id.
    readers: HashMap<usize, i64>,
    /// The newest watermark sent to the destinations, unix ms.
    watermark_sent_ms: i64,
    /// The rules' outcome of every series, and their counts.
    rules: RuleCache,
    /// The window being routed piece by piece as its only reader hands it in.
    stream: Option<Stream>,
    /// Pieces of a reader's cut put together until its last one comes, by reader id
    /// (where a window cannot be routed piece by piece).
    assembling: HashMap<usize, Cut>,
    /// Buffers a cut is rewritten into by the rules, kept for the next one.
    spare_ids: Vec<u8>,
    spare_entries: Vec<CutEntry>,
    /// The ids one series goes under, as ranges of `spare_ids`.
    targets: Vec<(u32, u32)>,
}

impl Flusher {
    /// A flusher reading the cuts of `links` and handing each window to `router`; the
    /// rules count what they do in `rules`.
    pub fn new(
        links: FlusherLinks,
        settings: FlushSettings,
        router: Router,
        metrics: WindowMetrics,
        rules: RuleMetrics,
    ) -> Flusher {
        let rules = RuleCache::new(settings.rules.clone(), rules, settings.rules_idle_ms);
        Flusher {
            rules,
            spare_ids: Vec::new(),
            spare_entries: Vec::new(),
            targets: Vec::new(),
            cuts: links.cuts,
            spare_cuts: links.spares,
            windows: BTreeMap::new(),
            spare_tables: Vec::new(),
            settings,
            router,
            metrics,
            readers: HashMap::new(),
            watermark_sent_ms: i64::MIN,
            stream: None,
            assembling: HashMap::new(),
        }
    }

    /// Runs until every reader has gone, then flushes what is left.
    pub fn run(mut self) {
        loop {
            let timeout = self.time_to_next_flush();
            match self.cuts.recv_timeout(timeout) {
                Ok(piece) => self.receive(piece),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.close_stream();
                    for (_, assembled) in std::mem::take(&mut self.assembling) {
                        self.merge(assembled);
                    }
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

    /// Takes one piece of a reader's cut ([`Cut::more`]). With one reader and no rules
    /// in force, a window in several pieces is routed piece by piece as they come, each
    /// piece given back at once, so that its series are never held whole here; otherwise
    /// the pieces are put together and the cut merged whole.
    fn receive(&mut self, mut piece: Cut) {
        let streamed = self.stream.as_ref().map(|stream| (stream.reader, stream.window_start_ms));
        if streamed.is_some_and(|streamed| streamed != (piece.reader, piece.window_start_ms)) {
            // The rest of that window will not come (its reader has gone): it goes as is,
            // below a watermark that this piece has not moved yet.
            tracing::warn!(window_start_ms = ?streamed.map(|(_, start)| start), "a window's cut stopped part way; sending what came of it");
            self.close_stream();
        }
        self.note_through(&piece);
        if self.stream.is_some() {
            return self.stream_piece(piece);
        }
        if let Some(mut assembled) = self.assembling.remove(&piece.reader) {
            if assembled.window_start_ms == piece.window_start_ms {
                assembled.append(&mut piece);
                assembled.through_ms = assembled.through_ms.max(piece.through_ms);
                assembled.more = piece.more;
                let _ = self.spare_cuts.try_send(piece);
                if assembled.more {
                    self.assembling.insert(assembled.reader, assembled);
                } else {
                    self.merge(assembled);
                }
                return;
            }
            // Another window: the rest of this one will not come.
            tracing::warn!(
                window_start_ms = assembled.window_start_ms,
                "a window's cut stopped part way; sending what came of it"
            );
            self.merge(assembled);
        }
        if !piece.more {
            return self.merge(piece);
        }
        let streams = self.settings.readers == 1
            && self.router.routes_in_pieces()
            && self.settings.rules.for_window(piece.window_start_ms).is_empty();
        if streams {
            self.router.open_window();
            self.stream = Some(Stream {
                reader: piece.reader,
                window_start_ms: piece.window_start_ms,
                emitted: 0,
                started: Instant::now(),
            });
            self.stream_piece(piece);
        } else {
            self.assembling.insert(piece.reader, piece);
        }
    }

    /// Routes one piece of the window being streamed, and closes the window with its
    /// last piece.
    fn stream_piece(&mut self, piece: Cut) {
        let stream = self.stream.as_mut().expect("a window is being streamed");
        stream.emitted += self.router.route_series(piece.window_start_ms, |each| {
            for entry in &piece.entries {
                each(entry.kind, piece.id(entry), &entry.aggregate);
            }
            piece.entries.len()
        });
        let last = !piece.more;
        let _ = self.spare_cuts.try_send(piece);
        if last {
            self.close_stream();
        }
    }

    /// Queues the window being streamed, with the watermark as it stands.
    fn close_stream(&mut self) {
        let Some(stream) = self.stream.take() else { return };
        self.close_window(stream.window_start_ms);
        self.record_flush(stream.window_start_ms, stream.emitted, stream.started);
    }

    /// Notes how far the reader of `cut` (or of a piece of one) has got.
    fn note_through(&mut self, cut: &Cut) {
        let through = self.readers.entry(cut.reader).or_insert(cut.through_ms);
        *through = (*through).max(cut.through_ms);
    }

    /// Takes a reader's whole cut of a window.
    fn merge(&mut self, cut: Cut) {
        self.note_through(&cut);
        if cut.entries.is_empty() {
            let _ = self.spare_cuts.try_send(cut);
            return;
        }
        let start = cut.window_start_ms;
        let mut window = match self.windows.remove(&start) {
            None => Window::Single(cut),
            Some(Window::Single(first)) => {
                let mut table = self.spare_table();
                self.merge_cut(&mut table, &first);
                self.merge_cut(&mut table, &cut);
                // Merged cuts go back to the readers (or are freed when they hold enough).
                let _ = self.spare_cuts.try_send(first);
                let _ = self.spare_cuts.try_send(cut);
                Window::Merged(table)
            }
            Some(Window::Merged(mut table)) => {
                self.merge_cut(&mut table, &cut);
                let _ = self.spare_cuts.try_send(cut);
                Window::Merged(table)
            }
        };
        if let Window::Merged(table) = &mut window {
            self.metrics.gauge_order_ambiguous.inc_by(table.take_ambiguous_merges());
            self.metrics.buckets_dropped.inc_by(table.take_buckets_dropped());
        }
        self.windows.insert(start, window);
    }

    /// Folds one reader's cut into a window table, each series under the ids the rules
    /// give it.
    fn merge_cut(&mut self, table: &mut Table, cut: &Cut) {
        let Some(mut rules) = self.rules.begin(cut.window_start_ms) else { return merge_cut_as_is(table, cut) };
        for entry in &cut.entries {
            rules.route(entry.kind, cut.id(entry), |target| merge_entry(table, entry.kind, target, &entry.aggregate));
        }
        rules.finish();
    }

    /// Rewrites a window's only cut with the ids the rules give each series; returns
    /// whether two series may now have one id (the cut must then be merged).
    fn apply_rules(&mut self, cut: &mut Cut) -> bool {
        let Some(mut rules) = self.rules.begin(cut.window_start_ms) else { return false };
        let mut ids = std::mem::take(&mut self.spare_ids);
        let mut entries = std::mem::take(&mut self.spare_entries);
        ids.clear();
        entries.clear();
        let targets = &mut self.targets;
        for entry in cut.entries.drain(..) {
            targets.clear();
            rules.route(entry.kind, &cut.ids[entry.id_start as usize..entry.id_end as usize], |target| {
                let id_start = ids.len() as u32;
                ids.extend_from_slice(target);
                targets.push((id_start, ids.len() as u32));
            });
            let Some((&(last_start, last_end), others)) = targets.split_last() else { continue };
            for &(id_start, id_end) in others {
                entries.push(CutEntry { kind: entry.kind, id_start, id_end, aggregate: entry.aggregate.clone() });
            }
            entries.push(CutEntry {
                kind: entry.kind,
                id_start: last_start,
                id_end: last_end,
                aggregate: entry.aggregate,
            });
        }
        let colliding = rules.finish();
        self.spare_ids = std::mem::replace(&mut cut.ids, ids);
        self.spare_entries = std::mem::replace(&mut cut.entries, entries);
        colliding
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
        if self.stream.is_some() {
            // The router holds the streamed window's series: nothing else goes out until
            // its last piece (at most a window's cut away) closes it.
            return;
        }
        let window_ms = self.settings.window_ms;
        let delay = self.settings.flush_delay_ms;
        let readers_through = self.readers_through_ms();
        while let Some((&start, _)) = self.windows.first_key_value() {
            let complete = start + window_ms <= readers_through;
            if now != i64::MAX && !complete && start + window_ms + delay > now {
                break;
            }
            let window = match self.windows.remove(&start).expect("key just seen") {
                Window::Single(mut cut) => {
                    if self.apply_rules(&mut cut) {
                        // Rules gave two series one id: merged, they are one.
                        let mut table = self.spare_table();
                        merge_cut_as_is(&mut table, &cut);
                        let _ = self.spare_cuts.try_send(cut);
                        Window::Merged(table)
                    } else {
                        Window::Single(cut)
                    }
                }
                merged => merged,
            };
            match window {
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
        let streaming = self.stream.as_ref().map(|stream| stream.window_start_ms);
        let assembling = self.assembling.values().map(|cut| cut.window_start_ms);
        let held = self.windows.keys().next().copied().into_iter().chain(streaming).chain(assembling).min();
        let held = held.unwrap_or(i64::MAX);
        let through = readers_through.min(held);
        if through == i64::MAX || through == i64::MIN { through } else { through.div_euclid(window_ms) * window_ms }
    }

    /// Sends every destination an empty batch for the window at
    /// `window_start_ms`, carrying the watermark; no flush metrics.
    fn announce_window(&mut self, window_start_ms: i64) {
        self.send_window(window_start_ms, |_| 0);
    }

    /// Routes and queues one window, and records the flush.
    fn flush_window(
        &mut self,
        window_start_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) {
        let started = Instant::now();
        let emitted = self.send_window(window_start_ms, series);
        self.record_flush(window_start_ms, emitted, started);
    }

    /// Records the flush of a window of `emitted` series begun at `started`.
    fn record_flush(&self, window_start_ms: i64, emitted: usize, started: Instant) {
        self.metrics.active_series.set(emitted as i64);
        self.metrics.flush_duration.observe(started.elapsed().as_secs_f64());
        let lag_ms = now_ms() - (window_start_ms + self.settings.window_ms);
        self.metrics.flush_lag.observe(lag_ms.max(0) as f64 / 1000.0);
    }

    /// Hands one window to the router with the watermark; returns its series.
    fn send_window(
        &mut self,
        window_start_ms: i64,
        series: impl FnOnce(&mut dyn FnMut(MetricKind, &[u8], &Aggregate)) -> usize,
    ) -> usize {
        self.router.open_window();
        let emitted = self.router.route_series(window_start_ms, series);
        self.close_window(window_start_ms);
        emitted
    }

    /// Queues the window at `window_start_ms` routed so far, its last batch carrying the
    /// watermark as it stands, capped at the window's end. The window is out of `windows`
    /// (and no longer streamed) already: what is held now bounds the watermark.
    fn close_window(&mut self, window_start_ms: i64) {
        let watermark_ms = self.watermark_ms().min(window_start_ms + self.settings.window_ms);
        self.router.close_window(window_start_ms, watermark_ms);
        self.watermark_sent_ms = self.watermark_sent_ms.max(watermark_ms);
    }
}

/// Folds a cut into a window table under the ids it has.
fn merge_cut_as_is(table: &mut Table, cut: &Cut) {
    let series = cut.entries.iter().map(|entry| (entry.kind, cut.id(entry), &entry.aggregate));
    table.merge_all(series, merge_failed);
}

fn merge_entry(table: &mut Table, kind: MetricKind, id: &[u8], aggregate: &Aggregate) {
    if let Err(error) = table.merge(kind, id, aggregate) {
        merge_failed(error);
    }
}

/// Both sides come from our own readers, so kinds always agree and the window table has
/// no series cap: a failed merge is a bug, logged.
fn merge_failed(error: MergeError) {
    tracing::error!(%error, "merging a reader's partial failed");
}

#[cfg(test)]
mod tests;
