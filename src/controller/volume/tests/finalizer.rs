//! The finalizer following the reclaim policy: put on a Bound PV, taken off
//! a retained one, each answer.

use super::rig::{PATCH_PV, Rig, object};
use crate::controller::scripted::Reply;
use crate::controller::volume::decide::fixtures::PvFixture;

/// The finalizer put on and taken off, each answer.
#[tokio::test]
async fn the_finalizer_follows_the_reclaim_policy() {
    let bound = PvFixture::ours().phase("Bound");
    let retained = PvFixture::ours().phase("Released").held().policy("Retain");
    // (PV, answer, ok, what)
    let rows: Vec<(&PvFixture, Reply, bool, &str)> = vec![
        (&bound, object(&bound.clone().held()), true, "bound: held"),
        (
            &bound,
            Reply::Status(422),
            true,
            "being deleted meanwhile: no new finalizer, nothing to hold",
        ),
        (&bound, Reply::Status(404), true, "gone meanwhile"),
        (&bound, Reply::Status(500), false, "failing: retried"),
        (
            &retained,
            object(&retained),
            true,
            "retained: let go, volume kept",
        ),
        (&retained, Reply::Status(404), true, "retained and gone"),
        (
            &retained,
            Reply::Lost,
            false,
            "retained, answer lost: retried",
        ),
    ];
    for (pv, answer, ok, what) in rows {
        let rig = Rig::new(vec![(PATCH_PV, answer)]).await;
        let r = rig.reconcile(pv).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        rig.assert_script_done();
        assert_eq!(
            rig.body(0)["metadata"]["uid"],
            "pv-uid",
            "{what}: fenced on the UID"
        );
        assert_eq!(rig.backend().await, (0, 0, 0), "{what}");
    }
}
