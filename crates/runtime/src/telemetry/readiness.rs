//! Readiness made of named conditions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Whether the daemon is ready for traffic: ready once every condition added with
/// [`condition`](Self::condition) is met (and ready when it has none). Cheap to clone
/// (one `Arc`); `/readyz` answers from it.
///
/// ```
/// use tessera_runtime::Readiness;
///
/// let readiness = Readiness::new();
/// let placement = readiness.condition("placement loaded");
/// let listening = readiness.condition("statsd sockets bound");
/// listening.mark_ready();
/// assert_eq!(readiness.unmet(), ["placement loaded"]);
/// placement.mark_ready();
/// assert!(readiness.is_ready());
/// ```
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Every condition met: what `is_ready` reads, one atomic load.
    ready: AtomicBool,
    /// Each condition's name and whether it is met, in the order they were added.
    conditions: Mutex<Vec<(String, bool)>>,
}

/// One condition of a [`Readiness`], unmet until [`mark_ready`](Self::mark_ready).
#[derive(Clone, Debug)]
pub struct ReadinessCondition {
    readiness: Readiness,
    index: usize,
}

impl Readiness {
    /// Readiness with no conditions yet, so ready until one is added.
    pub fn new() -> Self {
        Self { inner: Arc::new(Inner { ready: AtomicBool::new(true), conditions: Mutex::new(Vec::new()) }) }
    }

    /// Adds an unmet condition named `name` (shown by `/readyz` while unmet) and returns
    /// the handle that marks it.
    pub fn condition(&self, name: impl Into<String>) -> ReadinessCondition {
        let mut conditions = self.lock_conditions();
        conditions.push((name.into(), false));
        self.inner.ready.store(false, Ordering::Release);
        ReadinessCondition { readiness: self.clone(), index: conditions.len() - 1 }
    }

    /// Whether every condition is met.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// The names of the conditions not met, in the order they were added.
    pub fn unmet(&self) -> Vec<String> {
        self.lock_conditions().iter().filter(|(_, met)| !met).map(|(name, _)| name.clone()).collect()
    }

    fn set(&self, index: usize, met: bool) {
        let mut conditions = self.lock_conditions();
        let (name, was_met) = &mut conditions[index];
        if *was_met == met {
            return;
        }
        *was_met = met;
        tracing::info!(condition = %name, met, "readiness condition changed");
        let all_met = conditions.iter().all(|(_, met)| *met);
        self.inner.ready.store(all_met, Ordering::Release);
    }

    fn lock_conditions(&self) -> MutexGuard<'_, Vec<(String, bool)>> {
        // Every update leaves the list consistent, so a panic elsewhere does not spoil it.
        self.inner.conditions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadinessCondition {
    /// Marks the condition met.
    pub fn mark_ready(&self) {
        self.readiness.set(self.index, true);
    }

    /// Marks the condition unmet again (lost the placement, a socket closed).
    pub fn mark_not_ready(&self) {
        self.readiness.set(self.index, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_condition_is_met() {
        let readiness = Readiness::new();
        assert!(readiness.is_ready());
        let first = readiness.condition("first");
        let second = readiness.condition("second");
        assert!(!readiness.is_ready());
        assert_eq!(readiness.unmet(), ["first", "second"]);
        first.mark_ready();
        assert!(!readiness.is_ready());
        second.clone().mark_ready();
        assert!(readiness.is_ready());
        assert!(readiness.unmet().is_empty());
        first.mark_not_ready();
        assert_eq!(readiness.unmet(), ["first"]);
        assert!(!readiness.is_ready());
    }
}
