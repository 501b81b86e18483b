//! Polling until a condition holds, with a deadline.
//!
//! The deadlines are correctness bounds ("this must happen at all"), generous enough for a
//! loaded 2-core machine; they are not performance assertions.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use kube::api::Api;
use kube::core::Resource;
use serde::de::DeserializeOwned;

const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What one poll of [`wait_for`] saw: done with a value, or not yet, with a description of the
/// state observed (shown if the deadline passes).
pub trait Observation {
    type Output;
    fn into_result(self) -> Result<Self::Output, String>;
}

/// `Some(value)` when done, `None` when not yet (nothing to report about the state).
impl<T> Observation for Option<T> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(|| "condition not met (no state reported)".to_string())
    }
}

/// `Ok(value)` when done, `Err(state)` when not yet, where `state` is what was observed
/// (the object's status, or the error from the API).
impl<T, E: Debug> Observation for Result<T, E> {
    type Output = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|state| format!("{state:#?}"))
    }
}

/// Polls `f` every 200ms until it reports done, and returns its value. Panics after `timeout`
/// with `what` and the last state observed.
pub async fn wait_for<O, F, Fut>(what: &str, timeout: Duration, mut f: F) -> O::Output
where
    O: Observation,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match f().await.into_result() {
            Ok(value) => return value,
            Err(state) => state,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last observed: {last}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until `name` no longer exists in `api`; on timeout the last state shown is the object
/// (with its finalizers and deletion timestamp) or the API error.
pub async fn wait_for_deleted<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let what = format!("{} {name} to be deleted", std::any::type_name::<K>());
    wait_for(&what, timeout, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            still_there_or_error => Err(still_there_or_error),
        }
    })
    .await
}
