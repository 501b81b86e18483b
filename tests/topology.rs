//! Topology: for a driver with VOLUME_ACCESSIBILITY_CONSTRAINTS, the request
//! carries the selected node's (or the cluster's) topology, the PV gets the
//! volume's node affinity, and a selected node without a CSINode is handed
//! back to the scheduler.

mod support;

use support::{DEADLINE, Rig, k8s_keys, unique_name, wait_for};

const ZONE: &str = "topology.test.example.com/zone";

fn affinity_zones(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Vec<String> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
                .filter(|e| e.key == ZONE)
                .flat_map(|e| e.values.unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn late_binding_claim_gets_its_selected_nodes_topology() {
    let rig = Rig::builder("topo")
        .driver(|d| d.topology = Some((ZONE.to_string(), "zone-a".to_string())))
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .start()
        .await;
    let good = rig.node_in_zone(ZONE, "zone-a").await;
    let elsewhere = rig.node_in_zone(ZONE, "zone-b").await;

    rig.create_claim(rig.claim("here").selected_node(&good))
        .await;
    let pv = rig.wait_bound("here").await;
    assert_eq!(
        affinity_zones(&pv),
        vec!["zone-a"],
        "PV follows the volume's accessible topology"
    );

    // Without --strict-topology the requisite is every zone of the cluster
    // with the selected node's zone preferred (upstream semantics): a zone-a
    // driver can still serve a claim scheduled to a zone-b node.
    rig.create_claim(rig.claim("there").selected_node(&elsewhere))
        .await;
    let pv = rig.wait_bound("there").await;
    assert_eq!(affinity_zones(&pv), vec!["zone-a"]);
    rig.remove_node(&good).await;
    rig.remove_node(&elsewhere).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn strict_topology_sends_only_the_selected_node_and_reschedules_when_it_cannot_be_served() {
    let rig = Rig::builder("topo-strict")
        .driver(|d| d.topology = Some((ZONE.to_string(), "zone-a".to_string())))
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(&["--strict-topology"])
        .start()
        .await;
    let elsewhere = rig.node_in_zone(ZONE, "zone-b").await;
    // The driver (zone-a only) cannot serve a zone-b node: the requisite is
    // that node's topology alone, so it answers ResourceExhausted and the
    // claim goes back to the scheduler.
    rig.create_claim(rig.claim("there").selected_node(&elsewhere))
        .await;
    let claims = rig.claims();
    wait_for(
        "selected-node removed after ResourceExhausted",
        DEADLINE,
        || async {
            let c = claims.get("there").await.expect("reading the claim");
            let ann = c.metadata.annotations.unwrap_or_default();
            if ann.contains_key(k8s_keys::SELECTED_NODE) {
                Err(ann)
            } else {
                Ok(())
            }
        },
    )
    .await;
    let ledger = rig.ledger().await;
    assert!(
        ledger.volumes.is_empty(),
        "no volume for the unreachable zone"
    );
    assert!(ledger.call_count("CreateVolume") >= 1);
    rig.remove_node(&elsewhere).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn selected_node_without_csinode_is_rescheduled() {
    let rig = Rig::builder("topo-gone")
        .driver(|d| d.topology = Some((ZONE.to_string(), "zone-a".to_string())))
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .start()
        .await;
    rig.create_claim(
        rig.claim("data")
            .selected_node(&unique_name("no-such-node")),
    )
    .await;
    let claims = rig.claims();
    wait_for("selected-node removed", DEADLINE, || async {
        let c = claims.get("data").await.expect("reading the claim");
        let ann = c.metadata.annotations.unwrap_or_default();
        if ann.contains_key(k8s_keys::SELECTED_NODE) {
            Err(ann)
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(
        rig.ledger().await.call_count("CreateVolume"),
        0,
        "never called without a topology"
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn immediate_claim_with_allowed_topologies_is_provisioned_in_them() {
    let rig = Rig::builder("topo-imm")
        .driver(|d| d.topology = Some((ZONE.to_string(), "zone-a".to_string())))
        .class(|c| c.allowed_topology(ZONE, &["zone-a", "zone-c"]))
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    assert_eq!(affinity_zones(&pv), vec!["zone-a"]);
    rig.cleanup().await;
}
