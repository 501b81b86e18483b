//! The rig every row runs on: the claim path's context on the scripted
//! bench (`controller::scripted`), a reconcile as the controller runs it, and
//! the claim, answers and request names the rows share.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::json;

use crate::controller::Shared;
use crate::controller::claim::decide::fixtures::{ClaimFixture, DRIVER, class};
use crate::controller::claim::intent::IntentMode;
use crate::controller::claim::{Caches, ClaimError, ClaimMemory, Context, IntentReleaser};
use crate::controller::scripted::{Bench, Reply, Step};
use crate::csi::DriverCapabilities;
use crate::keys;
use crate::kube::Listed;
use crate::kube::fresh::{Freshness, FreshnessConfig};
use crate::kube::slim::{Claim, Pv};
use crate::provision::{ClaimView, ProvisionOptions, volume_name};

/// A context whose API server is a script and whose driver is a fresh test
/// driver (the bench's helpers read through: `rig.driver`, `rig.seen()`).
pub(super) struct Rig {
    pub(super) ctx: Arc<Context>,
    /// Fills the claim cache (for the admission-intent rows).
    pub(super) claim_writer: reflector::store::Writer<Claim>,
    bench: Bench,
}

impl Deref for Rig {
    type Target = Bench;
    fn deref(&self) -> &Bench {
        &self.bench
    }
}

pub(super) const UID: &str = "11111111-2222-3333-4444-555555555555";

fn pv_name() -> String {
    volume_name("pvc", UID, None).unwrap()
}

impl Rig {
    pub(super) async fn new(steps: Vec<Step>, caps: DriverCapabilities) -> Rig {
        Rig::with_claims_listed(steps, caps, Listed::done()).await
    }

    /// A rig whose claim cache holds its first list once `claims_listed` says so.
    pub(super) async fn with_claims_listed(
        steps: Vec<Step>,
        caps: DriverCapabilities,
        claims_listed: Listed,
    ) -> Rig {
        let bench = Bench::start(steps).await;
        let (claims, claim_writer) = reflector::store::<Claim>();
        Rig {
            ctx: Arc::new(context(&bench, caps, claims, claims_listed)),
            claim_writer,
            bench,
        }
    }

    pub(super) async fn basic(steps: Vec<Step>) -> Rig {
        Rig::new(
            steps,
            DriverCapabilities {
                controller_service: true,
                create_delete_volume: true,
                ..Default::default()
            },
        )
        .await
    }

    /// A reconcile of a claim that needs a volume, as the controller runs it
    /// after any backoff (the hold of an earlier failure has passed).
    pub(super) async fn provision(&self, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
        self.ctx.memory.expire_hold(ClaimView(claim).uid());
        self.reconcile(claim).await.map(drop)
    }

    /// A reconcile of a deleted claim that holds the intent, likewise.
    pub(super) async fn abandon(&self, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
        assert!(ClaimView(claim).is_deleting() && ClaimView(claim).holds_intent());
        self.ctx.memory.expire_hold(ClaimView(claim).uid());
        self.reconcile(claim).await.map(drop)
    }

    /// One reconcile as the controller runs it: on failure the error policy
    /// decides the requeue. Returns the requeue, if any.
    pub(super) async fn reconcile(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<Duration>, ClaimError> {
        let claim = Arc::new(Claim(claim.clone()));
        let r = match crate::controller::claim::reconcile(claim.clone(), self.ctx.clone()).await {
            Ok(action) => Ok(action.requeue_after()),
            Err(e) => {
                crate::controller::claim::error_policy(claim, &e, self.ctx.clone());
                Err(e)
            }
        };
        self.ctx.shared.recorder.flush(Duration::from_secs(5)).await;
        r
    }

    /// The control plane makes the intent (`--admission-intent`): rounds of
    /// one claim suffice here, the claim cache holds `cached`, and it has
    /// caught up with `reached`.
    pub(super) fn admission(
        &mut self,
        cached: &PersistentVolumeClaim,
        reached: u64,
        min_round: usize,
    ) {
        let progress = self.ctx.caches.claims_progress.clone();
        let freshness = Freshness::start(FreshnessConfig {
            client: self.ctx.shared.client.clone(),
            progress: progress.clone(),
            bucket: None,
            metrics: self.ctx.shared.metrics.clone(),
            driver: DRIVER.into(),
            catch_up: Duration::from_millis(200),
            min_round,
            clock: crate::kube::clock::WriteClock::new(true),
        });
        self.ctx_mut().intent = IntentMode::Admission(freshness);
        self.claim_writer
            .apply_watcher_event(&watcher::Event::Apply(Claim(cached.clone())));
        progress.reach(reached);
    }

    pub(super) fn ctx_mut(&mut self) -> &mut Context {
        Arc::get_mut(&mut self.ctx).expect("the context is not shared yet")
    }

    /// The shared part, changed before any reconcile holds it.
    pub(super) fn shared_mut(&mut self) -> &mut Shared {
        Arc::get_mut(&mut self.ctx_mut().shared).expect("the shared part is not shared yet")
    }
}

/// The claim path's context on `bench`: the class cache holds an Immediate
/// class of the driver, the claim cache is `claims`, every other cache is
/// empty, the intent is the sidecar's to write.
fn context(
    bench: &Bench,
    caps: DriverCapabilities,
    claims: Store<Claim>,
    claims_listed: Listed,
) -> Context {
    let (classes, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Apply(class(DRIVER, "Immediate")));
    let shared = Arc::new(bench.shared(caps, classes));
    let memory = Arc::new(ClaimMemory::new(
        Duration::from_secs(1),
        Duration::from_secs(300),
    ));
    Context {
        intents: IntentReleaser::start(shared.client.clone(), memory.clone(), claims.clone()),
        options: ProvisionOptions::default(),
        caches: Caches {
            volumes: reflector::store::<Pv>().0,
            volumes_listed: Listed::done(),
            claims,
            claims_listed,
            claims_progress: Default::default(),
            namespaces: None,
            topology: None,
        },
        memory,
        intent: IntentMode::Write,
        clone_releases: tokio::sync::Semaphore::new(1),
        creates: tokio::sync::Semaphore::new(2),
        shared,
    }
}

pub(super) const PUT_CLAIM: &str = "PUT persistentvolumeclaims/data";
pub(super) const PUT_SNAPSHOT: &str = "PUT volumesnapshots/snap";
pub(super) const GET_CLAIM: &str = "GET persistentvolumeclaims/data";
/// The release of the intent (an update of the claim without it).
pub(super) const RELEASE: &str = PUT_CLAIM;

pub(super) fn post_pv() -> &'static str {
    "POST persistentvolumes"
}

pub(super) fn get_pv() -> &'static str {
    // The PV name is fixed by the fixture's UID.
    Box::leak(format!("GET persistentvolumes/{}", pv_name()).into_boxed_str())
}

/// The claim as the API server answers a write on it.
pub(super) fn answer(c: &PersistentVolumeClaim, rv: &str) -> Reply {
    let mut c = c.clone();
    c.metadata.resource_version = Some(rv.into());
    let f = c.metadata.finalizers.get_or_insert_default();
    if !f.iter().any(|x| x == keys::FINALIZER_PVC_INTENT) {
        f.push(keys::FINALIZER_PVC_INTENT.into());
    }
    Reply::Object(serde_json::to_value(c).unwrap())
}

pub(super) fn claim_object(c: &PersistentVolumeClaim) -> Reply {
    Reply::Object(serde_json::to_value(c).unwrap())
}

pub(super) fn pv_bound_to(uid: &str) -> Reply {
    Reply::Object(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name(), "uid": "pv-uid", "resourceVersion": "9"},
        "spec": {"claimRef": {"name": "data", "namespace": "team-a", "uid": uid},
                 "csi": {"driver": DRIVER, "volumeHandle": "h"}}
    }))
}

pub(super) fn created_pv() -> Reply {
    pv_bound_to(UID)
}

pub(super) fn claim() -> PersistentVolumeClaim {
    ClaimFixture::ours().0
}

/// A driver fault failing every call with `code`.
pub(super) fn failing(code: GrpcCode) -> Fault {
    Fault::Error {
        code,
        count: u32::MAX,
        message: None,
    }
}

/// A claim of ours deleted while it holds the intent.
pub(super) fn deleted() -> PersistentVolumeClaim {
    ClaimFixture::ours().intent().deleting().0
}
