//! The deletion of a Released PV's volume, as decided (`decide.rs`): the
//! volume named, the detach waited for, the decision confirmed by the API
//! server (a DELETE fenced on the cached UID and resourceVersion, or a fresh
//! read decided again), `DeleteVolume`, then our finalizer dropped.
//! upstream: lib controller.go `deleteVolumeOperation`.

use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::Store;
use tracing::{debug, info, warn};

use super::Context;
use super::decide::still_to_delete;
use super::error::{VolumeError, labels};
use crate::controller::backend;
use crate::keys;
use crate::kube::slim::Pv;
use crate::kube::{get_fresh, has_finalizer, is_conflict, is_not_found, remove_finalizer};
use crate::provision::{SecretKind, SecretRef, migration, secrets};

/// How long a deletion waits for the VolumeAttachment cache's first list
/// before it is retried later (a reconcile must not wait for ever: a graceful
/// stop waits for it).
const ATTACHMENTS_LIST_WAIT: Duration = Duration::from_secs(10);

/// The deletion of a Released PV's volume, decided on `cached`.
pub(super) async fn delete(ctx: &Context, cached: &Pv) -> Result<(), VolumeError> {
    let api = ctx.shared.pv_api();
    if !ctx.shared.leader.is_leader() {
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
    backend::delete_volume(
        &ctx.shared,
        &handle,
        deletion_secret(ctx, &pv).as_ref(),
        migrated,
    )
    .await?;
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
    ctx.memory
        .with(&pv.uid().unwrap_or_default(), |e| e.deleted = true);
    ctx.shared
        .metrics
        .delete_total
        .get_or_create(&labels(&pv))
        .inc();
    ctx.shared
        .metrics
        .delete_duration
        .get_or_create(&labels(&pv))
        .observe(started.elapsed().as_secs_f64());
    info!(pv = %pv.name_any(), volume = %handle, "deleted");
    ctx.shared.capacity_changed();
    Ok(())
}

/// The node a VolumeAttachment still attaches the PV `name` to, if any,
/// from the attachments cache once its first list is in (upstream:
/// `canDeleteVolume`, which reads its VolumeAttachment informer). Without the
/// cache (the driver does not publish volumes) nothing attaches them.
async fn attached_to(ctx: &Context, name: &str) -> Result<Option<String>, VolumeError> {
    let Some(attachments) = ctx.attachments.as_ref() else {
        return Ok(None);
    };
    tokio::time::timeout(ATTACHMENTS_LIST_WAIT, attachments.listed.wait())
        .await
        .map_err(|_| VolumeError::AttachmentsNotListed)?;
    Ok(holder(&attachments.store, name))
}

/// The node of a cached VolumeAttachment that names the PV `name`.
pub(super) fn holder(store: &Store<VolumeAttachment>, name: &str) -> Option<String> {
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
    let api = ctx.shared.pv_api();
    if has_finalizer(cached, keys::FINALIZER_PV) && cached.metadata.deletion_timestamp.is_none() {
        match api
            .delete(&cached.name_any(), &preconditions(cached, true))
            .await
        {
            Ok(answer) => return Ok(answer.left()),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if is_conflict(&e) => {
                ctx.shared.metrics.stale("pv");
                debug!(pv = %cached.name_any(), "changed since the cache saw it: reading it");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let Some(pv) = get_fresh(&api, &cached.name_any()).await? else {
        return Ok(None);
    };
    Ok(still_to_delete(&pv, cached, &ctx.shared.driver.name).then_some(pv))
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
    match (
        pv.annotation(keys::ANN_DELETION_SECRET_NAME),
        pv.annotation(keys::ANN_DELETION_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
            Some(SecretRef {
                name: name.to_string(),
                namespace: namespace.to_string(),
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
        .shared
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
    use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec};
    use kube::runtime::watcher;

    fn attachment(name: &str, node: &str, pv: Option<&str>) -> VolumeAttachment {
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
    }
}
