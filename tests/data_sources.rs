//! Claims with a data source, end to end. A snapshot is restored: read live, protected by
//! upstream's finalizer while its volume is made, named in `CreateVolume`. A kind the
//! provisioner does not fill itself belongs to a volume populator: upstream notes that on the
//! claim and leaves it alone, with no `CreateVolume` and (ours) no intent. The data-source checks
//! that come before anything else give upstream's errors.

mod support;

use std::time::Duration;

use csi_provisioner::keys;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::ContentSource;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, TypedLocalObjectReference, TypedObjectReference,
};
use support::{DEADLINE, Rig, Snapshotter, wait_for};

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

fn restore_claim(rig: &Rig, name: &str, size: &str, snapshot: &str) -> PersistentVolumeClaim {
    let mut claim = rig.claim(name).size(size).build();
    claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: snapshot.into(),
    });
    claim
}

fn snapshot_rig() -> support::RigBuilder {
    Rig::builder("restore").driver(|d| {
        d.capabilities = vec!["+CREATE_DELETE_SNAPSHOT".into(), "+LIST_SNAPSHOTS".into()]
    })
}

#[tokio::test]
async fn a_claim_is_restored_from_a_snapshot_and_the_snapshot_is_protected_meanwhile() {
    let rig = snapshot_rig().start().await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("snap", "source").await;
    let backend_snapshot = rig.ledger().await.snapshots.into_values().next().unwrap();

    // The restore is held in the driver, so the protection can be seen while it runs.
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.claims()
        .create(
            &Default::default(),
            &restore_claim(&rig, "restored", "2Gi", "snap"),
        )
        .await
        .expect("creating the restore claim");
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .expect("the restore's CreateVolume");
    assert!(
        snapshotter
            .finalizers("snap")
            .await
            .iter()
            // upstream's name, spelled out: the snapshot-controller has a finalizer of a
            // similar name of its own
            .any(|f| f == "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"),
        "the snapshot is protected before CreateVolume"
    );
    rig.control.release("CreateVolume").await.unwrap();
    rig.control.clear_faults().await.unwrap();

    let pv = rig.wait_bound("restored").await;
    let ledger = rig.ledger().await;
    let volume = ledger
        .volume_by_name(pv.metadata.name.as_deref().unwrap())
        .expect("the restored volume");
    assert_eq!(
        volume.content_source,
        Some(ContentSource::Snapshot {
            snapshot_id: backend_snapshot.snapshot_id.clone()
        })
    );
    assert_eq!(volume.capacity_bytes, 2 << 30);
    rig.wait_claim_event("restored", "ProvisioningSucceeded", "")
        .await;
    wait_for("the protection to be removed", DEADLINE, || async {
        let f = snapshotter.finalizers("snap").await;
        if f.iter().any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE) {
            Err(f)
        } else {
            Ok(())
        }
    })
    .await;
    snapshotter.cleanup().await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_restore_smaller_than_the_snapshot_is_refused_in_upstreams_words() {
    let rig = snapshot_rig().start().await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("snap", "source").await;
    rig.claims()
        .create(
            &Default::default(),
            &restore_claim(&rig, "small", "1Gi", "snap"),
        )
        .await
        .expect("creating the restore claim");
    let event = rig
        .wait_claim_event(
            "small",
            "ProvisioningFailed",
            "error getting handle for DataSource Type VolumeSnapshot by Name snap: requested volume size 1073741824 is less than the size 2147483648 for the source snapshot snap",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // A missing snapshot is named too; neither reaches the driver or protects anything.
    rig.claims()
        .create(
            &Default::default(),
            &restore_claim(&rig, "nowhere", "2Gi", "missing"),
        )
        .await
        .expect("creating the restore claim");
    rig.wait_claim_event(
        "nowhere",
        "ProvisioningFailed",
        "error getting handle for DataSource Type VolumeSnapshot by Name missing: error getting snapshot missing from api server: volumesnapshots.snapshot.storage.k8s.io \"missing\" not found",
    )
    .await;
    assert_eq!(
        rig.ledger().await.call_count("CreateVolume"),
        1,
        "only the source's"
    );
    assert!(
        snapshotter
            .finalizers("snap")
            .await
            .iter()
            .all(|f| f != keys::FINALIZER_SNAPSHOT_SOURCE)
    );
    snapshotter.cleanup().await;
    rig.cleanup().await;
}
