//! Deletions held back or left alone: a volume still attached, a replica
//! that is not the leader, a volume that cannot be named, another node's PV.

use std::time::Duration;

use serde_json::json;

use super::rig::{DELETE_PV, Next, PATCH_PV, Rig, let_go, object, released, terminating};
use crate::controller::memory::Attempt;
use crate::controller::node::{NodeMode, Placement};
use crate::controller::volume::decide::Work;
use crate::controller::volume::decide::fixtures::{PvFixture, should_delete_table};
use crate::controller::volume::{VolumeError, queues};
use crate::kube::LeaderGate;

#[tokio::test]
async fn a_deletion_waits_for_the_detach_and_goes_on_when_it_ends() {
    let mut rig = Rig::publishing(vec![]).await;
    let h = rig.volume().await;
    rig.attach("pvc-1", "node-1");
    let r = rig.reconcile(&released(&h)).await;
    assert!(matches!(r, Err(VolumeError::Attached { .. })), "{r:?}");
    assert_eq!(
        rig.seen(),
        Vec::<String>::new(),
        "nothing touched while attached"
    );
    assert_eq!(rig.reasons(), ["VolumeDelete"]);
    assert_eq!(
        rig.messages(),
        ["persistentvolume pvc-1 is still attached to node node-1, waiting for detach"]
    );
    assert_eq!(rig.failed_total(), 0, "a wait is no failure");
    // The detach ends while the retry waits: the retry goes on with the deletion.
    rig.detach("pvc-1");
    assert_eq!(
        rig.reconcile(&released(&h)).await.unwrap(),
        Next::Later,
        "still held back"
    );
    rig.then(vec![
        (DELETE_PV, object(&terminating(&h))),
        (PATCH_PV, object(&let_go(&h))),
    ]);
    assert_eq!(rig.retry(&released(&h)).await.unwrap(), Next::Done);
    rig.assert_script_done();
    assert_eq!(rig.backend().await, (0, 1, 1));
}

#[tokio::test]
async fn a_replica_that_is_not_the_leader_touches_nothing_and_holds_nothing_back() {
    let mut rig = Rig::new(vec![]).await;
    rig.shared_mut().leader = LeaderGate::never();
    let h = rig.volume().await;
    let r = rig.reconcile(&released(&h)).await;
    assert!(matches!(r, Err(VolumeError::NotLeader)), "{r:?}");
    // Not held: the next look decides again at once (and is refused again).
    let again = rig.reconcile(&released(&h)).await;
    assert!(matches!(again, Err(VolumeError::NotLeader)), "{again:?}");
    assert_eq!(rig.seen(), Vec::<String>::new());
    assert_eq!(rig.reasons(), Vec::<String>::new());
    assert_eq!(rig.backend().await, (1, 1, 0));
}

#[tokio::test]
async fn a_pv_of_ours_whose_volume_cannot_be_named_is_shown_and_left_as_it_is() {
    let rig = Rig::new(vec![]).await;
    let pv = PvFixture::ours().no_csi().phase("Released").held();
    let r = rig.reconcile(&pv).await;
    assert!(matches!(r, Err(VolumeError::Invalid(_))), "{r:?}");
    assert_eq!(
        rig.seen(),
        Vec::<String>::new(),
        "not made Terminating with nothing to delete"
    );
    assert_eq!(rig.reasons(), ["VolumeFailedDelete"]);
    assert_eq!(rig.backend().await, (0, 0, 0));
}

#[tokio::test]
async fn another_nodes_pv_is_left_to_that_node() {
    let mut rig = Rig::new(vec![]).await;
    rig.shared_mut().place = Placement::Node(NodeMode {
        name: "n1".into(),
        topology: Some([("zone".to_string(), "a".to_string())].into()),
        immediate_binding: true,
        max_delay: Duration::from_secs(2),
        base_delay: Duration::from_secs(1),
    });
    let h = rig.volume().await;
    let mut pv = released(&h);
    pv.0.spec.as_mut().unwrap().node_affinity = Some(Box::new(in_zone("b")));
    assert_eq!(rig.reconcile(&pv).await.unwrap(), Next::Done);
    assert_eq!(rig.seen(), Vec::<String>::new());
    assert_eq!(rig.backend().await, (1, 1, 0));
}

fn in_zone(zone: &str) -> k8s_openapi::api::core::v1::VolumeNodeAffinity {
    serde_json::from_value(json!({"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}
    ]}}))
    .unwrap()
}

/// A PV is queued only if its reconcile could do something: every PV of the
/// decision table whose work is nothing is left out, and its reconcile sends no
/// request and remembers nothing; a PV the memory holds is queued whatever its
/// work.
#[tokio::test]
async fn only_pvs_with_something_to_do_are_queued() {
    for (pv, work, what) in should_delete_table() {
        let queued = work != Work::Nothing;
        let rig = Rig::new(vec![]).await;
        assert_eq!(queues(rig.ctx(), &pv.0), queued, "{what}");
        let mut cached = pv.0.clone();
        cached.trim();
        assert_eq!(queues(rig.ctx(), &cached), queued, "{what} (cached)");
        if !queued {
            let r = rig.reconcile(&pv).await;
            assert!(matches!(r, Ok(Next::Done)), "{what}: {r:?}");
            assert_eq!(rig.seen(), Vec::<String>::new(), "{what}");
            assert!(rig.ctx().memory.is_empty(), "{what}");
        }
    }
    let rig = Rig::new(vec![]).await;
    let pv = PvFixture::ours().phase("Bound").held();
    rig.ctx().memory.note("pv-uid", Attempt::of(1u8));
    assert!(queues(rig.ctx(), &pv.0), "remembered");
}
