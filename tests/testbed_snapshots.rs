//! Proof that the test bed's snapshot machinery is real: the VolumeSnapshot CRDs are served,
//! the snapshot-controller that `testbed/cluster.sh` starts and a csi-snapshotter sidecar next
//! to the test driver turn a VolumeSnapshot of a provisioned claim into a `CreateSnapshot` on
//! the backend, and deleting it into a `DeleteSnapshot` — the hand-offs the data-source tests
//! build on. The ReferenceGrant CRD (cross-namespace data sources) is served too.

mod support;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

use support::{
    DEADLINE, Rig, Snapshotter, cluster, dynamic, snapshot_resource, unique_name, wait_for,
};

#[tokio::test]
async fn a_volume_snapshot_of_a_claim_becomes_a_backend_snapshot_and_goes_with_it() {
    let rig = Rig::builder("tb-snap")
        .driver(|d| {
            d.capabilities = vec!["+CREATE_DELETE_SNAPSHOT".into(), "+LIST_SNAPSHOTS".into()]
        })
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    let pv = rig.wait_bound("source").await;
    let volume_handle = pv.spec.unwrap().csi.unwrap().volume_handle;

    let snapshotter = Snapshotter::start(&rig).await;
    let ready = snapshotter.snapshot("snap", "source").await;
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
        &snapshot_resource("VolumeSnapshotContent"),
    );
    let content = contents.get(&content_name).await.expect("the content");
    assert_eq!(
        content.data["status"]["snapshotHandle"],
        json!(backend.snapshot_id)
    );

    // Deleting the snapshot (deletionPolicy Delete) deletes the backend snapshot.
    snapshotter
        .snapshots()
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
    assert!(rig.ledger().await.call_count("DeleteSnapshot") >= 1);
    snapshotter.cleanup().await;
    rig.cleanup().await;
}

#[tokio::test]
async fn the_reference_grant_crd_is_served_as_upstream_reads_it() {
    let cluster = cluster().await;
    let grants: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        "default",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1beta1",
            "ReferenceGrant",
        )),
    );
    let name = unique_name("tb-grant");
    grants
        .create(
            &PostParams::default(),
            &dynamic(json!({
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
