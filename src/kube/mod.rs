//! The small Kubernetes helpers the reconcilers need: authoritative reads,
//! fenced finalizer patches (PVs) and updates (claims, snapshots), event
//! recording, and the slim PV we cache.

pub mod activity;
pub mod client;
pub mod clock;
pub mod dispatch;
mod events;
mod finalizers;
pub mod fresh;
pub mod lease;
mod listed;
pub mod reference_grant;
pub mod slim;
pub mod snapshot;
pub mod throttle;
pub mod update;
pub mod watch;

pub use events::EventRecorder;
pub use finalizers::{add_finalizer, has_finalizer, remove_finalizer};
pub use lease::LeaderGate;
pub use listed::Listed;

use kube::Api;
use serde::de::DeserializeOwned;

/// An authoritative GET: `Ok(None)` when the object does not exist.
pub async fn get_fresh<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(obj) => Ok(Some(obj)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The API server answered 404: the object does not exist.
pub fn is_not_found(err: &kube::Error) -> bool {
    is_code(err, 404)
}

/// The API server answered 409: the name is taken (create), or a
/// precondition (resourceVersion, UID of a DELETE) no longer holds.
pub fn is_conflict(err: &kube::Error) -> bool {
    is_code(err, 409)
}

/// The API server answered 422: the write is invalid for the object as it is
/// now (another UID under the name, a new finalizer on an object being deleted).
pub fn is_invalid(err: &kube::Error) -> bool {
    is_code(err, 422)
}

fn is_code(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

/// An error as a Go client shows it: the API server's own message for an API
/// answer (`secrets "x" not found`), the error itself otherwise.
pub fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}
