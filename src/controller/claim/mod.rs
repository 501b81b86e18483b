//! The claim path: a PVC that asks for our driver gets one backend volume and
//! one PV, exactly once, even under stale caches, crashes and deletion races.
//!
//! A reconcile is one straight sequence: read the facts (the cached claim,
//! its class, what this process remembers, where this replica runs), decide
//! once ([`decide`]), carry the decision out, and return. A failure is
//! returned, never reported where it happens: the error policy shows it
//! (event, metric) and holds the failed attempt back for its backoff.
//!
//! | module | owns |
//! |---|---|
//! | [`decide`] | the one decision (pure): forget, wait, retry later, race, refuse, create, abandon, release |
//! | [`gather`] | what a request needs beyond the claim and class, read live; the request built once |
//! | [`create`] | the create sequence (DESIGN §2.1–2.4, §2.7) |
//! | [`intent`] | the durable intent and the authoritative check in one fenced write (§2.2, §2.5); its release |
//! | [`abandon`] | the cleanup of a claim deleted mid-flight (§2.5) |
//! | [`protect`] | the protection of a restore's snapshot and a clone's source claim |
//! | [`race`] | one sidecar per node: the race for an Immediate claim |
//! | [`error`] | every failure, its event and metric; the one reporter |
//! | [`memory`] | what the process remembers per claim UID, forgotten in one place |

mod abandon;
mod create;
pub mod decide;
pub mod error;
mod gather;
pub mod intent;
pub mod memory;
mod protect;
mod race;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

pub use decide::{cached, gauges, trim};
pub use error::ClaimError;
pub use intent::IntentReleaser;
pub use memory::ClaimMemory;
pub use protect::snapshot_awaited;

use super::memory::Hold;
use super::topology::TopologyCaches;
use super::{Shared, bound_claim_uid};
use crate::controller::queue::Action;
use crate::csi::CsiErrorClass;
use crate::kube::Listed;
use crate::kube::slim::{Claim, Pv};
use crate::kube::watch::Progress;
use crate::provision::{self, ClaimView, ProvisionOptions};
use decide::{CachedPv, Decision, Facts, decide};
use intent::IntentMode;

/// What the claim reconciler works with: the shared part, and the claim
/// path's own options, caches, memory and bounds. Built once in `run`.
pub struct Context {
    pub shared: Arc<Shared>,
    /// How requests and PVs are built: volume names, topology, metadata
    /// passed on, feature gates.
    pub options: ProvisionOptions,
    pub caches: Caches,
    /// What the claim path remembers, per claim UID.
    pub memory: Arc<ClaimMemory>,
    /// Releases of intents that are no longer needed, in the background lane.
    pub intents: IntentReleaser,
    /// Who makes the provisioning intent durable: the sidecar or the control plane.
    pub intent: IntentMode,
    /// `--cloning-protection-threads`: how many removals of the cloning
    /// protection run at once (the workers of upstream's cloning-protection
    /// controller; here the claim workers do the work, this bounds it).
    pub clone_releases: Semaphore,
    /// `--worker-threads`: how many claims are in `CreateVolume` and the PV
    /// save at once (what upstream's workers bound), taken first come first
    /// served once a claim's check is done; the checks themselves wait for no
    /// permit, so they overlap the creates in flight.
    pub creates: Semaphore,
}

/// The reflector caches the claim path reads: for finding work, never for
/// deciding an irreversible act (DESIGN §2.2).
pub struct Caches {
    /// PVs in their slim shape. Trusted for one answer only: a PV seen bound
    /// to a claim's UID did exist.
    pub volumes: Store<Pv>,
    /// The PV cache holds its first list (wakes any number of waiters, which
    /// `Store::wait_until_ready` does not).
    pub volumes_listed: Listed,
    pub claims: Store<Claim>,
    /// The claim cache holds its first list: before it, the cache cannot say
    /// that no claim waits for something.
    pub claims_listed: Listed,
    /// How far the claim cache has caught up with the API server.
    pub claims_progress: Progress,
    /// Namespaces, metadata only and trimmed to the listed keys, when a
    /// request carries namespace metadata (`--extra-create-metadata-namespace-*`).
    pub namespaces: Option<Store<PartialObjectMeta<Namespace>>>,
    /// CSINodes and Nodes (metadata only), when claims get accessibility
    /// requirements from the cluster (`provision::topology::served`, a
    /// central replica).
    pub topology: Option<TopologyCaches>,
}

/// How long a claim waits for the PV cache's first list.
const PV_CACHE_WAIT: Duration = Duration::from_secs(10);

pub async fn reconcile(claim: Arc<Claim>, ctx: Arc<Context>) -> Result<Action, ClaimError> {
    let claim = &claim.0;
    let view = ClaimView(claim);
    // The PV cache answers "saved already" for free, but only once it has
    // listed: at start-up the claims may be listed first, and a claim whose PV
    // exists would then cost an (idempotent) CreateVolume. Instant once ready;
    // bounded, because a PV watch that cannot list (RBAC not there yet, an API
    // outage) must not hold provisioning: without the cache the create finds
    // out, at the price of that CreateVolume.
    let _ = tokio::time::timeout(PV_CACHE_WAIT, ctx.caches.volumes_listed.wait()).await;
    let (decision, attempt) = decide(&Facts {
        claim: view,
        driver: &ctx.shared.driver.name,
        options: &ctx.options,
        class: ctx
            .shared
            .classes
            .get(&ObjectRef::new(view.class().unwrap_or_default())),
        place: &ctx.shared.place,
        recall: ctx.memory.recall(view.uid()),
        pv: cached_pv(&ctx, view),
    });
    ctx.memory.note(view.uid(), attempt);
    let action = match decision {
        Decision::Forget => {
            ctx.memory.forget(view.uid());
            return Ok(Action::await_change());
        }
        Decision::Requeue(wait) => {
            debug!(claim = %view.key(), ?wait, "the same attempt failed: waiting out its backoff");
            return Ok(Action::requeue(wait));
        }
        Decision::Refuse(err) => return Err(err),
        Decision::Wait(why) => {
            debug!(claim = %view.key(), why, "waiting");
            Action::await_change()
        }
        Decision::Race(class, node) => {
            race::race(&ctx, node, claim, &class)
                .await
                .map_err(|source| ClaimError::Read {
                    what: "PersistentVolumeClaim (taking it for this node)",
                    source,
                })?
        }
        Decision::Create(class, answered) => create::create(&ctx, claim, &class, answered).await?,
        Decision::Abandon(answered) => abandon::abandon(&ctx, claim, answered).await?,
        Decision::ReleaseIntent => {
            ctx.intents.request(claim);
            Action::await_change()
        }
        Decision::ReleaseCloneSource => protect::release_clone_source(&ctx, claim).await?,
    };
    ctx.memory.succeeded(view.uid());
    Ok(action)
}

/// What the PV cache shows under the claim's deterministic name.
fn cached_pv(ctx: &Context, claim: ClaimView) -> CachedPv {
    let Ok(name) = provision::volume_name(
        &ctx.options.volume_name_prefix,
        claim.uid(),
        ctx.options.volume_name_uuid_length,
    ) else {
        return CachedPv::Unknown;
    };
    match ctx.caches.volumes.get(&ObjectRef::new(&name)) {
        Some(pv) => CachedPv::BoundTo(bound_claim_uid(&pv).unwrap_or_default().to_string()),
        None => CachedPv::Unknown,
    }
}

/// Every failure a reconcile returns lands here: it is shown on the claim
/// (event, failure metric) and the claim is requeued with its backoff, the
/// failed attempt held back until then. An infeasible request waits
/// `--retry-interval-max` (or a new StorageClass); a claim left to a volume
/// populator waits for a change.
pub fn error_policy(claim: Arc<Claim>, err: &ClaimError, ctx: Arc<Context>) -> Action {
    let view = ClaimView(&claim.0);
    error::report(&ctx, &claim.0, err);
    if err.is_ignored() {
        debug!(claim = %view.key(), reason = %err, "ignored");
        ctx.memory.succeeded(view.uid());
        return Action::await_change();
    }
    let delay = match err {
        ClaimError::NotLeader | ClaimError::ClonesPending => {
            ctx.memory.failed(view.uid(), Hold::Nothing)
        }
        ClaimError::CreateVolume {
            class: CsiErrorClass::Infeasible,
            ..
        } => ctx.memory.failed_for(view.uid(), ctx.memory.retry_max()),
        _ => ctx.memory.failed(view.uid(), Hold::Attempt),
    };
    match err {
        ClaimError::NotLeader | ClaimError::ClonesPending => {
            debug!(claim = %view.key(), reason = %err, retry_in = ?delay, "waiting")
        }
        _ => {
            warn!(claim = %view.key(), error = %err, kind = err.label(), final_error = err.is_final(), retry_in = ?delay, "provisioning failed")
        }
    }
    Action::requeue(delay)
}

/// Forgets a claim the watch says is gone (the reconciler never hears of it).
pub fn forget_deleted(memory: &ClaimMemory, event: &watcher::Event<Claim>) {
    if let watcher::Event::Delete(Claim(claim)) = event {
        memory.forget(ClaimView(claim).uid());
    }
}
