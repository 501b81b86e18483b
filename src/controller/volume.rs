//! The volume path: a PV we provisioned that is `Released` with reclaim
//! policy `Delete` is deleted (our finalizer holds it), gets `DeleteVolume`,
//! then our finalizer is dropped. A `Bound` PV's volume is never deleted, even when the PV
//! object is being deleted: the finalizer holds it until the claim lets go.
//! upstream: lib controller.go syncVolume, shouldDelete, deleteVolumeOperation.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tonic::Status;
use tracing::{debug, info, warn};

use super::backend::{self, DeleteError};
use super::memory::{Attempt, Hold};
use super::{Context, VolumeMemory};
use crate::keys;
use crate::kube::slim::Pv;
use crate::kube::{
    add_finalizer, get_fresh, has_finalizer, is_conflict, is_invalid, is_not_found,
    remove_finalizer,
};
use crate::metrics::VolumeLabels;
use crate::names::{PvPhase, Reason, ReclaimPolicy};
use crate::provision::{SecretKind, SecretRef, migration, secrets};

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("rpc error: code = {code} desc = {message}", code = crate::csi::code_name(.0.code()), message = .0.message())]
    DeleteVolume(Status),
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("not the leader: not acting")]
    NotLeader,
    /// No volume handle can be read from the PV (no CSI source, or an in-tree
    /// source that does not translate): nothing is touched, retried later.
    #[error("{0}")]
    Invalid(String),
    /// A VolumeAttachment still holds the volume: the deletion waits for the
    /// detach, which is not a failure (upstream v6.4: `canDeleteVolume`'s
    /// `VolumeInUseError`, shown by lib v13.1 as a Normal `VolumeDelete`).
    #[error("persistentvolume {pv} is still attached to node {node}, waiting for detach")]
    Attached { pv: String, node: String },
    /// Whether the volume is attached cannot be told yet (the cache cannot
    /// list VolumeAttachments: RBAC, an API outage): retried, nothing touched.
    #[error("the VolumeAttachments have not been listed yet")]
    AttachmentsNotListed,
}

/// How long a deletion waits for the VolumeAttachment cache's first list
/// before it is retried later (a reconcile must not wait for ever: a graceful
/// stop waits for it).
const ATTACHMENTS_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a PV needs from us, decided from the cached (or fresh) object.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Work {
    Nothing,
    /// Bound with policy Delete and no finalizer: hold it (also adopts
    /// statically provisioned PVs of our driver, as upstream does).
    AddFinalizer,
    /// Policy is no longer Delete: let the PV go, keep the volume.
    RemoveFinalizer,
    /// Released with policy Delete: delete the backend volume and the PV.
    Delete,
}

fn is_ours(pv: &Pv, driver: &str) -> bool {
    let ann = pv.annotations();
    match ann.get(keys::ANN_PROVISIONED_BY) {
        Some(by) => {
            by == driver
                || ann.get(keys::ANN_MIGRATED_TO).map(String::as_str) == Some(driver)
                || migration::in_tree_plugin(driver) == Some(by.as_str())
        }
        None => pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == driver),
    }
}

fn work_for(pv: &Pv, driver: &str) -> Work {
    if !is_ours(pv, driver) {
        return Work::Nothing;
    }
    let held = has_finalizer(pv, keys::FINALIZER_PV);
    let deleting = pv.metadata.deletion_timestamp.is_some();
    // No policy at all is taken as Delete (the API server always sets one).
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .map_or(Some(ReclaimPolicy::Delete), ReclaimPolicy::parse);
    let phase = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .and_then(PvPhase::parse);
    if policy != Some(ReclaimPolicy::Delete) {
        return if held {
            Work::RemoveFinalizer
        } else {
            Work::Nothing
        };
    }
    match phase {
        // Being deleted without our finalizer: someone else's decision, as upstream.
        _ if deleting && !held => Work::Nothing,
        Some(PvPhase::Released) => Work::Delete,
        Some(PvPhase::Bound) if !held && !deleting => Work::AddFinalizer,
        _ => Work::Nothing,
    }
}

pub async fn reconcile(pv: Arc<Pv>, ctx: Arc<Context>) -> Result<Action, VolumeError> {
    let api = ctx.pv_api();
    let uid = pv.uid().unwrap_or_default();
    let work = work_for(&pv, &ctx.driver.name);
    if work == Work::Nothing && !has_finalizer(pv.as_ref(), keys::FINALIZER_PV) {
        // Not ours, or done: nothing to remember.
        ctx.volumes.forget(&uid);
        return Ok(Action::await_change());
    }
    // The same work failed a moment ago: the updates its own DELETE caused
    // (the PV Terminating, the PV protection dropped) trigger reconciles.
    if let Some(wait) = ctx.volumes.begin(&uid, Attempt::of(&work)) {
        debug!(pv = %pv.name_any(), ?wait, "the same attempt failed: waiting out its backoff");
        return Ok(Action::requeue(wait));
    }
    match work {
        Work::Nothing => {}
        Work::AddFinalizer => match add_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await {
            Ok(_) => {}
            Err(e) if is_invalid(&e) || is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        },
        Work::RemoveFinalizer => {
            remove_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await?;
        }
        Work::Delete if ctx.volumes.read(&uid, |e| e.deleted) == Some(true) => {}
        // One sidecar per node: a PV made on another node is that node's to delete.
        Work::Delete
            if !ctx
                .place
                .may_delete(pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref())) =>
        {
            debug!(pv = %pv.name_any(), "not provisioned on this node");
        }
        Work::Delete => delete(&ctx, &pv).await?,
    }
    ctx.volumes.succeeded(&uid);
    Ok(Action::await_change())
}

/// Every failure a reconcile returns lands here: a failed deletion is shown
/// on the PV (a `VolumeFailedDelete` Warning, the failure metric) and the PV
/// is requeued with its backoff, the failed work held back until then. A
/// deletion that waits for a detach is a Normal `VolumeDelete` note, retried
/// with the same backoff, and no failure.
pub fn error_policy(pv: Arc<Pv>, err: &VolumeError, ctx: Arc<Context>) -> Action {
    let uid = pv.uid().unwrap_or_default();
    if let VolumeError::Attached { .. } = err {
        ctx.recorder
            .record(pv.as_ref(), Reason::VolumeDelete, &err.to_string());
        let delay = ctx.volumes.failed(&uid, Hold::Attempt);
        info!(pv = %pv.name_any(), reason = %err, retry_in = ?delay, "deletion postponed");
        return Action::requeue(delay);
    }
    if let VolumeError::DeleteVolume(_) | VolumeError::Invalid(_) = err {
        if let VolumeError::DeleteVolume(_) = err {
            ctx.metrics
                .delete_failed_total
                .get_or_create(&labels(&pv))
                .inc();
        }
        ctx.recorder
            .record(pv.as_ref(), Reason::VolumeFailedDelete, &err.to_string());
    }
    let hold = match err {
        VolumeError::NotLeader => Hold::Nothing,
        _ => Hold::Attempt,
    };
    let delay = ctx.volumes.failed(&uid, hold);
    match err {
        VolumeError::NotLeader => debug!(pv = %pv.name_any(), "not leader"),
        _ => warn!(pv = %pv.name_any(), error = %err, retry_in = ?delay, "deletion failed"),
    }
    Action::requeue(delay)
}

/// Forgets a PV the watch says is gone (the reconciler never hears of it).
pub fn forget_deleted(memory: &VolumeMemory, event: &watcher::Event<Pv>) {
    if let watcher::Event::Delete(pv) = event {
        memory.forget(&pv.uid().unwrap_or_default());
    }
}

fn labels(pv: &Pv) -> VolumeLabels {
    VolumeLabels {
        class: pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default(),
    }
}

async fn delete(ctx: &Context, cached: &Pv) -> Result<(), VolumeError> {
    let api = ctx.pv_api();
    if !ctx.leader.is_leader() {
        return Err(VolumeError::NotLeader);
    }
    // Known before the PV is touched: a PV whose volume cannot be named is
    // left as it is (not made Terminating with nothing to delete), as upstream.
    let handle = match migration::volume_handle(cached) {
        Some(Ok(handle)) => handle,
        Some(Err(e)) => return Err(VolumeError::Invalid(e)),
        None => return Err(VolumeError::Invalid("invalid CSI PV".into())),
    };
    // Before the PV is touched: a volume still attached is not deleted yet.
    if let Some(node) = attached_to(ctx, &cached.name_any()).await? {
        return Err(VolumeError::Attached {
            pv: cached.name_any(),
            node,
        });
    }
    let Some(pv) = confirm_delete(ctx, cached).await? else {
        debug!(pv = %cached.name_any(), "no longer to be deleted");
        return Ok(());
    };
    let started = Instant::now();
    // An in-tree PV (its handle translated) is a migrated volume: its call is
    // labelled `migrated="true"`, as upstream.
    let migrated = pv.spec.as_ref().is_some_and(|s| s.csi.is_none());
    backend::delete_volume(ctx, &handle, deletion_secret(ctx, &pv).as_ref(), migrated)
        .await
        .map_err(|e| match e {
            DeleteError::NotLeader => VolumeError::NotLeader,
            DeleteError::DeleteVolume(status) => VolumeError::DeleteVolume(status),
        })?;
    if pv.metadata.deletion_timestamp.is_some() {
        // Deleted already (by `confirm_delete` or someone else): only our
        // finalizer is left to drop.
        remove_finalizer(&api, &pv, keys::FINALIZER_PV).await?;
    } else {
        // The answer is the object while finalizers hold it (then drop ours
        // from exactly that object), or a status once it is gone.
        match api.delete(&pv.name_any(), &preconditions(&pv, false)).await {
            Ok(answer) => {
                if let Some(current) = answer.left()
                    && current.uid() == pv.uid()
                {
                    remove_finalizer(&api, &current, keys::FINALIZER_PV).await?;
                }
            }
            // Gone, or the name is another object's now (the UID precondition).
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    ctx.volumes
        .with(&pv.uid().unwrap_or_default(), |e| e.deleted = true);
    ctx.metrics.delete_total.get_or_create(&labels(&pv)).inc();
    ctx.metrics
        .delete_duration
        .get_or_create(&labels(&pv))
        .observe(started.elapsed().as_secs_f64());
    info!(pv = %pv.name_any(), volume = %handle, "deleted");
    ctx.capacity_changed();
    Ok(())
}

/// The node a VolumeAttachment still attaches the PV `name` to, if any,
/// from the attachments cache once its first list is in (upstream:
/// `canDeleteVolume`, which reads its VolumeAttachment informer). Without the
/// cache (the driver does not publish volumes) nothing attaches them.
async fn attached_to(ctx: &Context, name: &str) -> Result<Option<String>, VolumeError> {
    let Some(attachments) = ctx.caches.attachments.as_ref() else {
        return Ok(None);
    };
    tokio::time::timeout(ATTACHMENTS_LIST_WAIT, attachments.listed.wait())
        .await
        .map_err(|_| VolumeError::AttachmentsNotListed)?;
    Ok(holder(&attachments.store, name))
}

/// The node of a cached VolumeAttachment that names the PV `name`.
fn holder(store: &Store<VolumeAttachment>, name: &str) -> Option<String> {
    store
        .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
        .map(|va| va.spec.node_name.clone())
}

/// The PV as the API server has it, if it still says "delete" there and not
/// just in our cache (DESIGN §2.2): phase, policy, ownership and identity.
///
/// A PV our finalizer holds is confirmed and deleted in one request: a DELETE
/// fenced on the cached UID *and* resourceVersion succeeds only if nothing in
/// the object changed since the decision was taken, and the finalizer keeps
/// the PV (now Terminating) until the backend volume is gone. Anything else —
/// a stale cache (409), a PV already being deleted, a PV without our
/// finalizer (deleting it first would lose the record of its volume) — is
/// read back and decided again.
async fn confirm_delete(ctx: &Context, cached: &Pv) -> Result<Option<Pv>, VolumeError> {
    let api = ctx.pv_api();
    if has_finalizer(cached, keys::FINALIZER_PV) && cached.metadata.deletion_timestamp.is_none() {
        match api
            .delete(&cached.name_any(), &preconditions(cached, true))
            .await
        {
            Ok(answer) => return Ok(answer.left()),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if is_conflict(&e) => {
                ctx.metrics.stale("pv");
                debug!(pv = %cached.name_any(), "changed since the cache saw it: reading it");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let Some(pv) = get_fresh(&api, &cached.name_any()).await? else {
        return Ok(None);
    };
    Ok((pv.uid() == cached.uid() && work_for(&pv, &ctx.driver.name) == Work::Delete).then_some(pv))
}

/// A DELETE fenced on `pv`'s UID, and on its resourceVersion if `exact`.
fn preconditions(pv: &Pv, exact: bool) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: pv.uid(),
            resource_version: if exact { pv.resource_version() } else { None },
        }),
        ..Default::default()
    }
}

/// The provisioner secret recorded on the PV at provisioning time (read by
/// the backend, which deletes without it if it cannot be read, as upstream).
fn deletion_secret(ctx: &Context, pv: &Pv) -> Option<SecretRef> {
    let ann = pv.annotations();
    match (
        ann.get(keys::ANN_DELETION_SECRET_NAME),
        ann.get(keys::ANN_DELETION_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
            Some(SecretRef {
                name: name.clone(),
                namespace: namespace.clone(),
            })
        }
        (Some(_), Some(_)) => None,
        // PVs from before the annotations existed: resolve from the class.
        _ => secret_from_class(ctx, pv),
    }
}

/// The provisioner secret as the PV's (current) StorageClass names it, for PVs
/// without the deletion-secret annotations. Claim annotations are not known
/// any more, so templates using them fail (as upstream).
fn secret_from_class(ctx: &Context, pv: &Pv) -> Option<SecretRef> {
    let spec = pv.spec.as_ref()?;
    let class_name = spec.storage_class_name.as_deref()?;
    let class = ctx
        .caches
        .classes
        .get(&kube::runtime::reflector::ObjectRef::new(class_name))?;
    let claim = spec.claim_ref.as_ref()?;
    let params = class.parameters.clone().unwrap_or_default();
    let none = std::collections::BTreeMap::new();
    let pv_name = pv.name_any();
    let inputs = secrets::TemplateInputs {
        pv_name: &pv_name,
        pvc_name: claim.name.as_deref().unwrap_or_default(),
        pvc_namespace: claim.namespace.as_deref().unwrap_or_default(),
        pvc_annotations: &none,
    };
    secrets::resolve(SecretKind::Provisioner, &params, &inputs).unwrap_or_else(|e| {
        warn!(pv = %pv_name, error = %e, "cannot resolve the deletion secret from the StorageClass");
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::slim::{PvCsi, PvSpec, PvStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    struct Fixture(Pv);

    impl Fixture {
        fn ours() -> Fixture {
            let mut pv = Pv::default();
            pv.metadata.annotations =
                Some([(keys::ANN_PROVISIONED_BY.to_string(), "d".to_string())].into());
            pv.spec = Some(PvSpec {
                persistent_volume_reclaim_policy: Some("Delete".into()),
                csi: Some(PvCsi {
                    driver: "d".into(),
                    volume_handle: "h".into(),
                }),
                ..Default::default()
            });
            Fixture(pv)
        }
        fn static_of(driver: &str) -> Fixture {
            let mut pv = Fixture::ours();
            pv.0.metadata.annotations = None;
            pv.0.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = driver.into();
            pv
        }
        fn phase(mut self, p: &str) -> Fixture {
            self.0.status = Some(PvStatus {
                phase: Some(p.into()),
            });
            self
        }
        fn policy(mut self, p: &str) -> Fixture {
            self.0
                .spec
                .as_mut()
                .unwrap()
                .persistent_volume_reclaim_policy = Some(p.into());
            self
        }
        fn no_policy(mut self) -> Fixture {
            self.0
                .spec
                .as_mut()
                .unwrap()
                .persistent_volume_reclaim_policy = None;
            self
        }
        fn held(mut self) -> Fixture {
            self.0.metadata.finalizers = Some(vec![keys::FINALIZER_PV.into()]);
            self
        }
        fn deleting(mut self) -> Fixture {
            self.0.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            self
        }
        fn by(mut self, who: &str) -> Fixture {
            self.0.metadata.annotations =
                Some([(keys::ANN_PROVISIONED_BY.to_string(), who.to_string())].into());
            self
        }
    }

    fn attachment(name: &str, node: &str, pv: Option<&str>) -> VolumeAttachment {
        use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec};
        VolumeAttachment {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "d".into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: pv.map(String::from),
                    ..Default::default()
                },
            },
            status: None,
        }
    }

    #[test]
    fn a_volume_attachment_naming_the_pv_holds_its_deletion() {
        let (store, mut writer) = kube::runtime::reflector::store::<VolumeAttachment>();
        for va in [
            attachment("csi-1", "node-1", Some("pv-1")),
            // An inline volume's attachment names no PV.
            attachment("csi-2", "node-2", None),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(va));
        }
        assert_eq!(holder(&store, "pv-1").as_deref(), Some("node-1"));
        assert_eq!(holder(&store, "pv-2"), None);
        // upstream v6.4's text, which lib v13.1 shows as the Normal event's message.
        let err = VolumeError::Attached {
            pv: "pv-1".into(),
            node: "node-1".into(),
        };
        assert_eq!(
            err.to_string(),
            "persistentvolume pv-1 is still attached to node node-1, waiting for detach"
        );
    }

    #[test]
    fn decides_like_upstream_should_delete() {
        use Work::*;
        let cases: Vec<(Fixture, Work, &str)> = vec![
            (
                Fixture::ours().phase("Released").held(),
                Delete,
                "released, delete policy",
            ),
            (
                Fixture::ours().phase("Released"),
                Delete,
                "released without finalizer (older PV)",
            ),
            (
                Fixture::ours().phase("Released").held().deleting(),
                Delete,
                "released and being deleted",
            ),
            (
                Fixture::ours().phase("Released").deleting(),
                Nothing,
                "deleting without our finalizer",
            ),
            (
                Fixture::ours().phase("Bound").held(),
                Nothing,
                "bound: never delete",
            ),
            (
                Fixture::ours().phase("Bound").held().deleting(),
                Nothing,
                "bound while PV deleted: wait for release",
            ),
            (
                Fixture::ours().phase("Bound"),
                AddFinalizer,
                "bound without finalizer: hold it",
            ),
            (
                Fixture::static_of("d").phase("Bound"),
                AddFinalizer,
                "adopts static PVs of our driver",
            ),
            (
                Fixture::static_of("other").phase("Released"),
                Nothing,
                "static PV of another driver",
            ),
            (
                Fixture::ours().by("other").phase("Released"),
                Nothing,
                "provisioned by another",
            ),
            (
                Fixture::ours().phase("Released").held().policy("Retain"),
                RemoveFinalizer,
                "switched to Retain",
            ),
            (
                Fixture::ours().phase("Released").policy("Retain"),
                Nothing,
                "retain, no finalizer",
            ),
            (
                Fixture::ours().phase("Released").held().no_policy(),
                Delete,
                "no policy: as Delete",
            ),
            (
                Fixture::ours().phase("Released").held().policy("delete"),
                RemoveFinalizer,
                "a policy spelled otherwise is not Delete",
            ),
            (
                Fixture::ours().phase("released").held(),
                Nothing,
                "a phase spelled otherwise is not Released",
            ),
            (
                Fixture::ours().phase("Available").held(),
                Nothing,
                "available",
            ),
            (Fixture::ours().phase("Pending").held(), Nothing, "pending"),
        ];
        for (pv, want, what) in cases {
            assert_eq!(work_for(&pv.0, "d"), want, "{what}");
        }
    }
}
