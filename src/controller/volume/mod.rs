//! The volume path: a PV we provisioned that is `Released` with reclaim
//! policy `Delete` is deleted (our finalizer holds it), gets `DeleteVolume`,
//! then our finalizer is dropped. A `Bound` PV's volume is never deleted, even when the PV
//! object is being deleted: the finalizer holds it until the claim lets go.
//! upstream: lib controller.go syncVolume, shouldDelete, deleteVolumeOperation.
//!
//! A reconcile is the claim path's shape: read the facts (the cached PV, what
//! the memory recalls, where this replica runs), **decide once**
//! (`decide.rs`), carry the decision out (the finalizer here, the deletion in
//! `delete.rs`), and return. A failure is returned where it happens and
//! **reported once**, by the error policy (`error.rs`).

mod decide;
mod delete;
mod error;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use super::{Context, VolumeMemory};
use crate::keys;
use crate::kube::slim::Pv;
use crate::kube::{add_finalizer, is_invalid, is_not_found, remove_finalizer};
use decide::{Decision, Facts, Recall};
pub use error::VolumeError;

pub async fn reconcile(pv: Arc<Pv>, ctx: Arc<Context>) -> Result<Action, VolumeError> {
    let uid = pv.uid().unwrap_or_default();
    let facts = Facts {
        pv: &pv,
        driver: &ctx.driver.name,
        place: &ctx.place,
        recall: Recall {
            deleted: ctx.volumes.read(&uid, |e| e.deleted) == Some(true),
            held: ctx.volumes.held(&uid),
        },
    };
    let (decision, attempt) = decide::decide(&facts);
    let api = ctx.pv_api();
    match decision {
        Decision::Forget => {
            ctx.volumes.forget(&uid);
            return Ok(Action::await_change());
        }
        Decision::Requeue(wait) => {
            debug!(pv = %pv.name_any(), ?wait, "the same attempt failed: waiting out its backoff");
            return Ok(Action::requeue(wait));
        }
        Decision::Wait(why) => debug!(pv = %pv.name_any(), why, "nothing to do"),
        Decision::AddFinalizer => {
            ctx.volumes.note(&uid, attempt);
            match add_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await {
                Ok(_) => {}
                // Being deleted (no new finalizer on it) or gone: nothing to hold.
                Err(e) if is_invalid(&e) || is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Decision::RemoveFinalizer => {
            ctx.volumes.note(&uid, attempt);
            remove_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await?;
        }
        Decision::Delete => {
            ctx.volumes.note(&uid, attempt);
            delete::delete(&ctx, &pv).await?;
        }
    }
    ctx.volumes.succeeded(&uid);
    Ok(Action::await_change())
}

/// Every failure a reconcile returns lands here: shown on the PV (`report`),
/// and the PV requeued with its backoff, the failed attempt held back until
/// then. A deletion that waits for a detach is a Normal note and no failure.
pub fn error_policy(pv: Arc<Pv>, err: &VolumeError, ctx: Arc<Context>) -> Action {
    let uid = pv.uid().unwrap_or_default();
    error::report(&ctx, &pv, err);
    let delay = ctx.volumes.failed(&uid, err.hold());
    match err {
        VolumeError::NotLeader => debug!(pv = %pv.name_any(), "not leader"),
        _ if err.is_postponement() => {
            info!(pv = %pv.name_any(), reason = %err, retry_in = ?delay, "deletion postponed")
        }
        _ => {
            warn!(pv = %pv.name_any(), error = %err, kind = err.label(), retry_in = ?delay, "deletion failed")
        }
    }
    Action::requeue(delay)
}

/// Forgets a PV the watch says is gone (the reconciler never hears of it).
pub fn forget_deleted(memory: &VolumeMemory, event: &watcher::Event<Pv>) {
    if let watcher::Event::Delete(pv) = event {
        memory.forget(&pv.uid().unwrap_or_default());
    }
}
