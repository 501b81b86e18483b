//! The volume path's sequences, in-process and in seconds, on the claim
//! path's bench (`controller::scripted`): the API server is a script that can
//! refuse, fail or lose an answer, the CSI driver is the real test driver.
//! Each row says, for one answer at one step, which requests follow and what
//! the backend holds in the end. The end-to-end deletion tests
//! (tests/provision_basic.rs, tests/detach_wait.rs, tests/deletion_secrets.rs,
//! tests/invariants.rs, tests/migration.rs, tests/node_deployment.rs) prove the
//! same on a real control plane; these prove every branch.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};

use super::decide::fixtures::PvFixture;
use super::{Attachments, Context, VolumeError, VolumeMemory};
use crate::controller::Shared;
use crate::controller::node::{NodeMode, Placement};
use crate::controller::scripted::{Bench, Reply, Step};
use crate::csi::pb::volume_capability::access_mode::Mode;
use crate::csi::pb::volume_capability::{AccessMode, AccessType, MountVolume};
use crate::csi::{DriverCapabilities, pb};
use crate::keys;
use crate::kube::{LeaderGate, Listed};
use crate::metrics::VolumeLabels;

const DELETE_PV: &str = "DELETE persistentvolumes/pvc-1";
const GET_PV: &str = "GET persistentvolumes/pvc-1";
const PATCH_PV: &str = "PATCH persistentvolumes/pvc-1";

struct Rig {
    ctx: Arc<Context>,
    /// Fills the VolumeAttachment cache (a driver that publishes volumes).
    attachments: Option<reflector::store::Writer<VolumeAttachment>>,
    bench: Bench,
}

impl Deref for Rig {
    type Target = Bench;
    fn deref(&self) -> &Bench {
        &self.bench
    }
}

/// What a reconcile asked for when it succeeded.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Nothing until the PV changes.
    Done,
    /// Run again later (the same attempt failed a moment ago).
    Later,
}

fn caps(publish: bool) -> DriverCapabilities {
    DriverCapabilities {
        controller_service: true,
        create_delete_volume: true,
        publish_unpublish_volume: publish,
        ..Default::default()
    }
}

/// The volume path's context on `bench`: an empty class cache, a fresh
/// memory, the VolumeAttachment cache if the driver publishes volumes.
fn context(bench: &Bench, caps: DriverCapabilities, attachments: Option<Attachments>) -> Context {
    Context {
        shared: Arc::new(bench.shared(caps, reflector::store().0)),
        memory: VolumeMemory::new(Duration::from_secs(1), Duration::from_secs(300)),
        attachments,
    }
}

impl Rig {
    async fn new(steps: Vec<Step>) -> Rig {
        let bench = Bench::start(steps).await;
        let ctx = context(&bench, caps(false), None);
        Rig {
            ctx: Arc::new(ctx),
            attachments: None,
            bench,
        }
    }

    /// A rig for a driver that publishes volumes: its VolumeAttachment cache
    /// has had its first list.
    async fn publishing(steps: Vec<Step>) -> Rig {
        let bench = Bench::start(steps).await;
        let (store, writer) = reflector::store::<VolumeAttachment>();
        let attachments = Attachments {
            store,
            listed: Listed::done(),
        };
        let ctx = context(&bench, caps(true), Some(attachments));
        Rig {
            ctx: Arc::new(ctx),
            attachments: Some(writer),
            bench,
        }
    }

    /// The shared part, changed before any reconcile holds it.
    fn shared_mut(&mut self) -> &mut Shared {
        let ctx = Arc::get_mut(&mut self.ctx).expect("the context is not shared yet");
        Arc::get_mut(&mut ctx.shared).expect("the shared part is not shared yet")
    }

    /// A backend volume made for the PV; its handle.
    async fn volume(&self) -> String {
        let made = self
            .ctx
            .shared
            .csi
            .create_volume(pb::CreateVolumeRequest {
                name: "pvc-1".into(),
                volume_capabilities: vec![pb::VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }],
                ..Default::default()
            })
            .await
            .unwrap();
        made.volume.unwrap().volume_id
    }

    /// One reconcile as the controller runs it: on failure the error policy
    /// decides the requeue. Returns whether it asked to run again later.
    async fn reconcile(&self, pv: &PvFixture) -> Result<Next, VolumeError> {
        let pv = Arc::new(pv.0.clone());
        let r = match super::reconcile(pv.clone(), self.ctx.clone()).await {
            Ok(action) if action == Action::await_change() => Ok(Next::Done),
            Ok(_) => Ok(Next::Later),
            Err(e) => {
                super::error_policy(pv, &e, self.ctx.clone());
                Err(e)
            }
        };
        self.ctx.shared.recorder.flush(Duration::from_secs(5)).await;
        r
    }

    /// The same, once the backoff of an earlier failure has passed.
    async fn retry(&self, pv: &PvFixture) -> Result<Next, VolumeError> {
        self.ctx.memory.expire_hold(&pv.0.uid().unwrap());
        self.reconcile(pv).await
    }

    fn attach(&mut self, pv: &str, node: &str) {
        let va = VolumeAttachment {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("csi-{pv}")),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "d".into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.into()),
                    ..Default::default()
                },
            },
            status: None,
        };
        let writer = self.attachments.as_mut().expect("a publishing rig");
        writer.apply_watcher_event(&watcher::Event::Apply(va));
    }

    fn detach(&mut self, pv: &str) {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some(format!("csi-{pv}"));
        let writer = self.attachments.as_mut().expect("a publishing rig");
        writer.apply_watcher_event(&watcher::Event::Delete(va));
    }

    fn deleted_total(&self) -> u64 {
        self.ctx
            .shared
            .metrics
            .delete_total
            .get_or_create(&VolumeLabels {
                class: String::new(),
            })
            .get()
    }

    fn failed_total(&self) -> u64 {
        self.ctx
            .shared
            .metrics
            .delete_failed_total
            .get_or_create(&VolumeLabels {
                class: String::new(),
            })
            .get()
    }
}

/// The PV as the API server answers a request on it.
fn object(pv: &PvFixture) -> Reply {
    let mut v = serde_json::to_value(&pv.0).unwrap();
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("PersistentVolume");
    Reply::Object(v)
}

/// A Released PV of ours, held by our finalizer, naming `handle`.
fn released(handle: &str) -> PvFixture {
    PvFixture::ours().phase("Released").held().handle(handle)
}

/// The PV as the fenced DELETE leaves it: Terminating, held by our finalizer.
fn terminating(handle: &str) -> PvFixture {
    released(handle).deleting().version("6")
}

/// The PV once our finalizer is dropped.
fn let_go(handle: &str) -> PvFixture {
    let mut pv = terminating(handle);
    pv.0.metadata.finalizers = None;
    pv
}

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
    pv.0.spec.as_mut().unwrap().node_affinity = Some(in_zone("b"));
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
