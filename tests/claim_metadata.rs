//! Claim and namespace metadata passed on, opt-in and allow-listed: a claim's labels copied onto
//! its PV (`--copy-pvc-labels`; upstream #760/#731, never built there), and the listed labels and
//! annotations of the claim and of its namespace sent to the driver as `CreateVolume` parameters
//! (`--extra-create-metadata-{pvc,namespace}-{labels,annotations}`; upstream #86, PR #1531 for the
//! namespace's). Side by side with upstream v6.4, which has neither: without the flags ours sends
//! and copies exactly what it does.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::{Rig, Sidecar};

/// One sidecar (with `flags`) provisions a labelled claim; the labels of its PV.
async fn pv_labels(who: Sidecar, flags: &[&str]) -> BTreeMap<String, String> {
    let mut rig = Rig::builder("pvc-labels").start_for(who).await;
    let _upstream = rig.start_as(who, flags);
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

/// What the claim's namespace carries in the metadata tests.
async fn label_namespace(rig: &Rig, annotation: &str) {
    Api::<Namespace>::all(rig.client.clone())
        .patch(
            &rig.ns.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"tier": "gold", "unlisted": "x"},
                "annotations": {"example.com/account": annotation},
            }})),
        )
        .await
        .expect("labelling the namespace");
}

/// The flags that send every kind of listed metadata to the driver.
const METADATA_FLAGS: [&str; 4] = [
    "--extra-create-metadata-pvc-labels=team,absent",
    "--extra-create-metadata-pvc-annotations=example.com/owner",
    "--extra-create-metadata-namespace-labels=tier",
    "--extra-create-metadata-namespace-annotations=example.com/account,example.com/absent",
];

/// One sidecar (with `flags` and `--extra-create-metadata`) provisions a claim with labels and
/// annotations in a namespace with labels and annotations; the parameters the driver got, with
/// the run's names replaced.
async fn parameters_sent(who: Sidecar, flags: &[&str]) -> BTreeMap<String, String> {
    let mut rig = Rig::builder("ns-meta")
        .class(|c| c.param("type", "fast"))
        .start_for(who)
        .await;
    label_namespace(&rig, "acct-123").await;
    let mut args = vec!["--leader-election=false", "--extra-create-metadata"];
    args.extend(flags);
    let _upstream = rig.start_as(who, &args);
    rig.create_claim(
        rig.claim("data")
            .label("team", "payments")
            .label("app", "db")
            .annotation("example.com/owner", "jo"),
    )
    .await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let parameters = rig
        .ledger()
        .await
        .volume_by_name(&pv_name)
        .expect("the volume")
        .parameters
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.replace(&pv_name, "<pv>").replace(&rig.ns.name, "<ns>"),
            )
        })
        .collect();
    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    rig.cleanup().await;
    parameters
}

#[tokio::test]
async fn only_the_listed_claim_and_namespace_metadata_reach_the_driver() {
    let upstream = parameters_sent(Sidecar::Upstream, &[]).await;
    let ours_default = parameters_sent(Sidecar::Ours, &[]).await;
    let extra_create_metadata: BTreeMap<String, String> = [
        ("type", "fast"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "<ns>"),
        ("csi.storage.k8s.io/pv/name", "<pv>"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_eq!(upstream, extra_create_metadata, "upstream v6.4");
    assert_eq!(ours_default, upstream, "nothing more unless listed");

    let ours = parameters_sent(Sidecar::Ours, &METADATA_FLAGS).await;
    let mut want = extra_create_metadata;
    want.extend(
        [
            ("csi.storage.k8s.io/pvc/labels/team", "payments"),
            ("csi.storage.k8s.io/pvc/annotations/example.com/owner", "jo"),
            ("csi.storage.k8s.io/namespace/labels/tier", "gold"),
            (
                "csi.storage.k8s.io/namespace/annotations/example.com/account",
                "acct-123",
            ),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    assert_eq!(
        ours, want,
        "the listed keys the objects have, and nothing else"
    );
}

#[tokio::test]
async fn a_value_no_driver_can_take_fails_provisioning_naming_its_key_until_fixed() {
    let mut rig = Rig::builder("ns-meta-bad").without_sidecar().start().await;
    let too_long = "x".repeat(200);
    label_namespace(&rig, &too_long).await;
    rig.args.extend(
        ["--leader-election=false", "--retry-interval-max=2s"]
            .into_iter()
            .chain(METADATA_FLAGS)
            .map(String::from),
    );
    rig.start_sidecar();
    rig.create_claim(rig.claim("data")).await;
    let event = rig
        .wait_claim_event(
            "data",
            "ProvisioningFailed",
            "namespace annotation \"example.com/account\"",
        )
        .await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("200 bytes, more than the 128 bytes"),
        "{message}"
    );
    assert!(
        !message.contains(&too_long),
        "the value is not shown: {message}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 0);

    // Fixed on the namespace (the claim is not touched): the next retry provisions it.
    label_namespace(&rig, "acct-9").await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let ledger = rig.ledger().await;
    let volume = ledger.volume_by_name(&pv_name).expect("the volume");
    assert_eq!(
        volume.parameters["csi.storage.k8s.io/namespace/annotations/example.com/account"],
        "acct-9"
    );
    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    rig.cleanup().await;
}
