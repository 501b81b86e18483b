//! The fenced intent: what a claim costs, and every answer to the write that
//! makes the intent durable and checks the cached copy in one request.

use serde_json::json;

use super::rig::{
    GET_CLAIM, PUT_CLAIM, Rig, UID, answer, claim, claim_object, created_pv, post_pv,
};
use crate::controller::claim::decide::fixtures::ClaimFixture;
use crate::controller::scripted::{Reply, Step};
use crate::keys;

#[tokio::test]
async fn a_claim_costs_the_fenced_intent_and_the_pv_and_nothing_else() {
    let c = claim();
    let rig = Rig::basic(vec![
        (PUT_CLAIM, answer(&c, "8")),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    // The intent write is fenced on the UID and the resourceVersion decided on.
    let fence = &rig.body(0)["metadata"];
    assert_eq!(fence["uid"], UID);
    assert_eq!(fence["resourceVersion"], "7");
    assert_eq!(fence["finalizers"], json!([keys::FINALIZER_PVC_INTENT]));
    assert_eq!(rig.reasons(), ["Provisioning", "ProvisioningSucceeded"]);
    assert_eq!(rig.backend().await, (1, 1, 0));
}

#[tokio::test]
async fn the_fenced_write_is_made_even_when_the_cached_copy_shows_the_intent() {
    let c = ClaimFixture::ours().intent().0;
    let rig = Rig::basic(vec![
        // A no-op write answers the claim unchanged: the same version.
        (PUT_CLAIM, answer(&c, "7")),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (1, 1, 0));
}

#[tokio::test]
async fn a_cached_copy_with_the_intent_but_an_older_version_is_read_again() {
    let c = ClaimFixture::ours().intent().0;
    let fresh = {
        let mut f = c.clone();
        f.metadata.resource_version = Some("9".into());
        f
    };
    let rig = Rig::basic(vec![
        // The intent was there already, so nothing was written, and the
        // answer is a newer version than the one decided on: decide again.
        (PUT_CLAIM, answer(&c, "9")),
        (PUT_CLAIM, answer(&fresh, "9")),
        (post_pv(), created_pv()),
    ])
    .await;
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(rig.body(1)["metadata"]["resourceVersion"], "9");
    assert_eq!(rig.backend().await, (1, 1, 0));
    let stale = rig
        .ctx
        .shared
        .metrics
        .stale_cache_answers
        .get_or_create(&crate::metrics::ObjectLabels {
            object: "claim".into(),
        })
        .get();
    assert_eq!(stale, 1, "the stale copy is counted");
}

/// Each answer to the intent write, and what follows it.
#[tokio::test]
async fn every_answer_to_the_intent_write() {
    let c = claim();
    let bound = ClaimFixture::ours().bound().0;
    let mut newer = c.clone();
    newer.metadata.resource_version = Some("8".into());
    // (answer, then, CreateVolume calls, ok, what)
    let rows: Vec<(Reply, Vec<Step>, u64, bool, &str)> = vec![
        (
            Reply::Status(409),
            vec![(GET_CLAIM, Reply::Status(404))],
            0,
            true,
            "stale copy of a claim deleted since (#1469: no volume may be created)",
        ),
        (
            Reply::Status(409),
            vec![(GET_CLAIM, claim_object(&bound))],
            0,
            true,
            "stale copy of a claim bound since",
        ),
        (
            Reply::Status(409),
            vec![
                (GET_CLAIM, claim_object(&newer)),
                (PUT_CLAIM, answer(&newer, "9")),
                (post_pv(), created_pv()),
            ],
            1,
            true,
            "stale copy of a claim that still needs a volume: decided again on the fresh one",
        ),
        (
            Reply::Status(422),
            vec![],
            0,
            true,
            "being deleted (no new finalizers) or re-created (UID)",
        ),
        (Reply::Status(404), vec![], 0, true, "gone"),
        (
            Reply::Status(500),
            vec![],
            0,
            false,
            "server error: retried, nothing done",
        ),
        (
            Reply::Lost,
            vec![],
            0,
            false,
            "timeout or lost response: retried, nothing done",
        ),
    ];
    for (reply, then, creates, ok, what) in rows {
        let rig = Rig::basic(vec![(PUT_CLAIM, reply)]).await;
        rig.then(then);
        let r = rig.provision(&c).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        rig.assert_script_done();
        assert_eq!(rig.backend().await.1, creates, "{what}: CreateVolume calls");
        assert!(
            !rig.reasons().contains(&"ProvisioningFailed".to_string()) || !ok,
            "{what}"
        );
    }
}
