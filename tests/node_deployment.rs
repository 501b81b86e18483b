//! `--node-deployment`: three sidecars, one per node, each with a test-driver instance of its
//! own (the same driver name, its own node id and topology segment, its own backend ledger), on
//! one control plane. Every claim must get exactly one volume, on exactly the node it belongs
//! to: the scheduler's selected node for WaitForFirstConsumer claims, and for Immediate claims
//! whichever node won the race for it — also when a sidecar is killed in the middle. Deleting
//! the claims deletes each volume once, through its own node's sidecar.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use csi_provisioner::keys;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::Ledger;
use csi_test_driver::process::{DriverOptions, DriverProcess, binary_path};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::PostParams;
use support::{ChildProcess, DEADLINE, Rig, StorageClassFixture, unique_name, wait_for};

const NODE_KEY: &str = "topology.node-deployment.example.com/node";
const NODES: [&str; 3] = ["nd-node-a", "nd-node-b", "nd-node-c"];

/// One node: its driver (sockets and ledger in a directory of its own; node A's is the
/// rig's) and its sidecar.
struct Node {
    name: &'static str,
    driver: Option<DriverProcess>,
    sidecar: Option<ChildProcess>,
    args: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Node {
    fn start_sidecar(&mut self, rig: &Rig) {
        if let Some(mut old) = self.sidecar.take() {
            old.kill();
        }
        self.sidecar = Some(ChildProcess::spawn(
            Command::new(&rig.binary)
                .args(&self.args)
                .envs(rig.env.iter().cloned())
                .env("NODE_NAME", self.name),
        ));
    }

    async fn ledger(&self, rig: &Rig) -> Ledger {
        match &self.driver {
            None => rig.ledger().await,
            Some(driver) => driver
                .control()
                .await
                .expect("driver control socket")
                .ledger()
                .await
                .expect("reading the ledger"),
        }
    }
}

fn sidecar_args(rig: &Rig, driver: &DriverProcess) -> Vec<String> {
    let mut args: Vec<String> = rig
        .args
        .iter()
        .filter(|a| !a.starts_with("--csi-address="))
        .cloned()
        .collect();
    args.push(format!("--csi-address={}", driver.csi_address()));
    args
}

/// The rig's driver is node A's; nodes B and C get drivers of their own with the same name.
/// With `capacity`, the sidecars track storage capacity (10 GiB per node's driver) in the
/// rig's namespace.
async fn three_nodes(prefix: &str, capacity: bool) -> (Rig, Vec<Node>) {
    three_nodes_with(prefix, capacity, capacity.then_some([10 << 30; 3])).await
}

/// [`three_nodes`], with each node's driver reporting its own capacity (`GetCapacity`).
async fn three_nodes_with(
    prefix: &str,
    capacity: bool,
    capacities: Option<[i64; 3]>,
) -> (Rig, Vec<Node>) {
    let capacity_bytes = |i: usize| capacities.map(|c| c[i]);
    let capacity_args: &[&str] = if capacity {
        &["--enable-capacity", "--capacity-ownerref-level=-1"]
    } else {
        &[]
    };
    let mut rig = Rig::builder(prefix)
        .driver(|d| {
            d.node_id = NODES[0].into();
            d.topology = Some((NODE_KEY.into(), NODES[0].into()));
            d.capacity_bytes = capacity_bytes(0);
        })
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(&[
            "--node-deployment",
            // Short delays: the race itself is what is tested, not its patience.
            "--node-deployment-base-delay=200ms",
            "--node-deployment-max-delay=2s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ])
        .sidecar_args(capacity_args)
        .without_sidecar()
        .start()
        .await;
    if capacity {
        rig.env.push(("NAMESPACE".into(), rig.ns.name.clone()));
    }
    let mut nodes = vec![Node {
        name: NODES[0],
        driver: None,
        sidecar: None,
        args: sidecar_args(&rig, &rig.driver),
        _dir: None,
    }];
    for (i, name) in NODES.iter().enumerate().skip(1) {
        let dir = tempfile::Builder::new()
            .prefix("node-")
            .tempdir()
            .expect("node dir");
        let driver = DriverProcess::start(
            &binary_path().expect("csi-test-driver binary"),
            dir.path(),
            &DriverOptions {
                drivername: rig.driver_name.clone(),
                node_id: (*name).into(),
                topology: Some((NODE_KEY.into(), (*name).into())),
                capacity_bytes: capacity_bytes(i),
                seed: i as u64 + 1,
                ..DriverOptions::default()
            },
        )
        .await
        .expect("starting a node's driver");
        let args = sidecar_args(&rig, &driver);
        nodes.push(Node {
            name,
            driver: Some(driver),
            sidecar: None,
            args,
            _dir: Some(dir),
        });
    }
    for node in &mut nodes {
        node.start_sidecar(&rig);
    }
    (rig, nodes)
}

/// An Immediate class of the rig's driver.
async fn immediate_class(rig: &Rig) -> String {
    let name = unique_name("nd-immediate");
    Api::<StorageClass>::all(rig.client.clone())
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&name, &rig.driver_name)
                .reclaim("Delete")
                .binding_mode("Immediate")
                .build(),
        )
        .await
        .expect("creating the Immediate class");
    name
}

/// Per volume name (`pvc-<uid>`): the nodes whose backend holds a volume of that name, and
/// how many `CreateVolume` calls created one, over every node.
async fn volumes_by_name(
    rig: &Rig,
    nodes: &[Node],
) -> (BTreeMap<String, Vec<&'static str>>, BTreeMap<String, usize>) {
    let mut held: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    for node in nodes {
        let ledger = node.ledger(rig).await;
        for v in ledger.volumes.values() {
            held.entry(v.name.clone()).or_default().push(node.name);
        }
        for op in &ledger.operations {
            if op.method == "CreateVolume" && op.created {
                *created
                    .entry(op.name.clone().unwrap_or_default())
                    .or_default() += 1;
            }
        }
    }
    (held, created)
}

fn accessible_node(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Option<String> {
    pv.spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .first()?
        .match_expressions
        .as_ref()?
        .iter()
        .find(|e| e.key == NODE_KEY)?
        .values
        .as_ref()?
        .first()
        .cloned()
}

async fn wait_every_volume_gone(rig: &Rig, nodes: &[Node]) {
    wait_for("every backend volume to be deleted", DEADLINE, || async {
        let (held, _) = volumes_by_name(rig, nodes).await;
        if held.is_empty() { Ok(()) } else { Err(held) }
    })
    .await;
}

#[tokio::test]
async fn each_claim_gets_one_volume_on_its_own_node() {
    let (rig, nodes) = three_nodes("node-deployment", false).await;
    let immediate = immediate_class(&rig).await;

    // WaitForFirstConsumer: two claims selected for each node.
    let mut selected = Vec::new();
    for node in NODES {
        for i in 0..2 {
            let name = format!("late-{node}-{i}");
            rig.create_claim(rig.claim(&name).selected_node(node)).await;
            selected.push((name, node));
        }
    }
    // Immediate: raced for by all three.
    let raced: Vec<String> = (0..6).map(|i| format!("raced-{i}")).collect();
    for name in &raced {
        rig.create_claim(rig.claim(name).class(&immediate)).await;
    }

    for (name, node) in &selected {
        let pv = rig.wait_bound(name).await;
        assert_eq!(accessible_node(&pv).as_deref(), Some(*node), "claim {name}");
    }
    let mut winners = BTreeMap::new();
    for name in &raced {
        let pv = rig.wait_bound(name).await;
        let claim = rig.claims().get(name).await.expect("reading the claim");
        let chosen = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned())
            .expect("the winner wrote itself as the selected node");
        assert_eq!(accessible_node(&pv), Some(chosen.clone()), "claim {name}");
        *winners.entry(chosen).or_insert(0) += 1;
    }

    let (held, created) = volumes_by_name(&rig, &nodes).await;
    assert_eq!(held.len(), selected.len() + raced.len(), "{held:?}");
    for (name, on) in &held {
        assert_eq!(on.len(), 1, "volume {name} on exactly one node: {on:?}");
        assert_eq!(created.get(name), Some(&1), "volume {name} created once");
    }
    eprintln!("Immediate claims won per node: {winners:?}");

    // Each node deletes its own volumes, once.
    for (name, _) in &selected {
        rig.delete_claim(name).await;
    }
    for name in &raced {
        rig.delete_claim(name).await;
    }
    wait_every_volume_gone(&rig, &nodes).await;
    for node in &nodes {
        let ledger = node.ledger(&rig).await;
        let deletes = ledger
            .operations
            .iter()
            .filter(|o| o.method == "DeleteVolume")
            .count();
        let creates = ledger
            .operations
            .iter()
            .filter(|o| o.method == "CreateVolume" && o.created)
            .count();
        assert_eq!(
            deletes, creates,
            "node {}: each of its volumes deleted once",
            node.name
        );
    }
    drop(nodes);
    rig.ns.cleanup().await;
}

#[tokio::test]
async fn a_sidecar_killed_mid_run_leaves_one_volume_per_claim() {
    let (rig, mut nodes) = three_nodes("node-deployment-kill", false).await;
    let immediate = immediate_class(&rig).await;
    let mut names = Vec::new();
    for i in 0..12 {
        let name = format!("c-{i}");
        let fixture = if i % 2 == 0 {
            rig.claim(&name).class(&immediate)
        } else {
            rig.claim(&name).selected_node(NODES[i % 3])
        };
        rig.create_claim(fixture).await;
        names.push(name);
        if i == 5 {
            // Node B's sidecar dies mid-run and comes back.
            nodes[1].sidecar.take().expect("running").kill();
            tokio::time::sleep(Duration::from_millis(500)).await;
            nodes[1].start_sidecar(&rig);
        }
    }
    for name in &names {
        rig.wait_bound(name).await;
    }
    let (held, created) = volumes_by_name(&rig, &nodes).await;
    assert_eq!(held.len(), names.len(), "{held:?}");
    for (name, on) in &held {
        assert_eq!(on.len(), 1, "volume {name} on exactly one node: {on:?}");
        assert_eq!(created.get(name), Some(&1), "volume {name} created once");
    }
    for name in &names {
        rig.delete_claim(name).await;
    }
    wait_every_volume_gone(&rig, &nodes).await;
    drop(nodes);
    rig.ns.cleanup().await;
}

#[tokio::test]
async fn each_node_publishes_its_own_capacity() {
    use csi_provisioner::capacity::{LABEL_DRIVER, LABEL_MANAGED_BY};
    use k8s_openapi::api::storage::v1::CSIStorageCapacity;
    use kube::api::ListParams;

    let (rig, nodes) = three_nodes("node-deployment-capacity", true).await;
    let objects: Api<CSIStorageCapacity> = Api::namespaced(rig.client.clone(), &rig.ns.name);
    let selector = format!("{LABEL_DRIVER}={}", rig.driver_name);
    // One object per node for the late-binding class: that node's segment, its own
    // managed-by, what its own driver reports.
    let want: Vec<(String, String, String, String)> = NODES
        .iter()
        .map(|n| {
            (
                format!("external-provisioner-{n}"),
                rig.class.clone(),
                (*n).to_string(),
                "10Gi".to_string(),
            )
        })
        .collect();
    wait_for("one CSIStorageCapacity per node", DEADLINE, || async {
        let mut got: Vec<(String, String, String, String)> = objects
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("listing CSIStorageCapacity")
            .items
            .into_iter()
            .map(|o| {
                let node = o
                    .node_topology
                    .as_ref()
                    .and_then(|t| t.match_labels.as_ref())
                    .and_then(|l| l.get(NODE_KEY).cloned())
                    .unwrap_or_default();
                (
                    o.metadata.labels.unwrap_or_default()[LABEL_MANAGED_BY].clone(),
                    o.storage_class_name,
                    node,
                    o.capacity.map(|q| q.0).unwrap_or_default(),
                )
            })
            .collect();
        got.sort();
        if got == want { Ok(()) } else { Err(got) }
    })
    .await;
    drop(nodes);
    rig.ns.cleanup().await;
}

#[tokio::test]
async fn a_node_without_room_does_not_take_an_immediate_claim() {
    // Node A's driver has 512 MiB free, the claims ask for 1 GiB: B and C share them.
    let (rig, nodes) = three_nodes_with(
        "node-deployment-room",
        false,
        Some([512 << 20, 10 << 30, 10 << 30]),
    )
    .await;
    let immediate = immediate_class(&rig).await;
    let names: Vec<String> = (0..6).map(|i| format!("big-{i}")).collect();
    for name in &names {
        rig.create_claim(rig.claim(name).class(&immediate)).await;
    }
    for name in &names {
        let pv = rig.wait_bound(name).await;
        let on = accessible_node(&pv).expect("the PV names its node");
        assert_ne!(on, NODES[0], "claim {name} went to the node without room");
    }
    assert!(
        nodes[0].ledger(&rig).await.volumes.is_empty(),
        "node A created nothing"
    );
    for name in &names {
        rig.delete_claim(name).await;
    }
    wait_every_volume_gone(&rig, &nodes).await;
    drop(nodes);
    rig.ns.cleanup().await;
}

#[tokio::test]
async fn a_claim_sent_back_by_a_full_node_can_be_deleted() {
    // Node A's driver has no room (ResourceExhausted): A sends the claim back to the
    // scheduler. A claim deleted then must not wait for a cleanup no node would do: the
    // intent went with the selected node, in the same write.
    let (rig, nodes) = three_nodes("node-deployment-full", false).await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::ResourceExhausted,
                count: 1,
                message: Some("injected: node full".into()),
            },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("sent-back").selected_node(NODES[0]))
        .await;
    let claims = rig.claims();
    wait_for("node A to send the claim back", DEADLINE, || async {
        let c = claims.get("sent-back").await.expect("reading the claim");
        let meta = &c.metadata;
        let selected = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned());
        match (selected, &meta.finalizers) {
            (None, f) if !f.iter().flatten().any(|f| f == keys::FINALIZER_PVC_INTENT) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    rig.delete_claim("sent-back").await;
    rig.wait_claim_gone("sent-back").await;
    for node in &nodes {
        assert!(
            node.ledger(&rig).await.volumes.is_empty(),
            "node {} holds no volume",
            node.name
        );
    }
    drop(nodes);
    rig.ns.cleanup().await;
}
