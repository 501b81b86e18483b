//! The cleanup of a claim deleted mid-flight: every answer on the way, a
//! handle that cannot be learned, a `CreateVolume` that fails.

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;

use super::rig::{
    GET_CLAIM, PUT_CLAIM, RELEASE, Rig, UID, claim_object, deleted, get_pv, pv_bound_to,
};
use crate::controller::claim::ClaimError;
use crate::controller::scripted::{Reply, Step};
use crate::keys;

#[tokio::test]
async fn every_answer_while_cleaning_up_a_deleted_claim() {
    let d = deleted();
    let mut recorded = d.clone();
    recorded
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(keys::ANN_ABANDONED_HANDLE.into(), "vol-recorded".into());
    let other = {
        let mut o = d.clone();
        o.metadata.uid = Some("another".into());
        o
    };
    // (steps, ok, CreateVolume calls, DeleteVolume calls, what)
    let rows: Vec<(Vec<Step>, bool, u64, u64, &str)> = vec![
        (
            vec![(get_pv(), pv_bound_to(UID)), (RELEASE, claim_object(&d))],
            true,
            0,
            0,
            "its PV was saved: the volume path owns the volume; only the intent goes",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, claim_object(&d)),
                (PUT_CLAIM, claim_object(&d)),
                (RELEASE, claim_object(&d)),
            ],
            true,
            1,
            1,
            "no PV: find the volume by its name, record its handle, delete it, release",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, claim_object(&recorded)),
                (RELEASE, claim_object(&d)),
            ],
            true,
            0,
            1,
            "handle recorded by an earlier try: no CreateVolume, delete that handle",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, Reply::Status(404)),
            ],
            true,
            0,
            0,
            "the claim is gone already",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, claim_object(&other)),
            ],
            true,
            0,
            0,
            "the name is another claim's now",
        ),
        (
            vec![(get_pv(), Reply::Status(500))],
            false,
            0,
            0,
            "cannot read the PV: retry",
        ),
        (
            vec![(get_pv(), Reply::Lost)],
            false,
            0,
            0,
            "no answer about the PV: retry",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, claim_object(&d)),
                (PUT_CLAIM, Reply::Status(500)),
            ],
            false,
            1,
            0,
            "the handle cannot be recorded: nothing deleted yet, retry",
        ),
        (
            vec![
                (get_pv(), Reply::Status(404)),
                (GET_CLAIM, claim_object(&d)),
                (PUT_CLAIM, claim_object(&d)),
                (RELEASE, Reply::Lost),
            ],
            false,
            1,
            1,
            "volume deleted, release lost: the retry finds the recorded handle",
        ),
    ];
    for (steps, ok, creates, deletes, what) in rows {
        let rig = Rig::basic(steps).await;
        let r = rig.abandon(&d).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        rig.assert_script_done();
        let (held, c, del) = rig.backend().await;
        assert_eq!((c, del), (creates, deletes), "{what}");
        // A volume found is deleted before the claim may go; only a retry
        // that has not got that far yet still sees it.
        assert_eq!(
            held as u64,
            creates - deletes.min(creates),
            "{what}: volumes left"
        );
    }
}

#[tokio::test]
async fn a_cleanup_that_cannot_learn_the_handle_keeps_the_claim_and_says_why() {
    let d = deleted();
    let rig = Rig::basic(vec![
        (get_pv(), Reply::Status(404)),
        (GET_CLAIM, claim_object(&d)),
    ])
    .await;
    rig.driver
        .set_fault(
            "CreateVolume",
            Fault::Error {
                code: GrpcCode::AlreadyExists,
                count: 1,
                message: None,
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        rig.abandon(&d).await,
        Err(ClaimError::CleanupBlocked(_))
    ));
    rig.assert_script_done();
    assert_eq!(rig.reasons(), ["ProvisioningCleanupFailed"]);
}

#[tokio::test]
async fn a_cleanup_whose_create_volume_fails_keeps_the_claim_until_it_can_tell() {
    use GrpcCode::*;
    // (driver's answer to the cleanup's CreateVolume, the claim may go)
    for (code, released) in [
        (Internal, false),
        (Unknown, false),
        (ResourceExhausted, false),
        (Unavailable, false),
        (DeadlineExceeded, false),
        (InvalidArgument, true),
    ] {
        let d = deleted();
        let mut steps = vec![
            (get_pv(), Reply::Status(404)),
            (GET_CLAIM, claim_object(&d)),
        ];
        if released {
            steps.push((RELEASE, claim_object(&d)));
        }
        let rig = Rig::basic(steps).await;
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
        let r = rig.abandon(&d).await;
        assert_eq!(r.is_ok(), released, "{code:?}: {r:?}");
        rig.assert_script_done();
    }
}
