//! Proof that the test bed's control plane is real: kube-controller-manager's PV binder and
//! protection controllers do to claims and volumes what they do in a cluster, so the sidecar
//! tests built on it exercise the genuine hand-offs (the binder asks for a provisioner, binds
//! what the provisioner creates, releases it when the claim goes).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use support::{
    PvFixture, PvcFixture, StorageClassFixture, TestNamespace, cluster, k8s_keys, unique_name,
    wait_for, wait_for_deleted,
};

const DEADLINE: Duration = Duration::from_secs(60);

fn phase_of_pvc(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref()?.phase.as_deref()
}

fn phase_of_pv(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref()?.phase.as_deref()
}

#[tokio::test]
async fn binder_asks_the_classes_provisioner_for_a_claim_and_says_so_in_an_event() {
    let cluster = cluster().await;
    let ns = TestNamespace::create(&cluster.client, "tb-annotate").await;
    let provisioner = format!("{}.csi.invalid", unique_name("fake"));
    let class = unique_name("tb-annotate");
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&class, &provisioner).build(),
        )
        .await
        .expect("creating the StorageClass");
    let claims: Api<PersistentVolumeClaim> = ns.api();
    claims
        .create(
            &PostParams::default(),
            &PvcFixture::new("data", &ns.name).class(&class).build(),
        )
        .await
        .expect("creating the claim");

    let annotated = wait_for(
        "the PV binder to annotate the claim with its provisioner",
        DEADLINE,
        || async {
            let pvc = claims.get("data").await.expect("reading the claim");
            let annotation = pvc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k8s_keys::STORAGE_PROVISIONER));
            match annotation {
                Some(_) => Ok(pvc),
                None => Err(pvc.metadata),
            }
        },
    )
    .await;
    let annotations = annotated.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[k8s_keys::STORAGE_PROVISIONER], provisioner);
    // v1.36 still writes the deprecated beta spelling too; external provisioners accept either.
    assert_eq!(annotations[k8s_keys::BETA_STORAGE_PROVISIONER], provisioner);
    assert_eq!(phase_of_pvc(&annotated), Some("Pending"));
    // Admission (StorageObjectInUseProtection) adds the protection finalizer on creation.
    assert!(
        annotated
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == k8s_keys::PVC_PROTECTION_FINALIZER)),
        "claim has no pvc-protection finalizer: {:?}",
        annotated.metadata.finalizers
    );

    // The binder tells the user who it is waiting for.
    let events: Api<Event> = ns.api();
    let event = wait_for(
        "an ExternalProvisioning event on the claim",
        DEADLINE,
        || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=data"))
                .await
                .expect("listing events");
            list.items
                .iter()
                .find(|e| e.reason.as_deref() == Some("ExternalProvisioning"))
                .cloned()
                .ok_or(list.items)
        },
    )
    .await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains(&provisioner),
        "event does not name the provisioner {provisioner}: {message}"
    );

    classes
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the StorageClass");
    ns.cleanup().await;
}

#[tokio::test]
async fn prebound_volume_binds_its_claim_and_is_released_when_the_claim_is_deleted() {
    let cluster = cluster().await;
    let ns = TestNamespace::create(&cluster.client, "tb-bind").await;
    let provisioner = format!("{}.csi.invalid", unique_name("fake"));
    let class = unique_name("tb-bind");
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClassFixture::new(&class, &provisioner).build(),
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

    let volumes: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let pv_name = unique_name("tb-bind-pv");
    volumes
        .create(
            &PostParams::default(),
            &PvFixture::new(&pv_name)
                .driver(&provisioner)
                .handle("vol-1")
                .capacity("1Gi")
                .access_modes(&["ReadWriteOnce"])
                .class(&class)
                .reclaim("Retain")
                .claim(&claim)
                .build(),
        )
        .await
        .expect("creating the pre-bound volume");

    let bound = wait_for("the claim to be Bound", DEADLINE, || async {
        let pvc = claims.get("data").await.expect("reading the claim");
        match phase_of_pvc(&pvc) {
            Some("Bound") => Ok(pvc),
            _ => Err(pvc.status),
        }
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    let pvc_annotations = bound.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        pvc_annotations
            .get(k8s_keys::BIND_COMPLETED)
            .map(String::as_str),
        Some("yes")
    );
    let capacity = &bound.status.as_ref().unwrap().capacity.as_ref().unwrap()["storage"];
    assert_eq!(capacity.0, "1Gi");

    let pv = wait_for("the volume to be Bound", DEADLINE, || async {
        let pv = volumes.get(&pv_name).await.expect("reading the volume");
        match phase_of_pv(&pv) {
            Some("Bound") => Ok(pv),
            _ => Err(pv.status),
        }
    })
    .await;
    assert!(
        pv.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == k8s_keys::PV_PROTECTION_FINALIZER)),
        "volume has no pv-protection finalizer: {:?}",
        pv.metadata.finalizers
    );

    // With no pod using it, the PVC protection controller lets the claim go at once, and the
    // binder releases the volume, keeping it (Retain) with its claimRef.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("deleting the claim");
    wait_for_deleted(&claims, "data", DEADLINE).await;
    let released = wait_for("the volume to be Released", DEADLINE, || async {
        let pv = volumes.get(&pv_name).await.expect("reading the volume");
        match phase_of_pv(&pv) {
            Some("Released") => Ok(pv),
            _ => Err(pv.status),
        }
    })
    .await;
    let claim_ref = released.spec.unwrap().claim_ref.unwrap();
    assert_eq!(claim_ref.uid, claim.metadata.uid);

    // A released volume is not in use, so PV protection lets it be deleted.
    volumes
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("deleting the volume");
    wait_for_deleted(&volumes, &pv_name, DEADLINE).await;
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the StorageClass");
    ns.cleanup().await;
}

#[tokio::test]
async fn provisioner_identity_is_authenticated_but_not_an_admin() {
    let cluster = cluster().await;
    let client = cluster.client_for(&cluster.provisioner_kubeconfig).await;
    // Listing secrets: a verb no RBAC of ours ever grants (the sidecar only gets the secret a
    // class names). The tests of our sidecar bind the identity to deploy/kubernetes/rbac.yaml,
    // so volumes, and namespaces for the metadata flags, may be readable by now.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::all(client);
    match secrets.list(&ListParams::default()).await {
        // 403 (authorized no further), not 401 (unknown token): the identity exists.
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(status.message.contains("\"csi-provisioner\""), "{status:?}");
        }
        other => panic!("the provisioner identity must not list secrets: {other:?}"),
    }
}
