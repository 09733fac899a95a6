//! Remote write's metadata: each metric family's type, help and unit, sent in requests of
//! their own once a minute (`metadata_interval_secs`), as Prometheus' own sender does, so
//! that a metric browser (Grafana's, on Mimir or another store that keeps metadata) shows
//! what each family is.
//!
//! ```text
//! converter (writer thread) ──note(family, type, unit)──▶ Families ◀──snapshot── metadata task ──▶ store
//!   a local set of what it noted:                         (shared,                  (every interval: one
//!   the lock only for a family new to it                   bounded)                  request per ~512 KiB)
//! ```
//!
//! The converter notes the families of a tile's samples when the tile's name is not the
//! last tile's (consecutive tiles mostly share it), and only families it has not noted
//! before take the shared lock: the hot path pays a compare per tile, and a hash per tile
//! whose name changed. The help is the mapping's (`[mapping] file`) or the type's default
//! ([`help_text`](super::openmetrics::help_text)); the unit is `seconds` for the families of
//! statsd timers (`|ms`, written in seconds: `[mapping] timer_unit`, which says what the
//! collectors do) and empty otherwise. At most [`MAX_FAMILIES`] families are kept; more are
//! counted (`tessera_ingester_metadata_families_dropped_total`) and go without metadata.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use tessera_core::prehashed::BuildPrehashed;

/// Most families one target keeps metadata for.
pub const MAX_FAMILIES: usize = 100_000;

/// One family's type (OpenMetrics name) and unit (empty: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyMeta {
    /// `counter`, `gauge`, `summary` or `histogram`.
    pub type_name: &'static str,
    /// `seconds`, or empty.
    pub unit: &'static str,
}

/// The families of one target, shared by its converter and its metadata task.
#[derive(Clone, Debug)]
pub struct Families {
    table: Arc<Mutex<BTreeMap<String, FamilyMeta>>>,
    max: usize,
    /// Families kept (`tessera_ingester_metadata_families`).
    pub kept: Gauge,
    /// Families not kept, past the bound.
    pub dropped: Counter,
}

impl Families {
    /// An empty table of at most `max` families, counted in `kept` and `dropped`.
    pub fn new(max: usize, kept: Gauge, dropped: Counter) -> Families {
        Families { table: Arc::default(), max, kept, dropped }
    }

    /// Adds `family` (a family of another type replaces it); false when the table is full.
    pub fn note(&self, family: &str, meta: FamilyMeta) -> bool {
        let mut table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = table.get_mut(family) {
            *held = meta;
            return true;
        }
        if table.len() >= self.max {
            self.dropped.inc();
            return false;
        }
        table.insert(family.to_owned(), meta);
        self.kept.set(table.len() as i64);
        true
    }

    /// Every family, in name order.
    pub fn snapshot(&self) -> Vec<(String, FamilyMeta)> {
        let table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.iter().map(|(family, meta)| (family.clone(), *meta)).collect()
    }
}

/// The converter's side: what it noted already, so that only new families take the lock.
#[derive(Debug)]
pub struct FamilyNotes {
    families: Families,
    noted: HashSet<u64, BuildPrehashed>,
    /// Hashes of the statsd names (and kinds) whose families were noted.
    sources: HashSet<u64, BuildPrehashed>,
}

impl FamilyNotes {
    /// Notes into `families`.
    pub fn new(families: Families) -> FamilyNotes {
        FamilyNotes { families, noted: HashSet::default(), sources: HashSet::default() }
    }

    /// Whether the source behind `key` (a hash of a statsd name and kind) is new: its
    /// families are to be noted. Remembers it (up to twice the bound on families).
    pub fn first_time(&mut self, key: u64) -> bool {
        if self.sources.contains(&key) {
            return false;
        }
        if self.sources.len() < self.families.max * 2 {
            self.sources.insert(key);
        }
        true
    }

    /// Notes `family` unless noted already.
    pub fn note(&mut self, family: &str, meta: FamilyMeta) {
        let key = xxhash_rust::xxh3::xxh3_64_with_seed(family.as_bytes(), meta.type_name.len() as u64);
        if self.noted.contains(&key) {
            return;
        }
        // Past the bound the shared table counts what it does not keep; the local set stops
        // growing too.
        if self.families.note(family, meta) && self.noted.len() < self.families.max * 2 {
            self.noted.insert(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_kept_once_in_name_order_up_to_the_bound_and_the_rest_counted() {
        let families = Families::new(2, Gauge::default(), Counter::default());
        let mut notes = FamilyNotes::new(families.clone());
        let counter = FamilyMeta { type_name: "counter", unit: "" };
        let summary = FamilyMeta { type_name: "summary", unit: "seconds" };
        notes.note("hits", counter);
        notes.note("hits", counter);
        notes.note("api_latency", summary);
        assert_eq!(families.snapshot(), [("api_latency".to_owned(), summary), ("hits".to_owned(), counter)]);
        notes.note("third", counter);
        assert_eq!((families.kept.get(), families.dropped.get()), (2, 1));
        assert_eq!(families.snapshot().len(), 2);
    }
}
