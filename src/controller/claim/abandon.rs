//! The abandon sequence: a claim deleted while our intent was on it. If its
//! PV was saved, the volume path owns the volume and only the intent is left
//! to release. Otherwise the backend volume is found by its deterministic
//! name — an idempotent `CreateVolume` returns its handle, or proves it never
//! existed — its handle is recorded on the claim, and it is deleted; then the
//! intent goes and the claim with it (DESIGN §2.5).
//!
//! [`delete_volume`] is the one place where the claim path calls
//! `DeleteVolume` (here, and for a volume the driver made smaller than asked).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use tonic::Code;
use tracing::{debug, info, warn};

use super::error::{ClaimError, report};
use crate::controller::topology;
use crate::controller::{Context, bound_claim_uid};
use crate::csi::classify;
use crate::keys;
use crate::kube::{get_fresh, is_not_found, remove_finalizer};
use crate::provision::{self, ClaimView, SecretRef};

pub async fn abandon(ctx: &Context, cached: &PersistentVolumeClaim) -> Result<Action, ClaimError> {
    let view = ClaimView(cached);
    let uid = view.uid();
    let pv_name = provision::volume_name(
        &ctx.options.volume_name_prefix,
        uid,
        ctx.options.volume_name_uuid_length,
    )?;
    let saved = ctx.claims.pv_saved(uid)
        || get_fresh(&ctx.pv_api(), &pv_name)
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
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), view.namespace());
    let Some(claim) = get_fresh(&api, view.name())
        .await
        .map_err(|source| ClaimError::Read {
            what: "PersistentVolumeClaim",
            source,
        })?
    else {
        return Ok(Action::await_change());
    };
    let fresh = ClaimView(&claim);
    if fresh.uid() != uid || !fresh.holds_intent() || !fresh.asks(&ctx.driver.name) {
        return Ok(Action::await_change());
    }
    let handle = match recorded_handle(fresh) {
        Some(h) => Some(h),
        None => find_volume(ctx, &claim).await?,
    };
    if let Some(handle) = handle {
        if recorded_handle(fresh).is_none() {
            record_handle(ctx, &claim, &handle).await?;
        }
        let secret = provisioner_secret(ctx, &claim);
        delete_volume(ctx, secret.as_ref(), &handle)
            .await
            .map_err(|e| report(ctx, &claim, e))?;
        info!(claim = %fresh.key(), volume = %handle, "deleted the volume of a claim deleted during provisioning");
    }
    ctx.claims.forget_created(uid);
    // No volume is being made from the claim's snapshot any more.
    if let Some(source) = restored_snapshot(&claim) {
        super::protect::release_snapshot(ctx, &source).await;
    }
    release_now(ctx, &claim).await?;
    Ok(Action::await_change())
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
/// idempotent `CreateVolume` with the same name and parameters answers it.
async fn find_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Option<String>, ClaimError> {
    let view = ClaimView(claim);
    if let Some(v) = ctx.claims.created(view.uid()) {
        return Ok(Some(v.volume_id));
    }
    let Some(class) = ctx
        .caches
        .classes
        .get(&kube::runtime::reflector::ObjectRef::new(
            view.class().unwrap_or_default(),
        ))
    else {
        let name = view.class().unwrap_or_default().to_string();
        return Err(report(
            ctx,
            claim,
            ClaimError::CleanupBlocked(format!(
                "storageclass.storage.k8s.io {name:?} not found; re-create it to let the claim go"
            )),
        ));
    };
    let mut prepared = match provision::prepare(claim, &class, &ctx.driver, &ctx.options) {
        Ok(p) => p,
        // StorageClass parameters are immutable: a request that cannot be
        // built now could never have been sent, so no volume exists.
        Err(e) => {
            debug!(claim = %view.key(), error = %e, "no request could have been sent");
            return Ok(None);
        }
    };
    // Best effort: the same requirements, mutable parameters and secret as
    // the original call, when they can still be computed.
    prepared.request.accessibility_requirements = topology::requirements(ctx, claim, &class)
        .await
        .ok()
        .flatten();
    // A restore's request names its snapshot: the same handle, read from the
    // content (our finalizer keeps the snapshot while the claim holds the
    // intent). Without it the driver answers AlreadyExists and the claim waits.
    if let Some(source) = &prepared.snapshot
        && let Ok((_, Some(content))) = super::create::read_snapshot(ctx, source).await
        && let Some(handle) = content.status.and_then(|s| s.snapshot_handle)
    {
        prepared.request.volume_content_source = Some(provision::snapshot::from_handle(handle));
    }
    // A clone's names its source volume: the source claim's PV (the source is
    // protected while this claim, pending, names it).
    if let Some(source) = &prepared.clone
        && let Ok(original) =
            Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &source.namespace)
                .get(&source.name)
                .await
        && let Some(pv_name) = original.spec.and_then(|s| s.volume_name)
        && let Ok(pv) = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(ctx.client.clone())
            .get(&pv_name)
            .await
        && let Some(csi) = pv.spec.and_then(|s| s.csi)
    {
        prepared.request.volume_content_source =
            Some(provision::clone::from_volume(csi.volume_handle));
    }
    if let Some(name) = view.vac_name(&ctx.options) {
        let api: Api<k8s_openapi::api::storage::v1::VolumeAttributesClass> =
            Api::all(ctx.client.clone());
        if let Ok(vac) = api.get(name).await {
            prepared.request.mutable_parameters =
                vac.parameters.unwrap_or_default().into_iter().collect();
        }
    }
    let mut request = prepared.request.clone();
    request.secrets = secret_data(ctx, prepared.provisioner_secret()).await;
    if !ctx.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    match ctx.csi.create_volume(request).await {
        Ok(resp) => Ok(resp.volume.map(|v| v.volume_id).filter(|h| !h.is_empty())),
        // Same name, incompatible parameters (the class changed?): the handle
        // cannot be learned. Keep the claim rather than leak.
        Err(s) if s.code() == Code::AlreadyExists => Err(report(
            ctx,
            claim,
            ClaimError::CleanupBlocked(
                ClaimError::create_volume(s, crate::csi::CsiErrorClass::Final).to_string(),
            ),
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

fn provisioner_secret(ctx: &Context, claim: &PersistentVolumeClaim) -> Option<SecretRef> {
    let class = ctx
        .caches
        .classes
        .get(&kube::runtime::reflector::ObjectRef::new(
            ClaimView(claim).class().unwrap_or_default(),
        ))?;
    provision::prepare(claim, &class, &ctx.driver, &ctx.options)
        .ok()?
        .provisioner_secret()
        .cloned()
}

/// Records the handle of a deleted claim's volume on the claim (UID-fenced;
/// annotations may still change on a claim that is being deleted).
async fn record_handle(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    handle: &str,
) -> Result<(), ClaimError> {
    let view = ClaimView(claim);
    let body = json!({"metadata": {"uid": view.uid(), "annotations": {keys::ANN_ABANDONED_HANDLE: handle}}});
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), view.namespace())
        .patch(view.name(), &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|source| ClaimError::RecordHandle {
            handle: handle.to_string(),
            source,
        })?;
    Ok(())
}

/// Releases the intent at once (the abandon path finishes with it).
async fn release_now(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let view = ClaimView(claim);
    if !view.holds_intent() || ctx.claims.intent_released(view.uid()) {
        return Ok(());
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), view.namespace());
    match remove_finalizer(&api, claim, keys::FINALIZER_PVC_INTENT).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) || crate::kube::is_invalid(&e) => {}
        Err(e) => return Err(ClaimError::ReleaseIntent(e)),
    }
    ctx.claims.mark_intent_released(view.uid());
    Ok(())
}

/// The data of the provisioner secret, or none if it cannot be read (the
/// cleanup goes on without it, as upstream's deletion does).
async fn secret_data(ctx: &Context, secret: Option<&SecretRef>) -> HashMap<String, String> {
    let Some(r) = secret else {
        return HashMap::new();
    };
    ctx.secret_data(r).await.unwrap_or_else(|e| {
        warn!(secret = %format!("{}/{}", r.namespace, r.name), error = %e, "going on without the provisioner secret");
        HashMap::new()
    })
}

/// `DeleteVolume` for the claim path (`NotFound` counts as done).
pub async fn delete_volume(
    ctx: &Context,
    secret: Option<&SecretRef>,
    handle: &str,
) -> Result<(), ClaimError> {
    let secrets = secret_data(ctx, secret).await;
    if !ctx.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    ctx.csi
        .delete_volume(handle, secrets)
        .await
        .map_err(|status| ClaimError::DeleteVolume {
            handle: handle.to_string(),
            status,
        })
}
