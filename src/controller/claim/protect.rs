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
use crate::kube::{add_finalizer, remove_finalizer};
use crate::provision::ClaimView;
use crate::provision::snapshot::SnapshotSource;

/// A source as read for the request, to be protected before `CreateVolume`.
pub enum Source {
    Snapshot(Box<VolumeSnapshot>),
    Claim(Box<PersistentVolumeClaim>),
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

/// Lets the snapshot go once the volume made from it is saved (or the
/// deleted claim that restored it is cleaned up). Best effort: the orphan
/// sweep removes a finalizer left behind.
pub async fn release_snapshot(ctx: &Context, source: &SnapshotSource) {
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
