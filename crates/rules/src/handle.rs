//! The rules in force, swapped on reload at a window boundary.
//!
//! A reload does not change the rules under a window already running: the new set takes
//! effect from the next window's start, and a reader cutting an earlier window (one that
//! runs late) still gets the set that was in force for it. So every window is taken
//! through one set by every reader, and no partial is lost or split across the switch.

use std::sync::{Arc, Mutex, PoisonError};

use tessera_core::aggregate::Observer;
use tessera_core::parse::MetricKind;
use tessera_core::table::ObserverSource;

use crate::set::RuleSet;

/// Sets kept for readers that run late: the one in force, and the ones before it.
const SETS_KEPT: usize = 3;

/// The shared handle readers ask for the rules of a window.
pub struct RulesHandle {
    /// `(in force from window start, set)`, oldest first; the first is in force from
    /// the beginning of time.
    sets: Mutex<Vec<(i64, Arc<RuleSet>)>>,
}

impl RulesHandle {
    /// A handle starting with `rules`.
    pub fn new(rules: RuleSet) -> RulesHandle {
        RulesHandle { sets: Mutex::new(vec![(i64::MIN, Arc::new(rules))]) }
    }

    /// The set in force for the window starting at `window_start_ms`.
    pub fn for_window(&self, window_start_ms: i64) -> Arc<RuleSet> {
        let sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let in_force = sets.iter().rev().find(|(from_ms, _)| *from_ms <= window_start_ms).unwrap_or(&sets[0]);
        in_force.1.clone()
    }

    /// Puts `rules` in force from the window starting at `from_window_ms`.
    pub fn replace(&self, rules: RuleSet, from_window_ms: i64) {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        sets.retain(|(from_ms, _)| *from_ms < from_window_ms);
        sets.push((from_window_ms, Arc::new(rules)));
        if sets.len() > SETS_KEPT {
            sets.remove(0);
            sets[0].0 = i64::MIN;
        }
    }
}

/// A reader's table asks the newest rules what a new series is written as (a classic
/// histogram's buckets, a summary's quantiles). A reload changes it for series new to a
/// reader's table from then on; a series the table already holds keeps it until it goes
/// idle and expires. Partials that disagree on buckets merge without them
/// ([`Distribution::merge`](tessera_core::aggregate::Distribution::merge)).
impl ObserverSource for RulesHandle {
    fn observer(&self, kind: MetricKind, name: &[u8]) -> Option<Observer> {
        let newest = {
            let sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
            sets.last().map(|(_, set)| set.clone())
        };
        newest?.observer(kind, name)
    }
}
