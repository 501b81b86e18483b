//! Restore and clone, side by side with upstream: the upstream Go sidecar (v6.4.0) and ours, each
//! next to a test driver of its own with the same capabilities, on the same scenarios. What the
//! backend is asked (the restored or cloned volume's size, parameters and content source), the
//! PV saved and the events on the claims must be the same; where they differ on purpose it is in
//! docs/compatibility.md and normalised here with a comment.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use csi_test_driver::ledger::ContentSource;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use support::{ChildProcess, DEADLINE, Rig, Snapshotter, cluster, wait_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sidecar {
    Upstream,
    Ours,
}

/// What one sidecar did for one scenario, with run-specific names taken out.
#[derive(Debug, PartialEq)]
struct Observed {
    /// (capacity, parameters, content source kind) of the volume made from the source.
    volume: (i64, BTreeMap<String, String>, &'static str),
    /// The PV: capacity, access modes, volume mode, fsType, reclaim policy, attribute keys.
    pv: String,
    /// Events on the new claim: (type, reason, message with names replaced).
    events: Vec<(String, String, String)>,
    /// Events on the claim that asks for a smaller volume than its source.
    refused: Vec<(String, String, String)>,
}

fn start_sidecar(rig: &Rig, who: Sidecar) -> ChildProcess {
    let cluster_bin = |name: &str| support::testbed_bin(name);
    let binary = match who {
        Sidecar::Upstream => cluster_bin("csi-provisioner-upstream"),
        Sidecar::Ours => support::workspace_bin("csi-provisioner"),
    };
    ChildProcess::spawn(
        Command::new(binary)
            .args(&rig.args)
            .args(["--leader-election=false", "--timeout=10s"]),
    )
}

fn with_source(
    rig: &Rig,
    name: &str,
    size: &str,
    group: Option<&str>,
    kind: &str,
    source: &str,
) -> PersistentVolumeClaim {
    let mut claim = rig.claim(name).size(size).build();
    claim.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: group.map(String::from),
        kind: kind.into(),
        name: source.into(),
    });
    claim
}

async fn events(rig: &Rig, claim: &str, replace: &[(&str, &str)]) -> Vec<(String, String, String)> {
    let mut events: Vec<(String, String, String)> = rig
        .events_for(&rig.ns.name, claim)
        .await
        .into_iter()
        // The binder's own events are not the sidecar's.
        .filter(|e| e.reason.as_deref() != Some("ExternalProvisioning"))
        .map(|e| {
            let mut message = e.message.unwrap_or_default();
            for (from, to) in replace {
                message = message.replace(from, to);
            }
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                message,
            )
        })
        .collect();
    events.sort();
    events.dedup();
    events
}

async fn scenario(who: Sidecar, kind: &str) -> Observed {
    let cluster = cluster().await;
    let capability = if kind == "VolumeSnapshot" {
        "+CREATE_DELETE_SNAPSHOT"
    } else {
        "+CLONE_VOLUME"
    };
    let rig = Rig::builder("sbs")
        .driver(|d| d.capabilities = vec![capability.to_string()])
        .class(|c| {
            c.param("type", "fast")
                .param("csi.storage.k8s.io/fstype", "ext4")
        })
        .kubeconfig(cluster.kubeconfig.clone())
        .without_sidecar()
        .start()
        .await;
    let _sidecar = start_sidecar(&rig, who);
    rig.create_claim(rig.claim("source").size("2Gi")).await;
    rig.wait_bound("source").await;
    let snapshotter = if kind == "VolumeSnapshot" {
        let s = Snapshotter::start(&rig).await;
        s.snapshot("snap", "source").await;
        Some(s)
    } else {
        None
    };
    let (group, source) = match kind {
        "VolumeSnapshot" => (Some("snapshot.storage.k8s.io"), "snap"),
        _ => (None, "source"),
    };
    rig.claims()
        .create(
            &Default::default(),
            &with_source(&rig, "copy", "2Gi", group, kind, source),
        )
        .await
        .unwrap();
    rig.claims()
        .create(
            &Default::default(),
            &with_source(&rig, "small", "1Gi", group, kind, source),
        )
        .await
        .unwrap();
    let pv = rig.wait_bound("copy").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    rig.wait_claim_event("small", "ProvisioningFailed", "")
        .await;
    rig.wait_claim_event("copy", "ProvisioningSucceeded", "")
        .await;

    let ledger = rig.ledger().await;
    let volume = ledger.volume_by_name(&pv_name).expect("the new volume");
    let source_kind = match &volume.content_source {
        Some(ContentSource::Snapshot { .. }) => "snapshot",
        Some(ContentSource::Volume { .. }) => "volume",
        None => "none",
    };
    let spec = pv.spec.clone().unwrap();
    let csi = spec.csi.clone().unwrap();
    let mut attribute_keys: Vec<String> = csi
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_keys()
        .collect();
    attribute_keys.sort();
    let pv_summary = format!(
        "capacity={:?} modes={:?} volumeMode={:?} fsType={:?} reclaim={:?} attributes={attribute_keys:?} driver-is-rig={}",
        spec.capacity
            .unwrap_or_default()
            .get("storage")
            .map(|q| q.0.clone()),
        spec.access_modes,
        spec.volume_mode,
        csi.fs_type,
        spec.persistent_volume_reclaim_policy,
        csi.driver == rig.driver_name,
    );
    let replace = [(pv_name.as_str(), "<pv>"), (rig.ns.name.as_str(), "<ns>")];
    let observed = Observed {
        volume: (
            volume.capacity_bytes,
            volume.parameters.clone(),
            source_kind,
        ),
        pv: pv_summary,
        events: events(&rig, "copy", &replace).await,
        refused: events(&rig, "small", &replace).await,
    };
    // Leave nothing behind for the next run.
    for claim in ["small", "copy"] {
        rig.delete_claim(claim).await;
    }
    wait_for("the new volume to go", DEADLINE, || async {
        if rig.ledger().await.volume_by_name(&pv_name).is_some() {
            Err(pv_name.clone())
        } else {
            Ok(())
        }
    })
    .await;
    if let Some(s) = snapshotter {
        s.cleanup().await;
    }
    rig.cleanup().await;
    observed
}

async fn compare(kind: &str) {
    let upstream = scenario(Sidecar::Upstream, kind).await;
    let ours = scenario(Sidecar::Ours, kind).await;
    assert_eq!(ours.volume, upstream.volume, "the backend's request");
    assert_eq!(ours.pv, upstream.pv, "the PV");
    assert_eq!(ours.events, upstream.events, "events on the new claim");
    assert_eq!(
        ours.refused, upstream.refused,
        "events on the refused claim"
    );
}

#[tokio::test]
async fn a_restore_is_what_upstream_makes() {
    compare("VolumeSnapshot").await;
}

#[tokio::test]
async fn a_clone_is_what_upstream_makes() {
    compare("PersistentVolumeClaim").await;
}

/// The key an administrator writes on a VolumeSnapshotContent to let a
/// Filesystem snapshot be restored as a Block volume, as upstream's and
/// external-snapshotter's documentation spell it (written out here, not
/// taken from `keys.rs`, so a wrong constant fails this test).
const ALLOW_MODE_CHANGE: &str = "snapshot.storage.kubernetes.io/allow-volume-mode-change";

/// One sidecar restores a Filesystem snapshot as a Block claim: refused until
/// the content carries the documented annotation, restored after. Returns the
/// refusal's events on the claim.
async fn mode_change(who: Sidecar) -> Vec<(String, String, String)> {
    let cluster = cluster().await;
    let rig = Rig::builder("mode")
        .driver(|d| d.capabilities = vec!["+CREATE_DELETE_SNAPSHOT".to_string()])
        .kubeconfig(cluster.kubeconfig.clone())
        .without_sidecar()
        .start()
        .await;
    let _sidecar = ChildProcess::spawn(
        Command::new(match who {
            Sidecar::Upstream => support::testbed_bin("csi-provisioner-upstream"),
            Sidecar::Ours => support::workspace_bin("csi-provisioner"),
        })
        .args(&rig.args)
        .args([
            "--leader-election=false",
            "--timeout=10s",
            "--retry-interval-max=2s",
        ]),
    );
    rig.create_claim(rig.claim("source")).await;
    rig.wait_bound("source").await;
    let snapshotter = Snapshotter::start(&rig).await;
    let status = snapshotter.snapshot("snap", "source").await;
    let content_name = status["boundVolumeSnapshotContentName"]
        .as_str()
        .expect("the snapshot's content")
        .to_string();
    let contents = Api::<DynamicObject>::all_with(
        rig.client.clone(),
        &support::snapshot_resource("VolumeSnapshotContent"),
    );
    let content = contents.get(&content_name).await.unwrap();
    assert_eq!(
        content.data["spec"]["sourceVolumeMode"], "Filesystem",
        "the content records its volume's mode, so a Block restore is a mode change"
    );

    let mut block = with_source(
        &rig,
        "block",
        "1Gi",
        Some("snapshot.storage.k8s.io"),
        "VolumeSnapshot",
        "snap",
    );
    block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    rig.claims()
        .create(&Default::default(), &block)
        .await
        .unwrap();
    rig.wait_claim_event("block", "ProvisioningFailed", ALLOW_MODE_CHANGE)
        .await;
    let replace = [
        (content_name.as_str(), "<content>"),
        (rig.ns.name.as_str(), "<ns>"),
    ];
    let refused = events(&rig, "block", &replace).await;
    assert!(
        rig.ledger().await.volumes.len() == 1,
        "nothing is restored without the content's consent"
    );

    contents
        .patch(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ALLOW_MODE_CHANGE: "true"}}})),
        )
        .await
        .unwrap();
    let pv = rig.wait_bound("block").await;
    assert_eq!(
        pv.spec.as_ref().unwrap().volume_mode.as_deref(),
        Some("Block")
    );
    for claim in ["block", "source"] {
        rig.delete_claim(claim).await;
    }
    wait_for("the volumes to go", DEADLINE, || async {
        let left = rig.ledger().await.volumes.len();
        if left == 0 { Ok(()) } else { Err(left) }
    })
    .await;
    snapshotter.cleanup().await;
    rig.cleanup().await;
    refused
}

#[tokio::test]
async fn a_block_restore_of_a_filesystem_snapshot_waits_for_the_documented_annotation() {
    let upstream = mode_change(Sidecar::Upstream).await;
    let ours = mode_change(Sidecar::Ours).await;
    assert!(
        ours.iter().any(|e| e.2.contains(ALLOW_MODE_CHANGE)),
        "the refusal names the key to set: {ours:?}"
    );
    assert_eq!(ours, upstream, "the refusal's events, as upstream's");
}
