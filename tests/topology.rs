//! Topology: for a driver with VOLUME_ACCESSIBILITY_CONSTRAINTS, the request
//! carries the selected node's (or the cluster's) topology, the PV gets the
//! volume's node affinity, and a selected node without a CSINode is handed
//! back to the scheduler.

mod support;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use support::{DEADLINE, Rig, Sidecar, StorageClassFixture, k8s_keys, unique_name, wait_for};

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

/// upstream #1589 / PR #1582: nodes that register different topology key sets
/// (region on some, region and zone on others) give every Immediate claim the
/// same requisite, with every key set's terms, whatever order the API server
/// lists CSINodes and Nodes in; the same again after a restart.
#[tokio::test]
async fn immediate_topology_is_the_same_for_every_claim_and_across_restarts() {
    // Keys of this test alone: other tests' nodes share the control plane.
    let prefix = unique_name("keys");
    let region = format!("{prefix}.test/region");
    let zone = format!("{prefix}.test/zone");
    let mut rig = Rig::builder("topo-keys")
        .driver(|d| d.topology = Some((region.clone(), "r1".to_string())))
        .start()
        .await;
    let (r, z) = (region.as_str(), zone.as_str());
    let nodes = vec![
        rig.node_with(&[r], &[(r, "r1")]).await,
        rig.node_with(&[z, r], &[(r, "r1"), (z, "a")]).await,
        rig.node_with(&[r, z], &[(r, "r2"), (z, "b")]).await,
        rig.node_with(&[r], &[(r, "r2")]).await,
    ];
    let claims = ["www-web-0", "www-web-1", "www-web-2", "www-web-3"];
    for claim in claims {
        rig.create_claim(rig.claim(claim)).await;
    }
    let mut first = std::collections::BTreeMap::new();
    for claim in claims {
        let pv = rig.wait_bound(claim).await;
        first.insert(claim, requirements_of(&rig, &pv).await);
    }
    let term = |pairs: &[(&str, &str)]| -> Term {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let everywhere = vec![
        term(&[(r, "r1")]),
        term(&[(r, "r2")]),
        term(&[(r, "r1"), (z, "a")]),
        term(&[(r, "r2"), (z, "b")]),
    ];
    for (claim, (requisite, preferred)) in &first {
        assert_eq!(requisite, &everywhere, "{claim}: every key set's terms");
        let mut sorted = preferred.clone();
        sorted.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
        assert_eq!(
            sorted, everywhere,
            "{claim}: preferred is the requisite rotated"
        );
    }
    let leading: std::collections::BTreeSet<_> =
        first.values().map(|(_, p)| p[0].clone()).collect();
    assert_eq!(
        leading.len(),
        4,
        "StatefulSet ordinals spread over the terms: {first:?}"
    );

    // After a restart the same claim (a new object of the same name) is given
    // the same topology.
    rig.delete_claim("www-web-1").await;
    rig.wait_claim_gone("www-web-1").await;
    rig.kill_sidecar();
    rig.start_sidecar();
    rig.create_claim(rig.claim("www-web-1")).await;
    let pv = rig.wait_bound("www-web-1").await;
    assert_eq!(requirements_of(&rig, &pv).await, first["www-web-1"]);

    for node in nodes {
        rig.remove_node(&node).await;
    }
    rig.cleanup().await;
}

type Term = std::collections::BTreeMap<String, String>;

/// The (requisite, preferred) of the successful `CreateVolume` of `pv`.
async fn requirements_of(
    rig: &Rig,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
) -> (Vec<Term>, Vec<Term>) {
    let name = pv.metadata.name.clone().unwrap();
    let ledger = rig.ledger().await;
    let op = ledger
        .operations_of("CreateVolume")
        .filter(|op| op.name.as_deref() == Some(&name) && op.volume_id.is_some())
        .last()
        .unwrap_or_else(|| panic!("no CreateVolume of {name}"))
        .clone();
    (op.requisite, op.preferred)
}

/// Each claim's (requisite, preferred), the run's key prefix replaced by `P` and node names by
/// the role they play, so that two runs (two drivers, two sets of nodes) compare.
type Seen = std::collections::BTreeMap<String, (Vec<Term>, Vec<Term>)>;

/// The cases upstream v6.4 changed (#1582) on one cluster: nodes registering two key sets, a node
/// carrying the labels whose driver registered no keys yet, a node carrying them where the driver
/// is not, a node registering fewer keys than it carries labels; Immediate and
/// WaitForFirstConsumer claims, strict topology off, then on after a restart, and a claim made
/// again after it.
async fn topology_cases(who: Sidecar) -> Seen {
    let prefix = unique_name("v64");
    let region = format!("{prefix}.test/region");
    let zone = format!("{prefix}.test/zone");
    let (r, z) = (region.as_str(), zone.as_str());
    let mut rig = Rig::builder("topo-v64")
        .driver(|d| d.topology = Some((region.clone(), "r1".to_string())))
        .start_for(who)
        .await;
    let a = rig.node_with(&[r], &[(r, "r1")]).await;
    let b = rig.node_with(&[z, r], &[(r, "r1"), (z, "a")]).await;
    let c = rig.node_with(&[r, z], &[(r, "r2"), (z, "b")]).await;
    let unregistered = rig.node_with(&[], &[(r, "r3"), (z, "c")]).await;
    let elsewhere = rig.node_without_driver(&[(r, "r4"), (z, "d")]).await;
    let coarse = rig.node_with(&[r], &[(r, "r5"), (z, "e")]).await;
    let late = unique_name("late");
    Api::<StorageClass>::all(rig.client.clone())
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&late, &rig.driver_name)
                .reclaim("Delete")
                .binding_mode("WaitForFirstConsumer")
                .build(),
        )
        .await
        .expect("creating the WaitForFirstConsumer class");
    let mut seen = Seen::new();
    let mut record = async |rig: &Rig, claim: &str| {
        let pv = rig.wait_bound(claim).await;
        let (requisite, preferred) = requirements_of(rig, &pv).await;
        let norm = |terms: Vec<Term>| -> Vec<Term> {
            terms
                .into_iter()
                .map(|t| {
                    t.into_iter()
                        .map(|(k, v)| (k.replace(&prefix, "P"), v))
                        .collect()
                })
                .collect()
        };
        seen.insert(claim.to_string(), (norm(requisite), norm(preferred)));
    };

    let mut upstream = rig.start_as(who, &[]);
    for (claim, node) in [
        ("www-web-0", None),
        ("www-web-1", None),
        ("late-b", Some(&b)),
        ("late-a", Some(&a)),
    ] {
        let fixture = match node {
            Some(node) => rig.claim(claim).class(&late).selected_node(node),
            None => rig.claim(claim),
        };
        rig.create_claim(fixture).await;
        record(&rig, claim).await;
    }

    // A restart with --strict-topology; a claim made again gets what it got before.
    rig.delete_claim("www-web-0").await;
    rig.wait_claim_gone("www-web-0").await;
    rig.kill_sidecar();
    drop(upstream.take());
    upstream = rig.start_as(who, &["--strict-topology"]);
    for (claim, node) in [
        ("www-web-0", None),
        ("www-web-2", None),
        ("strict-b", Some(&b)),
    ] {
        let fixture = match node {
            Some(node) => rig.claim(claim).class(&late).selected_node(node),
            None => rig.claim(claim),
        };
        rig.create_claim(fixture).await;
        record(&rig, claim).await;
    }
    drop(upstream);
    for node in [a, b, c, unregistered, elsewhere, coarse] {
        rig.remove_node(&node).await;
    }
    let _ = Api::<StorageClass>::all(rig.client.clone())
        .delete(&late, &Default::default())
        .await;
    rig.cleanup().await;
    seen
}

#[tokio::test]
async fn topology_requirements_are_upstream_v6_4s_on_the_same_cluster() {
    let ours = topology_cases(Sidecar::Ours).await;
    let upstream = topology_cases(Sidecar::Upstream).await;
    let term = |pairs: &[(&str, &str)]| -> Term {
        pairs
            .iter()
            .map(|(k, v)| (format!("P.test/{k}"), v.to_string()))
            .collect()
    };
    // Every key set, each from the nodes whose driver registered it (a finer registration covers
    // a coarser set); not the node whose driver registered nothing, nor the one without the
    // driver, nor the zone of the node that registered only its region.
    let immediate = vec![
        term(&[("region", "r1")]),
        term(&[("region", "r2")]),
        term(&[("region", "r5")]),
        term(&[("region", "r1"), ("zone", "a")]),
        term(&[("region", "r2"), ("zone", "b")]),
    ];
    assert_eq!(ours["www-web-0"].0, immediate, "{ours:?}");
    // The selected node's keys, across the nodes that registered them; its own term first.
    let late_b = vec![
        term(&[("region", "r1"), ("zone", "a")]),
        term(&[("region", "r2"), ("zone", "b")]),
    ];
    assert_eq!(ours["late-b"], (late_b.clone(), late_b), "{ours:?}");
    assert_eq!(
        ours["late-a"].0,
        vec![
            term(&[("region", "r1")]),
            term(&[("region", "r2")]),
            term(&[("region", "r5")])
        ],
        "{ours:?}"
    );
    let strict_b = vec![term(&[("region", "r1"), ("zone", "a")])];
    assert_eq!(ours["strict-b"], (strict_b.clone(), strict_b), "{ours:?}");
    assert_eq!(
        ours["www-web-2"].0, immediate,
        "strict topology leaves Immediate as it was"
    );
    // And all of it is what upstream v6.4 sends, claim by claim (preferred included: the same
    // rotation by StatefulSet ordinal, the same selected node first), before and after the
    // restart.
    assert_eq!(ours, upstream, "ours (left) and upstream v6.4 (right)");
}
