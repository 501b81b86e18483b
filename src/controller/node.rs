//! `--node-deployment`: one sidecar per node, each provisioning only for its
//! own node (upstream's node-deployment mode).
//!
//! - A claim whose scheduler-selected node is this node is ours; a claim
//!   selected for another node is that node's, silently.
//! - An Immediate claim (with `--node-deployment-immediate-binding`) is raced
//!   for: after a per-claim delay with jitter, the first sidecar whose fenced
//!   write of `volume.kubernetes.io/selected-node` succeeds owns it; the
//!   others see the annotation through their watch and leave it alone.
//! - Only PVs accessible from this node's topology are deleted here.
//!
//! The decisions are pure and table-tested below; the claim path's
//! `claim::race` carries a race out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::names::BindingMode;
use crate::provision::ClaimView;

/// This replica's node: its name (`NODE_NAME`) and what the driver's
/// `NodeGetInfo` said about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMode {
    pub name: String,
    /// The node's topology segment; `None`: the driver reported none.
    pub topology: Option<BTreeMap<String, String>>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay` / `--node-deployment-max-delay`: the
    /// delay before a try to take an Immediate claim, doubling per try (the
    /// count is in the claim's memory).
    pub base_delay: Duration,
    pub max_delay: Duration,
}

/// Where this replica runs: beside a driver that serves the whole cluster,
/// or as one sidecar per node (`--node-deployment`). The one place that
/// answers "is this claim mine", "may I delete this PV" and "which topology
/// segment am I".
#[derive(Clone)]
pub enum Placement {
    Central,
    Node(NodeMode),
}

impl Placement {
    fn node(&self) -> Option<&NodeMode> {
        match self {
            Placement::Central => None,
            Placement::Node(n) => Some(n),
        }
    }

    /// Whether a claim that needs a volume is this replica's to provision
    /// now (centrally: always; one per node: see [`node_gate`]).
    pub fn claim(&self, claim: ClaimView, class: &StorageClass) -> NodeGate<'_> {
        match self {
            Placement::Central => NodeGate::ThisNode,
            Placement::Node(n) => node_gate(claim, class, n),
        }
    }

    /// Whether this replica cleans up after a claim that holds our intent:
    /// with one sidecar per node, its volume is on the node it was made for.
    pub fn cleans_up(&self, claim: ClaimView) -> bool {
        match self {
            Placement::Central => true,
            Placement::Node(n) => claim.selected_node() == Some(n.name.as_str()),
        }
    }

    /// Whether this replica may delete a PV's volume: one made on another
    /// node is that node's to delete.
    pub fn may_delete(&self, affinity: Option<&VolumeNodeAffinity>) -> bool {
        match self {
            Placement::Central => true,
            Placement::Node(n) => accessible(affinity, n.topology.as_ref()),
        }
    }

    /// The driver's identity (`<time>-<random>-<driver>`) as this replica
    /// shows it: with one sidecar per node, it names the node too.
    pub fn identity(&self, base: String) -> String {
        match self {
            Placement::Central => base,
            Placement::Node(n) => format!("{base}-{}", n.name),
        }
    }

    /// Whether the cluster's topology (CSINodes, Nodes) is read here: for a
    /// replica serving the whole cluster. One sidecar per node knows only its
    /// own node's segment, from `NodeGetInfo`, as upstream's node mode.
    pub fn reads_cluster_topology(&self) -> bool {
        matches!(self, Placement::Central)
    }

    /// This replica's own topology segment when it is the only node there is
    /// (one sidecar per node); `None` when the cluster's topology applies.
    pub fn own_segment(&self) -> Option<(&str, BTreeMap<String, String>)> {
        match self {
            Placement::Central => None,
            Placement::Node(n) => Some((&n.name, n.topology.clone().unwrap_or_default())),
        }
    }

    /// The segments whose capacity this replica reports: its own, with one
    /// sidecar per node; otherwise those `cluster` finds.
    pub fn capacity_segments(
        &self,
        cluster: impl FnOnce() -> Vec<BTreeMap<String, String>>,
    ) -> Vec<BTreeMap<String, String>> {
        match self.own_segment() {
            Some((_, segment)) => vec![segment],
            None => cluster(),
        }
    }

    /// The `app.kubernetes.io/managed-by` value of this replica's
    /// CSIStorageCapacity objects (each node's own, with one per node).
    pub fn managed_by(&self) -> String {
        crate::capacity::managed_by(self.node().map(|n| n.name.as_str()))
    }

    /// What a `CreateVolume` answered "no room" (a reschedule) does with the
    /// claim, given whether an earlier attempt of this name may have made the
    /// volume.
    pub fn no_room(&self, may_have_created: bool) -> NoRoom {
        match (may_have_created, self) {
            (false, _) => NoRoom::GiveBack { keep_intent: false },
            // One driver for every node: the intent stays, and a claim
            // deleted now is cleaned up by its name wherever it goes.
            (true, Placement::Central) => NoRoom::GiveBack { keep_intent: true },
            // A volume of this name may be on this node's driver, and no other
            // node could find it: the claim stays here and is retried until
            // the driver answers for it (a driver that checks room before its
            // own volumes says no room to a retry of a create it already did).
            (true, Placement::Node(n)) => NoRoom::StayOn(n.name.clone()),
        }
    }
}

/// What a claim answered "no room" becomes ([`Placement::no_room`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// Back to the scheduler (the selected node dropped), with or without
    /// our intent.
    GiveBack { keep_intent: bool },
    /// Kept on this node and retried.
    StayOn(String),
}

/// Whose claim it is, in node-deployment mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeGate<'a> {
    /// Selected for this node: provision it.
    ThisNode,
    /// Selected for another node: that node's sidecar provisions it.
    OtherNode,
    /// Immediate binding, no node yet, and this node may take it: race for it.
    RaceForIt(&'a NodeMode),
    /// Not for any node yet (WaitForFirstConsumer without a node), or an
    /// Immediate claim this node does not take (immediate binding off, or
    /// the class's allowed topologies exclude this node).
    NotHere,
}

pub fn node_gate<'a>(claim: ClaimView, class: &StorageClass, node: &'a NodeMode) -> NodeGate<'a> {
    match claim.selected_node() {
        Some(selected) if selected == node.name => NodeGate::ThisNode,
        Some(_) => NodeGate::OtherNode,
        None if class
            .volume_binding_mode
            .as_deref()
            .and_then(BindingMode::parse)
            == Some(BindingMode::WaitForFirstConsumer) =>
        {
            NodeGate::NotHere
        }
        None if node.immediate_binding && allowed_here(class, node.topology.as_ref()) => {
            NodeGate::RaceForIt(node)
        }
        None => NodeGate::NotHere,
    }
}

/// Whether a class's `allowedTopologies` admit a node with this topology (no
/// restriction, or one term whose every key has the node's value among its
/// values). A node without topology satisfies no restriction.
fn allowed_here(class: &StorageClass, topology: Option<&BTreeMap<String, String>>) -> bool {
    let terms = class.allowed_topologies.as_deref().unwrap_or_default();
    if terms.is_empty() {
        return true;
    }
    let Some(topology) = topology else {
        return false;
    };
    terms.iter().any(|term| {
        term.match_label_expressions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .all(|e| topology.get(&e.key).is_some_and(|v| e.values.contains(v)))
    })
}

/// Whether a PV is accessible from a node with this topology: it was made
/// here, so this node's sidecar may delete it. No topology on either side
/// means accessible (upstream's `VolumeIsAccessible`).
pub fn accessible(
    affinity: Option<&VolumeNodeAffinity>,
    topology: Option<&BTreeMap<String, String>>,
) -> bool {
    let (Some(required), Some(topology)) = (affinity.and_then(|a| a.required.as_ref()), topology)
    else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, topology))
}

/// A node selector term as the scheduler reads it against node labels: every
/// expression holds, and a term without expressions matches nothing.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    !expressions.is_empty()
        && term.match_fields.as_deref().unwrap_or_default().is_empty()
        && expressions.iter().all(|e| requirement_holds(e, labels))
}

fn requirement_holds(e: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&e.key);
    let values = e.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (
            value.and_then(|v| number(v)),
            values.first().and_then(|v| number(v)),
        ) {
            (Some(have), Some(bound)) if values.len() == 1 => {
                if e.operator == "Gt" {
                    have > bound
                } else {
                    have < bound
                }
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::claim::decide::fixtures::{ClaimFixture, DRIVER, class};
    use k8s_openapi::api::core::v1::TopologySelectorTerm;
    use k8s_openapi::api::core::v1::{NodeSelector, TopologySelectorLabelRequirement};

    fn node(immediate: bool) -> NodeMode {
        NodeMode {
            name: "n1".into(),
            topology: Some([("zone".to_string(), "a".to_string())].into()),
            immediate_binding: immediate,
            base_delay: Duration::from_secs(20),
            max_delay: Duration::from_secs(60),
        }
    }

    fn allowed(mut class: StorageClass, zones: &[&str]) -> StorageClass {
        class.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: "zone".into(),
                values: zones.iter().map(|z| z.to_string()).collect(),
            }]),
        }]);
        class
    }

    #[test]
    fn decides_whose_claim_it_is() {
        use NodeGate::*;
        let wffc = class(DRIVER, "WaitForFirstConsumer");
        let immediate = class(DRIVER, "Immediate");
        let cases: Vec<(&str, ClaimFixture, StorageClass, bool, &str)> = vec![
            (
                "selected for this node",
                ClaimFixture::ours().on_node("n1"),
                wffc.clone(),
                true,
                "this node",
            ),
            (
                "selected for another node",
                ClaimFixture::ours().on_node("n2"),
                wffc.clone(),
                true,
                "other node",
            ),
            (
                "waiting for the scheduler",
                ClaimFixture::ours(),
                wffc.clone(),
                true,
                "not here",
            ),
            (
                "Immediate: race for it",
                ClaimFixture::ours(),
                immediate.clone(),
                true,
                "race",
            ),
            (
                "Immediate, immediate binding off",
                ClaimFixture::ours(),
                immediate.clone(),
                false,
                "not here",
            ),
            (
                "Immediate, taken by this node",
                ClaimFixture::ours().on_node("n1"),
                immediate.clone(),
                true,
                "this node",
            ),
            (
                "Immediate, taken by another node",
                ClaimFixture::ours().on_node("n2"),
                immediate.clone(),
                true,
                "other node",
            ),
            (
                "Immediate, allowed here",
                ClaimFixture::ours(),
                allowed(immediate.clone(), &["a", "b"]),
                true,
                "race",
            ),
            (
                "Immediate, not allowed here",
                ClaimFixture::ours(),
                allowed(immediate.clone(), &["b"]),
                true,
                "not here",
            ),
        ];
        for (name, claim, class, immediate_binding, want) in cases {
            let here = node(immediate_binding);
            let got = match node_gate(ClaimView(&claim.0), &class, &here) {
                ThisNode => "this node",
                OtherNode => "other node",
                RaceForIt(n) => {
                    assert!(std::ptr::eq(n, &here), "{name}: races as this node");
                    "race"
                }
                NotHere => "not here",
            };
            assert_eq!(got, want, "{name}");
        }
    }

    fn affinity(terms: Vec<Vec<(&str, &str, &[&str])>>) -> VolumeNodeAffinity {
        VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: terms
                    .into_iter()
                    .map(|exprs| NodeSelectorTerm {
                        match_expressions: Some(
                            exprs
                                .into_iter()
                                .map(|(key, op, values)| NodeSelectorRequirement {
                                    key: key.into(),
                                    operator: op.into(),
                                    values: Some(values.iter().map(|v| v.to_string()).collect()),
                                })
                                .collect(),
                        ),
                        match_fields: None,
                    })
                    .collect(),
            }),
        }
    }

    /// (what, the PV's affinity, the node's topology, accessible).
    type Case<'a> = (
        &'a str,
        Option<VolumeNodeAffinity>,
        Option<&'a BTreeMap<String, String>>,
        bool,
    );

    #[test]
    fn a_pv_is_deleted_only_by_the_node_it_is_accessible_from() {
        let here: BTreeMap<String, String> = [
            ("zone".to_string(), "a".to_string()),
            ("rack".to_string(), "1".to_string()),
        ]
        .into();
        let cases: Vec<Case> = vec![
            ("no affinity", None, Some(&here), true),
            (
                "no node topology",
                Some(affinity(vec![vec![("zone", "In", &["b"])]])),
                None,
                true,
            ),
            (
                "made here",
                Some(affinity(vec![vec![("zone", "In", &["a"])]])),
                Some(&here),
                true,
            ),
            (
                "made elsewhere",
                Some(affinity(vec![vec![("zone", "In", &["b"])]])),
                Some(&here),
                false,
            ),
            (
                "every expression must hold",
                Some(affinity(vec![vec![
                    ("zone", "In", &["a"]),
                    ("rack", "In", &["2"]),
                ]])),
                Some(&here),
                false,
            ),
            (
                "any term may match",
                Some(affinity(vec![
                    vec![("zone", "In", &["b"])],
                    vec![("rack", "In", &["1"])],
                ])),
                Some(&here),
                true,
            ),
            (
                "NotIn",
                Some(affinity(vec![vec![("zone", "NotIn", &["b"])]])),
                Some(&here),
                true,
            ),
            (
                "Exists",
                Some(affinity(vec![vec![("rack", "Exists", &[])]])),
                Some(&here),
                true,
            ),
            (
                "DoesNotExist",
                Some(affinity(vec![vec![("rack", "DoesNotExist", &[])]])),
                Some(&here),
                false,
            ),
            (
                "Gt",
                Some(affinity(vec![vec![("rack", "Gt", &["0"])]])),
                Some(&here),
                true,
            ),
            (
                "Lt",
                Some(affinity(vec![vec![("rack", "Lt", &["1"])]])),
                Some(&here),
                false,
            ),
            (
                "an empty term matches nothing",
                Some(affinity(vec![vec![]])),
                Some(&here),
                false,
            ),
        ];
        for (name, affinity, topology, want) in cases {
            assert_eq!(accessible(affinity.as_ref(), topology), want, "{name}");
        }
    }
}
