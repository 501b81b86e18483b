//! Topology and rescheduling: the accessibility requirements from the
//! CSINode and Node caches, and what "no room" and a vanished node do with
//! the claim and its intent.

use std::time::Duration;

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::{Value, json};

use super::rig::{PUT_CLAIM, Rig, answer, claim, claim_object, created_pv, post_pv};
use crate::controller::claim::ClaimError;
use crate::controller::claim::decide::fixtures::{ClaimFixture, DRIVER};
use crate::controller::node::Placement;
use crate::controller::scripted::{Reply, Step};
use crate::controller::topology::{self, TopologyCaches};
use crate::csi::DriverCapabilities;
use crate::keys;

#[tokio::test]
async fn resource_exhausted_on_the_selected_node_asks_the_scheduler_again() {
    let c = ClaimFixture::ours().on_node("n1").0;
    let rig = exhausted_rig(vec![
        (PUT_CLAIM, answer(&c, "8")),
        // The reschedule: the selected node goes.
        (PUT_CLAIM, claim_object(&c)),
    ])
    .await;
    assert!(rig.provision(&c).await.is_err());
    rig.assert_script_done();
    // An update of the claim as the intent write answered it, the selected node gone.
    let sent = rig.body(1);
    assert_eq!(sent["metadata"]["resourceVersion"], "8", "{sent}");
    assert!(!selects_a_node(&sent), "{sent}");
    // The driver said no volume of that name exists: the intent goes with it,
    // so no node is left holding a claim it could not clean up.
    assert!(!holds_intent(&sent), "{sent}");
}

/// Whether a claim sent in an update still names a selected node.
fn selects_a_node(sent: &Value) -> bool {
    sent["metadata"]["annotations"]
        .as_object()
        .is_some_and(|a| a.contains_key(keys::ANN_SELECTED_NODE))
}

/// Whether a claim sent in an update holds the intent.
fn holds_intent(sent: &Value) -> bool {
    sent["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_PVC_INTENT))
}

/// The accessibility capability of a driver that reports topology.
fn topology_caps() -> DriverCapabilities {
    DriverCapabilities {
        controller_service: true,
        create_delete_volume: true,
        accessibility_constraints: true,
        ..Default::default()
    }
}

/// A cluster in the topology caches: two key sets (zone; zone and rack), a
/// node whose driver registered nothing, a node without a CSINode.
fn zoned_caches() -> TopologyCaches {
    topology::filled(
        DRIVER,
        &[
            ("n1", Some(&["zone"]), Some(&[("zone", "a")])),
            ("n2", Some(&["zone"]), Some(&[("zone", "b")])),
            (
                "n3",
                Some(&["zone", "rack"]),
                Some(&[("zone", "b"), ("rack", "7")]),
            ),
            ("n4", Some(&[]), Some(&[("zone", "c")])),
            ("n5", None, Some(&[("zone", "d")])),
        ],
    )
}

/// A rig whose driver reports topology, with [`zoned_caches`].
async fn topology_rig(steps: Vec<Step>) -> Rig {
    let mut rig = Rig::new(steps, topology_caps()).await;
    rig.ctx_mut().caches.topology = Some(zoned_caches());
    rig
}

/// `ResourceExhausted` once, from a driver that reports topology.
async fn exhausted_rig(steps: Vec<Step>) -> Rig {
    let rig = topology_rig(steps).await;
    rig.driver
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::ResourceExhausted,
                count: 1,
                message: None,
            },
        )
        .await
        .unwrap();
    rig
}

/// The requisite and preferred topologies of the driver's last `CreateVolume`.
async fn sent_topology(rig: &Rig) -> (Vec<Value>, Vec<Value>) {
    let ledger = rig.driver.ledger().await.unwrap();
    let last = ledger
        .operations
        .iter()
        .rev()
        .find(|o| o.method == "CreateVolume")
        .expect("a CreateVolume");
    let json = |t: &[std::collections::BTreeMap<String, String>]| {
        t.iter().map(|s| json!(s)).collect::<Vec<_>>()
    };
    (json(&last.requisite), json(&last.preferred))
}

/// Provisions `c` on the topology rig, checks that the intent and the PV were
/// the only requests, and returns the topology sent to the driver.
async fn provisioned_from_caches(c: &PersistentVolumeClaim) -> (Vec<Value>, Vec<Value>) {
    let rig = topology_rig(vec![(PUT_CLAIM, answer(c, "8")), (post_pv(), created_pv())]).await;
    rig.provision(c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(
        rig.seen(),
        [PUT_CLAIM, post_pv()],
        "the intent and the PV only"
    );
    sent_topology(&rig).await
}

#[tokio::test]
async fn a_topology_claim_costs_no_csinode_or_node_request() {
    // WaitForFirstConsumer: the selected node's keys and labels, and its key
    // set aggregated, all from the caches.
    let c = ClaimFixture::ours().on_node("n2").0;
    let (requisite, preferred) = provisioned_from_caches(&c).await;
    assert_eq!(requisite, [json!({"zone": "a"}), json!({"zone": "b"})]);
    assert_eq!(
        preferred[0],
        json!({"zone": "b"}),
        "the selected node first"
    );

    // Immediate, with two key sets registered: each aggregated from the caches.
    let c = claim();
    let (requisite, _) = provisioned_from_caches(&c).await;
    assert_eq!(
        requisite,
        [
            json!({"zone": "a"}),
            json!({"zone": "b"}),
            json!({"rack": "7", "zone": "b"})
        ]
    );
}

#[tokio::test]
async fn a_selected_node_the_caches_show_without_its_labels_is_retried_without_a_request() {
    // Its CSINode is in, its Node not yet (or not labelled yet): upstream's
    // lister answers the same, and the claim is tried again later.
    let c = ClaimFixture::ours().on_node("n9").0;
    let mut rig = Rig::new(Vec::new(), topology_caps()).await;
    rig.ctx_mut().caches.topology =
        Some(topology::filled(DRIVER, &[("n9", Some(&["zone"]), None)]));
    let r = rig.provision(&c).await;
    assert!(matches!(r, Err(ClaimError::Invalid(_))), "{r:?}");
    rig.assert_script_done();
    assert!(rig.seen().is_empty(), "{:?}", rig.seen());
    assert_eq!(rig.backend().await, (0, 0, 0));
}

#[tokio::test]
async fn no_room_after_an_earlier_attempt_sends_the_claim_back_with_its_intent() {
    // The intent was on the claim before: an earlier CreateVolume may have made
    // the volume (DEADLINE_EXCEEDED, then made). One driver serves every node,
    // so the claim may go back to the scheduler, but the intent stays.
    let c = ClaimFixture::ours().on_node("n1").intent().0;
    let rig = exhausted_rig(vec![
        (PUT_CLAIM, answer(&c, "7")),
        (PUT_CLAIM, claim_object(&c)),
    ])
    .await;
    assert!(rig.provision(&c).await.is_err());
    rig.assert_script_done();
    let sent = rig.body(1);
    assert!(!selects_a_node(&sent), "{sent}");
    assert!(holds_intent(&sent), "the intent stays: {sent}");
}

#[tokio::test]
async fn in_a_node_deployment_no_room_after_an_earlier_attempt_keeps_the_claim_here() {
    // Found by the node-deployment soak: a create answered DEADLINE_EXCEEDED
    // (and made), then ResourceExhausted; the node gave the claim back, another
    // node made a second volume, and the first leaked. Only this node could
    // find that volume: it keeps the claim and retries.
    let c = ClaimFixture::ours().on_node("n1").intent().0;
    let mut rig = exhausted_rig(vec![(PUT_CLAIM, answer(&c, "7"))]).await;
    rig.shared_mut().place = Placement::Node(crate::controller::node::NodeMode {
        name: "n1".into(),
        topology: Some([("zone".to_string(), "a".to_string())].into()),
        immediate_binding: true,
        max_delay: Duration::from_secs(2),
        base_delay: Duration::from_secs(1),
    });
    assert!(rig.provision(&c).await.is_err());
    rig.assert_script_done();
    assert_eq!(rig.seen(), [PUT_CLAIM], "no write sends it back");
}

#[tokio::test]
async fn a_vanished_node_sends_the_claim_back_and_keeps_an_earlier_intent() {
    // An earlier attempt recorded the intent (its volume may exist); now the
    // selected node's CSINode is gone. Nothing is asked of the driver, so
    // nothing proves the volume absent: only the selected node goes.
    let c = ClaimFixture::ours().on_node("n5").intent().0;
    // n5 has a Node but no CSINode in the caches; the API server confirms it.
    let rig = topology_rig(vec![
        ("GET csinodes/n5", Reply::Status(404)),
        (PUT_CLAIM, claim_object(&c)),
    ])
    .await;
    assert!(rig.provision(&c).await.is_err());
    rig.assert_script_done();
    let sent = rig.body(1);
    assert!(!selects_a_node(&sent), "{sent}");
    assert!(holds_intent(&sent), "the intent stays: {sent}");
    assert_eq!(rig.backend().await.1, 0);
}

#[tokio::test]
async fn a_csinode_the_cache_has_not_brought_yet_is_waited_for_not_rescheduled() {
    // Created a moment ago: the API server has it, the watch not yet.
    let c = ClaimFixture::ours().on_node("n5").0;
    let csinode = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "n5"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "n5", "topologyKeys": ["zone"]}]}});
    let rig = topology_rig(vec![("GET csinodes/n5", Reply::Object(csinode))]).await;
    let r = rig.provision(&c).await;
    assert!(matches!(r, Err(ClaimError::Invalid(_))), "{r:?}");
    rig.assert_script_done();
    assert_eq!(rig.seen(), ["GET csinodes/n5"], "no reschedule, no intent");
    assert_eq!(rig.backend().await, (0, 0, 0));
}
