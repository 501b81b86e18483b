//! The intent policies of deploy/kubernetes (provisioning-intent-policy.yaml,
//! release-intent-policy.yaml) installed for one rig: renamed for it, the
//! driver placeholder replaced by the rig's driver, each binding narrowed to
//! the rig's namespace so that the tests sharing the control plane keep the
//! default path.

use std::path::Path;

use csi_provisioner::keys;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};

use super::{DEADLINE, Rig, wait_for};

/// The driver name the shipped policy lists, to be edited by the operator.
pub const PLACEHOLDER_DRIVER: &str = "csi-driver.example.com";
/// The manager our sidecar's writes show in managedFields (its User-Agent).
pub const OUR_MANAGER: &str = "csi-provisioner";

pub fn resource(kind: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("policys", "policies"),
    }
}

/// The shipped policy and binding of `file`, for `driver`, renamed for the
/// rig and bound to its namespace only.
pub fn documents(rig: &Rig, file: &str) -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(PLACEHOLDER_DRIVER, &rig.driver_name);
    assert!(
        file != "provisioning-intent-policy.yaml" || text.contains(&rig.driver_name),
        "the shipped policy names the placeholder driver {PLACEHOLDER_DRIVER}"
    );
    let name = format!("{}-{}", file.trim_end_matches(".yaml"), rig.ns.name);
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|mut doc| {
            doc["metadata"]["name"] = name.clone().into();
            if doc["kind"] == "MutatingAdmissionPolicyBinding" {
                doc["spec"]["policyName"] = name.clone().into();
                doc["spec"]["matchResources"] = serde_json::json!({
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": rig.ns.name}}
                });
            }
            doc
        })
        .collect()
}

/// Installs the shipped policies (both, or the one named) and returns, once
/// each of them acts, their (kind, name) to remove them. A policy is loaded by
/// the API server a moment after its binding is created, and each file's at
/// its own moment: a test that went on once the first acted could see the
/// binder's update of its first claim pass before the release policy is
/// loaded.
pub async fn install(rig: &Rig, files: &[&str]) -> Vec<(String, String)> {
    let mut created = Vec::new();
    for file in files {
        for doc in documents(rig, file) {
            let kind = doc["kind"].as_str().unwrap().to_string();
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            let api: Api<DynamicObject> = Api::all_with(rig.client.clone(), &resource(&kind));
            api.create(
                &PostParams::default(),
                &serde_json::from_value(doc).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("creating the {kind} of {file}: {e}"));
            created.push((kind, name));
        }
    }
    for file in files {
        match *file {
            "provisioning-intent-policy.yaml" => wait_enforced(rig).await,
            "release-intent-policy.yaml" => wait_release(rig, true).await,
            other => panic!("no probe for {other}"),
        }
    }
    created
}

pub async fn uninstall(rig: &Rig, installed: &[(String, String)]) {
    for (kind, name) in installed.iter().rev() {
        let api: Api<DynamicObject> = Api::all_with(rig.client.clone(), &resource(kind));
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

pub fn holds_intent(c: &PersistentVolumeClaim) -> bool {
    c.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == keys::FINALIZER_PVC_INTENT)
}

/// Waits until a claim created already annotated for our driver gets the
/// intent at CREATE (the policy is enforced); removes the probe's intent.
async fn wait_enforced(rig: &Rig) {
    let claims = rig.claims();
    let mut n = 0;
    wait_for("the provisioning-intent policy to act", DEADLINE, || {
        n += 1;
        let name = format!("probe-{n}");
        let claims = claims.clone();
        let probe = rig
            .claim(&name)
            .class("")
            .annotation(keys::ANN_STORAGE_PROVISIONER, &rig.driver_name)
            .build();
        async move {
            let c = claims
                .create(&PostParams::default(), &probe)
                .await
                .map_err(|e| e.to_string())?;
            if !holds_intent(&c) {
                return Err("no intent at CREATE yet".to_string());
            }
            let mut c = c;
            c.metadata.finalizers = None;
            claims
                .replace(&name, &PostParams::default(), &c)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    })
    .await;
}

/// Waits until binding a claim by hand (no class, so no provisioner is
/// involved) drops the intent (`enforced`) or keeps it (`!enforced`: the
/// release policy is gone). The probes are named `probe-…` and hold no
/// finalizer of ours afterwards: they go with the namespace.
pub async fn wait_release(rig: &Rig, enforced: bool) {
    let claims = rig.claims();
    let mut n = 0;
    wait_for("the release policy to take effect", DEADLINE, || {
        n += 1;
        let name = format!("probe-release-{enforced}-{n}");
        let claims = claims.clone();
        let mut probe = rig.claim(&name).class("").build();
        async move {
            probe.metadata.finalizers = Some(vec![keys::FINALIZER_PVC_INTENT.into()]);
            let mut c = claims
                .create(&PostParams::default(), &probe)
                .await
                .map_err(|e| e.to_string())?;
            c.spec.as_mut().unwrap().volume_name = Some("nowhere".into());
            let after = claims
                .replace(&name, &PostParams::default(), &c)
                .await
                .map_err(|e| e.to_string())?;
            let kept = holds_intent(&after);
            if kept {
                let mut c = after;
                c.metadata.finalizers = None;
                claims
                    .replace(&name, &PostParams::default(), &c)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            if kept != enforced {
                Ok(())
            } else {
                Err(format!("intent kept: {kept}"))
            }
        }
    })
    .await;
}
