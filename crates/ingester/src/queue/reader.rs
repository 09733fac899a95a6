//! The reading side of the queue: records in order, from the oldest segment to the one
//! being written, waiting for appends at the end.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::record;
use super::{Position, Queue, ReadRecord, Shared, segment};

/// Reads records in order; see the [queue docs](super).
pub struct QueueReader {
    pub(super) shared: Arc<Shared>,
    pub(super) segment: Option<u64>,
    pub(super) file: Option<File>,
    pub(super) offset: u64,
}

enum Step {
    Read { segment: u64, end: u64 },
    Advance { from: u64 },
    Wait,
    Closed,
}

impl QueueReader {
    fn queue(&self) -> Queue {
        Queue { shared: self.shared.clone() }
    }

    /// The next record, waiting for one to be appended; `Ok(None)` once the queue is closed.
    pub fn next_record(&mut self) -> io::Result<Option<ReadRecord>> {
        loop {
            match self.step() {
                Step::Closed => return Ok(None),
                Step::Wait => {
                    let queue = self.queue();
                    let state = queue.lock();
                    if !state.closed {
                        let _ = self.shared.wakeup.wait_timeout(state, Duration::from_millis(200));
                    }
                }
                Step::Advance { from } => {
                    self.file = None;
                    let queue = self.queue();
                    let mut state = queue.lock();
                    if let Some(segment) = state.segments.get_mut(&from) {
                        segment.read_all = true;
                    }
                    queue.maybe_delete(&mut state, from);
                    queue.publish(&state);
                    self.segment = state.segments.range(from + 1..).next().map(|(id, _)| *id);
                    self.offset = segment::MAGIC.len() as u64;
                }
                Step::Read { segment, end } => {
                    if let Some(record) = self.read_one(segment, end)? {
                        return Ok(Some(record));
                    }
                }
            }
        }
    }

    fn step(&mut self) -> Step {
        let queue = self.queue();
        let state = queue.lock();
        if state.closed {
            return Step::Closed;
        }
        let id = match self.segment {
            Some(id) => id,
            None => match state.segments.keys().next() {
                Some(id) => {
                    self.segment = Some(*id);
                    self.offset = segment::MAGIC.len() as u64;
                    *id
                }
                None => return Step::Wait,
            },
        };
        let Some(segment) = state.segments.get(&id) else {
            // Only the reader deletes a segment it has not finished; this cannot happen,
            // but moving on is the safe answer.
            return Step::Advance { from: id };
        };
        if self.offset < segment.len {
            Step::Read { segment: id, end: segment.len }
        } else if segment.sealed {
            Step::Advance { from: id }
        } else {
            Step::Wait
        }
    }

    /// Reads the record at the current offset of `segment` (whose committed end is `end`).
    /// A damaged record gives up the rest of the segment, whose records count as done.
    fn read_one(&mut self, segment: u64, end: u64) -> io::Result<Option<ReadRecord>> {
        if self.file.is_none() {
            self.file = Some(File::open(segment::segment_path(&self.shared.options.dir, segment))?);
        }
        let file = self.file.as_ref().expect("opened above");
        let offset = self.offset;
        let mut header = [0u8; record::HEADER_BYTES];
        let damaged = match file.read_exact_at(&mut header, offset) {
            Err(error) => Some(error.to_string()),
            Ok(()) => {
                let (len, crc) = record::parse_header(header);
                let frame_end = offset + (record::HEADER_BYTES + len) as u64;
                if len > self.shared.options.max_record_bytes || frame_end > end {
                    Some(format!("impossible record length {len}"))
                } else {
                    let mut payload = vec![0u8; len];
                    match file.read_exact_at(&mut payload, offset + record::HEADER_BYTES as u64) {
                        Err(error) => Some(error.to_string()),
                        Ok(()) => match record::verify(&payload, crc) {
                            Err(error) => Some(error.to_string()),
                            Ok(()) => {
                                self.offset = frame_end;
                                let queue = self.queue();
                                let mut state = queue.lock();
                                let already_done = match state.segments.get_mut(&segment) {
                                    Some(segment) => {
                                        segment.read += 1;
                                        segment.replayed_done.remove(&offset).unwrap_or_default()
                                    }
                                    None => Vec::new(),
                                };
                                return Ok(Some(ReadRecord {
                                    position: Position { segment, offset },
                                    payload: Bytes::from(payload),
                                    already_done,
                                }));
                            }
                        },
                    }
                }
            }
        };
        let reason = damaged.unwrap_or_default();
        tracing::error!(segment, offset, reason, "damaged queue record; skipping the rest of the segment");
        self.shared.metrics.corrupt_records.inc();
        let queue = self.queue();
        let mut state = queue.lock();
        if let Some(damaged) = state.segments.get_mut(&segment) {
            let lost = damaged.records.saturating_sub(damaged.read);
            damaged.done += lost;
            damaged.read = damaged.records;
            self.offset = damaged.len;
            state.pending_records = state.pending_records.saturating_sub(lost);
        }
        queue.publish(&state);
        Ok(None)
    }
}
