//! Finalizer edits of PVs as strategic-merge patches (finalizers merge as a
//! set, so concurrent edits by two replicas or other controllers never clobber
//! each other) fenced on the object's UID: the patch carries `metadata.uid`,
//! and the API server rejects it (422, UID is immutable) if the name now
//! belongs to a different object. Both edits are idempotent. Upstream's RBAC
//! grants `patch` on PVs; claims and snapshots, where it grants `update`
//! only, are edited with [`super::update`].

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Adds `finalizer` to `obj`; returns the object as the API server now has it.
/// Fails with 422 if the name now belongs to another object, and with 422 or
/// 403 if the object is being deleted (no new finalizers then).
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let body = json!({"metadata": {"uid": obj.uid(), "finalizers": [finalizer]}});
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(&body),
    )
    .await
}

/// Removes `finalizer` from `obj`. Returns the updated object, or `None` if it
/// is gone (removing the last finalizer of a deleted object lets it vanish).
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let body =
        json!({"metadata": {"uid": obj.uid(), "$deleteFromPrimitiveList/finalizers": [finalizer]}});
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&body),
        )
        .await
    {
        Ok(o) => Ok(Some(o)),
        Err(e) if super::is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}
