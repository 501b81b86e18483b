//! Looks up what topology decisions need — the selected node's CSINode and
//! Node, or the cluster's nodes — and asks `provision::topology` to decide.
//! Only for drivers with VOLUME_ACCESSIBILITY_CONSTRAINTS (and the Topology
//! gate on). Reads go straight to the API server: topology is only computed
//! right before a `CreateVolume`.

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::Context;
use crate::csi::pb;
use crate::kube::get_fresh;
use crate::provision::topology::{self, Segments, SelectedNode, TopologyInputs};
use crate::provision::{ClaimView, ProvisionError};

/// Why topology could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The selected node's CSINode does not exist: the scheduler must pick again.
    #[error("CSINode {0} not found")]
    SelectedNodeGone(String),
    #[error(transparent)]
    Invalid(#[from] ProvisionError),
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
}

pub async fn requirements(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Option<pb::TopologyRequirement>, TopologyError> {
    if !(ctx.driver.capabilities.accessibility_constraints && ctx.options.topology_gate) {
        return Ok(None);
    }
    let allowed = class.allowed_topologies.clone().unwrap_or_default();
    let opts = &ctx.options;
    let name = claim.name_any();
    if let Some(node) = &ctx.node {
        // One sidecar per node: this node is the only one there is, as
        // upstream's node mode sees it (its topology from `NodeGetInfo`, no
        // Node or CSINode read).
        let segment = node.topology.clone().unwrap_or_default();
        let here = SelectedNode {
            name: node.name.clone(),
            keys: segment.keys().cloned().collect(),
            labels: segment.clone(),
        };
        let cluster: Vec<Segments> = if segment.is_empty() {
            Vec::new()
        } else {
            vec![segment]
        };
        return Ok(topology::requirements(&TopologyInputs {
            selected: Some(&here),
            allowed: &allowed,
            cluster: &cluster,
            strict: opts.strict_topology,
            immediate: opts.immediate_topology,
            claim_name: &name,
        })?);
    }
    let selected = match ClaimView(claim).selected_node() {
        Some(name) => Some(selected_node(ctx, name).await?),
        None => None,
    };
    let cluster = if topology::needs_cluster_topology(
        opts.strict_topology,
        selected.is_some(),
        !allowed.is_empty(),
        opts.immediate_topology,
    ) {
        let keys = match &selected {
            Some(s) => s.keys.clone(),
            None => any_driver_keys(ctx).await?,
        };
        nodes_with(ctx, &keys).await?
    } else {
        Vec::new()
    };
    Ok(topology::requirements(&TopologyInputs {
        selected: selected.as_ref(),
        allowed: &allowed,
        cluster: &cluster,
        strict: opts.strict_topology,
        immediate: opts.immediate_topology,
        claim_name: &name,
    })?)
}

async fn selected_node(ctx: &Context, name: &str) -> Result<SelectedNode, TopologyError> {
    let csinode = get_fresh(&Api::<CSINode>::all(ctx.client.clone()), name)
        .await?
        .ok_or_else(|| TopologyError::SelectedNodeGone(name.to_string()))?;
    let node = get_fresh(&Api::<Node>::all(ctx.client.clone()), name).await?;
    Ok(SelectedNode {
        name: name.to_string(),
        keys: driver_keys(&csinode, &ctx.driver.name),
        labels: node.map(|n| n.labels().clone()).unwrap_or_default(),
    })
}

fn driver_keys(csinode: &CSINode, driver: &str) -> Vec<String> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .and_then(|d| d.topology_keys.clone())
        .unwrap_or_default()
}

/// Topology keys of our driver from any node that has them (Immediate binding).
async fn any_driver_keys(ctx: &Context) -> Result<Vec<String>, TopologyError> {
    let csinodes = Api::<CSINode>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    csinodes
        .items
        .iter()
        .map(|c| driver_keys(c, &ctx.driver.name))
        .find(|k| !k.is_empty())
        .ok_or_else(|| ProvisionError::Topology("no available topology found".into()).into())
}

/// One segment set per node carrying every key.
async fn nodes_with(ctx: &Context, keys: &[String]) -> Result<Vec<Segments>, TopologyError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let lp = ListParams::default().labels(&keys.join(","));
    let nodes = Api::<Node>::all(ctx.client.clone()).list(&lp).await?;
    let segments: Vec<Segments> = nodes
        .items
        .iter()
        .filter_map(|n| {
            keys.iter()
                .map(|k| n.labels().get(k).map(|v| (k.clone(), v.clone())))
                .collect()
        })
        .collect();
    if segments.is_empty() {
        return Err(ProvisionError::Topology(format!(
            "topologyKeys {keys:?} were not found on any nodes"
        ))
        .into());
    }
    Ok(segments)
}
