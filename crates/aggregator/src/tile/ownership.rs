//! Keeping an eye on the placement: the shards this instance owns now, the
//! placement version, and warnings an operator should see. (The etcd
//! liveness lease is kept by [`crate::flush`].)
//!
//! Ownership itself is decided per batch by the decoder
//! ([`Placement::owns`](tessera_topology::Placement::owns) at the window
//! start), so a move takes effect exactly at its cutover whatever this
//! task is doing.

use std::time::Duration;

use tessera_runtime::{ReadinessCondition, Shutdown};
use tessera_topology::{Placement, PlacementHandle};

use super::metrics::TileMetrics;
use super::policy::StoragePolicy;
use tessera_core::clock::now_ms;

/// How often the owned-shard gauge is refreshed (ownership changes with time at cutovers).
const REFRESH: Duration = Duration::from_secs(1);

/// Refreshes the ownership gauges until `shutdown`, logging each new placement.
pub async fn watch_ownership(
    placement: PlacementHandle,
    instance_id: String,
    policies: Vec<StoragePolicy>,
    metrics: TileMetrics,
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
