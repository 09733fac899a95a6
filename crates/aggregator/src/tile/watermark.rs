//! When tiles close: the collectors' watermarks, bounded by `max_buffer_past`.
//!
//! Every partial batch carries its collector's **watermark** on that
//! connection: the end of the newest window the collector has sent in full
//! (collectors send an empty batch for a window with nothing for this
//! aggregator, so an idle collector's watermark moves too). The admission
//! thread keeps one per open connection and closes every tile ending at or
//! before the **horizon**:
//!
//! ```text
//! horizon = max(min(every connection's watermark, now), now - max_buffer_past)
//! ```
//!
//! where a connection that has not reported a watermark (just connected, or
//! a collector too old to send one) counts as `now - buffer_past`, and with
//! no connection at all the horizon is `now - buffer_past`: the fixed delay
//! of an aggregator without watermarks. Two more rules keep a connection
//! from holding too little or too long:
//!
//! - **departed**: when a connection closes, its collector still counts,
//!   as `max(its last watermark, now - buffer_past)`, until it reports a
//!   watermark on a new connection or `max_buffer_past` has passed: a batch
//!   that was in flight when the connection dropped and is sent again on
//!   the next one gets the grace a fixed close would give it. It is
//!   remembered longer, for as long as a tile it may have sent into can be
//!   open (the longest tile and `max_buffer_past`), so that such a tile is
//!   not taken as confirmed ([`Watermarks::confirms`]). A collector that
//!   comes back as another process (another stream in its hello: it was
//!   restarted) does not confirm what its earlier life left unsent: that
//!   one stops holding tiles, and is still remembered;
//! - **silent**: a connection with no batch for `max_buffer_past` (a stopped
//!   process, a half-open connection, a stalled link) holds nothing;
//!   collectors send a batch every window to every aggregator they route to.
//!   It still confirms nothing past its watermark ([`Watermarks::confirms`]):
//!   a stalled link delivers the collector's windows later, and a replica
//!   whose link did not stall may hold them. The intake closes a connection
//!   silent for `idle_timeout_ms` (30 s), which makes it a departed one.
//!
//! So:
//!
//! - when every collector is current, a tile closes as soon as the last one
//!   has sent its last window, sooner than a fixed delay;
//! - when the aggregator is behind and partials wait in front of it, their
//!   senders' watermarks hold the tile open, for up to `max_buffer_past`:
//!   the backlog costs latency, not data;
//! - a stopped or stuck collector holds tiles for `max_buffer_past` at most,
//!   and one that disconnects holds them for `buffer_past` at most.
//!
//! A watermark moves when its batch was admitted or refused for good, never
//! on a retryable refusal (the collector sends that batch again).
//!
//! ```
//! use tessera_aggregator::{Trigger, Watermarks};
//!
//! let now = 100_000;
//! let mut marks = Watermarks::new(2_000, 8_000);
//! assert_eq!(marks.horizon(now), (98_000, Trigger::BufferPast));
//! marks.opened(1, "host-a", 0, now);
//! marks.opened(2, "host-b", 0, now);
//! marks.advance(1, Some(99_000), now);
//! marks.advance(2, Some(95_000), now);
//! assert_eq!(marks.horizon(now), (95_000, Trigger::Watermark));
//! marks.closed(2, now);
//! // host-b's batch in flight gets buffer_past: tiles ending after 98 s wait.
//! assert_eq!(marks.horizon(now), (98_000, Trigger::BufferPast));
//! // Once host-b is back with a watermark, it counts as any connection.
//! marks.opened(3, "host-b", 0, now);
//! marks.advance(3, Some(99_500), now);
//! assert_eq!(marks.horizon(now), (99_000, Trigger::Watermark));
//! // A collector stuck at 80 s holds tiles 8 s past their end at most.
//! marks.opened(4, "host-c", 0, now);
//! marks.advance(4, Some(80_000), now);
//! assert_eq!(marks.horizon(now), (92_000, Trigger::MaxBufferPast));
//! ```

use std::collections::HashMap;

/// What set the horizon: the label of `tessera_aggregator_tile_closes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Every connected collector's watermark passed the tiles' ends.
    Watermark,
    /// A collector's watermark lagged; `max_buffer_past` ran out.
    MaxBufferPast,
    /// No watermark to go by: `buffer_past` after the end.
    BufferPast,
    /// Shutdown closes every open tile.
    Shutdown,
}

impl Trigger {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Watermark => "watermark",
            Trigger::MaxBufferPast => "max_buffer_past",
            Trigger::BufferPast => "buffer_past",
            Trigger::Shutdown => "shutdown",
        }
    }
}

/// One open collector connection.
#[derive(Debug)]
struct Stream {
    source: String,
    /// The collector process' stream of batches to this aggregator (`Hello.stream`, new
    /// with each process; 0: not given).
    incarnation: u64,
    watermark_ms: Option<i64>,
    /// When its last batch (or its opening) was seen, unix ms.
    seen_ms: i64,
}

/// A collector process whose connection closed: its last watermark, and when.
#[derive(Debug, Clone, Copy)]
struct Departed {
    /// Its stream of batches (`Hello.stream`; 0: not given).
    incarnation: u64,
    watermark_ms: Option<i64>,
    closed_ms: i64,
    /// The collector is back as another process: what this one left unsent will never
    /// come, so it holds no tile open, but it confirms nothing past its watermark.
    succeeded: bool,
}

/// The watermark of every open connection; see the module docs (`tile/watermark.rs`).
#[derive(Debug)]
pub struct Watermarks {
    buffer_past_ms: i64,
    max_buffer_past_ms: i64,
    /// How long a departed collector is remembered for [`Watermarks::confirms`].
    departed_kept_ms: i64,
    streams: HashMap<u64, Stream>,
    /// By collector, one per process (a restarted collector may have two).
    departed: HashMap<String, Vec<Departed>>,
}

impl Watermarks {
    /// No connections yet; `buffer_past_ms` applies to connections without
    /// a watermark, `max_buffer_past_ms` bounds how long any tile waits.
    pub fn new(buffer_past_ms: i64, max_buffer_past_ms: i64) -> Watermarks {
        let max_buffer_past_ms = max_buffer_past_ms.max(buffer_past_ms).max(0);
        Watermarks {
            buffer_past_ms: buffer_past_ms.max(0),
            max_buffer_past_ms,
            departed_kept_ms: max_buffer_past_ms,
            streams: HashMap::new(),
            departed: HashMap::new(),
        }
    }

    /// Remembers a departed collector for as long as a tile of `longest_tile_ms` it may
    /// have sent into can be open, so that the tile is not taken as confirmed without it
    /// (found by the fault campaign, seed 61: a collector killed 11 s before a 1 min
    /// tile's end was forgotten 8 s later, and the leader's copy of the tile, which
    /// lacked its last windows, closed confirmed).
    pub fn remembering_departed_for(mut self, longest_tile_ms: i64) -> Watermarks {
        self.departed_kept_ms = self.max_buffer_past_ms.saturating_add(longest_tile_ms.max(0));
        self
    }

    /// How long a departed collector is remembered: as long as a tile it may have sent
    /// into can be open.
    pub fn departed_kept_ms(&self) -> i64 {
        self.departed_kept_ms
    }

    /// A collector (`source`, its instance id) connected as `connection` at `now_ms`, the
    /// process whose stream of batches is `incarnation` (`Hello.stream`; 0: not given).
    pub fn opened(&mut self, connection: u64, source: &str, incarnation: u64, now_ms: i64) {
        let stream = Stream { source: source.to_owned(), incarnation, watermark_ms: None, seen_ms: now_ms };
        self.streams.insert(connection, stream);
    }

    /// The stream of batches (`Hello.stream`) the collector named on `connection`; 0 when
    /// it named none or the connection is not open.
    pub fn stream_of(&self, connection: u64) -> u64 {
        self.streams.get(&connection).map_or(0, |stream| stream.incarnation)
    }

    /// The connection closed at `now_ms`: its collector holds tiles as a
    /// departed one (see the module docs).
    pub fn closed(&mut self, connection: u64, now_ms: i64) {
        if let Some(stream) = self.streams.remove(&connection) {
            let incarnation = stream.incarnation;
            let departed =
                Departed { incarnation, watermark_ms: stream.watermark_ms, closed_ms: now_ms, succeeded: false };
            let lives = self.departed.entry(stream.source).or_default();
            lives.retain(|life| life.incarnation != incarnation);
            lives.push(departed);
        }
    }

    /// A batch on the connection at `now_ms`: it has sent everything ending
    /// at or before `watermark_ms` (when it says). Watermarks only move forward.
    pub fn advance(&mut self, connection: u64, watermark_ms: Option<i64>, now_ms: i64) {
        let Some(stream) = self.streams.get_mut(&connection) else { return };
        stream.seen_ms = now_ms;
        let Some(watermark_ms) = watermark_ms else { return };
        stream.watermark_ms = Some(stream.watermark_ms.map_or(watermark_ms, |held| held.max(watermark_ms)));
        // Back with a watermark: the departed entry of this collector has done its job. An
        // earlier process of it is done holding tiles, but what it left unsent stays
        // unconfirmed.
        if let Some(lives) = self.departed.get_mut(&stream.source) {
            let incarnation = stream.incarnation;
            lives.retain_mut(|life| {
                let restarted = incarnation != 0 && life.incarnation != 0 && life.incarnation != incarnation;
                life.succeeded |= restarted;
                restarted
            });
            if lives.is_empty() {
                self.departed.remove(&stream.source);
            }
        }
    }

    /// When the clock alone next changes what may close, given the end of
    /// the oldest open tile: the admission thread sleeps until then (new
    /// watermarks wake it anyway).
    pub fn next_clock_close_ms(&self, next_tile_end_ms: i64, now_ms: i64) -> i64 {
        let all_report = !self.streams.is_empty()
            && !self.holding_departed(now_ms).any(|_| true)
            && self.streams.values().all(|stream| stream.watermark_ms.is_some());
        let delay = if all_report { self.max_buffer_past_ms } else { self.buffer_past_ms };
        next_tile_end_ms.saturating_add(delay)
    }

    /// Whether every collector that may have sent partials into the tile
    /// `[tile_start_ms, tile_end_ms)` confirmed its end with its watermark: every
    /// collector on an open connection, silent or not, and every one whose connection
    /// closed since `max_buffer_past` before the tile began, has a watermark at or after
    /// the tile's end. A tile closed without that confirmation (on `max_buffer_past`, or
    /// with a collector's link stalled) may lack partials that a replica of the shard set
    /// holds: it is flushed marked incomplete (`flush/leadership.rs`). A collector that
    /// never reports a watermark confirms nothing.
    ///
    /// A silent connection counts however long it has been silent (found reading the
    /// code for fix 16 of the fault campaign): one collector's link into the leader
    /// stalled from before a tile began until after it closed, the others' fine, and the
    /// tile closed confirmed without that collector's windows, which the follower held.
    pub fn confirms(&self, tile_start_ms: i64, tile_end_ms: i64) -> bool {
        let since = tile_start_ms.saturating_sub(self.max_buffer_past_ms);
        let confirmed = |watermark: Option<i64>| watermark.is_some_and(|watermark| watermark >= tile_end_ms);
        self.streams.values().all(|stream| confirmed(stream.watermark_ms))
            && self
                .departed
                .values()
                .flatten()
                .all(|departed| departed.closed_ms < since || confirmed(departed.watermark_ms))
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.streams.len()
    }

    /// Every tile ending at or before the horizon may close at `now_ms`,
    /// and what decided it.
    pub fn horizon(&mut self, now_ms: i64) -> (i64, Trigger) {
        let fixed = (now_ms.saturating_sub(self.buffer_past_ms), Trigger::BufferPast);
        let floor = now_ms.saturating_sub(self.max_buffer_past_ms);
        let forgotten = now_ms.saturating_sub(self.departed_kept_ms);
        self.departed.retain(|_, lives| {
            lives.retain(|life| life.closed_ms > forgotten);
            !lives.is_empty()
        });
        let live =
            self.streams.values().filter(|stream| stream.seen_ms >= floor).map(|stream| match stream.watermark_ms {
                Some(watermark) => (watermark.min(now_ms), Trigger::Watermark),
                None => fixed,
            });
        let departed = self.holding_departed(now_ms).map(|departed| match departed.watermark_ms {
            Some(watermark) if watermark.min(now_ms) > fixed.0 => (watermark.min(now_ms), Trigger::Watermark),
            _ => fixed,
        });
        let slowest = live.chain(departed).min_by_key(|(horizon, _)| *horizon);
        let slowest = match slowest {
            Some(slowest) => slowest,
            // No connection, or every one silent for max_buffer_past: they hold nothing.
            None => fixed,
        };
        if slowest.0 < floor { (floor, Trigger::MaxBufferPast) } else { slowest }
    }

    /// The departed collectors that still hold tiles at `now_ms`: those gone for less
    /// than `max_buffer_past`.
    fn holding_departed(&self, now_ms: i64) -> impl Iterator<Item = &Departed> {
        let floor = now_ms.saturating_sub(self.max_buffer_past_ms);
        self.departed.values().flatten().filter(move |departed| departed.closed_ms > floor && !departed.succeeded)
    }

    /// `(source, now - watermark)` for every connection with a watermark,
    /// the largest lag per source.
    pub fn lags_ms(&self, now_ms: i64) -> Vec<(&str, i64)> {
        let mut lags: Vec<(&str, i64)> = Vec::with_capacity(self.streams.len());
        for stream in self.streams.values() {
            let Some(watermark) = stream.watermark_ms else { continue };
            let lag = now_ms.saturating_sub(watermark);
            match lags.iter_mut().find(|(source, _)| *source == stream.source) {
                Some((_, held)) => *held = (*held).max(lag),
                None => lags.push((&stream.source, lag)),
            }
        }
        lags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 100_000;

    /// Watermarks with 2 s buffer_past and 8 s max_buffer_past, and `connections`
    /// `(connection, source, watermark)` opened at [`NOW`] with a first batch then.
    fn opened_at_now(connections: &[(u64, &str, Option<i64>)]) -> Watermarks {
        let mut marks = Watermarks::new(2_000, 8_000);
        for &(connection, source, watermark_ms) in connections {
            marks.opened(connection, source, 0, NOW);
            marks.advance(connection, watermark_ms, NOW);
        }
        marks
    }

    #[test]
    fn a_connection_without_a_watermark_holds_tiles_for_buffer_past() {
        let mut marks = opened_at_now(&[(1, "new", None), (2, "current", Some(99_500))]);
        assert_eq!(marks.horizon(NOW), (98_000, Trigger::BufferPast));
        marks.advance(1, Some(99_000), NOW);
        assert_eq!(marks.horizon(NOW), (99_000, Trigger::Watermark));
        marks.advance(1, Some(90_000), NOW);
        assert_eq!(marks.horizon(NOW), (99_000, Trigger::Watermark), "watermarks never go back");
    }

    #[test]
    fn a_watermark_ahead_of_our_clock_closes_nothing_that_has_not_ended() {
        let mut marks = opened_at_now(&[(1, "fast-clock", Some(105_000))]);
        assert_eq!(marks.horizon(NOW), (NOW, Trigger::Watermark));
    }

    #[test]
    fn a_departed_collector_holds_for_buffer_past_until_it_is_back_or_max_buffer_past_passed() {
        let mut marks = opened_at_now(&[(1, "a", Some(NOW)), (2, "b", Some(NOW - 1_000))]);
        marks.closed(2, NOW);
        // b's last watermark (99 s) is after now - buffer_past (98 s): it holds the horizon there.
        assert_eq!(marks.horizon(NOW), (99_000, Trigger::Watermark));
        // Later, b's grace is buffer_past: tiles ending after now - 2 s wait for it.
        marks.advance(1, Some(NOW + 5_000), NOW + 5_000);
        assert_eq!(marks.horizon(NOW + 5_000), (NOW + 3_000, Trigger::BufferPast));
        assert_eq!(
            marks.next_clock_close_ms(110_000, NOW + 5_000),
            112_000,
            "the clock closes on buffer_past while b is away"
        );
        // Past max_buffer_past after it left, b holds nothing.
        marks.advance(1, Some(NOW + 8_500), NOW + 8_500);
        assert_eq!(marks.horizon(NOW + 8_500), (NOW + 8_500, Trigger::Watermark));
        assert_eq!(marks.next_clock_close_ms(110_000, NOW + 8_500), 118_000);
    }

    #[test]
    fn a_silent_connection_stops_holding_after_max_buffer_past() {
        let mut marks = opened_at_now(&[(1, "busy", None), (2, "half-open", Some(NOW))]);
        for second in 1..=12 {
            let now = NOW + second * 1_000;
            marks.advance(1, Some(now), now);
            let (horizon, trigger) = marks.horizon(now);
            if second <= 8 {
                // Held by the silent one, down to the max_buffer_past floor.
                assert_eq!(horizon, NOW.max(now - 8_000), "second {second}");
            } else {
                assert_eq!((horizon, trigger), (now, Trigger::Watermark), "second {second}");
            }
        }
        assert_eq!(marks.connections(), 2, "silent connections are ignored, not forgotten");
    }

    #[test]
    fn a_tile_is_confirmed_once_every_collector_connected_or_seen_around_it_has_passed_its_end() {
        let mut marks = opened_at_now(&[(1, "a", Some(NOW)), (2, "b", Some(NOW))]);
        assert!(marks.confirms(NOW - 10_000, NOW));
        assert!(!marks.confirms(NOW, NOW + 10_000), "neither has sent the tile's last window");
        // b's link stalls: a's watermark goes on, b's stays, and b falls silent.
        let later = NOW + 15_000;
        marks.advance(1, Some(later), later);
        assert_eq!(marks.horizon(later).0, later, "b is silent: it holds nothing");
        assert!(!marks.confirms(NOW, NOW + 10_000), "but b has not sent the tile's end: unconfirmed");
        assert!(!marks.confirms(NOW + 5_000, NOW + 15_000), "seen within max_buffer_past before it began");
        // A link stalled since more than max_buffer_past before the tile began may still
        // deliver b's windows of it (fix 16's gap): silent, b confirms nothing.
        assert!(!marks.confirms(NOW + 8_001, NOW + 15_000), "b's link stalled across the whole tile");
        // A collector that left counts as it last stood, for as long as it is remembered.
        marks.advance(2, Some(NOW + 10_000), later);
        assert!(marks.confirms(NOW, NOW + 10_000));
        marks.closed(2, later);
        assert!(!marks.confirms(NOW + 5_000, NOW + 15_000), "b left at 110 s");
        marks.opened(3, "b", 0, later);
        marks.advance(3, Some(NOW + 20_000), later);
        assert!(marks.confirms(NOW + 5_000, NOW + 15_000), "back with a watermark past the end");
        // One that never reports a watermark confirms nothing.
        marks.opened(4, "legacy", 0, later);
        assert!(!marks.confirms(NOW + 5_000, NOW + 15_000));
    }

    /// Fault campaign seed 61: a collector that sent into a 1 min tile was killed 11 s
    /// before its end; forgotten `max_buffer_past` later, it no longer kept the tile
    /// unconfirmed, and the leader's copy, which lacked its last windows, closed confirmed.
    #[test]
    fn a_collector_that_left_during_a_long_tile_keeps_it_unconfirmed_past_max_buffer_past() {
        let mut marks = opened_at_now(&[(1, "a", Some(NOW)), (2, "b", Some(NOW))]);
        marks = marks.remembering_departed_for(60_000);
        marks.advance(2, Some(NOW + 40_000), NOW + 40_500);
        marks.closed(2, NOW + 49_000);
        let end = NOW + 60_000;
        marks.advance(1, Some(end), end);
        // What admission does before closing: b holds nothing any more...
        assert_eq!(marks.horizon(end), (end, Trigger::Watermark));
        assert_eq!(marks.next_clock_close_ms(end + 10_000, end), end + 18_000);
        // ...but it sent into the tile and never confirmed its end.
        assert!(!marks.confirms(NOW, end));
        // Remembered until no tile it may have sent into can still be open.
        marks.advance(1, Some(NOW + 110_000), NOW + 110_000);
        marks.horizon(NOW + 110_000);
        assert!(!marks.confirms(NOW, end));
        marks.horizon(NOW + 49_000 + 68_001);
        assert!(marks.confirms(NOW, end), "forgotten once the longest tile and max_buffer_past passed");
    }

    /// A collector restarted within a tile: its first life's last windows reached one
    /// replica and not the other. Its new life's watermark must not confirm the tile,
    /// or the short copy would go out as whole.
    #[test]
    fn a_collector_back_as_another_process_does_not_confirm_what_its_first_life_left_unsent() {
        let mut marks = Watermarks::new(2_000, 8_000).remembering_departed_for(60_000);
        marks.opened(1, "a", 11, NOW);
        marks.advance(1, Some(NOW + 20_000), NOW + 20_000);
        marks.closed(1, NOW + 22_000);
        marks.opened(2, "a", 12, NOW + 25_000);
        marks.advance(2, Some(NOW + 60_000), NOW + 60_000);
        assert!(!marks.confirms(NOW, NOW + 60_000), "the first life sent nothing past 120 s");
        assert_eq!(marks.horizon(NOW + 60_000), (NOW + 60_000, Trigger::Watermark), "and holds nothing open");
        // The new life leaves in turn: both are remembered.
        marks.closed(2, NOW + 61_000);
        assert!(!marks.confirms(NOW, NOW + 60_000));
        assert!(marks.confirms(NOW + 31_000, NOW + 60_000), "a tile begun max_buffer_past after the first life left");
        // Reconnecting as the same process confirms as before.
        marks.opened(3, "a", 12, NOW + 62_000);
        marks.advance(3, Some(NOW + 62_000), NOW + 62_000);
        assert!(!marks.confirms(NOW, NOW + 60_000), "the first life still");
        marks.horizon(NOW + 22_000 + 68_001);
        assert!(marks.confirms(NOW, NOW + 60_000), "forgotten once no tile it sent into is open");
    }

    #[test]
    fn unknown_connections_are_ignored_and_lags_are_per_source() {
        let mut marks = opened_at_now(&[(1, "a", Some(99_000)), (2, "a", Some(97_000)), (3, "b", None)]);
        marks.advance(7, Some(1), NOW);
        assert_eq!(marks.connections(), 3, "connection 7 was never opened");
        let mut lags = marks.lags_ms(NOW);
        lags.sort();
        assert_eq!(lags, vec![("a", 3_000)]);
        marks.advance(3, Some(NOW), NOW);
        lags = marks.lags_ms(NOW);
        lags.sort();
        assert_eq!(lags, vec![("a", 3_000), ("b", 0)]);
    }
}
