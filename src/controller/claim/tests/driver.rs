//! The driver's answers to `CreateVolume`: each class of error, the
//! infeasible wait, and the backoff that holds a failed attempt back.

use std::time::Duration;

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;

use super::rig::{GET_CLAIM, PUT_CLAIM, Rig, answer, claim, claim_object, failing, get_pv};
use crate::controller::claim::ClaimError;
use crate::controller::claim::decide::fixtures::ClaimFixture;
use crate::controller::scripted::Reply;

/// Each CSI answer to CreateVolume (DESIGN §2.7).
#[tokio::test]
async fn every_answer_of_the_driver() {
    use GrpcCode::*;
    // (code, volumes held after, event text fragment)
    let rows = [
        (DeadlineExceeded, 0, "rpc error: code = DeadlineExceeded"),
        (Unavailable, 0, "rpc error: code = Unavailable"),
        (AlreadyExists, 0, "rpc error: code = AlreadyExists"),
        (Internal, 0, "rpc error: code = Internal"),
        (
            InvalidArgument,
            0,
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument",
        ),
        (ResourceExhausted, 0, "rpc error: code = ResourceExhausted"),
    ];
    let c = claim();
    for (code, held, text) in rows {
        let rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8"))]).await;
        rig.driver
            .set_fault(
                "CreateVolume",
                Fault::Error {
                    code,
                    count: 1,
                    message: None,
                },
            )
            .await
            .unwrap();
        let r = rig.provision(&c).await;
        assert!(
            matches!(r, Err(ClaimError::CreateVolume { .. })),
            "{code:?}: {r:?}"
        );
        rig.assert_script_done();
        assert_eq!(
            rig.reasons(),
            ["Provisioning", "ProvisioningFailed"],
            "{code:?}"
        );
        assert!(
            rig.messages()[1].starts_with(text),
            "{code:?}: {:?}",
            rig.messages()
        );
        assert_eq!(rig.backend().await.0, held);
    }
}

#[tokio::test]
async fn an_infeasible_claim_waits_without_a_request() {
    let c = claim();
    let rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8"))]).await;
    rig.driver
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::InvalidArgument,
                count: 1,
                message: None,
            },
        )
        .await
        .unwrap();
    assert!(rig.reconcile(&c).await.is_err());
    // The next attempt within --retry-interval-max sends nothing at all.
    let wait = rig.reconcile(&c).await.unwrap().expect("a requeue");
    assert!(wait > Duration::from_secs(299), "{wait:?}");
    rig.assert_script_done();
    assert_eq!(rig.seen(), [PUT_CLAIM]);
}

/// The updates a failed attempt causes (here: its own intent write) trigger
/// reconciles at once; none of them calls the driver before the backoff is
/// over. A deleted claim is other work: its cleanup goes at once.
#[tokio::test]
async fn a_failed_attempt_is_not_repeated_before_its_backoff() {
    let c = claim();
    let rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8"))]).await;
    rig.driver
        .set_fault("CreateVolume", failing(GrpcCode::Internal))
        .await
        .unwrap();
    assert!(rig.reconcile(&c).await.is_err());
    let echo = ClaimFixture::ours().intent().0;
    for _ in 0..3 {
        let wait = rig.reconcile(&echo).await.unwrap().expect("a requeue");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }
    assert_eq!(rig.backend().await.1, 1, "one CreateVolume");
    rig.assert_script_done();

    // Deleted meanwhile: abandoned at once (the volume may exist: asked again
    // by name, then nothing to delete as the driver failed every create).
    let deleted = ClaimFixture::ours().intent().deleting().0;
    rig.then(vec![
        (get_pv(), Reply::Status(404)),
        (GET_CLAIM, claim_object(&deleted)),
    ]);
    assert!(rig.reconcile(&deleted).await.is_err());
    assert_eq!(rig.backend().await.1, 2, "the cleanup asked at once");
    rig.assert_script_done();
}
