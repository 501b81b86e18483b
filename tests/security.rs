//! Secrets stay secret: the value of a provisioner secret reaches the driver
//! (its keys are in the driver's ledger) and nowhere else — not in our logs at
//! the highest verbosity (text or JSON), not in events, not in the PV, and not
//! in the `Debug` output of the CSI requests that carry it; and the same when
//! the driver and the API server fail, a claim is deleted mid-flight and the
//! sidecar crashes (the fault paths, where errors carry the most context).
//!
//! One run at `-v=10` covers every level: a level only adds lines to those of
//! the levels below it.

mod support;

use csi_provisioner::csi::pb;
use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube_fault_proxy::{Fault as ApiFault, Rule};
use support::{DEADLINE, Rig, StorageClassFixture, free_address, unique_name, wait_serving};

/// The secret's value: unique per run, so no other text can contain it by chance.
fn sentinel() -> String {
    format!("s3ntinel-{}", unique_name("v"))
}

/// Every form the value could leak in: as is, and base64 as the API carries it.
fn forms(value: &str) -> [String; 2] {
    [value.to_string(), base64(value.as_bytes())]
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn assert_absent(what: &str, text: &str, value: &str) {
    for form in forms(value) {
        assert!(
            !text.contains(&form),
            "the secret value ({form}) appears in {what}:\n{text}"
        );
    }
}

/// A class whose provisioner secret is the claim's `<name>-creds` in its namespace.
fn secret_per_claim(class: StorageClassFixture) -> StorageClassFixture {
    class
        .param(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-creds",
        )
        .param(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
}

/// Provisions and deletes a claim of a class whose provisioner secret is found
/// through `${pvc.namespace}`/`${pvc.name}` templates, with our sidecar at
/// `-v=10` in the given logging format; then looks for the secret everywhere.
async fn secret_value_reaches_only_the_driver(logging_format: &str) {
    let value = sentinel();
    let rig = Rig::builder("secrets")
        .class(secret_per_claim)
        .sidecar_args(&["-v=10", &format!("--logging-format={logging_format}")])
        .without_sidecar()
        .start()
        .await;
    rig.create_secret("data-creds", &[("password", &value), ("user", "admin")])
        .await;
    let mut rig = rig;
    rig.start_sidecar();

    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();

    // The secret did reach the driver: the ledger records the keys it got.
    let ledger = rig.ledger().await;
    let volume = ledger.volume_by_name(&pv_name).expect("the backend volume");
    let mut keys = volume.secret_keys.clone();
    keys.sort();
    assert_eq!(
        keys,
        ["password", "user"],
        "CreateVolume carried the secret"
    );
    // The PV records where the secret is (for deletion), never what it holds.
    let ann = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("volume.kubernetes.io/provisioner-deletion-secret-name")
            .map(String::as_str),
        Some("data-creds")
    );
    assert_eq!(
        ann.get("volume.kubernetes.io/provisioner-deletion-secret-namespace"),
        Some(&rig.ns.name)
    );
    assert_absent("the PV", &serde_json::to_string(&pv).unwrap(), &value);

    rig.delete_claim("data").await;
    rig.wait_pv_gone(&pv_name).await;
    assert_eq!(rig.ledger().await.call_count("DeleteVolume"), 1);

    // Logs at the highest verbosity: the requests were logged (so the check
    // means something), their secret was not.
    let log = rig.sidecar_log();
    let logged_request = log
        .lines()
        .any(|l| l.contains("CreateVolume") && l.contains(&pv_name));
    assert!(
        logged_request,
        "-v=10 logs the CreateVolume request:\n{log}"
    );
    assert!(
        log.contains("hyper_util"),
        "-v=10 turns on the HTTP libraries' debug logs too:\n{log}"
    );
    if logging_format == "json" {
        let first = log.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        serde_json::from_str::<serde_json::Value>(first)
            .unwrap_or_else(|e| panic!("JSON log lines ({e}): {first}"));
    }
    assert_absent("the sidecar's log", &log, &value);

    assert_no_event_holds(&rig, &value).await;
    rig.cleanup().await;
}

/// Events in the claim's namespace and about the PV (in `default`).
async fn assert_no_event_holds(rig: &Rig, value: &str) {
    for ns in [rig.ns.name.as_str(), "default"] {
        let events: Api<Event> = Api::namespaced(rig.client.clone(), ns);
        let list = events.list(&ListParams::default()).await.unwrap();
        assert_absent(
            &format!("events of {ns}"),
            &serde_json::to_string(&list.items).unwrap(),
            value,
        );
    }
}

fn failing(code: GrpcCode, count: u32) -> Fault {
    Fault::Error {
        code,
        count,
        message: Some("backend refused the request".into()),
    }
}

/// The secret through the fault paths, with the sidecar at `-v=10` behind the
/// fault proxy: `CreateVolume` failing, the PV's save refused by the API server,
/// a claim deleted while its `CreateVolume` hangs and the sidecar killed then
/// (the restarted one cleans up after it, with the secret), `DeleteVolume`
/// failing on release. Every log of both processes, every event and the
/// metrics are searched; the faults are checked to have fired, so the search
/// covers their paths.
async fn secret_value_stays_out_of_fault_paths(logging_format: &str) {
    let value = sentinel();
    let api = support::faulty_api().await;
    let address = free_address();
    let rig = Rig::builder("secrets-faults")
        .class(secret_per_claim)
        .sidecar_args(&[
            "-v=10",
            &format!("--logging-format={logging_format}"),
            &format!("--http-endpoint={address}"),
            "--timeout=2s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ])
        .kubeconfig(api.kubeconfig.clone())
        .without_sidecar()
        .start()
        .await;
    for claim in ["first", "second"] {
        rig.create_secret(
            &format!("{claim}-creds"),
            &[("password", &value), ("user", "admin")],
        )
        .await;
    }
    let mut rig = rig;
    let mut logs = String::new();

    // CreateVolume fails twice, then the PV's save is refused twice.
    rig.control
        .set_fault("CreateVolume", failing(GrpcCode::Internal, 2))
        .await
        .unwrap();
    api.proxy.add_rule(
        Rule::new(ApiFault::Status { code: 500 })
            .verbs(&["create"])
            .resources(&["persistentvolumes"])
            .count(2),
    );
    rig.start_sidecar();
    rig.create_claim(rig.claim("first")).await;
    let pv = rig.wait_bound("first").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert_eq!(
        api.proxy.stats().total_injected(),
        2,
        "the PV's save was refused twice"
    );
    assert_absent("the PV", &serde_json::to_string(&pv).unwrap(), &value);

    // A claim deleted while its CreateVolume hangs, and the sidecar killed
    // then; the restarted one cleans up after it.
    rig.control
        .set_fault("CreateVolume", Fault::Hang)
        .await
        .unwrap();
    rig.create_claim(rig.claim("second")).await;
    rig.control
        .wait_for_hung("CreateVolume", 1, DEADLINE)
        .await
        .unwrap();
    rig.delete_claim("second").await;
    logs.push_str(&rig.sidecar_log());
    rig.kill_sidecar();
    rig.control.clear_faults().await.unwrap();
    rig.control.release("CreateVolume").await.unwrap();
    rig.start_sidecar();
    rig.wait_claim_gone("second").await;

    // DeleteVolume fails twice on release.
    rig.control
        .set_fault("DeleteVolume", failing(GrpcCode::Internal, 2))
        .await
        .unwrap();
    rig.delete_claim("first").await;
    rig.wait_pv_gone(&pv_name).await;
    let ledger = rig.ledger().await;
    let failed = |method: &str| {
        ledger
            .operations
            .iter()
            .filter(|op| op.method == method && op.injected)
            .count()
    };
    assert_eq!(failed("CreateVolume"), 2, "CreateVolume failed twice");
    assert_eq!(failed("DeleteVolume"), 2, "DeleteVolume failed twice");
    assert!(
        ledger.volumes.is_empty(),
        "both volumes deleted (the abandoned one after the crash): {:?}",
        ledger.volumes
    );
    // Each volume was deleted with the secret (the abandoned one by the restarted sidecar).
    let deleted_with_secret = ledger
        .operations
        .iter()
        .filter(|op| op.method == "DeleteVolume" && op.deleted)
        .filter(|op| op.secret_keys.iter().any(|k| k == "password"))
        .count();
    assert_eq!(deleted_with_secret, 2, "{:?}", ledger.operations);

    let metrics = wait_serving(&rig, &address, "/metrics").await.body;
    assert!(
        metrics.contains("csi_sidecar_operations_seconds"),
        "{metrics}"
    );
    assert_absent("the metrics", &metrics, &value);
    logs.push_str(&rig.sidecar_log());
    assert!(
        logs.contains("backend refused the request"),
        "the failures were logged:\n{logs}"
    );
    assert_absent("the sidecar's logs", &logs, &value);
    assert_no_event_holds(&rig, &value).await;
    rig.cleanup().await;
}

#[tokio::test]
async fn secret_stays_out_of_text_logs_events_and_metrics_on_the_fault_paths() {
    secret_value_stays_out_of_fault_paths("text").await;
}

#[tokio::test]
async fn secret_stays_out_of_json_logs_on_the_fault_paths() {
    secret_value_stays_out_of_fault_paths("json").await;
}

#[tokio::test]
async fn provisioner_secret_reaches_the_driver_and_no_text_log_event_or_pv() {
    secret_value_reaches_only_the_driver("text").await;
}

#[tokio::test]
async fn provisioner_secret_reaches_no_json_log_either() {
    secret_value_reaches_only_the_driver("json").await;
}

#[test]
fn debug_of_requests_with_secrets_never_prints_them() {
    let value = sentinel();
    let secrets = std::collections::HashMap::from([("password".to_string(), value.clone())]);
    let create = pb::CreateVolumeRequest {
        name: "pvc-1".into(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let delete = pb::DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        secrets,
    };
    for text in [
        format!("{create:?}"),
        format!("{create:#?}"),
        format!("{delete:?}"),
        format!("{delete:#?}"),
    ] {
        assert_absent("a request's Debug", &text, &value);
        assert!(
            text.contains("pvc-1") || text.contains("vol-1"),
            "the rest is printed: {text}"
        );
    }
}
