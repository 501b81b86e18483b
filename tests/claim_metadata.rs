//! Claim metadata passed on, opt-in and allow-listed: a claim's labels copied onto its PV
//! (`--copy-pvc-labels`; upstream #760/#731, never built there). Side by side with upstream v6.3,
//! which copies nothing: without the flag ours copies nothing either.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use support::{ChildProcess, Rig, cluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sidecar {
    Upstream,
    Ours,
}

/// One sidecar (with `flags`) provisions a labelled claim; the labels of its PV.
async fn pv_labels(who: Sidecar, flags: &[&str]) -> BTreeMap<String, String> {
    let builder = Rig::builder("pvc-labels");
    let (rig, _upstream) = match who {
        // Ours under the shipped RBAC.
        Sidecar::Ours => (builder.sidecar_args(flags).start().await, None),
        Sidecar::Upstream => {
            let rig = builder
                .kubeconfig(cluster().await.kubeconfig.clone())
                .without_sidecar()
                .start()
                .await;
            let upstream = ChildProcess::spawn(
                Command::new(support::testbed_bin("csi-provisioner-upstream"))
                    .args(&rig.args)
                    .args(flags),
            );
            (rig, Some(upstream))
        }
    };
    rig.create_claim(
        rig.claim("data")
            .label("team", "payments")
            .label("example.com/cost-center", "cc-42")
            .label("app", "db"),
    )
    .await;
    let pv = rig.wait_bound("data").await;
    rig.delete_claim("data").await;
    rig.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    rig.cleanup().await;
    pv.metadata.labels.unwrap_or_default()
}

#[tokio::test]
async fn only_the_listed_claim_labels_are_copied_onto_the_pv() {
    let upstream = pv_labels(Sidecar::Upstream, &["--leader-election=false"]).await;
    let ours_default = pv_labels(Sidecar::Ours, &[]).await;
    assert!(upstream.is_empty(), "upstream copies nothing: {upstream:?}");
    assert_eq!(ours_default, upstream, "nothing is copied unless asked");

    let ours = pv_labels(
        Sidecar::Ours,
        &[
            "--copy-pvc-labels=team",
            "--copy-pvc-labels=example.com/cost-center,absent",
        ],
    )
    .await;
    assert_eq!(
        ours,
        BTreeMap::from([
            ("example.com/cost-center".to_string(), "cc-42".to_string()),
            ("team".to_string(), "payments".to_string()),
        ]),
        "the listed keys the claim has, and nothing else"
    );
}

#[tokio::test]
async fn a_scheduling_label_is_refused_at_start_up() {
    let out = Command::new(support::workspace_bin("csi-provisioner"))
        .args([
            "--csi-address=/nonexistent.sock",
            "--copy-pvc-labels=team,topology.kubernetes.io/zone",
        ])
        .output()
        .expect("running csi-provisioner");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("topology.kubernetes.io/zone cannot be copied"),
        "{stderr}"
    );
}
