//! The two objects of the snapshot API (`snapshot.storage.k8s.io/v1`, CRDs
//! of the external-snapshotter) that a restore reads, with only the fields it
//! reads, and the source-protection finalizer edits on a VolumeSnapshot.
//!
//! Custom resources take no strategic-merge patches, so the finalizer edits
//! are merge patches of the whole list fenced on the resourceVersion read with
//! it: a concurrent edit makes them fail with a conflict (retried), never
//! lost.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{has_finalizer, is_not_found};

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeSnapshot {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeSnapshotContent {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub volume_snapshot_ref: SnapshotRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

/// `spec.volumeSnapshotRef` of a content: the snapshot it is bound to.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct SnapshotRef {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

macro_rules! snapshot_resource {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                crate::keys::SNAPSHOT_API_GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                "snapshot.storage.k8s.io/v1".into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

snapshot_resource!(
    VolumeSnapshot,
    "VolumeSnapshot",
    "volumesnapshots",
    NamespaceResourceScope
);
snapshot_resource!(
    VolumeSnapshotContent,
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    kube::core::ClusterResourceScope
);

/// Adds `finalizer` to `snapshot` as read (fenced on its UID and
/// resourceVersion). A snapshot being deleted takes no new finalizer: the API
/// server refuses it, so a protected snapshot was protected before its
/// deletion began.
pub async fn protect(
    api: &Api<VolumeSnapshot>,
    snapshot: &VolumeSnapshot,
    finalizer: &str,
) -> Result<(), kube::Error> {
    if has_finalizer(snapshot, finalizer) {
        return Ok(());
    }
    let mut finalizers = snapshot.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    patch_finalizers(api, snapshot, finalizers).await
}

/// Removes `finalizer` from the snapshot `name` as it is now; a snapshot that
/// is gone or does not carry it needs nothing.
pub async fn unprotect(
    api: &Api<VolumeSnapshot>,
    name: &str,
    finalizer: &str,
) -> Result<(), kube::Error> {
    let snapshot = match api.get(name).await {
        Ok(s) => s,
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    if !has_finalizer(&snapshot, finalizer) {
        return Ok(());
    }
    let finalizers = snapshot
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    match patch_finalizers(api, &snapshot, finalizers).await {
        Err(e) if is_not_found(&e) => Ok(()),
        other => other,
    }
}

async fn patch_finalizers(
    api: &Api<VolumeSnapshot>,
    snapshot: &VolumeSnapshot,
    finalizers: Vec<String>,
) -> Result<(), kube::Error> {
    let body = json!({"metadata": {
        "uid": snapshot.uid(),
        "resourceVersion": snapshot.resource_version(),
        "finalizers": finalizers,
    }});
    api.patch(
        &snapshot.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await
    .map(|_| ())
}
