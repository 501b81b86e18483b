//! VolumeAttributesClass (feature gate GA, on by default): a claim that names
//! one gets the class's parameters as `CreateVolume`'s mutable parameters and
//! a PV that names the class; a class for another driver, a missing class or
//! a driver without MODIFY_VOLUME gives a `ProvisioningFailed` event and no
//! backend volume, as upstream.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::api::{Api, DeleteParams, PostParams};
use kube::core::ObjectMeta;
use support::{DEADLINE, Rig, unique_name, wait_for};

/// Creates a cluster-scoped VolumeAttributesClass (named uniquely unless `name` is given)
/// and returns its name.
async fn create_vac(
    rig: &Rig,
    name: Option<&str>,
    driver: &str,
    params: &[(&str, &str)],
) -> String {
    let name = name.map_or_else(|| unique_name("vac"), str::to_string);
    let vac = VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        driver_name: driver.to_string(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
    };
    Api::<VolumeAttributesClass>::all(rig.client.clone())
        .create(&PostParams::default(), &vac)
        .await
        .expect("creating the VolumeAttributesClass");
    name
}

async fn delete_vac(rig: &Rig, name: &str) {
    let _ = Api::<VolumeAttributesClass>::all(rig.client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn class_parameters_become_mutable_parameters_and_the_pv_names_the_class() {
    let rig = Rig::builder("vac-ok")
        .driver(|d| d.capabilities = vec!["+MODIFY_VOLUME".into()])
        .start()
        .await;
    let vac = create_vac(&rig, None, &rig.driver_name.clone(), &[("iops", "3000")]).await;
    rig.create_claim(rig.claim("data").attributes_class(&vac))
        .await;
    let pv = rig.wait_bound("data").await;
    assert_eq!(
        pv.spec
            .as_ref()
            .unwrap()
            .volume_attributes_class_name
            .as_deref(),
        Some(vac.as_str())
    );
    let ledger = rig.ledger().await;
    let volume = ledger
        .volume_by_name(pv.metadata.name.as_deref().unwrap())
        .expect("the backend volume");
    assert_eq!(
        volume.mutable_parameters,
        BTreeMap::from([("iops".to_string(), "3000".to_string())])
    );
    assert!(
        volume.parameters.is_empty(),
        "mutable parameters are not mixed into the class's parameters: {:?}",
        volume.parameters
    );
    delete_vac(&rig, &vac).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn unusable_classes_fail_the_claim_and_create_nothing() {
    let rig = Rig::builder("vac-bad")
        .driver(|d| d.capabilities = vec!["+MODIFY_VOLUME".into()])
        .start()
        .await;
    let foreign = create_vac(&rig, None, "other.csi.example.com", &[("iops", "1")]).await;
    rig.create_claim(rig.claim("foreign").attributes_class(&foreign))
        .await;
    let missing = unique_name("vac-missing");
    rig.create_claim(rig.claim("missing").attributes_class(&missing))
        .await;
    rig.wait_claim_event(
        "foreign",
        "ProvisioningFailed",
        &format!(
            "VAC {foreign} referenced in PVC is for driver other.csi.example.com which does not match driver name {}",
            rig.driver_name
        ),
    )
    .await;
    rig.wait_claim_event("missing", "ProvisioningFailed", &missing)
        .await;
    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.call_count("CreateVolume"),
        0,
        "{:?}",
        ledger.operations
    );

    // Once the missing class exists, the retries provision that claim.
    create_vac(
        &rig,
        Some(&missing),
        &rig.driver_name.clone(),
        &[("tier", "gold")],
    )
    .await;
    let pv = rig.wait_bound("missing").await;
    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.call_count("CreateVolume"),
        1,
        "only the claim with a usable class reached the driver: {:?}",
        ledger.operations
    );
    let volume = ledger
        .volume_by_name(pv.metadata.name.as_deref().unwrap())
        .expect("the backend volume");
    assert_eq!(volume.mutable_parameters["tier"], "gold");
    let claim = rig.claims().get("foreign").await.unwrap();
    assert!(
        claim.spec.unwrap().volume_name.is_none(),
        "the claim of a foreign class stays unbound"
    );
    delete_vac(&rig, &foreign).await;
    delete_vac(&rig, &missing).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_driver_without_modify_volume_is_told_so() {
    let rig = Rig::builder("vac-nocap").start().await;
    let vac = create_vac(&rig, None, &rig.driver_name.clone(), &[("iops", "3000")]).await;
    rig.create_claim(rig.claim("data").attributes_class(&vac))
        .await;
    rig.wait_claim_event(
        "data",
        "ProvisioningFailed",
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported",
    )
    .await;
    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.call_count("CreateVolume"),
        0,
        "{:?}",
        ledger.operations
    );
    delete_vac(&rig, &vac).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn with_the_gate_off_the_class_is_not_read_as_upstream() {
    let rig = Rig::builder("vac-off")
        .sidecar_args(&["--feature-gates=VolumeAttributesClass=false"])
        .start()
        .await;
    let claim = rig
        .create_claim(rig.claim("data").attributes_class("whatever"))
        .await;
    // The PV names no class, so kube-controller-manager (gate on) will not
    // bind it to this claim; upstream with the gate off does the same.
    let pv_name = format!("pvc-{}", claim.metadata.uid.unwrap());
    let pv = wait_for("the PV of the claim", DEADLINE, || async {
        rig.volumes()
            .get_opt(&pv_name)
            .await
            .unwrap()
            .ok_or("no PV yet")
    })
    .await;
    assert_eq!(pv.spec.unwrap().volume_attributes_class_name, None);
    let ledger = rig.ledger().await;
    let volume = ledger.volumes.values().next().expect("one volume");
    assert!(volume.mutable_parameters.is_empty());
    rig.cleanup().await;
}
