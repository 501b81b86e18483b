//! The topology caches: the cluster's CSINodes (each cut to our driver's
//! topology keys) and Nodes (metadata only, cut to name and labels), watched
//! when claims get accessibility requirements (`provision::topology::served`,
//! central replicas only), so that a claim's topology costs no request, as
//! upstream's CSINode and Node listers. They answer
//! [`provision::topology::Cluster`]; the walk itself is pure.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::kube::Listed;
use crate::provision::topology::{self as topo, Labels, Registered, Segments};

/// The CSINode and Node caches, and whether each holds its first list.
#[derive(Clone)]
pub struct TopologyCaches {
    /// Our driver's name: the CSINode entry read.
    pub driver: String,
    pub csinodes: Store<CSINode>,
    pub csinodes_listed: Listed,
    pub nodes: Store<PartialObjectMeta<Node>>,
    pub nodes_listed: Listed,
}

impl TopologyCaches {
    /// Returns once both caches hold their first list (upstream waits for
    /// its informers to sync before it provisions).
    pub async fn listed(&self) {
        tokio::join!(self.csinodes_listed.wait(), self.nodes_listed.wait());
    }
}

impl topo::Cluster for TopologyCaches {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        let csinode = self.csinodes.get(&ObjectRef::new(node))?;
        Some(driver_keys(&csinode, &self.driver))
    }

    fn registered(&self) -> Registered {
        topo::registered(
            self.csinodes
                .state()
                .iter()
                .map(|c| (c.name_any(), driver_keys(c, &self.driver))),
        )
    }

    fn labels(&self, node: &str) -> Option<Labels> {
        let node = self.nodes.get(&ObjectRef::new(node))?;
        Some(node.labels().clone())
    }

    fn labelled(&self, keys: &[String]) -> Vec<(String, Segments)> {
        self.nodes
            .state()
            .iter()
            .filter_map(|n| Some((n.name_any(), topo::segment(n.labels(), keys)?)))
            .collect()
    }
}

/// The topology keys `driver` registered on a CSINode (none where it is not
/// registered).
pub fn driver_keys(csinode: &CSINode, driver: &str) -> Vec<String> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .and_then(|d| d.topology_keys.clone())
        .unwrap_or_default()
}

/// A CSINode as the cache keeps it: its name and our driver's entry with its
/// keys, nothing else (other drivers, node IDs, allocatable counts).
pub fn trim_csinode(csinode: &mut CSINode, driver: &str) {
    csinode.metadata = ObjectMeta {
        name: csinode.metadata.name.take(),
        ..Default::default()
    };
    csinode.spec.drivers = std::mem::take(&mut csinode.spec.drivers)
        .into_iter()
        .filter(|d| d.name == driver)
        .map(|d| CSINodeDriver {
            name: d.name,
            topology_keys: d.topology_keys,
            ..Default::default()
        })
        .collect();
}

/// A Node as the cache keeps it: its name and labels (which topology keys a
/// driver registers can change at any time, so every label is kept).
pub fn trim_node(node: &mut PartialObjectMeta<Node>) {
    node.types = None;
    node.metadata = ObjectMeta {
        name: node.metadata.name.take(),
        labels: node.metadata.labels.take(),
        ..Default::default()
    };
}

/// Caches filled by hand, for tests: (node, our keys on its CSINode or no
/// CSINode, its labels or no Node).
#[cfg(test)]
pub fn filled(
    driver: &str,
    rows: &[(&str, Option<&[&str]>, Option<&[(&str, &str)]>)],
) -> TopologyCaches {
    use kube::runtime::{reflector, watcher};
    let (csinodes, mut csinode_writer) = reflector::store();
    let (nodes, mut node_writer) = reflector::store();
    for (name, keys, labels) in rows {
        if let Some(keys) = keys {
            let mut csinode = CSINode {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            csinode.spec.drivers.push(CSINodeDriver {
                name: driver.into(),
                node_id: name.to_string(),
                topology_keys: Some(keys.iter().map(|k| k.to_string()).collect()),
                ..Default::default()
            });
            csinode_writer.apply_watcher_event(&watcher::Event::Apply(csinode));
        }
        if let Some(labels) = labels {
            let mut node = PartialObjectMeta::<Node>::default();
            node.metadata.name = Some(name.to_string());
            node.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            node_writer.apply_watcher_event(&watcher::Event::Apply(node));
        }
    }
    TopologyCaches {
        driver: driver.into(),
        csinodes,
        csinodes_listed: Listed::done(),
        nodes,
        nodes_listed: Listed::done(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::topology::Cluster;

    const DRIVER: &str = "csi.example.com";

    fn seg(pairs: &[(&str, &str)]) -> Segments {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_csinode_is_kept_with_our_drivers_keys_only() {
        let mut csinode: CSINode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "5",
                         "labels": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"drivers": [
                {"name": "other.example.com", "nodeID": "x", "topologyKeys": ["other"]},
                {"name": DRIVER, "nodeID": "n1-id", "topologyKeys": ["zone", "rack"],
                 "allocatable": {"count": 8}}
            ]}
        }))
        .unwrap();
        trim_csinode(&mut csinode, DRIVER);
        assert_eq!(
            serde_json::to_value(&csinode).unwrap(),
            serde_json::json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "n1"},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": "", "topologyKeys": ["zone", "rack"]}]}
            })
        );
        assert_eq!(driver_keys(&csinode, DRIVER), ["zone", "rack"]);
        assert!(driver_keys(&csinode, "other.example.com").is_empty());
    }

    #[test]
    fn a_node_is_kept_with_its_name_and_labels_only() {
        let mut node: PartialObjectMeta<Node> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "5",
                         "labels": {"zone": "a"}, "annotations": {"big": "x"},
                         "managedFields": [{"manager": "kubelet"}]}
        }))
        .unwrap();
        trim_node(&mut node);
        assert_eq!(node.types, None);
        assert_eq!(
            node.metadata,
            ObjectMeta {
                name: Some("n1".into()),
                labels: Some([("zone".to_string(), "a".to_string())].into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn the_caches_answer_what_the_claim_path_asks() {
        let caches = filled(
            DRIVER,
            &[
                ("n1", Some(&["zone"]), Some(&[("zone", "a"), ("os", "x")])),
                ("n2", Some(&[]), Some(&[("zone", "b")])),
                ("n3", None, Some(&[("os", "x")])),
            ],
        );
        assert_eq!(caches.csinode_keys("n1"), Some(vec!["zone".to_string()]));
        assert_eq!(caches.csinode_keys("n2"), Some(vec![]), "not registered");
        assert_eq!(caches.csinode_keys("n3"), None, "no CSINode");
        assert_eq!(
            caches.registered(),
            [("n1".to_string(), vec!["zone".to_string()])].into(),
            "a node without our keys is left out"
        );
        assert_eq!(caches.labels("n3"), Some(seg(&[("os", "x")])));
        assert_eq!(caches.labels("n9"), None);
        let mut zoned = caches.labelled(&["zone".to_string()]);
        zoned.sort();
        assert_eq!(
            zoned,
            [
                ("n1".to_string(), seg(&[("zone", "a")])),
                ("n2".to_string(), seg(&[("zone", "b")]))
            ]
        );
    }
}
