//! The series dictionary of one destination: the first time a series goes
//! to a destination within a dictionary generation, it is named in full
//! with a ref; after that by the ref alone. The aggregator resolves the ref
//! straight to its slot for the series, with no hash of the id.
//!
//! The generation is the destination queue's
//! ([`OutboundQueue::generation`](tessera_wire::OutboundQueue::generation)):
//! it ends with every new connection and every dropped batch, and the
//! dictionary starts empty again when it sees that. Batches still queued
//! from an ended generation are expanded to full ids before they are sent,
//! from the ids this dictionary kept for them ([`GenerationIds`]). A
//! dictionary that holds many series idle for a while ends its generation
//! itself (`rotated`), so that a long-lived connection does not keep every
//! series it ever named.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;
use tessera_core::table::KeyBytes;
use tessera_proto::partials::{MAX_SERIES_REFS, expand_refs};
use tessera_wire::{Batch, Expand, GenerationEnd};

use super::DestinationQueue;

/// Every this many windows the dictionary counts its idle series.
const ROTATION_CHECK_WINDOWS: u32 = 64;
/// A series unused for this many windows is idle.
const IDLE_WINDOWS: u32 = 64;
/// Dictionaries smaller than this never rotate.
const ROTATION_MIN_SERIES: usize = 4096;

/// One named series. The id lives in the hash table's bucket (inline when
/// short), so naming a known series is one probe with no further cache miss.
struct Entry {
    id: KeyBytes,
    metric_type: i32,
    series_ref: u32,
    /// The window the series was last named in.
    last_used: u32,
}

/// The series of one generation: the router names series through it
/// window by window, and expanding the generation's batches reads it.
pub struct GenerationIds {
    entries: Mutex<HashTable<Entry>>,
    max_frame_bytes: usize,
}

impl GenerationIds {
    /// Room for `series` series up front, so a new generation of a busy
    /// dictionary does not rehash as it fills again.
    fn new(max_frame_bytes: usize, series: usize) -> GenerationIds {
        GenerationIds { entries: Mutex::new(HashTable::with_capacity(series)), max_frame_bytes }
    }

    fn lock(&self) -> MutexGuard<'_, HashTable<Entry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Expand for GenerationIds {
    fn expand(&self, frame: &[u8], sequences: &mut dyn FnMut() -> u64) -> Result<Vec<Batch>, String> {
        let entries = self.lock();
        // By ref; built per expansion, which only batches caught by a new connection need.
        let mut by_ref: Vec<Option<(i32, &[u8])>> = vec![None; entries.len() + 1];
        for entry in entries.iter() {
            if let Some(slot) = by_ref.get_mut(entry.series_ref as usize) {
                *slot = Some((entry.metric_type, entry.id.as_slice()));
            }
        }
        let lookup = |series_ref: u32| by_ref.get(series_ref as usize).copied().flatten();
        let frames = expand_refs(frame, self.max_frame_bytes, self.max_frame_bytes / 2, sequences, lookup)
            .map_err(|error| error.to_string())?;
        Ok(frames
            .into_iter()
            .map(|(sequence, frame, items)| Batch { sequence, frame, items, refs: None, owner_refused: false })
            .collect())
    }
}

/// How a series is named in the batch being encoded.
pub struct Name {
    /// The ref (never 0).
    pub series_ref: u32,
    /// Whether this is the series' first use in the generation: send the id.
    pub define: bool,
}

/// One destination's dictionary; see the [module docs](self).
pub struct Dictionary {
    generation: u64,
    hasher: foldhash::fast::RandomState,
    ids: Arc<GenerationIds>,
    /// Windows encoded, for idleness.
    window: u32,
}

impl Dictionary {
    /// An empty dictionary; frames expanded from it are at most `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Dictionary {
        Dictionary {
            generation: 0,
            hasher: foldhash::fast::RandomState::default(),
            ids: Arc::new(GenerationIds::new(max_frame_bytes, 0)),
            window: 0,
        }
    }

    /// Starts encoding one window for `queue`: rotates or starts afresh if
    /// the queue's generation moved on.
    pub fn open(&mut self, queue: &DestinationQueue) -> DictionaryWindow<'_> {
        self.window = self.window.wrapping_add(1);
        if self.window.is_multiple_of(ROTATION_CHECK_WINDOWS) && self.should_rotate() {
            queue.end_generation(GenerationEnd::Rotated);
        }
        let generation = queue.generation();
        if generation != self.generation {
            self.generation = generation;
            // Batches of the old generation keep its ids for expansion.
            let series = self.ids.lock().len();
            self.ids = Arc::new(GenerationIds::new(self.ids.max_frame_bytes, series));
        }
        DictionaryWindow { hasher: &self.hasher, entries: self.ids.lock(), window: self.window }
    }

    fn should_rotate(&self) -> bool {
        let entries = self.ids.lock();
        let len = entries.len();
        if len >= MAX_SERIES_REFS as usize {
            return true;
        }
        if len < ROTATION_MIN_SERIES {
            return false;
        }
        let idle = entries.iter().filter(|entry| self.window.wrapping_sub(entry.last_used) > IDLE_WINDOWS).count();
        idle * 2 > len
    }

    /// The generation the last opened window's batches belong to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What expanding this generation's batches needs.
    pub fn ids(&self) -> Arc<GenerationIds> {
        self.ids.clone()
    }

    /// Series named in the current generation.
    pub fn len(&self) -> usize {
        self.ids.lock().len()
    }
}

/// A dictionary open for one window's encoding (holds its ids' lock).
pub struct DictionaryWindow<'d> {
    hasher: &'d foldhash::fast::RandomState,
    entries: MutexGuard<'d, HashTable<Entry>>,
    window: u32,
}

impl DictionaryWindow<'_> {
    /// The name of the series of `metric_type` (wire type) and `id`, giving
    /// it a ref if it has none; `None` when the dictionary is full
    /// ([`MAX_SERIES_REFS`]): the series goes by id until the dictionary
    /// rotates.
    #[inline]
    pub fn name(&mut self, metric_type: i32, id: &[u8]) -> Option<Name> {
        let hash = self.hasher.hash_one((metric_type, id));
        let found = self.entries.find_mut(hash, |entry| entry.metric_type == metric_type && entry.id.as_slice() == id);
        if let Some(entry) = found {
            entry.last_used = self.window;
            return Some(Name { series_ref: entry.series_ref, define: false });
        }
        let series_ref = self.entries.len() as u32 + 1;
        if series_ref > MAX_SERIES_REFS {
            return None;
        }
        let entry = Entry { id: KeyBytes::copy_of(id), metric_type, series_ref, last_used: self.window };
        let hasher = self.hasher;
        self.entries.insert_unique(hash, entry, |entry| hasher.hash_one((entry.metric_type, entry.id.as_slice())));
        Some(Name { series_ref, define: true })
    }
}

#[cfg(test)]
mod tests {
    use tessera_proto::{Aggregate, MetricType, aggregate::Value};

    use super::*;
    use crate::metrics::Metrics;

    const COUNTER: i32 = MetricType::Counter as i32;

    fn queue() -> DestinationQueue {
        DestinationQueue::new("a:1".into(), 1 << 20, {
            let metrics = Metrics::default();
            metrics.senders.destination("a", &metrics.drops)
        })
    }

    fn names(dictionary: &mut Dictionary, queue: &DestinationQueue, ids: &[&str]) -> Vec<(u32, bool)> {
        let mut window = dictionary.open(queue);
        ids.iter()
            .map(|id| {
                let name = window.name(COUNTER, id.as_bytes()).expect("room for a ref");
                (name.series_ref, name.define)
            })
            .collect()
    }

    #[test]
    fn a_series_is_defined_once_per_generation_then_named_by_ref() {
        let (queue, mut dictionary) = (queue(), Dictionary::new(1 << 20));
        assert_eq!(names(&mut dictionary, &queue, &["a", "b", "a"]), [(1, true), (2, true), (1, false)]);
        assert_eq!(names(&mut dictionary, &queue, &["b", "c"]), [(2, false), (3, true)]);
        let mut window = dictionary.open(&queue);
        assert!(window.name(MetricType::Gauge as i32, b"a").unwrap().define, "the type is part of the series");
        drop(window);
        // A new connection: everything is defined again, from ref 1.
        queue.end_generation(GenerationEnd::Connect);
        assert_eq!(names(&mut dictionary, &queue, &["c", "a"]), [(1, true), (2, true)]);
        assert_eq!(dictionary.len(), 2);
    }

    #[test]
    fn the_ids_of_an_ended_generation_still_expand_its_batches() {
        let (queue, mut dictionary) = (queue(), Dictionary::new(1 << 20));
        names(&mut dictionary, &queue, &["x|#k:v", "y"]);
        let ids = dictionary.ids();
        queue.end_generation(GenerationEnd::Connect);
        names(&mut dictionary, &queue, &["z"]);
        let mut series = tessera_proto::partials::ShardSeries::default();
        let counter = Aggregate { value: Some(Value::Counter(2.0)) };
        series.push(1 << 20, b"", 0, &counter, 2);
        series.push(1 << 20, b"", 0, &counter, 1);
        let header = tessera_proto::PartialBatch { dictionary: 1, window_start_ms: 1000, ..Default::default() };
        let mut frame = Vec::new();
        tessera_proto::partials::cut_frames(&header, [(3, series.chunks())], 1 << 19, &mut || 9, |_, bytes, _| {
            frame = bytes
        });
        let expanded = ids.expand(&frame, &mut || 10).unwrap();
        let decoded = tessera_proto::framing::decode_frame(&expanded[0].frame, 1 << 20).unwrap().unwrap().0;
        let Some(tessera_proto::frame::Body::Partials(batch)) = decoded.body else { panic!("{decoded:?}") };
        let named: Vec<(&[u8], i32, u32)> =
            batch.shards[0].series.iter().map(|value| (&value.series_id[..], value.r#type, value.r#ref)).collect();
        assert_eq!(named, [(&b"y"[..], COUNTER, 0), (&b"x|#k:v"[..], COUNTER, 0)]);
        assert_eq!((batch.dictionary, batch.sequence, expanded[0].sequence), (0, 10, 10));
        // A ref the generation never had cannot be expanded.
        series.clear();
        series.push(1 << 20, b"", 0, &counter, 3);
        tessera_proto::partials::cut_frames(&header, [(3, series.chunks())], 1 << 19, &mut || 9, |_, bytes, _| {
            frame = bytes
        });
        assert!(ids.expand(&frame, &mut || 11).unwrap_err().contains("ref 3"));
    }

    #[test]
    fn a_dictionary_mostly_idle_rotates() {
        let (queue, mut dictionary) = (queue(), Dictionary::new(1 << 20));
        let many: Vec<String> = (0..ROTATION_MIN_SERIES).map(|n| format!("s{n}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        names(&mut dictionary, &queue, &many);
        // Only one series stays in use; the check comes every ROTATION_CHECK_WINDOWS windows.
        let mut windows = 1;
        while queue.generation() == 1 && windows < 4 * ROTATION_CHECK_WINDOWS {
            names(&mut dictionary, &queue, &["s0"]);
            windows += 1;
        }
        assert_eq!(queue.generation(), 2, "rotated after {windows} windows");
        assert!(windows > IDLE_WINDOWS, "not before the series were idle: {windows}");
        assert_eq!(dictionary.len(), 1, "only s0 is named in the new generation");
    }
}
