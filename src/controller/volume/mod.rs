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

pub mod decide;
mod delete;
mod error;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use super::{Shared, memory};
use crate::keys;
use crate::kube::slim::Pv;
use crate::kube::{Listed, add_finalizer, is_invalid, is_not_found, remove_finalizer};
use decide::{Decision, Facts, Recall};
pub use error::VolumeError;

/// What the volume reconciler works with: the shared part, what the volume
/// path remembers, and the one cache only it reads. Built once in `run`.
pub struct Context {
    pub shared: Arc<Shared>,
    /// What the volume path remembers, per PV UID.
    pub memory: VolumeMemory,
    /// VolumeAttachments, for a driver with `PUBLISH_UNPUBLISH_VOLUME` only:
    /// a PV one of them still names is not deleted yet (upstream's `vaLister`).
    pub attachments: Option<Attachments>,
}

/// The VolumeAttachment cache and whether its first list is in.
pub struct Attachments {
    pub store: Store<VolumeAttachment>,
    pub listed: Listed,
}

/// What the volume path remembers, per PV UID.
pub type VolumeMemory = memory::Memory<VolumeEntry>;

#[derive(Default)]
pub struct VolumeEntry {
    /// This process finished the PV's deletion, so a stale cached copy that
    /// still shows it Released with our finalizer costs no second read.
    pub deleted: bool,
}

pub async fn reconcile(pv: Arc<Pv>, ctx: Arc<Context>) -> Result<Action, VolumeError> {
    let uid = pv.uid().unwrap_or_default();
    let facts = Facts {
        pv: &pv,
        driver: &ctx.shared.driver.name,
        place: &ctx.shared.place,
        recall: Recall {
            deleted: ctx.memory.read(&uid, |e| e.deleted) == Some(true),
            held: ctx.memory.held(&uid),
        },
    };
    let (decision, attempt) = decide::decide(&facts);
    let api = ctx.shared.pv_api();
    match decision {
        Decision::Forget => {
            ctx.memory.forget(&uid);
            return Ok(Action::await_change());
        }
        Decision::Requeue(wait) => {
            debug!(pv = %pv.name_any(), ?wait, "the same attempt failed: waiting out its backoff");
            return Ok(Action::requeue(wait));
        }
        Decision::Wait(why) => debug!(pv = %pv.name_any(), why, "nothing to do"),
        Decision::AddFinalizer => {
            ctx.memory.note(&uid, attempt);
            match add_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await {
                Ok(_) => {}
                // Being deleted (no new finalizer on it) or gone: nothing to hold.
                Err(e) if is_invalid(&e) || is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Decision::RemoveFinalizer => {
            ctx.memory.note(&uid, attempt);
            remove_finalizer(&api, pv.as_ref(), keys::FINALIZER_PV).await?;
        }
        Decision::Delete => {
            ctx.memory.note(&uid, attempt);
            delete::delete(&ctx, &pv).await?;
        }
    }
    ctx.memory.succeeded(&uid);
    Ok(Action::await_change())
}

/// Whether an event of `pv` can give this path anything to do: the PV has
/// work (`decide::work_for`), or the memory holds something of it (a backoff
/// to wait out, a deletion to remember). Without either, a reconcile decides
/// "nothing to do" and sends nothing, so the PV is not queued at all: nearly
/// every PV of a large cluster is bound and held by our finalizer, or another
/// driver's, and queueing each one at start-up and after every relist kept
/// kube-runtime's scheduler at its size for 20,000 PVs (10 MiB of it resident
/// for good; the scale profile, 2026-12-07). A PV that gets work later is
/// queued by the event that gives it.
pub fn queues(ctx: &Context, pv: &Pv) -> bool {
    let remembered = ctx.memory.read(&pv.uid().unwrap_or_default(), |_| ());
    remembered.is_some() || decide::work_for(pv, &ctx.shared.driver.name) != decide::Work::Nothing
}

/// Every failure a reconcile returns lands here: shown on the PV (`report`),
/// and the PV requeued with its backoff, the failed attempt held back until
/// then. A deletion that waits for a detach is a Normal note and no failure.
pub fn error_policy(pv: Arc<Pv>, err: &VolumeError, ctx: Arc<Context>) -> Action {
    let uid = pv.uid().unwrap_or_default();
    error::report(&ctx, &pv, err);
    let delay = ctx.memory.failed(&uid, err.hold());
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
