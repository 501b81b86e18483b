//! The small Kubernetes helpers the reconcilers need: authoritative reads,
//! fenced finalizer patches, event recording, and the slim PV we cache.

mod events;
mod finalizers;
pub mod lease;
pub mod slim;
pub mod throttle;

pub use events::{EventRecorder, EventType};
pub use finalizers::{add_finalizer, has_finalizer, remove_finalizer};
pub use lease::LeaderGate;

use kube::Api;
use serde::de::DeserializeOwned;

/// An authoritative GET: `Ok(None)` when the object does not exist.
pub async fn get_fresh<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(obj) => Ok(Some(obj)),
        Err(e) if is_status(&e, 404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `err` is an API answer with HTTP status `code` (404 not found,
/// 409 already exists / conflict, 422 invalid).
pub fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}
