//! The PV save: every answer to it, a failed save retried without a second
//! `CreateVolume`, and no save by a leader whose lease ran out.

use std::time::Duration;

use csi_test_driver::control::Fault;

use super::rig::{PUT_CLAIM, Rig, UID, answer, claim, created_pv, get_pv, post_pv, pv_bound_to};
use crate::controller::claim::ClaimError;
use crate::controller::scripted::{Reply, Step};

/// Each answer to the PV save, and what follows it (DESIGN §2.3, §2.4).
#[tokio::test]
async fn every_answer_to_the_pv_save() {
    let c = claim();
    // (answer, then, ok, ProvisioningSucceeded, what)
    let rows: Vec<(Reply, Vec<Step>, bool, bool, &str)> = vec![
        (created_pv(), vec![], true, true, "saved"),
        (
            Reply::Status(409),
            vec![(get_pv(), pv_bound_to(UID))],
            true,
            true,
            "AlreadyExists, and it is ours: done",
        ),
        (
            Reply::Status(409),
            vec![(get_pv(), pv_bound_to("someone-else"))],
            false,
            false,
            "AlreadyExists, another claim's: warn, keep the volume",
        ),
        (
            Reply::Status(409),
            vec![(get_pv(), Reply::Status(404))],
            false,
            false,
            "AlreadyExists, then gone: save again",
        ),
        (
            Reply::Status(500),
            vec![],
            false,
            false,
            "server error: save again",
        ),
        (
            Reply::Status(422),
            vec![],
            false,
            false,
            "invalid: save again",
        ),
        (Reply::Lost, vec![], false, false, "lost: save again"),
    ];
    for (reply, then, ok, succeeded, what) in rows {
        let rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8")), (post_pv(), reply)]).await;
        rig.then(then);
        let r = rig.provision(&c).await;
        assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
        rig.assert_script_done();
        assert_eq!(
            rig.reasons().contains(&"ProvisioningSucceeded".to_string()),
            succeeded,
            "{what}"
        );
        // Never a DeleteVolume because Kubernetes said no.
        assert_eq!(rig.backend().await, (1, 1, 0), "{what}");
    }
}

#[tokio::test]
async fn a_failed_save_is_retried_without_a_second_create_volume() {
    let c = claim();
    let rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8")), (post_pv(), Reply::Lost)]).await;
    assert!(rig.provision(&c).await.is_err());
    // The lost response had saved it: the retry finds it, ours, and the
    // driver's answer is remembered, so CreateVolume is not called again.
    rig.then(vec![
        (PUT_CLAIM, answer(&c, "8")),
        (post_pv(), Reply::Status(409)),
        (get_pv(), pv_bound_to(UID)),
    ]);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(
        rig.backend().await,
        (1, 1, 0),
        "one volume, one CreateVolume"
    );
}

/// Found by the model checker (docs/reliability.md, F1 and F2): a replica
/// whose lease ran out while its `CreateVolume` was in flight must not save
/// the PV, which would bind a claim the new leader has decided on since. The
/// save is refused like the call; the new leader saves the volume once, with
/// no second `CreateVolume`.
#[tokio::test]
async fn a_leader_whose_lease_ran_out_during_create_volume_does_not_save_the_pv() {
    let c = claim();
    let mut rig = Rig::basic(vec![(PUT_CLAIM, answer(&c, "8"))]).await;
    rig.shared_mut().leader = crate::kube::LeaderGate::open_for(Duration::from_millis(300));
    rig.driver
        .set_fault("CreateVolume", Fault::Latency { ms: 900 })
        .await
        .unwrap();
    let r = rig.provision(&c).await;
    assert!(matches!(r, Err(ClaimError::NotLeader)), "{r:?}");
    rig.assert_script_done();
    assert_eq!(rig.seen(), [PUT_CLAIM], "no PV saved by the old leader");
    assert_eq!(rig.backend().await, (1, 1, 0), "the volume was made");
    // The next leader: its fenced write, then the save of the volume the
    // driver made, found without asking again.
    rig.driver.clear_faults().await.unwrap();
    rig.shared_mut().leader = crate::kube::LeaderGate::always();
    rig.then(vec![
        (PUT_CLAIM, answer(&c, "9")),
        (post_pv(), created_pv()),
    ]);
    rig.provision(&c).await.unwrap();
    rig.assert_script_done();
    assert_eq!(
        rig.backend().await,
        (1, 1, 0),
        "one volume, one CreateVolume"
    );
}
