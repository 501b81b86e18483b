//! Claims with a data source, end to end. A kind the provisioner does not fill itself belongs to
//! a volume populator: upstream notes that on the claim and leaves it alone, with no
//! `CreateVolume` and (ours) no intent. The data-source checks that come before anything else
//! give upstream's errors.

mod support;

use std::time::Duration;

use csi_provisioner::keys;
use k8s_openapi::api::core::v1::TypedObjectReference;
use support::Rig;

#[tokio::test]
async fn a_populators_claim_gets_upstreams_note_and_no_volume() {
    let rig = Rig::builder("populator").start().await;
    let mut fixture = rig.claim("restored").build();
    fixture.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
        api_group: Some("backup.example.com".into()),
        kind: "Restore".into(),
        name: "nightly".into(),
        namespace: None,
    });
    rig.claims()
        .create(&Default::default(), &fixture)
        .await
        .expect("creating the claim");

    let note = rig
        .wait_claim_event(
            "restored",
            "Provisioning",
            "Assuming an external populator will provision the volume",
        )
        .await;
    assert_eq!(note.type_.as_deref(), Some("Normal"));
    // Upstream records this note as its provisioner, not as its controller library.
    let source = note.source.clone().unwrap_or_default();
    assert_eq!(source.component.as_deref(), Some("external-provisioner"));
    assert_eq!(source.host, None);
    rig.wait_claim_event(
        "restored",
        "Provisioning",
        "External provisioner is provisioning volume",
    )
    .await;

    // Nothing else happens: give a wrong implementation time to show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ledger = rig.ledger().await;
    assert_eq!(ledger.call_count("CreateVolume"), 0, "{ledger:?}");
    let claim = rig.claims().get("restored").await.unwrap();
    let finalizers = claim.metadata.finalizers.unwrap_or_default();
    assert!(
        !finalizers.iter().any(|f| f == keys::FINALIZER_PVC_INTENT),
        "no intent for a claim that is not ours to fill: {finalizers:?}"
    );
    let failed: Vec<_> = rig
        .events_for(&rig.ns.name, "restored")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    rig.cleanup().await;
}

#[tokio::test]
async fn a_snapshot_source_of_another_api_group_is_refused_as_upstream_does() {
    let rig = Rig::builder("badgroup").start().await;
    let mut fixture = rig.claim("data").build();
    fixture.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
        api_group: Some("example.com".into()),
        kind: "VolumeSnapshot".into(),
        name: "snap".into(),
        namespace: None,
    });
    rig.claims()
        .create(&Default::default(), &fixture)
        .await
        .expect("creating the claim");
    let event = rig
        .wait_claim_event(
            "data",
            "ProvisioningFailed",
            "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 0);
    rig.cleanup().await;
}
