//! Finalizer edits as JSON patches fenced on the object's UID, so a patch
//! meant for one incarnation of an object never lands on its successor (same
//! name, new UID), and concurrent edits by two replicas both converge.

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

/// Adds `finalizer` to `obj` unless present; returns the object as the API
/// server now has it. Fails with 422 if the UID changed (the object was
/// replaced) and with 403/422 if the object is already being deleted.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let uid = obj.uid().unwrap_or_default();
    let ops = if obj.meta().finalizers.is_none() {
        json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    patch(api, &obj.name_any(), ops).await
}

/// Removes `finalizer` from `obj` if present, fenced on UID and on the
/// finalizer's position (a concurrent edit makes the `test` fail with 422 and
/// the caller retries with a fresh read). Returns the updated object, or
/// `None` if the object is gone (removing the last finalizer of a deleted
/// object lets it vanish; so does a 404).
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let Some(idx) = obj
        .meta()
        .finalizers
        .as_ref()
        .and_then(|f| f.iter().position(|x| x == finalizer))
    else {
        return Ok(Some(obj.clone()));
    };
    let ops = json!([
        {"op": "test", "path": "/metadata/uid", "value": obj.uid().unwrap_or_default()},
        {"op": "test", "path": format!("/metadata/finalizers/{idx}"), "value": finalizer},
        {"op": "remove", "path": format!("/metadata/finalizers/{idx}")},
    ]);
    match patch(api, &obj.name_any(), ops).await {
        Ok(o) => Ok(Some(o)),
        Err(e) if super::is_status(&e, 404) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn patch<K>(api: &Api<K>, name: &str, ops: serde_json::Value) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
}
