//! The intent made by the control plane's own writes, on the real control plane:
//! deploy/kubernetes/provisioning-intent-policy.yaml adds our intent inside
//! kube-controller-manager's hand-over update (or the CREATE of a claim made
//! already annotated), release-intent-policy.yaml drops it inside the binder's
//! update, and the sidecar with `--admission-intent` writes nothing to a claim
//! it provisions. And where the policy does not act — not installed, another
//! driver's claim, a claim handed over before it was installed — the sidecar's
//! own fenced write still makes the intent first.
//!
//! The policies are cluster-scoped; here each binding is narrowed to the test's
//! namespace, so the tests sharing the control plane keep the default path.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use csi_provisioner::keys;
use csi_test_driver::control::Fault;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams, WatchParams};
use support::policies::{OUR_MANAGER, holds_intent, install, uninstall};
use support::{DEADLINE, Rig, wait_for};

/// What every version of the rig's claims showed, from a watch started
/// before they are created: per claim, whether some version held the intent
/// before its first bound version, and every manager in managedFields.
#[derive(Default, Debug)]
struct History {
    intent_before_bound: BTreeMap<String, bool>,
    /// The value of the label the policy puts on with the intent, per claim, before it was bound.
    label_before_bound: BTreeMap<String, String>,
    managers: BTreeSet<String>,
}

async fn record(claims: Api<PersistentVolumeClaim>, until_bound: usize) -> History {
    let mut history = History::default();
    let mut bound = BTreeSet::new();
    let mut events = claims
        .watch(&WatchParams::default().timeout(120), "0")
        .await
        .unwrap()
        .boxed();
    while bound.len() < until_bound {
        let Some(event) = events.try_next().await.unwrap() else {
            break;
        };
        let c = match event {
            kube::api::WatchEvent::Added(c) | kube::api::WatchEvent::Modified(c) => c,
            _ => continue,
        };
        let name = c.metadata.name.clone().unwrap();
        if name.starts_with("probe-") {
            continue;
        }
        for m in c.metadata.managed_fields.iter().flatten() {
            history
                .managers
                .insert(m.manager.clone().unwrap_or_default());
        }
        let is_bound = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .is_some();
        let seen = history.intent_before_bound.entry(name.clone()).or_default();
        if !bound.contains(&name) {
            *seen |= holds_intent(&c);
            if let Some(v) = c
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::LABEL_PROVISIONING))
            {
                history.label_before_bound.insert(name.clone(), v.clone());
            }
        }
        if is_bound {
            bound.insert(name);
        }
    }
    history
}

#[tokio::test]
async fn the_control_plane_makes_the_intent_and_the_sidecar_changes_nothing_on_the_claims() {
    let rig = Rig::builder("intpol")
        .sidecar_args(&["--admission-intent"])
        .start()
        .await;
    let installed = install(
        &rig,
        &[
            "provisioning-intent-policy.yaml",
            "release-intent-policy.yaml",
        ],
    )
    .await;

    let watch = tokio::spawn(record(rig.claims(), 5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        rig.create_claim(rig.claim(&format!("data-{i}"))).await;
    }
    for i in 0..5 {
        rig.wait_bound(&format!("data-{i}")).await;
    }
    let history = watch.await.unwrap();
    assert_eq!(history.intent_before_bound.len(), 5, "{history:?}");
    assert!(
        history.intent_before_bound.values().all(|held| *held),
        "every claim held the intent before it was bound: {history:?}"
    );
    assert!(
        !history.managers.iter().any(|m| m.starts_with(OUR_MANAGER)),
        "the sidecar wrote to a claim: managers {:?}",
        history.managers
    );
    assert!(history.managers.contains("kube-controller-manager"));
    // With the intent came the label that lists the claims pending for the driver.
    assert_eq!(history.label_before_bound.len(), 5, "{history:?}");
    assert!(
        history
            .label_before_bound
            .values()
            .all(|v| *v == rig.driver_name),
        "{history:?}"
    );
    // The binder's update dropped the intents, and the labels with them.
    let claims = rig.claims();
    for i in 0..5 {
        let c = claims.get(&format!("data-{i}")).await.unwrap();
        assert!(!holds_intent(&c), "data-{i}: {:?}", c.metadata.finalizers);
        let labels = c.metadata.labels.unwrap_or_default();
        assert!(
            !labels.contains_key(keys::LABEL_PROVISIONING),
            "data-{i}: {labels:?}"
        );
    }
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 5, "one volume each: {ledger:#?}");

    for i in 0..5 {
        rig.delete_claim(&format!("data-{i}")).await;
    }
    wait_for("every volume to go", DEADLINE, || async {
        let left = rig.ledger().await.volumes.len();
        if left == 0 { Ok(()) } else { Err(left) }
    })
    .await;
    uninstall(&rig, &installed).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_wait_for_first_consumer_claim_gets_the_intent_only_once_a_node_is_chosen() {
    let rig = Rig::builder("intpol-wffc")
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(&["--admission-intent"])
        .start()
        .await;
    let installed = install(&rig, &["provisioning-intent-policy.yaml"]).await;
    let node = rig
        .node_in_zone("topology.intpol.example.com/zone", "a")
        .await;

    rig.create_claim(rig.claim("late")).await;
    // No node yet: not handed over, no intent (upstream's binder waits too).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = rig.claims().get("late").await.unwrap();
    assert!(!holds_intent(&c), "{:?}", c.metadata.finalizers);
    assert!(
        !c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(keys::ANN_STORAGE_PROVISIONER)
    );

    // Playing the scheduler: the binder hands the claim over, the policy
    // adds the intent in that very update.
    let mut c = rig.claims().get("late").await.unwrap();
    c.metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::ANN_SELECTED_NODE.into(), node);
    rig.claims()
        .replace("late", &PostParams::default(), &c)
        .await
        .unwrap();
    let pv = rig.wait_bound("late").await;
    assert!(pv.metadata.name.is_some());
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1);
    rig.delete_claim("late").await;
    rig.wait_claim_gone("late").await;
    uninstall(&rig, &installed).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn where_the_policy_does_not_act_the_sidecar_writes_the_intent_itself() {
    let rig = Rig::builder("intpol-off")
        .sidecar_args(&["--admission-intent"])
        .without_sidecar()
        .start()
        .await;
    // Claims handed over before the policy is installed: no intent from it.
    rig.create_claim(rig.claim("before")).await;
    support::wait_for("the hand-over", DEADLINE, || async {
        let c = rig.claims().get("before").await.unwrap();
        if c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(keys::ANN_STORAGE_PROVISIONER)
        {
            Ok(())
        } else {
            Err("not yet")
        }
    })
    .await;
    let installed = install(&rig, &["provisioning-intent-policy.yaml"]).await;
    // Another driver's claim: the policy leaves it alone.
    let other = rig
        .claims()
        .create(
            &PostParams::default(),
            &rig.claim("other")
                .class("")
                .annotation(
                    keys::ANN_STORAGE_PROVISIONER,
                    "someone-else.csi.example.com",
                )
                .build(),
        )
        .await
        .unwrap();
    assert!(!holds_intent(&other));

    // A slow CreateVolume shows the intent is there before the call: the
    // sidecar's own fenced write made it.
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let mut rig = rig;
    rig.start_sidecar();
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    let c = rig.claims().get("before").await.unwrap();
    assert!(holds_intent(&c), "the fenced write made the intent first");
    let managers: Vec<String> = c
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m.starts_with(OUR_MANAGER)),
        "written by the sidecar: {managers:?}"
    );
    rig.control.release("CreateVolume").await.unwrap();
    rig.wait_bound("before").await;
    rig.delete_claim("before").await;
    rig.wait_claim_gone("before").await;
    // The other driver's claim has nothing of ours: it can go.
    rig.delete_claim("other").await;
    rig.wait_claim_gone("other").await;
    uninstall(&rig, &installed).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_volume_is_made_is_cleaned_up_and_one_re_created_under_its_name_is_new()
 {
    let rig = Rig::builder("intpol-del")
        .sidecar_args(&["--admission-intent", "--timeout=2s"])
        .start()
        .await;
    let installed = install(
        &rig,
        &[
            "provisioning-intent-policy.yaml",
            "release-intent-policy.yaml",
        ],
    )
    .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.create_claim(rig.claim("gone")).await;
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    // Deleted mid-call; the volume is made after the sidecar gave up on it.
    rig.delete_claim("gone").await;
    rig.control.release("CreateVolume").await.unwrap();
    rig.wait_claim_gone("gone").await;
    wait_for("the abandoned volume to go", DEADLINE, || async {
        let l = rig.ledger().await;
        if l.volumes.is_empty() {
            Ok(())
        } else {
            Err(l.volumes.len())
        }
    })
    .await;
    let created = rig
        .ledger()
        .await
        .operations_of("CreateVolume")
        .filter(|op| op.created)
        .count();
    assert!(created <= 1, "one volume at most was made");
    // Re-created under the same name: a new claim (UID), handed over anew,
    // gets the intent again and a volume of its own name.
    let again = rig.create_claim(rig.claim("gone")).await;
    let pv = rig.wait_bound("gone").await;
    assert_eq!(
        pv.metadata.name,
        Some(format!("pvc-{}", again.metadata.uid.unwrap())),
        "the PV is the new claim's"
    );
    assert_eq!(
        rig.ledger().await.volumes.len(),
        1,
        "only the new claim's volume"
    );
    rig.delete_claim("gone").await;
    rig.wait_claim_gone("gone").await;
    uninstall(&rig, &installed).await;
    rig.cleanup().await;
}
