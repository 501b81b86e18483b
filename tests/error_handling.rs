//! How CSI errors are handled end to end (DESIGN §2.7: one classification,
//! `csi::classify`): errors after which the volume may exist are retried with
//! the durable intent kept; `InvalidArgument` is infeasible and retried only
//! slowly; final errors are retried with per-claim backoff; `ResourceExhausted`
//! on a selected node of a topology-aware driver goes back to the scheduler.
//! Whatever fails, no event or log line carries secret data.

mod support;

use std::time::Duration;

use csi_provisioner::keys;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use csi_test_driver::ledger::{Ledger, OperationRecord};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams};
use support::{DEADLINE, Rig, Sidecar, k8s_keys, unique_name, wait_for};

/// Short CSI timeout and quick retries, so failing paths go round often.
const FAST: &[&str] = &[
    "--timeout=2s",
    "--retry-interval-start=200ms",
    "--retry-interval-max=2s",
];

fn holds_intent(claim: &PersistentVolumeClaim) -> bool {
    claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == keys::FINALIZER_PVC_INTENT))
}

fn failing(code: GrpcCode) -> Fault {
    Fault::Error {
        code,
        count: 1_000_000,
        message: Some("injected for the test".into()),
    }
}

fn create_ops(ledger: &Ledger) -> Vec<&OperationRecord> {
    ledger.operations_of("CreateVolume").collect()
}

/// Waits until the driver has answered at least `n` `CreateVolume` calls.
async fn wait_create_calls(rig: &Rig, n: usize) -> Ledger {
    wait_for(&format!("{n} CreateVolume calls"), DEADLINE, || async {
        let ledger = rig.ledger().await;
        let seen = create_ops(&ledger).len();
        if seen >= n { Ok(ledger) } else { Err(seen) }
    })
    .await
}

fn is_pending(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_none_or(str::is_empty)
}

/// While the driver keeps failing with `fault` (after which the volume may
/// exist), the claim is retried, keeps its durable intent, and gets no second
/// volume; once the driver recovers it is bound and the intent dropped.
async fn retried_in_background_with_the_intent_until_success(
    prefix: &str,
    fault: Fault,
    what: &str,
) {
    let rig = Rig::builder(prefix).sidecar_args(FAST).start().await;
    rig.control.set_fault("CreateVolume", fault).await.unwrap();
    let claim = rig.create_claim(rig.claim("data")).await;
    let pv_name = format!("pvc-{}", claim.metadata.uid.clone().unwrap());

    // Each observation during the failing period: the intent is there.
    let mut failures = 0;
    while failures < 4 {
        let ledger = wait_create_calls(&rig, failures + 1).await;
        failures = create_ops(&ledger).len();
        let c = rig.claims().get("data").await.unwrap();
        assert!(
            holds_intent(&c),
            "intent dropped after {failures} failed calls: {:?}",
            c.metadata.finalizers
        );
        assert!(is_pending(&c), "bound while the driver fails");
        assert!(
            ledger.volumes.len() <= 1,
            "one volume at most, whatever the retries: {ledger:#?}"
        );
    }
    let event = rig
        .wait_claim_event("data", "ProvisioningFailed", what)
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    rig.control.clear_faults().await.unwrap();
    let pv = rig.wait_bound("data").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(pv_name.as_str()));
    let claims = rig.claims();
    wait_for("the intent to be dropped", DEADLINE, || async {
        let c = claims.get("data").await.unwrap();
        if holds_intent(&c) {
            Err(c.metadata.finalizers)
        } else {
            Ok(())
        }
    })
    .await;
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    assert_eq!(
        create_ops(&ledger).iter().filter(|op| op.created).count(),
        1,
        "{ledger:#?}"
    );
    assert_eq!(
        pv.spec.unwrap().csi.unwrap().volume_handle,
        ledger.volume_by_name(&pv_name).unwrap().volume_id
    );
    assert_eq!(ledger.call_count("DeleteVolume"), 0);
    rig.cleanup().await;
}

#[tokio::test]
async fn unavailable_is_retried_with_the_intent_kept_until_success() {
    retried_in_background_with_the_intent_until_success(
        "err-unavailable",
        failing(GrpcCode::Unavailable),
        "code = Unavailable",
    )
    .await;
}

#[tokio::test]
async fn deadline_exceeded_after_the_volume_was_created_is_retried_with_the_intent_kept_until_success()
 {
    retried_in_background_with_the_intent_until_success(
        "err-deadline",
        Fault::CreateThenDeadlineExceeded { count: 1_000_000 },
        "code = DeadlineExceeded",
    )
    .await;
}

#[tokio::test]
async fn invalid_argument_is_reported_as_infeasible_and_not_retried_within_the_slow_window() {
    let rig = Rig::builder("err-infeasible")
        .sidecar_args(&[
            "--timeout=2s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=30s",
        ])
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", failing(GrpcCode::InvalidArgument))
        .await
        .unwrap();
    rig.create_claim(rig.claim("data")).await;
    let event = rig
        .wait_claim_event(
            "data",
            "ProvisioningFailed",
            "Volume provisioning failed with infeasible error. Retries will be delayed.",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("InvalidArgument"),
        "{event:?}"
    );

    // A final error would have been retried several times in this window
    // (200ms, 400ms, 800ms, ...); an infeasible one waits for --retry-interval-max.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ledger = rig.ledger().await;
    assert_eq!(
        create_ops(&ledger).len(),
        1,
        "CreateVolume retried within the slow window: {ledger:#?}"
    );
    let c = rig.claims().get("data").await.unwrap();
    assert!(is_pending(&c));
    rig.cleanup().await;
}

#[tokio::test]
async fn final_error_is_retried_with_growing_backoff_until_the_fault_clears() {
    let rig = Rig::builder("err-final").sidecar_args(FAST).start().await;
    rig.control
        .set_fault("CreateVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    rig.create_claim(rig.claim("data")).await;
    let ledger = wait_create_calls(&rig, 5).await;
    let at: Vec<u64> = create_ops(&ledger).iter().map(|op| op.at_ms).collect();
    // Retries 3→4 and 4→5 follow the 3rd and 4th failures: 800ms and 1.6s at
    // least (every gap is checked from the first at upstream's default
    // interval by `a_failing_create_volume_is_retried_after_1s_2s_4s`).
    assert!(at[3] - at[2] >= 700, "no backoff: calls at {at:?}");
    assert!(
        at[4] - at[3] >= 1400,
        "backoff does not grow: calls at {at:?}"
    );
    assert!(ledger.volumes.is_empty());
    rig.wait_claim_event("data", "ProvisioningFailed", "code = Internal")
        .await;
    assert!(is_pending(&rig.claims().get("data").await.unwrap()));

    rig.control.clear_faults().await.unwrap();
    rig.wait_bound("data").await;
    let ledger = rig.ledger().await;
    assert_eq!(ledger.volumes.len(), 1, "{ledger:#?}");
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// Reports of a claim that keeps failing: client-go's event budget (25 events per
// object and source, then one per 5 minutes), side by side with upstream.

/// The event source of kube-controller-manager's PV controller.
const PV_CONTROLLER: &str = "persistentvolume-controller";

/// A claim whose `CreateVolume` failed at least `calls` times in quick retries: its
/// Events, as (type, reason, count).
async fn events_of_a_claim_failing(who: Sidecar, calls: usize) -> Vec<(String, String, i32)> {
    let mut rig = Rig::builder("err-budget").start_for(who).await;
    rig.control
        .set_fault("CreateVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    let flags = [
        "--leader-election=false",
        "--retry-interval-start=20ms",
        "--retry-interval-max=50ms",
        // Not the client's rate limit: the correlator's budget is what is looked at.
        "--kube-api-qps=1000",
        "--kube-api-burst=1000",
    ];
    let upstream = rig.start_as(who, &flags);
    rig.create_claim(rig.claim("data")).await;
    wait_create_calls(&rig, calls).await;
    // Events are sent in the background: give the last reports time to be written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut events: Vec<(String, String, i32)> = rig
        .events_for(&rig.ns.name, "data")
        .await
        .into_iter()
        // kube-controller-manager's own `ExternalProvisioning` notes are not the sidecar's.
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) != Some(PV_CONTROLLER))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.count.unwrap_or(1),
            )
        })
        .collect();
    events.sort();
    rig.control.clear_faults().await.unwrap();
    rig.wait_bound("data").await;
    drop(upstream);
    rig.cleanup().await;
    events
}

#[tokio::test]
async fn a_claim_that_keeps_failing_is_reported_25_times_per_event_type_as_upstream_does() {
    // Each attempt is reported twice (Normal Provisioning, then Warning
    // ProvisioningFailed): 40 attempts are 40 reports of each type, of which the budget
    // of 25 per type is sent.
    let ours = events_of_a_claim_failing(Sidecar::Ours, 40).await;
    let upstream = events_of_a_claim_failing(Sidecar::Upstream, 40).await;
    let expected = [
        ("Normal".to_string(), "Provisioning".to_string(), 25),
        ("Warning".to_string(), "ProvisioningFailed".to_string(), 25),
    ];
    assert_eq!(upstream, expected, "upstream");
    assert_eq!(ours, expected, "ours");
}

// ---------------------------------------------------------------------------
// Backoff: a failing backend is asked again after 1 s, 2 s, 4 s (upstream's
// `--retry-interval-start` doubling), on every path, however many updates our
// own writes of the failed attempt make to the object.

/// The times (ms) of the first `n` calls of `method` the driver answered.
async fn call_times(rig: &Rig, method: &str, n: usize) -> Vec<u64> {
    wait_for(&format!("{n} {method} calls"), DEADLINE, || async {
        let ledger = rig.ledger().await;
        let at: Vec<u64> = ledger.operations_of(method).map(|op| op.at_ms).collect();
        if at.len() >= n {
            Ok(at[..n].to_vec())
        } else {
            Err(at)
        }
    })
    .await
}

/// Each retry waits at least (most of) its backoff: 1 s, 2 s, 4 s ... after
/// the first, second, third failure, up to `max_s` seconds (failures of the
/// same claim before the first of these calls only make the waits longer).
/// The lower bounds are what a hammered backend lacks; a retry that comes
/// late is not checked (a slow machine).
fn assert_backs_off(method: &str, at: &[u64], max_s: u64) {
    for (i, pair) in at.windows(2).enumerate() {
        let want = (1000u64 << i).min(max_s * 1000);
        assert!(
            pair[1] - pair[0] >= want * 9 / 10,
            "{method} retry {} came {} ms after the failure before it, not after {want} ms: calls at {at:?}",
            i + 1,
            pair[1] - pair[0]
        );
    }
}

/// Waits until the driver holds no volume.
async fn wait_no_volumes(rig: &Rig) {
    wait_for("every volume to be deleted", DEADLINE, || async {
        let ledger = rig.ledger().await;
        if ledger.volumes.is_empty() {
            Ok(())
        } else {
            Err(ledger.volumes.into_keys().collect::<Vec<_>>())
        }
    })
    .await;
}

#[tokio::test]
async fn a_failing_create_volume_is_retried_after_1s_2s_4s() {
    let rig = Rig::builder("err-backoff-create").start().await;
    rig.control
        .set_fault("CreateVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    rig.create_claim(rig.claim("data")).await;
    let at = call_times(&rig, "CreateVolume", 4).await;
    assert_backs_off("CreateVolume", &at, 300);
    rig.control.clear_faults().await.unwrap();
    rig.wait_bound("data").await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_failing_delete_volume_of_a_released_pv_is_retried_after_1s_2s_4s() {
    let rig = Rig::builder("err-backoff-delete").start().await;
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    rig.control
        .set_fault("DeleteVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    rig.delete_claim("data").await;
    let at = call_times(&rig, "DeleteVolume", 4).await;
    assert_backs_off("DeleteVolume", &at, 300);
    rig.control.clear_faults().await.unwrap();
    rig.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_no_volumes(&rig).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn a_failing_delete_volume_of_a_claim_deleted_mid_flight_is_retried_after_1s_2s_4s() {
    // The first CreateVolume hangs past the 1 s timeout, so no PV is saved:
    // the claim, deleted then, is cleaned up by the claim path (the same
    // CreateVolume to learn the handle, then DeleteVolume), not the volume path.
    let rig = Rig::builder("err-backoff-abandon")
        .sidecar_args(&["--timeout=1s", "--retry-interval-max=4s"])
        .start()
        .await;
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.control
        .set_fault("DeleteVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    rig.create_claim(rig.claim("data")).await;
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    rig.delete_claim("data").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The hung calls make the volume; the claim is gone, so it is deleted.
    rig.control.release("CreateVolume").await.unwrap();
    let at = call_times(&rig, "DeleteVolume", 4).await;
    assert_backs_off("DeleteVolume", &at, 4);
    assert!(
        rig.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|pv| pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.namespace.as_deref())
                != Some(rig.ns.name.as_str())),
        "no PV was saved: the claim path cleaned up"
    );
    rig.control.clear_faults().await.unwrap();
    rig.wait_claim_gone("data").await;
    wait_no_volumes(&rig).await;
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// ResourceExhausted: reschedule only when the node could be the reason.

const ZONE_KEY: &str = "topology.err.example.com/zone";

fn selected_node(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k8s_keys::SELECTED_NODE).cloned())
}

#[tokio::test]
async fn resource_exhausted_on_the_selected_node_removes_the_selected_node_annotation() {
    let rig = Rig::builder("err-resched")
        .driver(|d| d.topology = Some((ZONE_KEY.to_string(), "z1".to_string())))
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(FAST)
        .start()
        .await;
    let node = rig.node_in_zone(ZONE_KEY, "z1").await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::ResourceExhausted,
                count: 1,
                message: Some("injected: node full".into()),
            },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("data").selected_node(&node))
        .await;

    let claims = rig.claims();
    wait_for(
        "the selected-node annotation to be removed",
        DEADLINE,
        || async {
            let c = claims.get("data").await.unwrap();
            match selected_node(&c) {
                None => Ok(()),
                Some(n) => Err(n),
            }
        },
    )
    .await;
    // It was the driver's ResourceExhausted (not a missing CSINode) that did it.
    let ledger = rig.ledger().await;
    let ops = create_ops(&ledger);
    assert_eq!(ops.len(), 1, "{ledger:#?}");
    assert_eq!(ops[0].code, GrpcCode::ResourceExhausted);
    assert!(ledger.volumes.is_empty());
    rig.wait_claim_event("data", "ProvisioningFailed", "code = ResourceExhausted")
        .await;
    // Without a selected node a WaitForFirstConsumer claim waits for the scheduler.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(create_ops(&rig.ledger().await).len(), 1);

    // The scheduler picks (again): now it is provisioned.
    let patch = serde_json::json!({"metadata": {"annotations": {k8s_keys::SELECTED_NODE: node}}});
    rig.claims()
        .patch(
            "data",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    rig.wait_bound("data").await;
    assert_eq!(rig.ledger().await.volumes.len(), 1);
    rig.remove_node(&node).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn resource_exhausted_without_topology_keeps_the_selected_node_and_is_retried() {
    // No VOLUME_ACCESSIBILITY_CONSTRAINTS: another node would not help, so
    // ResourceExhausted is a final error, retried in place.
    let rig = Rig::builder("err-exhausted")
        .class(|c| c.binding_mode("WaitForFirstConsumer"))
        .sidecar_args(FAST)
        .start()
        .await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::ResourceExhausted,
                count: 2,
                message: Some("injected: backend full".into()),
            },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("data").selected_node("node-somewhere"))
        .await;
    wait_create_calls(&rig, 2).await;
    let c = rig.claims().get("data").await.unwrap();
    assert_eq!(selected_node(&c).as_deref(), Some("node-somewhere"));
    rig.wait_bound("data").await;
    let c = rig.claims().get("data").await.unwrap();
    assert_eq!(
        selected_node(&c).as_deref(),
        Some("node-somewhere"),
        "the annotation was never removed"
    );
    let ledger = rig.ledger().await;
    assert_eq!(create_ops(&ledger).len(), 3, "{ledger:#?}");
    assert_eq!(ledger.volumes.len(), 1);
    rig.cleanup().await;
}

// ---------------------------------------------------------------------------
// Secrets: failures are reported, secret data never is.

#[tokio::test]
async fn failed_calls_with_a_provisioner_secret_never_put_it_in_events_or_logs() {
    let value = format!("s3ntinel-{}", unique_name("err"));
    let mut rig = Rig::builder("err-secret")
        .class(|c| {
            c.param("csi.storage.k8s.io/provisioner-secret-name", "creds")
                .param(
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                )
        })
        .sidecar_args(FAST)
        .without_sidecar()
        .start()
        .await;
    rig.create_secret("creds", &[("password", &value)]).await;
    rig.start_sidecar();
    for method in ["CreateVolume", "DeleteVolume"] {
        rig.control
            .set_fault(
                method,
                Fault::Error {
                    code: GrpcCode::Internal,
                    count: 2,
                    message: Some("injected: backend error".into()),
                },
            )
            .await
            .unwrap();
    }

    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let ledger = rig.ledger().await;
    assert_eq!(
        ledger.volume_by_name(&pv_name).unwrap().secret_keys,
        ["password"],
        "the secret reached the driver"
    );
    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    assert!(rig.ledger().await.call_count("DeleteVolume") >= 3);

    // The failures were reported (so there is text to look into)...
    rig.wait_claim_event("data", "ProvisioningFailed", "code = Internal")
        .await;
    // Events are sent in the background (after the work that waits for the
    // API), so they may land after the PV is gone.
    support::wait_for(
        "VolumeFailedDelete on the PV",
        support::DEADLINE,
        || async {
            let pv_events = rig.events_for("default", &pv_name).await;
            if pv_events
                .iter()
                .any(|e| e.reason.as_deref() == Some("VolumeFailedDelete"))
            {
                Ok(())
            } else {
                Err(pv_events)
            }
        },
    )
    .await;
    // ...and none of it, nor the log at -v=5 (which logs every CSI request), holds the value.
    let base64 = base64(value.as_bytes());
    for ns in [rig.ns.name.as_str(), "default"] {
        let events: Api<Event> = Api::namespaced(rig.client.clone(), ns);
        let text = serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items)
            .unwrap();
        assert!(!text.contains(&value), "secret in events of {ns}: {text}");
        assert!(!text.contains(&base64), "secret in events of {ns}: {text}");
    }
    let log = rig.sidecar_log();
    assert!(
        log.contains("DeleteVolume") && log.contains("CreateVolume"),
        "the CSI requests are logged at -v=5"
    );
    for line in log.lines() {
        assert!(
            !line.contains(&value) && !line.contains(&base64),
            "secret in the sidecar's log: {line}"
        );
    }
    rig.cleanup().await;
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// A secret the class names that does not exist yet: shown as upstream shows
// it, on every attempt, before anything is written; provisioned once it exists.

#[tokio::test]
async fn a_missing_provisioner_secret_is_shown_and_nothing_is_written_until_it_exists() {
    let rig = Rig::builder("err-nosecret")
        .class(|c| {
            c.param("csi.storage.k8s.io/provisioner-secret-name", "creds")
                .param(
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                )
        })
        .sidecar_args(FAST)
        .start()
        .await;
    rig.create_claim(rig.claim("data")).await;
    let ns = rig.ns.name.clone();
    let event = rig
        .wait_claim_event(
            "data",
            "ProvisioningFailed",
            &format!("error getting secret creds in namespace {ns}: secrets \"creds\" not found"),
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // As upstream, `Provisioning` comes before the attempt that then fails.
    rig.wait_claim_event(
        "data",
        "Provisioning",
        "External provisioner is provisioning volume",
    )
    .await;
    let claim = rig.claims().get("data").await.unwrap();
    assert!(
        !holds_intent(&claim),
        "no intent before the request can be sent"
    );
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 0);

    rig.create_secret("creds", &[("password", "x")]).await;
    rig.wait_bound("data").await;
    assert_eq!(rig.ledger().await.call_count("CreateVolume"), 1);
    rig.cleanup().await;
}

/// A driver that reports capacity 0 ("unknown") gets the requested size on the PV; one that
/// reports less than asked has its volume deleted and the claim retried (upstream does both).
#[tokio::test]
async fn a_reported_capacity_of_zero_or_less_than_asked_is_handled_as_upstream() {
    let rig = Rig::builder("capacity").sidecar_args(FAST).start().await;
    rig.control
        .set_fault(
            "CreateVolume",
            Fault::CreateReportsCapacity { bytes: 0, count: 1 },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("unknown").size("2Gi")).await;
    let pv = rig.wait_bound("unknown").await;
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");

    rig.control
        .set_fault(
            "CreateVolume",
            Fault::CreateReportsCapacity {
                bytes: 1 << 20,
                count: 1,
            },
        )
        .await
        .unwrap();
    rig.create_claim(rig.claim("short").size("2Gi")).await;
    let event = rig
        .wait_claim_event(
            "short",
            "ProvisioningFailed",
            "created volume capacity 1048576 less than requested capacity 2147483648",
        )
        .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // The short answer's volume was deleted; the retry gets a volume of the right size.
    let pv = rig.wait_bound("short").await;
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    let ledger = rig.ledger().await;
    let created = ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created)
        .count();
    assert_eq!(
        created, 3,
        "unknown, short (deleted), short again: {ledger:?}"
    );
    assert_eq!(ledger.volumes.len(), 2, "nothing left of the short answer");
    rig.cleanup().await;
}
