//! Snapshots and content sources: a restore or a clone is a real copy of its source (its size,
//! its origin in the ledger), snapshots are idempotent by name like volumes, and the faults that
//! the provisioner's data-source paths are tested with do what they say.

mod support;

use csi_proto::v1;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::ContentSource;
use csi_test_driver::process::DriverOptions;
use support::{GIB, Harness, create_request};
use tonic::Code;

fn with_capabilities(capabilities: &[&str]) -> DriverOptions {
    DriverOptions {
        capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        ..DriverOptions::default()
    }
}

fn snapshot_request(name: &str, source_volume_id: &str) -> v1::CreateSnapshotRequest {
    v1::CreateSnapshotRequest {
        source_volume_id: source_volume_id.to_string(),
        name: name.to_string(),
        ..Default::default()
    }
}

fn restore_request(name: &str, required_bytes: i64, snapshot_id: &str) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        volume_content_source: Some(v1::VolumeContentSource {
            r#type: Some(v1::volume_content_source::Type::Snapshot(
                v1::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot_id.to_string(),
                },
            )),
        }),
        ..create_request(name, required_bytes)
    }
}

fn clone_request(name: &str, required_bytes: i64, volume_id: &str) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        volume_content_source: Some(v1::VolumeContentSource {
            r#type: Some(v1::volume_content_source::Type::Volume(
                v1::volume_content_source::VolumeSource {
                    volume_id: volume_id.to_string(),
                },
            )),
        }),
        ..create_request(name, required_bytes)
    }
}

#[tokio::test]
async fn a_restore_copies_the_snapshot_size_and_records_its_source() {
    let h = Harness::start_with(with_capabilities(&[
        "+CREATE_DELETE_SNAPSHOT",
        "+LIST_SNAPSHOTS",
    ]))
    .await;
    let mut controller = h.controller().await;
    let source = controller
        .create_volume(create_request("pvc-source", 2 * GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    let snapshot = controller
        .create_snapshot(snapshot_request("snap-1", &source.volume_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snapshot.source_volume_id, source.volume_id);
    assert_eq!(snapshot.size_bytes, 2 * GIB);
    assert!(snapshot.ready_to_use);
    // Idempotent by name; the same name for another source is a conflict.
    let again = controller
        .create_snapshot(snapshot_request("snap-1", &source.volume_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(again.snapshot_id, snapshot.snapshot_id);
    let other = controller
        .create_volume(create_request("pvc-other", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let conflict = controller
        .create_snapshot(snapshot_request("snap-1", &other.volume_id))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    let missing = controller
        .create_snapshot(snapshot_request("snap-2", "vol-does-not-exist"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // Asked for less than the snapshot holds: the restore is the snapshot's size.
    let restored = controller
        .create_volume(restore_request("pvc-restored", GIB, &snapshot.snapshot_id))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.capacity_bytes, 2 * GIB);
    match restored.content_source.and_then(|s| s.r#type) {
        Some(v1::volume_content_source::Type::Snapshot(s)) => {
            assert_eq!(s.snapshot_id, snapshot.snapshot_id)
        }
        other => panic!("restored volume reports content source {other:?}"),
    }
    let unknown = controller
        .create_volume(restore_request("pvc-nowhere", GIB, "snap-does-not-exist"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    // The snapshot outlives its source volume, and the ledger says what came from where.
    controller
        .delete_volume(support::delete_request(&source.volume_id))
        .await
        .unwrap();
    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(
        ledger
            .volume_by_name("pvc-restored")
            .unwrap()
            .content_source,
        Some(ContentSource::Snapshot {
            snapshot_id: snapshot.snapshot_id.clone()
        })
    );
    assert_eq!(
        ledger.snapshot_by_name("snap-1").unwrap().size_bytes,
        2 * GIB
    );
    assert!(ledger.volume_by_name("pvc-nowhere").is_none());

    let listed = controller
        .list_snapshots(v1::ListSnapshotsRequest {
            source_volume_id: source.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);

    // DeleteSnapshot is idempotent and recorded.
    for _ in 0..2 {
        controller
            .delete_snapshot(v1::DeleteSnapshotRequest {
                snapshot_id: snapshot.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let ledger = h.control.ledger().await.unwrap();
    assert!(ledger.snapshots.is_empty());
    let deleted: Vec<bool> = ledger
        .operations_of("DeleteSnapshot")
        .map(|op| op.deleted)
        .collect();
    assert_eq!(deleted, vec![true, false]);
}

#[tokio::test]
async fn restoring_needs_the_snapshot_capability() {
    let h = Harness::start().await;
    let mut controller = h.controller().await;
    let err = controller
        .create_volume(restore_request("pvc-r", GIB, "snap-1"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = controller
        .create_snapshot(snapshot_request("snap-1", "vol-1"))
        .await
        .unwrap_err();
    assert_ne!(err.code(), Code::Ok);
    assert!(h.control.ledger().await.unwrap().volumes.is_empty());
}

#[tokio::test]
async fn a_clone_copies_the_source_size_and_records_its_source() {
    let h = Harness::start_with(with_capabilities(&["+CLONE_VOLUME"])).await;
    let mut controller = h.controller().await;
    let source = controller
        .create_volume(create_request("pvc-source", 3 * GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let clone = controller
        .create_volume(clone_request("pvc-clone", GIB, &source.volume_id))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(clone.capacity_bytes, 3 * GIB);
    // A limit below the source's size cannot be met.
    let mut too_small = clone_request("pvc-small", GIB, &source.volume_id);
    too_small.capacity_range.as_mut().unwrap().limit_bytes = 2 * GIB;
    let err = controller.create_volume(too_small).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);

    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(
        ledger.volume_by_name("pvc-clone").unwrap().content_source,
        Some(ContentSource::Volume {
            volume_id: source.volume_id.clone()
        })
    );
    assert!(ledger.volume_by_name("pvc-small").is_none());
}

#[tokio::test]
async fn create_reports_a_chosen_capacity_for_the_next_calls_only() {
    let h = Harness::start().await;
    h.control
        .set_fault(
            "CreateVolume",
            Fault::CreateReportsCapacity { bytes: 0, count: 1 },
        )
        .await
        .unwrap();
    let mut controller = h.controller().await;
    let reported = controller
        .create_volume(create_request("pvc-zero", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(reported.capacity_bytes, 0);
    // The volume keeps its real size; the next answer is the truth again.
    let again = controller
        .create_volume(create_request("pvc-zero", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.capacity_bytes, GIB);
    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(
        ledger.volume_by_name("pvc-zero").unwrap().capacity_bytes,
        GIB
    );
    assert!(
        ledger
            .operations_of("CreateVolume")
            .next()
            .unwrap()
            .injected
    );
}

#[tokio::test]
async fn snapshot_calls_take_faults_and_fail_without_creating() {
    let h = Harness::start_with(with_capabilities(&["+CREATE_DELETE_SNAPSHOT"])).await;
    let mut controller = h.controller().await;
    let source = controller
        .create_volume(create_request("pvc-source", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    h.control
        .set_fault(
            "CreateSnapshot",
            Fault::Error {
                code: GrpcCode::Unavailable,
                count: 1,
                message: None,
            },
        )
        .await
        .unwrap();
    let err = controller
        .create_snapshot(snapshot_request("snap-f", &source.volume_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(h.control.ledger().await.unwrap().snapshots.is_empty());
    controller
        .create_snapshot(snapshot_request("snap-f", &source.volume_id))
        .await
        .unwrap();
    let ledger = h.control.ledger().await.unwrap();
    assert_eq!(ledger.snapshots.len(), 1);
    let codes: Vec<GrpcCode> = ledger
        .operations_of("CreateSnapshot")
        .map(|op| op.code)
        .collect();
    assert_eq!(codes, vec![GrpcCode::Unavailable, GrpcCode::Ok]);
}
