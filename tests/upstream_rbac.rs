//! A drop-in under the RBAC upstream ships: operators swap the sidecar's image inside their
//! driver's chart, whose ClusterRole and Role are external-provisioner v6.4.0's
//! deploy/kubernetes/rbac.yaml. Here that file is read verbatim from the release's Go module (the
//! test bed copies it), its optional rules uncommented as a driver needing them would (secrets,
//! referencegrants), and bound to a user of its own; our sidecar runs as that user and must
//! provision, delete, restore with the snapshot's protection, clone with the source's
//! protection, publish capacity and lead through the Lease, in both intent modes — with
//! `update` on claims and snapshots, where upstream's file grants no `patch`.

mod support;

use csi_provisioner::capacity::LABEL_DRIVER;
use csi_provisioner::keys;
use csi_provisioner::kube::lease::lease_name;
use csi_test_driver::control::Fault;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, Pod, PodSpec, TypedLocalObjectReference,
};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use support::policies::{holds_intent, install, uninstall};
use support::{DEADLINE, Rbac, Rig, Snapshotter, unique_name, wait_for};

fn finalizers(c: &PersistentVolumeClaim) -> Vec<String> {
    c.metadata.finalizers.clone().unwrap_or_default()
}

/// The sidecar's log must show no refusal by the authorizer.
fn assert_never_forbidden(rig: &Rig) {
    let log = rig.sidecar_log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the sidecar met a refusal under upstream's RBAC:\n{}",
        rig.sidecar_log_tail()
    );
}

/// Provisioning and deletion with our own intent (the default mode: the intent finalizer is
/// written and released with `update`), as the leader of its Lease.
#[tokio::test]
async fn provisions_and_deletes_under_upstreams_rbac_as_the_leader() {
    let mut rig = Rig::builder("uprbac")
        .rbac(Rbac::Upstream)
        .without_sidecar()
        .start()
        .await;
    let lease_ns = rig.ns.name.clone();
    rig.args.extend([
        "--leader-election".to_string(),
        format!("--leader-election-namespace={lease_ns}"),
    ]);
    rig.start_sidecar();
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    rig.wait_claim_event("data", "ProvisioningSucceeded", "")
        .await;
    // The intent was written before the volume was made, and released once the claim was bound.
    let ledger = rig.ledger().await;
    assert_eq!(ledger.call_count("CreateVolume"), 1, "{ledger:?}");
    wait_for("the intent to be released", DEADLINE, || async {
        let c = rig.claims().get("data").await.unwrap();
        if holds_intent(&c) {
            Err(finalizers(&c))
        } else {
            Ok(())
        }
    })
    .await;
    // The Lease is held by this sidecar.
    let leases: Api<Lease> = Api::namespaced(rig.client.clone(), &lease_ns);
    let lease_name = lease_name(&rig.driver_name);
    let lease = wait_for("the Lease", DEADLINE, || async {
        leases.get(&lease_name).await.map_err(|e| e.to_string())
    })
    .await;
    assert!(
        lease.spec.and_then(|s| s.holder_identity).is_some(),
        "the Lease names its holder"
    );

    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    assert!(
        rig.ledger().await.volume_by_name(&pv_name).is_none(),
        "the volume is deleted"
    );
    assert_never_forbidden(&rig);
    rig.cleanup().await;
}

fn data_source(claim: &mut PersistentVolumeClaim, api_group: Option<&str>, kind: &str, name: &str) {
    claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: api_group.map(str::to_string),
        kind: kind.into(),
        name: name.into(),
    });
}

/// A restore protects its snapshot (an `update` of the VolumeSnapshot) while its volume is made
/// and lets it go once saved; a clone protects its source claim and lets it go once the source
/// is deleted and no clone waits.
#[tokio::test]
async fn restores_and_clones_with_their_protections_under_upstreams_rbac() {
    let rig = Rig::builder("uprbac-src")
        .rbac(Rbac::Upstream)
        .driver(|d| {
            d.capabilities = vec![
                "+CREATE_DELETE_SNAPSHOT".into(),
                "+LIST_SNAPSHOTS".into(),
                "+CLONE_VOLUME".into(),
            ]
        })
        .start()
        .await;
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    snapshotter.snapshot("snap", "source").await;

    // The restore is held in the driver so that the protection can be seen while it runs.
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let mut restore = rig.claim("restored").size("2Gi").build();
    data_source(
        &mut restore,
        Some("snapshot.storage.k8s.io"),
        "VolumeSnapshot",
        "snap",
    );
    rig.claims()
        .create(&PostParams::default(), &restore)
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
            .any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE),
        "the snapshot is protected before CreateVolume"
    );
    rig.control.release("CreateVolume").await.unwrap();
    rig.control.clear_faults().await.unwrap();
    rig.wait_bound("restored").await;
    wait_for("the snapshot's protection to go", DEADLINE, || async {
        let f = snapshotter.finalizers("snap").await;
        if f.iter().any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE) {
            Err(f)
        } else {
            Ok(())
        }
    })
    .await;

    // The clone: its source is protected, and goes only once it is deleted and nothing waits.
    let mut clone = rig.claim("copy").size("2Gi").build();
    data_source(&mut clone, None, "PersistentVolumeClaim", "source");
    rig.claims()
        .create(&PostParams::default(), &clone)
        .await
        .expect("creating the clone");
    rig.wait_bound("copy").await;
    let source = rig.claims().get("source").await.unwrap();
    assert!(
        finalizers(&source)
            .iter()
            .any(|f| f == keys::FINALIZER_CLONE_SOURCE),
        "the source claim carries the cloning protection: {:?}",
        finalizers(&source)
    );
    snapshotter.cleanup().await;
    rig.delete_claim("source").await;
    rig.wait_claim_gone("source").await;
    assert_never_forbidden(&rig);
    rig.cleanup().await;
}

/// `--enable-capacity` publishes its objects in the sidecar's namespace with the Role
/// upstream ships (the owner read from the Pod).
#[tokio::test]
async fn publishes_capacity_under_upstreams_rbac() {
    const ZONE: &str = "topology.uprbac.example.com/zone";
    let mut rig = Rig::builder("uprbac-cap")
        .rbac(Rbac::Upstream)
        .driver(|d| {
            d.topology = Some((ZONE.to_string(), "zone-a".to_string()));
            d.capacity_bytes = Some(10 << 30);
        })
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(&[
            "--enable-capacity",
            "--capacity-ownerref-level=0",
            "--capacity-poll-interval=1h",
        ])
        .without_sidecar()
        .start()
        .await;
    let node = rig.node_in_zone(ZONE, "zone-a").await;
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(unique_name("provisioner")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "csi-provisioner".into(),
                image: Some("csi-provisioner".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = Api::<Pod>::namespaced(rig.client.clone(), &rig.ns.name)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the owner Pod");
    rig.env = vec![
        ("NAMESPACE".into(), rig.ns.name.clone()),
        ("POD_NAME".into(), pod.name_any()),
    ];
    rig.start_sidecar();
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(rig.client.clone(), &rig.ns.name);
    let selector = format!("{LABEL_DRIVER}={}", rig.driver_name);
    let found = wait_for("a CSIStorageCapacity for zone-a", DEADLINE, || async {
        let items = capacities
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?
            .items;
        match items.as_slice() {
            [one] if one.capacity.as_ref().map(|q| q.0.as_str()) == Some("10Gi") => Ok(one.clone()),
            other => Err(format!("{other:?}\n{}", rig.sidecar_log_tail())),
        }
    })
    .await;
    assert_eq!(
        found.owner_references()[0].uid,
        pod.uid().unwrap(),
        "owned by the Pod it read"
    );
    // A claim of the late-binding class is provisioned on the node the scheduler chose.
    rig.create_claim(rig.claim("data").size("1Gi").selected_node(&node))
        .await;
    rig.wait_bound("data").await;
    assert_never_forbidden(&rig);
    rig.remove_node(&node).await;
    rig.cleanup().await;
}

/// The policy mode (`--admission-intent` with the shipped policies): the control plane makes
/// and drops the intent, the sidecar provisions and deletes under upstream's RBAC.
#[tokio::test]
async fn the_policy_mode_provisions_and_deletes_under_upstreams_rbac() {
    let rig = Rig::builder("uprbac-pol")
        .rbac(Rbac::Upstream)
        .sidecar_args(&["--admission-intent"])
        .start()
        .await;
    let installed = install(
        &rig,
        &[
            "provisioning-intent-policy.yaml",
            "release-intent-policy.yaml",
        ],
    )
    .await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    wait_for("the binder to drop the intent", DEADLINE, || async {
        let c = rig.claims().get("data").await.unwrap();
        if holds_intent(&c) {
            Err(finalizers(&c))
        } else {
            Ok(())
        }
    })
    .await;
    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 1);
    uninstall(&rig, &installed).await;
    assert_never_forbidden(&rig);
    rig.cleanup().await;
}
