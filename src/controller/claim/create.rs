//! The create sequence: a claim of ours without a volume gets one backend
//! volume and one PV, exactly once.
//!
//! 1. decide from the cached copy (class, node, a PV already saved) — free;
//! 2. `Provisioning` event, then build everything the request needs from that
//!    copy: the request (pure), the VolumeAttributesClass, the topology, the
//!    provisioner secret — any failure is shown on the claim and nothing is
//!    written;
//! 3. write the intent fenced on the copy's UID and resourceVersion
//!    ([`intent::record`]): the one request that both makes the intent durable
//!    and confirms the copy (a changed claim is read and step 2 repeated);
//! 4. `CreateVolume`, classified by `csi::classify`;
//! 5. save the PV; `AlreadyExists` is read and checked (DESIGN §2.3); a
//!    failure is retried, never answered by deleting the volume (§2.4);
//! 6. `ProvisioningSucceeded`. The intent leaves when the claim is bound
//!    (`ReleaseIntent`), off the critical path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::abandon::delete_volume;
use super::decide::{Gate, Work, gate, work_for};
use super::error::{ClaimError, labels, report};
use super::intent::{self, Confirmed};
use super::protect;
use crate::controller::node::{NodeGate, node_gate, race};
use crate::controller::topology::{self, TopologyError};
use crate::controller::{Context, bound_claim_uid};
use crate::csi::{CsiErrorClass, classify, pb};
use crate::keys;
use crate::kube::reference_grant::ReferenceGrant;
use crate::kube::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use crate::kube::{EventType, api_message, get_fresh, is_conflict};
use crate::provision::snapshot::SnapshotSource;
use crate::provision::{self, ClaimView, PreparedVolume, ProvisionError, migration};

/// How often a changed claim is re-read and re-decided within one attempt
/// before the attempt is left to the next event.
const CONFIRM_ROUNDS: usize = 3;

/// How long a claim waits for the PV cache's first list.
const PV_CACHE_WAIT: Duration = Duration::from_secs(10);

pub async fn provision(
    ctx: &Context,
    cached: &PersistentVolumeClaim,
) -> Result<Action, ClaimError> {
    let view = ClaimView(cached);
    let uid = view.uid();
    // The PV cache answers "saved already" for free, but only once it has
    // listed: at start-up the claims may be listed first, and a claim whose PV
    // exists would then cost an (idempotent) CreateVolume. Instant once ready;
    // bounded, because a PV watch that cannot list (RBAC not there yet, an API
    // outage) must not hold provisioning: without the cache the create finds
    // out, at the price of that CreateVolume.
    let _ = tokio::time::timeout(PV_CACHE_WAIT, ctx.caches.volumes_listed.wait()).await;
    let class = class_of(ctx, view).map_err(|e| report(ctx, cached, e))?;
    // A class of the in-tree plugin migrated to our driver, in our driver's
    // terms (upstream: csi-translation-lib); its provisioner stays in-tree.
    let class = if migration::is_migrated_class(&class, &ctx.driver.name) {
        Arc::new(migration::translate_class(&class).map_err(|e| {
            report(
                ctx,
                cached,
                ClaimError::Invalid(ProvisionError::Migration(e)),
            )
        })?)
    } else {
        class
    };
    if gate(view, &class, &ctx.driver.name) != Gate::Go {
        return Ok(Action::await_change());
    }
    if let Some(node) = &ctx.node {
        match node_gate(view, &class, node) {
            NodeGate::ThisNode => {}
            NodeGate::OtherNode | NodeGate::NotHere => return Ok(Action::await_change()),
            NodeGate::RaceForIt => {
                return race(ctx, node, cached, &class)
                    .await
                    .map_err(|source| ClaimError::Read {
                        what: "PersistentVolumeClaim (taking it for this node)",
                        source,
                    });
            }
        }
    }
    match cached_pv(ctx, view) {
        CachedPv::Ours => {
            // Saved already: binding is kube-controller-manager's step, and
            // the intent leaves with it (`ReleaseIntent`).
            debug!(claim = %view.key(), "its PV exists: waiting for the binder");
            return Ok(Action::await_change());
        }
        // Our deterministic name is taken: no CreateVolume (it would make a
        // volume no PV can point to). Stopping is safe on a stale cache: the
        // retry looks again.
        CachedPv::Another(other) => {
            let name = provision::volume_name(
                &ctx.options.volume_name_prefix,
                uid,
                ctx.options.volume_name_uuid_length,
            )?;
            return Err(report(
                ctx,
                cached,
                ClaimError::PvOfAnotherClaim { name, other },
            ));
        }
        CachedPv::Unknown => {}
    }
    ctx.claims.attempt_started(uid);
    // As upstream: before every attempt, also one that then fails validation.
    ctx.recorder.record(
        cached,
        EventType::Normal,
        "Provisioning",
        &format!(
            "External provisioner is provisioning volume for claim \"{}\"",
            view.key()
        ),
    );

    let mut copy = cached.clone();
    for _ in 0..CONFIRM_ROUNDS {
        let (prepared, request, source) = prepare(ctx, &copy, &class).await?;
        match intent::record(&ctx.client, &copy).await? {
            Confirmed::Current(claim) => {
                if let Some(source) = &source {
                    protect::protect(ctx, &claim, source).await?;
                }
                // `copy` is the claim as it was before this attempt's write.
                let earlier = if ClaimView(&copy).holds_intent() {
                    Earlier::MayHaveCreated
                } else {
                    Earlier::None
                };
                let volume = create_volume(ctx, &claim, &class, request, earlier).await?;
                let action = save(ctx, &claim, &class, &prepared, volume).await?;
                if let Some(snapshot) = &prepared.snapshot {
                    protect::release_snapshot(ctx, snapshot).await;
                }
                return Ok(action);
            }
            Confirmed::Changed(fresh) => {
                let still = ClaimView(&fresh);
                if work_for(still, &ctx.driver.name) != Work::Provision
                    || gate(still, &class, &ctx.driver.name) != Gate::Go
                    || ctx
                        .node
                        .as_ref()
                        .is_some_and(|n| node_gate(still, &class, n) != NodeGate::ThisNode)
                {
                    debug!(claim = %view.key(), "no longer needs a volume from us");
                    return Ok(Action::await_change());
                }
                copy = fresh;
            }
            Confirmed::Gone => return Ok(Action::await_change()),
        }
    }
    // Changing faster than we can read it: the next event decides.
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The claim's StorageClass, from the cache.
fn class_of(ctx: &Context, claim: ClaimView) -> Result<Arc<StorageClass>, ClaimError> {
    let name = claim.class().unwrap_or_default();
    ctx.caches
        .classes
        .get(&ObjectRef::new(name))
        .ok_or_else(|| ClaimError::StorageClassNotFound {
            name: name.to_string(),
        })
}

/// What is known, without a request, of the PV under the claim's name.
enum CachedPv {
    /// Saved by this process, or in the PV cache bound to this claim (a PV
    /// once seen bound to the claim's UID did exist).
    Ours,
    /// In the PV cache, bound to another claim (its UID).
    Another(String),
    /// Nothing: "no PV" is never taken from the cache, the create finds out.
    Unknown,
}

fn cached_pv(ctx: &Context, claim: ClaimView) -> CachedPv {
    if ctx.claims.pv_saved(claim.uid()) {
        return CachedPv::Ours;
    }
    let Ok(name) = provision::volume_name(
        &ctx.options.volume_name_prefix,
        claim.uid(),
        ctx.options.volume_name_uuid_length,
    ) else {
        return CachedPv::Unknown;
    };
    match ctx.caches.volumes.get(&ObjectRef::new(&name)) {
        Some(pv) if bound_claim_uid(&pv) == Some(claim.uid()) => CachedPv::Ours,
        Some(pv) => CachedPv::Another(bound_claim_uid(&pv).unwrap_or_default().to_string()),
        None => CachedPv::Unknown,
    }
}

/// Everything the request needs, from `claim` as it is: the request itself
/// (pure), the snapshot or claim it is made from (read live, returned to be
/// protected),
/// the VolumeAttributesClass's parameters, the topology and the provisioner
/// secret. Any failure is shown on the claim.
pub(super) async fn prepare(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<
    (
        PreparedVolume,
        pb::CreateVolumeRequest,
        Option<protect::Source>,
    ),
    ClaimError,
> {
    let fail = |e: ClaimError| report(ctx, claim, e);
    // This process has the driver's answer already (the PV is still to be
    // saved): the source was checked and protected before it was asked, and
    // must not be judged again (a source deleted meanwhile, protected, would
    // otherwise hold up the save).
    let answered = ctx.claims.created(ClaimView(claim).uid()).is_some();
    // A source in another namespace is checked first, as upstream does: a
    // ReferenceGrant there must allow it (listed live, like the source).
    let foreign = provision::grant::foreign_source(ClaimView(claim), &ctx.options);
    if let Some(source) = foreign.filter(|_| !answered) {
        let namespace = source.namespace.unwrap_or_default();
        let grants = Api::<ReferenceGrant>::namespaced(ctx.client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(|e| {
                fail(ClaimError::ReadGrants {
                    namespace: namespace.to_string(),
                    source: e,
                })
            })?;
        provision::grant::check(&grants.items, ClaimView(claim), &source)
            .map_err(|e| fail(e.into()))?;
    }
    let prepared =
        provision::prepare(claim, class, &ctx.driver, &ctx.options).map_err(|e| fail(e.into()))?;
    let mut request = prepared.request.clone();
    let mut source_object = None;
    if let Some(source) = prepared.snapshot.as_ref().filter(|_| !answered) {
        let refused = |reason: String| {
            fail(ClaimError::DataSource {
                kind: keys::SNAPSHOT_KIND,
                name: source.name.clone(),
                reason,
            })
        };
        let (snapshot, content) = read_snapshot(ctx, source).await.map_err(|e| {
            refused(format!(
                "error getting snapshot {} from api server: {}",
                source.name,
                api_message(&e)
            ))
        })?;
        request.volume_content_source = Some(
            provision::snapshot::content_source(
                claim,
                &class.provisioner,
                &snapshot,
                content.as_ref(),
                ctx.options.prevent_volume_mode_conversion,
            )
            .map_err(refused)?,
        );
        source_object = Some(protect::Source::Snapshot(Box::new(snapshot)));
    }
    if let Some(source) = prepared.clone.as_ref().filter(|_| !answered) {
        let refused = |reason: String| {
            fail(ClaimError::DataSource {
                kind: keys::CLAIM_KIND,
                name: source.name.clone(),
                reason,
            })
        };
        let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &source.namespace);
        let original = api.get(&source.name).await.map_err(|e| {
            refused(format!(
                "error getting PVC {} (namespace {:?}) from api server: {}",
                source.name,
                source.namespace,
                api_message(&e)
            ))
        })?;
        let volume_name = original
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty());
        let pv = match volume_name {
            Some(name) => Api::<PersistentVolume>::all(ctx.client.clone())
                .get(&name)
                .await
                .map_err(|e| debug!(pv = %name, error = %e, "cannot read the source claim's PV"))
                .ok(),
            None => None,
        };
        request.volume_content_source = Some(
            provision::clone::content_source(claim, &class.provisioner, &original, pv.as_ref())
                .map_err(refused)?,
        );
        source_object = Some(protect::Source::Claim(Box::new(original)));
    }
    if let Some(name) = ClaimView(claim).vac_name(&ctx.options) {
        request.mutable_parameters = vac_parameters(ctx, name).await.map_err(fail)?;
    }
    request.accessibility_requirements = match topology::requirements(ctx, claim, class).await {
        Ok(r) => r,
        Err(TopologyError::SelectedNodeGone(node)) => {
            // upstream #1438: a vanished node must not pin the claim forever.
            let err = fail(ClaimError::Invalid(ProvisionError::Topology(format!(
                "failed to get selected CSINode {node}: csinode.storage.k8s.io \"{node}\" not found"
            ))));
            // Nothing was asked of the driver this time; an intent left by an
            // earlier attempt (whose volume may exist) stays.
            reschedule(ctx, claim, Reschedule::KeepIntent).await?;
            return Err(err);
        }
        Err(TopologyError::Invalid(e)) => {
            return Err(fail(ClaimError::Invalid(ProvisionError::Topology(
                format!("error generating accessibility requirements: {e}"),
            ))));
        }
        Err(TopologyError::Kube(e)) => return Err(fail(ClaimError::ReadTopology(e))),
    };
    if let Some(r) = prepared.provisioner_secret() {
        request.secrets = ctx.secret_data(r).await.map_err(|source| {
            fail(ClaimError::GetSecret {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                source,
            })
        })?;
    }
    Ok((prepared, request, source_object))
}

/// A snapshot and, when it names one that can be read, its content.
pub(super) async fn read_snapshot(
    ctx: &Context,
    source: &SnapshotSource,
) -> Result<(VolumeSnapshot, Option<VolumeSnapshotContent>), kube::Error> {
    let snapshot = Api::<VolumeSnapshot>::namespaced(ctx.client.clone(), &source.namespace)
        .get(&source.name)
        .await?;
    let content = match snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
    {
        Some(name) => Api::<VolumeSnapshotContent>::all(ctx.client.clone())
            .get(name)
            .await
            .map_err(|e| debug!(content = name, error = %e, "cannot read the snapshot's content"))
            .ok(),
        None => None,
    };
    Ok((snapshot, content))
}

/// The parameters of the VolumeAttributesClass `name`, read from the API
/// server as upstream does (the class may be newer than any cache). A class
/// meant for another driver is refused.
async fn vac_parameters(ctx: &Context, name: &str) -> Result<HashMap<String, String>, ClaimError> {
    let api: Api<VolumeAttributesClass> = Api::all(ctx.client.clone());
    let vac = api
        .get(name)
        .await
        .map_err(|source| ClaimError::GetVolumeAttributesClass {
            name: name.to_string(),
            source,
        })?;
    if vac.driver_name != ctx.driver.name {
        return Err(ProvisionError::VolumeAttributesClassOfAnotherDriver {
            name: name.to_string(),
            driver: vac.driver_name,
            ours: ctx.driver.name.clone(),
        }
        .into());
    }
    Ok(vac.parameters.unwrap_or_default().into_iter().collect())
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
/// the selected node. Every failure is shown on the claim.
async fn create_volume(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    request: pb::CreateVolumeRequest,
    earlier: Earlier,
) -> Result<pb::Volume, ClaimError> {
    let view = ClaimView(claim);
    if let Some(v) = ctx.claims.created(view.uid()) {
        return Ok(v);
    }
    if !ctx.leader.is_leader() {
        return Err(ClaimError::NotLeader);
    }
    // A migrated class's call is labelled `migrated="true"`, as upstream.
    let migrated = migration::is_migrated_class(class, &ctx.driver.name);
    match ctx.csi.for_migrated(migrated).create_volume(request).await {
        Ok(resp) => match resp.volume.filter(|v| !v.volume_id.is_empty()) {
            Some(volume) => {
                ctx.claims.remember_created(view.uid(), &volume);
                Ok(volume)
            }
            None => Err(report(ctx, claim, ProvisionError::EmptyVolumeId.into())),
        },
        Err(status) => {
            let reschedulable =
                ctx.driver.capabilities.accessibility_constraints && view.selected_node().is_some();
            let class_of_error = classify(status.code(), reschedulable);
            let err = report(
                ctx,
                claim,
                ClaimError::create_volume(status, class_of_error),
            );
            match class_of_error {
                // Waits `--retry-interval-max` (the error policy), or a new class.
                CsiErrorClass::Infeasible => {}
                CsiErrorClass::Reschedule => match (earlier, &ctx.node) {
                    (Earlier::None, _) => reschedule(ctx, claim, Reschedule::DropIntent).await?,
                    // One driver for every node: the intent stays, and a claim
                    // deleted now is cleaned up by its name wherever it goes.
                    (Earlier::MayHaveCreated, None) => {
                        reschedule(ctx, claim, Reschedule::KeepIntent).await?
                    }
                    // A volume of this name may be on this node's driver, and
                    // no other node could find it: the claim stays here and
                    // is retried until the driver answers for it (a driver
                    // that checks room before its own volumes says no room to
                    // a retry of a create it already did).
                    (Earlier::MayHaveCreated, Some(node)) => {
                        warn!(claim = %view.key(), node = %node.name, "no room on this node, but an earlier attempt may have created the volume here: retrying here instead of giving the claim back");
                    }
                },
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

/// Lets the scheduler choose again: the selected node goes (UID-fenced).
async fn reschedule(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    why: Reschedule,
) -> Result<(), ClaimError> {
    let view = ClaimView(claim);
    let mut body =
        json!({"metadata": {"uid": view.uid(), "annotations": {view.selected_node_key(): null}}});
    if why == Reschedule::DropIntent {
        body["metadata"]["$deleteFromPrimitiveList/finalizers"] =
            json!([keys::FINALIZER_PVC_INTENT]);
    }
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), view.namespace())
        .patch(
            view.name(),
            &PatchParams::default(),
            &Patch::Strategic(&body),
        )
        .await
        .map_err(ClaimError::Reschedule)?;
    Ok(())
}

/// Builds and saves the PV for `volume`, then reports success.
async fn save(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    prepared: &PreparedVolume,
    volume: pb::Volume,
) -> Result<Action, ClaimError> {
    let view = ClaimView(claim);
    let handle = volume.volume_id.clone();
    let response = pb::CreateVolumeResponse {
        volume: Some(volume),
    };
    let built = provision::build_pv(prepared, claim, class, &response, &ctx.driver, &ctx.options)
        .and_then(|mut pv| {
            // Saved in the in-tree form for a migrated class, as upstream.
            if migration::is_migrated_class(class, &ctx.driver.name) {
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
            let cleanup = delete_volume(ctx, prepared.provisioner_secret(), &handle).await;
            ctx.claims.forget_created(view.uid());
            let err = match cleanup {
                Ok(()) => ClaimError::Invalid(e),
                Err(c) => ClaimError::Orphaned {
                    error: e,
                    pv: prepared.pv_name.clone(),
                    cleanup: Box::new(c),
                },
            };
            return Err(report(ctx, claim, err));
        }
        Err(e) => return Err(report(ctx, claim, e.into())),
    };
    save_pv(ctx, claim, pv).await?;
    ctx.claims.mark_pv_saved(view.uid());
    let labels = labels(claim);
    ctx.metrics.provision_total.get_or_create(&labels).inc();
    if let Some(took) = ctx.claims.take_started(view.uid()) {
        ctx.metrics
            .provision_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
    info!(claim = %view.key(), pv = %prepared.pv_name, "provisioned");
    ctx.capacity_changed();
    // Upstream finds no claim to report on when it was deleted meanwhile;
    // ours is still there (Terminating, held by the intent): say nothing either.
    if !deleted_since(ctx, view) {
        ctx.recorder.record(
            claim,
            EventType::Normal,
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume {}", prepared.pv_name),
        );
    }
    Ok(Action::await_change())
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
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let source = match api.create(&PostParams::default(), &pv).await {
        Ok(_) => return Ok(()),
        Err(e) if is_conflict(&e) => e,
        Err(source) => return Err(report(ctx, claim, ClaimError::SavePv { name, source })),
    };
    let existing = get_fresh(&ctx.pv_api(), &name)
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
        other => Err(report(
            ctx,
            claim,
            ClaimError::PvOfAnotherClaim {
                name,
                other: other.unwrap_or_default().to_string(),
            },
        )),
    }
}
