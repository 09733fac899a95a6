//! The series dictionary of one destination: the first time a series goes
//! to a destination within a dictionary generation, it is named in full
//! with a ref; after that by the ref alone. The aggregator resolves the ref
//! straight to its slot for the series, with no hash of the id.
//!
//! The generation is the destination queue's
//! ([`OutboundQueue::generation`](tessera_runtime::outbound::OutboundQueue::generation)):
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
use tessera_proto::partials::expand_refs;
use tessera_runtime::outbound::{Batch, Expand, GenerationEnd};

use crate::forward::DestinationQueue;

/// Every this many windows the dictionary counts its idle series.
const ROTATION_CHECK_WINDOWS: u32 = 64;
/// A series unused for this many windows is idle.
const IDLE_WINDOWS: u32 = 64;
/// Dictionaries smaller than this never rotate.
const ROTATION_MIN_SERIES: usize = 4096;
/// Most refs in one generation.
const MAX_REFS: usize = 1 << 31;

/// The ids of one generation, by ref - 1: what expanding its batches needs.
pub struct GenerationIds {
    entries: Mutex<Vec<(i32, Box<[u8]>)>>,
    max_frame_bytes: usize,
}

impl GenerationIds {
    fn lock(&self) -> MutexGuard<'_, Vec<(i32, Box<[u8]>)>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Expand for GenerationIds {
    fn expand(&self, frame: &[u8], sequences: &mut dyn FnMut() -> u64) -> Result<Vec<Batch>, String> {
        let entries = self.lock();
        let lookup = |series_ref: u32| {
            let (metric_type, id) = entries.get((series_ref as usize).checked_sub(1)?)?;
            Some((*metric_type, &**id))
        };
        let frames = expand_refs(frame, self.max_frame_bytes, self.max_frame_bytes / 2, sequences, lookup)
            .map_err(|error| error.to_string())?;
        Ok(frames.into_iter().map(|(sequence, frame, items)| Batch { sequence, frame, items, refs: None }).collect())
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
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    ids: Arc<GenerationIds>,
    /// The window each ref was last used in, by ref - 1.
    last_used: Vec<u32>,
    /// Windows encoded, for idleness.
    window: u32,
    max_frame_bytes: usize,
}

impl Dictionary {
    /// An empty dictionary; frames expanded from it are at most `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Dictionary {
        Dictionary {
            generation: 0,
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            ids: Arc::new(GenerationIds { entries: Mutex::default(), max_frame_bytes }),
            last_used: Vec::new(),
            window: 0,
            max_frame_bytes,
        }
    }

    /// Starts encoding one window for `queue`: rotates or starts afresh if
    /// the queue's generation moved on. Returns the generation to stamp.
    pub fn open(&mut self, queue: &DestinationQueue) -> DictionaryWindow<'_> {
        self.window = self.window.wrapping_add(1);
        if self.window.is_multiple_of(ROTATION_CHECK_WINDOWS) && self.should_rotate() {
            queue.end_generation(GenerationEnd::Rotated);
        }
        let generation = queue.generation();
        if generation != self.generation {
            self.generation = generation;
            self.index.clear();
            self.last_used.clear();
            self.ids = Arc::new(GenerationIds { entries: Mutex::default(), max_frame_bytes: self.max_frame_bytes });
        }
        let entries = self.ids.lock();
        DictionaryWindow {
            generation,
            index: &mut self.index,
            hasher: &self.hasher,
            entries,
            last_used: &mut self.last_used,
            window: self.window,
        }
    }

    fn should_rotate(&self) -> bool {
        let len = self.last_used.len();
        if len >= MAX_REFS {
            return true;
        }
        if len < ROTATION_MIN_SERIES {
            return false;
        }
        let idle = self.last_used.iter().filter(|&&used| self.window.wrapping_sub(used) > IDLE_WINDOWS).count();
        idle * 2 > len
    }

    /// What expanding this generation's batches needs.
    pub fn ids(&self) -> Arc<GenerationIds> {
        self.ids.clone()
    }

    /// Series named in the current generation.
    pub fn len(&self) -> usize {
        self.last_used.len()
    }
}

/// A dictionary open for one window's encoding (holds its ids' lock).
pub struct DictionaryWindow<'d> {
    /// The generation the window's batches belong to.
    pub generation: u64,
    index: &'d mut HashTable<u32>,
    hasher: &'d foldhash::fast::RandomState,
    entries: MutexGuard<'d, Vec<(i32, Box<[u8]>)>>,
    last_used: &'d mut Vec<u32>,
    window: u32,
}

impl DictionaryWindow<'_> {
    /// The name of the series of `metric_type` (wire type) and `id`, giving it a ref if it has none.
    #[inline]
    pub fn name(&mut self, metric_type: i32, id: &[u8]) -> Name {
        let hash = self.hasher.hash_one((metric_type, id));
        let entries = &self.entries;
        if let Some(&series_ref) = self.index.find(hash, |&r| {
            let (existing_type, existing) = &entries[r as usize - 1];
            *existing_type == metric_type && **existing == *id
        }) {
            self.last_used[series_ref as usize - 1] = self.window;
            return Name { series_ref, define: false };
        }
        self.entries.push((metric_type, id.into()));
        self.last_used.push(self.window);
        let series_ref = self.entries.len() as u32;
        let (hasher, entries) = (self.hasher, &self.entries);
        self.index.insert_unique(hash, series_ref, |&r| {
            let (metric_type, id) = &entries[r as usize - 1];
            hasher.hash_one((*metric_type, &**id))
        });
        Name { series_ref, define: true }
    }
}
