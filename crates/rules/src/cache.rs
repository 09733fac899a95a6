//! The window stage's side of the rules: the outcome of every series the collector
//! holds, and its counts.
//!
//! The collector's flusher takes every reader's cut of a window through the rules before
//! it sends the window. [`RuleCache::begin`] fetches the set in force for that window;
//! [`CutRules::route`] gives the ids each series' partial goes under, from the cache when
//! the series was seen before (one hash lookup, no allocation) and from
//! [`RuleSet::apply`] otherwise. Hits are added to local counts and published once per
//! cut ([`CutRules::finish`]), which also forgets series idle for longer than the readers
//! keep them (handing back the limits' places they held). When a reload puts another set
//! in force, the cache is emptied and filled again.
//!
//! **Duplicate ids.** Rules can send two series under one id (a rollup, two names mapped
//! to one); such a cut must be merged before it is sent. Merging a whole cut costs as
//! much as cutting it, so the cache tracks instead whether any two of its series
//! may give the same id: a fingerprint (64-bit hash of kind and id) of every output goes
//! in a set as the outcome is cached, and leaves it when the series is forgotten. A
//! fingerprint already present marks the cache as colliding until it is emptied
//! (a false positive from a hash clash only costs a merge). [`CutRules::finish`] says
//! whether the cut may hold an id twice.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use hashbrown::HashTable;
use tessera_core::parse::MetricKind;
use tessera_core::prehashed::BuildPrehashed;
use tessera_core::series::kind_byte;

use crate::handle::RulesHandle;
use crate::mapping::Mapped;
use crate::metrics::RuleMetrics;
use crate::set::{Admission, Outcome, RuleSet, Targets};

/// Cuts between sweeps of the cache for idle series.
const SWEEP_EVERY_CUTS: u64 = 8;

/// The cache of outcomes.
pub struct RuleCache {
    handle: Arc<RulesHandle>,
    active: Option<Arc<RuleSet>>,
    cache: HashTable<Entry>,
    hasher: foldhash::fast::RandomState,
    /// Cuts so far.
    cuts: u64,
    /// How long a series may stay out of the cuts before its entry is forgotten, ms.
    idle_ms: i64,
    /// The newest window start seen.
    newest_window_ms: i64,
    /// Hits of this cut, by hit slot.
    counts: Vec<u64>,
    /// Fingerprints of the outputs of every cached series.
    outputs: hashbrown::HashSet<u64, BuildPrehashed>,
    /// Whether two cached series may give one id (sticky until the cache is emptied).
    colliding: bool,
    /// The mapping file's buffers, kept from one new series to the next.
    mapped: Mapped,
    metrics: RuleMetrics,
}

/// One cached series, compact: a million of them are held at once. Its key and the ids
/// it goes under share one allocation; up to two hits and the limits' places of its ids
/// are held inline (a series under a limit costs nothing more: the place is handed back
/// with the id the entry keeps anyway).
struct Entry {
    hash: u64,
    /// Start of the newest window the series was in.
    last_window_ms: i64,
    /// Kind byte and canonical id (`..key_end`), then the ids it goes under, back to back.
    bytes: Box<[u8]>,
    key_end: u32,
    route: Route,
    /// Hit slots, the first two of them.
    hits: [u32; 2],
    hit_count: u8,
    /// `admitted[i]`: the limit's place the `i`th id the series goes under holds, if any.
    admitted: [Option<Admission>; 2],
    /// More hits: rare.
    extra: Option<Box<Extra>>,
}

/// Where a cached series goes.
#[derive(Clone, Copy)]
enum Route {
    /// Under its own id.
    Same,
    /// Nowhere.
    Dropped,
    /// Under the ids that end at these offsets of `bytes` (a second end of 0: one id).
    Ids([u32; 2]),
}

struct Extra {
    hits: Vec<u32>,
}

impl Entry {
    fn new(hash: u64, kind_byte: u8, id: &[u8], outcome: Outcome) -> Entry {
        let mut bytes = Vec::with_capacity(1 + id.len());
        bytes.push(kind_byte);
        bytes.extend_from_slice(id);
        let key_end = bytes.len() as u32;
        let route = match outcome.targets {
            Targets::Same => Route::Same,
            Targets::Dropped => Route::Dropped,
            targets => {
                let mut ends = [0u32; 2];
                for (end, target) in ends.iter_mut().zip(targets.new_ids()) {
                    bytes.extend_from_slice(target);
                    *end = bytes.len() as u32;
                }
                Route::Ids(ends)
            }
        };
        let mut hits = [0u32; 2];
        let hit_count = outcome.hits.len().min(2);
        hits[..hit_count].copy_from_slice(&outcome.hits[..hit_count]);
        let more_hits = &outcome.hits[hit_count..];
        let extra = (!more_hits.is_empty()).then(|| Box::new(Extra { hits: more_hits.to_vec() }));
        Entry {
            hash,
            last_window_ms: i64::MIN,
            bytes: bytes.into(),
            key_end,
            route,
            hits,
            hit_count: hit_count as u8,
            admitted: outcome.admissions,
            extra,
        }
    }

    fn key(&self) -> &[u8] {
        &self.bytes[..self.key_end as usize]
    }

    /// Calls `each` with every id the series goes under; `id` is its own.
    fn for_each_id(&self, id: &[u8], mut each: impl FnMut(&[u8])) {
        match self.route {
            Route::Same => each(id),
            Route::Dropped => {}
            Route::Ids([first, second]) => {
                each(&self.bytes[self.key_end as usize..first as usize]);
                if second != 0 {
                    each(&self.bytes[first as usize..second as usize]);
                }
            }
        }
    }

    fn hits(&self) -> impl Iterator<Item = u32> + '_ {
        let more = self.extra.iter().flat_map(|extra| extra.hits.iter().copied());
        self.hits[..self.hit_count as usize].iter().copied().chain(more)
    }

    /// Hands back to `set` the limits' places the series' ids hold.
    fn release_admissions(&self, set: &RuleSet) {
        if self.admitted == [None; 2] {
            return;
        }
        let mut index = 0;
        self.for_each_id(&self.key()[1..], |id| {
            if let Some(&Some(admission)) = self.admitted.get(index) {
                set.release(admission, id);
            }
            index += 1;
        });
    }
}

/// The rules of one cut, borrowed from the cache.
pub struct CutRules<'r> {
    rules: &'r mut RuleCache,
    window_start_ms: i64,
    set: Arc<RuleSet>,
    started: Instant,
}

impl RuleCache {
    /// A cache of the outcomes of `handle`'s sets; a series out of the cuts for longer
    /// than `idle_ms` is forgotten.
    pub fn new(handle: Arc<RulesHandle>, metrics: RuleMetrics, idle_ms: i64) -> RuleCache {
        RuleCache {
            handle,
            active: None,
            cache: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            cuts: 0,
            idle_ms,
            newest_window_ms: i64::MIN,
            counts: Vec::new(),
            outputs: hashbrown::HashSet::default(),
            colliding: false,
            mapped: Mapped::default(),
            metrics,
        }
    }

    /// Records the outputs of a newly cached series (`id` is its own).
    fn add_outputs(&mut self, entry: &Entry, id: &[u8]) {
        let kind_byte = entry.key()[0];
        let (outputs, hasher, colliding) = (&mut self.outputs, &self.hasher, &mut self.colliding);
        entry.for_each_id(id, |output| *colliding |= !outputs.insert(hasher.hash_one((kind_byte, output))));
    }

    /// Starts the cut of the window starting at `window_start_ms`; `None` when the set
    /// in force does nothing, and the cut goes as it is.
    pub fn begin(&mut self, window_start_ms: i64) -> Option<CutRules<'_>> {
        let set = self.handle.for_window(window_start_ms);
        if !self.active.as_ref().is_some_and(|active| Arc::ptr_eq(active, &set)) {
            self.forget_all();
            self.counts = vec![0; set.hit_counters().len()];
            self.active = Some(set.clone());
        }
        if set.is_empty() {
            return None;
        }
        self.cuts += 1;
        self.newest_window_ms = self.newest_window_ms.max(window_start_ms);
        Some(CutRules { rules: self, window_start_ms, set, started: Instant::now() })
    }

    /// Forgets every outcome, handing back the places they held.
    fn forget_all(&mut self) {
        self.metrics.rule_cache_series.dec_by(self.cache.len() as i64);
        self.outputs.clear();
        self.colliding = false;
        for entry in self.cache.drain() {
            if let Some(active) = &self.active {
                entry.release_admissions(active);
            }
        }
        self.cache.shrink_to_fit(|entry| entry.hash);
    }

    /// Series whose outcome the cache holds.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

impl Drop for RuleCache {
    fn drop(&mut self) {
        self.forget_all();
    }
}

impl CutRules<'_> {
    /// Calls `each` with every id the partial of series `id` of `kind` goes under (none
    /// when a rule dropped it).
    pub fn route(&mut self, kind: MetricKind, id: &[u8], mut each: impl FnMut(&[u8])) {
        let rules = &mut *self.rules;
        let kind_byte = kind_byte(kind);
        let hash = rules.hasher.hash_one((kind_byte, id));
        let matches = |entry: &Entry| entry.key()[0] == kind_byte && &entry.key()[1..] == id;
        let entry = match rules.cache.find_mut(hash, matches) {
            Some(entry) => entry,
            None => {
                let entry = Entry::new(hash, kind_byte, id, self.set.apply_with(kind, id, &mut rules.mapped));
                rules.metrics.rule_cache_series.inc();
                rules.add_outputs(&entry, id);
                rules.cache.insert_unique(hash, entry, |entry| entry.hash).into_mut()
            }
        };
        entry.last_window_ms = entry.last_window_ms.max(self.window_start_ms);
        for slot in entry.hits() {
            rules.counts[slot as usize] += 1;
        }
        entry.for_each_id(id, &mut each);
    }

    /// Publishes the cut's counts and forgets idle series; returns whether the cut may
    /// hold one id twice (and must be merged before it is sent).
    pub fn finish(self) -> bool {
        let rules = self.rules;
        for (counter, count) in self.set.hit_counters().iter().zip(rules.counts.iter_mut()) {
            if *count > 0 {
                counter.inc_by(std::mem::take(count));
            }
        }
        if rules.cuts.is_multiple_of(SWEEP_EVERY_CUTS) {
            let (oldest_kept_ms, set) = (rules.newest_window_ms.saturating_sub(rules.idle_ms), &self.set);
            let before = rules.cache.len();
            let (outputs, hasher, colliding) = (&mut rules.outputs, &rules.hasher, rules.colliding);
            rules.cache.retain(|entry| {
                let keep = entry.last_window_ms >= oldest_kept_ms;
                if !keep {
                    entry.release_admissions(set);
                    // Once colliding, a fingerprint may stand for two series: keep them all.
                    if !colliding {
                        forget_outputs(outputs, hasher, entry);
                    }
                }
                keep
            });
            rules.metrics.rule_cache_series.dec_by((before - rules.cache.len()) as i64);
        }
        rules.metrics.rule_evaluation_duration.observe(self.started.elapsed().as_secs_f64());
        rules.colliding
    }
}

/// Takes the fingerprints of a forgotten series' outputs out of `outputs`.
fn forget_outputs(
    outputs: &mut hashbrown::HashSet<u64, BuildPrehashed>,
    hasher: &foldhash::fast::RandomState,
    entry: &Entry,
) {
    let (kind_byte, own_id) = (entry.key()[0], &entry.key()[1..]);
    entry.for_each_id(own_id, |id| {
        outputs.remove(&hasher.hash_one((kind_byte, id)));
    });
}

#[cfg(test)]
mod tests {
    /// A million entries are held at once: the limits' places and up to two hits live in
    /// what would be padding, so an entry stays at 72 bytes (plus its key and ids).
    #[test]
    fn an_entry_stays_compact() {
        assert_eq!(std::mem::size_of::<super::Entry>(), 72);
    }
}
