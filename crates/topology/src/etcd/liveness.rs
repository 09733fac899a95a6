//! Instance liveness: a key per instance attached to an etcd lease that a
//! background task keeps alive.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Backoff, EtcdConfig, request, with_timeout};
use crate::error::StoreError;

/// What the background task is asked on stop: revoke, and maybe report how it went.
type StopRequest = Option<oneshot::Sender<Result<(), StoreError>>>;

/// A live registration made by
/// [`PlacementStore::register_instance`](super::PlacementStore::register_instance).
///
/// Dropping it stops the keep-alive and revokes the lease in the
/// background (the key disappears at once); [`revoke`](Self::revoke) does
/// the same and waits for etcd's answer. If the process dies, the lease
/// expires after its TTL.
#[derive(Debug)]
pub struct Registration {
    key: String,
    lease_id: Arc<AtomicI64>,
    valid_until: LeaseDeadline,
    stop: Option<oneshot::Sender<StopRequest>>,
    task: Option<JoinHandle<()>>,
}

impl Registration {
    /// The registered key, `/tessera/<env>/alive/<id>`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The current lease id (it changes when the lease had to be granted again).
    pub fn lease_id(&self) -> i64 {
        self.lease_id.load(Ordering::Relaxed)
    }

    /// A handle on the time before which the lease cannot have expired.
    pub fn deadline(&self) -> LeaseDeadline {
        self.valid_until.clone()
    }

    /// Stops the keep-alive and revokes the lease, so the key goes away now.
    pub async fn revoke(mut self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        let stop = self.stop.take().expect("stop is only taken by revoke (which consumes self) or drop");
        if stop.send(Some(reply)).is_err() {
            return Ok(());
        }
        let result = answer.await.unwrap_or(Ok(()));
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        result
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(None);
        }
    }
}

/// How long before its lease's [`LeaseDeadline`] a daemon stops what only the lease's
/// holder may do: an aggregator leader flushing, an ingester writing to its stores.
pub const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// The time before which a lease cannot have expired in etcd: the moment
/// the last successful grant or keep-alive was *sent*, plus the TTL etcd
/// answered with. etcd starts the TTL when it receives the request, later
/// than that, so the deadline errs on the early side; a process paused past
/// it (or cut off from etcd) sees it passed as soon as it runs again.
/// This is what fencing rests on ([`Election`](crate::Election)).
///
/// The deadline belongs to one lease: when the lease expired and a new one
/// was granted, whatever was held on the old one (a leader key) is gone,
/// and [`remaining`](Self::remaining) for the old id is zero.
#[derive(Debug, Clone, Default)]
pub struct LeaseDeadline(Arc<Mutex<Deadlines>>);

/// The current lease's deadline, and the last one of the lease before it.
#[derive(Debug, Clone, Copy, Default)]
struct Deadlines {
    current: Option<(i64, Instant)>,
    previous: Option<(i64, Instant)>,
}

impl LeaseDeadline {
    /// The current lease and when it may expire; `None` before the first grant.
    pub fn get(&self) -> Option<(i64, Instant)> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).current
    }

    /// The last deadline known of lease `lease_id`: the current lease's, or that of the lease
    /// granted before it (etcd could not expire it sooner). A process paused past its lease
    /// may be granted a new one before it looks at the old one's end.
    pub fn last_of(&self, lease_id: i64) -> Option<Instant> {
        let deadlines = *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        [deadlines.current, deadlines.previous]
            .into_iter()
            .flatten()
            .find(|(lease, _)| *lease == lease_id)
            .map(|(_, at)| at)
    }

    /// How long lease `lease_id` is certainly still alive from now: zero if
    /// it may have expired, or if the current lease is another one.
    pub fn remaining(&self, lease_id: i64) -> Duration {
        match self.get() {
            Some((current, deadline)) if current == lease_id => deadline.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// Test support: lease `lease_id` certainly lives until `deadline`.
    #[doc(hidden)]
    pub fn set(&self, lease_id: i64, deadline: Instant) {
        let mut deadlines = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(current) = deadlines.current.filter(|(current, _)| *current != lease_id) {
            deadlines.previous = Some(current);
        }
        deadlines.current = Some((lease_id, deadline));
    }
}

/// Grants a lease, puts the key, and starts the keep-alive task.
pub(crate) async fn register(
    mut client: Client,
    config: Arc<EtcdConfig>,
    instance_id: &str,
    ttl: Duration,
) -> Result<Registration, StoreError> {
    if instance_id.is_empty() || instance_id.contains('/') {
        return Err(StoreError::InvalidConfig {
            message: format!("instance id must be non-empty and without `/`, got `{instance_id}`"),
        });
    }
    let ttl_secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
    let key = config.alive_key(instance_id);
    let valid_until = LeaseDeadline::default();
    // The lease of this instance's previous incarnation, if its key is still there: a process
    // that died (or was killed and restarted) within the TTL.
    let previous = request(&config, "get", &key, client.get(key.as_str(), None))
        .await?
        .kvs()
        .first()
        .map(|kv| kv.lease())
        .filter(|lease| *lease != 0);
    let sent = Instant::now();
    let lease_id = grant_and_put(&config, &mut client, &key, instance_id, ttl_secs).await?;
    valid_until.set(lease_id, sent + Duration::from_secs(ttl_secs as u64));
    if let Some(previous) = previous.filter(|previous| *previous != lease_id) {
        // Best effort: if it fails, what the old lease holds goes when it expires, as it did
        // before this was done; the registration itself (a new lease, the key on it) stands.
        if let Err(error) = revoke_previous_incarnation(&config, &mut client, &key, previous).await {
            tracing::warn!(%error, key, lease = previous, "cannot revoke the previous incarnation's lease; it expires after its TTL");
        }
    }
    let lease = Arc::new(AtomicI64::new(lease_id));
    let (stop, stop_requests) = oneshot::channel();
    let keeper = KeepAlive {
        config,
        client,
        key: key.clone(),
        value: instance_id.to_owned(),
        ttl_secs,
        lease_id: lease.clone(),
        valid_until: valid_until.clone(),
        needs_lease: false,
    };
    let task = tokio::spawn(keeper.run(stop_requests));
    Ok(Registration { key, lease_id: lease, valid_until, stop: Some(stop), task: Some(task) })
}

/// Revokes the lease of this instance's previous incarnation, after the alive key moved to
/// the new lease (so the key itself never disappears: nobody sees the instance die and come
/// back). Whatever else that process held with its lease goes at once: a shard set's leader
/// key, so a replica takes over now instead of after the TTL. Instance ids are one process
/// each (`tessera-topology`'s README): a second live process with the same id would lose
/// its leases to this one.
async fn revoke_previous_incarnation(
    config: &EtcdConfig,
    client: &mut Client,
    key: &str,
    previous: i64,
) -> Result<(), StoreError> {
    match with_timeout(config, "lease revoke", key, client.lease_revoke(previous)).await? {
        Ok(_) => {
            tracing::info!(
                key,
                lease = previous,
                "revoked the lease of this instance's previous incarnation: what it held is free now"
            );
            Ok(())
        }
        // Expired meanwhile: nothing to revoke.
        Err(etcd_client::Error::GRpcStatus(status)) if status.message().contains("lease not found") => Ok(()),
        Err(source) => {
            Err(StoreError::Request { operation: "lease revoke", key: key.to_owned(), source: Box::new(source) })
        }
    }
}

async fn grant_and_put(
    config: &EtcdConfig,
    client: &mut Client,
    key: &str,
    value: &str,
    ttl_secs: i64,
) -> Result<i64, StoreError> {
    let lease = request(config, "lease grant", key, client.lease_grant(ttl_secs, None)).await?;
    let options = PutOptions::new().with_lease(lease.id());
    request(config, "put", key, client.put(key, value, Some(options))).await?;
    Ok(lease.id())
}

/// The background task of one registration.
struct KeepAlive {
    config: Arc<EtcdConfig>,
    client: Client,
    key: String,
    value: String,
    ttl_secs: i64,
    lease_id: Arc<AtomicI64>,
    valid_until: LeaseDeadline,
    /// The lease expired (etcd was gone longer than the TTL): grant a new one.
    needs_lease: bool,
}

/// The reason of the stream's end when etcd answers a keep-alive with a TTL of zero.
const LEASE_EXPIRED: &str = "lease expired";

impl KeepAlive {
    async fn run(mut self, mut stop_requests: oneshot::Receiver<StopRequest>) {
        let mut backoff = self.config.backoff();
        loop {
            let error = tokio::select! {
                stop = &mut stop_requests => return self.stop(stop.ok().flatten()).await,
                error = self.keep_alive(&mut backoff) => error,
            };
            // etcd answered that the lease is gone: it was away longer than the TTL.
            let gone = error.is_lease_not_found()
                || matches!(&error, StoreError::StreamEnded { reason, .. } if reason == LEASE_EXPIRED);
            if gone {
                self.needs_lease = true;
            }
            let reason = std::error::Error::source(&error).map(ToString::to_string);
            tracing::warn!(key = %self.key, %error, ?reason, "liveness lease keep-alive interrupted; retrying");
            if gone {
                // etcd is back, and every moment without a key is a moment a peer may
                // take this instance for dead: grant again at once, not after a backoff.
                continue;
            }
            tokio::select! {
                stop = &mut stop_requests => return self.stop(stop.ok().flatten()).await,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
            match super::connect(&self.config).await {
                Ok(client) => self.client = client,
                Err(error) => tracing::warn!(%error, "reconnecting to etcd for liveness"),
            }
        }
    }

    /// Keeps the lease alive until something fails.
    async fn keep_alive(&mut self, backoff: &mut Backoff) -> StoreError {
        let config = self.config.clone();
        let key = self.key.clone();
        if self.needs_lease {
            tessera_runtime::failpoint::delay("liveness.before_regrant").await;
            let sent = Instant::now();
            match grant_and_put(&config, &mut self.client, &key, &self.value, self.ttl_secs).await {
                Ok(lease_id) => {
                    self.lease_id.store(lease_id, Ordering::Relaxed);
                    self.valid_until.set(lease_id, sent + Duration::from_secs(self.ttl_secs as u64));
                    self.needs_lease = false;
                    tracing::info!(%key, lease_id, "liveness lease granted again");
                }
                Err(error) => return error,
            }
        }
        let lease_id = self.lease_id.load(Ordering::Relaxed);
        let (mut keeper, mut responses) =
            match request(&config, "lease keep-alive", &key, self.client.lease_keep_alive(lease_id)).await {
                Ok(streams) => streams,
                Err(error) => return error,
            };
        let interval = Duration::from_millis((self.ttl_secs as u64 * 1_000 / 3).max(100));
        loop {
            let sent = Instant::now();
            if let Err(error) = request(&config, "lease keep-alive", &key, keeper.keep_alive()).await {
                return error;
            }
            let response = match request(&config, "lease keep-alive", &key, responses.message()).await {
                Ok(Some(response)) => response,
                Ok(None) => {
                    return StoreError::StreamEnded {
                        operation: "lease keep-alive",
                        key,
                        reason: "closed by the server".into(),
                    };
                }
                Err(error) => return error,
            };
            if response.ttl() <= 0 {
                self.needs_lease = true;
                return StoreError::StreamEnded { operation: "lease keep-alive", key, reason: LEASE_EXPIRED.into() };
            }
            self.valid_until.set(lease_id, sent + Duration::from_secs(response.ttl() as u64));
            backoff.reset();
            tokio::time::sleep(interval).await;
        }
    }

    /// Revokes the lease (best effort) and reports to whoever asked.
    async fn stop(mut self, reply: StopRequest) {
        let config = self.config.clone();
        let lease_id = self.lease_id.load(Ordering::Relaxed);
        let result = with_timeout(&config, "lease revoke", &self.key, self.client.lease_revoke(lease_id))
            .await
            .and_then(|revoked| match revoked {
                Ok(_) => Ok(()),
                // Already gone (expired while etcd was away): nothing to revoke.
                Err(etcd_client::Error::GRpcStatus(status)) if status.message().contains("lease not found") => Ok(()),
                Err(source) => Err(StoreError::Request {
                    operation: "lease revoke",
                    key: self.key.clone(),
                    source: Box::new(source),
                }),
            });
        if let Err(error) = &result {
            tracing::warn!(key = %self.key, %error, "revoking liveness lease");
        }
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }
}
