//! VolumeSnapshots on the test bed: the csi-snapshotter sidecar next to a rig's test driver
//! (the snapshot-controller runs with the control plane), a class, and snapshots of claims.

use std::process::Command;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use super::{ChildProcess, DEADLINE, Rig, cluster, unique_name, wait_for};

pub fn snapshot_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "snapshot.storage.k8s.io",
        "v1",
        kind,
    ))
}

pub fn dynamic(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

/// A csi-snapshotter for the rig's driver and a VolumeSnapshotClass of it (deletion policy
/// Delete). Dropping it stops the sidecar; [`Snapshotter::cleanup`] deletes the class too.
pub struct Snapshotter {
    pub class: String,
    process: ChildProcess,
    client: kube::Client,
    namespace: String,
}

impl Snapshotter {
    pub async fn start(rig: &Rig) -> Snapshotter {
        let cluster = cluster().await;
        let process = ChildProcess::spawn(Command::new(cluster.bin("csi-snapshotter")).args([
            format!("--csi-address={}", rig.driver.endpoint.display()),
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            "--leader-election=false".to_string(),
            "--v=4".to_string(),
        ]));
        let class = unique_name("snapclass");
        Api::<DynamicObject>::all_with(
            rig.client.clone(),
            &snapshot_resource("VolumeSnapshotClass"),
        )
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshotClass",
                "metadata": {"name": class},
                "driver": rig.driver_name,
                "deletionPolicy": "Delete",
            })),
        )
        .await
        .expect("creating the VolumeSnapshotClass");
        Snapshotter {
            class,
            process,
            client: rig.client.clone(),
            namespace: rig.ns.name.clone(),
        }
    }

    pub fn snapshots(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &snapshot_resource("VolumeSnapshot"),
        )
    }

    /// Snapshots `claim` as `name` and waits until it is ready to use; returns its status.
    pub async fn snapshot(&self, name: &str, claim: &str) -> Value {
        let snapshots = self.snapshots();
        snapshots
            .create(
                &PostParams::default(),
                &dynamic(json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshot",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "spec": {
                        "volumeSnapshotClassName": self.class,
                        "source": {"persistentVolumeClaimName": claim},
                    },
                })),
            )
            .await
            .expect("creating the VolumeSnapshot");
        wait_for(
            &format!("VolumeSnapshot {name} to be ready to use"),
            DEADLINE,
            || async {
                let snap = snapshots.get(name).await.expect("reading the snapshot");
                let status = snap.data.get("status").cloned().unwrap_or_default();
                if status.get("readyToUse") == Some(&json!(true)) {
                    Ok(status)
                } else {
                    Err(status)
                }
            },
        )
        .await
    }

    /// The finalizers of snapshot `name` now.
    pub async fn finalizers(&self, name: &str) -> Vec<String> {
        self.snapshots()
            .get(name)
            .await
            .expect("reading the snapshot")
            .metadata
            .finalizers
            .unwrap_or_default()
    }

    pub async fn cleanup(mut self) {
        self.process.kill();
        Api::<DynamicObject>::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotClass"),
        )
        .delete(&self.class, &DeleteParams::default())
        .await
        .expect("deleting the VolumeSnapshotClass");
    }
}
