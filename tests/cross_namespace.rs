//! Cross-namespace data sources (`--feature-gates=CrossNamespaceVolumeDataSource=true`; the test
//! bed's kube-apiserver has the gate on, so a claim can name a source in another namespace). The
//! source's namespace allows it with a ReferenceGrant, read live: without one the claim gets
//! upstream's `ProvisioningFailed` and no volume, and once one appears the claim is provisioned.
//! The source is protected as a local one is, and a source claim waits for a pending clone in
//! another namespace before it goes, also when the sidecar of another driver has the gate off. With the gate off such a claim is refused, as upstream does.

mod support;

use csi_provisioner::keys;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::ContentSource;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedObjectReference};
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use support::{DEADLINE, Rig, Snapshotter, TestNamespace, dynamic, wait_for};

const GATE: &str = "--feature-gates=CrossNamespaceVolumeDataSource=true";

/// Creates claim `name` in namespace `team`, its `dataSourceRef` naming `kind` `source` in
/// `source_ns`.
async fn create_claim_from(
    rig: &Rig,
    team: &TestNamespace,
    name: &str,
    (group, kind): (Option<&str>, &str),
    source_ns: &str,
    source: &str,
) {
    let mut claim = rig.claim(name).size("2Gi").build();
    claim.metadata.namespace = Some(team.name.clone());
    claim.spec.as_mut().unwrap().data_source_ref = Some(TypedObjectReference {
        api_group: group.map(String::from),
        kind: kind.into(),
        name: source.into(),
        namespace: Some(source_ns.into()),
    });
    team.api::<PersistentVolumeClaim>()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap_or_else(|e| panic!("creating claim {name}: {e}"));
}

/// A ReferenceGrant in `namespace` letting claims of `from` use every `kind` of `group` there.
async fn grant(rig: &Rig, namespace: &str, from: &str, (group, kind): (&str, &str)) {
    let resource = kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(
        "gateway.networking.k8s.io",
        "v1beta1",
        "ReferenceGrant",
    ));
    Api::<DynamicObject>::namespaced_with(rig.client.clone(), namespace, &resource)
        .create(
            &PostParams::default(),
            &dynamic(json!({
                "apiVersion": "gateway.networking.k8s.io/v1beta1",
                "kind": "ReferenceGrant",
                "metadata": {"name": format!("from-{from}"), "namespace": namespace},
                "spec": {
                    "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from}],
                    "to": [{"group": group, "kind": kind}],
                },
            })),
        )
        .await
        .expect("creating the ReferenceGrant");
}

/// Waits until claim `namespace/name` is Bound; returns its volume's name.
async fn wait_bound_in(team: &TestNamespace, name: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = team.api();
    wait_for(&format!("claim {name} to be Bound"), DEADLINE, || async {
        let claim = claims.get(name).await.expect("reading the claim");
        let status = claim.status.clone().unwrap_or_default();
        match (
            status.phase.as_deref(),
            claim.spec.and_then(|s| s.volume_name),
        ) {
            (Some("Bound"), Some(volume)) => Ok(volume),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn a_snapshot_of_another_namespace_is_restored_once_a_grant_allows_it() {
    let rig = Rig::builder("xns-restore")
        .driver(|d| {
            d.capabilities = vec!["+CREATE_DELETE_SNAPSHOT".into(), "+LIST_SNAPSHOTS".into()]
        })
        .sidecar_args(&[GATE, "--retry-interval-max=2s"])
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("snap", "source").await;
    let backend_snapshot = rig.ledger().await.snapshots.into_values().next().unwrap();
    let creates_before = rig.ledger().await.call_count("CreateVolume");

    let team = TestNamespace::create(&rig.client, "xns-team").await;
    let snapshot_kind = (Some(keys::SNAPSHOT_API_GROUP), keys::SNAPSHOT_KIND);
    create_claim_from(&rig, &team, "restored", snapshot_kind, &rig.ns.name, "snap").await;

    // No grant: upstream's words, and the driver is not asked.
    let refused = format!(
        "accessing {}/snap of VolumeSnapshot dataSource from {}/restored isn't allowed",
        rig.ns.name, team.name
    );
    let event = rig
        .wait_event(&team.name, "restored", "ProvisioningFailed", &refused)
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        rig.ledger().await.call_count("CreateVolume"),
        creates_before
    );
    assert!(
        !snapshotter
            .finalizers("snap")
            .await
            .iter()
            .any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE),
        "a source that may not be used is not protected"
    );

    // A grant in the snapshot's namespace: the claim is restored from the snapshot.
    grant(
        &rig,
        &rig.ns.name,
        &team.name,
        (keys::SNAPSHOT_API_GROUP, keys::SNAPSHOT_KIND),
    )
    .await;
    let pv = wait_bound_in(&team, "restored").await;
    let ledger = rig.ledger().await;
    let volume = ledger.volume_by_name(&pv).expect("the restored volume");
    assert_eq!(
        volume.content_source,
        Some(ContentSource::Snapshot {
            snapshot_id: backend_snapshot.snapshot_id.clone()
        })
    );
    assert_eq!(
        ledger.call_count("CreateVolume"),
        creates_before + 1,
        "{ledger:?}"
    );
    // Its protection is taken off once the volume is saved.
    wait_for("the snapshot's protection to go", DEADLINE, || async {
        let finalizers = snapshotter.finalizers("snap").await;
        if finalizers
            .iter()
            .any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE)
        {
            Err(finalizers)
        } else {
            Ok(())
        }
    })
    .await;
    team.cleanup().await;
    snapshotter.cleanup().await;
    rig.cleanup().await;
}

fn protected(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == keys::FINALIZER_CLONE_SOURCE)
}

#[tokio::test]
async fn a_claim_of_another_namespace_is_cloned_and_outlives_the_pending_clone() {
    let rig = Rig::builder("xns-clone")
        .driver(|d| d.capabilities = vec!["+CLONE_VOLUME".into()])
        .sidecar_args(&[GATE])
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    let source_pv = rig.wait_bound("source").await;
    let source_volume = source_pv.spec.unwrap().csi.unwrap().volume_handle;
    let team = TestNamespace::create(&rig.client, "xns-team").await;
    grant(&rig, &rig.ns.name, &team.name, ("", keys::CLAIM_KIND)).await;
    // The sidecar of another driver, with the gate off: any sidecar may release a cloning
    // protection (as upstream), so this one must not release what our pending clone needs.
    let other = Rig::builder("xns-other").start().await;

    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    create_claim_from(
        &rig,
        &team,
        "copy",
        (None, keys::CLAIM_KIND),
        &rig.ns.name,
        "source",
    )
    .await;
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .expect("the clone's CreateVolume");
    assert!(protected(&rig.claims().get("source").await.unwrap()));

    // Deleted while a clone of it in another namespace is being made: it waits.
    rig.delete_claim("source").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let waiting = rig
        .claims()
        .get("source")
        .await
        .unwrap_or_else(|e| panic!("the source is still there: {e}\n{}", rig.sidecar_log()));
    assert!(waiting.metadata.deletion_timestamp.is_some() && protected(&waiting));

    rig.control.release("CreateVolume").await.unwrap();
    rig.control.clear_faults().await.unwrap();
    let pv = wait_bound_in(&team, "copy").await;
    let ledger = rig.ledger().await;
    let volume = ledger.volume_by_name(&pv).expect("the clone's volume");
    assert_eq!(
        volume.content_source,
        Some(ContentSource::Volume {
            volume_id: source_volume
        })
    );
    // No clone waits any more: the source goes.
    rig.wait_claim_gone("source").await;
    team.cleanup().await;
    other.cleanup().await;
    rig.cleanup().await;
}

#[tokio::test]
async fn with_the_gate_off_a_source_in_another_namespace_is_refused_as_upstream_does() {
    let rig = Rig::builder("xns-off")
        .driver(|d| d.capabilities = vec!["+CLONE_VOLUME".into()])
        .start()
        .await;
    let team = TestNamespace::create(&rig.client, "xns-team").await;
    grant(&rig, &rig.ns.name, &team.name, ("", keys::CLAIM_KIND)).await;
    create_claim_from(
        &rig,
        &team,
        "copy",
        (None, keys::CLAIM_KIND),
        &rig.ns.name,
        "source",
    )
    .await;
    rig.wait_event(
        &team.name,
        "copy",
        "ProvisioningFailed",
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled",
    )
    .await;
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 0);
    team.cleanup().await;
    rig.cleanup().await;
}
