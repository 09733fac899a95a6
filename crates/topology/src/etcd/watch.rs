//! Watching the placement key: the current placement in memory, swapped
//! atomically, surviving etcd outages, mirrored to a cache file.
//!
//! [`Watcher::start`] returns once it has a first placement: from etcd, or
//! (etcd unreachable) from the cache file. A background task then reads the
//! key, watches it from the revision read, applies every valid new
//! placement, and writes each one to the cache file. When etcd goes away
//! the last placement stays current; the task retries with exponential
//! backoff and jitter, connects again, reads the key again (nothing is
//! missed), and resumes watching.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;

use super::{Backoff, EtcdConfig, connect, request};
use crate::cache::{read_cache, write_cache};
use crate::error::{StoreError, WatchError};
use crate::handle::{AbortOnDrop, PlacementHandle, Published};
use crate::placement::Placement;
use crate::routing::Routing;
use crate::stats::{WatchEvent, WatchStats};

/// Keeps the current placement of one environment, watched in etcd.
///
/// Cloning is cheap; the background task stops when the last clone (and
/// the last [`PlacementHandle`] taken from it) is dropped.
#[derive(Debug, Clone)]
pub struct Watcher {
    handle: PlacementHandle,
}

impl Watcher {
    /// Loads a first placement and starts watching.
    ///
    /// Tries etcd, then the cache file (`config.cache_path`), then etcd
    /// again with backoff until `config.start_timeout_ms` has passed
    /// ([`WatchError::NoPlacement`]). Placements that fail validation are
    /// ignored (and counted).
    pub async fn start(config: EtcdConfig) -> Result<Watcher, WatchError> {
        config.validate()?;
        let config = Arc::new(config);
        let key = config.placement_key();
        let stats = Arc::new(WatchStats::default());
        let started = Instant::now();
        let deadline = started + Duration::from_millis(config.start_timeout_ms);
        let mut backoff = config.backoff();
        let mut cache_tried = false;
        let (placement, from_etcd) = loop {
            let last_error = match read_once(&config, &key).await {
                Ok(Some(bytes)) => match decode_valid(&bytes) {
                    Ok(placement) => break (placement, true),
                    Err(error) => {
                        stats.bump(WatchEvent::InvalidPlacements);
                        error
                    }
                },
                Ok(None) => format!("no placement at `{key}`"),
                Err(error) => {
                    stats.bump(WatchEvent::EtcdErrors);
                    error.to_string()
                }
            };
            tracing::warn!(%key, error = %last_error, "no placement from etcd yet");
            let cache_error = match (&config.cache_path, cache_tried) {
                (Some(path), false) => {
                    cache_tried = true;
                    match read_cache(path) {
                        Ok(placement) => {
                            stats.bump(WatchEvent::LoadedFromCache);
                            tracing::warn!(path = %path.display(), version = placement.version(), "starting on the cached placement");
                            break (placement, false);
                        }
                        Err(error) => Some(error.to_string()),
                    }
                }
                _ => None,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(WatchError::NoPlacement {
                    key,
                    waited_ms: now.duration_since(started).as_millis() as u64,
                    last_error: cache_error.map_or(last_error.clone(), |cache| format!("{last_error}; {cache}")),
                });
            }
            tokio::time::sleep(backoff.next_delay().min(deadline - now)).await;
        };

        let published = Arc::new(Published::new(placement, stats));
        if from_etcd {
            store_cache(&config, &published, published.current()).await;
        }
        let task = tokio::spawn(watch_forever(config, key, published.clone()));
        Ok(Watcher { handle: PlacementHandle::watched(published, Arc::new(AbortOnDrop(task))) })
    }

    /// A handle on the watched placement (keeps the watch running).
    pub fn handle(&self) -> PlacementHandle {
        self.handle.clone()
    }

    /// The current placement.
    pub fn current(&self) -> Arc<Placement> {
        self.handle.current()
    }

    /// The routing table of the current placement.
    pub fn routing(&self) -> Arc<Routing> {
        self.handle.routing()
    }

    /// The current placement's version.
    pub fn version(&self) -> u64 {
        self.handle.version()
    }

    /// How many placements were swapped in, starting at 1.
    pub fn generation(&self) -> u64 {
        self.handle.generation()
    }

    /// A receiver told of every new placement.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Placement>> {
        self.handle.subscribe()
    }

    /// The watcher's counters.
    pub fn stats(&self) -> Arc<WatchStats> {
        self.handle.stats()
    }
}

/// Reads the placement key once on a new connection: `None` when absent.
async fn read_once(config: &EtcdConfig, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let mut client = connect(config).await?;
    let mut response = request(config, "get", key, client.get(key, None)).await?;
    Ok(response.take_kvs().into_iter().next().map(|kv| kv.into_key_value().1))
}

fn decode_valid(bytes: &[u8]) -> Result<Placement, String> {
    let placement = Placement::decode(bytes).map_err(|error| format!("undecodable placement: {error}"))?;
    placement.validate().map_err(|error| format!("invalid placement: {error}"))?;
    Ok(placement)
}

/// Watches until the task is aborted, reconnecting after every failure.
async fn watch_forever(config: Arc<EtcdConfig>, key: String, published: Arc<Published>) {
    let mut backoff = config.backoff();
    loop {
        let error = watch_session(&config, &key, &published, &mut backoff).await;
        published.stats().bump(WatchEvent::EtcdErrors);
        let delay = backoff.next_delay();
        tracing::warn!(%key, %error, retry_in_ms = delay.as_millis() as u64, "placement watch interrupted; keeping the last placement");
        tokio::time::sleep(delay).await;
        published.stats().bump(WatchEvent::Reconnects);
    }
}

/// One connection: read the key, then watch it from the revision read.
/// Returns why it ended.
async fn watch_session(config: &EtcdConfig, key: &str, published: &Published, backoff: &mut Backoff) -> StoreError {
    let mut client = match connect(config).await {
        Ok(client) => client,
        Err(error) => return error,
    };
    let mut response = match request(config, "get", key, client.get(key, None)).await {
        Ok(response) => response,
        Err(error) => return error,
    };
    let revision = response.header().map_or(0, |header| header.revision());
    match response.take_kvs().into_iter().next() {
        Some(kv) => apply(config, key, published, kv.value()).await,
        None => tracing::warn!(%key, "placement key is absent; keeping the last placement"),
    }

    let options = WatchOptions::new().with_start_revision(revision + 1);
    // The returned etcd Watcher owns the request stream: dropping it would close the watch.
    let (_request_stream, mut events) = match request(config, "watch", key, client.watch(key, Some(options))).await {
        Ok(streams) => streams,
        Err(error) => return error,
    };
    backoff.reset();
    tracing::debug!(%key, revision, "watching placement");
    loop {
        let response = match events.message().await {
            Ok(Some(response)) => response,
            Ok(None) => {
                return StoreError::StreamEnded {
                    operation: "watch",
                    key: key.to_owned(),
                    reason: "closed by the server".into(),
                };
            }
            Err(source) => {
                return StoreError::Request { operation: "watch", key: key.to_owned(), source: Box::new(source) };
            }
        };
        if response.canceled() {
            let reason = match response.compact_revision() {
                0 => format!("cancelled: {}", response.cancel_reason()),
                compacted => format!("revision {} compacted (now {compacted})", revision + 1),
            };
            return StoreError::StreamEnded { operation: "watch", key: key.to_owned(), reason };
        }
        for event in response.events() {
            match (event.event_type(), event.kv()) {
                (EventType::Put, Some(kv)) => apply(config, key, published, kv.value()).await,
                (EventType::Delete, _) => tracing::warn!(%key, "placement key deleted; keeping the last placement"),
                (EventType::Put, None) => {}
            }
        }
    }
}

/// Swaps in the placement in `bytes` if it is valid and differs from the current one.
async fn apply(config: &EtcdConfig, key: &str, published: &Published, bytes: &[u8]) {
    let placement = match decode_valid(bytes) {
        Ok(placement) => placement,
        Err(error) => {
            published.stats().bump(WatchEvent::InvalidPlacements);
            tracing::error!(%key, %error, "ignoring placement from etcd; keeping the last placement");
            return;
        }
    };
    if *published.current() == placement {
        return;
    }
    tracing::info!(%key, version = placement.version(), "placement updated");
    published.publish(placement);
    store_cache(config, published, published.current()).await;
}

/// Writes the cache file, if configured, off the async workers.
async fn store_cache(config: &EtcdConfig, published: &Published, placement: Arc<Placement>) {
    let Some(path) = config.cache_path.clone() else { return };
    let written = tokio::task::spawn_blocking(move || write_cache(&path, &placement)).await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            published.stats().bump(WatchEvent::CacheWriteErrors);
            tracing::warn!(%error, "writing the placement cache");
        }
        Err(error) => {
            published.stats().bump(WatchEvent::CacheWriteErrors);
            tracing::warn!(%error, "placement cache writer panicked");
        }
    }
}
