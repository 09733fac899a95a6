//! The election task: keeps this instance's liveness lease and, when its shard set is
//! replicated, campaigns for the shard set's leader key, records the flush marks as
//! leader and reads them as follower, one tick every [`TICK`]; what it decides goes into
//! the [`Leadership`] state the flusher reads ([`super`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tessera_runtime::Shutdown;
use tessera_runtime::logging::{RateLimitedLog, error_chain};
use tessera_runtime::{Backoff, sleep_or_stop};
use tessera_topology::{Election, EtcdConfig, Leader, PlacementHandle, PlacementStore, Registration};

use super::super::metrics::FlushMetrics;
use super::{Leadership, TICK};
use crate::outbound::Ingesters;
use tessera_core::clock::now_ms;
/// What the election task needs.
pub struct ElectionSettings {
    /// etcd.
    pub etcd: EtcdConfig,
    /// This instance.
    pub instance_id: String,
    /// Liveness lease TTL.
    pub ttl: Duration,
    /// The aggregator's `max_buffer_past`, ms: how long a tile may stay open after its end.
    pub max_buffer_past_ms: i64,
}

/// Keeps this instance's liveness lease and, when its shard set is
/// replicated, runs its side of the election until `shutdown`.
pub async fn run_election(
    settings: ElectionSettings,
    leadership: Leadership,
    placement: PlacementHandle,
    ingesters: Ingesters,
    metrics: FlushMetrics,
    shutdown: Shutdown,
) {
    let Some((store, registration)) = register(&settings, &shutdown).await else { return };
    let _ = leadership.inner.deadline.set(registration.deadline());
    let mut task = ElectionTask {
        settings,
        leadership,
        store,
        registration,
        ingesters,
        metrics,
        election: None,
        leaderless_since: None,
        answered_leaderless_since: None,
        recorded: Vec::new(),
        fenced: false,
    };
    loop {
        if let Err(error) = task.tick(&placement).await {
            if ELECTION_LOG.allow() {
                tracing::warn!(error = %error_chain(&error), "leader election: etcd request failed");
            }
            task.metrics.election_errors.inc();
            // The other replicas may not have been heard either: the grace starts over.
            task.answered_leaderless_since = None;
        }
        task.publish_state();
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(TICK) => {}
        }
    }
    task.stop().await;
}

static ELECTION_LOG: RateLimitedLog = RateLimitedLog::new("aggregator.election", 1);

struct ElectionTask {
    settings: ElectionSettings,
    leadership: Leadership,
    store: PlacementStore,
    registration: Registration,
    ingesters: Ingesters,
    metrics: FlushMetrics,
    /// The shard set's election, once the placement names one.
    election: Option<(u32, Election)>,
    /// When this replica first saw no leader, for the takeover time.
    leaderless_since: Option<Instant>,
    /// Since when every tick's etcd answer said the shard set has no leader (reset by a
    /// failed request), for [`Leadership::leaderless_grace`].
    answered_leaderless_since: Option<Instant>,
    /// The marks last recorded.
    recorded: Vec<i64>,
    /// Leading but fenced off at the last tick (for the log and the count).
    fenced: bool,
}

impl ElectionTask {
    async fn tick(&mut self, placement: &PlacementHandle) -> Result<(), tessera_topology::StoreError> {
        let inner = &self.leadership.inner;
        let current = placement.current();
        let instance_id = self.settings.instance_id.as_str();
        let Some(instance) = current.instance(instance_id).filter(|_| current.replication_factor() > 1) else {
            inner.replicated.store(false, Ordering::Release);
            self.election = None;
            return Ok(());
        };
        let shard_set = instance.shard_set_id;
        if self.election.as_ref().is_none_or(|(set, _)| *set != shard_set) {
            self.election = Some((shard_set, self.store.election(shard_set, instance_id)));
            inner.leader_lease.store(0, Ordering::Release);
        }
        let Some((_, election)) = &self.election else { return Ok(()) };
        let election = election.clone();
        inner.replicated.store(true, Ordering::Release);

        let lease_id = self.registration.lease_id();
        let observed = election.observe(lease_id).await?;
        let peers = current.shard_sets().remove(&shard_set).unwrap_or_default();
        let others_alive = peers.iter().any(|peer| peer.id != instance_id && observed.alive.contains(&peer.id));
        inner.others_alive.store(others_alive, Ordering::Release);

        let mut leader = observed.leader;
        if leader == Leader::Nobody {
            let since = *self.leaderless_since.get_or_insert_with(Instant::now);
            let answered_since = *self.answered_leaderless_since.get_or_insert_with(Instant::now);
            let max_buffer_past_ms = self.settings.max_buffer_past_ms;
            let nobody_whole = answered_since.elapsed() >= self.leadership.leaderless_grace(max_buffer_past_ms);
            if !others_alive || nobody_whole || self.leadership.complete(max_buffer_past_ms) {
                leader = election.campaign(lease_id).await?;
                if leader == Leader::Us {
                    self.metrics.election("won");
                    self.metrics.takeover_duration.observe(since.elapsed().as_secs_f64());
                    tracing::info!(shard_set, "elected leader of the shard set");
                } else {
                    self.metrics.election("lost");
                }
            }
        }
        if leader != Leader::Nobody {
            self.leaderless_since = None;
            self.answered_leaderless_since = None;
        }
        let leads_on = if leader == Leader::Us { lease_id } else { 0 };
        let led_on = inner.leader_lease.load(Ordering::Acquire);
        if leads_on != 0 && led_on != leads_on {
            // Take over from the last leader's marks before flushing anything.
            // Also when the campaign's answer was lost and this tick is the
            // first to see the key ours: only a leader writes the marks, so
            // the ones observed are the last leader's.
            self.leadership.set_marks(&observed.marks);
        }
        inner.leader_lease.store(leads_on, Ordering::Release);
        if led_on != 0 && leads_on == 0 {
            tracing::warn!(shard_set, ?leader, "no longer leader of the shard set; holding tiles");
        }
        match leader {
            Leader::Us => {
                // Compared with what was recorded, not with the last tick:
                // a write that failed is made again on the next one.
                let acknowledged = self.leadership.acknowledge(&self.ingesters);
                if acknowledged != self.recorded {
                    let marks = self.leadership.marks_text(&acknowledged);
                    if election.record_flushed(lease_id, &marks).await? {
                        self.metrics.flush_marks_recorded.inc();
                        self.leadership.recorded(&acknowledged);
                        self.recorded = acknowledged;
                    } else {
                        inner.leader_lease.store(0, Ordering::Release);
                    }
                }
            }
            Leader::Other(_) | Leader::Nobody => self.leadership.set_marks(&observed.marks),
        }
        let now = now_ms();
        let lags: Vec<(String, f64)> = inner
            .policies
            .iter()
            .zip(self.leadership.marks())
            .filter(|(_, mark)| *mark != i64::MIN)
            .map(|(policy, mark)| (policy.to_string(), (now - mark).max(0) as f64 / 1000.0))
            .collect();
        self.metrics.set_flush_mark_lags(&lags);
        Ok(())
    }

    /// The leader gauge, after every tick (also one whose etcd requests
    /// failed): 1 only while this replica may flush. A leader whose lease
    /// etcd has not confirmed for TTL minus [`FENCE_MARGIN`](super::FENCE_MARGIN) is fenced off:
    /// logged and counted once per episode.
    fn publish_state(&mut self) {
        let Some((shard_set, _)) = self.election.as_ref().filter(|_| self.leadership.replicated()) else {
            self.metrics.set_leader(None);
            return;
        };
        let flushes = self.leadership.may_flush();
        self.metrics.set_leader(Some((*shard_set, flushes)));
        let fenced = self.leadership.leads() && !flushes;
        if fenced && !self.fenced {
            self.metrics.fenced.inc();
            tracing::warn!(
                shard_set,
                remaining_ms = self.leadership.lease_remaining().as_millis() as u64,
                "leader fenced off: etcd has not confirmed the lease in time; holding tiles until it does"
            );
        } else if !fenced && self.fenced && flushes {
            tracing::info!(shard_set, "lease confirmed again; flushing as leader");
        }
        self.fenced = fenced;
    }

    /// Resigns (when another replica can take over) and revokes the lease.
    async fn stop(self) {
        let inner = &self.leadership.inner;
        if self.leadership.leads() && inner.others_alive.load(Ordering::Acquire) {
            inner.leader_lease.store(0, Ordering::Release);
            if let Some((shard_set, election)) = &self.election {
                match election.resign(self.registration.lease_id()).await {
                    Ok(()) => tracing::info!(shard_set, "resigned as leader of the shard set"),
                    Err(error) => tracing::warn!(error = %error_chain(&error), "resigning as leader"),
                }
            }
        }
        match tokio::time::timeout(Duration::from_secs(2), self.registration.revoke()).await {
            Ok(Ok(())) => tracing::info!("liveness lease revoked"),
            Ok(Err(error)) => tracing::warn!(error = %error_chain(&error), "revoking the liveness lease"),
            Err(_) => tracing::warn!("revoking the liveness lease timed out; it expires with its TTL"),
        }
    }
}

/// Registers the liveness lease, retrying while etcd is unreachable.
async fn register(settings: &ElectionSettings, shutdown: &Shutdown) -> Option<(PlacementStore, Registration)> {
    tessera_runtime::failpoint::delay("aggregator.election.before_register").await;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    loop {
        let attempt = async {
            let store = PlacementStore::connect(settings.etcd.clone()).await?;
            let registration = store.register_instance(&settings.instance_id, settings.ttl).await?;
            Ok::<_, tessera_topology::StoreError>((store, registration))
        };
        let error = tokio::select! {
            () = shutdown.wait() => return None,
            result = attempt => match result {
                Ok((store, registration)) => {
                    tracing::info!(key = registration.key(), "liveness lease registered");
                    return Some((store, registration));
                }
                Err(error) => error,
            },
        };
        tracing::warn!(error = %error_chain(&error), "cannot register liveness in etcd; will retry");
        if !sleep_or_stop(backoff.next_delay(), shutdown).await {
            return None;
        }
    }
}
