//! Segment files on disk: names, the header, the start-up scan that finds and truncates a
//! torn or corrupt tail, and the done log.
//!
//! A segment `<id>.seg` (id zero-padded to 20 digits, so names sort like ids) starts with
//! the 8-byte header [`MAGIC`], then holds framed records ([`super::record`]) back to
//! back. Its done log `<id>.done` holds fixed 24-byte entries, one per sink request that
//! reached storage: record offset (u64), shard (u32), chunk (u32), split fingerprint
//! (u32), CRC32 of those 20 bytes (u32), all little-endian. A torn entry fails its CRC
//! and is ignored; losing one only means that request is sent again after a restart.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::record;

/// The first bytes of every segment file: format name and version.
pub const MAGIC: [u8; 8] = *b"TSQSEG\x00\x01";

/// Bytes of a done-log entry.
pub const DONE_ENTRY_BYTES: usize = 24;

/// Identifies one sink request of a record: which worker shard and which chunk of it,
/// under which split (a fingerprint of the worker count and the request size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestKey {
    /// Worker shard the request went to.
    pub shard: u32,
    /// Index of the chunk within the shard's samples of the record.
    pub chunk: u32,
    /// Fingerprint of the split parameters.
    pub fingerprint: u32,
}

/// Path of segment `id` in `dir`.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// Path of segment `id`'s done log in `dir`.
pub fn done_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.done"))
}

/// The ids of the segment files in `dir`, in order.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(".seg").and_then(|stem| stem.parse::<u64>().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Creates segment `id` with its header, fsynced with its directory when `durable`; on any
/// failure nothing is left behind.
pub fn create(dir: &Path, id: u64, durable: bool) -> io::Result<File> {
    let path = segment_path(dir, id);
    let mut file = OpenOptions::new().create_new(true).read(true).write(true).open(&path)?;
    let made = file.write_all(&MAGIC).and_then(|()| match durable {
        true => file.sync_all().and_then(|()| sync_dir(dir)),
        false => Ok(()),
    });
    if let Err(error) = made {
        // A full or failing disk: leave no half-made segment behind, or the next try would
        // find it in the way (`create_new`) and the queue could never rotate again.
        drop(file);
        let _ = std::fs::remove_file(&path);
        return Err(error);
    }
    Ok(file)
}

/// What the start-up scan found in one segment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Whole, checksummed records.
    pub records: u64,
    /// Bytes kept (header and whole records).
    pub len: u64,
    /// Bytes cut off the tail (a torn or corrupt record and what followed it).
    pub truncated_bytes: u64,
    /// Whether a torn or corrupt record was found.
    pub corrupt: bool,
    /// Whether the header itself was bad (the file was set aside as `.corrupt`).
    pub bad_header: bool,
}

/// Scans segment `id`: counts its whole records, shows each checked payload with its offset
/// to `visit`, and truncates the file after the last whole record. Never panics on bad
/// content.
pub fn scan(dir: &Path, id: u64, max_record_bytes: usize, visit: &mut dyn FnMut(u64, &[u8])) -> io::Result<Scan> {
    let path = segment_path(dir, id);
    let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
    let file_len = file.metadata()?.len();
    let mut header = [0u8; MAGIC.len()];
    let header_ok = file_len >= MAGIC.len() as u64 && file.read_exact(&mut header).is_ok() && header == MAGIC;
    if !header_ok {
        let aside = path.with_extension("corrupt");
        std::fs::rename(&path, &aside)?;
        return Ok(Scan { bad_header: true, corrupt: true, truncated_bytes: file_len, ..Scan::default() });
    }
    let mut reader = io::BufReader::with_capacity(1 << 20, &mut file);
    let mut offset = MAGIC.len() as u64;
    let mut records = 0;
    let mut payload = Vec::new();
    let corrupt = loop {
        let mut frame_header = [0u8; record::HEADER_BYTES];
        match read_full(&mut reader, &mut frame_header)? {
            0 => break false,
            n if n < frame_header.len() => break true,
            _ => {}
        }
        let (len, crc) = record::parse_header(frame_header);
        if len > max_record_bytes || offset + (record::HEADER_BYTES + len) as u64 > file_len {
            break true;
        }
        payload.resize(len, 0);
        if read_full(&mut reader, &mut payload)? < len || record::verify(&payload, crc).is_err() {
            break true;
        }
        visit(offset, &payload);
        offset += (record::HEADER_BYTES + len) as u64;
        records += 1;
    };
    drop(reader);
    if offset < file_len {
        file.set_len(offset)?;
        file.sync_all()?;
    }
    Ok(Scan { records, len: offset, truncated_bytes: file_len - offset, corrupt, bad_header: false })
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Encodes one done-log entry.
pub fn done_entry(offset: u64, key: RequestKey) -> [u8; DONE_ENTRY_BYTES] {
    let mut entry = [0u8; DONE_ENTRY_BYTES];
    entry[..8].copy_from_slice(&offset.to_le_bytes());
    entry[8..12].copy_from_slice(&key.shard.to_le_bytes());
    entry[12..16].copy_from_slice(&key.chunk.to_le_bytes());
    entry[16..20].copy_from_slice(&key.fingerprint.to_le_bytes());
    let crc = crc32fast::hash(&entry[..20]);
    entry[20..].copy_from_slice(&crc.to_le_bytes());
    entry
}

/// Reads segment `id`'s done log: the requests done, per record offset. A missing file is
/// an empty log; torn or damaged entries are skipped.
pub fn read_done(dir: &Path, id: u64) -> io::Result<HashMap<u64, Vec<RequestKey>>> {
    let mut done: HashMap<u64, Vec<RequestKey>> = HashMap::new();
    let bytes = match std::fs::read(done_path(dir, id)) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(done),
        Err(error) => return Err(error),
    };
    for entry in bytes.chunks_exact(DONE_ENTRY_BYTES) {
        let word = |at: usize| u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]]);
        if crc32fast::hash(&entry[..20]) != word(20) {
            continue;
        }
        let offset = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
        done.entry(offset).or_default().push(RequestKey { shard: word(8), chunk: word(12), fingerprint: word(16) });
    }
    Ok(done)
}

/// Opens (creating) segment `id`'s done log for appending.
pub fn open_done(dir: &Path, id: u64) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(done_path(dir, id))
}

/// Removes segment `id` and its done log.
pub fn remove(dir: &Path, id: u64) -> io::Result<()> {
    std::fs::remove_file(segment_path(dir, id))?;
    match std::fs::remove_file(done_path(dir, id)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Fsyncs a directory, so that files created or removed in it survive a power loss.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Moves `file`'s cursor back to `len` and cuts what follows (undoing a failed append).
pub fn cut_back(file: &mut File, len: u64) -> io::Result<()> {
    file.set_len(len)?;
    file.seek(SeekFrom::Start(len))?;
    Ok(())
}
