//! The intent made by the control plane (`--admission-intent`): freshness
//! rounds, listing rounds, a lone claim read at once, a cache caught up.

use serde_json::{Value, json};

use super::rig::{
    GET_CLAIM, PUT_CLAIM, Rig, UID, answer, claim, claim_object, created_pv, post_pv,
};
use crate::controller::claim::decide::fixtures::{ClaimFixture, DRIVER};
use crate::controller::scripted::{Reply, Step};
use crate::keys;
use crate::provision::ClaimView;

const LIST_CLAIMS: &str = "GET persistentvolumeclaims";

/// The answer to a round's consistent list: the collection's version.
fn collection_at(version: &str) -> Reply {
    Reply::Object(
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": version}, "items": []}),
    )
}

#[tokio::test]
async fn with_the_intent_from_admission_a_claim_costs_its_pv_and_a_share_of_a_round() {
    let c = ClaimFixture::ours().intent().0;
    let mut rig = Rig::basic(vec![
        (LIST_CLAIMS, collection_at("10")),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.admission(&c, 10, 1);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert!(
        !rig.seen().iter().any(|r| r.starts_with("PATCH")),
        "no write of ours on the claim"
    );
    assert_eq!(rig.reasons(), ["Provisioning", "ProvisioningSucceeded"]);
    assert_eq!(rig.backend().await, (1, 1, 0));
}

/// The claims pending for us as a listing round sees them: (name, uid, resourceVersion).
fn pending(items: &[(&str, &str, &str)]) -> Reply {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, uid, rv)| {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": rv,
                    "labels": {keys::LABEL_PROVISIONING: DRIVER}}})
        })
        .collect();
    Reply::Object(
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "11"}, "items": items}),
    )
}

/// A round the cache does not catch up with (a stalled watch, nothing written since: the tail of
/// a burst) is answered by one listing round of the claims pending for us, where each member
/// finds its own claim: never by a read per claim. Rows: what the listing shows of the claim.
#[tokio::test]
async fn a_round_the_cache_does_not_catch_up_with_is_answered_by_a_listing_round() {
    let c = ClaimFixture::ours().intent().0;
    let rv = ClaimView(&c).resource_version().unwrap().to_string();
    let mut bound = ClaimFixture::ours().intent().bound().0;
    bound.metadata.resource_version = Some("9".into());
    // (the listing, the steps after it, CreateVolume calls, what)
    let rows: Vec<(Reply, Vec<Step>, u64, &str)> = vec![
        (
            pending(&[("other", "u-2", "3"), ("data", UID, &rv)]),
            vec![(post_pv(), created_pv())],
            1,
            "the same version: current, no read",
        ),
        (
            pending(&[("data", UID, "9")]),
            vec![],
            0,
            "a newer version: decided again when the watch brings it",
        ),
        (
            pending(&[("data", "another-claim-of-that-name", "9")]),
            vec![],
            0,
            "another claim of that name: gone",
        ),
        (
            pending(&[("other", "u-2", "3")]),
            vec![(GET_CLAIM, claim_object(&bound))],
            0,
            "not among them (bound since, gone, or labelled by no policy): read, and decided on the read",
        ),
    ];
    for (listing, after, creates, what) in rows {
        let mut rig = Rig::basic(
            [
                vec![(LIST_CLAIMS, collection_at("10")), (LIST_CLAIMS, listing)],
                after,
            ]
            .concat(),
        )
        .await;
        // The cache is at 5 and stays there.
        rig.admission(&c, 5, 1);
        let r = rig.provision(&c).await;
        assert!(r.is_ok(), "{what}: {r:?} {:?}", rig.seen());
        rig.assert_script_done();
        assert_eq!(rig.backend().await.1, creates, "{what}");
        let selector = rig.query(1);
        assert!(
            selector.contains("labelSelector=csi-provisioner.rs%2Fprovisioning%3Dd"),
            "{what}: the listing asks for the claims pending for us: {selector}"
        );
    }
}

#[tokio::test]
async fn a_claim_without_the_intent_in_admission_mode_gets_it_from_the_fenced_write() {
    // The policy is not installed, failed open, or was removed mid-flight.
    let c = claim();
    let mut rig = Rig::basic(vec![
        (PUT_CLAIM, answer(&c, "8")),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.admission(&c, 10, 1);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(
        rig.body(0)["metadata"]["finalizers"],
        json!([keys::FINALIZER_PVC_INTENT]),
        "the intent is written before CreateVolume"
    );
    assert_eq!(rig.backend().await, (1, 1, 0));
}

#[tokio::test]
async fn a_claim_the_caught_up_cache_shows_bound_gets_no_volume() {
    // #124/#1469 without a fenced write: the copy decided on was stale; the
    // cache, caught up with the round, shows the claim bound since.
    let c = ClaimFixture::ours().intent().0;
    let mut now = ClaimFixture::ours().intent().bound().0;
    now.metadata.resource_version = Some("9".into());
    let mut rig = Rig::basic(vec![(LIST_CLAIMS, collection_at("10"))]).await;
    rig.admission(&now, 10, 1);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 0, 0), "no CreateVolume");
}

#[tokio::test]
async fn a_claim_deleted_and_gone_from_the_caught_up_cache_gets_no_volume() {
    let c = ClaimFixture::ours().intent().0;
    let mut rig = Rig::basic(vec![(LIST_CLAIMS, collection_at("10"))]).await;
    let mut other = ClaimFixture::ours().intent().0;
    other.metadata.uid = Some("another-claim-of-that-name".into());
    rig.admission(&other, 10, 1);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 0, 0), "no CreateVolume");
}

#[tokio::test]
async fn a_lone_claim_is_read_at_once_instead_of_waiting_for_a_round() {
    let c = ClaimFixture::ours().intent().0;
    let mut rig = Rig::basic(vec![
        (GET_CLAIM, claim_object(&c)),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.admission(&c, 10, 2);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (1, 1, 0));
}

#[tokio::test]
async fn a_read_that_shows_the_claim_changed_decides_again_on_what_it_shows() {
    // Read alone (no round): the claim is bound since the cache saw it.
    let c = ClaimFixture::ours().intent().0;
    let mut bound = ClaimFixture::ours().intent().bound().0;
    bound.metadata.resource_version = Some("9".into());
    let mut rig = Rig::basic(vec![(GET_CLAIM, claim_object(&bound))]).await;
    rig.admission(&c, 10, 2);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 0, 0), "no CreateVolume");
}
