//! The opt-in policy deploy/kubernetes/release-intent-policy.yaml on the real
//! control plane: kube-controller-manager's bind drops our intent inside its
//! own update, so the sidecar sends no request to release it. The policy is
//! cluster-scoped; here its binding is narrowed to the test's namespace so the
//! tests that share the control plane keep the default behaviour.

mod support;

use support::Rig;
use support::policies::{holds_intent, install, uninstall, wait_release};

#[tokio::test]
async fn with_the_policy_the_binder_drops_the_intent_and_the_sidecar_sends_nothing() {
    let rig = Rig::builder("mapol").start().await;
    // The shipped objects, renamed for this test and bound to its namespace only;
    // `install` returns once the policy acts.
    let installed = install(&rig, &["release-intent-policy.yaml"]).await;
    let kinds: Vec<&str> = installed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    );
    let claims = rig.claims();

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

    uninstall(&rig, &installed).await;

    // The control: without the policy the sidecar releases the intent itself,
    // and says so in the same log.
    wait_release(&rig, false).await;
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
