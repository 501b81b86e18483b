//! The two objects of the snapshot API (`snapshot.storage.k8s.io/v1`, CRDs
//! of the external-snapshotter) that a restore reads, with the fields it
//! reads, and the source-protection finalizer edits on a VolumeSnapshot.
//!
//! The finalizer edits are updates (PUT) of the snapshot as read, as
//! upstream makes them (its RBAC grants `update` on volumesnapshots, not
//! `patch`): fenced on the resourceVersion read, so a concurrent edit makes
//! them fail with a conflict, never lost. A VolumeSnapshot therefore keeps
//! every field it was read with (its `spec` among them), not only the ones
//! read here: a PUT without them would clear them.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::core::NamespaceResourceScope;
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};

use super::update;

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeSnapshot {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
    /// Everything else the API server sent (`apiVersion`, `kind`, `spec`),
    /// kept as it came so that an update writes it back unchanged.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
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

/// Adds `finalizer` to `snapshot` as read, in an update of that copy (fenced
/// on its UID and resourceVersion: a conflict is returned, and the restore is
/// tried again from a fresh read). A snapshot being deleted takes no new
/// finalizer: the API server refuses it, so a protected snapshot was protected
/// before its deletion began.
pub async fn protect(
    api: &Api<VolumeSnapshot>,
    snapshot: &VolumeSnapshot,
    finalizer: &str,
) -> Result<(), kube::Error> {
    let mut protected = snapshot.clone().typed();
    if !update::add_finalizer(&mut protected, finalizer) {
        return Ok(());
    }
    protected.metadata.managed_fields = None;
    api.replace(&snapshot.name_any(), &PostParams::default(), &protected)
        .await
        .map(|_| ())
}

/// Removes `finalizer` from `snapshot` (as read: an update of that copy; a
/// conflict reads it again); a snapshot that is gone or does not carry it
/// needs nothing.
pub async fn unprotect(
    api: &Api<VolumeSnapshot>,
    snapshot: VolumeSnapshot,
    finalizer: &str,
) -> Result<(), kube::Error> {
    let (name, uid) = (snapshot.name_any(), snapshot.uid().unwrap_or_default());
    update::edit(api, &name, &uid, Some(snapshot.typed()), |s| {
        update::remove_finalizer(s, finalizer)
    })
    .await
    .map(|_| ())
}

impl VolumeSnapshot {
    /// The copy with its `apiVersion` and `kind`, which the body of an update
    /// must carry (a listed item may come without them).
    fn typed(mut self) -> VolumeSnapshot {
        for (key, value) in [
            ("apiVersion", "snapshot.storage.k8s.io/v1"),
            ("kind", "VolumeSnapshot"),
        ] {
            self.rest.entry(key).or_insert_with(|| value.into());
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_keeps_what_it_does_not_read_for_its_update() {
        let json = serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "s", "namespace": "n", "uid": "u", "resourceVersion": "7"},
            "spec": {
                "source": {"persistentVolumeClaimName": "c"},
                "volumeSnapshotClassName": "k"
            },
            "status": {"readyToUse": true, "restoreSize": "1Gi"}
        });
        let snapshot: VolumeSnapshot = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(snapshot.status.as_ref().unwrap().ready_to_use, Some(true));
        assert_eq!(serde_json::to_value(&snapshot).unwrap(), json);
    }
}
