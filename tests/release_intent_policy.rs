//! The opt-in policy deploy/kubernetes/release-intent-policy.yaml on the real
//! control plane: kube-controller-manager's bind drops our intent inside its
//! own update, so the sidecar sends no request to release it. The policy is
//! cluster-scoped; here its binding is narrowed to the test's namespace so the
//! tests that share the control plane keep the default behaviour.

mod support;

use std::path::Path;

use csi_provisioner::keys;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use support::Rig;

fn documents() -> Vec<serde_json::Value> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/release-intent-policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn resource(kind: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("policys", "policies"),
    }
}

fn holds_intent(c: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> bool {
    c.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == keys::FINALIZER_PVC_INTENT)
}

/// Waits until binding a claim by hand (no class, so no provisioner is
/// involved) drops the intent (`enforced`) or keeps it (`!enforced`).
async fn wait_for_policy(rig: &Rig, enforced: bool) {
    let claims = rig.claims();
    let mut n = 0;
    support::wait_for("the policy to take effect", support::DEADLINE, || {
        n += 1;
        let name = format!("probe-{enforced}-{n}");
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
                // Let the probe go with the namespace.
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

#[tokio::test]
async fn with_the_policy_the_binder_drops_the_intent_and_the_sidecar_sends_nothing() {
    let rig = Rig::builder("mapol").start().await;
    let ns = rig.ns.name.clone();
    // The shipped objects, renamed for this test and bound to its namespace only.
    let name = format!("release-intent-{ns}");
    let mut created = Vec::new();
    for mut doc in documents() {
        let kind = doc["kind"].as_str().unwrap().to_string();
        doc["metadata"]["name"] = name.clone().into();
        if kind == "MutatingAdmissionPolicyBinding" {
            doc["spec"]["policyName"] = name.clone().into();
            doc["spec"]["matchResources"] = serde_json::json!({
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            });
        }
        let api: Api<DynamicObject> = Api::all_with(rig.client.clone(), &resource(&kind));
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating the {kind}: {e}"));
        created.push(kind);
    }
    assert_eq!(
        created,
        ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    );

    // A policy takes a moment to be enforced (and to stop being enforced).
    let claims = rig.claims();
    wait_for_policy(&rig, true).await;

    rig.create_claim(rig.claim("data")).await;
    rig.wait_bound("data").await;
    support::wait_for("the intent to go", support::DEADLINE, || async {
        let c = claims.get("data").await.unwrap();
        if holds_intent(&c) {
            Err("still held")
        } else {
            Ok(())
        }
    })
    .await;
    assert!(
        !rig.sidecar_log().contains("releasing the intent"),
        "the binder's update released it; the sidecar sent nothing"
    );

    rig.delete_claim("data").await;
    rig.wait_claim_gone("data").await;
    support::wait_for("the backend volume to go", support::DEADLINE, || async {
        let l = rig.ledger().await;
        if l.volumes.is_empty() {
            Ok(())
        } else {
            Err(l.volumes.len())
        }
    })
    .await;

    for kind in ["MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"] {
        let api: Api<DynamicObject> = Api::all_with(rig.client.clone(), &resource(kind));
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }

    // The control: without the policy the sidecar releases the intent itself,
    // and says so in the same log.
    wait_for_policy(&rig, false).await;
    rig.create_claim(rig.claim("after")).await;
    rig.wait_bound("after").await;
    support::wait_for(
        "the sidecar to release the intent",
        support::DEADLINE,
        || async {
            let c = claims.get("after").await.unwrap();
            if !holds_intent(&c) && rig.sidecar_log().contains("releasing the intent") {
                Ok(())
            } else {
                Err(c.metadata.finalizers)
            }
        },
    )
    .await;
    // The probe claim holds no finalizer of ours any more; it goes with the namespace.
    rig.cleanup().await;
}
