//! Edits of claims and snapshots with `update` (a PUT of the whole object): the verb upstream's
//! RBAC grants on `persistentvolumeclaims` and `volumesnapshots`, where it grants no `patch`
//! (external-provisioner v6.4 deploy/kubernetes/rbac.yaml). A PUT carries the resourceVersion of
//! the copy it was made from, and the API server takes it only if that copy is the object as it is
//! now: every edit is fenced by itself, and a stale copy costs a conflict, never a lost write.
//!
//! Never PUT a partial copy (a claim the cache trimmed, a slim PV): the fields it lacks would be
//! cleared. PVs keep their patches (upstream's RBAC grants `patch` on them).

use std::fmt::Debug;

use kube::api::PostParams;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{get_fresh, is_conflict, is_not_found};

/// What an edit found.
#[derive(Debug)]
pub enum Edited<K> {
    /// Written: the object as the API server now has it.
    Written(K),
    /// Read fresh, it needs nothing: the object as it is.
    Unchanged(K),
    /// Not found, or its name belongs to another object (another UID) now.
    Gone,
}

/// How many times an edit is tried when it keeps meeting a newer object (client-go's
/// `retry.DefaultRetry`, which upstream's `RetryOnConflict` uses, tries 5 times).
const ATTEMPTS: usize = 5;

/// Applies `change` to the object `name` whose UID is `uid` and writes it with `update`.
///
/// It starts from `known` — a whole copy: a cached claim the cache did not trim, or an answer of
/// the API server — or, without one, from a fresh read. A conflict means the copy was not the
/// object as it is now: the object is read and `change` applied again (client-go's
/// `RetryOnConflict`). `change` returns `false` when the object needs nothing; that answer is only
/// taken from a fresh read, since a stale copy may miss what is to be changed (a finalizer added
/// since, say). Any other refusal (422: a new finalizer on an object being deleted) is returned.
pub async fn edit<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    known: Option<K>,
    mut change: impl FnMut(&mut K) -> bool,
) -> Result<Edited<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let mut copy = known.map(|k| (k, false));
    let mut conflicts = 0;
    loop {
        let (mut object, fresh) = match copy.take() {
            Some(known) => known,
            None => match get_fresh(api, name).await? {
                Some(object) => (object, true),
                None => return Ok(Edited::Gone),
            },
        };
        if object.meta().uid.as_deref() != Some(uid) {
            if fresh {
                return Ok(Edited::Gone);
            }
            continue;
        }
        if !change(&mut object) {
            if fresh {
                return Ok(Edited::Unchanged(object));
            }
            continue;
        }
        // Without managedFields the API server keeps the object's own.
        object.meta_mut().managed_fields = None;
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(written) => return Ok(Edited::Written(written)),
            Err(e) if is_not_found(&e) => return Ok(Edited::Gone),
            Err(e) if is_conflict(&e) && conflicts + 1 < ATTEMPTS => conflicts += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Adds `finalizer` to a copy; `false` if it is there already.
pub fn add_finalizer<K: Resource>(object: &mut K, finalizer: &str) -> bool {
    let finalizers = object.meta_mut().finalizers.get_or_insert_default();
    if finalizers.iter().any(|f| f == finalizer) {
        return false;
    }
    finalizers.push(finalizer.to_string());
    true
}

/// Removes `finalizer` from a copy; `false` if it was not there.
pub fn remove_finalizer<K: Resource>(object: &mut K, finalizer: &str) -> bool {
    let Some(finalizers) = object.meta_mut().finalizers.as_mut() else {
        return false;
    };
    let before = finalizers.len();
    finalizers.retain(|f| f != finalizer);
    finalizers.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    fn with(finalizers: &[&str]) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        c
    }

    #[test]
    fn finalizer_edits_say_whether_they_changed_the_copy() {
        let mut c = with(&["a"]);
        assert!(!add_finalizer(&mut c, "a"), "there already");
        assert!(add_finalizer(&mut c, "b"));
        assert_eq!(c.metadata.finalizers.as_deref().unwrap(), ["a", "b"]);
        assert!(remove_finalizer(&mut c, "a"));
        assert!(!remove_finalizer(&mut c, "a"), "gone already");
        assert_eq!(c.metadata.finalizers.as_deref().unwrap(), ["b"]);
        let mut none = PersistentVolumeClaim::default();
        assert!(!remove_finalizer(&mut none, "a"));
        assert!(add_finalizer(&mut none, "a"));
    }
}
