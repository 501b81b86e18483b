//! The deletion of a Released PV, answer by answer: the fenced DELETE, a
//! lost answer, `DeleteVolume` failing, the finalizer patch, the deletion
//! secret.

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use serde_json::{Value, json};

use super::rig::{DELETE_PV, GET_PV, Next, PATCH_PV, Rig, let_go, object, released, terminating};
use crate::controller::scripted::{Reply, Step};
use crate::controller::volume::VolumeError;
use crate::keys;

fn delete_fence(rig: &Rig, i: usize) -> Value {
    rig.body(i)["preconditions"].clone()
}

#[tokio::test]
async fn a_released_pv_costs_one_fenced_delete_and_one_finalizer_patch() {
    let rig = Rig::new(vec![]).await;
    let h = rig.volume().await;
    rig.then(vec![
        (DELETE_PV, object(&terminating(&h))),
        (PATCH_PV, object(&let_go(&h))),
    ]);
    assert_eq!(rig.reconcile(&released(&h)).await.unwrap(), Next::Done);
    rig.assert_script_done();
    // The DELETE is the API server's confirmation: fenced on what was decided on.
    assert_eq!(
        delete_fence(&rig, 0),
        json!({"uid": "pv-uid", "resourceVersion": "5"})
    );
    // The finalizer is dropped from exactly the PV the DELETE answered.
    assert_eq!(rig.body(1)["metadata"]["uid"], "pv-uid");
    assert_eq!(rig.backend().await, (0, 1, 1));
    assert_eq!(rig.reasons(), Vec::<String>::new());
    assert_eq!(rig.deleted_total(), 1);
    // A stale copy of it, still Released in the cache, costs nothing more.
    assert_eq!(rig.reconcile(&released(&h)).await.unwrap(), Next::Done);
    assert_eq!(rig.seen(), [DELETE_PV, PATCH_PV]);
    assert_eq!(rig.backend().await, (0, 1, 1));
}

/// Each answer to the fenced DELETE, and what follows it.
#[tokio::test]
async fn every_answer_to_the_fenced_delete() {
    // (answer, then, DeleteVolume calls, ok, what)
    type Row = (Reply, fn(&str) -> Vec<Step>, u64, bool, &'static str);
    let rows: Vec<Row> = vec![
        (
            Reply::Status(409),
            |h| {
                vec![
                    (GET_PV, object(&released(h).version("9"))),
                    (DELETE_PV, object(&terminating(h))),
                    (PATCH_PV, object(&let_go(h))),
                ]
            },
            1,
            true,
            "a stale copy, still Released when read: decided again and deleted",
        ),
        (
            Reply::Status(409),
            |h| vec![(GET_PV, object(&released(h).policy("Retain")))],
            0,
            true,
            "a stale copy of a PV retained since: its volume is kept",
        ),
        (
            Reply::Status(409),
            |h| vec![(GET_PV, object(&released(h).uid("another")))],
            0,
            true,
            "another PV under the name now (the UID fence): not ours to delete",
        ),
        (
            Reply::Status(409),
            |_| vec![(GET_PV, Reply::Status(404))],
            0,
            true,
            "gone by the time it is read",
        ),
        (
            Reply::Status(404),
            |_| vec![],
            0,
            true,
            "gone already: nothing to delete",
        ),
        (
            Reply::Status(500),
            |_| vec![],
            0,
            false,
            "the API server fails: retried, nothing touched",
        ),
        (
            Reply::Lost,
            |_| vec![],
            0,
            false,
            "the answer is lost: retried, nothing touched yet",
        ),
    ];
    for (answer, then, calls, ok, what) in rows {
        let rig = Rig::new(vec![]).await;
        let h = rig.volume().await;
        rig.then(vec![(DELETE_PV, answer)]);
        rig.then(then(&h));
        let r = rig.reconcile(&released(&h)).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        rig.assert_script_done();
        let (volumes, _, deletes) = rig.backend().await;
        assert_eq!(deletes, calls, "{what}");
        assert_eq!(volumes, 1 - calls as usize, "{what}");
        assert_eq!(rig.reasons(), Vec::<String>::new(), "{what}: no event");
        if rig.seen().len() > 2 {
            // The second DELETE (after a read) is fenced on the UID alone: the
            // PV is ours to delete, whatever else changed since the read.
            assert_eq!(delete_fence(&rig, 2), json!({"uid": "pv-uid"}), "{what}");
        }
    }
}

#[tokio::test]
async fn a_delete_answered_but_lost_is_finished_on_the_next_attempt() {
    let rig = Rig::new(vec![]).await;
    let h = rig.volume().await;
    // The API server made the PV Terminating; the answer never came.
    rig.then(vec![(DELETE_PV, Reply::Lost)]);
    assert!(matches!(
        rig.reconcile(&released(&h)).await,
        Err(VolumeError::Kube(_))
    ));
    assert_eq!(
        rig.backend().await,
        (1, 1, 0),
        "no DeleteVolume on a lost answer"
    );
    // The watch brings the Terminating PV: the held attempt waits out its backoff...
    let requeued = rig.reconcile(&terminating(&h)).await.unwrap();
    assert_eq!(requeued, Next::Later, "held back, not retried at once");
    assert_eq!(rig.seen(), [DELETE_PV], "and asks nothing meanwhile");
    // ...then reads it (a Terminating PV is not deleted again) and finishes.
    rig.then(vec![
        (GET_PV, object(&terminating(&h))),
        (PATCH_PV, object(&let_go(&h))),
    ]);
    assert_eq!(rig.retry(&terminating(&h)).await.unwrap(), Next::Done);
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 1, 1));
}

#[tokio::test]
async fn a_failed_delete_volume_is_shown_and_retried_on_the_terminating_pv() {
    let rig = Rig::new(vec![]).await;
    let h = rig.volume().await;
    rig.driver
        .set_fault(
            "DeleteVolume",
            Fault::Error {
                code: GrpcCode::Internal,
                count: 1,
                message: Some("disk busy".into()),
            },
        )
        .await
        .unwrap();
    rig.then(vec![(DELETE_PV, object(&terminating(&h)))]);
    let r = rig.reconcile(&released(&h)).await;
    assert!(matches!(r, Err(VolumeError::DeleteVolume(_))), "{r:?}");
    rig.assert_script_done();
    assert_eq!(rig.reasons(), ["VolumeFailedDelete"]);
    assert_eq!(
        rig.messages(),
        ["rpc error: code = Internal desc = disk busy"]
    );
    assert_eq!(rig.failed_total(), 1);
    assert_eq!(rig.backend().await, (1, 1, 1), "the volume is still there");
    // The PV stays Terminating, held by our finalizer: the retry finishes it.
    rig.then(vec![
        (GET_PV, object(&terminating(&h))),
        (PATCH_PV, object(&let_go(&h))),
    ]);
    assert_eq!(rig.retry(&terminating(&h)).await.unwrap(), Next::Done);
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 1, 2));
    assert_eq!(rig.deleted_total(), 1);
}

/// The finalizer patch after `DeleteVolume`, answered each way.
#[tokio::test]
async fn every_answer_to_the_finalizer_patch() {
    // (answer, ok, DeleteVolume calls in the end, what)
    let rows: Vec<(Reply, bool, u64, &str)> = vec![
        (
            Reply::Status(404),
            true,
            1,
            "gone: the last finalizer was ours",
        ),
        (
            Reply::Status(409),
            false,
            2,
            "conflicting: retried, DeleteVolume repeated (NotFound = done)",
        ),
        (Reply::Status(500), false, 2, "failing: likewise"),
        (Reply::Lost, false, 2, "lost: likewise"),
    ];
    for (answer, ok, calls, what) in rows {
        let rig = Rig::new(vec![]).await;
        let h = rig.volume().await;
        rig.then(vec![
            (DELETE_PV, object(&terminating(&h))),
            (PATCH_PV, answer),
        ]);
        let r = rig.reconcile(&released(&h)).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        if !ok {
            rig.then(vec![
                (GET_PV, object(&terminating(&h))),
                (PATCH_PV, object(&let_go(&h))),
            ]);
            assert_eq!(
                rig.retry(&terminating(&h)).await.unwrap(),
                Next::Done,
                "{what}"
            );
        }
        rig.assert_script_done();
        assert_eq!(rig.backend().await, (0, 1, calls), "{what}");
        assert_eq!(rig.reasons(), Vec::<String>::new(), "{what}: no event");
    }
}

/// The provisioner secret recorded on the PV is read after the DELETE, and a
/// secret that cannot be read does not stop the deletion (as upstream).
#[tokio::test]
async fn the_deletion_secret_is_read_and_its_absence_does_not_block() {
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "ns"}, "data": {"key": "c2VjcmV0"}});
    for (answer, what) in [
        (Reply::Object(secret), "readable"),
        (Reply::Status(404), "gone"),
    ] {
        let rig = Rig::new(vec![]).await;
        let h = rig.volume().await;
        let pv = released(&h)
            .annotate(keys::ANN_DELETION_SECRET_NAME, "s")
            .annotate(keys::ANN_DELETION_SECRET_NAMESPACE, "ns");
        // The DELETE answers the PV with its annotations: the secret is named there.
        let deleted = pv.clone().deleting().version("6");
        rig.then(vec![
            (DELETE_PV, object(&deleted)),
            ("GET secrets/s", answer),
            (PATCH_PV, object(&let_go(&h))),
        ]);
        let r = rig.reconcile(&pv).await;
        assert!(
            matches!(r, Ok(Next::Done)),
            "{what}: {r:?} after {:?}",
            rig.seen()
        );
        rig.assert_script_done();
        assert_eq!(rig.backend().await, (0, 1, 1), "{what}");
    }
}
