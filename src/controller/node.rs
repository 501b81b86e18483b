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
//! The decisions are pure and table-tested below; [`race`] carries one out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaim, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

use super::claim::decide::{Work, work_for};
use super::{Backoff, Context};
use crate::keys;
use crate::kube::is_conflict;
use crate::provision::ClaimView;
use crate::quantity;

/// This replica's node: its name (`NODE_NAME`) and what the driver's
/// `NodeGetInfo` said about it.
pub struct NodeMode {
    pub name: String,
    /// The node's topology segment; `None`: the driver reported none.
    pub topology: Option<BTreeMap<String, String>>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay` / `--node-deployment-max-delay`, per claim UID.
    pub race_delay: Backoff,
    pub base_delay: Duration,
}

/// Whose claim it is, in node-deployment mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeGate {
    /// Selected for this node: provision it.
    ThisNode,
    /// Selected for another node: that node's sidecar provisions it.
    OtherNode,
    /// Immediate binding, no node yet, and this node may take it: race for it.
    RaceForIt,
    /// Not for any node yet (WaitForFirstConsumer without a node), or an
    /// Immediate claim this node does not take (immediate binding off, or
    /// the class's allowed topologies exclude this node).
    NotHere,
}

pub fn node_gate(claim: ClaimView, class: &StorageClass, node: &NodeMode) -> NodeGate {
    match claim.selected_node() {
        Some(selected) if selected == node.name => NodeGate::ThisNode,
        Some(_) => NodeGate::OtherNode,
        None if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") => {
            NodeGate::NotHere
        }
        None if node.immediate_binding && allowed_here(class, node.topology.as_ref()) => {
            NodeGate::RaceForIt
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

/// The delay before this node tries to take an Immediate claim: the claim's
/// exponential delay (base to max) minus a random jitter below the base, so
/// that the sidecars of many nodes do not all try at once.
fn race_delay(node: &NodeMode, uid: &str) -> Duration {
    let delay = node.race_delay.next_delay(uid);
    let jitter = node.base_delay.mul_f64(rand::random::<f64>());
    delay.saturating_sub(jitter)
}

/// Races for an Immediate claim: waits this node's delay, giving up as soon
/// as the cache shows that another node took the claim, then writes this
/// node as the selected node, fenced on the claim's resourceVersion. A
/// conflict means the claim changed (usually: another node won): the claim
/// is looked at again. The winner's claim comes back through the watch with
/// the annotation and is provisioned as [`NodeGate::ThisNode`].
pub async fn race(
    ctx: &Context,
    node: &NodeMode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Action, kube::Error> {
    let view = ClaimView(claim);
    let delay = race_delay(node, view.uid());
    debug!(claim = %view.key(), ?delay, "racing for an Immediate claim");
    let poll = (node.base_delay / 100).max(Duration::from_millis(10));
    let until = Instant::now() + delay;
    let key = ObjectRef::new(view.name()).within(view.namespace());
    let resource_version = loop {
        let seen = match ctx.caches.claims.get(&key) {
            Some(cached) if cached.0.uid() == claim.uid() => {
                let now = ClaimView(&cached.0);
                // Taken by another node, or provisioned meanwhile (a bound
                // claim is cached without its annotations, if at all, so its
                // selected node cannot be seen: bound is enough to stop).
                if now.selected_node().is_some()
                    || work_for(now, &ctx.driver.name) != Work::Provision
                {
                    debug!(claim = %view.key(), "another node took it");
                    // Should it come back (rescheduled), the delay starts afresh.
                    node.race_delay.reset(view.uid());
                    return Ok(Action::await_change());
                }
                cached.0.resource_version()
            }
            // Deleted, another claim of that name now, or bound (and so
            // left out of the cache).
            _ => return Ok(Action::await_change()),
        };
        let now = Instant::now();
        if now >= until {
            break seen;
        }
        tokio::time::sleep(poll.min(until - now)).await;
    };
    // As late as possible, as upstream: is there room here now? A failed
    // check does not stop the race (provisioning then tells the user why).
    match has_room(ctx, node, claim, class).await {
        Ok(false) => {
            debug!(claim = %view.key(), "not enough capacity on this node: not taking it");
            return Ok(Action::requeue(race_delay(node, view.uid())));
        }
        Ok(true) => {}
        Err(status) => {
            debug!(claim = %view.key(), code = ?status.code(), message = status.message(), "capacity check failed: taking the claim anyway")
        }
    }
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), view.namespace());
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { keys::ANN_SELECTED_NODE: node.name },
        }
    });
    match api
        .patch(view.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            info!(claim = %view.key(), node = %node.name, "took the Immediate claim for this node");
            node.race_delay.reset(view.uid());
            Ok(Action::await_change())
        }
        Err(e) if is_conflict(&e) => {
            debug!(claim = %view.key(), "changed while racing for it: looking again");
            Ok(Action::requeue(Duration::ZERO))
        }
        Err(e) => Err(e),
    }
}

/// Whether this node's driver reports room for the claim's requested size
/// (`GetCapacity` with the class's parameters, without the sidecar's own
/// prefixed keys, in this node's segment). A claim without a size always fits.
async fn has_room(
    ctx: &Context,
    node: &NodeMode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<bool, tonic::Status> {
    let wanted = ClaimView(claim)
        .requested_storage()
        .and_then(quantity::parse_bytes)
        .unwrap_or_default();
    if wanted == 0 {
        return Ok(true);
    }
    let parameters = class
        .parameters
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(keys::CSI_PARAMETER_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let segment = node
        .topology
        .clone()
        .filter(|t| !t.is_empty())
        .map(|t| t.into_iter().collect());
    let answer = ctx.csi.get_capacity(parameters, segment).await?;
    Ok(i128::from(answer.available_capacity) >= i128::from(wanted))
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
            race_delay: Backoff::new(Duration::from_secs(20), Duration::from_secs(60)),
            base_delay: Duration::from_secs(20),
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
        let cases: Vec<(&str, ClaimFixture, StorageClass, bool, NodeGate)> = vec![
            (
                "selected for this node",
                ClaimFixture::ours().on_node("n1"),
                wffc.clone(),
                true,
                ThisNode,
            ),
            (
                "selected for another node",
                ClaimFixture::ours().on_node("n2"),
                wffc.clone(),
                true,
                OtherNode,
            ),
            (
                "waiting for the scheduler",
                ClaimFixture::ours(),
                wffc.clone(),
                true,
                NotHere,
            ),
            (
                "Immediate: race for it",
                ClaimFixture::ours(),
                immediate.clone(),
                true,
                RaceForIt,
            ),
            (
                "Immediate, immediate binding off",
                ClaimFixture::ours(),
                immediate.clone(),
                false,
                NotHere,
            ),
            (
                "Immediate, taken by this node",
                ClaimFixture::ours().on_node("n1"),
                immediate.clone(),
                true,
                ThisNode,
            ),
            (
                "Immediate, taken by another node",
                ClaimFixture::ours().on_node("n2"),
                immediate.clone(),
                true,
                OtherNode,
            ),
            (
                "Immediate, allowed here",
                ClaimFixture::ours(),
                allowed(immediate.clone(), &["a", "b"]),
                true,
                RaceForIt,
            ),
            (
                "Immediate, not allowed here",
                ClaimFixture::ours(),
                allowed(immediate.clone(), &["b"]),
                true,
                NotHere,
            ),
        ];
        for (name, claim, class, immediate_binding, want) in cases {
            let got = node_gate(ClaimView(&claim.0), &class, &node(immediate_binding));
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

    #[test]
    fn the_race_delay_grows_per_claim_and_is_jittered_below_the_base() {
        let n = node(true);
        let first = race_delay(&n, "uid-1");
        assert!(first <= Duration::from_secs(20), "{first:?}");
        let _ = race_delay(&n, "uid-1");
        let third = race_delay(&n, "uid-1");
        // 20 s, 40 s, then the 60 s cap, each minus under 20 s of jitter.
        assert!(
            third > Duration::from_secs(40) && third <= Duration::from_secs(60),
            "{third:?}"
        );
        let other = race_delay(&n, "uid-2");
        assert!(
            other <= Duration::from_secs(20),
            "a claim of its own: {other:?}"
        );
    }
}
