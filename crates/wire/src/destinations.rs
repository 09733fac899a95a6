//! The registry of a sender's destinations; see the crate docs, *Outbound*.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard};

use tessera_runtime::Shutdown;

use tessera_runtime::telemetry::Drops;

use crate::metrics::{DestinationMetrics, SenderMetrics};
use crate::outbound::{OutboundQueue, SenderSettings, run_sender};

/// One destination's bounded queue.
pub type DestinationQueue = OutboundQueue<DestinationMetrics>;

/// One destination: its key, its queue, and whether it left (the daemon says what
/// leaving means; its queue and sender stay, for what is still queued).
pub struct DestinationEntry<K> {
    /// What the daemon knows the destination by.
    pub key: K,
    /// Its queue, drained by its own sender task.
    pub queue: Arc<DestinationQueue>,
    departed: AtomicBool,
}

impl<K> DestinationEntry<K> {
    /// Whether the destination left.
    pub fn is_departed(&self) -> bool {
        self.departed.load(Ordering::Acquire)
    }

    /// Marks the destination as gone or back; returns whether that changed.
    pub fn set_departed(&self, departed: bool) -> bool {
        self.departed.swap(departed, Ordering::AcqRel) != departed
    }
}

/// How sender tasks are started, once the daemon's runtime runs.
struct Spawner {
    settings: SenderSettings,
    stop: Shutdown,
    runtime: tokio::runtime::Handle,
}

struct Inner<K> {
    /// Every destination ever added, in order: an index stays valid for the process' life.
    entries: RwLock<Vec<Arc<DestinationEntry<K>>>>,
    /// Serializes adding (index by key).
    index: Mutex<HashMap<K, usize>>,
    max_queue_bytes: usize,
    metrics: SenderMetrics,
    drops: Drops,
    spawner: OnceLock<Spawner>,
}

/// Every destination of a sender, each with one bounded [`DestinationQueue`] and one
/// long-lived [`run_sender`] task, both made the first time the destination is added:
/// the collector's aggregators, the aggregator's ingesters. Cloning shares it.
///
/// Its locks guard lists of queues, which stay whole whatever panicked while one was
/// held: a poisoned lock is taken as it is, never unwrapped, so that one panicking
/// caller cannot stop every later send.
pub struct Destinations<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Destinations<K> {
    fn clone(&self) -> Self {
        Destinations { inner: self.inner.clone() }
    }
}

impl<K: Clone + Eq + Hash> Destinations<K> {
    /// No destination yet; each queue will be bounded at `max_queue_bytes` and count into
    /// `metrics` (under the label given when added) and `drops`.
    pub fn new(max_queue_bytes: usize, metrics: SenderMetrics, drops: Drops) -> Destinations<K> {
        Destinations {
            inner: Arc::new(Inner {
                entries: RwLock::default(),
                index: Mutex::default(),
                max_queue_bytes,
                metrics,
                drops,
                spawner: OnceLock::new(),
            }),
        }
    }

    /// Starts one sender per destination on the current runtime, and one per destination
    /// added later; they stop when `stop` fires. Only the first call does anything.
    pub fn start_senders(&self, settings: &SenderSettings, stop: &Shutdown) {
        let spawner =
            Spawner { settings: settings.clone(), stop: stop.clone(), runtime: tokio::runtime::Handle::current() };
        if self.inner.spawner.set(spawner).is_err() {
            return;
        }
        for entry in self.entries().iter() {
            self.spawn_sender(&entry.queue);
        }
    }

    /// Starts `queue`'s sender, unless senders do not run yet or it has one: an `add`
    /// racing `start_senders` may try twice, and two senders would put two batches of one
    /// stream in flight at once (receivers take a stream's batches in order,
    /// [`crate::OutboundQueue::stream`]).
    fn spawn_sender(&self, queue: &Arc<DestinationQueue>) {
        if let Some(spawner) = self.inner.spawner.get()
            && queue.claim_sender()
        {
            spawner.runtime.spawn(run_sender(queue.clone(), spawner.settings.clone(), spawner.stop.clone()));
        }
    }

    /// The index of `key`'s destination, added (its queue towards `endpoint`, its metrics
    /// under `label`, its sender started if senders run) when new; whether it was new.
    pub fn add(&self, key: &K, endpoint: &str, label: &str) -> (usize, bool) {
        let mut index = lock(&self.inner.index);
        if let Some(&known) = index.get(key) {
            return (known, false);
        }
        let metrics = self.inner.metrics.destination(label, &self.inner.drops);
        let queue = Arc::new(DestinationQueue::new(endpoint.to_owned(), self.inner.max_queue_bytes, metrics));
        let entry = Arc::new(DestinationEntry { key: key.clone(), queue: queue.clone(), departed: false.into() });
        let mut entries = self.inner.entries.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.push(entry);
        let position = entries.len() - 1;
        drop(entries);
        index.insert(key.clone(), position);
        drop(index);
        self.spawn_sender(&queue);
        (position, true)
    }

    /// The queue of `key`'s destination, added when new.
    pub fn queue_of(&self, key: &K, endpoint: &str, label: &str) -> Arc<DestinationQueue> {
        let (index, _) = self.add(key, endpoint, label);
        self.queue(index).expect("an added destination stays")
    }

    /// The queue at `index`.
    pub fn queue(&self, index: usize) -> Option<Arc<DestinationQueue>> {
        self.entries().get(index).map(|entry| entry.queue.clone())
    }

    /// Every destination, by index (a read lock: hold it briefly).
    pub fn entries(&self) -> RwLockReadGuard<'_, Vec<Arc<DestinationEntry<K>>>> {
        self.inner.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether every queue is empty with nothing in flight.
    pub fn all_idle(&self) -> bool {
        self.entries().iter().all(|entry| entry.queue.is_idle())
    }

    /// Drops what is still queued everywhere; returns the batches and items dropped.
    pub fn abandon_all(&self) -> (u64, u64) {
        self.entries().iter().map(|entry| entry.queue.abandon()).fold((0, 0), |sum, one| (sum.0 + one.0, sum.1 + one.1))
    }
}

/// Takes `mutex`, poisoned or not (see [`Destinations`]).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Items;
    use crate::outbound::Batch;

    fn destinations() -> Destinations<String> {
        let items = Items { unit: "partials", count_batches: false, refusals: &[], dictionaries: false };
        let metrics = SenderMetrics::new(items);
        Destinations::new(1 << 10, metrics, Drops::default())
    }

    #[test]
    fn a_destination_is_added_once_and_keeps_its_index() {
        let destinations = destinations();
        assert_eq!(destinations.add(&"a".to_owned(), "a:1", "a"), (0, true));
        assert_eq!(destinations.add(&"b".to_owned(), "b:1", "b"), (1, true));
        assert_eq!(destinations.add(&"a".to_owned(), "a:1", "a"), (0, false));
        let queue = destinations.queue_of(&"b".to_owned(), "b:1", "b");
        assert!(Arc::ptr_eq(&queue, &destinations.queue(1).unwrap()));
        assert_eq!(destinations.entries().len(), 2);
        assert!(destinations.entries()[1].set_departed(true));
        assert!(!destinations.entries()[1].set_departed(true), "already gone");
        assert!(destinations.entries()[1].is_departed());
    }

    /// An `add` racing `start_senders` calls `spawn_sender` for a queue whose sender
    /// `start_senders` already started: a second sender would put two batches of one stream
    /// in flight, which receivers take in order. Each sender connects: one connection only.
    #[tokio::test]
    async fn a_queue_gets_one_sender_when_an_add_races_the_start() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let destinations = destinations();
        let queue = destinations.queue_of(&"a".to_owned(), &endpoint, "a");
        let settings = SenderSettings {
            source: "test".into(),
            role: tessera_proto::Role::Collector,
            peer: "test",
            connect_timeout: std::time::Duration::from_secs(5),
            ack_timeout: std::time::Duration::from_secs(5),
            reconnect_min: std::time::Duration::from_secs(5),
            reconnect_max: std::time::Duration::from_secs(5),
            rejection_label: |_| "rejected",
            heartbeat: None,
            tls: None,
            redirect: None,
        };
        let stop = Shutdown::new();
        destinations.start_senders(&settings, &stop);
        // The racing add's own call, after start_senders saw its entry.
        destinations.spawn_sender(&queue);
        queue.push(Batch { sequence: 1, frame: vec![0; 10], items: 1, refs: None, owner_refused: false });
        let mut connections = Vec::new();
        let accepting = async {
            loop {
                connections.push(listener.accept().await.unwrap().0);
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), accepting).await;
        stop.trigger();
        assert_eq!(connections.len(), 1, "one sender per queue");
    }

    #[test]
    fn idle_until_something_is_queued_and_abandoning_drops_it_all() {
        let destinations = destinations();
        let queue = destinations.queue_of(&"a".to_owned(), "a:1", "a");
        assert!(destinations.all_idle());
        queue.push(Batch { sequence: 1, frame: vec![0; 10], items: 3, refs: None, owner_refused: false });
        assert!(!destinations.all_idle());
        assert_eq!(destinations.abandon_all(), (1, 3));
        assert!(destinations.all_idle());
    }

    #[test]
    fn a_poisoned_lock_does_not_stop_later_callers() {
        let destinations = destinations();
        destinations.add(&"a".to_owned(), "a:1", "a");
        let poisoner = destinations.clone();
        let _ = std::thread::spawn(move || {
            let _held = poisoner.inner.entries.write().unwrap();
            panic!("a caller panics while it holds the lock");
        })
        .join();
        assert!(destinations.inner.entries.is_poisoned());
        assert_eq!(destinations.add(&"b".to_owned(), "b:1", "b"), (1, true));
        assert!(destinations.all_idle());
    }
}
