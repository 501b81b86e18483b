//! Accessibility requirements for `CreateVolume` (requisite and preferred
//! topologies), from the selected node, the class's `allowedTopologies` and
//! the cluster's node topology. Pure: the cluster is read through
//! [`cluster::Cluster`], which the controller's CSINode and Node caches answer.
//! upstream: pkg/controller/topology.go GenerateAccessibilityRequirements.

pub mod cluster;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::TopologySelectorTerm;

use super::{DriverInfo, ProvisionError, ProvisionOptions};
use crate::csi::pb;

pub use cluster::{Ask, Cluster, Labels, TopologyError, from_cluster, segment};

/// Whether claims get accessibility requirements: a driver with
/// VOLUME_ACCESSIBILITY_CONSTRAINTS, and the Topology gate on (upstream's
/// `supportsTopology`). Only then are CSINodes and Nodes watched.
pub fn served(driver: &DriverInfo, options: &ProvisionOptions) -> bool {
    driver.capabilities.accessibility_constraints && options.topology_gate
}

/// One topology segment set, e.g. `{zone: a, rack: 3}`.
pub type Segments = BTreeMap<String, String>;

/// What the controller found about the selected node.
#[derive(Clone, Debug)]
pub struct SelectedNode {
    pub name: String,
    /// `CSINode.spec.drivers[ours].topologyKeys`.
    pub keys: Vec<String>,
    /// The Node's labels.
    pub labels: BTreeMap<String, String>,
}

pub struct TopologyInputs<'a> {
    pub selected: Option<&'a SelectedNode>,
    pub allowed: &'a [TopologySelectorTerm],
    /// One entry per node carrying all topology keys (only needed when there
    /// are no allowed topologies and either a node is selected or
    /// `immediate` is on; see [`needs_cluster_topology`]).
    pub cluster: &'a [Segments],
    pub strict: bool,
    pub immediate: bool,
    pub claim_name: &'a str,
}

/// Whether the requirements depend on the cluster's aggregated topology.
pub fn needs_cluster_topology(
    strict: bool,
    has_selected: bool,
    has_allowed: bool,
    immediate: bool,
) -> bool {
    // Strict late binding uses the node alone; allowed topologies replace the
    // cluster's; otherwise the cluster is needed for a selected node or Immediate.
    let uses_node_only = strict && has_selected;
    !(uses_node_only || has_allowed) && (has_selected || immediate)
}

/// What the driver registered on each node: node name → the topology keys
/// of its CSINode entry for the driver. Nodes where the driver is not, or
/// has registered no key yet (still rolling out), are left out: the driver
/// has said nothing of their topology.
/// The keys keep their CSINode order (an error message lists them so).
pub type Registered = BTreeMap<String, Vec<String>>;

/// [`Registered`] from each CSINode's name and keys for the driver.
pub fn registered<I>(per_node: I) -> Registered
where
    I: IntoIterator<Item = (String, Vec<String>)>,
{
    per_node
        .into_iter()
        .filter(|(_, keys)| !keys.is_empty())
        .collect()
}

/// The distinct topology key sets the driver registered on the cluster's
/// nodes, each sorted, in sorted order, whatever order the CSINodes were
/// listed in. Nodes need not register the same keys: part of a cluster may
/// register a finer granularity (region on some nodes, region and zone on
/// others; upstream #1589, v6.4 `distinctTopologyKeySets`).
pub fn registered_key_sets(registered: &Registered) -> Vec<Vec<String>> {
    let sets: BTreeSet<Vec<String>> = registered
        .values()
        .map(|keys| {
            let mut keys = keys.clone();
            keys.sort();
            keys.dedup();
            keys
        })
        .collect();
    sets.into_iter().collect()
}

/// The cluster's topology for one key set: one term per node whose driver
/// registered every key of the set (a node that merely carries the labels is
/// left out: the driver may be told only topology it reported; v6.4
/// `aggregateTopologiesForKeys`) and that carries a label for each, with its
/// values for those keys; sorted and without repeats, so that neither the
/// order nodes are listed in nor their number per term changes it.
pub fn terms_for_keys<'a, I>(keys: &[String], registered: &Registered, nodes: I) -> Vec<Segments>
where
    I: IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>)>,
{
    if keys.is_empty() {
        return Vec::new();
    }
    let terms: BTreeSet<Segments> = nodes
        .into_iter()
        .filter(|(name, _)| {
            registered
                .get(*name)
                .is_some_and(|r| keys.iter().all(|k| r.contains(k)))
        })
        .filter_map(|(_, labels)| segment(labels, keys))
        .collect();
    let mut terms: Vec<Segments> = terms.into_iter().collect();
    terms.sort_by(compare_terms);
    terms
}

/// A list of strings as Go's `%v` prints it: `[a b]`.
pub fn go_list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("[{}]", items.join(" "))
}

/// The segments of the selected node for its driver's topology keys.
pub fn selected_segments(node: &SelectedNode) -> Result<Segments, ProvisionError> {
    if node.keys.is_empty() {
        return Err(ProvisionError::Topology(format!(
            "no topology key found for node {}",
            node.name
        )));
    }
    let mut seg = Segments::new();
    for k in &node.keys {
        match node.labels.get(k) {
            Some(v) => {
                seg.insert(k.clone(), v.clone());
            }
            None => {
                return Err(ProvisionError::Topology(format!(
                    "topology labels from selected node {:?} does not match topology keys from CSINode {:?}",
                    node.labels, node.keys
                )));
            }
        }
    }
    Ok(seg)
}

pub fn requirements(
    inputs: &TopologyInputs<'_>,
) -> Result<Option<pb::TopologyRequirement>, ProvisionError> {
    let selected = inputs.selected.map(selected_segments).transpose()?;
    let allowed = flatten(inputs.allowed);

    if inputs.strict
        && let Some(sel) = &selected
    {
        if !allowed.is_empty() && !allowed.iter().any(|term| is_subset(term, sel)) {
            return Err(ProvisionError::Topology(format!(
                "selected node '{:?}' topology '{sel:?}' is not in allowed topologies: {allowed:?}",
                inputs.selected.map(|s| s.name.as_str()).unwrap_or_default()
            )));
        }
        let t = vec![to_pb(sel)];
        return Ok(Some(pb::TopologyRequirement {
            requisite: t.clone(),
            preferred: t,
        }));
    }

    let mut requisite = if !allowed.is_empty() {
        allowed
    } else if selected.is_none() && !inputs.immediate {
        return Ok(None);
    } else {
        inputs.cluster.to_vec()
    };
    requisite.sort_by(compare_terms);
    requisite.dedup();
    if requisite.is_empty() {
        return Ok(None);
    }

    let preferred = match &selected {
        None => {
            let (hash_input, index) = statefulset_hash_input(inputs.claim_name);
            let offset =
                (fnv1_32(hash_input.as_bytes()).wrapping_add(index) as usize) % requisite.len();
            rotate(&requisite, offset)
        }
        Some(sel) => match requisite.iter().position(|t| is_subset(t, sel)) {
            Some(i) => rotate(&requisite, i),
            None => {
                return Err(ProvisionError::Topology(format!(
                    "topology {sel:?} from selected node {:?} is not in requisite: {requisite:?}",
                    inputs.selected.map(|s| s.name.as_str()).unwrap_or_default()
                )));
            }
        },
    };
    Ok(Some(pb::TopologyRequirement {
        requisite: requisite.iter().map(to_pb).collect(),
        preferred: preferred.iter().map(to_pb).collect(),
    }))
}

/// `allowedTopologies` as segment sets: each term is the cartesian product of
/// its expressions' values; terms are alternatives.
pub fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Segments> {
    let mut out = Vec::new();
    for term in allowed {
        let mut combos = vec![Segments::new()];
        for expr in term.match_label_expressions.as_deref().unwrap_or_default() {
            let mut next = Vec::new();
            for base in &combos {
                for v in &expr.values {
                    let mut s = base.clone();
                    s.insert(expr.key.clone(), v.clone());
                    next.push(s);
                }
            }
            combos = next;
        }
        out.extend(combos.into_iter().filter(|c| !c.is_empty()));
    }
    out
}

fn is_subset(small: &Segments, big: &Segments) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

/// Fewer segments first, then by the sorted key/value pairs.
fn compare_terms(a: &Segments, b: &Segments) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.iter().cmp(b.iter()))
}

fn rotate(terms: &[Segments], offset: usize) -> Vec<Segments> {
    terms[offset..]
        .iter()
        .chain(terms[..offset].iter())
        .cloned()
        .collect()
}

fn to_pb(s: &Segments) -> pb::Topology {
    pb::Topology {
        segments: s.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// StatefulSet claims are named `<claim>-<set>-<ordinal>`: hash only `<set>`
/// (so all claims of one pod land together) and offset by the ordinal (so the
/// set's pods spread across topologies), as in-tree volume plugins do.
fn statefulset_hash_input(claim: &str) -> (String, u32) {
    let Some((prefix, ordinal)) = claim.rsplit_once('-') else {
        return (claim.to_string(), 0);
    };
    match ordinal.parse::<u32>() {
        Ok(index) => {
            let set = prefix.rsplit_once('-').map(|(_, s)| s).unwrap_or(prefix);
            (set.to_string(), index)
        }
        Err(_) => (claim.to_string(), 0),
    }
}

/// 32-bit FNV-1 (not FNV-1a): Go's `hash/fnv.New32`.
fn fnv1_32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in data {
        h = h.wrapping_mul(0x01000193);
        h ^= u32::from(*b);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;

    fn seg(pairs: &[(&str, &str)]) -> Segments {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn term(exprs: &[(&str, &[&str])]) -> TopologySelectorTerm {
        TopologySelectorTerm {
            match_label_expressions: Some(
                exprs
                    .iter()
                    .map(|(k, vs)| TopologySelectorLabelRequirement {
                        key: k.to_string(),
                        values: vs.iter().map(|v| v.to_string()).collect(),
                    })
                    .collect(),
            ),
        }
    }

    fn node(name: &str, keys: &[&str], labels: &[(&str, &str)]) -> SelectedNode {
        SelectedNode {
            name: name.into(),
            keys: keys.iter().map(|s| s.to_string()).collect(),
            labels: seg(labels),
        }
    }

    fn segs(t: &[pb::Topology]) -> Vec<Segments> {
        t.iter()
            .map(|t| {
                t.segments
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .collect()
    }

    fn inputs<'a>(
        selected: Option<&'a SelectedNode>,
        allowed: &'a [TopologySelectorTerm],
        cluster: &'a [Segments],
    ) -> TopologyInputs<'a> {
        TopologyInputs {
            selected,
            allowed,
            cluster,
            strict: false,
            immediate: true,
            claim_name: "data",
        }
    }

    #[test]
    fn fnv1_matches_go() {
        // Go: fnv.New32() over "" and "a".
        assert_eq!(fnv1_32(b""), 0x811c9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c5d7e);
    }

    #[test]
    fn statefulset_names_hash_the_set_and_offset_by_ordinal() {
        assert_eq!(statefulset_hash_input("www-web-3"), ("web".to_string(), 3));
        assert_eq!(statefulset_hash_input("data"), ("data".to_string(), 0));
        assert_eq!(statefulset_hash_input("data-x"), ("data-x".to_string(), 0));
        assert_eq!(statefulset_hash_input("web-2"), ("web".to_string(), 2));
    }

    #[test]
    fn allowed_topologies_flatten_to_a_cartesian_product() {
        let allowed = [
            term(&[("zone", &["a", "b"]), ("rack", &["1"])]),
            term(&[("zone", &["c"])]),
        ];
        let flat = flatten(&allowed);
        assert_eq!(
            flat,
            vec![
                seg(&[("zone", "a"), ("rack", "1")]),
                seg(&[("zone", "b"), ("rack", "1")]),
                seg(&[("zone", "c")])
            ]
        );
    }

    #[test]
    fn selected_node_goes_first_in_preferred() {
        let n = node("n2", &["zone"], &[("zone", "b"), ("other", "x")]);
        let cluster = [
            seg(&[("zone", "a")]),
            seg(&[("zone", "b")]),
            seg(&[("zone", "c")]),
            seg(&[("zone", "b")]),
        ];
        let r = requirements(&inputs(Some(&n), &[], &cluster))
            .unwrap()
            .unwrap();
        assert_eq!(
            segs(&r.requisite),
            vec![
                seg(&[("zone", "a")]),
                seg(&[("zone", "b")]),
                seg(&[("zone", "c")])
            ],
            "sorted, deduplicated"
        );
        assert_eq!(
            segs(&r.preferred),
            vec![
                seg(&[("zone", "b")]),
                seg(&[("zone", "c")]),
                seg(&[("zone", "a")])
            ]
        );
    }

    #[test]
    fn strict_topology_is_the_selected_node_only() {
        let n = node("n2", &["zone"], &[("zone", "b")]);
        let mut i = inputs(Some(&n), &[], &[]);
        i.strict = true;
        let r = requirements(&i).unwrap().unwrap();
        assert_eq!(segs(&r.requisite), vec![seg(&[("zone", "b")])]);
        assert_eq!(r.requisite, r.preferred);
        let allowed = [term(&[("zone", &["a"])])];
        i.allowed = &allowed;
        assert!(
            requirements(&i)
                .unwrap_err()
                .to_string()
                .contains("not in allowed topologies")
        );
    }

    #[test]
    fn immediate_without_allowed_topologies_can_be_turned_off() {
        let mut i = inputs(None, &[], &[]);
        i.immediate = false;
        assert_eq!(requirements(&i).unwrap(), None);
        assert!(!needs_cluster_topology(false, false, false, false));
        assert!(needs_cluster_topology(false, false, false, true));
        assert!(!needs_cluster_topology(true, true, false, true));
        assert!(!needs_cluster_topology(false, true, true, true));
    }

    #[test]
    fn immediate_preferred_is_a_rotation_chosen_by_the_claim_name() {
        let cluster = [
            seg(&[("zone", "a")]),
            seg(&[("zone", "b")]),
            seg(&[("zone", "c")]),
        ];
        let mut firsts = std::collections::BTreeSet::new();
        for ordinal in 0..3 {
            let name = format!("www-web-{ordinal}");
            let mut i = inputs(None, &[], &cluster);
            i.claim_name = &name;
            let r = requirements(&i).unwrap().unwrap();
            assert_eq!(r.preferred.len(), 3);
            firsts.insert(segs(&r.preferred)[0].clone());
        }
        assert_eq!(
            firsts.len(),
            3,
            "consecutive StatefulSet ordinals spread over every zone"
        );
    }

    /// Every order of `items` (Heap's algorithm).
    fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
        fn heap<T: Clone>(k: usize, items: &mut Vec<T>, out: &mut Vec<Vec<T>>) {
            if k <= 1 {
                out.push(items.clone());
                return;
            }
            for i in 0..k {
                heap(k - 1, items, out);
                let j = if k.is_multiple_of(2) { i } else { 0 };
                items.swap(j, k - 1);
            }
        }
        let mut out = Vec::new();
        heap(items.len(), &mut items.to_vec(), &mut out);
        out
    }

    /// A cluster whose nodes register different key sets for the driver
    /// (upstream #1589): (node name, CSINode keys, Node labels) per node.
    fn mixed_cluster() -> Vec<(String, Vec<String>, Segments)> {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        vec![
            ("n1".into(), keys(&["region"]), seg(&[("region", "r1")])),
            (
                "n2".into(),
                keys(&["zone", "region"]),
                seg(&[("region", "r1"), ("zone", "a")]),
            ),
            (
                "n3".into(),
                keys(&["region", "zone"]),
                seg(&[("region", "r2"), ("zone", "b")]),
            ),
            // The driver registered no key here yet: left out.
            ("n4".into(), keys(&[]), seg(&[("region", "r3")])),
            // The labels of a zone the driver did not register here: only its region counts.
            (
                "n5".into(),
                keys(&["region"]),
                seg(&[("region", "r4"), ("zone", "c")]),
            ),
        ]
    }

    /// What the claim path computes for an Immediate claim from the nodes
    /// in the order given.
    fn immediate_requirements(
        nodes: &[(String, Vec<String>, Segments)],
        claim: &str,
    ) -> pb::TopologyRequirement {
        let reg = registered(nodes.iter().map(|(n, k, _)| (n.clone(), k.clone())));
        let cluster: Vec<Segments> = registered_key_sets(&reg)
            .iter()
            .flat_map(|set| {
                terms_for_keys(set, &reg, nodes.iter().map(|(n, _, l)| (n.as_str(), l)))
            })
            .collect();
        let mut i = inputs(None, &[], &cluster);
        i.claim_name = claim;
        requirements(&i).unwrap().unwrap()
    }

    #[test]
    fn key_sets_are_the_same_whatever_order_csinodes_come_in() {
        for order in permutations(&mixed_cluster()) {
            let reg = registered(order.into_iter().map(|(n, k, _)| (n, k)));
            assert_eq!(
                registered_key_sets(&reg),
                vec![
                    vec!["region".to_string()],
                    vec!["region".to_string(), "zone".to_string()]
                ]
            );
        }
    }

    #[test]
    fn immediate_topology_is_the_same_whatever_order_nodes_come_in() {
        let nodes = mixed_cluster();
        for claim in ["data", "www-web-0", "www-web-1", "www-web-2"] {
            let want = immediate_requirements(&nodes, claim);
            for order in permutations(&nodes) {
                assert_eq!(immediate_requirements(&order, claim), want, "{claim}");
            }
        }
        let r = immediate_requirements(&nodes, "data");
        // Every key set contributes, from the nodes that registered it (a finer registration
        // covers a coarser set): region-only nodes are not dropped for the finer ones, nor is
        // the zone erased where nodes register it; n4 (nothing registered) and n5's zone (not
        // registered there) are left out, as v6.4 leaves them out.
        assert_eq!(
            segs(&r.requisite),
            vec![
                seg(&[("region", "r1")]),
                seg(&[("region", "r2")]),
                seg(&[("region", "r4")]),
                seg(&[("region", "r1"), ("zone", "a")]),
                seg(&[("region", "r2"), ("zone", "b")]),
            ]
        );
    }

    #[test]
    fn a_key_set_no_registered_node_fully_carries_gives_no_terms() {
        let keys = vec!["region".to_string(), "zone".to_string()];
        let labels = [
            ("a".to_string(), seg(&[("region", "r1")])),
            ("b".to_string(), seg(&[("zone", "a")])),
            ("c".to_string(), seg(&[("region", "r1"), ("zone", "a")])),
        ];
        let nodes = || labels.iter().map(|(n, l)| (n.as_str(), l));
        let all = registered(labels.iter().map(|(n, _)| (n.clone(), keys.clone())));
        assert_eq!(
            terms_for_keys(&keys, &all, nodes()).len(),
            1,
            "c carries both"
        );
        let none_on_c = registered(
            labels
                .iter()
                .filter(|(n, _)| n != "c")
                .map(|(n, _)| (n.clone(), keys.clone())),
        );
        assert!(
            terms_for_keys(&keys, &none_on_c, nodes()).is_empty(),
            "c registered nothing"
        );
        assert!(terms_for_keys(&[], &all, nodes()).is_empty());
    }

    #[test]
    fn go_lists_print_as_go_does() {
        assert_eq!(go_list(&["region", "zone"]), "[region zone]");
        assert_eq!(go_list::<&str>(&[]), "[]");
    }

    #[test]
    fn node_problems_are_errors() {
        let no_keys = node("n1", &[], &[("zone", "a")]);
        assert!(
            requirements(&inputs(Some(&no_keys), &[], &[]))
                .unwrap_err()
                .to_string()
                .contains("no topology key")
        );
        let missing = node("n1", &["zone"], &[]);
        assert!(
            requirements(&inputs(Some(&missing), &[], &[]))
                .unwrap_err()
                .to_string()
                .contains("does not match")
        );
        let elsewhere = node("n1", &["zone"], &[("zone", "z")]);
        let allowed = [term(&[("zone", &["a"])])];
        assert!(
            requirements(&inputs(Some(&elsewhere), &allowed, &[]))
                .unwrap_err()
                .to_string()
                .contains("not in requisite")
        );
    }
}
