//! The orphan sweep of snapshot source protection (`--snapshot-orphan-sweep-interval`): a
//! VolumeSnapshot keeps our source-protection finalizer only while a claim still waits to be
//! restored from it. The create path removes it after the PV is saved, and the cleanup of a
//! deleted claim after its volume is gone; a removal that failed, or a process that died
//! before it, leaves it behind, and the snapshot could then never be deleted. Each sweep
//! lists the snapshots (one request) and removes the finalizer where no pending claim of the
//! claims cache names the snapshot. upstream: pkg/controller/snapshot_finalizer_controller.go.

use std::sync::Arc;
use std::time::Duration;

use kube::api::ListParams;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::claim::{self, ClaimMemory, snapshot_awaited};
use crate::keys;
use crate::kube::slim::Claim;
use crate::kube::snapshot::{VolumeSnapshot, unprotect};
use crate::kube::{LeaderGate, Listed, has_finalizer};

/// What the sweep reads and writes with: the claim path's view of which
/// claims may still restore, and the API client behind the leader gate.
pub struct Sweep {
    /// The work lane of the API client.
    pub client: Client,
    pub leader: LeaderGate,
    /// The claim cache, and whether it holds its first list.
    pub claims: Store<Claim>,
    pub claims_listed: Listed,
    /// The claim path's memory: a claim saved or cleaned up by this process
    /// waits for no snapshot, whatever the cache still shows.
    pub memory: Arc<ClaimMemory>,
}

impl Sweep {
    /// The sweep of the claim path running in `claims`.
    pub fn of(claims: &claim::Context) -> Sweep {
        Sweep {
            client: claims.shared.client.clone(),
            leader: claims.shared.leader.clone(),
            claims: claims.caches.claims.clone(),
            claims_listed: claims.caches.claims_listed.clone(),
            memory: claims.memory.clone(),
        }
    }
}

/// Sweeps every `every` until `stop`, the first time once the claim cache
/// holds its first list: before that it shows no claim waiting for any
/// snapshot, and a sweep right after a start or a change of leader would take
/// the protection off the snapshots of pending restores.
pub async fn run(ctx: Sweep, every: Duration, stop: CancellationToken) {
    tokio::select! {
        _ = ctx.claims_listed.wait() => {}
        _ = stop.cancelled() => return,
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sweep(&ctx).await,
            _ = stop.cancelled() => return,
        }
    }
}

async fn sweep(ctx: &Sweep) {
    if !ctx.leader.is_leader() {
        return;
    }
    let snapshots = match Api::<VolumeSnapshot>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            warn!(error = %e, "snapshot sweep: listing VolumeSnapshots failed; next sweep retries");
            return;
        }
    };
    for snapshot in snapshots
        .iter()
        .filter(|s| has_finalizer(*s, keys::FINALIZER_SNAPSHOT_SOURCE))
    {
        let namespace = snapshot.namespace().unwrap_or_default();
        let name = snapshot.name_any();
        if snapshot_awaited(&ctx.claims, &ctx.memory, snapshot, None) {
            debug!(snapshot = %name, %namespace, "snapshot sweep: a pending claim restores from it");
            continue;
        }
        let api = Api::<VolumeSnapshot>::namespaced(ctx.client.clone(), &namespace);
        match unprotect(&api, snapshot.clone(), keys::FINALIZER_SNAPSHOT_SOURCE).await {
            Ok(()) => {
                info!(snapshot = %name, %namespace, "snapshot sweep: removed the source protection no claim needs")
            }
            Err(e) => {
                warn!(snapshot = %name, %namespace, error = %e, "snapshot sweep: removal failed; next sweep retries")
            }
        }
    }
}
