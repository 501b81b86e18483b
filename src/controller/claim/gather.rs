//! The one gathering of what a claim's `CreateVolume` needs beyond the claim
//! and its class — the ReferenceGrants of a cross-namespace source, the
//! snapshot or source claim, the VolumeAttributesClass's parameters, the
//! provisioner secret, all read live, and the topology, from the CSINode and
//! Node caches — after which the request is built once, complete
//! ([`Plan::request`]). Strict for a create: every
//! check applies and any failure stops it. Best effort for the cleanup of a
//! deleted claim: the same request as far as it can still be rebuilt.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::Context;
use super::error::ClaimError;
use super::protect;
use crate::controller::backend;
use crate::csi::pb;
use crate::keys;
use crate::kube::reference_grant::ReferenceGrant;
use crate::kube::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use crate::kube::{api_message, get_fresh};
use crate::provision::snapshot::SnapshotSource;
use crate::provision::topology::{
    self as topo, Ask, Segments, SelectedNode, TopologyError, TopologyInputs,
};
use crate::provision::{self, ClaimView, Gathered, Plan, ProvisionError};

/// A create, ready to go: its plan, its complete request, and the source it
/// is made from as read (protected right before `CreateVolume`).
pub struct Ready {
    pub plan: Plan,
    pub request: pb::CreateVolumeRequest,
    pub source: Option<protect::Source>,
}

/// Everything a create needs, each part checked. When this process has the
/// driver's answer already (the PV is still to be saved) the source is
/// neither read nor judged again: it was checked and protected before the
/// driver was asked, and a source deleted since must not hold up the save.
pub async fn for_create(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    answered: bool,
) -> Result<Ready, ClaimError> {
    let view = ClaimView(claim);
    if !answered {
        check_grants(ctx, claim).await?;
    }
    let plan = provision::plan(claim, class, &ctx.shared.driver, &ctx.options)?;
    let (content_source, source) = if answered {
        (None, None)
    } else {
        checked_source(ctx, claim, class, &plan).await?
    };
    let mutable_parameters = match view.vac_name(&ctx.options) {
        Some(name) => vac_parameters(ctx, name).await?,
        None => HashMap::new(),
    };
    let accessibility_requirements = match topology(ctx, claim, class) {
        Ok(requirements) => requirements,
        // upstream #1438: a vanished node must not pin the claim forever.
        Err(TopologyError::SelectedNodeGone(node)) => {
            return Err(confirm_gone(ctx, node).await);
        }
        Err(TopologyError::Invalid(e)) => {
            return Err(ProvisionError::Topology(format!(
                "error generating accessibility requirements: {e}"
            ))
            .into());
        }
    };
    let secrets = match plan.provisioner_secret() {
        Some(r) => ctx
            .shared
            .secret_data(r)
            .await
            .map_err(|source| ClaimError::GetSecret {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                source,
            })?,
        None => HashMap::new(),
    };
    let metadata_parameters = metadata_parameters(ctx, claim, &plan).await?;
    let request = plan.request(Gathered {
        content_source,
        mutable_parameters,
        accessibility_requirements,
        secrets,
        metadata_parameters,
    });
    Ok(Ready {
        plan,
        request,
        source,
    })
}

/// The request an earlier create of this claim sent, as far as it can be
/// rebuilt now (the cleanup of a deleted claim asks the driver again by name
/// to learn the volume's handle): the same source handle, requirements,
/// mutable parameters and secret where they can still be read.
///
/// `None`: no create of this claim can have reached the driver, so there is
/// nothing to ask for. A restore or clone is sent only with its source's
/// handle, after the source is protected, and the protection stays while the
/// claim waits; a source that is gone, never had a handle, or is being
/// deleted without our protection was never sent. Asking without it would
/// make a volume the create never asked for, which every later (correct)
/// request then meets as `AlreadyExists`. Otherwise the source is protected
/// again (fenced, as the create does) before the request may name it, so it
/// cannot go while the driver works on it. A source that cannot be read or
/// protected now is an error: retried.
pub async fn for_cleanup(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &Plan,
) -> Result<Option<pb::CreateVolumeRequest>, ClaimError> {
    let content_source = match (&plan.snapshot, &plan.clone) {
        (Some(source), _) => match snapshot_handle(ctx, claim, source).await? {
            Some((handle, held)) if protect::hold_for_cleanup(ctx, &held).await? => {
                Some(provision::snapshot::from_handle(handle))
            }
            _ => return Ok(None),
        },
        (None, Some(source)) => match source_volume(ctx, &source.namespace, &source.name).await? {
            Some((handle, held)) if protect::hold_for_cleanup(ctx, &held).await? => {
                Some(provision::clone::from_volume(handle))
            }
            _ => return Ok(None),
        },
        (None, None) => None,
    };
    let mutable_parameters = match ClaimView(claim).vac_name(&ctx.options) {
        Some(name) => vac_parameters(ctx, name).await.unwrap_or_default(),
        None => HashMap::new(),
    };
    Ok(Some(
        plan.request(Gathered {
            content_source,
            mutable_parameters,
            accessibility_requirements: topology(ctx, claim, class).ok().flatten(),
            secrets: backend::secret_data_or_none(&ctx.shared, plan.provisioner_secret()).await,
            metadata_parameters: metadata_parameters(ctx, claim, plan)
                .await
                .unwrap_or_default(),
        }),
    ))
}

/// The handle of the snapshot a restore was made from, and the snapshot as
/// read: `None` when the snapshot or its content is gone or has none, or the
/// claim asks for less than the snapshot holds (no restore was sent).
async fn snapshot_handle(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source: &SnapshotSource,
) -> Result<Option<(String, protect::Source)>, ClaimError> {
    let unreadable = |e: kube::Error| ClaimError::DataSource {
        kind: "VolumeSnapshot",
        name: source.name.clone(),
        reason: api_message(&e),
    };
    let snapshots = Api::<VolumeSnapshot>::namespaced(ctx.shared.client.clone(), &source.namespace);
    let snapshot = get_fresh(&snapshots, &source.name)
        .await
        .map_err(unreadable)?;
    // No create of a claim that asks for less than the snapshot holds was ever sent.
    let Some(snapshot) =
        snapshot.filter(|s| provision::snapshot::smaller_than_snapshot(claim, s).is_none())
    else {
        return Ok(None);
    };
    let Some(content) = snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
    else {
        return Ok(None);
    };
    let content = get_fresh(
        &Api::<VolumeSnapshotContent>::all(ctx.shared.client.clone()),
        content,
    )
    .await
    .map_err(unreadable)?;
    Ok(content
        .and_then(|c| c.status)
        .and_then(|s| s.snapshot_handle)
        .map(|handle| (handle, protect::Source::Snapshot(Box::new(snapshot)))))
}

/// The listed labels and annotations of the claim and of its namespace as
/// parameters (`--extra-create-metadata-*`). The namespace comes from its
/// cache (metadata only), or is read when the cache does not have it yet.
async fn metadata_parameters(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    plan: &Plan,
) -> Result<BTreeMap<String, String>, ClaimError> {
    let namespace = match &ctx.caches.namespaces {
        Some(cache) => {
            let name = ClaimView(claim).namespace();
            match cache.get(&ObjectRef::new(name)) {
                Some(ns) => Some(ns.metadata.clone()),
                None => Some(read_namespace(ctx, name).await?),
            }
        }
        None => None,
    };
    Ok(plan.metadata_parameters(claim, namespace.as_ref(), &ctx.options.metadata)?)
}

async fn read_namespace(ctx: &Context, name: &str) -> Result<ObjectMeta, ClaimError> {
    Api::<Namespace>::all(ctx.shared.client.clone())
        .get_metadata(name)
        .await
        .map(|ns| ns.metadata)
        .map_err(|source| ClaimError::ReadNamespace {
            name: name.to_string(),
            source,
        })
}

/// A source in another namespace: a ReferenceGrant there must allow it
/// (listed live, like the source), checked before anything else, as upstream.
async fn check_grants(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let Some(source) = provision::grant::foreign_source(ClaimView(claim), &ctx.options) else {
        return Ok(());
    };
    let namespace = source.namespace.unwrap_or_default();
    let grants = Api::<ReferenceGrant>::namespaced(ctx.shared.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|source| ClaimError::ReadGrants {
            namespace: namespace.to_string(),
            source,
        })?;
    provision::grant::check(&grants.items, ClaimView(claim), &source)?;
    Ok(())
}

/// The snapshot or claim the volume is made from, read live and checked as
/// upstream checks it; its handle for the request and the object to protect.
async fn checked_source(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &Plan,
) -> Result<(Option<pb::VolumeContentSource>, Option<protect::Source>), ClaimError> {
    if let Some(source) = &plan.snapshot {
        let refused = |reason: String| ClaimError::DataSource {
            kind: keys::SNAPSHOT_KIND,
            name: source.name.clone(),
            reason,
        };
        let (snapshot, content) = read_snapshot(ctx, source).await.map_err(|e| {
            refused(format!(
                "error getting snapshot {} from api server: {}",
                source.name,
                api_message(&e)
            ))
        })?;
        let handle = provision::snapshot::content_source(
            claim,
            &class.provisioner,
            &snapshot,
            content.as_ref(),
            ctx.options.prevent_volume_mode_conversion,
        )
        .map_err(refused)?;
        return Ok((
            Some(handle),
            Some(protect::Source::Snapshot(Box::new(snapshot))),
        ));
    }
    let Some(source) = &plan.clone else {
        return Ok((None, None));
    };
    let refused = |reason: String| ClaimError::DataSource {
        kind: keys::CLAIM_KIND,
        name: source.name.clone(),
        reason,
    };
    let api =
        Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), &source.namespace);
    let original = api.get(&source.name).await.map_err(|e| {
        refused(format!(
            "error getting PVC {} (namespace {:?}) from api server: {}",
            source.name,
            source.namespace,
            api_message(&e)
        ))
    })?;
    let pv = match ClaimView(&original).volume_name() {
        Some(name) => Api::<PersistentVolume>::all(ctx.shared.client.clone())
            .get(name)
            .await
            .map_err(|e| debug!(pv = %name, error = %e, "cannot read the source claim's PV"))
            .ok(),
        None => None,
    };
    let handle =
        provision::clone::content_source(claim, &class.provisioner, &original, pv.as_ref())
            .map_err(refused)?;
    Ok((
        Some(handle),
        Some(protect::Source::Claim(Box::new(original))),
    ))
}

/// A snapshot and, when it names one that can be read, its content.
async fn read_snapshot(
    ctx: &Context,
    source: &SnapshotSource,
) -> Result<(VolumeSnapshot, Option<VolumeSnapshotContent>), kube::Error> {
    let snapshot = Api::<VolumeSnapshot>::namespaced(ctx.shared.client.clone(), &source.namespace)
        .get(&source.name)
        .await?;
    let content = match snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
    {
        Some(name) => Api::<VolumeSnapshotContent>::all(ctx.shared.client.clone())
            .get(name)
            .await
            .map_err(|e| debug!(content = name, error = %e, "cannot read the snapshot's content"))
            .ok(),
        None => None,
    };
    Ok((snapshot, content))
}

/// The volume handle of a source claim's PV, and the claim as read: `None`
/// when the claim or its PV is gone, unbound or not CSI (no clone of it was
/// sent).
async fn source_volume(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<(String, protect::Source)>, ClaimError> {
    let unreadable = |e: kube::Error| ClaimError::DataSource {
        kind: "PersistentVolumeClaim",
        name: name.to_string(),
        reason: api_message(&e),
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.shared.client.clone(), namespace);
    let original = get_fresh(&claims, name).await.map_err(unreadable)?;
    let Some(pv_name) = original
        .as_ref()
        .and_then(|c| ClaimView(c).volume_name().map(str::to_string))
    else {
        return Ok(None);
    };
    let pv = get_fresh(
        &Api::<PersistentVolume>::all(ctx.shared.client.clone()),
        &pv_name,
    )
    .await
    .map_err(unreadable)?;
    Ok(pv
        .and_then(|pv| pv.spec?.csi)
        .zip(original)
        .map(|(csi, original)| {
            (
                csi.volume_handle,
                protect::Source::Claim(Box::new(original)),
            )
        }))
}

/// The parameters of the VolumeAttributesClass `name`, read from the API
/// server as upstream does (the class may be newer than any cache). A class
/// meant for another driver is refused.
async fn vac_parameters(ctx: &Context, name: &str) -> Result<HashMap<String, String>, ClaimError> {
    let api: Api<VolumeAttributesClass> = Api::all(ctx.shared.client.clone());
    let vac = api
        .get(name)
        .await
        .map_err(|source| ClaimError::GetVolumeAttributesClass {
            name: name.to_string(),
            source,
        })?;
    if vac.driver_name != ctx.shared.driver.name {
        return Err(ProvisionError::VolumeAttributesClassOfAnotherDriver {
            name: name.to_string(),
            driver: vac.driver_name,
            ours: ctx.shared.driver.name.clone(),
        }
        .into());
    }
    Ok(vac.parameters.unwrap_or_default().into_iter().collect())
}

// ---- topology ----

/// The error of a selected node whose CSINode the cache does not hold. The
/// claim goes back to the scheduler only once the API server confirms that
/// the CSINode is gone (the one request topology may cost, on this path
/// alone): a CSINode created a moment ago that the watch has not brought yet
/// is retried instead, where upstream's lister would reschedule.
async fn confirm_gone(ctx: &Context, node: String) -> ClaimError {
    match get_fresh(&Api::<CSINode>::all(ctx.shared.client.clone()), &node).await {
        Ok(None) => ClaimError::SelectedNodeGone { node },
        Ok(Some(_)) => ProvisionError::Topology(format!(
            "error generating accessibility requirements: CSINode {node} is not in the cache yet"
        ))
        .into(),
        Err(e) => ClaimError::ReadTopology(e),
    }
}

/// The topology requirement of the claim's volume, only where claims get one
/// (`topo::served`). Read from the CSINode and Node caches, as upstream reads
/// its listers: a selected node the caches do not know yet costs a retry or
/// a reschedule, as there (`topo::TopologyError`), never a request.
fn topology(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Option<pb::TopologyRequirement>, TopologyError> {
    if !topo::served(&ctx.shared.driver, &ctx.options) {
        return Ok(None);
    }
    let allowed = class.allowed_topologies.clone().unwrap_or_default();
    let opts = &ctx.options;
    let name = claim.name_any();
    if let Some((node, segment)) = ctx.shared.place.own_segment() {
        // One sidecar per node: this node is the only one there is, as
        // upstream's node mode sees it (its topology from `NodeGetInfo`, no
        // Node or CSINode read).
        let here = SelectedNode {
            name: node.to_string(),
            keys: segment.keys().cloned().collect(),
            labels: segment.clone(),
        };
        let cluster: Vec<Segments> = if segment.is_empty() {
            Vec::new()
        } else {
            vec![segment]
        };
        return Ok(topo::requirements(&TopologyInputs {
            selected: Some(&here),
            allowed: &allowed,
            cluster: &cluster,
            strict: opts.strict_topology,
            immediate: opts.immediate_topology,
            claim_name: &name,
        })?);
    }
    // Started with the controllers whenever topology is served centrally.
    let Some(cluster) = &ctx.caches.topology else {
        return Err(
            ProvisionError::Topology("the CSINode and Node caches are not running".into()).into(),
        );
    };
    let ask = Ask {
        selected: ClaimView(claim).selected_node(),
        allowed: &allowed,
        strict: opts.strict_topology,
        immediate: opts.immediate_topology,
        claim_name: &name,
    };
    topo::from_cluster(&ask, cluster)
}
