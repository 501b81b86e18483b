//! The claim path: a PVC that asks for our driver gets one backend volume and
//! one PV, exactly once, even under stale caches, crashes and deletion races.
//!
//! The durable intent (DESIGN §2.5) is the PVC finalizer
//! `keys::FINALIZER_PVC_INTENT`: added before the first `CreateVolume`, removed
//! only once the PV is saved or the abandoned backend volume is deleted. A
//! claim deleted mid-flight therefore stays visible (Terminating) until we
//! have cleaned up, across restarts of this process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;
use tonic::{Code, Status};
use tracing::{debug, info, warn};

use super::topology::{self, TopologyError};
use super::{Context, bound_claim_uid};
use crate::csi::{CsiErrorClass, classify, pb};
use crate::keys;
use crate::kube::slim::{Claim, Pv};
use crate::kube::{
    EventType, add_finalizer, get_fresh, has_finalizer, is_status, remove_finalizer,
};
use crate::metrics::ClaimLabels;
use crate::provision::{self, PreparedVolume, ProvisionError};

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("storageclass.storage.k8s.io {name:?} not found")]
    StorageClassNotFound { name: String },
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    #[error("failed to get secret {namespace}/{name}: {source}")]
    GetSecret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to get VolumeAttributesClass {name}: {source}")]
    GetVolumeAttributesClass {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("rpc error: code = {code} desc = {message}", code = crate::csi::code_name(.0.code()), message = .0.message())]
    CreateVolume(Status),
    #[error("failed to delete abandoned volume {handle}: rpc error: code = {code} desc = {message}", code = crate::csi::code_name(.status.code()), message = .status.message())]
    DeleteAbandoned { handle: String, status: Status },
    #[error("error saving PersistentVolume {name}: {source}")]
    SavePv {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("PersistentVolume {name} exists but is bound to another claim ({other})")]
    PvOfAnotherClaim { name: String, other: String },
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("not the leader: not acting")]
    NotLeader,
}

/// What the claim needs from us right now, decided from the cached object.
enum Work {
    /// Not ours, or nothing to do.
    Nothing,
    /// A claim of ours without a volume: provision it.
    Provision,
    /// Deleted while we held the intent: make sure no backend volume is left.
    Abandon,
    /// Bound (or otherwise done) but our intent finalizer is still on it.
    DropIntent,
}

/// Whether the claim names our driver as its provisioner. The intent
/// finalizer has one name for every driver, and every provisioner in the
/// cluster watches every claim: only the sidecar of the claim's driver may
/// act on it, or one driver's sidecar drops another's intent mid-flight.
fn asks_us(claim: &PersistentVolumeClaim, driver: &str) -> bool {
    provision::claim_provisioner(claim) == Some(driver)
        || claim
            .annotations()
            .get(keys::ANN_MIGRATED_TO)
            .map(String::as_str)
            == Some(driver)
}

fn work_for(claim: &PersistentVolumeClaim, driver: &str) -> Work {
    if !asks_us(claim, driver) {
        return Work::Nothing;
    }
    let intent = has_finalizer(claim, keys::FINALIZER_PVC_INTENT);
    if claim.metadata.deletion_timestamp.is_some() {
        return if intent { Work::Abandon } else { Work::Nothing };
    }
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    match (bound, intent) {
        (false, _) => Work::Provision,
        (true, true) => Work::DropIntent,
        (true, false) => Work::Nothing,
    }
}

/// Trims a claim before it is cached. A claim bound to a PV and without our
/// intent has nothing left for any sidecar to do (`work_for` is `Nothing` for
/// it whatever its other fields say, deleted or not, and a bound claim never
/// becomes unbound), so only its identity, finalizers, deletion mark and
/// volume name are kept: in a cluster of bound claims that is most of the
/// cache. Claims still to be provisioned are cached whole.
pub fn trim(Claim(claim): &mut Claim) {
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_ref())
        .is_some_and(|v| !v.is_empty());
    if !bound || has_finalizer(claim, keys::FINALIZER_PVC_INTENT) {
        return;
    }
    claim.metadata.annotations = None;
    claim.metadata.labels = None;
    claim.metadata.owner_references = None;
    claim.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
        volume_name: claim.spec.as_mut().and_then(|s| s.volume_name.take()),
        ..Default::default()
    });
    claim.status = None;
}

pub async fn reconcile(claim: Arc<Claim>, ctx: Arc<Context>) -> Result<Action, ClaimError> {
    let claim = &claim.0;
    if !has_finalizer(claim, keys::FINALIZER_PVC_INTENT)
        && let Some(uid) = claim.uid()
    {
        ctx.intent_dropped.remove(&uid);
    }
    let action = match work_for(claim, &ctx.driver.name) {
        Work::Nothing => Action::await_change(),
        Work::DropIntent => {
            drop_intent(&ctx, claim).await?;
            Action::await_change()
        }
        Work::Abandon => abandon(&ctx, claim).await?,
        Work::Provision => provision(&ctx, claim).await?,
    };
    ctx.claim_backoff.reset(&key(claim));
    Ok(action)
}

/// Requeues a failed claim with per-claim exponential backoff.
pub fn error_policy(claim: Arc<Claim>, err: &ClaimError, ctx: Arc<Context>) -> Action {
    let claim = &claim.0;
    let delay = ctx.claim_backoff.next_delay(&key(claim));
    match err {
        ClaimError::NotLeader => debug!(claim = %key(claim), "not leader"),
        _ => warn!(claim = %key(claim), error = %err, retry_in = ?delay, "provisioning failed"),
    }
    Action::requeue(delay)
}

fn key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    )
}

fn claims(ctx: &Context, ns: &str) -> Api<PersistentVolumeClaim> {
    Api::namespaced(ctx.client.clone(), ns)
}

fn class_of(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<Arc<StorageClass>, ClaimError> {
    let name = provision::claim_class(claim)
        .unwrap_or_default()
        .to_string();
    ctx.classes
        .get(&kube::runtime::reflector::ObjectRef::new(&name))
        .ok_or(ClaimError::StorageClassNotFound { name })
}

fn labels(claim: &PersistentVolumeClaim) -> ClaimLabels {
    ClaimLabels {
        class: provision::claim_class(claim)
            .unwrap_or_default()
            .to_string(),
        source: String::new(),
    }
}

async fn provision(ctx: &Context, cached: &PersistentVolumeClaim) -> Result<Action, ClaimError> {
    let class = match class_of(ctx, cached) {
        Ok(c) => c,
        Err(e) => {
            ctx.metrics
                .provision_failed_total
                .get_or_create(&labels(cached))
                .inc();
            return Err(e);
        }
    };
    if class.provisioner != ctx.driver.name {
        return Ok(Action::await_change());
    }
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && provision::claim_selected_node(cached).is_none()
    {
        return Ok(Action::await_change());
    }
    let uid = cached.uid().unwrap_or_default();
    if let Some(wait) = infeasible_wait(ctx, &uid, &class) {
        return Ok(Action::requeue(wait));
    }
    ctx.started
        .lock()
        .expect("poisoned")
        .entry(uid.clone())
        .or_insert_with(Instant::now);

    let mut prepared = match provision::prepare(cached, &class, &ctx.driver, &ctx.options) {
        Ok(p) => p,
        Err(e) => return Err(fail(ctx, cached, e.into()).await),
    };

    // A PV of this claim that we saved, or that the cache shows, settles it
    // without a request (a PV seen bound to this UID existed). Otherwise the
    // PV by its deterministic name, from the API server: a stale cache must
    // never make us create a second volume for a claim that has one.
    if ctx.pv_known_for(&prepared.pv_name, &uid) {
        return provisioned_before(ctx, cached).await;
    }
    if let Some(pv) = get_fresh(&ctx.pv_api(), &prepared.pv_name).await? {
        return already_provisioned(ctx, cached, &pv).await;
    }

    // A claim that names a VolumeAttributesClass gets its parameters as the
    // request's mutable parameters; checked before the intent, so a missing
    // or foreign class changes nothing.
    if let Some(name) = provision::claim_vac_name(cached, &ctx.options) {
        prepared.request.mutable_parameters = match vac_parameters(ctx, name).await {
            Ok(p) => p,
            Err(e) => return Err(fail(ctx, cached, e).await),
        };
    }

    // Durable intent, and the authoritative read of the claim in one request.
    let claim = if has_finalizer(cached, keys::FINALIZER_PVC_INTENT) {
        match get_fresh(
            &claims(ctx, &cached.namespace().unwrap_or_default()),
            &cached.name_any(),
        )
        .await?
        {
            Some(c) => c,
            None => return Ok(Action::await_change()),
        }
    } else {
        match add_finalizer(
            &claims(ctx, &cached.namespace().unwrap_or_default()),
            cached,
            keys::FINALIZER_PVC_INTENT,
        )
        .await
        {
            Ok(c) => c,
            // Replaced (UID test failed), being deleted, or gone: the next event decides.
            Err(e) if is_status(&e, 422) || is_status(&e, 404) => {
                debug!(claim = %key(cached), error = %e, "claim changed under us");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(e) => return Err(e.into()),
        }
    };
    if claim.uid() != cached.uid() || !matches!(work_for(&claim, &ctx.driver.name), Work::Provision)
    {
        // Deleted, bound or re-targeted since the cache saw it.
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    // The selected node is part of the decision too (DESIGN §2.2): a
    // reschedule (ours, after ResourceExhausted) may have removed it since the
    // cache saw it, and provisioning now would pick a topology the scheduler
    // did not choose. The scheduler's next choice is a new claim event.
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && provision::claim_selected_node(&claim).is_none()
    {
        return Ok(Action::await_change());
    }

    prepared.request.accessibility_requirements =
        match topology::requirements(ctx, &claim, &class).await {
            Ok(r) => r,
            Err(TopologyError::SelectedNodeGone(node)) => {
                // upstream #1438: a vanished node must not pin the claim forever.
                let err = ClaimError::Provision(ProvisionError::Topology(format!(
                    "selected node {node} has no CSINode"
                )));
                let err = fail(ctx, &claim, err).await;
                reschedule(ctx, &claim).await?;
                return Err(err);
            }
            Err(TopologyError::Invalid(e)) => return Err(fail(ctx, &claim, e.into()).await),
            Err(TopologyError::Kube(e)) => return Err(e.into()),
        };

    let volume = match create_volume(ctx, &claim, &class, &prepared, true).await {
        Ok(v) => v,
        Err(e) => return Err(e),
    };

    let pv = match provision::build_pv(
        &prepared,
        &claim,
        &class,
        &pb::CreateVolumeResponse {
            volume: Some(volume.clone()),
        },
        &ctx.driver,
        &ctx.options,
    ) {
        Ok(pv) => pv,
        Err(e @ ProvisionError::VolumeTooSmall { .. }) => {
            // The driver broke its contract; the volume is useless to this claim.
            delete_backend(ctx, &claim, &prepared, &volume.volume_id).await?;
            ctx.created.lock().expect("poisoned").remove(&uid);
            return Err(fail(ctx, &claim, e.into()).await);
        }
        Err(e) => return Err(fail(ctx, &claim, e.into()).await),
    };
    save_pv(ctx, &claim, pv).await?;
    ctx.created.lock().expect("poisoned").remove(&uid);
    let labels = labels(&claim);
    ctx.metrics.provision_total.get_or_create(&labels).inc();
    if let Some(t0) = ctx.started.lock().expect("poisoned").remove(&uid) {
        ctx.metrics
            .provision_duration
            .get_or_create(&labels)
            .observe(t0.elapsed().as_secs_f64());
    }
    ctx.recorder.record(
        &claim,
        EventType::Normal,
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume {}", prepared.pv_name),
    );
    info!(claim = %key(&claim), pv = %prepared.pv_name, "provisioned");
    // If this fails, the retry finds the claim bound (or the PV saved) and
    // only drops the intent.
    drop_intent(ctx, &claim).await?;
    Ok(Action::await_change())
}

/// The parameters of the VolumeAttributesClass `name`, read from the API
/// server as upstream does (one read per attempt; the class may be newer than
/// any cache). A class meant for another driver is refused.
async fn vac_parameters(ctx: &Context, name: &str) -> Result<HashMap<String, String>, ClaimError> {
    let api: Api<VolumeAttributesClass> = Api::all(ctx.client.clone());
    let vac = api
        .get(name)
        .await
        .map_err(|source| ClaimError::GetVolumeAttributesClass {
            name: name.to_string(),
            source,
        })?;
    if vac.driver_name != ctx.driver.name {
        return Err(ProvisionError::VolumeAttributesClassOfAnotherDriver {
            name: name.to_string(),
            driver: vac.driver_name,
            ours: ctx.driver.name.clone(),
        }
        .into());
    }
    Ok(vac.parameters.unwrap_or_default().into_iter().collect())
}

/// Returns how long to wait if the claim's last attempt was infeasible and
/// neither time nor the StorageClass has moved on.
fn infeasible_wait(ctx: &Context, uid: &str, class: &StorageClass) -> Option<Duration> {
    let mut map = ctx.infeasible.lock().expect("poisoned");
    let (at, class_uid) = map.get(uid)?;
    let elapsed = at.elapsed();
    if class.metadata.uid.as_deref() != Some(class_uid.as_str())
        || elapsed >= ctx.claim_backoff.max()
    {
        map.remove(uid);
        return None;
    }
    Some(ctx.claim_backoff.max() - elapsed)
}

/// The PV named for this claim exists already.
async fn already_provisioned(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pv: &Pv,
) -> Result<Action, ClaimError> {
    let owner = bound_claim_uid(pv).unwrap_or_default().to_string();
    if Some(owner.as_str()) == claim.uid().as_deref() {
        ctx.remember_saved(&pv.name_any(), &owner);
        return provisioned_before(ctx, claim).await;
    }
    let err = ClaimError::PvOfAnotherClaim {
        name: pv.name_any(),
        other: owner,
    };
    fail(ctx, claim, err).await;
    Ok(Action::await_change())
}

/// The claim's PV was saved earlier: only the intent may be left to drop.
async fn provisioned_before(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
) -> Result<Action, ClaimError> {
    debug!(claim = %key(claim), "its PV exists: nothing to provision");
    drop_intent(ctx, claim).await?;
    ctx.started
        .lock()
        .expect("poisoned")
        .remove(&claim.uid().unwrap_or_default());
    Ok(Action::await_change())
}

/// Calls `CreateVolume` (unless a previous attempt's answer is remembered) and
/// applies the error classification. `report` controls the user-facing
/// events (the abandon path calls this silently).
async fn create_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    prepared: &PreparedVolume,
    report: bool,
) -> Result<pb::Volume, ClaimError> {
    let uid = claim.uid().unwrap_or_default();
    if let Some(v) = ctx.created.lock().expect("poisoned").get(&uid) {
        return Ok(v.clone());
    }
    let mut request = prepared.request.clone();
    if let Some(r) = prepared.provisioner_secret() {
        request.secrets = ctx
            .secret_data(r)
            .await
            .map_err(|source| ClaimError::GetSecret {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                source,
            })?;
    }
    if !ctx.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    if report {
        let msg = format!(
            "External provisioner is provisioning volume for claim \"{}\"",
            key(claim)
        );
        ctx.recorder
            .record(claim, EventType::Normal, "Provisioning", &msg);
    }
    match ctx.csi.create_volume(request).await {
        Ok(resp) => {
            let volume = resp.volume.unwrap_or_default();
            if volume.volume_id.is_empty() {
                return Err(ClaimError::Provision(ProvisionError::EmptyVolumeId));
            }
            ctx.created
                .lock()
                .expect("poisoned")
                .insert(uid, volume.clone());
            Ok(volume)
        }
        Err(status) => {
            let reschedulable = ctx.driver.capabilities.accessibility_constraints
                && provision::claim_selected_node(claim).is_some();
            let class_of_error = classify(status.code(), reschedulable);
            if !report {
                return Err(ClaimError::CreateVolume(status));
            }
            let err = ClaimError::CreateVolume(status);
            match class_of_error {
                CsiErrorClass::InBackground | CsiErrorClass::Final => {
                    Err(fail(ctx, claim, err).await)
                }
                CsiErrorClass::Infeasible => {
                    ctx.infeasible.lock().expect("poisoned").insert(
                        uid,
                        (
                            Instant::now(),
                            class.metadata.uid.clone().unwrap_or_default(),
                        ),
                    );
                    ctx.metrics
                        .provision_failed_total
                        .get_or_create(&labels(claim))
                        .inc();
                    let msg = format!(
                        "Volume provisioning failed with infeasible error. Retries will be delayed. {err}"
                    );
                    ctx.recorder
                        .record(claim, EventType::Warning, "ProvisioningFailed", &msg);
                    Err(err)
                }
                CsiErrorClass::Reschedule => {
                    let e = fail(ctx, claim, err).await;
                    reschedule(ctx, claim).await?;
                    Err(e)
                }
            }
        }
    }
}

/// Reports a failure on the claim and returns it for the error policy.
async fn fail(ctx: &Context, claim: &PersistentVolumeClaim, err: ClaimError) -> ClaimError {
    ctx.metrics
        .provision_failed_total
        .get_or_create(&labels(claim))
        .inc();
    ctx.recorder.record(
        claim,
        EventType::Warning,
        "ProvisioningFailed",
        &err.to_string(),
    );
    err
}

/// `ResourceExhausted` on the selected node: let the scheduler choose again.
async fn reschedule(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let ann = claim.annotations();
    let key = if ann.contains_key(keys::ANN_SELECTED_NODE) {
        keys::ANN_SELECTED_NODE
    } else {
        keys::ANN_ALPHA_SELECTED_NODE
    };
    let body = json!({"metadata": {"uid": claim.uid(), "annotations": {key: null}}});
    claims(ctx, &claim.namespace().unwrap_or_default())
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await?;
    Ok(())
}

/// Saves the PV. `AlreadyExists` is an answer, not a failure (DESIGN §2.3).
/// Any other failure is retried by the error policy; the backend volume is
/// never deleted because Kubernetes said no (DESIGN §2.4).
async fn save_pv(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pv: PersistentVolume,
) -> Result<(), ClaimError> {
    let name = pv.name_any();
    match ctx
        .pv_create_api()
        .create(&PostParams::default(), &pv)
        .await
    {
        Ok(_) => {
            ctx.remember_saved(&name, &claim.uid().unwrap_or_default());
            Ok(())
        }
        Err(e) if is_status(&e, 409) => {
            let Some(existing) = get_fresh(&ctx.pv_api(), &name).await? else {
                // Deleted between our create and get: try again.
                return Err(ClaimError::SavePv { name, source: e });
            };
            let owner = bound_claim_uid(&existing);
            if owner == claim.uid().as_deref() {
                ctx.remember_saved(&name, &claim.uid().unwrap_or_default());
                Ok(())
            } else {
                let err = ClaimError::PvOfAnotherClaim {
                    name,
                    other: owner.unwrap_or_default().to_string(),
                };
                Err(fail(ctx, claim, err).await)
            }
        }
        Err(source) => Err(fail(ctx, claim, ClaimError::SavePv { name, source }).await),
    }
}

/// Removes the intent finalizer, unless this process already did: once the
/// PV is saved nothing adds it again, so a stale copy that still shows it
/// needs no second patch.
async fn drop_intent(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    if !has_finalizer(claim, keys::FINALIZER_PVC_INTENT) {
        return Ok(());
    }
    let uid = claim.uid().unwrap_or_default();
    if ctx.intent_dropped.contains(&uid) {
        return Ok(());
    }
    remove_finalizer(
        &claims(ctx, &claim.namespace().unwrap_or_default()),
        claim,
        keys::FINALIZER_PVC_INTENT,
    )
    .await?;
    ctx.intent_dropped.insert(&uid);
    Ok(())
}

/// The claim was deleted while we held the intent. If its PV was saved, the
/// volume path owns the volume from here; otherwise find the backend volume
/// by its deterministic name (an idempotent `CreateVolume` returns its
/// handle, or proves it never existed) and delete it, then let the claim go.
async fn abandon(ctx: &Context, cached: &PersistentVolumeClaim) -> Result<Action, ClaimError> {
    let uid = cached.uid().unwrap_or_default();
    let pv_name = provision::volume_name(
        &ctx.options.volume_name_prefix,
        &uid,
        ctx.options.volume_name_uuid_length,
    )?;
    if let Some(pv) = get_fresh(&ctx.pv_api(), &pv_name).await?
        && bound_claim_uid(&pv) == Some(uid.as_str())
    {
        drop_intent(ctx, cached).await?;
        return Ok(Action::await_change());
    }
    let Some(claim) = get_fresh(
        &claims(ctx, &cached.namespace().unwrap_or_default()),
        &cached.name_any(),
    )
    .await?
    else {
        return Ok(Action::await_change());
    };
    if claim.uid() != cached.uid()
        || !has_finalizer(&claim, keys::FINALIZER_PVC_INTENT)
        || !asks_us(&claim, &ctx.driver.name)
    {
        return Ok(Action::await_change());
    }
    let class = class_of(ctx, &claim)?;
    let mut prepared = match provision::prepare(&claim, &class, &ctx.driver, &ctx.options) {
        Ok(p) => p,
        // StorageClass parameters are immutable: a request that cannot be
        // built now could never have been sent, so no volume exists.
        Err(e) => {
            debug!(claim = %key(&claim), error = %e, "no request could have been sent; releasing the claim");
            drop_intent(ctx, &claim).await?;
            return Ok(Action::await_change());
        }
    };
    // Best effort: the same requirements and mutable parameters as the
    // original call, when they can still be computed.
    prepared.request.accessibility_requirements = topology::requirements(ctx, &claim, &class)
        .await
        .ok()
        .flatten();
    if let Some(name) = provision::claim_vac_name(&claim, &ctx.options) {
        prepared.request.mutable_parameters = vac_parameters(ctx, name).await.unwrap_or_default();
    }
    // A cleanup that got as far as recording the handle must not create the
    // volume again: it may already be deleted, and CreateVolume would make a new one.
    let recorded = claim
        .annotations()
        .get(keys::ANN_ABANDONED_HANDLE)
        .filter(|h| !h.is_empty())
        .cloned();
    let handle = match recorded.clone() {
        Some(h) => Some(h),
        None => match create_volume(ctx, &claim, &class, &prepared, false).await {
            Ok(v) => Some(v.volume_id),
            Err(ClaimError::CreateVolume(s)) if s.code() == Code::AlreadyExists => {
                // Same name, incompatible parameters (the class changed?): we
                // cannot learn its handle. Keep the claim rather than leak.
                let err = ClaimError::CreateVolume(s);
                let msg = format!("cannot clean up the volume of deleted claim: {err}");
                ctx.recorder.record(
                    &claim,
                    EventType::Warning,
                    "ProvisioningCleanupFailed",
                    &msg,
                );
                return Err(err);
            }
            Err(ClaimError::CreateVolume(s)) if !classify(s.code(), false).volume_may_exist() => {
                None
            }
            Err(e) => return Err(e),
        },
    };
    if let Some(handle) = handle {
        if recorded.is_none() {
            record_abandoned_handle(ctx, &claim, &handle).await?;
        }
        delete_backend(ctx, &claim, &prepared, &handle).await?;
        info!(claim = %key(&claim), volume = %handle, "deleted the volume of a claim deleted during provisioning");
    }
    ctx.created.lock().expect("poisoned").remove(&uid);
    ctx.started.lock().expect("poisoned").remove(&uid);
    ctx.infeasible.lock().expect("poisoned").remove(&uid);
    drop_intent(ctx, &claim).await?;
    Ok(Action::await_change())
}

/// Records the handle of a deleted claim's volume on the claim (UID-fenced;
/// annotations may still change on a claim that is being deleted).
async fn record_abandoned_handle(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    handle: &str,
) -> Result<(), ClaimError> {
    let body = json!({"metadata": {"uid": claim.uid(), "annotations": {keys::ANN_ABANDONED_HANDLE: handle}}});
    claims(ctx, &claim.namespace().unwrap_or_default())
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await?;
    Ok(())
}

async fn delete_backend(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    prepared: &PreparedVolume,
    handle: &str,
) -> Result<(), ClaimError> {
    let secrets = match prepared.provisioner_secret() {
        Some(r) => ctx.secret_data(r).await.unwrap_or_else(|e| {
            warn!(claim = %key(claim), error = %e, "deleting without the provisioner secret");
            HashMap::new()
        }),
        None => HashMap::new(),
    };
    if !ctx.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    match ctx
        .csi
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: handle.to_string(),
            secrets,
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(status) => Err(ClaimError::DeleteAbandoned {
            handle: handle.to_string(),
            status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn claim(
        annotations: &[(&str, &str)],
        volume: Option<&str>,
        finalizers: &[&str],
        deleting: bool,
    ) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c.metadata.finalizers = Some(finalizers.iter().map(|s| s.to_string()).collect());
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        c.spec = Some(Default::default());
        c.spec.as_mut().unwrap().volume_name = volume.map(str::to_string);
        c
    }

    #[test]
    fn decides_the_work_from_the_claim() {
        let ours = [(keys::ANN_STORAGE_PROVISIONER, "d")];
        let beta = [(keys::ANN_BETA_STORAGE_PROVISIONER, "d")];
        let other = [(keys::ANN_STORAGE_PROVISIONER, "x")];
        let intent = [keys::FINALIZER_PVC_INTENT];
        let cases: Vec<(PersistentVolumeClaim, &str)> = vec![
            (claim(&ours, None, &[], false), "provision"),
            (claim(&beta, None, &[], false), "provision"),
            (claim(&other, None, &[], false), "nothing"),
            (claim(&ours, Some("pv"), &[], false), "nothing"),
            (claim(&ours, Some("pv"), &intent, false), "drop"),
            (claim(&ours, None, &intent, true), "abandon"),
            (claim(&ours, None, &[], true), "nothing"),
            (claim(&ours, Some("pv"), &intent, true), "abandon"),
            // Another driver's claims are never ours to touch, intent or not.
            (claim(&other, None, &intent, false), "nothing"),
            (claim(&other, Some("pv"), &intent, false), "nothing"),
            (claim(&other, None, &intent, true), "nothing"),
            (claim(&[], None, &intent, true), "nothing"),
        ];
        for (c, want) in cases {
            assert_eq!(work_name(&c), want, "{:?}", c.metadata);
            // The cache holds trimmed claims: trimming never changes the work.
            let mut trimmed = Claim(c.clone());
            trim(&mut trimmed);
            assert_eq!(work_name(&trimmed.0), want, "trimmed {:?}", c.metadata);
        }
    }

    fn work_name(c: &PersistentVolumeClaim) -> &'static str {
        match work_for(c, "d") {
            Work::Nothing => "nothing",
            Work::Provision => "provision",
            Work::Abandon => "abandon",
            Work::DropIntent => "drop",
        }
    }

    #[test]
    fn trims_only_bound_claims_without_the_intent() {
        let ours = [(keys::ANN_STORAGE_PROVISIONER, "d")];
        let mut done = Claim(claim(
            &ours,
            Some("pv"),
            &["kubernetes.io/pvc-protection"],
            false,
        ));
        done.0.metadata.name = Some("c".into());
        done.0.metadata.uid = Some("u".into());
        trim(&mut done);
        let Claim(done) = done;
        assert_eq!(done.metadata.annotations, None);
        assert_eq!(done.metadata.name.as_deref(), Some("c"));
        assert_eq!(done.metadata.uid.as_deref(), Some("u"));
        assert_eq!(done.metadata.finalizers.as_ref().unwrap().len(), 1);
        assert_eq!(done.spec.unwrap().volume_name.as_deref(), Some("pv"));

        for c in [
            claim(&ours, None, &[], false),
            claim(&ours, Some("pv"), &[keys::FINALIZER_PVC_INTENT], false),
        ] {
            let mut trimmed = Claim(c.clone());
            trim(&mut trimmed);
            assert_eq!(trimmed.0, c, "kept whole");
        }
    }
}
