//! Storage capacity tracking (`--enable-capacity`) as kube-scheduler sees it: one
//! CSIStorageCapacity per topology segment and late-binding class of the driver, in `NAMESPACE`,
//! with upstream's labels, owner and numbers, following the driver's `GetCapacity` after a volume
//! is provisioned, when a class comes or goes, when a node goes away and when someone deletes an
//! object. The poll interval is an hour, so every change seen here is the tracker reacting.

mod support;

use std::collections::BTreeMap;

use csi_provisioner::capacity::{LABEL_DRIVER, LABEL_MANAGED_BY};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use support::{
    DEADLINE, Rig, StorageClassFixture, free_address, get, unique_name, wait_for, wait_serving,
};

const ZONE: &str = "topology.capacity.example.com/zone";
const GI: i64 = 1 << 30;

/// What one object says: (class, zone, capacity as written).
type Row = (String, String, String);

async fn objects(rig: &Rig) -> Vec<CSIStorageCapacity> {
    let selector = format!("{LABEL_DRIVER}={}", rig.driver_name);
    Api::<CSIStorageCapacity>::namespaced(rig.client.clone(), &rig.ns.name)
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("listing CSIStorageCapacity")
        .items
}

fn rows(objects: &[CSIStorageCapacity]) -> Vec<Row> {
    let mut rows: Vec<Row> = objects
        .iter()
        .map(|o| {
            let zone = o
                .node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(ZONE).cloned())
                .unwrap_or_default();
            let capacity = o.capacity.as_ref().map(|q| q.0.clone()).unwrap_or_default();
            (o.storage_class_name.clone(), zone, capacity)
        })
        .collect();
    rows.sort();
    rows
}

/// Waits until the objects say exactly `want`; returns them.
async fn wait_rows(rig: &Rig, want: &[(&str, &str, &str)]) -> Vec<CSIStorageCapacity> {
    let mut want: Vec<Row> = want
        .iter()
        .map(|(c, z, q)| (c.to_string(), z.to_string(), q.to_string()))
        .collect();
    want.sort();
    wait_for(
        &format!("CSIStorageCapacity objects {want:?}"),
        DEADLINE,
        || async {
            let objects = objects(rig).await;
            if rows(&objects) == want {
                Ok(objects)
            } else {
                Err(format!("{:?}\n{}", rows(&objects), rig.sidecar_log_tail()))
            }
        },
    )
    .await
}

/// A Pod object to own the objects (`--capacity-ownerref-level=0`); nothing runs it.
async fn own_pod(rig: &Rig) -> Pod {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(unique_name("provisioner")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "csi-provisioner".into(),
                image: Some("csi-provisioner".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(rig.client.clone(), &rig.ns.name)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the owner Pod")
}

async fn gauge(address: &str, name: &str) -> Option<f64> {
    let reply = get(address, "/metrics", None).await.ok()?;
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A driver serving zone-a with 10Gi, a late-binding class, and the sidecar's capacity flags
/// (the Pod of the owner and `NAMESPACE` are set before it is started).
fn capacity_rig(prefix: &str) -> support::RigBuilder {
    Rig::builder(prefix)
        .driver(|d| {
            d.topology = Some((ZONE.to_string(), "zone-a".to_string()));
            d.capacity_bytes = Some(10 * GI);
        })
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(&[
            "--enable-capacity",
            "--capacity-ownerref-level=0",
            "--capacity-poll-interval=1h",
        ])
        .without_sidecar()
}

#[tokio::test]
async fn capacity_objects_follow_the_driver_classes_and_nodes() {
    let address = free_address();
    let mut rig = capacity_rig("capacity")
        .sidecar_args(&[&format!("--http-endpoint={address}")])
        .start()
        .await;
    let node_a = rig.node_in_zone(ZONE, "zone-a").await;
    let node_b = rig.node_in_zone(ZONE, "zone-b").await;
    let pod = own_pod(&rig).await;
    rig.env = vec![
        ("NAMESPACE".into(), rig.ns.name.clone()),
        ("POD_NAME".into(), pod.name_any()),
    ];
    // An Immediate class of the driver: no objects unless --capacity-for-immediate-binding.
    let immediate = unique_name("immediate");
    let classes = Api::<StorageClass>::all(rig.client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&immediate, &rig.driver_name)
                .binding_mode("Immediate")
                .build(),
        )
        .await
        .expect("creating the Immediate class");
    rig.start_sidecar();

    // The driver serves zone-a only: the zone-b object says 0 (created all the same, as upstream).
    let class = rig.class.clone();
    let first = wait_rows(&rig, &[(&class, "zone-a", "10Gi"), (&class, "zone-b", "0")]).await;
    for o in &first {
        assert_eq!(o.metadata.generate_name.as_deref(), Some("csisc-"));
        assert!(o.name_any().starts_with("csisc-"));
        assert_eq!(o.labels()[LABEL_MANAGED_BY], "external-provisioner");
        let owners = o.owner_references();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Pod", pod.uid().unwrap().as_str())
        );
        assert_eq!(owners[0].controller, Some(true));
        let labels: BTreeMap<String, String> =
            o.node_topology.clone().unwrap().match_labels.unwrap();
        assert_eq!(labels.keys().collect::<Vec<_>>(), [ZONE]);
    }
    wait_serving(&rig, &address, "/metrics").await;
    assert_eq!(
        gauge(&address, "csistoragecapacities_desired_goal").await,
        Some(2.0)
    );
    assert_eq!(
        gauge(&address, "csistoragecapacities_obsolete").await,
        Some(0.0)
    );

    // A volume in zone-a: its object follows at once (not at the next poll).
    rig.create_claim(rig.claim("data").size("1Gi").selected_node(&node_a))
        .await;
    rig.wait_bound("data").await;
    wait_rows(&rig, &[(&class, "zone-a", "9Gi"), (&class, "zone-b", "0")]).await;

    // Someone deletes an object: it is made again.
    let zone_a = objects(&rig)
        .await
        .into_iter()
        .find(|o| rows(std::slice::from_ref(o))[0].1 == "zone-a")
        .unwrap();
    Api::<CSIStorageCapacity>::namespaced(rig.client.clone(), &rig.ns.name)
        .delete(&zone_a.name_any(), &DeleteParams::default())
        .await
        .expect("deleting an object");
    let again = wait_rows(&rig, &[(&class, "zone-a", "9Gi"), (&class, "zone-b", "0")]).await;
    assert!(again.iter().all(|o| o.name_any() != zone_a.name_any()));

    // A second late-binding class: objects for it; deleted: they go.
    let second = unique_name("second");
    classes
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&second, &rig.driver_name)
                .binding_mode("WaitForFirstConsumer")
                .build(),
        )
        .await
        .expect("creating a second class");
    wait_rows(
        &rig,
        &[
            (&class, "zone-a", "9Gi"),
            (&class, "zone-b", "0"),
            (&second, "zone-a", "9Gi"),
            (&second, "zone-b", "0"),
        ],
    )
    .await;
    classes
        .delete(&second, &DeleteParams::default())
        .await
        .expect("deleting the second class");
    wait_rows(&rig, &[(&class, "zone-a", "9Gi"), (&class, "zone-b", "0")]).await;

    // The only node of zone-b goes away: so does its segment's object.
    rig.remove_node(&node_b).await;
    wait_rows(&rig, &[(&class, "zone-a", "9Gi")]).await;
    assert_eq!(
        gauge(&address, "csistoragecapacities_desired_goal").await,
        Some(1.0)
    );

    classes
        .delete(&immediate, &DeleteParams::default())
        .await
        .expect("deleting the Immediate class");
    rig.remove_node(&node_a).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn capacity_starts_only_with_an_owner_it_can_find() {
    // As upstream: the owner lookup failing at start-up stops the process, in one line.
    let mut rig = Rig::builder("capacity-owner")
        .sidecar_args(&["--enable-capacity", "--capacity-ownerref-level=0"])
        .without_sidecar()
        .start()
        .await;
    rig.env = vec![
        ("NAMESPACE".into(), rig.ns.name.clone()),
        ("POD_NAME".into(), "no-such-pod".into()),
    ];
    rig.start_sidecar();
    let sidecar = rig.sidecar.as_mut().expect("the sidecar");
    let status = sidecar.wait_exit(DEADLINE).await;
    assert!(!status.success(), "{status:?}");
    let log = sidecar.log_contents();
    assert!(
        log.contains(&format!(
            "look up owner(s) of pod {}/no-such-pod",
            rig.ns.name
        )),
        "{log}"
    );
    rig.cleanup().await;
}

/// What a sidecar's capacity objects look like, with run-specific names taken out.
#[derive(Debug, PartialEq)]
struct Seen {
    /// (class, zone, capacity) after start-up, and after a 1Gi volume in zone-a.
    first: Vec<Row>,
    after_volume: Vec<Row>,
    /// Labels (the driver's name replaced), generateName, owner kinds, topology keys,
    /// maximumVolumeSize, per object.
    shape: Vec<String>,
}

async fn capacity_of(upstream: bool) -> Seen {
    let cluster = support::cluster().await;
    let mut builder = capacity_rig("capacity-sbs");
    if upstream {
        // Upstream's informers need more than our RBAC grants: run it as the admin.
        builder = builder
            .sidecar_binary(support::testbed_bin("csi-provisioner-upstream"))
            .kubeconfig(cluster.kubeconfig.clone());
    }
    let mut rig = builder.start().await;
    let node_a = rig.node_in_zone(ZONE, "zone-a").await;
    let node_b = rig.node_in_zone(ZONE, "zone-b").await;
    let pod = own_pod(&rig).await;
    rig.env = vec![
        ("NAMESPACE".into(), rig.ns.name.clone()),
        ("POD_NAME".into(), pod.name_any()),
    ];
    rig.start_sidecar();
    let class = rig.class.clone();
    let normal = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .map(|(c, z, q)| (c.replace(&class, "CLASS"), z, q))
            .collect()
    };
    let first = wait_rows(&rig, &[(&class, "zone-a", "10Gi"), (&class, "zone-b", "0")]).await;
    let shape = first
        .iter()
        .map(|o| {
            let labels: BTreeMap<String, String> = o
                .labels()
                .iter()
                .map(|(k, v)| (k.clone(), v.replace(&rig.driver_name, "DRIVER")))
                .collect();
            let owners: Vec<(String, Option<bool>)> = o
                .owner_references()
                .iter()
                .map(|r| (r.kind.clone(), r.controller))
                .collect();
            let keys: Vec<String> = o
                .node_topology
                .clone()
                .and_then(|t| t.match_labels)
                .unwrap_or_default()
                .into_keys()
                .collect();
            format!(
                "labels={labels:?} generateName={:?} owners={owners:?} keys={keys:?} max={:?}",
                o.metadata.generate_name, o.maximum_volume_size
            )
        })
        .collect();
    rig.create_claim(rig.claim("data").size("1Gi").selected_node(&node_a))
        .await;
    rig.wait_bound("data").await;
    let after = wait_rows(&rig, &[(&class, "zone-a", "9Gi"), (&class, "zone-b", "0")]).await;
    let seen = Seen {
        first: normal(rows(&first)),
        after_volume: normal(rows(&after)),
        shape,
    };
    rig.remove_node(&node_a).await;
    rig.remove_node(&node_b).await;
    rig.cleanup().await;
    seen
}

/// The same objects as the upstream sidecar (v6.4) makes, on the same scenario.
#[tokio::test]
async fn capacity_objects_are_upstreams() {
    let upstream = capacity_of(true).await;
    let ours = capacity_of(false).await;
    assert_eq!(ours, upstream);
}
