//! DESIGN §2's invariants, each under the fault that would break it: a test here
//! fails when the invariant does. Every test has its own Rig (namespace, driver,
//! class, sidecar) and the driver's ledger is the ground truth for what exists on
//! the backend.

mod support;

use std::time::Duration;

use csi_provisioner::keys;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::Ledger;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use support::{DEADLINE, PvFixture, Rig, k8s_keys, wait_for};

/// Short CSI timeout and quick retries, so failing paths go round often.
const FAST: &[&str] = &[
    "--timeout=2s",
    "--retry-interval-start=200ms",
    "--retry-interval-max=2s",
];

fn uid(claim: &PersistentVolumeClaim) -> String {
    claim
        .metadata
        .uid
        .clone()
        .expect("a created claim has a uid")
}

fn holds_intent(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_PVC_INTENT))
}

/// How many `CreateVolume` calls made a new backend volume named `name`.
fn created(ledger: &Ledger, name: &str) -> usize {
    ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created && op.name.as_deref() == Some(name))
        .count()
}

fn create_calls_for(ledger: &Ledger, name: &str) -> usize {
    ledger
        .operations_of("CreateVolume")
        .filter(|op| op.name.as_deref() == Some(name))
        .count()
}

fn delete_calls(ledger: &Ledger) -> usize {
    ledger.operations_of("DeleteVolume").count()
}

/// No name was ever created twice on the backend (DESIGN §2.1).
fn assert_no_duplicate_volume(ledger: &Ledger) {
    let mut names: Vec<&str> = ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created)
        .filter_map(|op| op.name.as_deref())
        .collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "a name was created twice: {ledger:#?}");
}

fn pv_handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV")
}

async fn delete_pv(rig: &Rig, name: &str) {
    match rig.volumes().delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => panic!("deleting PV {name}: {e}"),
    }
}

/// Waits until the claim's storage-provisioner annotation names the rig's driver:
/// the binder handed it to external provisioning, so our sidecar must look at it.
async fn wait_handed_to_us(rig: &Rig, name: &str) {
    let claims = rig.claims();
    wait_for(
        &format!("the binder to hand claim {name} to our driver"),
        DEADLINE,
        || async {
            let c = claims.get(name).await.expect("reading the claim");
            let ann = c.metadata.annotations.clone().unwrap_or_default();
            match ann.get(k8s_keys::STORAGE_PROVISIONER) {
                Some(p) if *p == rig.driver_name => Ok(()),
                _ => Err(ann),
            }
        },
    )
    .await
}

// ---------------------------------------------------------------------------
// §2.2 authoritative reads: the PV already exists.

#[tokio::test]
async fn existing_pv_of_the_claim_means_no_create_volume_and_no_delete_volume() {
    let mut rig = Rig::builder("inv-pvexists")
        .without_sidecar()
        // -v=5 logs the claim path's decisions: the positive proof that the
        // sidecar looked at this claim and found its PV.
        .sidecar_args(FAST)
        .sidecar_args(&["-v=5"])
        .start()
        .await;
    let claim = rig.create_claim(rig.claim("existing")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    // The PV a previous run saved, claimRef'd to this claim. It is smaller than the
    // claim asks for, so the binder never binds the two (a PV pre-bound by claimRef
    // skips the class check but not the size check) and the claim stays Pending with
    // our driver's annotation: exactly what a sidecar with a stale cache would see.
    let pv = PvFixture::new(&pv_name)
        .driver(&rig.driver_name)
        .handle("handle-saved-earlier")
        .class(&rig.class)
        .capacity("1Mi")
        .reclaim("Delete")
        .provisioned_by(&rig.driver_name)
        .claim(&claim)
        .build();
    rig.volumes()
        .create(&PostParams::default(), &pv)
        .await
        .expect("creating the pre-existing PV");
    wait_handed_to_us(&rig, "existing").await;
    // A second claim of the same class, provisioned normally, shows the sidecar works.
    rig.create_claim(rig.claim("fresh")).await;

    rig.start_sidecar();
    let fresh = rig.wait_bound("fresh").await;
    // The positive signal: the sidecar reconciled this claim and found its PV by
    // the deterministic name (in its cache: the PV was there before it started).
    let reconciled = format!("claim={}/existing", rig.ns.name);
    wait_for("the sidecar to find the claim's PV", DEADLINE, || async {
        let log = strip_ansi(&rig.sidecar_log());
        let seen = log
            .lines()
            .any(|l| l.contains(&reconciled) && l.contains("its PV exists"));
        if seen {
            Ok(())
        } else {
            Err(log.lines().count())
        }
    })
    .await;
    // Give a (broken) sidecar every chance to act after its read.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let ledger = rig.ledger().await;
    assert_eq!(
        create_calls_for(&ledger, &pv_name),
        0,
        "CreateVolume for a claim whose PV exists: {ledger:#?}"
    );
    assert_eq!(ledger.call_count("CreateVolume"), 1, "{ledger:#?}");
    assert!(
        ledger
            .volume_by_name(&fresh.metadata.name.unwrap())
            .is_some()
    );
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    let existing = rig.claims().get("existing").await.unwrap();
    assert!(
        !holds_intent(&existing),
        "no intent to provision a claim whose PV exists: {:?}",
        existing.metadata.finalizers
    );
    let still = rig.volumes().get(&pv_name).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_none());
    assert_eq!(pv_handle(&still), "handle-saved-earlier");

    delete_pv(&rig, &pv_name).await;
    rig.cleanup().await;
}

/// Removes the terminal colour codes the sidecar's text log carries.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI sequence: ESC '[' params... final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// §2.3 AlreadyExists is an answer: a PV of another claim stops us with a warning.

/// A PV named like our claim's volume but bound to some other claim (and owned by
/// another driver, so nothing of ours would ever delete it).
fn foreign_pv(name: &str, namespace: &str) -> PersistentVolume {
    let other = PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some("someone-else".into()),
            namespace: Some(namespace.into()),
            uid: Some("00000000-0000-0000-0000-00000000beef".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    PvFixture::new(name)
        .driver("other.csi.invalid")
        .handle("foreign-handle")
        .reclaim("Retain")
        .claim(&other)
        .build()
}

#[tokio::test]
async fn pv_of_another_claim_under_our_name_stops_with_a_warning_before_create_volume() {
    let mut rig = Rig::builder("inv-foreign-pre")
        .without_sidecar()
        .sidecar_args(FAST)
        .start()
        .await;
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    rig.volumes()
        .create(&PostParams::default(), &foreign_pv(&pv_name, &rig.ns.name))
        .await
        .expect("creating the foreign PV");
    wait_handed_to_us(&rig, "data").await;
    rig.start_sidecar();

    let event = rig
        .wait_claim_event("data", "ProvisioningFailed", "bound to another claim")
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ledger = rig.ledger().await;
    assert_eq!(ledger.call_count("CreateVolume"), 0, "{ledger:#?}");
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    let pv = rig.volumes().get(&pv_name).await.unwrap();
    assert_eq!(
        pv_handle(&pv),
        "foreign-handle",
        "the foreign PV is untouched"
    );
    assert!(pv.metadata.deletion_timestamp.is_none());

    delete_pv(&rig, &pv_name).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn pv_create_answering_already_exists_for_another_claim_warns_and_keeps_the_volume() {
    // A long CSI timeout: the hung CreateVolume must still be waited for when the
    // foreign PV appears and the call is released, so that the *PV create* is what
    // meets the foreign PV (not the pre-check of the next attempt).
    let rig = Rig::builder("inv-foreign-save")
        .sidecar_args(&[
            "--timeout=60s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ])
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .expect("CreateVolume to be called");
    rig.volumes()
        .create(&PostParams::default(), &foreign_pv(&pv_name, &rig.ns.name))
        .await
        .expect("creating the foreign PV");
    rig.control.release("CreateVolume").await.unwrap();

    let event = rig
        .wait_claim_event("data", "ProvisioningFailed", "bound to another claim")
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // Several retries later the backend volume is still there, never deleted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ledger = rig.ledger().await;
    let op = ledger
        .operations_of("CreateVolume")
        .find(|op| op.name.as_deref() == Some(pv_name.as_str()))
        .expect("CreateVolume was called");
    assert!(
        op.created,
        "the released call created the volume: {ledger:#?}"
    );
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    assert!(ledger.volume_by_name(&pv_name).is_some());
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    let c = rig.claims().get("data").await.unwrap();
    assert!(
        c.spec.as_ref().unwrap().volume_name.is_none(),
        "never bound"
    );
    assert!(holds_intent(&c), "the volume is still ours to clean up");
    let pv = rig.volumes().get(&pv_name).await.unwrap();
    assert_eq!(
        pv_handle(&pv),
        "foreign-handle",
        "the foreign PV is untouched"
    );

    // Deleting the claim cleans up its own volume, and only that.
    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    let ledger = rig.ledger().await;
    assert!(ledger.volumes.is_empty(), "{ledger:#?}");
    assert!(
        ledger
            .operations_of("DeleteVolume")
            .all(|op| op.volume_id.as_deref() != Some("foreign-handle")),
        "{ledger:#?}"
    );
    let pv = rig.volumes().get(&pv_name).await.unwrap();
    assert!(pv.metadata.deletion_timestamp.is_none());

    delete_pv(&rig, &pv_name).await;
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// §2.4 never delete a backend volume because Kubernetes said no.

/// A ValidatingAdmissionPolicy (+ binding) that denies creating PVs of `driver`.
struct DenyPvCreate {
    client: kube::Client,
    name: String,
}

impl DenyPvCreate {
    async fn install(client: &kube::Client, driver: &str) -> DenyPvCreate {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let name = support::unique_name("deny-pv");
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["persistentvolumes"],
                }]},
                "validations": [{
                    "expression": format!(
                        "!has(object.spec.csi) || object.spec.csi.driver != '{driver}'"
                    ),
                    "message": "injected: saving PVs of this driver is denied",
                }],
            },
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }))
        .unwrap();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .expect("creating the ValidatingAdmissionPolicy");
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("creating the ValidatingAdmissionPolicyBinding");
        DenyPvCreate {
            client: client.clone(),
            name,
        }
    }

    /// Whether a dry-run create of a PV of `driver` is denied right now (the API
    /// server loads policies asynchronously).
    async fn denies(&self, driver: &str) -> bool {
        let pv = PvFixture::new(&support::unique_name("probe"))
            .driver(driver)
            .build();
        let pp = PostParams {
            dry_run: true,
            ..Default::default()
        };
        match Api::<PersistentVolume>::all(self.client.clone())
            .create(&pp, &pv)
            .await
        {
            Ok(_) => false,
            Err(kube::Error::Api(s)) if s.message.contains("injected") => true,
            Err(e) => panic!("dry-run PV create: {e}"),
        }
    }

    async fn remove(self) {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
async fn failing_pv_save_never_deletes_the_backend_volume_and_succeeds_once_saving_works() {
    let rig = Rig::builder("inv-pvsave")
        .without_sidecar()
        .sidecar_args(FAST)
        .start()
        .await;
    let mut rig = rig;
    let deny = DenyPvCreate::install(&rig.client, &rig.driver_name).await;
    wait_for("the admission policy to take effect", DEADLINE, || async {
        deny.denies(&rig.driver_name).await.then_some(())
    })
    .await;
    rig.start_sidecar();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));

    // Several failed saves. As upstream, a failed save is retried without an
    // event on the claim; the log says each one.
    wait_for("several failed PV saves", DEADLINE, || async {
        let log = strip_ansi(&rig.sidecar_log());
        let saves = log
            .lines()
            .filter(|l| l.contains("error saving PersistentVolume") && l.contains("injected"))
            .count();
        if saves >= 3 { Ok(()) } else { Err(saves) }
    })
    .await;
    let events = rig.events_for(&rig.ns.name, "data").await;
    assert!(
        !events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProvisioningFailed")),
        "no event for a failed save: {events:?}"
    );
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "exactly one volume: {ledger:#?}");
    let volume_id = ledger
        .volume_by_name(&pv_name)
        .expect("the claim's volume")
        .volume_id
        .clone();
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    let c = rig.claims().get("data").await.unwrap();
    assert!(
        holds_intent(&c),
        "the intent is kept while the PV is unsaved"
    );

    deny.remove().await;
    let pv = rig.wait_bound("data").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(pv_name.as_str()));
    assert_eq!(pv_handle(&pv), volume_id, "the PV points to that volume");
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// §2.1 + §2.6: retries after timeouts send the same request and converge.

async fn driver_pvs(rig: &Rig) -> Vec<PersistentVolume> {
    rig.volumes()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == rig.driver_name)
        })
        .collect()
}

#[tokio::test]
async fn create_volume_timing_out_twice_then_succeeding_gives_one_volume_and_one_pv() {
    let rig = Rig::builder("inv-ctde").sidecar_args(FAST).start().await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::CreateThenDeadlineExceeded { count: 2 },
        )
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    let pv = rig.wait_bound("data").await;

    let ledger = rig.ledger().await;
    let codes: Vec<_> = ledger
        .operations_of("CreateVolume")
        .map(|op| op.code.name())
        .collect();
    assert_eq!(
        codes,
        ["DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "OK"],
        "{ledger:#?}"
    );
    assert!(
        ledger
            .operations_of("CreateVolume")
            .all(|op| op.name.as_deref() == Some(pv_name.as_str())),
        "every retry sends the same name"
    );
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert_eq!(
        pv_handle(&pv),
        ledger.volume_by_name(&pv_name).unwrap().volume_id
    );
    assert_eq!(driver_pvs(&rig).await.len(), 1, "one PV");
    assert_eq!(delete_calls(&ledger), 0);
    rig.cleanup().await;
}

#[tokio::test]
async fn create_volume_slower_than_the_timeout_gives_one_volume_and_one_pv() {
    let rig = Rig::builder("inv-slow")
        .sidecar_args(&[
            "--timeout=1s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ])
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Latency { ms: 2500 })
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    // Two calls given up by the sidecar; the driver finishes them anyway.
    wait_for("two CreateVolume calls to finish", DEADLINE, || async {
        let ledger = rig.ledger().await;
        (create_calls_for(&ledger, &pv_name) >= 2).then_some(())
    })
    .await;
    let c = rig.claims().get("data").await.unwrap();
    assert!(c.spec.unwrap().volume_name.is_none(), "not bound yet");
    rig.control.clear_faults().await.unwrap();
    let pv = rig.wait_bound("data").await;

    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert_eq!(
        pv_handle(&pv),
        ledger.volume_by_name(&pv_name).unwrap().volume_id
    );
    assert_eq!(driver_pvs(&rig).await.len(), 1, "one PV");
    assert_eq!(delete_calls(&ledger), 0);
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// §2.5 nothing important lives only in memory: a claim deleted mid-flight.

async fn wait_intent_dropped(rig: &Rig, name: &str) {
    let claims = rig.claims();
    wait_for("the intent to be dropped", DEADLINE, || async {
        let c = claims.get(name).await.expect("reading the claim");
        if holds_intent(&c) {
            Err(c.metadata.finalizers)
        } else {
            Ok(())
        }
    })
    .await
}

/// Waits a moment and checks the deleted claim is held (Terminating) by our intent.
async fn assert_held_terminating(rig: &Rig, name: &str) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = rig
        .claims()
        .get_opt(name)
        .await
        .unwrap()
        .expect("the deleted claim is still there while its volume may exist");
    assert!(c.metadata.deletion_timestamp.is_some());
    assert!(
        holds_intent(&c),
        "held by the intent: {:?}",
        c.metadata.finalizers
    );
}

/// After the claim is gone: nothing of it is left on the backend or in the API. If
/// the deletion raced with a last successful attempt, the PV was saved and the
/// volume path deletes both, so this waits for convergence.
async fn assert_nothing_left(rig: &Rig, pv_name: &str) {
    rig.wait_pv_gone(pv_name).await;
    wait_for("no volume on the backend", DEADLINE, || async {
        let ledger = rig.ledger().await;
        if ledger.volumes.is_empty() {
            Ok(())
        } else {
            Err(ledger.volumes)
        }
    })
    .await;
    let ledger = rig.ledger().await;
    assert!(created(&ledger, pv_name) <= 1, "{ledger:#?}");
    assert_no_duplicate_volume(&ledger);
}

/// Every `CreateVolume` creates (or finds) the volume and answers `DEADLINE_EXCEEDED`,
/// until the faults are cleared: the claim can never get a PV meanwhile.
fn always_created_then_timed_out() -> Fault {
    Fault::CreateThenDeadlineExceeded { count: 1_000_000 }
}

#[tokio::test]
async fn pvc_deleted_while_create_volume_hangs_then_completes_leaves_no_volume() {
    // The call in flight completes after the deletion: its PV is saved for a
    // claim that is going away, and the volume path deletes both.
    let rig = Rig::builder("inv-del-hang")
        .sidecar_args(FAST)
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    rig.delete_claim("data").await;
    assert_held_terminating(&rig, "data").await;
    rig.control.release("CreateVolume").await.unwrap();

    rig.wait_claim_gone("data").await;
    assert_nothing_left(&rig, &pv_name).await;
    let ledger = rig.ledger().await;
    assert_eq!(
        created(&ledger, &pv_name),
        1,
        "the released call created it: {ledger:#?}"
    );
    assert!(
        ledger.operations_of("DeleteVolume").any(|op| op.deleted),
        "and the sidecar deleted it: {ledger:#?}"
    );
    // Upstream has no claim left to tell; ours was Terminating meanwhile and
    // says nothing either (events go out in the background: give them time).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = rig.events_for(&rig.ns.name, "data").await;
    assert!(
        !events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProvisioningSucceeded")),
        "no success reported for a claim deleted meanwhile: {events:?}"
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn pvc_deleted_while_create_volume_hangs_past_the_timeout_leaves_no_volume() {
    // The sidecar gives up on the hung call (--timeout=2s) after the claim is
    // deleted, so no attempt can save a PV any more: only the cleanup of the
    // deleted claim can find the volume the driver creates once released.
    let rig = Rig::builder("inv-del-hang-to")
        .sidecar_args(FAST)
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    rig.delete_claim("data").await;
    // The first call timed out; the cleanup asks the driver for the volume too
    // and hears that the first call is still in progress (ABORTED, an answer
    // the driver counts in its calls but not in the ledger's operations).
    rig.wait_claim_event("data", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    wait_for("the cleanup to call CreateVolume", DEADLINE, || async {
        let calls = rig.ledger().await.call_count("CreateVolume");
        if calls >= 2 { Ok(()) } else { Err(calls) }
    })
    .await;
    assert_held_terminating(&rig, "data").await;
    rig.control.release("CreateVolume").await.unwrap();

    rig.wait_claim_gone("data").await;
    assert_nothing_left(&rig, &pv_name).await;
    let ledger = rig.ledger().await;
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert!(
        ledger.operations_of("DeleteVolume").any(|op| op.deleted),
        "{ledger:#?}"
    );
    rig.cleanup().await;
}

#[tokio::test]
async fn pvc_deleted_after_create_volume_timed_out_leaves_no_volume() {
    let rig = Rig::builder("inv-del-ctde")
        .sidecar_args(FAST)
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", always_created_then_timed_out())
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    rig.wait_claim_event("data", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    assert!(rig.ledger().await.volume_by_name(&pv_name).is_some());

    rig.delete_claim("data").await;
    // While the driver keeps timing out, the cleanup cannot learn the volume's
    // handle: the claim must wait rather than let the volume leak.
    assert_held_terminating(&rig, "data").await;
    rig.control.clear_faults().await.unwrap();
    rig.wait_claim_gone("data").await;
    assert_nothing_left(&rig, &pv_name).await;
    let ledger = rig.ledger().await;
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    rig.cleanup().await;
}

#[tokio::test]
async fn sidecar_killed_between_create_volume_and_pv_save_then_pvc_deleted_leaves_no_volume() {
    let mut rig = Rig::builder("inv-kill").sidecar_args(FAST).start().await;
    rig.control
        .set_fault("CreateVolume", always_created_then_timed_out())
        .await
        .unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    // The driver created the volume; the sidecar only ever heard DeadlineExceeded.
    rig.wait_claim_event("data", "ProvisioningFailed", "DeadlineExceeded")
        .await;
    assert!(rig.ledger().await.volume_by_name(&pv_name).is_some());

    rig.kill_sidecar();
    rig.control.clear_faults().await.unwrap();
    rig.delete_claim("data").await;
    // With no sidecar running, only the durable intent keeps the claim around.
    assert_held_terminating(&rig, "data").await;
    assert!(rig.volumes().get_opt(&pv_name).await.unwrap().is_none());

    rig.start_sidecar();
    rig.wait_claim_gone("data").await;
    assert_nothing_left(&rig, &pv_name).await;
    let ledger = rig.ledger().await;
    assert_eq!(created(&ledger, &pv_name), 1, "{ledger:#?}");
    assert!(
        ledger.operations_of("DeleteVolume").any(|op| op.deleted),
        "{ledger:#?}"
    );
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// The volume path: only a Released PV with policy Delete loses its volume.

fn holds_pv_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_PV))
}

async fn pv_phase(rig: &Rig, name: &str) -> Option<String> {
    rig.volumes()
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|pv| pv.status.and_then(|s| s.phase))
}

#[tokio::test]
async fn released_pv_switched_to_retain_keeps_its_volume_and_loses_our_finalizer() {
    let mut rig = Rig::builder("inv-retain").sidecar_args(FAST).start().await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let handle = pv_handle(&pv);
    assert!(holds_pv_finalizer(&pv), "{:?}", pv.metadata.finalizers);
    // Provisioning is complete once the intent is dropped (just after the PV is saved).
    wait_intent_dropped(&rig, "data").await;

    rig.kill_sidecar();
    let patch = serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    rig.volumes()
        .patch(
            &pv_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    wait_for("the PV to be Released", DEADLINE, || async {
        match pv_phase(&rig, &pv_name).await {
            Some(p) if p == "Released" => Ok(()),
            other => Err(other),
        }
    })
    .await;

    rig.start_sidecar();
    let volumes = rig.volumes();
    wait_for("our PV finalizer to be removed", DEADLINE, || async {
        let pv = volumes.get(&pv_name).await.unwrap();
        if holds_pv_finalizer(&pv) {
            Err(pv.metadata.finalizers)
        } else {
            Ok(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pv = rig.volumes().get(&pv_name).await.unwrap();
    assert!(pv.metadata.deletion_timestamp.is_none(), "the PV is kept");
    let ledger = rig.ledger().await;
    assert!(
        ledger.volumes.contains_key(&handle),
        "volume kept: {ledger:#?}"
    );
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");

    delete_pv(&rig, &pv_name).await;
    rig.cleanup().await;
}

/// The volume path decides on its cache, but only the API server's copy of the PV may
/// carry the decision out (DESIGN §2.2). The sidecar talks to the API server through the
/// fault proxy, whose PV watch runs 3 s late: the claim is deleted, and as soon as the PV
/// is Released on the server it is switched to Retain. For ~3 s the sidecar's cache says
/// "Released, Delete" while the server says Retain: the volume and the PV must be kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_pv_switched_to_retain_while_the_cache_is_late_keeps_its_volume() {
    // Kept to the end: it holds the proxy's kubeconfig.
    let api = support::faulty_api().await;
    let proxy = &api.proxy;
    let rig = Rig::builder("inv-late-cache")
        .sidecar_args(FAST)
        .kubeconfig(api.kubeconfig.clone())
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let handle = pv_handle(&pv);
    wait_intent_dropped(&rig, "data").await;

    proxy.add_rule(
        kube_fault_proxy::Rule::new(kube_fault_proxy::Fault::DelayEvents { ms: 3000 })
            .verbs(&["watch"])
            .resources(&["persistentvolumes"]),
    );
    rig.delete_claim("data").await;
    let volumes = rig.volumes();
    loop {
        if pv_phase(&rig, &pv_name).await.as_deref() == Some("Released") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let patch = serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    volumes
        .patch(
            &pv_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();

    // The late "Released, Delete" reaches the sidecar ~3 s after it happened, the Retain
    // just after; then our finalizer goes (policy is no longer Delete).
    wait_for("our PV finalizer to be removed", DEADLINE, || async {
        let pv = volumes.get_opt(&pv_name).await.unwrap();
        let pv = pv.expect("the PV of a Retain policy was deleted");
        if holds_pv_finalizer(&pv) {
            Err(pv.metadata.finalizers)
        } else {
            Ok(())
        }
    })
    .await;
    let pv = volumes.get(&pv_name).await.unwrap();
    assert!(pv.metadata.deletion_timestamp.is_none(), "the PV is kept");
    let ledger = rig.ledger().await;
    assert!(
        ledger.volumes.contains_key(&handle),
        "volume kept: {ledger:#?}"
    );
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    // Not vacuous: the sidecar did act on its late copy, and the API server refused it.
    let log = rig.sidecar_log();
    assert!(
        log.contains("changed since the cache saw it"),
        "the sidecar never acted on the late copy:\n{log}"
    );

    delete_pv(&rig, &pv_name).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn bound_pv_object_deleted_keeps_its_volume_until_the_claim_is_deleted() {
    let rig = Rig::builder("inv-bound-del")
        .sidecar_args(FAST)
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let handle = pv_handle(&pv);

    delete_pv(&rig, &pv_name).await;
    let volumes = rig.volumes();
    wait_for("the PV to be Terminating", DEADLINE, || async {
        let pv = volumes.get(&pv_name).await.unwrap();
        pv.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    // The sidecar has seen the deletion; a Bound volume must survive it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ledger = rig.ledger().await;
    assert!(
        ledger.volumes.contains_key(&handle),
        "volume of a Bound PV deleted: {ledger:#?}"
    );
    assert_eq!(delete_calls(&ledger), 0, "{ledger:#?}");
    let pv = rig.volumes().get(&pv_name).await.unwrap();
    assert!(holds_pv_finalizer(&pv));
    assert_eq!(pv.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    let c = rig.claims().get("data").await.unwrap();
    assert_eq!(
        c.status.and_then(|s| s.phase).as_deref(),
        Some("Bound"),
        "the claim still has its volume"
    );

    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    rig.wait_pv_gone(&pv_name).await;
    let ledger = rig.ledger().await;
    assert!(ledger.volumes.is_empty(), "{ledger:#?}");
    assert!(
        ledger
            .operations_of("DeleteVolume")
            .any(|op| op.deleted && op.volume_id.as_deref() == Some(handle.as_str())),
        "{ledger:#?}"
    );
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// UID fencing: a name reused by a new claim is a new claim.

#[tokio::test]
async fn claim_recreated_with_the_same_name_gets_its_own_volume_and_the_old_one_is_deleted() {
    let rig = Rig::builder("inv-recreate")
        .sidecar_args(FAST)
        .start()
        .await;
    let first = rig.create_claim(rig.claim("data")).await;
    let first_pv = rig.wait_bound("data").await;
    let first_pv_name = first_pv.metadata.name.clone().unwrap();
    let first_handle = pv_handle(&first_pv);
    assert_eq!(first_pv_name, format!("pvc-{}", uid(&first)));

    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    let second = rig.create_claim(rig.claim("data")).await;
    assert_ne!(uid(&first), uid(&second));
    let second_pv = rig.wait_bound("data").await;
    let second_pv_name = second_pv.metadata.name.clone().unwrap();
    assert_eq!(second_pv_name, format!("pvc-{}", uid(&second)));
    assert_eq!(
        second_pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.clone()),
        Some(uid(&second))
    );
    assert_ne!(pv_handle(&second_pv), first_handle);

    rig.wait_pv_gone(&first_pv_name).await;
    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.volumes.keys().collect::<Vec<_>>(),
        [&pv_handle(&second_pv)],
        "only the new claim's volume is left: {ledger:#?}"
    );
    assert_eq!(created(&ledger, &first_pv_name), 1, "{ledger:#?}");
    assert_eq!(created(&ledger, &second_pv_name), 1, "{ledger:#?}");
    assert_no_duplicate_volume(&ledger);
    rig.cleanup().await;
}

#[tokio::test]
async fn claim_recreated_after_deletion_mid_create_gets_its_own_volume_and_the_old_one_is_deleted()
{
    let rig = Rig::builder("inv-recreate-hang")
        .sidecar_args(FAST)
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let first = rig.create_claim(rig.claim("data")).await;
    let first_pv_name = format!("pvc-{}", uid(&first));
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    rig.delete_claim("data").await;
    rig.control.release("CreateVolume").await.unwrap();
    rig.wait_claim_gone("data").await;

    let second = rig.create_claim(rig.claim("data")).await;
    let second_pv_name = format!("pvc-{}", uid(&second));
    let pv = rig.wait_bound("data").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(second_pv_name.as_str()));
    // The hung call may finish before the sidecar gives up on it: then the PV
    // is saved for the deleted claim and the volume path reclaims it once the
    // binder marks it Released, which can come after the new claim is bound.
    wait_for(
        "the first claim's volume to be deleted",
        DEADLINE,
        || async {
            let ledger = rig.ledger().await;
            match ledger.volume_by_name(&first_pv_name) {
                Some(v) => Err(v.volume_id.clone()),
                None => Ok(()),
            }
        },
    )
    .await;

    let ledger = rig.ledger().await;
    assert_eq!(
        ledger
            .volumes
            .values()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        [second_pv_name.as_str()],
        "{ledger:#?}"
    );
    assert!(created(&ledger, &first_pv_name) <= 1, "{ledger:#?}");
    assert_eq!(created(&ledger, &second_pv_name), 1, "{ledger:#?}");
    assert_no_duplicate_volume(&ledger);
    rig.wait_pv_gone(&first_pv_name).await;
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// The intent belongs to one driver: other provisioners in the cluster leave it alone.

#[tokio::test]
async fn sidecars_of_other_drivers_leave_our_intent_and_our_deleted_claims_alone() {
    let ours = Rig::builder("inv-ours").sidecar_args(FAST).start().await;
    // Another CSI driver with its own sidecar in the same cluster.
    let theirs = Rig::builder("inv-theirs").sidecar_args(FAST).start().await;
    ours.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    let claim = ours.create_claim(ours.claim("data")).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    ours.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    // Mid-flight, the intent stays (the other sidecar sees this claim too).
    for _ in 0..10 {
        let c = ours.claims().get("data").await.unwrap();
        assert!(
            holds_intent(&c),
            "intent dropped: {:?}",
            c.metadata.finalizers
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ours.delete_claim("data").await;
    assert_held_terminating(&ours, "data").await;
    let their_ledger = theirs.ledger().await;
    assert_eq!(
        their_ledger.call_count("CreateVolume") + their_ledger.call_count("DeleteVolume"),
        0,
        "another driver was asked about our claim: {their_ledger:#?}"
    );

    ours.control.release("CreateVolume").await.unwrap();
    ours.wait_claim_gone("data").await;
    assert_nothing_left(&ours, &pv_name).await;
    let their_ledger = theirs.ledger().await;
    assert_eq!(
        their_ledger.call_count("CreateVolume"),
        0,
        "{their_ledger:#?}"
    );
    assert_eq!(
        their_ledger.call_count("DeleteVolume"),
        0,
        "{their_ledger:#?}"
    );
    ours.cleanup().await;
    theirs.cleanup().await;
}
