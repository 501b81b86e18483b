//! Storage capacity tracking (`--enable-capacity`), the pure part: which
//! CSIStorageCapacity objects should exist (one per topology segment and
//! StorageClass of our driver), and what to create, update and delete to get
//! there from what exists. No I/O here; `controller::capacity` asks the driver
//! and the API server and carries the plan out.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::names::BindingMode;
use crate::quantity;

/// Label of every object: the driver it reports on.
pub const LABEL_DRIVER: &str = "csi.storage.k8s.io/drivername";
/// Label of every object: who maintains it.
pub const LABEL_MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";
/// `managed-by` of a central (not per-node) deployment, as upstream.
pub const MANAGED_BY: &str = "external-provisioner";

/// `managed-by` of the objects of one sidecar: [`MANAGED_BY`], or with
/// `--node-deployment` `external-provisioner-<node>`, shortened as upstream
/// does to fit a label value (63 characters).
pub fn managed_by(node: Option<&str>) -> String {
    match node {
        None => MANAGED_BY.to_string(),
        Some(node) => name_with_max_length(MANAGED_BY, node, 63),
    }
}

/// `<base>-<node>` (or `<node>` alone for an empty base) when it fits in
/// `max` bytes. Otherwise, upstream's shortening: the base cut down to make
/// room for the FNV-32a hash of the base and the whole node name
/// (`<cut base>-<hash of base>-<node>`), or, when the node name alone leaves
/// no room, the base and the hash of the whole joined name.
fn name_with_max_length(base: &str, node: &str, max: usize) -> String {
    let joined = if base.is_empty() {
        node.to_string()
    } else {
        format!("{base}-{node}")
    };
    if joined.len() <= max {
        return joined;
    }
    const HASH: usize = 8;
    let room = max.saturating_sub(node.len() + HASH + 2);
    if !base.is_empty() && room >= 1 {
        let cut = &base[..room.min(base.len())];
        format!("{cut}-{:08x}-{node}", fnv32a(base))
    } else if base.is_empty() {
        format!("{:08x}", fnv32a(&joined))
    } else {
        format!("{base}-{:08x}", fnv32a(&joined))
    }
}

/// FNV-1a, 32 bits.
fn fnv32a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Topology labels and their values; empty: every node.
pub type Segment = BTreeMap<String, String>;

/// The segments of the driver's nodes: for each CSINode that lists the
/// driver, its topology keys with the values of its Node's labels (`nodes`:
/// name → labels). A node
/// whose Node is missing or lacks one of the labels is left out; a driver
/// without topology keys gives the empty segment. Sorted, without repeats
/// (upstream #1450: a repeated segment made duplicate objects).
pub fn segments(
    driver: &str,
    csinodes: &[CSINode],
    nodes: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<Segment> {
    let mut found = BTreeSet::new();
    for csinode in csinodes {
        let Some(entry) = csinode.spec.drivers.iter().find(|d| d.name == driver) else {
            continue;
        };
        let Some(labels) = nodes.get(&csinode.name_any()) else {
            continue;
        };
        let keys = entry.topology_keys.clone().unwrap_or_default();
        let segment: Option<Segment> = keys
            .iter()
            .map(|k| Some((k.clone(), labels.get(k)?.clone())))
            .collect();
        if let Some(segment) = segment {
            found.insert(segment);
        }
    }
    found.into_iter().collect()
}

/// One object to keep: the capacity of `class` in `segment`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Item {
    pub class: String,
    pub segment: Segment,
}

/// Segments × the classes of our driver; Immediate classes only when
/// `for_immediate_binding` (their volumes are not placed by the scheduler).
pub fn items(
    segments: &[Segment],
    classes: &[StorageClass],
    driver: &str,
    for_immediate_binding: bool,
) -> Vec<Item> {
    let mut out: Vec<Item> = classes
        .iter()
        .filter(|c| c.provisioner == driver)
        .filter(|c| {
            for_immediate_binding
                || c.volume_binding_mode
                    .as_deref()
                    .and_then(BindingMode::parse)
                    == Some(BindingMode::WaitForFirstConsumer)
        })
        .flat_map(|c| {
            segments.iter().map(|s| Item {
                class: c.name_any(),
                segment: s.clone(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What the driver's `GetCapacity` answered for an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub available: i64,
    pub maximum_volume_size: Option<i64>,
}

/// A change to make.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A new object for `item` (`generateName`).
    Create(Item, Answer),
    /// The object `name` (as read, resourceVersion included) now says this.
    Update(Box<CSIStorageCapacity>, Answer),
    /// An object no item needs, or a second one for the same item.
    Delete(String),
}

/// Counts for the gauges upstream exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `csistoragecapacities_desired_goal`: items.
    pub goal: usize,
    /// `csistoragecapacities_desired_current`: items with an object.
    pub current: usize,
    /// `csistoragecapacities_obsolete`: objects no item needs.
    pub obsolete: usize,
}

/// The item an existing object stands for: its class and the labels its
/// `nodeTopology` matches (`None`: a selector we did not write).
fn item_of(object: &CSIStorageCapacity) -> Option<Item> {
    let segment = match &object.node_topology {
        None => Segment::new(),
        Some(selector)
            if selector
                .match_expressions
                .as_ref()
                .is_none_or(Vec::is_empty) =>
        {
            selector.match_labels.clone().unwrap_or_default()
        }
        Some(_) => return None,
    };
    Some(Item {
        class: object.storage_class_name.clone(),
        segment,
    })
}

/// Whether `object` already says what `answer` says, owned as it should be.
fn up_to_date(object: &CSIStorageCapacity, answer: Answer, owner: Option<&OwnerReference>) -> bool {
    let bytes = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.as_ref().and_then(|q| quantity::parse_bytes(&q.0))
    };
    let owned = owner.is_none_or(|o| object.owner_references().iter().any(|r| r.uid == o.uid));
    bytes(&object.capacity) == Some(answer.available)
        && bytes(&object.maximum_volume_size) == answer.maximum_volume_size
        && owned
}

/// From the objects that exist (ours: our labels, our namespace) and the
/// answers for each item (`None`: `GetCapacity` failed, and the object is left
/// as it is), the changes that make the objects say what the driver says.
pub fn plan(
    answers: &[(Item, Option<Answer>)],
    existing: &[CSIStorageCapacity],
    owner: Option<&OwnerReference>,
) -> (Vec<Change>, Counts) {
    let mut by_item: BTreeMap<Item, Vec<&CSIStorageCapacity>> = BTreeMap::new();
    let mut changes = Vec::new();
    let mut obsolete = 0;
    // Oldest first, so that of two objects for one item the same one is kept
    // on every pass.
    let mut sorted: Vec<&CSIStorageCapacity> = existing.iter().collect();
    sorted.sort_by_key(|o| {
        (
            o.metadata.creation_timestamp.clone().map(|t| t.0),
            o.name_any(),
        )
    });
    let wanted: BTreeSet<&Item> = answers.iter().map(|(i, _)| i).collect();
    for object in sorted {
        match item_of(object).filter(|i| wanted.contains(i)) {
            Some(item) => by_item.entry(item).or_default().push(object),
            None => {
                obsolete += 1;
                changes.push(Change::Delete(object.name_any()));
            }
        }
    }
    let mut current = 0;
    for (item, answer) in answers {
        let objects = by_item.remove(item).unwrap_or_default();
        let mut objects = objects.into_iter();
        match (objects.next(), answer) {
            (Some(kept), Some(answer)) => {
                current += 1;
                if !up_to_date(kept, *answer, owner) {
                    changes.push(Change::Update(Box::new(kept.clone()), *answer));
                }
            }
            (Some(_), None) => current += 1,
            (None, Some(answer)) => changes.push(Change::Create(item.clone(), *answer)),
            (None, None) => {}
        }
        changes.extend(objects.map(|dup| Change::Delete(dup.name_any())));
    }
    let counts = Counts {
        goal: answers.len(),
        current,
        obsolete,
    };
    (changes, counts)
}

/// The object for `item` saying `answer`, as upstream writes it.
pub fn object(
    item: &Item,
    answer: Answer,
    driver: &str,
    managed_by: &str,
    namespace: &str,
    owner: Option<&OwnerReference>,
) -> CSIStorageCapacity {
    let mut object = CSIStorageCapacity {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some("csisc-".into()),
            namespace: Some(namespace.into()),
            labels: Some(
                [
                    (LABEL_DRIVER.to_string(), driver.to_string()),
                    (LABEL_MANAGED_BY.to_string(), managed_by.to_string()),
                ]
                .into(),
            ),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..Default::default()
        },
        storage_class_name: item.class.clone(),
        node_topology: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(item.segment.clone()),
                match_expressions: None,
            },
        ),
        ..Default::default()
    };
    say(&mut object, answer, owner);
    object
}

/// Writes `answer` (and the owner, when missing) into `object`.
pub fn say(object: &mut CSIStorageCapacity, answer: Answer, owner: Option<&OwnerReference>) {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    object.capacity = Some(Quantity(quantity::format_bytes(answer.available)));
    object.maximum_volume_size = answer
        .maximum_volume_size
        .map(|b| Quantity(quantity::format_bytes(b)));
    if let Some(owner) = owner {
        let refs = object.metadata.owner_references.get_or_insert_default();
        if !refs.iter().any(|r| r.uid == owner.uid) {
            refs.push(owner.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const DRIVER: &str = "hostpath.csi.test";

    fn node(name: &str, labels: &[(&str, &str)]) -> (String, BTreeMap<String, String>) {
        (name.to_string(), seg(labels))
    }

    fn csinode(name: &str, drivers: &[(&str, Option<&[&str]>)]) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: drivers
                    .iter()
                    .map(|(d, keys)| CSINodeDriver {
                        name: d.to_string(),
                        node_id: name.into(),
                        topology_keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
                        ..Default::default()
                    })
                    .collect(),
            },
        }
    }

    fn seg(pairs: &[(&str, &str)]) -> Segment {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn segments_come_from_the_driver_s_nodes() {
        let zone: &[&str] = &["zone", "rack"];
        let csinodes = [
            csinode("n1", &[(DRIVER, Some(zone))]),
            csinode("n2", &[(DRIVER, Some(zone))]),
            // same segment as n1: one segment
            csinode("n3", &[(DRIVER, Some(zone))]),
            // a label missing on its node: left out
            csinode("n4", &[(DRIVER, Some(zone))]),
            // no Node object: left out
            csinode("gone", &[(DRIVER, Some(zone))]),
            // another driver only
            csinode("n5", &[("other.csi", Some(zone))]),
        ];
        let nodes: BTreeMap<_, _> = [
            node("n1", &[("zone", "a"), ("rack", "1")]),
            node("n2", &[("zone", "b"), ("rack", "1"), ("extra", "x")]),
            node("n3", &[("zone", "a"), ("rack", "1")]),
            node("n4", &[("zone", "a")]),
            node("n5", &[("zone", "c"), ("rack", "1")]),
        ]
        .into();
        assert_eq!(
            segments(DRIVER, &csinodes, &nodes),
            vec![
                seg(&[("rack", "1"), ("zone", "a")]),
                seg(&[("rack", "1"), ("zone", "b")])
            ]
        );
        // A driver without topology keys: one segment, every node.
        let flat = [
            csinode("n1", &[(DRIVER, None)]),
            csinode("n2", &[(DRIVER, Some(&[]))]),
        ];
        assert_eq!(segments(DRIVER, &flat, &nodes), vec![Segment::new()]);
        assert_eq!(segments(DRIVER, &[], &nodes), Vec::<Segment>::new());
    }

    fn class(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: mode.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn items_are_segments_times_our_late_binding_classes() {
        let segs = [seg(&[("zone", "a")]), seg(&[("zone", "b")])];
        let classes = [
            class("late", DRIVER, Some("WaitForFirstConsumer")),
            class("now", DRIVER, Some("Immediate")),
            class("default-mode", DRIVER, None),
            class("theirs", "other.csi", Some("WaitForFirstConsumer")),
        ];
        let names = |items: Vec<Item>| -> Vec<(String, String)> {
            items
                .into_iter()
                .map(|i| (i.class, i.segment["zone"].clone()))
                .collect()
        };
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            names(items(&segs, &classes, DRIVER, false)),
            pairs(&[("late", "a"), ("late", "b")])
        );
        assert_eq!(
            names(items(&segs, &classes, DRIVER, true)),
            pairs(&[
                ("default-mode", "a"),
                ("default-mode", "b"),
                ("late", "a"),
                ("late", "b"),
                ("now", "a"),
                ("now", "b")
            ])
        );
    }

    fn item(class: &str, zone: &str) -> Item {
        Item {
            class: class.into(),
            segment: seg(&[("zone", zone)]),
        }
    }

    fn answer(available: i64) -> Answer {
        Answer {
            available,
            maximum_volume_size: None,
        }
    }

    fn existing(name: &str, item: &Item, available: i64, created: i64) -> CSIStorageCapacity {
        let mut o = object(item, answer(available), DRIVER, MANAGED_BY, "ns", None);
        o.metadata.name = Some(name.into());
        o.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        o
    }

    #[test]
    fn the_plan_creates_updates_and_deletes_only_what_differs() {
        let a = item("fast", "a");
        let b = item("fast", "b");
        let c = item("fast", "c");
        let answers = vec![
            (a.clone(), Some(answer(10 << 30))),
            (b.clone(), Some(answer(5 << 30))),
            (c.clone(), Some(answer(0))),
        ];
        let objects = vec![
            existing("same", &a, 10 << 30, 1),
            existing("stale", &b, 7 << 30, 1),
            // a second object for b, newer: deleted
            existing("dup", &b, 5 << 30, 2),
            // an item no one needs any more
            existing("old", &item("gone", "a"), 1, 1),
        ];
        let (changes, counts) = plan(&answers, &objects, None);
        let summary: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Create(i, a) => {
                    format!("create {}/{} {}", i.class, i.segment["zone"], a.available)
                }
                Change::Update(o, a) => format!("update {} {}", o.name_any(), a.available),
                Change::Delete(n) => format!("delete {n}"),
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                "delete old".to_string(),
                format!("update stale {}", 5i64 << 30),
                "delete dup".to_string(),
                "create fast/c 0".to_string(),
            ]
        );
        assert_eq!(
            counts,
            Counts {
                goal: 3,
                current: 2,
                obsolete: 1
            }
        );
        // Nothing to do when everything says what the driver says.
        let fresh = vec![existing("a", &a, 1, 1)];
        assert!(
            plan(&[(a.clone(), Some(answer(1)))], &fresh, None)
                .0
                .is_empty()
        );
        // A failed GetCapacity leaves its object alone and creates nothing.
        let (changes, counts) = plan(&[(a.clone(), None), (b.clone(), None)], &fresh, None);
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!((counts.goal, counts.current), (2, 1));
        // A maximum volume size that changed is an update.
        let max = Answer {
            available: 1,
            maximum_volume_size: Some(1 << 20),
        };
        assert_eq!(plan(&[(a.clone(), Some(max))], &fresh, None).0.len(), 1);
    }

    #[test]
    fn an_owner_is_added_where_missing() {
        let a = item("fast", "a");
        let owner = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "rs".into(),
            uid: "u1".into(),
            controller: Some(true),
            ..Default::default()
        };
        let unowned = vec![existing("a", &a, 1, 1)];
        let (changes, _) = plan(&[(a.clone(), Some(answer(1)))], &unowned, Some(&owner));
        let Change::Update(mut o, ans) = changes[0].clone() else {
            panic!("{changes:?}")
        };
        say(&mut o, ans, Some(&owner));
        assert_eq!(o.owner_references(), std::slice::from_ref(&owner));
        assert!(
            plan(&[(a.clone(), Some(answer(1)))], &[*o], Some(&owner))
                .0
                .is_empty()
        );
    }

    #[test]
    fn managed_by_names_the_node_within_a_label_value() {
        let a = |n: usize| format!("node{}", "a".repeat(n));
        // Upstream's own cases (cmd/csi-provisioner util_test.go), same inputs and outputs.
        let cases: Vec<(&str, String, String)> = vec![
            (
                MANAGED_BY,
                "node01".into(),
                "external-provisioner-node01".into(),
            ),
            ("", "node01".into(), "node01".into()),
            (MANAGED_BY, a(38), format!("external-provisioner-{}", a(38))),
            (MANAGED_BY, a(39), format!("external-p-53f40b57-{}", a(39))),
            (MANAGED_BY, a(48), format!("e-53f40b57-{}", a(48))),
            (MANAGED_BY, a(49), "external-provisioner-a3607ff1".into()),
            (MANAGED_BY, a(63), "external-provisioner-df38e37f".into()),
            ("", a(63), "fa65587e".into()),
        ];
        for (base, node, want) in cases {
            let got = name_with_max_length(base, &node, 63);
            assert_eq!(got, want, "{base:?} {node:?}");
            assert!(got.len() <= 63);
        }
        assert_eq!(managed_by(None), "external-provisioner");
        assert_eq!(managed_by(Some("n1")), "external-provisioner-n1");
    }

    #[test]
    fn objects_are_written_as_upstream_writes_them() {
        let o = object(
            &item("fast", "a"),
            Answer {
                available: 3 << 30,
                maximum_volume_size: Some(1 << 30),
            },
            DRIVER,
            MANAGED_BY,
            "kube-system",
            None,
        );
        assert_eq!(o.metadata.generate_name.as_deref(), Some("csisc-"));
        assert_eq!(o.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(o.labels()[LABEL_DRIVER], DRIVER);
        assert_eq!(o.labels()[LABEL_MANAGED_BY], "external-provisioner");
        assert_eq!(o.capacity.as_ref().unwrap().0, "3Gi");
        assert_eq!(o.maximum_volume_size.as_ref().unwrap().0, "1Gi");
        assert_eq!(
            o.node_topology.unwrap().match_labels.unwrap(),
            seg(&[("zone", "a")])
        );
        assert_eq!(o.metadata.owner_references, None);
    }
}
