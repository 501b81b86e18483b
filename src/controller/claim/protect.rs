//! The protection of what a volume is made from: upstream's finalizers on the
//! VolumeSnapshot of a restore and on the source claim of a clone, put on the
//! source as it was read (a source being deleted takes no new finalizer, so
//! a protected source was protected before its deletion began) right before
//! `CreateVolume`, and taken off when nothing waits for it any more.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::error::ClaimError;
use super::{ClaimMemory, Context};
use crate::controller::queue::Action;
use crate::keys;
use crate::kube::slim::Claim;
use crate::kube::snapshot::{self, VolumeSnapshot};
use crate::kube::update::Edited;
use crate::kube::{get_fresh, has_finalizer, update};
use crate::provision::ClaimView;
use crate::provision::snapshot::{SnapshotSource, smaller_than_snapshot};

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
/// A source claim gone by the time it is to be held was never sent either (a
/// create fails when its source is gone before its protection).
pub async fn hold_for_cleanup(ctx: &Context, source: &Source) -> Result<bool, ClaimError> {
    if source.deleting() && !source.protected() {
        return Ok(false);
    }
    Ok(put_on(ctx, source).await? == Held::Yes)
}

/// Puts the source's protection on it (fenced on what was read) before a
/// `CreateVolume` that names it. A source claim gone since it was read fails
/// the attempt as a source that cannot be read does (upstream's clone
/// finalizer update returns its error): the call would name a volume its own
/// claim's deletion may be deleting (the model's finding F3).
pub async fn protect(ctx: &Context, source: &Source) -> Result<(), ClaimError> {
    match put_on(ctx, source).await? {
        Held::Yes => Ok(()),
        Held::Gone { namespace, name } => Err(ClaimError::DataSource {
            kind: keys::CLAIM_KIND,
            reason: format!(
                "error getting PVC {name} (namespace {namespace:?}) from api server: \
                 persistentvolumeclaims {name:?} not found"
            ),
            name,
        }),
    }
}

/// Whether the protection is on the source now.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    Yes,
    /// The source claim is gone, or its name is another claim's now.
    Gone {
        namespace: String,
        name: String,
    },
}

async fn put_on(ctx: &Context, source: &Source) -> Result<Held, ClaimError> {
    let result = match source {
        Source::Snapshot(s) => {
            let api = Api::<VolumeSnapshot>::namespaced(
                ctx.shared.client.clone(),
                &s.namespace().unwrap_or_default(),
            );
            snapshot::protect(&api, s, keys::FINALIZER_SNAPSHOT_SOURCE)
                .await
                .map(|()| Held::Yes)
        }
        Source::Claim(c) if ClaimView(c).has_finalizer(keys::FINALIZER_CLONE_SOURCE) => {
            Ok(Held::Yes)
        }
        // An update of the claim as read (a conflict reads it again); a claim
        // being deleted takes no new finalizer.
        Source::Claim(c) => {
            let view = ClaimView(c);
            let api = Api::<PersistentVolumeClaim>::namespaced(
                ctx.shared.client.clone(),
                view.namespace(),
            );
            update::edit(
                &api,
                view.name(),
                view.uid(),
                Some(c.as_ref().clone()),
                |c| update::add_finalizer(c, keys::FINALIZER_CLONE_SOURCE),
            )
            .await
            .map(|edited| match edited {
                Edited::Gone => Held::Gone {
                    namespace: view.namespace().to_string(),
                    name: view.name().to_string(),
                },
                Edited::Written(_) | Edited::Unchanged(_) => Held::Yes,
            })
        }
    };
    result.map_err(ClaimError::ProtectSource)
}

/// Whether a claim other than `except` may still send a `CreateVolume` restoring from
/// `snapshot`: pending in the claim cache, neither saved nor cleaned up by this process (the cache
/// may not show that yet), and not asking for less than the snapshot's `restoreSize` — such a
/// claim is refused before any create, for good, and must not pin the snapshot while it exists.
/// The cache shows every claim this process works on, so a claim that may be sending a restore is
/// never missed; a claim it shows late keeps the protection a while longer, for the sweep.
/// `claims` is the claim cache, `memory` the claim path's.
pub fn snapshot_awaited(
    claims: &Store<Claim>,
    memory: &ClaimMemory,
    snapshot: &VolumeSnapshot,
    except: Option<&str>,
) -> bool {
    let namespace = snapshot.namespace().unwrap_or_default();
    let name = snapshot.name_any();
    claims.state().iter().any(|c| {
        let claim = ClaimView(&c.0);
        let uid = claim.uid();
        Some(uid) != except
            && claim.waits_for(keys::SNAPSHOT_KIND, &namespace, &name)
            && !memory.pv_saved(uid)
            && !memory.intent_released(uid)
            && smaller_than_snapshot(&c.0, snapshot).is_none()
    })
}

/// Lets the snapshot go once the volume of `claim` made from it is saved (or
/// the deleted claim is cleaned up), unless another claim may still restore
/// from it ([`snapshot_awaited`]): that claim's `CreateVolume` may be on its
/// way, and without the protection the snapshot could go under it. The last
/// claim done lets it go, or the orphan sweep. Best effort: the sweep also
/// removes a finalizer left behind by a failed removal.
pub async fn release_snapshot(ctx: &Context, source: &SnapshotSource, claim: &str) {
    let api = Api::<VolumeSnapshot>::namespaced(ctx.shared.client.clone(), &source.namespace);
    let snapshot = match get_fresh(&api, &source.name).await {
        Ok(Some(s)) if has_finalizer(&s, keys::FINALIZER_SNAPSHOT_SOURCE) => s,
        Ok(_) => return,
        Err(e) => {
            warn!(snapshot = %source.name, error = %e, "failed to read the snapshot to remove its source-protection finalizer");
            return;
        }
    };
    if snapshot_awaited(&ctx.caches.claims, &ctx.memory, &snapshot, Some(claim)) {
        debug!(snapshot = %source.name, "another claim restores from it: keeping its protection");
        return;
    }
    if let Err(e) = snapshot::unprotect(&api, snapshot, keys::FINALIZER_SNAPSHOT_SOURCE).await {
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
        // The error policy looks at it again after its backoff.
        return Err(ClaimError::ClonesPending);
    }
    let _worker = ctx
        .clone_releases
        .acquire()
        .await
        .expect("the semaphore is never closed");
    // The cached copy of a bound claim is trimmed: the update starts from a fresh read.
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), view.namespace());
    update::edit(&api, view.name(), view.uid(), None, |c| {
        update::remove_finalizer(c, keys::FINALIZER_CLONE_SOURCE)
    })
    .await
    .map_err(|source| ClaimError::Read {
        what: "PersistentVolumeClaim (removing the cloning protection)",
        source,
    })?;
    info!(claim = %view.key(), "no pending clone: removed the cloning protection");
    Ok(Action::await_change())
}
