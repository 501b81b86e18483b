//! A Released PV whose volume a VolumeAttachment still holds (a workload and its claim deleted
//! together: the detach is still under way) is not deleted yet, and the wait is not a failure:
//! a Normal `VolumeDelete` event with upstream's text, retried with backoff, no
//! `VolumeFailedDelete` Warning (upstream #1574: v6.4's `VolumeInUseError`, PR #1588, shown by
//! lib v13.1). Side by side with upstream v6.4: the same events.

mod support;

use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use support::{DEADLINE, Rig, Sidecar, unique_name, wait_for};

/// What one sidecar showed while the volume was attached.
#[derive(Debug)]
struct Observed {
    /// Events on the PV: (type, reason, message with the names replaced, count).
    events: Vec<(String, String, String, i32)>,
    /// `DeleteVolume` calls made while the attachment existed.
    deletes_while_attached: u64,
    /// Whether the PV was left as it was (not Terminating) while attached.
    pv_untouched: bool,
}

fn attachment(name: &str, driver: &str, node: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: driver.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

/// A claim provisioned, "attached" (a VolumeAttachment naming its PV, as the attach/detach
/// controller makes), deleted; what the sidecar does until the attachment goes; then the PV must
/// be deleted.
async fn scenario(who: Sidecar) -> Observed {
    let mut rig = Rig::builder("detach")
        .driver(|d| d.capabilities = vec!["+PUBLISH_UNPUBLISH_VOLUME".to_string()])
        .start_for(who)
        .await;
    // Ours under the shipped RBAC: the VolumeAttachment watch needs its rule.
    let _upstream = rig.start_as(who, &["--leader-election=false", "--retry-interval-max=4s"]);
    rig.create_claim(rig.claim("data")).await;
    let pv = rig.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let node = unique_name("node");
    let va_name = unique_name("va");
    let attachments: Api<VolumeAttachment> = Api::all(rig.client.clone());
    attachments
        .create(
            &PostParams::default(),
            &attachment(&va_name, &rig.driver_name, &node, &pv_name),
        )
        .await
        .expect("creating the VolumeAttachment");
    // Let the sidecar's watch see it before the PV is released.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    rig.delete_claim("data").await;

    // Each retry is shown (on one Event whose count grows): wait for the third.
    let message =
        format!("persistentvolume {pv_name} is still attached to node {node}, waiting for detach");
    wait_for("three attempts while attached", DEADLINE, || async {
        let events = rig.events_for("default", &pv_name).await;
        let seen: i32 = events
            .iter()
            .filter(|e| e.message.as_deref() == Some(message.as_str()))
            .map(|e| e.count.unwrap_or(1))
            .sum();
        if seen >= 3 { Ok(()) } else { Err(events) }
    })
    .await;
    let still = rig.volumes().get(&pv_name).await.expect("the PV is kept");
    let observed = Observed {
        events: rig
            .events_for("default", &pv_name)
            .await
            .into_iter()
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message
                        .unwrap_or_default()
                        .replace(&pv_name, "<pv>")
                        .replace(&node, "<node>"),
                    e.count.unwrap_or(1),
                )
            })
            .collect(),
        deletes_while_attached: rig.ledger().await.call_count("DeleteVolume"),
        pv_untouched: still.metadata.deletion_timestamp.is_none(),
    };

    // Detached: the next retry deletes the volume and the PV.
    attachments
        .delete(&va_name, &DeleteParams::default())
        .await
        .expect("deleting the VolumeAttachment");
    rig.wait_pv_gone(&pv_name).await;
    assert!(
        rig.ledger().await.volume_by_name(&pv_name).is_none(),
        "{who:?}: the volume is deleted once detached"
    );
    rig.cleanup().await;
    observed
}

#[tokio::test]
async fn deletion_waits_for_the_detach_with_a_normal_event_as_upstream_does() {
    let ours = scenario(Sidecar::Ours).await;
    let upstream = scenario(Sidecar::Upstream).await;
    let text = "persistentvolume <pv> is still attached to node <node>, waiting for detach";

    for (who, seen) in [("ours", &ours), ("upstream", &upstream)] {
        // Neither calls the driver nor touches the PV while the volume is attached.
        assert_eq!(seen.deletes_while_attached, 0, "{who}: {seen:?}");
        assert!(seen.pv_untouched, "{who}: {seen:?}");
        // The wait is a Normal VolumeDelete with v6.4's text, each retry counted on it, and no
        // Warning at all.
        let normal: i32 = seen
            .events
            .iter()
            .filter(|(t, r, m, _)| t == "Normal" && r == "VolumeDelete" && m == text)
            .map(|e| e.3)
            .sum();
        assert!(normal >= 3, "{who}: retried: {seen:?}");
        assert!(
            !seen.events.iter().any(|(t, ..)| t == "Warning"),
            "{who}: no Warning while waiting for the detach: {seen:?}"
        );
    }
    // The same events, but for how many retries each counted.
    let kinds = |o: &Observed| {
        let mut k: Vec<_> = o
            .events
            .iter()
            .map(|(t, r, m, _)| (t.clone(), r.clone(), m.clone()))
            .collect();
        k.sort();
        k.dedup();
        k
    };
    assert_eq!(
        kinds(&ours),
        kinds(&upstream),
        "ours (left) and upstream v6.4 (right)"
    );
}
