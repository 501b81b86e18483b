//! CSI migration side by side with upstream: the upstream Go sidecar (v6.4.0) and ours, each
//! next to a test driver that calls itself `ebs.csi.aws.com` (the CSI driver the in-tree
//! `kubernetes.io/aws-ebs` plugin was migrated to), on the same in-tree StorageClass and claim.
//! kube-controller-manager hands such a claim to `ebs.csi.aws.com`; the sidecar must translate the
//! class to the CSI driver's terms, send the same `CreateVolume`, save the same in-tree PV, and
//! delete the volume through the in-tree PV once the claim goes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use support::{
    ChildProcess, DEADLINE, PvcFixture, StorageClassFixture, TestNamespace, cluster, driver_named,
    free_address, unique_name, wait_for,
};

/// A migrated plugin: its CSI driver, its in-tree name, the class parameters of the scenario.
struct Plugin {
    driver: &'static str,
    in_tree: &'static str,
    parameters: &'static [(&'static str, &'static str)],
    /// The class's allowed zones (`topology.kubernetes.io/zone`).
    allowed_zones: &'static [&'static str],
    /// The driver's topology segment (its zone key and zone), reported for each volume.
    topology: Option<(&'static str, &'static str)>,
}

const AWS_EBS: Plugin = Plugin {
    driver: "ebs.csi.aws.com",
    in_tree: "kubernetes.io/aws-ebs",
    // `zone` becomes the driver's allowed topology; its volume's zone the PV's Kubernetes zone
    // and region (node affinity and labels).
    parameters: &[("type", "gp2"), ("fsType", "xfs"), ("zone", "us-east-1a")],
    allowed_zones: &[],
    topology: Some(("topology.ebs.csi.aws.com/zone", "us-east-1a")),
};
const CINDER: Plugin = Plugin {
    driver: "cinder.csi.openstack.org",
    in_tree: "kubernetes.io/cinder",
    parameters: &[("availability", "nova"), ("fstype", "ext4")],
    allowed_zones: &["nova"],
    topology: Some(("topology.cinder.csi.openstack.org/zone", "nova")),
};
const PORTWORX: Plugin = Plugin {
    driver: "pxd.portworx.com",
    in_tree: "kubernetes.io/portworx-volume",
    parameters: &[("repl", "2"), ("fs", "ext4")],
    allowed_zones: &[],
    topology: None,
};

#[derive(Clone, Copy, Debug)]
enum Sidecar {
    Upstream,
    Ours,
}

/// What one sidecar did, with run-specific names taken out.
#[derive(Debug, PartialEq)]
struct Observed {
    /// The backend's volume: capacity and parameters.
    volume: (i64, BTreeMap<String, String>),
    /// The PV's source and the annotations a tool would read.
    pv: String,
    /// `DeleteVolume` calls that deleted the volume.
    deleted: usize,
    /// The `migrated` label of `csi_sidecar_operations_seconds`, per gRPC method (of the methods
    /// both sidecars call after start-up).
    migrated: BTreeMap<String, BTreeSet<String>>,
}

/// The methods whose `migrated` label is compared: the create and delete of the migrated volume
/// and a start-up call that is not about a volume.
const LABELLED: [&str; 3] = [
    "/csi.v1.Controller/CreateVolume",
    "/csi.v1.Controller/DeleteVolume",
    "/csi.v1.Controller/ControllerGetCapabilities",
];

/// `method_name` → the `migrated` values of its `csi_sidecar_operations_seconds_count` samples
/// (`-` where the label is absent), for the methods in [`LABELLED`].
fn migrated_labels(body: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("csi_sidecar_operations_seconds_count{") else {
            continue;
        };
        let labels = rest.split('}').next().unwrap_or_default();
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k.trim() == name).then(|| v.trim_matches('"').to_string())
            })
        };
        let Some(method) = label("method_name") else {
            continue;
        };
        if LABELLED.contains(&method.as_str()) {
            out.entry(method)
                .or_default()
                .insert(label("migrated").unwrap_or_else(|| "-".into()));
        }
    }
    out
}

fn tail(sidecar: &ChildProcess) -> String {
    let log = sidecar.log_contents();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

async fn scenario(plugin: &Plugin, who: Sidecar) -> Observed {
    let cluster = cluster().await;
    let (_dir, driver) = driver_named(plugin.driver, plugin.topology).await;
    let ns = TestNamespace::create(&cluster.client, "migration").await;
    let class = unique_name("in-tree");
    let mut fixture = StorageClassFixture::new(&class, plugin.in_tree)
        .reclaim("Delete")
        .binding_mode("Immediate");
    for (k, v) in plugin.parameters {
        fixture = fixture.param(k, v);
    }
    if !plugin.allowed_zones.is_empty() {
        fixture = fixture.allowed_topology("topology.kubernetes.io/zone", plugin.allowed_zones);
    }
    Api::<StorageClass>::all(cluster.client.clone())
        .create(&PostParams::default(), &fixture.build())
        .await
        .expect("creating the in-tree class");
    let binary = match who {
        Sidecar::Upstream => support::testbed_bin("csi-provisioner-upstream"),
        Sidecar::Ours => support::workspace_bin("csi-provisioner"),
    };
    let address = free_address();
    let sidecar = ChildProcess::spawn(Command::new(binary).args([
        format!("--csi-address={}", driver.csi_address()),
        format!("--http-endpoint={address}"),
        format!("--kubeconfig={}", cluster.kubeconfig.display()),
        "--leader-election=false".into(),
        "--timeout=10s".into(),
        "-v=5".into(),
    ]));
    let claims = ns.api();
    claims
        .create(
            &PostParams::default(),
            &PvcFixture::new("data", &ns.name)
                .class(&class)
                .size("2Gi")
                .build(),
        )
        .await
        .expect("creating the claim");
    let pv_name = wait_for("the claim to be Bound", DEADLINE, || async {
        let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            claims.get("data").await.expect("reading the claim");
        match (
            claim.status.as_ref().and_then(|s| s.phase.as_deref()),
            claim.spec.as_ref().and_then(|s| s.volume_name.clone()),
        ) {
            (Some("Bound"), Some(pv)) => Ok(pv),
            _ => Err((claim.metadata.annotations, tail(&sidecar))),
        }
    })
    .await;
    let pvs = Api::<PersistentVolume>::all(cluster.client.clone());
    let pv = pvs.get(&pv_name).await.expect("reading the PV");
    let control = driver.control().await.expect("driver control");
    let ledger = control.ledger().await.expect("ledger");
    let volume = ledger.volume_by_name(&pv_name).expect("the backend volume");
    let volume_id = volume.volume_id.clone();
    let spec = pv.spec.clone().unwrap();
    // The in-tree source, whichever plugin: its volume id and fsType.
    let source = serde_json::to_value(&spec).unwrap();
    let (field, in_tree_id, in_tree_fs, keys) = [
        ("awsElasticBlockStore", "volumeID"),
        ("cinder", "volumeID"),
        ("portworxVolume", "volumeID"),
    ]
    .iter()
    .find_map(|(field, id)| {
        let s = source.get(field)?;
        let mut keys: Vec<String> = s.as_object()?.keys().cloned().collect();
        keys.sort();
        Some((
            *field,
            s.get(id)?.as_str()?.to_string(),
            s.get("fsType").and_then(|f| f.as_str()).map(String::from),
            keys,
        ))
    })
    .expect("the PV is saved in its in-tree form");
    let mut annotations: Vec<(String, String)> = pv
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io"))
        .collect();
    annotations.sort();
    let pv_summary = format!(
        "csi={} in-tree=(volumeID-is-handle={} fsType={:?}) source={field}{keys:?} capacity={:?} modes={:?} reclaim={:?} annotations={annotations:?} finalizers={:?} labels={:?} affinity={}",
        spec.csi.is_some(),
        in_tree_id == volume_id,
        in_tree_fs,
        spec.capacity
            .unwrap_or_default()
            .get("storage")
            .map(|q| q.0.clone()),
        spec.access_modes,
        spec.persistent_volume_reclaim_policy,
        pv.metadata.finalizers,
        pv.metadata.labels,
        serde_json::to_string(&spec.node_affinity).unwrap(),
    );
    let volume = (volume.capacity_bytes, volume.parameters.clone());

    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("deleting the claim");
    wait_for("the volume and the PV to go", DEADLINE, || async {
        let ledger = control.ledger().await.expect("ledger");
        let gone = pvs
            .get_opt(&pv_name)
            .await
            .expect("reading the PV")
            .is_none();
        if ledger.volumes.is_empty() && gone {
            Ok(())
        } else {
            Err((gone, tail(&sidecar)))
        }
    })
    .await;
    let deleted = control
        .ledger()
        .await
        .expect("ledger")
        .operations
        .iter()
        .filter(|o| o.method == "DeleteVolume" && o.volume_id.as_deref() == Some(&volume_id))
        .count();
    // The DeleteVolume sample is recorded when the call returns: scrape until it shows.
    let migrated = wait_for("the DeleteVolume metric", DEADLINE, || async {
        let body = support::get(&address, "/metrics", None)
            .await
            .map_err(|e| e.to_string())?
            .body;
        let labels = migrated_labels(&body);
        if labels.contains_key(LABELLED[1]) {
            Ok(labels)
        } else {
            Err(body)
        }
    })
    .await;
    drop(sidecar);
    Api::<StorageClass>::all(cluster.client.clone())
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the class");
    ns.cleanup().await;
    Observed {
        volume,
        pv: pv_summary,
        deleted,
        migrated,
    }
}

async fn compare(plugin: &Plugin) {
    let upstream = scenario(plugin, Sidecar::Upstream).await;
    let ours = scenario(plugin, Sidecar::Ours).await;
    eprintln!("upstream: {upstream:?}");
    assert_eq!(ours.volume, upstream.volume, "the backend's request");
    assert_eq!(ours.pv, upstream.pv, "the PV");
    assert_eq!(ours.deleted, 1, "the volume deleted once");
    assert_eq!(
        ours.migrated, upstream.migrated,
        "the migrated label of the CSI calls"
    );
    assert_eq!(
        ours.migrated[LABELLED[0]],
        BTreeSet::from(["true".to_string()]),
        "the migrated volume's CreateVolume"
    );
    assert!(upstream.deleted >= 1);
}

// One test: the in-tree classes are cluster-wide, and two sidecars of one driver must not see
// each other's claims.
#[tokio::test]
async fn in_tree_claims_are_provisioned_as_upstream_does() {
    for plugin in [&AWS_EBS, &CINDER, &PORTWORX] {
        compare(plugin).await;
    }
}

/// An in-tree PV whose source does not translate (a GCE PD whose zone label names no region) is
/// not
/// touched when it is released: a `VolumeFailedDelete` warning says why, the PV is not made
/// Terminating, no `DeleteVolume` is sent.
#[tokio::test]
async fn an_in_tree_pv_that_does_not_translate_is_left_with_a_reason() {
    use kube::api::ListParams;
    let cluster = cluster().await;
    // Not a driver of the side-by-side test, which runs at the same time.
    let (_dir, driver) = driver_named("pd.csi.storage.gke.io", None).await;
    let name = unique_name("pv-bad-gce");
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd"},
            "labels": {"failure-domain.beta.kubernetes.io/zone": "bad__zone"},
            "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "gcePersistentDisk": {"pdName": "disk-1"},
            "claimRef": {"namespace": "default", "name": "gone", "uid": "00000000-0000-0000-0000-000000000001"},
        }
    }))
    .unwrap();
    let pvs = Api::<PersistentVolume>::all(cluster.client.clone());
    pvs.create(&PostParams::default(), &pv)
        .await
        .expect("creating the PV");
    let sidecar = ChildProcess::spawn(
        Command::new(support::workspace_bin("csi-provisioner")).args([
            format!("--csi-address={}", driver.csi_address()),
            format!("--kubeconfig={}", cluster.kubeconfig.display()),
            "--leader-election=false".into(),
            "-v=5".into(),
        ]),
    );
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client.clone(), "default");
    let message = wait_for("a VolumeFailedDelete event on the PV", DEADLINE, || async {
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .expect("listing events");
        list.items
            .into_iter()
            // Ours, not kube-controller-manager's.
            .filter(|e| e.reason.as_deref() == Some("VolumeFailedDelete"))
            .filter_map(|e| e.message)
            .find(|m| m.contains("zone in unexpected format"))
            .ok_or_else(|| tail(&sidecar))
    })
    .await;
    assert!(message.contains("bad"), "{message}");
    let now = pvs.get(&name).await.expect("the PV is still there");
    assert!(
        now.metadata.deletion_timestamp.is_none(),
        "not made Terminating"
    );
    let ledger = driver.control().await.unwrap().ledger().await.unwrap();
    assert_eq!(ledger.calls.get("DeleteVolume"), None, "no DeleteVolume");
    drop(sidecar);
    // Clean up: our finalizer off, then the PV.
    let _ = pvs
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = pvs.delete(&name, &DeleteParams::default()).await;
}
