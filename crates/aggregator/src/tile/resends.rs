//! Re-sent batches: each collector batch is admitted at most once.
//!
//! A collector whose acknowledgement does not come within its ack timeout
//! (this aggregator paused, starved, or its answers stalled on the way)
//! reconnects and sends the batch again. The first copy may still be in the
//! old connection's socket buffer, and be read and admitted after all: without
//! this check the window would be merged twice.
//!
//! A collector names its *stream* of batches to this aggregator in its hello
//! (`Hello.stream`: one per collector process and destination, kept across
//! reconnections), and a re-sent batch keeps its sequence in that stream. A
//! batch whose series went by refs of a dictionary that died with its
//! connection is re-sent *expanded*: cut into pieces that name every series
//! in full, with fresh sequences, each carrying the original's
//! (`PartialBatch.expanded_from`). The sender has one batch in flight at a
//! time, in queue order, so per stream the batches admitted come in order of
//! their *key* (the original's sequence, for a piece) and, within one
//! expanded batch, of their own sequence. A batch is a re-send of one already
//! admitted, and is answered as taken without being merged, when:
//!
//! - its key is below the last admitted one (a later batch went in after it);
//! - its key is the last admitted one and that batch was whole (a piece of it,
//!   or itself again);
//! - its key is the last admitted one, that was a piece, and it is the whole
//!   batch (its pieces went in) or a piece at or below that one.
//!
//! A stream's record is forgotten once no batch has been admitted from it for
//! twice as long as a tile can stay open (the longest tile and
//! `max_buffer_past`, [`super::Watermarks::departed_kept_ms`]), and never
//! sooner than [`MIN_REMEMBERED_MS`]: its collector restarted under a new
//! stream, or left. A batch admitted that long ago fed tiles that have all
//! closed, so a copy of it coming now is refused as too late.

use std::collections::HashMap;

/// The least time a stream with no admitted batch is remembered.
pub const MIN_REMEMBERED_MS: i64 = 60_000;

/// A batch as the resend check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Its sequence in its stream.
    pub sequence: u64,
    /// The sequence of the batch it was expanded from; 0 when whole.
    pub expanded_from: u64,
}

impl Sent {
    fn key(self) -> u64 {
        if self.expanded_from == 0 { self.sequence } else { self.expanded_from }
    }

    fn is_piece(self) -> bool {
        self.expanded_from != 0
    }
}

/// The last batch admitted from one stream.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    last: Sent,
    at_ms: i64,
}

/// Each stream's last admitted batch (a connection's stream is the watermarks':
/// [`super::Watermarks::stream_of`]).
#[derive(Debug)]
pub struct Resends {
    admitted: HashMap<u64, Admitted>,
    /// How long a stream with no admitted batch is remembered.
    remembered_ms: i64,
    next_expiry_ms: i64,
}

impl Resends {
    /// No stream yet; a tile stays open for at most `tile_open_ms` (see the module docs).
    pub fn new(tile_open_ms: i64) -> Resends {
        Resends {
            admitted: HashMap::new(),
            remembered_ms: tile_open_ms.saturating_mul(2).max(MIN_REMEMBERED_MS),
            next_expiry_ms: 0,
        }
    }

    /// Whether `batch` of `stream` was admitted already (stream 0: its sender named none,
    /// and its batches are not checked).
    pub fn already_admitted(&self, stream: u64, batch: Sent) -> bool {
        let Some(admitted) = self.admitted.get(&stream).filter(|_| stream != 0) else {
            return false;
        };
        let last = admitted.last;
        match batch.key().cmp(&last.key()) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => !last.is_piece() || !batch.is_piece() || batch.sequence <= last.sequence,
        }
    }

    /// `batch` of `stream` was admitted at `now_ms`.
    pub fn admitted(&mut self, stream: u64, batch: Sent, now_ms: i64) {
        if stream != 0 {
            self.admitted.insert(stream, Admitted { last: batch, at_ms: now_ms });
        }
        if now_ms >= self.next_expiry_ms {
            let remembered_ms = self.remembered_ms;
            self.next_expiry_ms = now_ms + remembered_ms / 4;
            self.admitted.retain(|_, admitted| now_ms - admitted.at_ms < remembered_ms);
        }
    }

    /// Streams remembered.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.admitted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(sequence: u64) -> Sent {
        Sent { sequence, expanded_from: 0 }
    }

    fn piece(sequence: u64, expanded_from: u64) -> Sent {
        Sent { sequence, expanded_from }
    }

    #[test]
    fn a_batch_re_sent_on_a_new_connection_after_it_went_in_is_not_taken_again() {
        let mut resends = Resends::new(0);
        assert!(!resends.already_admitted(7, whole(5)));
        resends.admitted(7, whole(5), 0);
        assert!(resends.already_admitted(7, whole(5)), "the same batch on the new connection");
        assert!(resends.already_admitted(7, whole(4)), "an older one");
        assert!(!resends.already_admitted(7, whole(6)), "the next one");
        assert!(!resends.already_admitted(8, whole(5)), "another stream's sequences are its own");
        resends.admitted(0, whole(1), 0);
        assert!(!resends.already_admitted(0, whole(1)), "a sender that named no stream is not checked");
    }

    #[test]
    fn the_pieces_of_an_admitted_batch_are_not_taken_and_neither_is_it_after_its_pieces() {
        let mut resends = Resends::new(0);
        resends.admitted(7, whole(5), 0);
        // Expanded on the new connection into fresh sequences 9 and 10.
        assert!(resends.already_admitted(7, piece(9, 5)));
        assert!(resends.already_admitted(7, piece(10, 5)));
        // A batch queued behind 5, expanded after it: its pieces go in.
        assert!(!resends.already_admitted(7, piece(11, 6)));

        let mut resends = Resends::new(0);
        resends.admitted(7, piece(9, 5), 0);
        assert!(!resends.already_admitted(7, piece(10, 5)), "the next piece of the same batch");
        assert!(resends.already_admitted(7, whole(5)), "the old connection's copy, read after its first piece");
        assert!(resends.already_admitted(7, piece(9, 5)), "a piece again");
        resends.admitted(7, piece(10, 5), 0);
        assert!(!resends.already_admitted(7, whole(6)), "the batch after it");
    }

    #[test]
    fn a_stream_is_remembered_twice_as_long_as_a_tile_stays_open() {
        let mut resends = Resends::new(10 * 60_000);
        resends.admitted(7, whole(5), 0);
        resends.admitted(8, whole(1), 19 * 60_000);
        assert!(resends.already_admitted(7, whole(5)), "19 minutes on, still remembered");
        // Swept every quarter of that: forgotten by 25 minutes.
        resends.admitted(8, whole(2), 25 * 60_000);
        assert!(!resends.already_admitted(7, whole(5)), "forgotten past 20 minutes");
    }

    #[test]
    fn a_stream_is_forgotten_when_nothing_came_for_a_long_time() {
        let mut resends = Resends::new(0);
        resends.admitted(7, whole(5), 0);
        resends.admitted(8, whole(2), MIN_REMEMBERED_MS - 1);
        assert_eq!(resends.remembered(), 2);
        resends.admitted(8, whole(3), 2 * MIN_REMEMBERED_MS);
        assert_eq!(resends.remembered(), 1, "stream 7 forgotten, stream 8 kept");
        assert!(!resends.already_admitted(7, whole(5)));
        assert!(resends.already_admitted(8, whole(3)));
    }
}
