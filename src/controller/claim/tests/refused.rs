//! Claims refused before anything is written: a missing secret, an invalid
//! class, a claim left to its volume populator. Each is shown, nothing is
//! written.

use kube::runtime::{reflector, watcher};

use super::rig::{Rig, claim};
use crate::controller::claim::ClaimError;
use crate::controller::claim::decide::fixtures::{DRIVER, class};
use crate::controller::scripted::Reply;

#[tokio::test]
async fn a_missing_secret_is_shown_and_nothing_is_written() {
    let mut c = claim();
    let rig = Rig::basic(vec![("GET secrets/s", Reply::Status(404))]).await;
    // The class names a provisioner secret.
    let mut cls = class(DRIVER, "Immediate");
    cls.parameters = Some(
        [
            (
                "csi.storage.k8s.io/provisioner-secret-name".to_string(),
                "s".to_string(),
            ),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace".to_string(),
                "ns".to_string(),
            ),
        ]
        .into(),
    );
    let (classes, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Apply(cls));
    let mut rig = rig;
    rig.shared_mut().classes = classes;
    c.metadata.resource_version = Some("7".into());
    let r = rig.provision(&c).await;
    assert!(matches!(r, Err(ClaimError::GetSecret { .. })), "{r:?}");
    rig.assert_script_done();
    assert_eq!(rig.reasons(), ["Provisioning", "ProvisioningFailed"]);
    assert_eq!(
        rig.messages()[1],
        "error getting secret s in namespace ns: scripted 404"
    );
    assert_eq!(rig.backend().await, (0, 0, 0));
}

#[tokio::test]
async fn an_invalid_class_is_shown_after_the_provisioning_event_and_nothing_is_written() {
    let c = claim();
    let rig = Rig::basic(vec![]).await;
    let mut cls = class(DRIVER, "Immediate");
    cls.parameters = Some([("csi.storage.k8s.io/bogus".to_string(), "x".to_string())].into());
    let (classes, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Apply(cls));
    let mut rig = rig;
    rig.shared_mut().classes = classes;
    assert!(rig.provision(&c).await.is_err());
    rig.assert_script_done();
    assert_eq!(rig.reasons(), ["Provisioning", "ProvisioningFailed"]);
    assert_eq!(
        rig.messages()[1],
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/bogus\" with reserved namespace csi.storage.k8s.io/"
    );
}

#[tokio::test]
async fn a_populators_claim_is_left_to_it_with_upstreams_note_and_no_request() {
    let mut c = claim();
    c.spec.as_mut().unwrap().data_source_ref =
        Some(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: Some("backup.example.com".into()),
            kind: "Restore".into(),
            name: "nightly".into(),
            namespace: None,
        });
    let rig = Rig::basic(vec![]).await;
    let r = rig.provision(&c).await;
    assert!(r.as_ref().is_err_and(ClaimError::is_ignored), "{r:?}");
    rig.assert_script_done();
    assert_eq!(rig.reasons(), ["Provisioning", "Provisioning"]);
    assert_eq!(
        rig.messages()[1],
        "Assuming an external populator will provision the volume"
    );
    assert_eq!(rig.backend().await, (0, 0, 0));
}
