//! Deletion still gets the provisioner secret when what named it is gone:
//! the PV records where the secret is (the deletion-secret annotations), so a
//! deleted StorageClass does not matter; a PV from before those annotations
//! existed resolves the secret from its (current) StorageClass, as upstream.

mod support;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::Rig;

const NAME_KEY: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
const NAMESPACE_KEY: &str = "volume.kubernetes.io/provisioner-deletion-secret-namespace";

/// A rig whose class names a provisioner secret `creds` in the claim's
/// namespace, with that secret created; the sidecar runs.
async fn rig_with_secret(prefix: &str) -> Rig {
    let mut rig = Rig::builder(prefix)
        .class(|c| {
            c.param("csi.storage.k8s.io/provisioner-secret-name", "creds")
                .param(
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                )
        })
        .without_sidecar()
        .start()
        .await;
    rig.create_secret("creds", &[("token", "t0ken")]).await;
    rig.start_sidecar();
    rig
}

/// The keys the driver got with the `DeleteVolume` of `handle`.
async fn delete_secret_keys(rig: &Rig, handle: &str) -> Vec<Vec<String>> {
    rig.ledger()
        .await
        .operations
        .iter()
        .filter(|op| op.method == "DeleteVolume" && op.volume_id.as_deref() == Some(handle))
        .map(|op| op.secret_keys.clone())
        .collect()
}

fn handle(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV")
}

#[tokio::test]
async fn deletion_after_the_storage_class_is_gone_uses_the_secret_recorded_on_the_pv() {
    let rig = rig_with_secret("delsec-gone").await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann.get(NAME_KEY).map(String::as_str), Some("creds"));
    assert_eq!(ann.get(NAMESPACE_KEY), Some(&rig.ns.name));

    Api::<StorageClass>::all(rig.client.clone())
        .delete(&rig.class, &DeleteParams::default())
        .await
        .expect("deleting the StorageClass");
    rig.delete_claim("data").await;
    rig.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;

    assert_eq!(
        delete_secret_keys(&rig, &handle(&pv)).await,
        vec![vec!["token".to_string()]],
        "one DeleteVolume, carrying the secret the PV names"
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn a_pv_without_the_deletion_secret_annotations_resolves_the_secret_from_its_class() {
    let rig = rig_with_secret("delsec-class").await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    // As a PV provisioned before the annotations existed.
    rig.volumes()
        .patch(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"annotations": {NAME_KEY: null, NAMESPACE_KEY: null}}}),
            ),
        )
        .await
        .expect("removing the deletion-secret annotations");

    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;

    assert_eq!(
        delete_secret_keys(&rig, &handle(&pv)).await,
        vec![vec!["token".to_string()]],
        "one DeleteVolume, carrying the secret the class names"
    );
    rig.cleanup().await;
}
