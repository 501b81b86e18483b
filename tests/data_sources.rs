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
use kube::api::{Patch, PatchParams};
use serde_json::json;
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
    wait_unprotected(&snapshotter, "snap", "the protection to be removed").await;
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

/// Waits until snapshot `name` no longer carries our source protection.
async fn wait_unprotected(snapshotter: &Snapshotter, name: &str, what: &str) {
    wait_for(what, DEADLINE, || async {
        let f = snapshotter.finalizers(name).await;
        if f.iter().any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE) {
            Err(f)
        } else {
            Ok(())
        }
    })
    .await;
}

/// Puts upstream's source protection on a snapshot, as a restore that died before removing it
/// would have left it.
async fn protect_by_hand(snapshotter: &Snapshotter, name: &str) {
    let mut finalizers = snapshotter.finalizers(name).await;
    finalizers.push(keys::FINALIZER_SNAPSHOT_SOURCE.to_string());
    snapshotter
        .snapshots()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .expect("protecting the snapshot");
}

#[tokio::test]
async fn the_sweep_removes_the_protection_no_pending_claim_needs() {
    let rig = snapshot_rig()
        .sidecar_args(&["--snapshot-orphan-sweep-interval=1s"])
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("1Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("orphan", "source").await;
    snapshotter.snapshot("kept", "source").await;
    // A claim that waits to be restored from "kept" (its class does not exist: it stays Pending).
    let mut waiting = restore_claim(&rig, "waiting", "1Gi", "kept");
    waiting.spec.as_mut().unwrap().storage_class_name = Some("no-such-class".into());
    rig.claims()
        .create(&Default::default(), &waiting)
        .await
        .expect("creating the waiting claim");
    protect_by_hand(&snapshotter, "kept").await;
    protect_by_hand(&snapshotter, "orphan").await;

    wait_unprotected(&snapshotter, "orphan", "the sweep to release the orphan").await;
    // Several sweeps later the one a claim waits for is still protected.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(
        snapshotter
            .finalizers("kept")
            .await
            .iter()
            .any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE)
    );
    // Once the claim is gone, so is the reason to keep it.
    rig.delete_claim("waiting").await;
    wait_unprotected(&snapshotter, "kept", "the sweep to release the snapshot").await;
    snapshotter.cleanup().await;
    rig.cleanup().await;
}

fn clone_claim(rig: &Rig, name: &str, size: &str, source: &str) -> PersistentVolumeClaim {
    let mut claim = rig.claim(name).size(size).build();
    claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: source.into(),
    });
    claim
}

fn clone_rig() -> support::RigBuilder {
    Rig::builder("clone").driver(|d| d.capabilities = vec!["+CLONE_VOLUME".into()])
}

fn protected(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == "provisioner.storage.kubernetes.io/cloning-protection")
}

#[tokio::test]
async fn a_claim_is_cloned_and_its_source_outlives_every_pending_clone() {
    let rig = clone_rig().start().await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    let source_pv = rig.wait_bound("source").await;
    let source_volume = source_pv.spec.unwrap().csi.unwrap().volume_handle;

    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.claims()
        .create(
            &Default::default(),
            &clone_claim(&rig, "copy", "2Gi", "source"),
        )
        .await
        .expect("creating the clone");
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .expect("the clone's CreateVolume");
    let claims = rig.claims();
    assert!(protected(&claims.get("source").await.unwrap()));
    // Deleted while its clone is being made: it waits.
    rig.delete_claim("source").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let waiting = claims
        .get("source")
        .await
        .expect("the source is still there");
    assert!(waiting.metadata.deletion_timestamp.is_some() && protected(&waiting));

    rig.control.release("CreateVolume").await.unwrap();
    rig.control.clear_faults().await.unwrap();
    let pv = rig.wait_bound("copy").await;
    let ledger = rig.ledger().await;
    let volume = ledger
        .volume_by_name(pv.metadata.name.as_deref().unwrap())
        .expect("the clone's volume");
    assert_eq!(
        volume.content_source,
        Some(ContentSource::Volume {
            volume_id: source_volume.clone()
        })
    );
    assert_eq!(volume.capacity_bytes, 2 << 30);
    // No clone waits any more: the source goes, and its volume with it.
    rig.wait_claim_gone("source").await;
    rig.wait_pv_gone(source_pv.metadata.name.as_deref().unwrap())
        .await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_clone_smaller_than_its_source_is_refused_in_upstreams_words() {
    let rig = clone_rig().start().await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    rig.claims()
        .create(
            &Default::default(),
            &clone_claim(&rig, "small", "1Gi", "source"),
        )
        .await
        .expect("creating the clone");
    let event = rig
        .wait_claim_event(
            "small",
            "ProvisioningFailed",
            "error getting handle for DataSource Type PersistentVolumeClaim by Name source: error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1073741824 but source is 2147483648",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        rig.ledger().await.call_count("CreateVolume"),
        1,
        "only the source's"
    );
    assert!(!protected(&rig.claims().get("source").await.unwrap()));
    rig.cleanup().await;
}

#[tokio::test]
async fn a_restore_claim_deleted_mid_flight_leaves_no_volume_and_frees_its_snapshot() {
    let rig = snapshot_rig().sidecar_args(&["--timeout=2s"]).start().await;
    rig.create_claim(rig.claim("source").size("1Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("snap", "source").await;

    // The restore's CreateVolume is made by the backend but answered too late.
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.claims()
        .create(
            &Default::default(),
            &restore_claim(&rig, "restored", "1Gi", "snap"),
        )
        .await
        .expect("creating the restore claim");
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .expect("the restore's CreateVolume");
    // The sidecar gives up on the call (the volume may exist); the claim is deleted.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    rig.delete_claim("restored").await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    rig.control.release("CreateVolume").await.unwrap();
    rig.control.clear_faults().await.unwrap();

    // The cleanup finds the volume by name (the same content source: the driver would
    // answer AlreadyExists to a request without it), deletes it, and frees the snapshot.
    rig.wait_claim_gone("restored").await;
    wait_for("the restored volume to be deleted", DEADLINE, || async {
        let ledger = rig.ledger().await;
        let restores: Vec<_> = ledger
            .volumes
            .values()
            .filter(|v| matches!(v.content_source, Some(ContentSource::Snapshot { .. })))
            .map(|v| v.volume_id.clone())
            .collect();
        if restores.is_empty() {
            Ok(())
        } else {
            Err(restores)
        }
    })
    .await;
    wait_unprotected(&snapshotter, "snap", "the snapshot's protection to go").await;
    let ledger = rig.ledger().await;
    let made: usize = ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created)
        .count();
    assert_eq!(
        made, 2,
        "the source's volume and one restore, never a second: {ledger:?}"
    );
    snapshotter.cleanup().await;
    rig.cleanup().await;
}
