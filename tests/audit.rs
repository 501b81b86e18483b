//! `csi-provisioner audit` end to end: each kind of finding made for real with the test
//! driver and the control plane (a volume no PersistentVolume points to, a PersistentVolume
//! whose volume the backend lost, a claim stuck holding the provisioning intent), a clean
//! cluster, a driver without LIST_VOLUMES, the recheck, in-tree PersistentVolumes of a migrated
//! plugin, and the exit codes.
//!
//! Every audit runs under deploy/kubernetes/audit-rbac.yaml, as the ServiceAccount of that
//! file (a real token): an identity that can only list, so an audit that tried to write would
//! fail. And the driver's ledger shows no CreateVolume or DeleteVolume from any audit.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use csi_provisioner::csi::pb;
use csi_provisioner::keys;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::Ledger;
use csi_test_driver::process::DriverProcess;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{DEADLINE, PvFixture, Rig, cluster, driver_named, k8s_keys, wait_for, workspace_bin};
use tokio::sync::OnceCell;

const AUDIT_RBAC: &str = "deploy/kubernetes/audit-rbac.yaml";
const FIELD_MANAGER: &str = "csi-provisioner-tests";

/// The exit statuses `csi-provisioner audit --help` promises.
const CLEAN: i32 = 0;
const ERROR: i32 = 1;
const USAGE: i32 = 2;
const FINDINGS: i32 = 3;

/// Applies the shipped audit RBAC (once per test binary) and returns a kubeconfig holding a
/// token of its ServiceAccount, after checking that this identity can list but not write.
async fn read_only_kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceCell<PathBuf> = OnceCell::const_new();
    KUBECONFIG
        .get_or_init(|| async {
            let cluster = cluster().await;
            let client = cluster.client.clone();
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(AUDIT_RBAC);
            let text = std::fs::read_to_string(&path).expect("reading the audit RBAC");
            let docs: Vec<Value> =
                serde_saphyr::from_multiple(&text).expect("the audit RBAC is YAML");
            let mut account = None;
            for doc in docs.into_iter().filter(|d| !d.is_null()) {
                let name = doc["metadata"]["name"].as_str().unwrap().to_string();
                let ssa = PatchParams::apply(FIELD_MANAGER).force();
                match doc["kind"].as_str().unwrap() {
                    "ServiceAccount" => {
                        let ns = doc["metadata"]["namespace"].as_str().unwrap().to_string();
                        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                            .patch(&name, &ssa, &Patch::Apply(&doc))
                            .await
                            .expect("applying the ServiceAccount");
                        account = Some((ns, name));
                    }
                    "ClusterRole" => {
                        Api::<ClusterRole>::all(client.clone())
                            .patch(&name, &ssa, &Patch::Apply(&doc))
                            .await
                            .expect("applying the ClusterRole");
                    }
                    "ClusterRoleBinding" => {
                        Api::<ClusterRoleBinding>::all(client.clone())
                            .patch(&name, &ssa, &Patch::Apply(&doc))
                            .await
                            .expect("applying the ClusterRoleBinding");
                    }
                    other => panic!("{AUDIT_RBAC}: unexpected kind {other}"),
                }
            }
            let (ns, name) = account.expect("the audit RBAC has a ServiceAccount");
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let token = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                .create_token_request(&name, &PostParams::default(), &request)
                .await
                .expect("a token for the audit ServiceAccount")
                .status
                .expect("the token request's status")
                .token;

            // The admin kubeconfig's server and CA, with the ServiceAccount's token.
            let admin: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(&cluster.kubeconfig).expect("the admin kubeconfig"),
            )
            .expect("the admin kubeconfig is YAML");
            let kubeconfig = json!({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "testbed", "cluster": admin["clusters"][0]["cluster"]}],
                "users": [{"name": "audit", "user": {"token": token}}],
                "contexts": [{"name": "audit", "context": {"cluster": "testbed", "user": "audit"}}],
                "current-context": "audit",
            });
            let path = cluster.dir.join("kubeconfig-audit");
            std::fs::write(&path, kubeconfig.to_string()).expect("writing the audit kubeconfig");

            // Allowed to list (once the authorizer has seen the binding), refused a write.
            let reader = cluster.client_for(&path).await;
            let volumes: Api<PersistentVolume> = Api::all(reader);
            wait_for(
                "the audit identity to be allowed to list",
                DEADLINE,
                || async {
                    volumes
                        .list(&ListParams::default().limit(1))
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                },
            )
            .await;
            let refused = volumes
                .create(
                    &PostParams::default(),
                    &PvFixture::new("audit-may-not").build(),
                )
                .await
                .expect_err("the audit identity must not create PersistentVolumes");
            assert!(
                matches!(&refused, kube::Error::Api(s) if s.code == 403),
                "{refused}"
            );
            path
        })
        .await
}

/// Runs `csi-provisioner audit` against the rig's driver as the read-only identity.
async fn audit(rig: &Rig, args: &[&str]) -> Output {
    audit_of(&rig.driver, args).await
}

/// Runs `csi-provisioner audit` against `driver` as the read-only identity.
async fn audit_of(driver: &DriverProcess, args: &[&str]) -> Output {
    audit_command_for(driver, args)
        .await
        .output()
        .await
        .expect("running csi-provisioner audit")
}

async fn audit_command(rig: &Rig, args: &[&str]) -> tokio::process::Command {
    audit_command_for(&rig.driver, args).await
}

async fn audit_command_for(driver: &DriverProcess, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(workspace_bin("csi-provisioner"));
    command
        .arg("audit")
        .arg(format!("--csi-address={}", driver.csi_address()))
        .arg(format!(
            "--kubeconfig={}",
            read_only_kubeconfig().await.display()
        ))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("audit killed: {output:?}"))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn json_report(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("audit --output=json printed no JSON ({e}): {output:?}"))
}

fn findings_of<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// What the driver was asked to create or delete so far.
fn writes(ledger: &Ledger) -> (u64, u64, usize) {
    (
        ledger.call_count("CreateVolume"),
        ledger.call_count("DeleteVolume"),
        ledger.operations.len(),
    )
}

/// `CreateVolume(name)` sent straight to the driver, as a provisioner that never saved a
/// PersistentVolume would have; returns the volume ID.
async fn backend_volume(rig: &Rig, name: &str) -> String {
    volume_on(&rig.driver, name).await
}

/// `CreateVolume(name)` sent straight to `driver`; returns the volume ID.
async fn volume_on(driver: &DriverProcess, name: &str) -> String {
    let channel = csi_proto::connect_unix(&driver.endpoint)
        .await
        .expect("connecting to the driver");
    let mut controller = pb::controller_client::ControllerClient::new(channel);
    let capability = pb::VolumeCapability {
        access_type: Some(pb::volume_capability::AccessType::Mount(
            pb::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(pb::volume_capability::AccessMode {
            mode: pb::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    controller
        .create_volume(pb::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability],
            ..Default::default()
        })
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
        .volume_id
}

fn random_uid() -> String {
    let b: [u8; 16] = rand::random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn holds_intent(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == keys::FINALIZER_PVC_INTENT)
}

async fn wait_intent(rig: &Rig, name: &str, held: bool) -> PersistentVolumeClaim {
    let claims = rig.claims();
    wait_for(
        &format!("claim {name} to hold the intent: {held}"),
        DEADLINE,
        || async {
            let claim = claims.get(name).await.expect("reading the claim");
            if holds_intent(&claim) == held {
                Ok(claim)
            } else {
                Err(claim.metadata.finalizers)
            }
        },
    )
    .await
}

/// Takes every finalizer off the claims and PersistentVolumes a test left behind (no sidecar
/// runs any more to do it) and deletes them, so the namespace can go.
async fn tidy(rig: &Rig, claims: &[&str], volumes: &[&str]) {
    let strip = json!({"metadata": {"finalizers": null}});
    for name in claims {
        let _ = rig
            .claims()
            .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
            .await;
        rig.delete_claim(name).await;
    }
    for name in volumes {
        let _ = rig
            .volumes()
            .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
            .await;
        let _ = rig.volumes().delete(name, &DeleteParams::default()).await;
    }
}

#[tokio::test]
async fn after_normal_provisioning_there_is_nothing_to_report() {
    let rig = Rig::builder("audit-clean").start().await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let before = rig.ledger().await;

    let output = audit(&rig, &["--output=json"]).await;
    assert_eq!(code(&output), CLEAN, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["driver"], rig.driver_name.as_str());
    assert_eq!(report["listVolumes"], true);
    assert_eq!(report["backendVolumes"], 1);
    assert_eq!(report["persistentVolumes"], 1);
    assert_eq!(report["findings"], json!([]));
    assert_eq!(report["inProgress"], json!([]));

    let output = audit(&rig, &[]).await;
    assert_eq!(code(&output), CLEAN, "{output:?}");
    let text = stdout(&output);
    assert!(
        text.starts_with(&format!(
            "Driver {}: 1 volume(s) listed by the driver, 1 PersistentVolume(s)",
            rig.driver_name
        )),
        "{text}"
    );
    assert!(text.ends_with("\nNo findings.\n"), "{text}");

    // A reader that has gone away before the report is written: no panic, the usual status.
    let mut child = audit_command(&rig, &[])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the audit");
    drop(child.stdout.take());
    let closed = child.wait_with_output().await.expect("the audit's end");
    assert_eq!(code(&closed), CLEAN, "{closed:?}");
    assert_eq!(String::from_utf8_lossy(&closed.stderr), "");

    let after = rig.ledger().await;
    assert_eq!(
        writes(&after),
        writes(&before),
        "the audit asked the driver to write"
    );
    assert!(after.call_count("ListVolumes") >= before.call_count("ListVolumes") + 3);
    assert!(rig.volumes().get_opt(&pv_name).await.unwrap().is_some());
    rig.cleanup().await;
}

#[tokio::test]
async fn each_kind_of_finding_is_reported_and_nothing_is_changed() {
    let mut rig = Rig::builder("audit-findings")
        .driver(|d| d.volume_id_with_name = true)
        .sidecar_args(&["--retry-interval-start=200ms", "--retry-interval-max=1s"])
        .start()
        .await;

    // A claim provisioned as usual (its intent released once bound)...
    let kept = rig.create_claim(rig.claim("kept")).await;
    let kept_uid = kept.metadata.uid.clone().unwrap();
    let kept_pv = rig.wait_bound("kept").await;
    let kept_pv_name = kept_pv.metadata.name.clone().unwrap();
    let kept_handle = kept_pv.spec.unwrap().csi.unwrap().volume_handle;
    wait_intent(&rig, "kept", false).await;

    // ...and one whose CreateVolume keeps failing: it holds the intent, left so by a
    // sidecar that stopped.
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::Unavailable,
                count: 1_000_000,
                message: None,
            },
        )
        .await
        .unwrap();
    let stuck = rig.create_claim(rig.claim("stuck")).await;
    let stuck_uid = stuck.metadata.uid.clone().unwrap();
    wait_intent(&rig, "stuck", true).await;
    wait_for("a refused CreateVolume", DEADLINE, || async {
        let calls = rig.ledger().await.call_count("CreateVolume");
        if calls >= 2 { Ok(()) } else { Err(calls) }
    })
    .await;
    rig.kill_sidecar();
    rig.control.clear_faults().await.unwrap();

    // The backend loses the kept claim's volume; volumes appear that no PV points to: one
    // named for a claim that never existed, one named by hand, a second one for the kept
    // claim, and one for the stuck claim (which still waits for it: not a finding).
    rig.control.lose_volume(&kept_handle).await.unwrap();
    let never_uid = random_uid();
    let never = backend_volume(&rig, &format!("pvc-{never_uid}")).await;
    let by_hand = backend_volume(&rig, "made-by-hand").await;
    let duplicate = backend_volume(&rig, &format!("pvc-{kept_uid}")).await;
    let waiting = backend_volume(&rig, &format!("pvc-{stuck_uid}")).await;
    // The stuck claim's intent must be older than the threshold used below.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rig.ledger().await;

    let output = audit(
        &rig,
        &[
            "--intent-older-than=1s",
            "--recheck-after=0s",
            "--output=json",
        ],
    )
    .await;
    assert_eq!(code(&output), FINDINGS, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["backendVolumes"], 4);
    assert_eq!(report["persistentVolumes"], 1);
    assert_eq!(report["claimsHoldingIntent"], 1);
    assert_eq!(report["recheckedAfter"], Value::Null);

    let orphaned = findings_of(&report, "orphanedVolume");
    let orphan = |id: &str| {
        *orphaned
            .iter()
            .find(|f| f["volumeId"] == id)
            .unwrap_or_else(|| panic!("{id} not reported: {report:#}"))
    };
    assert_eq!(orphaned.len(), 3, "{report:#}");
    assert_eq!(orphan(&never)["claimUid"], never_uid.as_str());
    assert_eq!(orphan(&never)["claim"], json!({"state": "gone"}));
    assert_eq!(orphan(&never)["capacityBytes"], 1 << 30);
    assert_eq!(orphan(&by_hand)["claimUid"], Value::Null);
    assert_eq!(orphan(&by_hand)["claim"], Value::Null);
    assert_eq!(orphan(&duplicate)["claimUid"], kept_uid.as_str());
    assert_eq!(
        orphan(&duplicate)["claim"],
        json!({"state": "found", "claim": format!("{}/kept", rig.ns.name), "phase": "Bound",
               "volumeName": kept_pv_name, "deleting": false})
    );

    assert_eq!(
        findings_of(&report, "missingVolume"),
        vec![
            &json!({"kind": "missingVolume", "persistentVolume": kept_pv_name,
                     "volumeHandle": kept_handle, "phase": "Bound",
                     "claim": format!("{}/kept", rig.ns.name)})
        ]
    );

    let stale = findings_of(&report, "staleIntent");
    assert_eq!(stale.len(), 1, "{report:#}");
    assert_eq!(stale[0]["claim"], format!("{}/stuck", rig.ns.name));
    assert_eq!(stale[0]["uid"], stuck_uid.as_str());
    assert_eq!(stale[0]["phase"], "Pending");
    assert_eq!(stale[0]["sinceFrom"], "managedFields");

    assert_eq!(
        report["inProgress"],
        json!([{"kind": "volumeBeingProvisioned", "volumeId": waiting,
                "claim": format!("{}/stuck", rig.ns.name), "deleting": false}])
    );

    // The same as a table, for a person.
    let output = audit(&rig, &["--intent-older-than=1s", "--recheck-after=0s"]).await;
    assert_eq!(code(&output), FINDINGS, "{output:?}");
    let text = stdout(&output);
    for line in [
        "Volumes no PersistentVolume points to (3):",
        "PersistentVolumes whose volume the driver does not list (1):",
        "Claims holding the provisioning intent for more than 1s (1):",
        "In progress, not findings (1):",
        "5 finding(s). Nothing was changed.",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{text}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.contains(&by_hand) && l.contains("1Gi") && l.ends_with(" -")),
        "{text}"
    );

    // With the defaults (10m, a recheck after 5s) the stuck claim is not old enough, and
    // the rest is still there at the second look.
    let output = audit(&rig, &["--output=json"]).await;
    assert_eq!(code(&output), FINDINGS, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["recheckedAfter"], "5s");
    assert_eq!(report["clearedOnRecheck"], 0);
    assert_eq!(findings_of(&report, "orphanedVolume").len(), 3);
    assert_eq!(findings_of(&report, "missingVolume").len(), 1);
    assert_eq!(findings_of(&report, "staleIntent").len(), 0);

    // Nothing was created or deleted, on either side.
    let after = rig.ledger().await;
    assert_eq!(
        writes(&after),
        writes(&before),
        "the audit asked the driver to write"
    );
    assert_eq!(after.volumes.len(), 4);
    assert!(
        wait_intent(&rig, "stuck", true)
            .await
            .spec
            .unwrap()
            .volume_name
            .is_none()
    );
    assert!(
        rig.volumes()
            .get_opt(&kept_pv_name)
            .await
            .unwrap()
            .is_some()
    );

    tidy(&rig, &["stuck", "kept"], &[&kept_pv_name]).await;
    rig.cleanup().await;
}

/// A PersistentVolume of the in-tree EBS plugin as the sidecar saves it for a claim of an
/// in-tree class migrated to `ebs.csi.aws.com`: the volume is named the in-tree way.
fn in_tree_ebs_pv(name: &str, volume_id: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            keys::ANN_PROVISIONED_BY: "kubernetes.io/aws-ebs",
            keys::ANN_MIGRATED_TO: MIGRATED_DRIVER}},
        "spec": {"awsElasticBlockStore": {"volumeID": volume_id, "fsType": "ext4"},
                 "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain"}
    }))
    .expect("an in-tree PersistentVolume")
}

/// The CSI driver the in-tree `kubernetes.io/aws-ebs` plugin was migrated to.
const MIGRATED_DRIVER: &str = "ebs.csi.aws.com";

#[tokio::test]
async fn a_migrated_in_tree_persistent_volume_points_to_its_volume() {
    // A driver that calls itself `ebs.csi.aws.com` (the migration test may run one too, and
    // make in-tree PVs of its own meanwhile: only this test's objects are looked at).
    let cluster = cluster().await;
    let (_dir, driver) = driver_named(MIGRATED_DRIVER, None).await;
    let control = driver.control().await.expect("driver control");
    let kept = volume_on(&driver, &format!("pvc-{}", random_uid())).await;
    let lost = volume_on(&driver, &format!("pvc-{}", random_uid())).await;
    control.lose_volume(&lost).await.unwrap();
    let volumes: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let kept_pv = support::unique_name("audit-in-tree");
    let lost_pv = support::unique_name("audit-in-tree-lost");
    for (name, id) in [
        (&kept_pv, format!("aws://us-east-1a/{kept}")),
        (&lost_pv, lost.clone()),
    ] {
        volumes
            .create(&PostParams::default(), &in_tree_ebs_pv(name, &id))
            .await
            .expect("creating the in-tree PersistentVolume");
        wait_for("the PersistentVolume to be Available", DEADLINE, || async {
            let pv = volumes
                .get(name)
                .await
                .expect("reading the PersistentVolume");
            match pv.status.and_then(|s| s.phase) {
                Some(phase) if phase == "Available" => Ok(()),
                other => Err(other),
            }
        })
        .await;
    }

    let output = audit_of(&driver, &["--recheck-after=0s", "--output=json"]).await;
    // Gone before anything is asserted: no other test's audit of this driver name finds them.
    for name in [&kept_pv, &lost_pv] {
        let _ = volumes.delete(name, &DeleteParams::default()).await;
    }
    assert_eq!(code(&output), FINDINGS, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["driver"], MIGRATED_DRIVER);
    assert!(
        !findings_of(&report, "orphanedVolume")
            .iter()
            .any(|f| f["volumeId"] == kept.as_str()),
        "the volume of an in-tree PersistentVolume reported as orphaned: {report:#}"
    );
    let missing: Vec<&Value> = findings_of(&report, "missingVolume")
        .into_iter()
        .filter(|f| {
            f["persistentVolume"] == kept_pv.as_str() || f["persistentVolume"] == lost_pv.as_str()
        })
        .collect();
    assert_eq!(
        missing,
        vec![
            &json!({"kind": "missingVolume", "persistentVolume": lost_pv,
                     "volumeHandle": lost, "phase": "Available", "claim": null})
        ],
        "{report:#}"
    );
}

/// Waits until the `n`th `ListVolumes` call has arrived and a call is hung: that one (the
/// hung count alone may still show an earlier call, released but not yet counted out).
async fn wait_hung_list(rig: &Rig, n: u64) {
    wait_for(
        &format!("ListVolumes call {n} to hang"),
        DEADLINE,
        || async {
            let stats = rig.control.stats().await.expect("the driver's stats");
            let calls = stats.calls.get("ListVolumes").copied().unwrap_or(0);
            let hung = stats.hung.get("ListVolumes").copied().unwrap_or(0);
            if calls >= n && hung >= 1 {
                Ok(())
            } else {
                Err((calls, hung))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_volume_whose_persistent_volume_appears_before_the_recheck_is_not_reported() {
    let rig = Rig::builder("audit-recheck")
        .without_sidecar()
        .start()
        .await;
    let volume = backend_volume(&rig, &format!("pvc-{}", random_uid())).await;

    // The first look stops in ListVolumes, after its first list of PersistentVolumes.
    rig.control
        .set_fault("ListVolumes", Fault::Hang)
        .await
        .unwrap();
    let audit = audit_command(&rig, &["--recheck-after=3s", "--output=json"])
        .await
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the audit");
    wait_hung_list(&rig, 1).await;
    rig.control.release("ListVolumes").await.unwrap();
    // The first look sees a volume without a PersistentVolume and looks again; the second
    // look stops in ListVolumes too, and meanwhile the PersistentVolume is made.
    rig.control
        .set_fault("ListVolumes", Fault::Hang)
        .await
        .unwrap();
    wait_hung_list(&rig, 2).await;
    let pv_name = support::unique_name("audit-late");
    rig.volumes()
        .create(
            &PostParams::default(),
            &PvFixture::new(&pv_name)
                .driver(&rig.driver_name)
                .handle(&volume)
                .build(),
        )
        .await
        .expect("creating the PersistentVolume");
    rig.control.release("ListVolumes").await.unwrap();

    let output = audit.wait_with_output().await.expect("the audit's end");
    assert_eq!(code(&output), CLEAN, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["findings"], json!([]));
    assert_eq!(report["clearedOnRecheck"], 1);
    assert_eq!(report["recheckedAfter"], "3s");
    assert_eq!(rig.ledger().await.call_count("ListVolumes"), 2);

    tidy(&rig, &[], &[&pv_name]).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_driver_without_list_volumes_still_has_its_claims_checked() {
    let rig = Rig::builder("audit-nolist")
        .driver(|d| d.capabilities = vec!["CREATE_DELETE_VOLUME".into()])
        .without_sidecar()
        .start()
        .await;
    // A claim of the driver holding our intent (put there by hand: no sidecar runs).
    rig.create_claim(rig.claim("held")).await;
    let claims = rig.claims();
    wait_for(
        "the binder to name the driver on the claim",
        DEADLINE,
        || async {
            let claim = claims.get("held").await.unwrap();
            let named = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k8s_keys::STORAGE_PROVISIONER))
                .cloned();
            if named.as_deref() == Some(rig.driver_name.as_str()) {
                Ok(())
            } else {
                Err(named)
            }
        },
    )
    .await;
    claims
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": [keys::FINALIZER_PVC_INTENT]}})),
        )
        .await
        .expect("putting the intent on the claim");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let output = audit(&rig, &["--intent-older-than=1s", "--output=json"]).await;
    assert_eq!(code(&output), FINDINGS, "{output:?}");
    let report = json_report(&output);
    assert_eq!(report["listVolumes"], false);
    assert_eq!(report["backendVolumes"], Value::Null);
    let stale = findings_of(&report, "staleIntent");
    assert_eq!(stale.len(), 1, "{report:#}");
    assert_eq!(stale[0]["claim"], format!("{}/held", rig.ns.name));

    let output = audit(&rig, &["--recheck-after=0s"]).await;
    assert_eq!(code(&output), CLEAN, "{output:?}");
    let text = stdout(&output);
    assert!(
        text.contains("the driver cannot list its volumes (no LIST_VOLUMES capability)"),
        "{text}"
    );
    assert_eq!(rig.ledger().await.call_count("ListVolumes"), 0);

    tidy(&rig, &["held"], &[]).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn wrong_flags_and_an_unreachable_driver_are_one_line_each() {
    let bin = workspace_bin("csi-provisioner");
    let run = |args: &[&str]| {
        std::process::Command::new(&bin)
            .arg("audit")
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("running csi-provisioner audit")
    };
    for (args, want) in [
        (
            &["--output=yaml"][..],
            "invalid value 'yaml' for '--output <FORMAT>'",
        ),
        (&["--intent-older-than=10"][..], "--intent-older-than"),
        (
            &["--volume-name-uuid-length=0"][..],
            "--volume-name-uuid-length must be -1 or between 1 and 32, not 0",
        ),
    ] {
        let output = run(args);
        assert_eq!(code(&output), USAGE, "{args:?}: {output:?}");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(output.stdout.is_empty());
    }

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let output = run(&[
        &format!("--csi-address={}", socket.display()),
        "--timeout=1s",
    ]);
    assert_eq!(code(&output), ERROR, "{output:?}");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "audit failed: failed to connect to CSI driver at {}",
            socket.display()
        )),
        "{err}"
    );

    let help = run(&["--help"]);
    assert_eq!(code(&help), CLEAN);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("Read-only"), "{text}");
    assert!(text.contains("--intent-older-than"), "{text}");
}

/// The value of the one sample of `name` whose labels include each of `labels`, from the text
/// exposition `--output=prometheus` prints.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, value)| value.parse().expect("a number"))
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?} in:\n{text}");
    found[0]
}

#[tokio::test]
async fn prometheus_output_counts_each_kind_of_finding_for_a_textfile_collector() {
    let rig = Rig::builder("audit-prom").start().await;
    rig.create_claim(rig.claim("data")).await;
    rig.wait_bound("data").await;
    // A volume no PersistentVolume points to, named for a claim that never existed.
    let orphan = backend_volume(&rig, &format!("pvc-{}", random_uid())).await;
    let before = rig.ledger().await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("csi-provisioner-audit.prom");
    let started = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
    let output = audit(
        &rig,
        &[
            "--output=prometheus",
            "--recheck-after=1s",
            &format!("--output-file={}", file.display()),
        ],
    )
    .await;
    // Findings are in the series: the run itself succeeded (a CronJob's Job is not failed).
    assert_eq!(code(&output), CLEAN, "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let text = std::fs::read_to_string(&file).expect("the output file");
    let driver = format!("driver=\"{}\"", rig.driver_name);
    let kind = |k: &str| format!("kind=\"{k}\"");
    let findings = |k: &str| {
        sample(
            &text,
            "csi_provisioner_audit_findings",
            &[&driver, &kind(k)],
        )
    };
    assert_eq!(findings("orphanedVolume"), 1.0, "{orphan}: {text}");
    assert_eq!(findings("missingVolume"), 0.0);
    assert_eq!(findings("staleIntent"), 0.0);
    let single = |name: &str| sample(&text, name, &[&driver]);
    assert_eq!(single("csi_provisioner_audit_success"), 1.0);
    assert_eq!(single("csi_provisioner_audit_list_volumes"), 1.0);
    assert_eq!(single("csi_provisioner_audit_backend_volumes"), 2.0);
    assert_eq!(single("csi_provisioner_audit_persistent_volumes"), 1.0);
    let ran = single("csi_provisioner_audit_last_run_timestamp_seconds");
    assert!(
        ran >= started && ran < started + 120.0,
        "{ran} vs {started}"
    );
    // Replaced in one rename: nothing but the file is left in the directory.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");

    // The same series on stdout, for a push.
    let output = audit(&rig, &["--output=prometheus", "--recheck-after=0s"]).await;
    assert_eq!(code(&output), CLEAN, "{output:?}");
    let printed = stdout(&output);
    let orphaned = sample(
        &printed,
        "csi_provisioner_audit_findings",
        &[&kind("orphanedVolume")],
    );
    assert_eq!(orphaned, 1.0, "{printed}");

    // A run that could not be made is a series too, and still exits 1 with its reason.
    let gone = dir.path().join("no-driver.sock");
    let failed = audit_command(&rig, &["--output=prometheus", "--timeout=1s"])
        .await
        .arg(format!("--csi-address={}", gone.display()))
        .arg(format!("--output-file={}", file.display()))
        .output()
        .await
        .expect("running the audit");
    assert_eq!(code(&failed), ERROR, "{failed:?}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        sample(&text, "csi_provisioner_audit_success", &[]),
        0.0,
        "{text}"
    );
    assert!(!text.contains("_findings"), "{text}");
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(err.starts_with("audit failed: "), "{err}");

    assert_eq!(
        writes(&rig.ledger().await),
        writes(&before),
        "the audit asked the driver to write"
    );
    rig.cleanup().await;
}
