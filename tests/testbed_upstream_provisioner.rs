//! The reference behaviour: the upstream Go external-provisioner (v6.4.0) with k8s's in-memory
//! mock CSI driver provisions and deletes a claim on our control plane. Our sidecar's end-to-end
//! tests are compared against what this test observes.
//!
//! Observed on v6.4.0 against kube-controller-manager v1.36.3 (asserted below unless marked):
//! - the PV is named `pvc-<claim uid>`, and that name is the CSI volume name (the mock echoes it
//!   back in the volume context, which lands in `spec.csi.volumeAttributes["name"]`); the
//!   CreateVolume request carries only name, capacity and one mount capability (no parameters,
//!   no secrets, no topology) for a plain class;
//! - the sidecar adds `storage.kubernetes.io/csiProvisionerIdentity` (`<start ms>-<rand>-<driver>`)
//!   to the volume attributes, writes `volumeMode: Filesystem` explicitly, and sets the
//!   annotations `volume.kubernetes.io/provisioner-deletion-secret-{name,namespace}` to `""`
//!   even when the class names no deletion secret;
//! - claim events: `ExternalProvisioning` (from the PV binder, component
//!   `persistentvolume-controller`), then `Provisioning` and `ProvisioningSucceeded` from the
//!   sidecar, whose event source is `<driver>_<hostname>_<uuid>`; it emits no event on deletion;
//! - the new PV carries `external-provisioner.volume.kubernetes.io/finalizer` (reclaim `Delete`)
//!   next to `kubernetes.io/pv-protection`; the sidecar removes it after DeleteVolume succeeded;
//! - not asserted: one claim deletion made upstream call DeleteVolume twice for the same volume
//!   id (the PV update carrying the deletion timestamp re-queued it while the finalizer was still
//!   there), then log `Unhandled Error ... persistentvolumes "pvc-..." not found` when it tried to
//!   delete the already gone PV. Idempotent DeleteVolume is load-bearing for upstream; tests
//!   comparing our sidecar with it must not count DeleteVolume calls;
//! - the mock driver starts with three volumes of its own, so the first volume id it hands out
//!   is `4`; upstream built from its module logs `"Version" version="unknown"`.

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use support::{
    ChildProcess, PvcFixture, StorageClassFixture, TestNamespace, cluster, k8s_keys, unique_name,
    wait_for, wait_for_deleted, wait_for_socket,
};

const DEADLINE: Duration = Duration::from_secs(90);

/// The finalizer upstream puts on the PVs it provisions with reclaim policy `Delete`
/// (upstream: lib controller.go, "HonorPVReclaimPolicy").
const UPSTREAM_PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Volume attribute upstream adds to every PV it provisions.
const PROVISIONER_IDENTITY_ATTRIBUTE: &str = "storage.kubernetes.io/csiProvisionerIdentity";

#[tokio::test]
async fn upstream_sidecar_with_the_mock_driver_provisions_and_deletes_a_claim() {
    let cluster = cluster().await;
    let driver = format!("{}.csi.invalid", unique_name("mock"));
    let sockets = tempfile::tempdir().expect("creating a socket directory");
    let socket = sockets.path().join("csi.sock");

    let mut mock = ChildProcess::spawn(
        Command::new(cluster.bin("csi-mock-driver"))
            .arg(format!("--endpoint={}", socket.display()))
            .arg(format!("--drivername={driver}")),
    );
    wait_for_socket(&mut mock, &socket, Duration::from_secs(30)).await;
    let mut sidecar = ChildProcess::spawn(
        Command::new(cluster.bin("csi-provisioner-upstream"))
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .args([
                "--leader-election=false",
                "--timeout=30s",
                "--worker-threads=4",
                "-v=5",
            ]),
    );
    // It asks the driver for its name first: seeing it in the log proves the gRPC connection.
    sidecar
        .wait_for_log(&format!("Detected CSI driver {driver}"), DEADLINE)
        .await;

    let ns = TestNamespace::create(&cluster.client, "tb-upstream").await;
    let class = unique_name("tb-upstream");
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&class, &driver)
                .reclaim("Delete")
                .binding_mode("Immediate")
                .build(),
        )
        .await
        .expect("creating the StorageClass");
    let claims: Api<PersistentVolumeClaim> = ns.api();
    let claim = claims
        .create(
            &PostParams::default(),
            &PvcFixture::new("data", &ns.name)
                .class(&class)
                .size("1Gi")
                .build(),
        )
        .await
        .expect("creating the claim");
    let claim_uid = claim.metadata.uid.clone().expect("created claim has a uid");

    let bound = wait_for("the claim to be Bound", DEADLINE, || async {
        let pvc = claims.get("data").await.expect("reading the claim");
        match pvc.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Bound") => Ok(pvc),
            _ => Err(pvc.status),
        }
    })
    .await;
    let pv_name = bound
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .expect("bound claim names its volume");
    assert_eq!(pv_name, format!("pvc-{claim_uid}"));

    let volumes: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let pv = volumes.get(&pv_name).await.expect("reading the volume");
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(k8s_keys::PROVISIONED_BY)
            .map(String::as_str),
        Some(driver.as_str())
    );
    for secret_ref in [
        "volume.kubernetes.io/provisioner-deletion-secret-name",
        "volume.kubernetes.io/provisioner-deletion-secret-namespace",
    ] {
        assert_eq!(
            annotations.get(secret_ref).map(String::as_str),
            Some(""),
            "{annotations:?}"
        );
    }
    let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.iter().any(|f| f == UPSTREAM_PV_FINALIZER),
        "finalizers: {finalizers:?}"
    );
    let spec = pv.spec.as_ref().expect("volume has a spec");
    let csi = spec.csi.as_ref().expect("volume has a CSI source");
    assert_eq!(csi.driver, driver);
    assert!(!csi.volume_handle.is_empty());
    let attributes = csi.volume_attributes.clone().unwrap_or_default();
    assert_eq!(
        attributes.get("name").map(String::as_str),
        Some(pv_name.as_str())
    );
    assert!(
        attributes.contains_key(PROVISIONER_IDENTITY_ATTRIBUTE),
        "volume attributes: {attributes:?}"
    );
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.storage_class_name.as_deref(), Some(class.as_str()));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(
        spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()),
        Some(claim_uid.as_str())
    );

    let events: Api<Event> = ns.api();
    let reasons = wait_for(
        "Provisioning and ProvisioningSucceeded events on the claim",
        DEADLINE,
        || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=data"))
                .await
                .expect("listing events");
            let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
            if ["Provisioning", "ProvisioningSucceeded"]
                .iter()
                .all(|r| reasons.iter().any(|seen| seen == r))
            {
                Ok(reasons)
            } else {
                Err(reasons)
            }
        },
    )
    .await;
    assert!(
        !reasons.iter().any(|r| r == "ProvisioningFailed"),
        "{reasons:?}"
    );

    // Deleting the claim releases the volume; the sidecar calls DeleteVolume, removes its
    // finalizer and deletes the PV.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("deleting the claim");
    wait_for_deleted(&volumes, &pv_name, DEADLINE).await;
    assert!(
        sidecar
            .log_contents()
            .contains("/csi.v1.Controller/DeleteVolume"),
        "the sidecar's log shows no DeleteVolume call"
    );
    assert!(sidecar.is_running(), "the sidecar exited");
    assert!(mock.is_running(), "the mock driver exited");

    classes
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the StorageClass");
    ns.cleanup().await;
}
