//! Proof that the test bed's snapshot machinery is real: the VolumeSnapshot CRDs are served,
//! the snapshot-controller that `testbed/cluster.sh` starts and a csi-snapshotter sidecar next
//! to the test driver turn a VolumeSnapshot of a provisioned claim into a `CreateSnapshot` on
//! the backend, and deleting it into a `DeleteSnapshot` — the hand-offs the data-source tests
//! build on. The ReferenceGrant CRD (cross-namespace data sources) is served too.

mod support;

use std::process::Command;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use support::{ChildProcess, DEADLINE, Rig, cluster, unique_name, wait_for};

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

#[tokio::test]
async fn a_volume_snapshot_of_a_claim_becomes_a_backend_snapshot_and_goes_with_it() {
    let cluster = cluster().await;
    let rig = Rig::builder("tb-snap")
        .driver(|d| {
            d.capabilities = vec!["+CREATE_DELETE_SNAPSHOT".into(), "+LIST_SNAPSHOTS".into()]
        })
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    let pv = rig.wait_bound("source").await;
    let volume_handle = pv.spec.unwrap().csi.unwrap().volume_handle;

    let mut snapshotter = ChildProcess::spawn(Command::new(cluster.bin("csi-snapshotter")).args([
        format!("--csi-address={}", rig.driver.endpoint.display()),
        format!("--kubeconfig={}", cluster.kubeconfig.display()),
        "--leader-election=false".to_string(),
        "--v=4".to_string(),
    ]));

    let class_name = unique_name("tb-snap");
    let classes: Api<DynamicObject> = Api::all_with(
        rig.client.clone(),
        &resource("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"),
    );
    classes
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshotClass",
                "metadata": {"name": class_name},
                "driver": rig.driver_name,
                "deletionPolicy": "Delete",
            })),
        )
        .await
        .expect("creating the VolumeSnapshotClass");
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        rig.client.clone(),
        &rig.ns.name,
        &resource("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
    );
    snapshots
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshot",
                "metadata": {"name": "snap", "namespace": rig.ns.name},
                "spec": {
                    "volumeSnapshotClassName": class_name,
                    "source": {"persistentVolumeClaimName": "source"},
                },
            })),
        )
        .await
        .expect("creating the VolumeSnapshot");

    let ready = wait_for(
        "the VolumeSnapshot to be ready to use",
        DEADLINE,
        || async {
            let snap = snapshots.get("snap").await.expect("reading the snapshot");
            let status = snap.data.get("status").cloned().unwrap_or_default();
            if status.get("readyToUse") == Some(&json!(true)) {
                Ok(status)
            } else {
                Err(status)
            }
        },
    )
    .await;
    assert_eq!(ready["restoreSize"], json!("2Gi"), "{ready}");
    let content_name = ready["boundVolumeSnapshotContentName"]
        .as_str()
        .expect("bound to a content")
        .to_string();

    let ledger = rig.ledger().await;
    assert_eq!(ledger.snapshots.len(), 1, "{ledger:?}");
    let backend = ledger.snapshots.values().next().unwrap();
    assert_eq!(backend.source_volume_id, volume_handle);
    assert_eq!(backend.size_bytes, 2 << 30);
    let contents: Api<DynamicObject> = Api::all_with(
        rig.client.clone(),
        &resource("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
    );
    let content = contents.get(&content_name).await.expect("the content");
    assert_eq!(
        content.data["status"]["snapshotHandle"],
        json!(backend.snapshot_id)
    );

    // Deleting the snapshot (deletionPolicy Delete) deletes the backend snapshot.
    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .expect("deleting the snapshot");
    wait_for("the backend snapshot to be deleted", DEADLINE, || async {
        let ledger = rig.ledger().await;
        if ledger.snapshots.is_empty() {
            Ok(())
        } else {
            Err(ledger.snapshots)
        }
    })
    .await;
    let deletes = rig.ledger().await.call_count("DeleteSnapshot");
    assert!(deletes >= 1, "DeleteSnapshot was called");

    snapshotter.kill();
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .expect("deleting the class");
    rig.cleanup().await;
}

#[tokio::test]
async fn the_reference_grant_crd_is_served_as_upstream_reads_it() {
    let cluster = cluster().await;
    let grants: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        "default",
        &resource("gateway.networking.k8s.io", "v1beta1", "ReferenceGrant"),
    );
    let name = unique_name("tb-grant");
    grants
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "gateway.networking.k8s.io/v1beta1",
                "kind": "ReferenceGrant",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": "other"}],
                    "to": [{"group": "", "kind": "PersistentVolumeClaim"}],
                },
            })),
        )
        .await
        .expect("creating a ReferenceGrant");
    let read = grants.get(&name).await.expect("reading it back");
    assert_eq!(read.data["spec"]["from"][0]["namespace"], json!("other"));
    grants
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting it");
}
