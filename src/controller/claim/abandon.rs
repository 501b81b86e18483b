//! The abandon sequence: a claim deleted while our intent was on it. If its
//! PV was saved, the volume path owns the volume and only the intent is left
//! to release. Otherwise the backend volume is found by its deterministic
//! name — an idempotent `CreateVolume` returns its handle, or proves it never
//! existed — its handle is recorded on the claim, and it is deleted; then the
//! intent goes and the claim with it (DESIGN §2.5).
//!
//! The volume is deleted through `controller::backend`, the one home of
//! `DeleteVolume` for every path.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use tonic::Code;
use tracing::info;

use super::Context;
use super::decide::Answered;
use super::error::ClaimError;
use super::gather;
use crate::controller::queue::Action;
use crate::controller::{backend, bound_claim_uid};
use crate::csi::{classify, pb};
use crate::keys;
use crate::kube::update::{self, Edited};
use crate::kube::{get_fresh, is_not_found};
use crate::provision::{self, ClaimView, Plan};

pub async fn abandon(
    ctx: &Context,
    cached: &PersistentVolumeClaim,
    answered: Answered,
) -> Result<Action, ClaimError> {
    let view = ClaimView(cached);
    let uid = view.uid();
    let pv_name = provision::volume_name(
        &ctx.options.volume_name_prefix,
        uid,
        ctx.options.volume_name_uuid_length,
    )?;
    let saved = answered.pv_saved
        || get_fresh(&ctx.shared.pv_api(), &pv_name)
            .await
            .map_err(|source| ClaimError::Read {
                what: "PersistentVolume",
                source,
            })?
            .is_some_and(|pv| bound_claim_uid(&pv) == Some(uid));
    if saved {
        release_now(ctx, cached).await?;
        return Ok(Action::await_change());
    }
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), view.namespace());
    let Some(mut claim) =
        get_fresh(&api, view.name())
            .await
            .map_err(|source| ClaimError::Read {
                what: "PersistentVolumeClaim",
                source,
            })?
    else {
        return Ok(Action::await_change());
    };
    let fresh = ClaimView(&claim);
    if fresh.uid() != uid || !fresh.holds_intent() || !fresh.asks(&ctx.shared.driver.name) {
        return Ok(Action::await_change());
    }
    // The class is needed to rebuild the request, and its plan to name the
    // secret the deletion sends. StorageClass parameters are immutable: a
    // plan that cannot be made now could never have been sent.
    let class = class_of(ctx, fresh);
    let plan = class
        .as_ref()
        .ok()
        .and_then(|class| provision::plan(&claim, class, &ctx.shared.driver, &ctx.options).ok());
    let handle = match recorded_handle(fresh) {
        Some(h) => Some(h),
        None => match &plan {
            Some(plan) => {
                let class = class?;
                find_volume(ctx, &claim, &class, plan, answered.created).await?
            }
            None => {
                class?;
                None
            }
        },
    };
    if let Some(handle) = handle {
        if recorded_handle(ClaimView(&claim)).is_none()
            && let Some(recorded) = record_handle(ctx, &claim, &handle).await?
        {
            claim = recorded;
        }
        let secret = plan.as_ref().and_then(|p| p.provisioner_secret());
        backend::delete_volume(&ctx.shared, &handle, secret, false)
            .await
            .map_err(|e| ClaimError::deleting(&handle, e))?;
        info!(claim = %ClaimView(&claim).key(), volume = %handle, "deleted the volume of a claim deleted during provisioning");
    }
    ctx.memory.forget_created(uid);
    // No volume is being made from the claim's snapshot any more.
    if let Some(source) = restored_snapshot(&claim) {
        super::protect::release_snapshot(ctx, &source, uid).await;
    }
    release_now(ctx, &claim).await?;
    Ok(Action::await_change())
}

/// The deleted claim's class, from the cache: without it the request cannot
/// be rebuilt and the volume's handle cannot be learned, so the claim waits
/// (with a Warning saying why) rather than leak.
fn class_of(ctx: &Context, claim: ClaimView) -> Result<Arc<StorageClass>, ClaimError> {
    let name = claim.class().unwrap_or_default();
    ctx.shared
        .classes
        .get(&ObjectRef::new(name))
        .ok_or_else(|| {
            ClaimError::CleanupBlocked(format!(
                "storageclass.storage.k8s.io {name:?} not found; re-create it to let the claim go"
            ))
        })
}

/// The snapshot a claim is restored from, if any.
fn restored_snapshot(claim: &PersistentVolumeClaim) -> Option<provision::snapshot::SnapshotSource> {
    let source = ClaimView(claim).data_source()?;
    (source.kind == keys::SNAPSHOT_KIND && source.namespace.is_none()).then(|| {
        provision::snapshot::SnapshotSource {
            namespace: ClaimView(claim).namespace().to_string(),
            name: source.name.to_string(),
        }
    })
}

/// A cleanup that got as far as recording the handle must not create the
/// volume again: it may already be deleted, and `CreateVolume` would make a new one.
fn recorded_handle(claim: ClaimView) -> Option<String> {
    claim
        .annotations()
        .get(keys::ANN_ABANDONED_HANDLE)
        .filter(|h| !h.is_empty())
        .cloned()
}

/// The handle of the claim's backend volume, if one may exist: the
/// idempotent `CreateVolume` with the same name and request answers it.
async fn find_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &Plan,
    created: Option<pb::Volume>,
) -> Result<Option<String>, ClaimError> {
    if let Some(v) = created {
        return Ok(Some(v.volume_id));
    }
    // No create of this claim can have reached the driver: nothing to delete.
    let Some(request) = gather::for_cleanup(ctx, claim, class, plan).await? else {
        return Ok(None);
    };
    if !ctx.shared.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    match ctx.shared.csi.create_volume(request).await {
        Ok(resp) => Ok(resp.volume.map(|v| v.volume_id).filter(|h| !h.is_empty())),
        // Same name, incompatible parameters (the class changed?): the handle
        // cannot be learned. Keep the claim rather than leak.
        Err(s) if s.code() == Code::AlreadyExists => Err(ClaimError::CleanupBlocked(
            ClaimError::create_volume(s, crate::csi::CsiErrorClass::Final).to_string(),
        )),
        // The request itself is refused: no call with it can have made a volume.
        Err(s) if s.code() == Code::InvalidArgument => Ok(None),
        // Any other error says nothing about a volume an earlier call may have
        // made (that call may have timed out after creating it): try again,
        // the claim waits. Letting it go now could leak that volume.
        Err(s) => {
            let class = classify(s.code(), false);
            Err(ClaimError::create_volume(s, class))
        }
    }
}

/// Records the handle of a deleted claim's volume on the claim (an update of the copy just read;
/// annotations may still change on a claim that is being deleted). Returns the claim as written,
/// for the release that follows; `None` if it is gone (the volume is deleted all the same).
async fn record_handle(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    handle: &str,
) -> Result<Option<PersistentVolumeClaim>, ClaimError> {
    let view = ClaimView(claim);
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), view.namespace());
    let edited = update::edit(&api, view.name(), view.uid(), Some(claim.clone()), |c| {
        let annotations = c.metadata.annotations.get_or_insert_default();
        annotations.insert(keys::ANN_ABANDONED_HANDLE.to_string(), handle.to_string())
            != Some(handle.to_string())
    })
    .await
    .map_err(|source| ClaimError::RecordHandle {
        handle: handle.to_string(),
        source,
    })?;
    Ok(match edited {
        Edited::Written(c) | Edited::Unchanged(c) => Some(c),
        Edited::Gone => None,
    })
}

/// Releases the intent at once (the abandon path finishes with it), starting from `claim`: the
/// copy just read or written.
async fn release_now(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let view = ClaimView(claim);
    if !view.holds_intent() || ctx.memory.intent_released(view.uid()) {
        return Ok(());
    }
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.shared.client.clone(), view.namespace());
    let known = Some(claim.clone());
    match update::edit(
        &api,
        view.name(),
        view.uid(),
        known,
        super::intent::drop_intent,
    )
    .await
    {
        Ok(_) => {}
        Err(e) if is_not_found(&e) || crate::kube::is_invalid(&e) => {}
        Err(e) => return Err(ClaimError::ReleaseIntent(e)),
    }
    ctx.memory.mark_intent_released(view.uid());
    Ok(())
}
