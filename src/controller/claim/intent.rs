//! The durable intent to provision (DESIGN §2.5) and the authoritative check
//! before `CreateVolume` (DESIGN §2.2), in one request: the intent finalizer is
//! written with the claim's UID *and* the resourceVersion the decision was
//! taken on as preconditions. The API server accepts it only if the copy we
//! decided on is the claim as it is now; a stale copy gets a conflict, a claim
//! being deleted refuses a new finalizer, a re-created claim fails the UID. So
//! a success both makes the intent durable and confirms every field the
//! request was built from, and no other read is needed.
//!
//! The write is made on every attempt, also when the cached copy already shows
//! the intent: that copy may be stale, and only the API server can say.
//!
//! Releasing the intent once the claim is bound is off the critical path: it
//! is queued to a background task that writes through the background lane of
//! the rate limiter, so it never takes a token that provisioning is waiting
//! for. Nothing is lost if the process dies with releases queued: a bound
//! claim that still holds the intent is `ReleaseIntent` work again at the next
//! start. With deploy/kubernetes/release-intent-policy.yaml installed, the
//! binder's own update drops the intent and no release is needed at all.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Context;
use super::error::ClaimError;
use super::memory::ClaimMemory;
use crate::keys;
use crate::kube::fresh::{Fresh, Freshness, ListedClaim};
use crate::kube::slim::Claim;
use crate::kube::update;
use crate::kube::{get_fresh, is_conflict, is_invalid, is_not_found};
use crate::provision::ClaimView;

/// What the API server said about the copy of the claim we decided on.
#[derive(Debug)]
pub enum Confirmed {
    /// It is the claim as it is now, and the intent is recorded on it.
    Current(PersistentVolumeClaim),
    /// The claim changed since: here it is as it is now (nothing written).
    Changed(PersistentVolumeClaim),
    /// Gone, re-created under the same name, or being deleted without our
    /// intent: nothing of ours to do with this copy.
    Gone,
    /// The claim changed since (a listing round saw a newer version), and the
    /// newer copy is not at hand: its watch event brings it, and the claim is
    /// decided again then.
    Newer,
}

/// Who makes the intent durable.
pub enum IntentMode {
    /// The sidecar, with the fenced write of [`record`] on every attempt.
    Write,
    /// The control plane: deploy/kubernetes/provisioning-intent-policy.yaml
    /// adds it in kube-controller-manager's own update of the claim
    /// (`--admission-intent`). What is left of the fenced write is the
    /// authoritative check, shared by the claims of a round ([`Freshness`]).
    /// A claim whose cached copy lacks the intent (the policy not installed,
    /// failing open, or installed after the claim was handed over) gets the
    /// fenced write, as in [`IntentMode::Write`].
    Admission(Freshness),
}

/// The authoritative check of `cached` before `CreateVolume`, and its durable
/// intent: a shared freshness round when the intent is the control plane's
/// and the cached copy shows it, else the fenced write.
pub async fn confirm(
    ctx: &Context,
    cached: &PersistentVolumeClaim,
) -> Result<Confirmed, ClaimError> {
    let check = async {
        match &ctx.intent {
            IntentMode::Admission(freshness) if ClaimView(cached).holds_intent() => {
                let view = ClaimView(cached);
                Ok(match freshness.check(view.namespace(), view.name()).await {
                    Fresh::Caught => as_cached(ctx, cached),
                    Fresh::Listed(Some(now)) => as_listed(cached, &now),
                    // Alone, not among the claims the policy labelled, or the
                    // API server could not be asked: one read, cheaper for it
                    // than the no-op write it replaces.
                    Fresh::Listed(None) | Fresh::Read => read(&ctx.shared.client, cached).await?,
                })
            }
            _ => record(&ctx.shared.client, cached).await,
        }
    };
    let answer = ctx.shared.metrics.stage("check", check).await?;
    if let Confirmed::Changed(_) = answer {
        ctx.shared.metrics.stale("claim");
    }
    Ok(answer)
}

/// The claim as the API server has it now, against the copy decided on (the
/// intent is on that copy already: a read confirms it, nothing to write).
async fn read(client: &Client, decided: &PersistentVolumeClaim) -> Result<Confirmed, ClaimError> {
    let view = ClaimView(decided);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), view.namespace());
    let fresh = get_fresh(&api, view.name())
        .await
        .map_err(ClaimError::RecordIntent)?;
    Ok(match fresh {
        Some(now) if ClaimView(&now).uid() == view.uid() => {
            let same = ClaimView(&now).resource_version() == view.resource_version();
            if same && ClaimView(&now).holds_intent() {
                Confirmed::Current(now)
            } else {
                Confirmed::Changed(now)
            }
        }
        _ => Confirmed::Gone,
    })
}

/// What a listing round's item says of the copy decided on: the same version
/// (it holds the intent: it is among the claims pending for us), a newer one,
/// or another claim of that name.
fn as_listed(decided: &PersistentVolumeClaim, now: &ListedClaim) -> Confirmed {
    let view = ClaimView(decided);
    if now.uid != view.uid() {
        Confirmed::Gone
    } else if view.resource_version() == Some(now.resource_version.as_str()) {
        Confirmed::Current(decided.clone())
    } else {
        Confirmed::Newer
    }
}

/// What the claim cache, caught up with a round, says of the copy decided on.
fn as_cached(ctx: &Context, decided: &PersistentVolumeClaim) -> Confirmed {
    let view = ClaimView(decided);
    let key = ObjectRef::new(view.name()).within(view.namespace());
    match ctx.caches.claims.get(&key) {
        Some(now) if ClaimView(&now.0).uid() == view.uid() => {
            if ClaimView(&now.0).resource_version() == view.resource_version() {
                Confirmed::Current(decided.clone())
            } else {
                Confirmed::Changed(now.0.clone())
            }
        }
        // Deleted, re-created, or bound and so left out of the cache.
        _ => Confirmed::Gone,
    }
}

/// Writes the intent on `cached` with an `update` of that copy: the API server takes it only if
/// the copy (its UID and resourceVersion) is the claim as it is now.
pub async fn record(
    client: &Client,
    cached: &PersistentVolumeClaim,
) -> Result<Confirmed, ClaimError> {
    let view = ClaimView(cached);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), view.namespace());
    let mut with_intent = cached.clone();
    update::add_finalizer(&mut with_intent, keys::FINALIZER_PVC_INTENT);
    with_intent.metadata.managed_fields = None;
    match api
        .replace(view.name(), &PostParams::default(), &with_intent)
        .await
    {
        // The copy was current. When the intent was there already the update changes nothing
        // and is not written: its answer is then the claim as it is, which must be the very
        // version we decided on (the API server checks the resourceVersion of a no-op update
        // too; this guards the claim if it ever did not).
        Ok(fresh)
            if view.holds_intent()
                && ClaimView(&fresh).resource_version() != view.resource_version() =>
        {
            Ok(Confirmed::Changed(fresh))
        }
        Ok(fresh) => Ok(Confirmed::Current(fresh)),
        Err(e) if is_conflict(&e) => {
            debug!(claim = %view.key(), "changed since the cache saw it: reading it");
            match get_fresh(&api, view.name())
                .await
                .map_err(ClaimError::RecordIntent)?
            {
                Some(fresh) if ClaimView(&fresh).uid() == view.uid() => {
                    Ok(Confirmed::Changed(fresh))
                }
                _ => Ok(Confirmed::Gone),
            }
        }
        // Being deleted (no new finalizers then), or gone.
        Err(e) if is_invalid(&e) || is_not_found(&e) => {
            debug!(claim = %view.key(), error = %e, "gone or going");
            Ok(Confirmed::Gone)
        }
        Err(e) => Err(ClaimError::RecordIntent(e)),
    }
}

/// Takes the intent off a copy of a claim: the finalizer, and the label the provisioning-intent
/// policy put on with it (`keys::LABEL_PROVISIONING`, so that the claims pending for us stay the
/// ones a listing round lists); `false` if neither was there.
pub fn drop_intent(claim: &mut PersistentVolumeClaim) -> bool {
    let unlabelled = claim
        .metadata
        .labels
        .as_mut()
        .is_some_and(|l| l.remove(keys::LABEL_PROVISIONING).is_some());
    update::remove_finalizer(claim, keys::FINALIZER_PVC_INTENT) | unlabelled
}

/// A claim whose intent is to be released.
struct Release {
    namespace: String,
    name: String,
    uid: String,
    /// Failed attempts so far, for the backoff between retries.
    failures: u32,
}

/// Queues intent releases and works them off in the background.
pub struct IntentReleaser {
    queue: mpsc::UnboundedSender<Release>,
    /// UIDs queued and not yet released, so a claim is queued once.
    pending: Arc<Mutex<HashSet<String>>>,
}

/// How many releases are written at once (each a request of the background lane).
const CONCURRENCY: usize = 8;
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

impl IntentReleaser {
    /// Starts the worker on the current runtime. `client` should be the
    /// background lane's; `claims` is the claim cache, whose copy of a claim at
    /// the time of its release is where the update starts.
    pub fn start(client: Client, memory: Arc<ClaimMemory>, claims: Store<Claim>) -> IntentReleaser {
        let (queue, rx) = mpsc::unbounded_channel();
        let pending: Arc<Mutex<HashSet<String>>> = Arc::default();
        let releaser = IntentReleaser {
            queue: queue.clone(),
            pending: pending.clone(),
        };
        let stream = tokio_stream_from(rx);
        tokio::spawn(stream.for_each_concurrent(CONCURRENCY, move |r: Release| {
            let (client, memory, pending, queue, claims) = (
                client.clone(),
                memory.clone(),
                pending.clone(),
                queue.clone(),
                claims.clone(),
            );
            async move {
                match release(&client, &claims, &r).await {
                    Ok(()) => {
                        memory.mark_intent_released(&r.uid);
                        pending.lock().expect("poisoned").remove(&r.uid);
                    }
                    Err(e) => {
                        let delay = crate::controller::retry_delay(RETRY, RETRY_MAX, r.failures);
                        warn!(claim = %format!("{}/{}", r.namespace, r.name), error = %e, retry_in = ?delay, "releasing the intent failed");
                        let r = Release {
                            failures: r.failures.saturating_add(1),
                            ..r
                        };
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let _ = queue.send(r);
                        });
                    }
                }
            }
        }));
        releaser
    }

    /// Queues the release of `claim`'s intent, once.
    pub fn request(&self, claim: &PersistentVolumeClaim) {
        let view = ClaimView(claim);
        if !self
            .pending
            .lock()
            .expect("poisoned")
            .insert(view.uid().to_string())
        {
            return;
        }
        let _ = self.queue.send(Release {
            namespace: view.namespace().to_string(),
            name: view.name().to_string(),
            uid: view.uid().to_string(),
            failures: 0,
        });
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Removes the intent: an update of the claim with this UID, starting from the claim cache's
/// copy as it is now (whole: a claim holding the intent is not trimmed), which by the time the
/// background lane sends has usually seen the binder's last write, so that the update needs no
/// read; a claim without the intent, gone, or re-created under its name is fine.
async fn release(client: &Client, claims: &Store<Claim>, r: &Release) -> Result<(), kube::Error> {
    debug!(claim = %format!("{}/{}", r.namespace, r.name), "releasing the intent");
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &r.namespace);
    let cached = claims
        .get(&ObjectRef::new(&r.name).within(&r.namespace))
        .map(|c| c.0.clone())
        .filter(|c| ClaimView(c).uid() == r.uid);
    update::edit(&api, &r.name, &r.uid, cached, drop_intent)
        .await
        .map(|_| ())
}
