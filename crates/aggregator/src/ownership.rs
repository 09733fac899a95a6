//! Keeping an eye on the placement: the shards this instance owns now, the
//! placement version, and warnings an operator should see; plus the etcd
//! liveness lease that `tessera placement show` reads.
//!
//! Ownership itself is decided per batch by the decoder
//! ([`Placement::owns`](tessera_topology::Placement::owns) at the window
//! start), so a move takes effect exactly at its cutover whatever this
//! task is doing.

use std::time::Duration;

use tessera_runtime::{ReadinessCondition, Shutdown};
use tessera_topology::{EtcdConfig, Placement, PlacementHandle, PlacementStore};

use crate::metrics::Metrics;
use crate::now_ms;
use crate::policy::StoragePolicy;

/// How often the owned-shard gauge is refreshed (ownership changes with time at cutovers).
const REFRESH: Duration = Duration::from_secs(1);

/// Refreshes the ownership gauges until `shutdown`, logging each new placement.
pub async fn watch_ownership(
    placement: PlacementHandle,
    instance_id: String,
    policies: Vec<StoragePolicy>,
    metrics: Metrics,
    ready: ReadinessCondition,
    shutdown: Shutdown,
) {
    let mut changes = placement.subscribe();
    let mut seen_version = None;
    let mut owned_before = None;
    loop {
        let current = placement.current();
        if seen_version != Some(current.version()) {
            seen_version = Some(current.version());
            describe(&current, &instance_id, &policies);
            metrics.placement_version.set(current.version() as i64);
            ready.mark_ready();
        }
        let owned = current.owned_shards(&instance_id, now_ms()).count();
        metrics.shards_owned.set(owned as i64);
        if owned_before.is_some_and(|before| before != owned) {
            tracing::info!(version = current.version(), shards = owned, "owned shards changed");
        }
        owned_before = Some(owned);
        tokio::select! {
            () = shutdown.wait() => return,
            changed = changes.changed() => if changed.is_err() { tokio::time::sleep(REFRESH).await },
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
}

/// Logs what a new placement means for this instance.
fn describe(placement: &Placement, instance_id: &str, policies: &[StoragePolicy]) {
    let Some(instance) = placement.instance(instance_id) else {
        tracing::warn!(
            version = placement.version(),
            instance_id,
            "this instance is not in the placement: every partial batch will be refused as not_owner"
        );
        return;
    };
    tracing::info!(
        version = placement.version(),
        shards = instance.shards.len(),
        shard_set = instance.shard_set_id,
        "using placement"
    );
    for shard in &instance.shards {
        for time in [shard.cutover_ms, shard.cutoff_ms] {
            for policy in policies {
                if time != 0 && time.rem_euclid(policy.resolution_ms()) != 0 {
                    tracing::warn!(
                        shard = shard.id,
                        time_ms = time,
                        policy = %policy,
                        "a shard moves inside a tile of this policy: that tile is split between two instances; \
                         schedule moves on a multiple of every resolution"
                    );
                }
            }
        }
    }
}

/// Holds this instance's liveness lease in etcd until `shutdown`, then
/// revokes it. Retries registering while etcd is unreachable; once
/// registered, the lease is kept alive (and granted again after an etcd
/// outage) by the registration itself.
pub async fn keep_registered(config: EtcdConfig, instance_id: String, ttl: Duration, shutdown: Shutdown) {
    let mut wait = Duration::from_millis(200);
    let registration = loop {
        let attempt = async {
            let store = PlacementStore::connect(config.clone()).await?;
            store.register_instance(&instance_id, ttl).await
        };
        let error = tokio::select! {
            () = shutdown.wait() => return,
            result = attempt => match result {
                Ok(registration) => break registration,
                Err(error) => error,
            },
        };
        tracing::warn!(error = %tessera_runtime::logging::error_chain(&error), "cannot register liveness in etcd; will retry");
        tokio::select! {
            () = shutdown.wait() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(10));
    };
    tracing::info!(key = registration.key(), "liveness lease registered");
    shutdown.wait().await;
    match tokio::time::timeout(Duration::from_secs(2), registration.revoke()).await {
        Ok(Ok(())) => tracing::info!("liveness lease revoked"),
        Ok(Err(error)) => {
            tracing::warn!(error = %tessera_runtime::logging::error_chain(&error), "revoking the liveness lease")
        }
        Err(_) => tracing::warn!("revoking the liveness lease timed out; it expires with its TTL"),
    }
}
