//! A claim's requirements from the cluster's topology as the caches hold it:
//! the selected node's keys (its CSINode) and labels (its Node), and for the
//! aggregated requisite what the driver registered on every node and the
//! nodes carrying those keys. The caches answer through [`Cluster`]; here
//! only the walk upstream makes, so a table stands in for them in tests.
//! upstream: pkg/controller/topology.go GenerateAccessibilityRequirements,
//! aggregateTopologies (v6.4).

use k8s_openapi::api::core::v1::TopologySelectorTerm;

use super::{
    Registered, Segments, SelectedNode, TopologyInputs, go_list, needs_cluster_topology,
    registered_key_sets, requirements, selected_segments, terms_for_keys,
};
use crate::csi::pb;
use crate::provision::ProvisionError;

/// A node's labels.
pub type Labels = std::collections::BTreeMap<String, String>;

/// What the topology of the cluster's nodes is read from: the CSINode and
/// Node caches (upstream's listers), or a table in a test. Read lazily, so
/// that a claim that needs only its selected node reads only that node.
pub trait Cluster {
    /// The keys our driver registered on `node`'s CSINode (empty: none);
    /// `None`: the node has no CSINode.
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>>;
    /// What our driver registered on each node ([`super::registered`]).
    fn registered(&self) -> Registered;
    /// The labels of `node`; `None`: no such node.
    fn labels(&self, node: &str) -> Option<Labels>;
    /// Each node carrying a label for every one of `keys`: its name and its
    /// values for them (upstream lists nodes with a selector on the keys).
    fn labelled(&self, keys: &[String]) -> Vec<(String, Segments)>;
}

/// A node's values for `keys`, if it carries every one of them.
pub fn segment(labels: &Labels, keys: &[String]) -> Option<Segments> {
    keys.iter()
        .map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// What a claim's requirements depend on besides the cluster.
pub struct Ask<'a> {
    /// The node the scheduler selected (WaitForFirstConsumer).
    pub selected: Option<&'a str>,
    pub allowed: &'a [TopologySelectorTerm],
    pub strict: bool,
    pub immediate: bool,
    pub claim_name: &'a str,
}

/// Why a claim's requirements could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The selected node has no CSINode: the scheduler must pick again
    /// (upstream's lister answers NotFound, and NotFound reschedules).
    #[error("CSINode {0} not found")]
    SelectedNodeGone(String),
    #[error(transparent)]
    Invalid(#[from] ProvisionError),
}

/// The claim's accessibility requirements from `cluster`: the selected node's
/// own problems first (no CSINode, no keys registered there, labels missing a
/// key), then the cluster's terms where the requisite is aggregated.
pub fn from_cluster(
    ask: &Ask<'_>,
    cluster: &impl Cluster,
) -> Result<Option<pb::TopologyRequirement>, TopologyError> {
    let selected = match ask.selected {
        Some(name) => Some(selected_node(cluster, name)?),
        None => None,
    };
    if let Some(node) = &selected {
        selected_segments(node)?;
    }
    let aggregated = needs_cluster_topology(
        ask.strict,
        selected.is_some(),
        !ask.allowed.is_empty(),
        ask.immediate,
    );
    let terms = if aggregated {
        cluster_terms(cluster, selected.as_ref())?
    } else {
        Vec::new()
    };
    Ok(requirements(&TopologyInputs {
        selected: selected.as_ref(),
        allowed: ask.allowed,
        cluster: &terms,
        strict: ask.strict,
        immediate: ask.immediate,
        claim_name: ask.claim_name,
    })?)
}

/// The selected node's keys (its CSINode, which must exist) and labels (its
/// Node; none when it is unknown, which then fails as a missing key, as
/// upstream's `getTopologyFromNodeName`).
fn selected_node(cluster: &impl Cluster, name: &str) -> Result<SelectedNode, TopologyError> {
    let keys = cluster
        .csinode_keys(name)
        .ok_or_else(|| TopologyError::SelectedNodeGone(name.to_string()))?;
    Ok(SelectedNode {
        name: name.to_string(),
        keys,
        labels: cluster.labels(name).unwrap_or_default(),
    })
}

/// The cluster's terms: for the selected node's key set, or (Immediate) for
/// every key set the driver registered, each from the nodes whose driver
/// registered it. Upstream's errors when there is nothing to aggregate.
fn cluster_terms(
    cluster: &impl Cluster,
    selected: Option<&SelectedNode>,
) -> Result<Vec<Segments>, ProvisionError> {
    let registered = cluster.registered();
    let key_sets = match selected {
        Some(s) => vec![s.keys.clone()],
        None => registered_key_sets(&registered),
    };
    if key_sets.is_empty() {
        return Err(ProvisionError::Topology(
            "no available topology found".into(),
        ));
    }
    let mut terms = Vec::new();
    for keys in key_sets.iter().filter(|k| !k.is_empty()) {
        let nodes = cluster.labelled(keys);
        terms.extend(terms_for_keys(
            keys,
            &registered,
            nodes.iter().map(|(name, values)| (name.as_str(), values)),
        ));
    }
    if terms.is_empty() {
        // Upstream names every key set (Immediate) or the selected node's keys.
        let keys = match selected {
            None => go_list(&key_sets.iter().map(|k| go_list(k)).collect::<Vec<_>>()),
            Some(s) => go_list(&s.keys),
        };
        return Err(ProvisionError::Topology(format!(
            "topologyKeys {keys} were not found on any nodes"
        )));
    }
    Ok(terms)
}

/// A cluster written down: each CSINode's keys for the driver, each Node's
/// labels.
#[cfg(test)]
#[derive(Default)]
pub struct Table {
    pub csinodes: std::collections::BTreeMap<String, Vec<String>>,
    pub nodes: std::collections::BTreeMap<String, Labels>,
}

#[cfg(test)]
impl Cluster for Table {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        self.csinodes.get(node).cloned()
    }

    fn registered(&self) -> Registered {
        super::registered(self.csinodes.clone())
    }

    fn labels(&self, node: &str) -> Option<Labels> {
        self.nodes.get(node).cloned()
    }

    fn labelled(&self, keys: &[String]) -> Vec<(String, Segments)> {
        self.nodes
            .iter()
            .filter_map(|(name, labels)| Some((name.clone(), segment(labels, keys)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A cluster of (node, CSINode keys or no CSINode, Node labels or no Node).
    fn cluster(rows: &[(&str, Option<&[&str]>, Option<&[(&str, &str)]>)]) -> Table {
        let mut t = Table::default();
        for (name, keys, node) in rows {
            if let Some(keys) = keys {
                t.csinodes.insert(name.to_string(), strings(keys));
            }
            if let Some(node) = node {
                t.nodes.insert(name.to_string(), labels(node));
            }
        }
        t
    }

    /// Two key sets (upstream #1589), a node without the driver, a Node
    /// without its CSINode yet, and a CSINode without its Node.
    fn zones() -> Table {
        cluster(&[
            ("n1", Some(&["zone"]), Some(&[("zone", "a"), ("os", "x")])),
            ("n2", Some(&["zone"]), Some(&[("zone", "b")])),
            (
                "n3",
                Some(&["zone", "rack"]),
                Some(&[("zone", "b"), ("rack", "7")]),
            ),
            ("n4", Some(&[]), Some(&[("zone", "c")])),
            ("n5", None, Some(&[("zone", "d")])),
            ("n6", Some(&["zone"]), None),
        ])
    }

    fn ask<'a>(selected: Option<&'a str>) -> Ask<'a> {
        Ask {
            selected,
            allowed: &[],
            strict: false,
            immediate: true,
            claim_name: "data",
        }
    }

    fn requisite(r: &pb::TopologyRequirement) -> Vec<Segments> {
        r.requisite
            .iter()
            .map(|t| t.segments.clone().into_iter().collect())
            .collect()
    }

    fn seg(pairs: &[(&str, &str)]) -> Segments {
        labels(pairs)
    }

    #[test]
    fn immediate_aggregates_every_key_set_from_the_nodes_that_registered_it() {
        let r = from_cluster(&ask(None), &zones()).unwrap().unwrap();
        assert_eq!(
            requisite(&r),
            [
                seg(&[("zone", "a")]),
                seg(&[("zone", "b")]),
                seg(&[("rack", "7"), ("zone", "b")]),
            ],
            "n4 registered nothing, n5 has no CSINode, n6 no Node: none of them counts"
        );
    }

    #[test]
    fn a_selected_node_is_preferred_and_aggregated_with_its_own_keys() {
        let r = from_cluster(&ask(Some("n3")), &zones()).unwrap().unwrap();
        assert_eq!(requisite(&r), [seg(&[("rack", "7"), ("zone", "b")])]);
        let r = from_cluster(&ask(Some("n2")), &zones()).unwrap().unwrap();
        assert_eq!(
            requisite(&r),
            [seg(&[("zone", "a")]), seg(&[("zone", "b")])],
            "n3 registered zone too: its zone counts"
        );
        let preferred: Vec<Segments> = r
            .preferred
            .iter()
            .map(|t| t.segments.clone().into_iter().collect())
            .collect();
        assert_eq!(preferred[0], seg(&[("zone", "b")]));
    }

    #[test]
    fn strict_or_allowed_topologies_read_only_the_selected_node() {
        /// A cluster that knows one node and fails a test that lists.
        struct OneNode(Table);
        impl Cluster for OneNode {
            fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
                self.0.csinode_keys(node)
            }
            fn registered(&self) -> Registered {
                panic!("no CSINode listed")
            }
            fn labels(&self, node: &str) -> Option<Labels> {
                self.0.labels(node)
            }
            fn labelled(&self, _: &[String]) -> Vec<(String, Segments)> {
                panic!("no Node listed")
            }
        }
        let one = OneNode(zones());
        let mut strict = ask(Some("n1"));
        strict.strict = true;
        let r = from_cluster(&strict, &one).unwrap().unwrap();
        assert_eq!(requisite(&r), [seg(&[("zone", "a")])]);
    }

    /// The error `from_cluster` gives, as a claim's event shows it.
    fn error(ask: &Ask<'_>, cluster: &Table) -> String {
        match from_cluster(ask, cluster) {
            Err(TopologyError::SelectedNodeGone(node)) => format!("gone: {node}"),
            Err(e) => e.to_string(),
            Ok(r) => panic!("no error: {r:?}"),
        }
    }

    #[test]
    fn what_the_caches_lack_is_an_error_as_upstreams_listers_make_it() {
        let t = zones();
        let rows: &[(Option<&str>, &str)] = &[
            // No CSINode: upstream's NotFound, which sends the claim back to the scheduler.
            (Some("n5"), "gone: n5"),
            (Some("nowhere"), "gone: nowhere"),
            // A CSINode without our keys: retried (the driver may be registering).
            (Some("n4"), "no topology key found for node n4"),
            // A CSINode but no Node (not in the cache yet): a missing key, retried.
            (
                Some("n6"),
                "topology labels from selected node {} does not match topology keys from CSINode [\"zone\"]",
            ),
        ];
        for (selected, want) in rows {
            assert_eq!(error(&ask(*selected), &t), *want, "{selected:?}");
        }
        let empty = Table::default();
        assert_eq!(
            error(&ask(None), &empty),
            "no available topology found",
            "no driver registered yet"
        );
        let unlabelled = cluster(&[
            ("n1", Some(&["zone"]), Some(&[])),
            ("n2", Some(&["rack"]), None),
        ]);
        assert_eq!(
            error(&ask(None), &unlabelled),
            "topologyKeys [[rack] [zone]] were not found on any nodes"
        );
    }
}
