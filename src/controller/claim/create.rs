//! The create sequence: a claim of ours without a volume gets one backend
//! volume and one PV, exactly once. The decision to create was taken from
//! the cached copy (`decide`); here it is carried out:
//!
//! 1. the `Provisioning` event, then everything the request needs, gathered
//!    from that copy ([`gather::for_create`]) — a failure is returned, shown
//!    by the error policy, and nothing is written;
//! 2. the intent written fenced on the copy's UID and resourceVersion
//!    ([`intent::record`]): the one request that both makes the intent durable
//!    and confirms the copy (a changed claim is read, decided on again and
//!    step 1 repeated);
//! 3. the source protected, then `CreateVolume`, classified by `csi::classify`;
//! 4. the PV saved; `AlreadyExists` is read and checked (DESIGN §2.3); a
//!    failure is retried, never answered by deleting the volume (§2.4);
//! 5. `ProvisioningSucceeded`. The intent leaves when the claim is bound
//!    (`ReleaseIntent`), off the critical path.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

use super::Context;
use super::decide::{Answered, still_creates};
use super::error::{ClaimError, labels};
use super::gather::{self, Ready};
use super::intent::{self, Confirmed, IntentMode};
use super::protect;
use crate::controller::node::NoRoom;
use crate::controller::queue::Action;
use crate::controller::{backend, bound_claim_uid};
use crate::csi::{CsiErrorClass, classify, pb};
use crate::kube::{get_fresh, is_conflict, update};
use crate::names::Reason;
use crate::provision::{self, ClaimView, Plan, ProvisionError, migration};

/// How often a changed claim is re-read and re-decided within one attempt
/// before the attempt is left to the next event.
const CONFIRM_ROUNDS: usize = 3;

pub async fn create(
    ctx: &Context,
    cached: &PersistentVolumeClaim,
    class: &StorageClass,
    answered: Answered,
) -> Result<Action, ClaimError> {
    let view = ClaimView(cached);
    ctx.memory.attempt_started(view.uid());
    // As upstream: before every attempt, also one that then fails validation.
    ctx.shared.recorder.record(
        cached,
        Reason::Provisioning,
        &format!(
            "External provisioner is provisioning volume for claim \"{}\"",
            view.key()
        ),
    );
    let mut copy = cached.clone();
    for _ in 0..CONFIRM_ROUNDS {
        let ready = match gather::for_create(ctx, &copy, class, answered.created.is_some()).await {
            Err(err @ ClaimError::SelectedNodeGone { .. }) => {
                // Nothing was asked of the driver this time; an intent left by
                // an earlier attempt (whose volume may exist) stays.
                reschedule(ctx, &copy, Reschedule::KeepIntent).await;
                return Err(err);
            }
            other => other?,
        };
        match intent::confirm(ctx, &copy).await? {
            Confirmed::Current(claim) => {
                return carry_out(ctx, &copy, &claim, class, ready, answered.created).await;
            }
            Confirmed::Changed(fresh) => {
                if !still_creates(
                    ClaimView(&fresh),
                    class,
                    &ctx.shared.driver.name,
                    &ctx.shared.place,
                ) {
                    debug!(claim = %view.key(), "no longer needs a volume from us");
                    return Ok(Action::await_change());
                }
                copy = fresh;
            }
            Confirmed::Gone => return Ok(Action::await_change()),
            // Its watch event brings the newer copy, and a new attempt with it.
            Confirmed::Newer => return Ok(Action::await_change()),
        }
    }
    // Changing faster than we can read it: the next event decides.
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Steps 3 to 5, on the claim as the fenced write confirmed it (`before`:
/// as it was decided on, before that write).
async fn carry_out(
    ctx: &Context,
    before: &PersistentVolumeClaim,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    ready: Ready,
    created: Option<pb::Volume>,
) -> Result<Action, ClaimError> {
    let Ready {
        plan,
        request,
        source,
    } = ready;
    // The check is done; the create and the save take one of the
    // `--worker-threads` permits, first come first served.
    let _slot = ctx
        .creates
        .acquire()
        .await
        .expect("the semaphore is never closed");
    if let Some(source) = &source {
        protect::protect(ctx, source).await?;
    }
    let earlier = if ClaimView(before).holds_intent() {
        Earlier::MayHaveCreated
    } else {
        Earlier::None
    };
    let volume = ctx
        .shared
        .metrics
        .stage(
            "create_volume",
            create_volume(ctx, claim, class, request, earlier, created),
        )
        .await?;
    save(ctx, claim, class, &plan, volume).await?;
    if let Some(snapshot) = &plan.snapshot {
        protect::release_snapshot(ctx, snapshot, ClaimView(claim).uid()).await;
    }
    Ok(Action::await_change())
}

/// Whether an earlier attempt may have left a volume of the claim's name: it
/// recorded the intent, so it may have reached `CreateVolume` (and, say, been
/// answered `DEADLINE_EXCEEDED` while the driver went on to create it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Earlier {
    /// The intent was not on the claim before this attempt: this attempt's
    /// `CreateVolume` is the first for its name.
    None,
    MayHaveCreated,
}

/// `CreateVolume` (unless this process has the answer already), with the
/// error classification applied: infeasible claims wait, a reschedule drops
/// the selected node. The failure is returned (the error policy shows it).
async fn create_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: pb::CreateVolumeRequest,
    earlier: Earlier,
    created: Option<pb::Volume>,
) -> Result<pb::Volume, ClaimError> {
    let view = ClaimView(claim);
    // This process has the driver's answer already (recalled with the facts).
    if let Some(v) = created {
        return Ok(v);
    }
    if !ctx.shared.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    // A migrated class's call is labelled `migrated="true"`, as upstream.
    let migrated = migration::is_migrated_class(class, &ctx.shared.driver.name);
    match ctx
        .shared
        .csi
        .for_migrated(migrated)
        .create_volume(request)
        .await
    {
        Ok(resp) => match resp.volume.filter(|v| !v.volume_id.is_empty()) {
            Some(volume) => {
                ctx.memory.remember_created(view.uid(), &volume);
                Ok(volume)
            }
            None => Err(ProvisionError::EmptyVolumeId.into()),
        },
        Err(status) => {
            let reschedulable = ctx.shared.driver.capabilities.accessibility_constraints
                && view.selected_node().is_some();
            let class_of_error = classify(status.code(), reschedulable);
            let err = ClaimError::create_volume(status, class_of_error);
            match class_of_error {
                // Waits `--retry-interval-max` (the error policy), or a new class.
                CsiErrorClass::Infeasible => {}
                CsiErrorClass::Reschedule => {
                    match ctx.shared.place.no_room(earlier == Earlier::MayHaveCreated) {
                        NoRoom::GiveBack { keep_intent: false } => {
                            reschedule(ctx, claim, Reschedule::DropIntent).await
                        }
                        NoRoom::GiveBack { keep_intent: true } => {
                            reschedule(ctx, claim, Reschedule::KeepIntent).await
                        }
                        NoRoom::StayOn(node) => {
                            warn!(claim = %view.key(), %node, "no room on this node, but an earlier attempt may have created the volume here: retrying here instead of giving the claim back");
                        }
                    }
                }
                CsiErrorClass::InBackground | CsiErrorClass::Final => {}
            }
            Err(err)
        }
    }
}

/// What a claim sent back to the scheduler keeps of ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reschedule {
    /// The intent stays: a volume of the claim's name may exist (an earlier
    /// attempt recorded it), so a claim deleted now must still be cleaned up.
    KeepIntent,
    /// The driver answered `ResourceExhausted` to the first `CreateVolume` of
    /// the claim's name, so no volume of that name exists; the intent goes in
    /// the same write: another node may take the claim, and a claim deleted
    /// now has nothing of ours left to clean up — with one sidecar per node no
    /// other node could (it would ask its own driver).
    DropIntent,
}

/// Lets the scheduler choose again: the selected node goes, in an update of the claim with this
/// UID (as upstream's lib v13.1: a conflict reads the claim and tries again). A failed write is
/// logged: the failure that asked for it is what the claim shows, and its retry asks again.
async fn reschedule(ctx: &Context, claim: &PersistentVolumeClaim, why: Reschedule) {
    let view = ClaimView(claim);
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), view.namespace());
    let edited = update::edit(&api, view.name(), view.uid(), Some(claim.clone()), |c| {
        let key = ClaimView(c).selected_node_key().to_string();
        let unselected = c
            .metadata
            .annotations
            .as_mut()
            .is_some_and(|a| a.remove(&key).is_some());
        let released = why == Reschedule::DropIntent && super::intent::drop_intent(c);
        unselected || released
    })
    .await;
    if let Err(e) = edited {
        warn!(claim = %view.key(), error = %e, "failed to send the claim back to the scheduler")
    }
}

/// Builds and saves the PV for `volume`, then says so on the claim.
async fn save(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &Plan,
    volume: pb::Volume,
) -> Result<(), ClaimError> {
    let view = ClaimView(claim);
    let handle = volume.volume_id.clone();
    let shared = &ctx.shared;
    let response = pb::CreateVolumeResponse {
        volume: Some(volume),
    };
    let built = provision::build_pv(plan, claim, class, &response, &shared.driver, &ctx.options)
        .and_then(|mut pv| {
            // Saved in the in-tree form for a migrated class, as upstream.
            if migration::is_migrated_class(class, &shared.driver.name) {
                migration::pv_to_in_tree(&class.provisioner, &mut pv)
                    .map_err(ProvisionError::Migration)?;
            }
            Ok(pv)
        });
    let pv = match built {
        Ok(pv) => pv,
        Err(
            e @ (ProvisionError::VolumeTooSmall { .. }
            | ProvisionError::ContentSourceMissing
            | ProvisionError::Migration(_)),
        ) => {
            // The driver broke its contract; the volume is useless to this
            // claim and no PV points to it (upstream deletes it too).
            let cleanup =
                backend::delete_volume(shared, &handle, plan.provisioner_secret(), false).await;
            ctx.memory.forget_created(view.uid());
            return Err(match cleanup {
                Ok(()) => ClaimError::Invalid(e),
                Err(c) => ClaimError::Orphaned {
                    error: e,
                    pv: plan.pv_name.clone(),
                    cleanup: Box::new(ClaimError::deleting(&handle, c)),
                },
            });
        }
        Err(e) => return Err(e.into()),
    };
    shared
        .metrics
        .stage("save_pv", save_pv(ctx, claim, pv))
        .await?;
    ctx.memory.mark_pv_saved(view.uid());
    let labels = labels(claim);
    shared.metrics.provision_total.get_or_create(&labels).inc();
    if let Some(took) = ctx.memory.take_started(view.uid()) {
        shared
            .metrics
            .provision_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
    info!(claim = %view.key(), pv = %plan.pv_name, "provisioned");
    shared.capacity_changed();
    // Upstream finds no claim to report on when it was deleted meanwhile;
    // ours is still there (Terminating, held by the intent): say nothing either.
    if !deleted_since(ctx, view) {
        shared.recorder.record(
            claim,
            Reason::ProvisioningSucceeded,
            &format!("Successfully provisioned volume {}", plan.pv_name),
        );
    }
    Ok(())
}

/// Whether the claims cache shows this claim deleted (after our fenced write).
fn deleted_since(ctx: &Context, claim: ClaimView) -> bool {
    ctx.caches
        .claims
        .get(&ObjectRef::new(claim.name()).within(claim.namespace()))
        .is_some_and(|c| ClaimView(&c.0).uid() == claim.uid() && ClaimView(&c.0).is_deleting())
}

/// Saves the PV. `AlreadyExists` is an answer, not a failure (DESIGN §2.3):
/// ours if its claimRef is this claim. Any other failure is retried by the
/// error policy; the backend volume is never deleted because Kubernetes said
/// no (DESIGN §2.4), and, as upstream, a failed save shows no event.
async fn save_pv(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pv: PersistentVolume,
) -> Result<(), ClaimError> {
    let name = pv.name_any();
    // Behind the leader gate like `CreateVolume`: a replica paused past its
    // lease must not bind a claim the new leader has decided on since (found
    // by the model checker, docs/reliability.md F1/F2). The driver's answer
    // stays in the memory; the new leader's idempotent `CreateVolume` of the
    // same name finds the volume, or its cleanup deletes it.
    if !ctx.shared.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    // In policy mode the create's version is what the checks of a burst wait for.
    let stamp = match &ctx.intent {
        IntentMode::Admission(freshness) => Some(freshness.clock().stamp()),
        IntentMode::Write => None,
    };
    let source = match crate::kube::clock::create_pv(&ctx.shared.client, &pv, stamp).await {
        Ok(_) => return Ok(()),
        Err(e) if is_conflict(&e) => e,
        Err(source) => return Err(ClaimError::SavePv { name, source }),
    };
    let existing = get_fresh(&ctx.shared.pv_api(), &name)
        .await
        .map_err(|source| ClaimError::Read {
            what: "PersistentVolume",
            source,
        })?;
    let Some(existing) = existing else {
        // Deleted between our create and our read: try again.
        return Err(ClaimError::SavePv { name, source });
    };
    match bound_claim_uid(&existing) {
        Some(uid) if uid == ClaimView(claim).uid() => Ok(()),
        other => Err(ClaimError::PvOfAnotherClaim {
            name,
            other: other.unwrap_or_default().to_string(),
        }),
    }
}
