//! A reader: one receiving thread's private series table and its window cuts.
//!
//! Every receiving thread (a UDP socket's thread, the Unix socket's thread,
//! the TCP line thread) owns one [`Reader`]: it parses what it receives and
//! folds it into its own [`Table`], so reader threads never contend on the
//! hot path. When the wall clock enters a new window, the reader cuts its
//! table into a [`Cut`] and sends it to the flusher (the window stage,
//! `window.rs`), which merges the cuts of every reader for that window.
//!
//! ```text
//!  datagram ──ingest──▶ Reader.table ──window turns──▶ Cut ──CutLinks.cuts──▶ flusher
//!                                        ▲                                      │
//!                                        └────────── CutLinks.spares ◀──────────┘
//!                                                    (emptied, buffers kept)
//! ```
//!
//! # Order
//!
//! Every datagram carries its receive stamp (unix nanoseconds: the kernel's
//! receive time for UDP, the read time for stream and Unix intake), and a
//! datagram belongs to the window of its stamp. Gauge lines are folded with
//! that stamp, so that the flusher, merging the cuts of readers that each
//! got some of one sender's datagrams, restores the order they were sent
//! in (see [`tessera_core::aggregate::Gauge`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender};
use tessera_core::aggregate::{Aggregate, GaugeDeltas, TimerUnit};
use tessera_core::parse::{MetricKind, ParseOptions};
use tessera_core::table::{Folded, ObserverSource, Table, TableOptions};

use tessera_runtime::telemetry::Drops;
use tessera_runtime::telemetry::count_drops;

use super::metrics::{BatchCounts, IntakeMetrics, ListenerMetrics};

/// The partials one reader held for one window, or a piece of them, and how far it
/// has got.
///
/// A reader hands a window in as pieces of at most [`PIECE_SERIES`] series, the last
/// one with `more` false, so that a window with many series is never copied whole:
/// the flusher routes each piece as it comes where it can, and gives it back.
#[derive(Debug, Default)]
pub struct Cut {
    /// The reader that cut it (unique in the process).
    pub reader: usize,
    /// Start of the window, unix milliseconds.
    pub window_start_ms: i64,
    /// Everything this reader received stamped before this time has been
    /// handed in (with this cut): on the last piece, the start of its window after
    /// the cut, `i64::MAX` once it has stopped; on the others, the window's own start.
    pub through_ms: i64,
    /// Whether more pieces of this window's cut follow.
    pub more: bool,
    /// Canonical ids, back to back; entries index into it.
    pub ids: Vec<u8>,
    /// One entry per series touched in the window.
    pub entries: Vec<CutEntry>,
}

/// One series of a [`Cut`].
#[derive(Debug)]
pub struct CutEntry {
    /// The series' kind.
    pub kind: MetricKind,
    /// Range of the id in [`Cut::ids`].
    pub id_start: u32,
    /// End of the id in [`Cut::ids`].
    pub id_end: u32,
    /// The partial.
    pub aggregate: Aggregate,
}

impl Cut {
    /// The id of `entry`.
    pub fn id(&self, entry: &CutEntry) -> &[u8] {
        &self.ids[entry.id_start as usize..entry.id_end as usize]
    }

    /// Moves the series of `piece` (another piece of the same reader's cut) after these,
    /// leaving it empty.
    pub fn append(&mut self, piece: &mut Cut) {
        let offset = self.ids.len() as u32;
        self.ids.extend_from_slice(&piece.ids);
        piece.ids.clear();
        self.entries.extend(piece.entries.drain(..).map(|entry| CutEntry {
            id_start: entry.id_start + offset,
            id_end: entry.id_end + offset,
            ..entry
        }));
    }
}

/// The two directions between readers and the flusher: cuts go to the
/// flusher, and come back emptied with their buffers kept, so that cutting
/// a window allocates nothing once the buffers have grown to fit it.
#[derive(Debug, Clone)]
pub struct CutLinks {
    /// Where cuts go.
    pub cuts: Sender<Cut>,
    /// Emptied cuts to fill again.
    pub spares: Receiver<Cut>,
}

/// The flusher's ends of [`CutLinks`].
#[derive(Debug)]
pub struct FlusherLinks {
    /// Cuts from the readers.
    pub cuts: Receiver<Cut>,
    /// Where flushed cuts go back.
    pub spares: Sender<Cut>,
}

/// Most series in one piece of a cut (about 900 KB of entries and ids at 23-byte ids).
pub const PIECE_SERIES: usize = 16 * 1024;

/// Links for the readers, and the flusher's ends: room for `capacity` pieces on their
/// way to the flusher, and `spares` emptied pieces kept for reuse (more are freed).
pub fn cut_links(capacity: usize, spares: usize) -> (CutLinks, FlusherLinks) {
    let (cuts, cut_receiver) = crossbeam_channel::bounded(capacity);
    let (spare_sender, spares) = crossbeam_channel::bounded(spares);
    (CutLinks { cuts, spares }, FlusherLinks { cuts: cut_receiver, spares: spare_sender })
}

/// What every reader of a collector shares.
#[derive(Debug, Clone)]
pub struct ReaderSettings {
    /// Window length.
    pub window_ms: i64,
    /// Most series per reader table.
    pub max_series: Option<usize>,
    /// Windows a series may stay idle before it is forgotten.
    pub expire_after_idle_windows: u32,
    /// Parser settings: the line length limit, the name tag styles.
    pub parse_options: ParseOptions,
    /// The unit `|ms` values are kept in.
    pub timer_unit: TimerUnit,
    /// The memory budget: near it, new series are refused.
    pub budget: Option<Arc<tessera_core::budget::MemoryBudget>>,
    /// Origin detection, when on: each reader tags lines with their sender's container.
    pub origins: Option<Arc<crate::intake::origin::Origins>>,
}

/// Reader ids, unique in the process.
static NEXT_READER: AtomicUsize = AtomicUsize::new(0);

/// A reader's table and window state.
pub struct Reader {
    id: usize,
    table: Table,
    window_ms: i64,
    window_start_ms: i64,
    parse_options: ParseOptions,
    links: CutLinks,
    listener: ListenerMetrics,
    metrics: IntakeMetrics,
    drops: Drops,
    counts: BatchCounts,
    /// Series the last cut emitted, and the bytes of an id in it, on average: what the
    /// next cut's buffers are sized for.
    last_emitted: usize,
    bytes_per_id: usize,
    /// Origin detection's side of this reader, when it is on.
    tagger: Option<crate::intake::origin::Tagger>,
}

/// Gives back most of a reused buffer's room when it holds four times what is expected
/// (and more than a few thousand): a burst of series grew it, and it would keep that peak.
fn shrink_spare<T>(buffer: &mut Vec<T>, expected: usize) {
    if buffer.capacity() > 4096 && buffer.capacity() / 4 > expected {
        buffer.shrink_to(expected);
    }
}

impl Reader {
    /// A reader feeding `cuts`.
    pub fn new(
        settings: &ReaderSettings,
        observers: Option<Arc<dyn ObserverSource>>,
        gauge_deltas: GaugeDeltas,
        links: CutLinks,
        listener: ListenerMetrics,
        metrics: IntakeMetrics,
        drops: Drops,
    ) -> Reader {
        let options = TableOptions {
            max_series: settings.max_series,
            expire_after_idle_cuts: Some(settings.expire_after_idle_windows),
            gauge_deltas,
            timer_unit: settings.timer_unit,
        };
        let mut table = match observers {
            Some(source) => Table::new(options).with_observer_source(source),
            None => Table::new(options),
        };
        if let Some(budget) = &settings.budget {
            table = table.with_budget(Arc::clone(budget));
        }
        Reader {
            id: NEXT_READER.fetch_add(1, Ordering::Relaxed),
            table,
            window_ms: settings.window_ms,
            window_start_ms: 0,
            parse_options: settings.parse_options,
            links,
            listener,
            metrics,
            drops,
            counts: BatchCounts::default(),
            last_emitted: 0,
            bytes_per_id: 0,
            tagger: settings.origins.clone().map(crate::intake::origin::Tagger::new),
        }
    }

    /// Cuts the table if `now_ms` is past the current window. Called for
    /// every datagram with its stamp, and on receive timeouts with the clock.
    ///
    /// A time in the window just cut stays in the current one (a datagram
    /// that waited in the socket across the turn); a jump back by more than
    /// a window is the clock being stepped, and starts a window there.
    #[inline]
    pub fn tick(&mut self, now_ms: i64) {
        if now_ms >= self.window_start_ms && now_ms < self.window_start_ms + self.window_ms {
            return;
        }
        let window_start_ms = now_ms - now_ms.rem_euclid(self.window_ms);
        if window_start_ms > self.window_start_ms || window_start_ms < self.window_start_ms - self.window_ms {
            self.cut_through(window_start_ms);
            self.window_start_ms = window_start_ms;
        }
    }

    /// Parses one datagram (or one chunk of whole lines) received at
    /// `stamp_ns` (unix nanoseconds) into the table of its window.
    #[inline]
    pub fn ingest(&mut self, data: &[u8], stamp_ns: i64) {
        self.tick(stamp_ns.div_euclid(1_000_000));
        let metric_lines = |counts: &BatchCounts| counts.lines + counts.series_limit + counts.memory_limit;
        let before = metric_lines(&self.counts);
        let counts = &mut self.counts;
        let table = &mut self.table;
        counts.datagrams += 1;
        counts.bytes += data.len() as u64;
        let each = |folded| match folded {
            Folded::Metric => counts.lines += 1,
            Folded::MetricWithNameTagErrors(skipped) => {
                counts.lines += 1;
                counts.name_tag_errors += u64::from(skipped);
            }
            Folded::TableFull => counts.series_limit += 1,
            Folded::MemoryLimit => counts.memory_limit += 1,
            Folded::Event => counts.events += 1,
            Folded::Rejected(reason) => counts.rejected[reason.index()] += 1,
        };
        match &mut self.tagger {
            None => table.fold_datagram(data, self.parse_options, stamp_ns, each),
            Some(tagger) => {
                table.fold_datagram_from(data, self.parse_options, stamp_ns, tagger, each);
                let left_off = table.take_origin_tags_left_off();
                tagger.finish_datagram(metric_lines(&self.counts) - before, left_off);
            }
        }
    }

    /// [`Reader::ingest`] for a datagram whose sender's PID the socket gave (`None`: it
    /// gave none): with origin detection on, its lines carry their container's tags.
    #[inline]
    pub fn ingest_from(&mut self, data: &[u8], stamp_ns: i64, pid: Option<u32>) {
        if let Some(tagger) = &mut self.tagger {
            tagger.set_sender(pid);
        }
        self.ingest(data, stamp_ns);
    }

    /// Whether origin detection is on for this reader.
    pub fn tags_origins(&self) -> bool {
        self.tagger.is_some()
    }

    /// Records a datagram the kernel truncated: its complete lines are kept
    /// (everything up to the last newline), the cut-off last line is counted.
    pub fn ingest_truncated(&mut self, data: &[u8], stamp_ns: i64) {
        self.counts.truncated += 1;
        let complete = match memchr::memrchr(b'\n', data) {
            Some(last_newline) => &data[..last_newline],
            None => b"",
        };
        self.ingest(complete, stamp_ns);
        // `ingest` counted the datagram; count its real size.
        self.counts.bytes += (data.len() - complete.len()) as u64;
    }

    /// Adds the batch's local counts to the shared metrics.
    pub fn publish_counts(&mut self) {
        let counts = std::mem::take(&mut self.counts);
        self.listener.add(&counts);
        if let Some(tagger) = &mut self.tagger {
            tagger.publish_counts();
        }
    }

    /// Counts a failed receive call of this reader's listener.
    pub fn receive_error(&self) {
        self.listener.receive_error();
    }

    /// Cuts the current window for good: the reader stops.
    pub fn cut(&mut self) {
        self.cut_through(i64::MAX);
    }

    /// Cuts the current window and tells the flusher that nothing stamped
    /// before `through_ms` is left here. The cut goes even when it is empty:
    /// the flusher's watermark waits for every reader ([`crate::window`]).
    /// It goes in pieces of at most [`PIECE_SERIES`] series, each sent as
    /// it fills.
    fn cut_through(&mut self, through_ms: i64) {
        self.publish_counts();
        let Reader { id, table, window_start_ms, links, metrics, drops, last_emitted, bytes_per_id, .. } = self;
        // Room for what the last cut emitted, not for every series the table holds (idle
        // ones emit nothing), up to a piece.
        let expected = (*last_emitted + *last_emitted / 4).min(PIECE_SERIES);
        let id_room = expected * (*bytes_per_id).max(1);
        let piece = || {
            let mut piece = links.spares.try_recv().unwrap_or_default();
            piece.reader = *id;
            piece.window_start_ms = *window_start_ms;
            piece.through_ms = *window_start_ms;
            piece.more = false;
            piece.ids.clear();
            piece.entries.clear();
            // A spare grown by a burst (or merged whole by the flusher) gives its room back.
            shrink_spare(&mut piece.entries, expected);
            shrink_spare(&mut piece.ids, id_room);
            piece.entries.reserve(expected);
            piece
        };
        let send = |piece: Cut| {
            let entries = piece.entries.len();
            if links.cuts.send(piece).is_err() {
                // The flusher is gone: the daemon is shutting down past its grace.
                count_drops(&*drops, "shutdown", "partials", entries as u64);
            }
        };
        let mut cut = piece();
        let mut id_bytes = 0;
        let stats = table.cut(|kind, id, aggregate| {
            if cut.entries.len() == PIECE_SERIES {
                id_bytes += cut.ids.len();
                cut.more = true;
                send(std::mem::replace(&mut cut, piece()));
            }
            let id_start = cut.ids.len() as u32;
            cut.ids.extend_from_slice(id);
            cut.entries.push(CutEntry { kind, id_start, id_end: cut.ids.len() as u32, aggregate: aggregate.clone() });
        });
        id_bytes += cut.ids.len();
        cut.through_ms = through_ms;
        send(cut);
        *last_emitted = stats.emitted;
        *bytes_per_id = id_bytes.checked_div(stats.emitted).unwrap_or(*bytes_per_id);
        metrics.series_expired.inc_by(stats.expired as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: i64 = 1_700_000_000_000;

    #[test]
    fn a_window_of_many_series_goes_in_pieces_the_last_saying_how_far_the_reader_got() {
        let (links, flusher) = cut_links(1024, 4);
        let metrics = IntakeMetrics::default();
        let drops = Drops::default();
        let settings = ReaderSettings {
            window_ms: 1_000,
            max_series: None,
            expire_after_idle_windows: 2,
            parse_options: ParseOptions::default(),
            timer_unit: TimerUnit::default(),
            budget: None,
            origins: None,
        };
        let listener = metrics.listener("udp", &drops);
        let mut reader = Reader::new(&settings, None, GaugeDeltas::default(), links, listener, metrics.clone(), drops);
        let series = 2 * PIECE_SERIES + 5;
        let datagram: String = (0..series).map(|i| format!("s{i}:1|c\n")).collect();
        reader.ingest(datagram.as_bytes(), W * 1_000_000);
        reader.tick(W + 1_000);
        let pieces: Vec<Cut> = flusher.cuts.try_iter().filter(|cut| cut.window_start_ms == W).collect();
        let shape: Vec<(usize, bool, i64)> =
            pieces.iter().map(|piece| (piece.entries.len(), piece.more, piece.through_ms)).collect();
        assert_eq!(shape, vec![(PIECE_SERIES, true, W), (PIECE_SERIES, true, W), (5, false, W + 1_000)]);
        let in_order: Vec<Vec<u8>> =
            pieces.iter().flat_map(|piece| piece.entries.iter().map(move |entry| piece.id(entry).to_vec())).collect();
        let mut distinct = in_order.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), series, "every series once");
        // Put together, the pieces are the whole cut, in order.
        let mut pieces = pieces.into_iter();
        let mut whole = pieces.next().unwrap();
        for mut piece in pieces {
            whole.append(&mut piece);
            assert!(piece.entries.is_empty() && piece.ids.is_empty(), "appending empties the piece");
        }
        let whole_ids: Vec<Vec<u8>> = whole.entries.iter().map(|entry| whole.id(entry).to_vec()).collect();
        assert_eq!(whole_ids, in_order);
    }
}
