//! The protection of what a volume is made from: upstream's finalizers on the
//! VolumeSnapshot of a restore and on the source claim of a clone, put on the
//! source as it was read (a source being deleted takes no new finalizer, so
//! a protected source was protected before its deletion began) right before
//! `CreateVolume`, and taken off when nothing waits for it any more.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::error::ClaimError;
use crate::controller::Context;
use crate::keys;
use crate::kube::snapshot::{self, VolumeSnapshot};
use crate::kube::{add_finalizer, has_finalizer, remove_finalizer};
use crate::provision::ClaimView;
use crate::provision::snapshot::SnapshotSource;

/// A source as read for the request, to be protected before `CreateVolume`.
pub enum Source {
    Snapshot(Box<VolumeSnapshot>),
    Claim(Box<PersistentVolumeClaim>),
}

impl Source {
    /// Whether our protection is on the source as read.
    fn protected(&self) -> bool {
        match self {
            Source::Snapshot(s) => has_finalizer(s.as_ref(), keys::FINALIZER_SNAPSHOT_SOURCE),
            Source::Claim(c) => ClaimView(c).has_finalizer(keys::FINALIZER_CLONE_SOURCE),
        }
    }

    fn deleting(&self) -> bool {
        match self {
            Source::Snapshot(s) => s.metadata.deletion_timestamp.is_some(),
            Source::Claim(c) => ClaimView(c).is_deleting(),
        }
    }
}

/// For the cleanup of a deleted claim that may have asked for a volume made
/// from `source`: holds the source with our protection before the driver is
/// asked again, so it cannot go while that call names it. `false`: the
/// source is being deleted without our protection, so no create of a claim
/// still waiting for it can have been sent (a create protects its source
/// first, and the protection stays while any claim waits for it), and there
/// is nothing to ask; a deleting source takes no new finalizer anyway.
pub async fn hold_for_cleanup(ctx: &Context, source: &Source) -> Result<bool, ClaimError> {
    if source.deleting() && !source.protected() {
        return Ok(false);
    }
    protect(ctx, source).await?;
    Ok(true)
}

/// Puts the source's protection on it (fenced on what was read).
pub async fn protect(ctx: &Context, source: &Source) -> Result<(), ClaimError> {
    let result = match source {
        Source::Snapshot(s) => {
            let api = Api::<VolumeSnapshot>::namespaced(
                ctx.client.clone(),
                &s.namespace().unwrap_or_default(),
            );
            snapshot::protect(&api, s, keys::FINALIZER_SNAPSHOT_SOURCE).await
        }
        Source::Claim(c) if ClaimView(c).has_finalizer(keys::FINALIZER_CLONE_SOURCE) => Ok(()),
        Source::Claim(c) => {
            let api = Api::<PersistentVolumeClaim>::namespaced(
                ctx.client.clone(),
                ClaimView(c).namespace(),
            );
            add_finalizer(&api, c, keys::FINALIZER_CLONE_SOURCE)
                .await
                .map(|_| ())
        }
    };
    result.map_err(ClaimError::ProtectSource)
}

/// Whether a claim other than `except` still waits to be restored from the
/// snapshot: pending in the claim cache, and neither saved nor cleaned up by
/// this process (the cache may not show that yet). The cache shows every
/// claim this process works on, so a claim that may be sending a restore is
/// never missed; a claim it shows late keeps the protection a while longer,
/// for the sweep.
pub fn snapshot_awaited(ctx: &Context, namespace: &str, name: &str, except: Option<&str>) -> bool {
    ctx.caches.claims.state().iter().any(|c| {
        let claim = ClaimView(&c.0);
        let uid = claim.uid();
        Some(uid) != except
            && claim.waits_for(keys::SNAPSHOT_KIND, namespace, name)
            && !ctx.claims.pv_saved(uid)
            && !ctx.claims.intent_released(uid)
    })
}

/// Lets the snapshot go once the volume of `claim` made from it is saved (or
/// the deleted claim is cleaned up), unless another claim still waits to be
/// restored from it: that claim's `CreateVolume` may be on its way, and
/// without the protection the snapshot could go under it. The last claim
/// done lets it go, or the orphan sweep. Best effort: the sweep also removes
/// a finalizer left behind by a failed removal.
pub async fn release_snapshot(ctx: &Context, source: &SnapshotSource, claim: &str) {
    if snapshot_awaited(ctx, &source.namespace, &source.name, Some(claim)) {
        debug!(snapshot = %source.name, "another claim restores from it: keeping its protection");
        return;
    }
    let api = Api::<VolumeSnapshot>::namespaced(ctx.client.clone(), &source.namespace);
    if let Err(e) = snapshot::unprotect(&api, &source.name, keys::FINALIZER_SNAPSHOT_SOURCE).await {
        warn!(snapshot = %source.name, error = %e, "failed to remove the source-protection finalizer");
    }
}

/// A deleted claim that clones were made from: its protection goes once no
/// clone of it is pending (upstream's cloning-protection controller). Until
/// then it is looked at again after the claim's backoff.
pub async fn release_clone_source(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Action, ClaimError> {
    let view = ClaimView(claim);
    let pending = ctx.caches.claims.state();
    if pending
        .iter()
        .any(|c| ClaimView(&c.0).waits_for(keys::CLAIM_KIND, view.namespace(), view.name()))
    {
        debug!(claim = %view.key(), "a clone of it is pending: keeping its protection");
        return Ok(Action::requeue(
            ctx.claims
                .failed(view.uid(), crate::controller::memory::Hold::Nothing),
        ));
    }
    let _worker = ctx
        .clone_releases
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), view.namespace());
    remove_finalizer(&api, claim, keys::FINALIZER_CLONE_SOURCE)
        .await
        .map_err(|source| ClaimError::Read {
            what: "PersistentVolumeClaim (removing the cloning protection)",
            source,
        })?;
    info!(claim = %view.key(), "no pending clone: removed the cloning protection");
    Ok(Action::await_change())
}
