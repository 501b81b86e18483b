//! The rig every row runs on: the volume path's context on the scripted
//! bench (`controller::scripted`), a reconcile as the controller runs it, and
//! the PVs and request names the rows share.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use serde_json::json;

use crate::controller::Shared;
use crate::controller::scripted::{Bench, Reply, Step};
use crate::controller::volume::decide::fixtures::PvFixture;
use crate::controller::volume::{Attachments, Context, VolumeError, VolumeMemory};
use crate::csi::pb::volume_capability::access_mode::Mode;
use crate::csi::pb::volume_capability::{AccessMode, AccessType, MountVolume};
use crate::csi::{DriverCapabilities, pb};
use crate::kube::Listed;
use crate::metrics::VolumeLabels;

pub(super) const DELETE_PV: &str = "DELETE persistentvolumes/pvc-1";
pub(super) const GET_PV: &str = "GET persistentvolumes/pvc-1";
pub(super) const PATCH_PV: &str = "PATCH persistentvolumes/pvc-1";

/// The volume path's context whose API server is a script and whose driver
/// is a fresh test driver (the bench's helpers read through).
pub(super) struct Rig {
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
pub(super) enum Next {
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
    pub(super) async fn new(steps: Vec<Step>) -> Rig {
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
    pub(super) async fn publishing(steps: Vec<Step>) -> Rig {
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

    /// The volume path's context the reconciles get.
    pub(super) fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The shared part, changed before any reconcile holds it.
    pub(super) fn shared_mut(&mut self) -> &mut Shared {
        let ctx = Arc::get_mut(&mut self.ctx).expect("the context is not shared yet");
        Arc::get_mut(&mut ctx.shared).expect("the shared part is not shared yet")
    }

    /// A backend volume made for the PV; its handle.
    pub(super) async fn volume(&self) -> String {
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
    pub(super) async fn reconcile(&self, pv: &PvFixture) -> Result<Next, VolumeError> {
        let pv = Arc::new(pv.0.clone());
        let r = match crate::controller::volume::reconcile(pv.clone(), self.ctx.clone()).await {
            Ok(action) if action == Action::await_change() => Ok(Next::Done),
            Ok(_) => Ok(Next::Later),
            Err(e) => {
                crate::controller::volume::error_policy(pv, &e, self.ctx.clone());
                Err(e)
            }
        };
        self.ctx.shared.recorder.flush(Duration::from_secs(5)).await;
        r
    }

    /// The same, once the backoff of an earlier failure has passed.
    pub(super) async fn retry(&self, pv: &PvFixture) -> Result<Next, VolumeError> {
        self.ctx.memory.expire_hold(&pv.0.uid().unwrap());
        self.reconcile(pv).await
    }

    pub(super) fn attach(&mut self, pv: &str, node: &str) {
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

    pub(super) fn detach(&mut self, pv: &str) {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some(format!("csi-{pv}"));
        let writer = self.attachments.as_mut().expect("a publishing rig");
        writer.apply_watcher_event(&watcher::Event::Delete(va));
    }

    pub(super) fn deleted_total(&self) -> u64 {
        self.ctx
            .shared
            .metrics
            .delete_total
            .get_or_create(&VolumeLabels {
                class: String::new(),
            })
            .get()
    }

    pub(super) fn failed_total(&self) -> u64 {
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
pub(super) fn object(pv: &PvFixture) -> Reply {
    let mut v = serde_json::to_value(&pv.0).unwrap();
    v["apiVersion"] = json!("v1");
    v["kind"] = json!("PersistentVolume");
    Reply::Object(v)
}

/// A Released PV of ours, held by our finalizer, naming `handle`.
pub(super) fn released(handle: &str) -> PvFixture {
    PvFixture::ours().phase("Released").held().handle(handle)
}

/// The PV as the fenced DELETE leaves it: Terminating, held by our finalizer.
pub(super) fn terminating(handle: &str) -> PvFixture {
    released(handle).deleting().version("6")
}

/// The PV once our finalizer is dropped.
pub(super) fn let_go(handle: &str) -> PvFixture {
    let mut pv = terminating(handle);
    pv.0.metadata.finalizers = None;
    pv
}
