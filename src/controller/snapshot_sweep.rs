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
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Context;
use super::claim::snapshot_awaited;
use crate::keys;
use crate::kube::has_finalizer;
use crate::kube::snapshot::{VolumeSnapshot, unprotect};

/// Sweeps every `every` until `stop`, the first time once the claim cache
/// holds its first list: before that it shows no claim waiting for any
/// snapshot, and a sweep right after a start or a change of leader would take
/// the protection off the snapshots of pending restores.
pub async fn run(ctx: Arc<Context>, every: Duration, stop: CancellationToken) {
    tokio::select! {
        _ = ctx.caches.claims_listed.wait() => {}
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

async fn sweep(ctx: &Context) {
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
        if snapshot_awaited(ctx, snapshot, None) {
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
