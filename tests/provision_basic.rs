//! Our sidecar's main job, end to end against the real control plane and the
//! fault-injecting test driver: a claim gets one volume and one PV with
//! everything upstream writes; deleting the claim deletes both.

mod support;

use csi_provisioner::keys;
use support::{Rig, k8s_keys};

#[tokio::test]
async fn claim_is_provisioned_bound_and_cleaned_up_after_deletion() {
    let rig = Rig::builder("basic")
        .class(|c| {
            c.param("csi.storage.k8s.io/fstype", "ext4")
                .param("type", "fast")
                .mount_options(&["noatime"])
        })
        .start()
        .await;
    let claim = rig.create_claim(rig.claim("data").size("2Gi")).await;
    let uid = claim.metadata.uid.clone().unwrap();

    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert_eq!(
        pv_name,
        format!("pvc-{uid}"),
        "deterministic name from the claim UID"
    );

    // One volume on the backend, named like the PV, with the class's parameters minus ours.
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "{ledger:?}");
    let vol = ledger
        .volume_by_name(&pv_name)
        .expect("backend volume named after the PV");
    assert_eq!(vol.capacity_bytes, 2 << 30);
    assert_eq!(vol.parameters.get("type").map(String::as_str), Some("fast"));
    assert!(
        !vol.parameters.contains_key("csi.storage.k8s.io/fstype"),
        "sidecar keys are stripped"
    );
    assert_eq!(ledger.call_count("CreateVolume"), 1);

    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get(k8s_keys::PROVISIONED_BY), Some(&rig.driver_name));
    assert_eq!(
        ann.get(keys::ANN_DELETION_SECRET_NAME).map(String::as_str),
        Some("")
    );
    assert!(
        pv.metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|f| f == keys::FINALIZER_PV)
    );
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.unwrap();
    assert_eq!(csi.driver, rig.driver_name);
    assert_eq!(csi.volume_handle, vol.volume_id);
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert!(
        csi.volume_attributes
            .unwrap_or_default()
            .contains_key(keys::ATTR_PROVISIONER_IDENTITY)
    );
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(uid.as_str()));

    // The durable intent is dropped once the PV is saved.
    let claims = rig.claims();
    support::wait_for(
        "the intent finalizer to be dropped",
        support::DEADLINE,
        || async {
            let c = claims.get("data").await.unwrap();
            let f = c.metadata.finalizers.unwrap_or_default();
            if f.iter().any(|f| f == keys::FINALIZER_PVC_INTENT) {
                Err(f)
            } else {
                Ok(())
            }
        },
    )
    .await;
    rig.wait_claim_event(
        "data",
        "Provisioning",
        "External provisioner is provisioning volume",
    )
    .await;
    rig.wait_claim_event("data", "ProvisioningSucceeded", &pv_name)
        .await;

    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    rig.wait_pv_gone(&pv_name).await;
    let ledger = rig.ledger().await;
    assert!(
        ledger.volumes.is_empty(),
        "backend volume deleted: {ledger:?}"
    );
    assert_eq!(ledger.call_count("CreateVolume"), 1, "never created twice");
    rig.cleanup().await;
}

#[tokio::test]
async fn bad_storage_class_parameters_fail_the_claim_without_a_volume() {
    let rig = Rig::builder("badparam")
        .class(|c| c.param("csi.storage.k8s.io/unknown-key", "x"))
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let event = rig
        .wait_claim_event(
            "data",
            "ProvisioningFailed",
            "csi.storage.k8s.io/unknown-key",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some(
            "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/unknown-key\" with reserved namespace csi.storage.k8s.io/"
        ),
        "upstream's text"
    );
    // As upstream, the attempt is announced before it fails validation.
    rig.wait_claim_event(
        "data",
        "Provisioning",
        "External provisioner is provisioning volume",
    )
    .await;
    let ledger = rig.ledger().await;
    assert_eq!(ledger.call_count("CreateVolume"), 0);
    assert!(ledger.volumes.is_empty());
    let claim = rig.claims().get("data").await.unwrap();
    assert!(
        !claim
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == keys::FINALIZER_PVC_INTENT),
        "no intent is recorded for a request that was never sent"
    );
    rig.cleanup().await;
}
