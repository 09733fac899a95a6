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
//! no connection at all the horizon is `now - buffer_past`: today's fixed
//! delay. So:
//!
//! - when every collector is current, a tile closes as soon as the last one
//!   has sent its last window, sooner than a fixed delay;
//! - when the aggregator is behind and partials wait in front of it, their
//!   senders' watermarks hold the tile open, for up to `max_buffer_past`:
//!   the backlog costs latency, not data;
//! - a stopped or stuck collector holds tiles for `max_buffer_past` at most,
//!   and one that disconnects holds nothing.
//!
//! A watermark moves when its batch was admitted or refused for good, never
//! on a retryable refusal (the collector sends that batch again).
//!
//! ```
//! use tessera_aggregator::watermark::{Trigger, Watermarks};
//!
//! let mut marks = Watermarks::new(2_000, 8_000);
//! assert_eq!(marks.horizon(100_000), (98_000, Trigger::BufferPast));
//! marks.opened(1, "host-a");
//! marks.opened(2, "host-b");
//! marks.advance(1, 99_000);
//! marks.advance(2, 95_000);
//! assert_eq!(marks.horizon(100_000), (95_000, Trigger::Watermark));
//! marks.closed(2);
//! assert_eq!(marks.horizon(100_000), (99_000, Trigger::Watermark));
//! // A collector stuck at 80 s holds tiles 8 s past their end at most.
//! marks.advance(1, 80_000);
//! assert_eq!(marks.horizon(100_000), (99_000, Trigger::Watermark), "watermarks never go back");
//! marks.opened(3, "host-c");
//! marks.advance(3, 80_000);
//! assert_eq!(marks.horizon(100_000), (92_000, Trigger::MaxBufferPast));
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
    watermark_ms: Option<i64>,
}

/// The watermark of every open connection; see the [module docs](self).
#[derive(Debug)]
pub struct Watermarks {
    buffer_past_ms: i64,
    max_buffer_past_ms: i64,
    streams: HashMap<u64, Stream>,
}

impl Watermarks {
    /// No connections yet; `buffer_past_ms` applies to connections without
    /// a watermark, `max_buffer_past_ms` bounds how long any tile waits.
    pub fn new(buffer_past_ms: i64, max_buffer_past_ms: i64) -> Watermarks {
        Watermarks {
            buffer_past_ms: buffer_past_ms.max(0),
            max_buffer_past_ms: max_buffer_past_ms.max(buffer_past_ms).max(0),
            streams: HashMap::new(),
        }
    }

    /// A collector (`source`, its instance id) connected as `connection`.
    pub fn opened(&mut self, connection: u64, source: &str) {
        self.streams.insert(connection, Stream { source: source.to_owned(), watermark_ms: None });
    }

    /// The connection is gone: it holds no tile any more.
    pub fn closed(&mut self, connection: u64) {
        self.streams.remove(&connection);
    }

    /// The connection has sent everything ending at or before
    /// `watermark_ms`. Watermarks only move forward.
    pub fn advance(&mut self, connection: u64, watermark_ms: i64) {
        if let Some(stream) = self.streams.get_mut(&connection) {
            stream.watermark_ms = Some(stream.watermark_ms.map_or(watermark_ms, |held| held.max(watermark_ms)));
        }
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.streams.len()
    }

    /// Every tile ending at or before the horizon may close at `now_ms`,
    /// and what decided it.
    pub fn horizon(&self, now_ms: i64) -> (i64, Trigger) {
        let fixed = (now_ms.saturating_sub(self.buffer_past_ms), Trigger::BufferPast);
        let slowest = self
            .streams
            .values()
            .map(|stream| match stream.watermark_ms {
                Some(watermark) => (watermark.min(now_ms), Trigger::Watermark),
                None => fixed,
            })
            .min_by_key(|(horizon, _)| *horizon)
            .unwrap_or(fixed);
        let floor = now_ms.saturating_sub(self.max_buffer_past_ms);
        if slowest.0 < floor { (floor, Trigger::MaxBufferPast) } else { slowest }
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

    #[test]
    fn a_connection_without_a_watermark_holds_tiles_for_buffer_past() {
        let mut marks = Watermarks::new(2_000, 8_000);
        marks.opened(1, "new");
        marks.opened(2, "current");
        marks.advance(2, 99_500);
        assert_eq!(marks.horizon(100_000), (98_000, Trigger::BufferPast));
        marks.advance(1, 99_000);
        assert_eq!(marks.horizon(100_000), (99_000, Trigger::Watermark));
    }

    #[test]
    fn a_watermark_ahead_of_our_clock_closes_nothing_that_has_not_ended() {
        let mut marks = Watermarks::new(2_000, 8_000);
        marks.opened(1, "fast-clock");
        marks.advance(1, 105_000);
        assert_eq!(marks.horizon(100_000), (100_000, Trigger::Watermark));
    }

    #[test]
    fn unknown_connections_are_ignored_and_lags_are_per_source() {
        let mut marks = Watermarks::new(2_000, 8_000);
        marks.advance(7, 1);
        assert_eq!(marks.connections(), 0);
        marks.opened(1, "a");
        marks.opened(2, "a");
        marks.opened(3, "b");
        marks.advance(1, 99_000);
        marks.advance(2, 97_000);
        let mut lags = marks.lags_ms(100_000);
        lags.sort();
        assert_eq!(lags, vec![("a", 3_000)]);
        marks.advance(3, 100_000);
        lags = marks.lags_ms(100_000);
        lags.sort();
        assert_eq!(lags, vec![("a", 3_000), ("b", 0)]);
    }
}
