//! The claim path: a PVC that asks for our driver gets one backend volume and
//! one PV, exactly once, even under stale caches, crashes and deletion races.
//!
//! | module | owns |
//! |---|---|
//! | [`decide`] | what a claim needs (pure): provision, abandon, release the intent, nothing |
//! | [`create`] | the create sequence (DESIGN §2.1–2.4, §2.7) |
//! | [`intent`] | the durable intent and the authoritative check in one fenced write (§2.2, §2.5); its release |
//! | [`abandon`] | the cleanup of a claim deleted mid-flight (§2.5); the one `DeleteVolume` of the claim path |
//! | [`error`] | every failure, its event and metric; the one reporter |
//! | [`memory`] | what the process remembers per claim UID, forgotten in one place |

mod abandon;
mod create;
pub mod decide;
pub mod error;
pub mod intent;
pub mod memory;
mod protect;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tracing::{debug, warn};

pub use decide::{cached, trim};
pub use error::ClaimError;
pub use intent::IntentReleaser;
pub use memory::ClaimMemory;

use super::Context;
use super::memory::Hold;
use crate::csi::CsiErrorClass;
use crate::kube::slim::Claim;
use crate::provision::ClaimView;
use decide::{Work, attempt, work_for};

pub async fn reconcile(claim: Arc<Claim>, ctx: Arc<Context>) -> Result<Action, ClaimError> {
    let claim = &claim.0;
    let view = ClaimView(claim);
    let work = match work_for(view, &ctx.driver.name) {
        // With one sidecar per node, a claim's intent and its volume belong
        // to the node it was provisioned for: only that node cleans up.
        Work::Abandon | Work::ReleaseIntent
            if ctx
                .node
                .as_ref()
                .is_some_and(|n| view.selected_node() != Some(n.name.as_str())) =>
        {
            Work::Nothing
        }
        work => work,
    };
    if work == Work::Nothing {
        ctx.claims.forget(view.uid());
        return Ok(Action::await_change());
    }
    // The same attempt failed a moment ago: its own writes (and the control
    // plane's answers to them) trigger reconciles; the backoff still holds.
    let class_uid = ctx
        .caches
        .classes
        .get(&ObjectRef::new(view.class().unwrap_or_default()))
        .and_then(|c| c.metadata.uid.clone());
    if let Some(wait) = ctx
        .claims
        .begin(view.uid(), attempt(view, work, class_uid.as_deref()))
    {
        debug!(claim = %view.key(), ?wait, "the same attempt failed: waiting out its backoff");
        return Ok(Action::requeue(wait));
    }
    let action = match work {
        Work::Nothing => Action::await_change(),
        Work::ReleaseIntent => {
            if !ctx.claims.intent_released(view.uid()) {
                ctx.intents.request(claim);
            }
            Action::await_change()
        }
        Work::Abandon => abandon::abandon(&ctx, claim).await?,
        Work::ReleaseCloneSource => protect::release_clone_source(&ctx, claim).await?,
        Work::Provision => match create::provision(&ctx, claim).await {
            // Reported already; not ours to retry (a volume populator's claim).
            Err(e) if e.is_ignored() => {
                debug!(claim = %view.key(), reason = %e, "ignored");
                Action::await_change()
            }
            other => other?,
        },
    };
    ctx.claims.succeeded(view.uid());
    Ok(action)
}

/// Requeues a failed claim with per-claim exponential backoff; the attempt
/// that failed is held back until then. An infeasible request waits
/// `--retry-interval-max` (or a new StorageClass).
pub fn error_policy(claim: Arc<Claim>, err: &ClaimError, ctx: Arc<Context>) -> Action {
    let view = ClaimView(&claim.0);
    let delay = match err {
        ClaimError::NotLeader => ctx.claims.failed(view.uid(), Hold::Nothing),
        ClaimError::CreateVolume {
            class: CsiErrorClass::Infeasible,
            ..
        } => ctx.claims.failed_for(view.uid(), ctx.claims.retry_max()),
        _ => ctx.claims.failed(view.uid(), Hold::Attempt),
    };
    match err {
        ClaimError::NotLeader => debug!(claim = %view.key(), "not leader"),
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
