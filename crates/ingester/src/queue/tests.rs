use std::io::{Seek, SeekFrom, Write};

use super::record::{self, Record};
use super::*;

fn options(dir: &std::path::Path, max_queue_bytes: u64, segment_max_bytes: u64) -> QueueOptions {
    QueueOptions::new(dir.to_owned(), max_queue_bytes, segment_max_bytes, FsyncPolicy::Never)
}

fn frame(tile_end_ms: i64, padding: usize) -> Vec<u8> {
    record::encode(&Record { tile_end_ms, source: "x".repeat(padding), ..Default::default() })
}

fn tile_end(read: &ReadRecord) -> i64 {
    record::decode_payload(read.payload.clone()).unwrap().tile_end_ms
}

fn files(dir: &std::path::Path, extension: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| entry.as_ref().unwrap().path().extension().is_some_and(|e| e == extension))
        .count()
}

#[test]
fn reads_in_order_and_deletes_a_segment_only_when_every_record_is_done() {
    let dir = tempfile::tempdir().unwrap();
    // Segments of about two records each.
    let (queue, mut writer, mut reader, replay) =
        open(options(dir.path(), 1 << 20, 250), TargetQueueMetrics::default()).unwrap();
    assert_eq!(replay, Replay::default());
    let mut positions = Vec::new();
    for i in 0..6 {
        positions.push(writer.append(&frame(i, 100)).unwrap());
    }
    assert_eq!(positions.iter().map(|p| p.segment).collect::<Vec<_>>(), vec![1, 1, 2, 2, 3, 3]);
    let mut read = Vec::new();
    for i in 0..6 {
        let record = reader.next_record().unwrap().unwrap();
        assert_eq!(tile_end(&record), i);
        assert_eq!(record.position, positions[i as usize]);
        read.push(record.position);
    }
    assert_eq!(files(dir.path(), "seg"), 3);
    // Out of order: the second record of segment 1 and one of segment 2.
    queue.complete(read[1]);
    queue.complete(read[3]);
    assert_eq!(files(dir.path(), "seg"), 3, "no segment is complete yet");
    queue.complete(read[2]);
    assert_eq!(files(dir.path(), "seg"), 2, "segment 2 is sealed, read and done");
    assert!(!segment::segment_path(dir.path(), 2).exists());
    queue.complete(read[0]);
    assert_eq!(files(dir.path(), "seg"), 1);
    // Segment 3 is still being written: done records stay until it is sealed and read past.
    queue.complete(read[4]);
    queue.complete(read[5]);
    assert_eq!(queue.pending_records(), 0);
    assert_eq!(files(dir.path(), "seg"), 1);
    writer.append(&frame(6, 100)).unwrap();
    writer.append(&frame(7, 100)).unwrap();
    let next = reader.next_record().unwrap().unwrap();
    assert_eq!(next.position.segment, 4);
    assert!(!segment::segment_path(dir.path(), 3).exists(), "segment 3 deleted once the reader moved past it");
}

#[test]
fn replay_cuts_a_torn_tail_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_queue, mut writer, _reader, _) =
            open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
        for i in 0..3 {
            writer.append(&frame(i, 10)).unwrap();
        }
    }
    // A crash in the middle of the fourth append: half its frame reached the file.
    let path = segment::segment_path(dir.path(), 1);
    let whole_len = std::fs::metadata(&path).unwrap().len();
    let fourth = frame(3, 10);
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&fourth[..fourth.len() / 2]).unwrap();
    drop(file);

    let metrics = TargetQueueMetrics::default();
    let (queue, _writer, mut reader, replay) = open(options(dir.path(), 1 << 20, 1 << 20), metrics.clone()).unwrap();
    assert_eq!(replay.records, 3);
    assert_eq!(replay.corrupt, 1);
    assert_eq!(replay.truncated_bytes, (fourth.len() / 2) as u64);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole_len);
    assert_eq!(metrics.replayed_records.get(), 3);
    assert_eq!(metrics.corrupt_records.get(), 1);
    assert_eq!(queue.pending_records(), 3);
    for i in 0..3 {
        assert_eq!(tile_end(&reader.next_record().unwrap().unwrap()), i);
    }
}

#[test]
fn replay_cuts_at_a_checksum_mismatch_and_sets_aside_a_bad_header() {
    let dir = tempfile::tempdir().unwrap();
    let first_len;
    {
        let (_queue, mut writer, _reader, _) =
            open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
        first_len = frame(0, 10).len() as u64;
        for i in 0..3 {
            writer.append(&frame(i, 10)).unwrap();
        }
    }
    let path = segment::segment_path(dir.path(), 1);
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // Flip a payload byte of the second record.
    file.seek(SeekFrom::Start(segment::MAGIC.len() as u64 + first_len + record::HEADER_BYTES as u64 + 2)).unwrap();
    file.write_all(&[0x55]).unwrap();
    drop(file);
    std::fs::write(segment::segment_path(dir.path(), 2), b"not a segment at all").unwrap();

    let (_queue, _writer, mut reader, replay) =
        open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
    assert_eq!(replay.records, 1, "only the record before the damage is kept");
    assert_eq!(replay.corrupt, 2);
    assert!(dir.path().join(format!("{:020}.corrupt", 2)).exists());
    assert_eq!(tile_end(&reader.next_record().unwrap().unwrap()), 0);
}

#[test]
fn refuses_appends_over_the_bound_until_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let one = frame(0, 100).len() as u64;
    let bound = 8 + 3 * one;
    let (queue, mut writer, mut reader, _) =
        open(options(dir.path(), bound, one + 8), TargetQueueMetrics::default()).unwrap();
    let mut accepted = 0;
    let err = loop {
        match writer.append(&frame(accepted, 100)) {
            Ok(_) => accepted += 1,
            Err(error) => break error,
        }
    };
    assert!(matches!(err, AppendError::Full { max, .. } if max == bound), "{err}");
    assert!(queue.bytes() <= bound);
    assert!(accepted >= 2);
    for _ in 0..accepted {
        let record = reader.next_record().unwrap().unwrap();
        queue.complete(record.position);
    }
    // The sealed segments are gone; the bound admits new records again.
    writer.append(&frame(99, 100)).unwrap();
}

#[test]
fn a_record_larger_than_the_bound_is_taken_when_nothing_is_pending() {
    let dir = tempfile::tempdir().unwrap();
    let (_queue, mut writer, _reader, _) =
        open(options(dir.path(), 64, 1 << 20), TargetQueueMetrics::default()).unwrap();
    writer.append(&frame(0, 500)).unwrap();
    assert!(matches!(writer.append(&frame(1, 500)), Err(AppendError::Full { .. })));
}

#[test]
fn the_done_log_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let key = |shard, chunk| RequestKey { shard, chunk, fingerprint: 7 };
    {
        let (queue, mut writer, mut reader, _) =
            open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
        writer.append(&frame(0, 10)).unwrap();
        writer.append(&frame(1, 10)).unwrap();
        let first = reader.next_record().unwrap().unwrap();
        queue.request_done(first.position, key(0, 0));
        queue.request_done(first.position, key(3, 1));
    }
    // A torn last entry is ignored.
    let mut done = std::fs::OpenOptions::new().append(true).open(segment::done_path(dir.path(), 1)).unwrap();
    done.write_all(&[1, 2, 3]).unwrap();
    drop(done);
    let (_queue, _writer, mut reader, replay) =
        open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
    assert_eq!(replay.records, 2);
    let first = reader.next_record().unwrap().unwrap();
    assert_eq!(first.already_done, vec![key(0, 0), key(3, 1)]);
    assert!(reader.next_record().unwrap().unwrap().already_done.is_empty());
}

#[test]
fn the_reader_waits_for_appends_and_stops_when_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, mut writer, mut reader, _) =
        open(options(dir.path(), 1 << 20, 1 << 20), TargetQueueMetrics::default()).unwrap();
    let consumer = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            seen.push(tile_end(&record));
        }
        seen
    });
    for i in 0..5 {
        writer.append(&frame(i, 10)).unwrap();
    }
    while queue.lock().segments.values().map(|s| s.read).sum::<u64>() < 5 {
        std::thread::yield_now();
    }
    queue.close();
    assert_eq!(consumer.join().unwrap(), vec![0, 1, 2, 3, 4]);
}

#[test]
fn done_segments_stay_until_a_checkpoint_covers_them_and_new_ones_are_numbered_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let with_checkpoint = |covers| QueueOptions { checkpointed: Some(covers), ..options(dir.path(), 1 << 20, 250) };
    let (queue, mut writer, mut reader, _) =
        open(with_checkpoint(Position::default()), TargetQueueMetrics::default()).unwrap();
    let mut marks = Vec::new();
    for i in 0..6 {
        writer.append(&frame(i, 100)).unwrap();
        marks.push(writer.appended_through());
    }
    writer.append(&frame(6, 100)).unwrap(); // seals segment 3
    for _ in 0..7 {
        let record = reader.next_record().unwrap().unwrap();
        queue.complete(record.position);
    }
    assert_eq!(queue.pending_records(), 0);
    assert_eq!(files(dir.path(), "seg"), 4, "done, but after the checkpoint (none yet): kept");

    // A checkpoint taken after the third record covers segment 1 and half of segment 2.
    queue.checkpointed(marks[2]);
    assert_eq!(files(dir.path(), "seg"), 3);
    assert!(!segment::segment_path(dir.path(), 1).exists());
    queue.checkpointed(marks[1]);
    assert_eq!(files(dir.path(), "seg"), 3, "an older checkpoint changes nothing");
    // One after the sixth covers segments 2 and 3 whole.
    queue.checkpointed(marks[5]);
    assert_eq!(files(dir.path(), "seg"), 1);
    drop((queue, writer, reader));

    // Restarted with a checkpoint whose segments are gone: new ones come after it.
    for id in segment::list_segments(dir.path()).unwrap() {
        segment::remove(dir.path(), id).unwrap();
    }
    let covers = Position { segment: 9, offset: 500 };
    let (_queue, mut writer, _reader, _) = open(with_checkpoint(covers), TargetQueueMetrics::default()).unwrap();
    assert_eq!(writer.append(&frame(7, 10)).unwrap().segment, 10);
}
