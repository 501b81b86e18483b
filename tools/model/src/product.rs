//! The bridge to the product: a model claim as the `PersistentVolumeClaim`
//! the sidecar would hold, a model PV as the slim `Pv` its cache would hold
//! (the PV the product builds, parsed as the cache parses it), and the
//! product's own pure decisions taken on them (the claim path's
//! `controller::claim::decide::{decide, still_creates}` and the claim cache's
//! `cached`; the volume path's `controller::volume::decide::{decide,
//! still_to_delete}`). Nothing here decides anything itself.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, LazyLock, OnceLock};
use std::thread::LocalKey;

use csi_provisioner::controller::claim::cached;
use csi_provisioner::controller::claim::decide::{
    CachedPv, Decision, Facts, Recall, decide, still_creates,
};
use csi_provisioner::controller::node::Placement;
use csi_provisioner::controller::volume::decide as volume;
use csi_provisioner::csi::{DriverCapabilities, pb};
use csi_provisioner::keys;
use csi_provisioner::kube::slim;
use csi_provisioner::names::PvPhase;
use csi_provisioner::provision::{ClaimView, DriverInfo, ProvisionOptions, build_pv, clone, plan};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    TypedLocalObjectReference, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::state::{Claim, Memory, Phase, Pv};

pub const DRIVER: &str = "model.csi.example.com";
const CLASS: &str = "fast";

/// Our StorageClass: our driver, Immediate binding, reclaim policy Delete.
static CLASS_OBJ: LazyLock<Arc<StorageClass>> = LazyLock::new(|| {
    Arc::new(StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.into()),
            uid: Some("class-uid".into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        volume_binding_mode: Some("Immediate".into()),
        reclaim_policy: Some("Delete".into()),
        ..Default::default()
    })
});
static OPTIONS: LazyLock<ProvisionOptions> = LazyLock::new(ProvisionOptions::default);

/// Claim `c`, of name `i`, as the API server would serve it.
pub fn pvc(i: usize, c: &Claim, policy: bool) -> PersistentVolumeClaim {
    let u = c.uid;
    let finalizers: Vec<String> = [
        (c.intent, keys::FINALIZER_PVC_INTENT),
        (c.protected, keys::FINALIZER_CLONE_SOURCE),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, f)| f.to_string())
    .collect();
    let mut annotations = BTreeMap::new();
    if c.handed {
        annotations.insert(
            keys::ANN_STORAGE_PROVISIONER.to_string(),
            DRIVER.to_string(),
        );
    }
    if c.handle {
        annotations.insert(keys::ANN_ABANDONED_HANDLE.to_string(), format!("vol-{u}"));
    }
    let labels = (policy && c.intent)
        .then(|| BTreeMap::from([(keys::LABEL_PROVISIONING.to_string(), DRIVER.to_string())]));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{i}")),
            namespace: Some("ns".into()),
            uid: Some(format!("u{u}")),
            resource_version: Some(c.rv.to_string()),
            annotations: Some(annotations),
            labels,
            finalizers: (!finalizers.is_empty()).then_some(finalizers),
            deletion_timestamp: c
                .deleting
                .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("1Gi".into()),
                )])),
                ..Default::default()
            }),
            storage_class_name: Some(CLASS.into()),
            volume_name: c.bound.then(|| format!("pvc-u{u}")),
            data_source: c.clones.map(|source| TypedLocalObjectReference {
                api_group: None,
                kind: keys::CLAIM_KIND.into(),
                name: format!("claim-{source}"),
            }),
            ..Default::default()
        }),
        // The binder sets the phase with the volume name.
        status: c.bound.then(|| PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
    }
}

/// What the model carries out of a product decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Create,
    Abandon,
    ReleaseIntent,
    ReleaseCloneSource,
}

/// The answers of the product's decisions, per checker thread, by their
/// inputs: each is a pure function of what the model passes it, and the model
/// asks the same question in many states (the product's crate is built
/// without optimisation, and every question builds its objects anew).
fn memo<K, V>(
    answers: &'static LocalKey<RefCell<HashMap<K, V>>>,
    key: K,
    answer: impl FnOnce() -> V,
) -> V
where
    K: Eq + Hash,
    V: Copy,
{
    if let Some(v) = answers.with_borrow(|m| m.get(&key).copied()) {
        return v;
    }
    let v = answer();
    answers.with_borrow_mut(|m| m.insert(key, v));
    v
}

type Answers<K, V> = RefCell<HashMap<K, V>>;

thread_local! {
    static CLAIM: Answers<(usize, Claim, bool, Memory, bool), Option<Act>> = Default::default();
    static STILL_NEEDS: Answers<(usize, Claim, bool), bool> = Default::default();
    static KEPT: Answers<(usize, Claim, bool), bool> = Default::default();
    static WAITS: Answers<(usize, Claim, bool, usize), bool> = Default::default();
    static DELETES: Answers<(usize, Pv, bool), bool> = Default::default();
    static STILL_DELETES: Answers<(usize, Pv, Pv), bool> = Default::default();
}

/// The product's decision on claim `i` as a replica's cache shows it, with
/// its PV cache and its memory; `None` for anything that does not act
/// (forget, wait, requeue, refuse).
pub fn decision(
    i: usize,
    claim: &Claim,
    pv: Option<Pv>,
    memory: Memory,
    policy: bool,
) -> Option<Act> {
    let key = (i, *claim, pv.is_some(), memory, policy);
    memo(&CLAIM, key, || claim_decision(i, claim, pv, memory, policy))
}

fn claim_decision(
    i: usize,
    claim: &Claim,
    pv: Option<Pv>,
    memory: Memory,
    policy: bool,
) -> Option<Act> {
    let obj = pvc(i, claim, policy);
    let (decision, _attempt) = decide(&Facts {
        claim: ClaimView(&obj),
        driver: DRIVER,
        options: &OPTIONS,
        class: Some(CLASS_OBJ.clone()),
        place: &Placement::Central,
        recall: Recall {
            // The driver's unsaved answer, as the memory holds it (its
            // handle does not matter to the decision).
            created: memory.created.then(|| pb::Volume {
                volume_id: format!("vol-{}", claim.uid),
                ..Default::default()
            }),
            pv_saved: memory.pv_saved,
            intent_released: memory.intent_released,
            // Backoff is timing: a held attempt only delays what the model
            // lets happen in any order anyway.
            held: None,
        },
        pv: match pv {
            Some(_) => CachedPv::BoundTo(format!("u{}", claim.uid)),
            None => CachedPv::Unknown,
        },
    });
    match decision {
        Decision::Create(..) => Some(Act::Create),
        Decision::Abandon(_) => Some(Act::Abandon),
        Decision::ReleaseIntent => Some(Act::ReleaseIntent),
        Decision::ReleaseCloneSource => Some(Act::ReleaseCloneSource),
        Decision::Forget
        | Decision::Wait(_)
        | Decision::Requeue(_)
        | Decision::Refuse(_)
        | Decision::Race(..) => None,
    }
}

/// The product's answer to "does this claim, read again mid-attempt, still
/// need a volume from us?".
pub fn still_needs(i: usize, claim: &Claim, policy: bool) -> bool {
    memo(&STILL_NEEDS, (i, *claim, policy), || {
        let obj = pvc(i, claim, policy);
        still_creates(ClaimView(&obj), &CLASS_OBJ, DRIVER, &Placement::Central)
    })
}

/// Whether the claim cache keeps the claim at all (a bound claim without our
/// finalizers is left out of it).
pub fn kept_in_cache(i: usize, claim: &Claim, policy: bool) -> bool {
    memo(&KEPT, (i, *claim, policy), || {
        cached(&slim::Claim(pvc(i, claim, policy)))
    })
}

/// Whether claim `c` of name `i`, as a cache holds it, is a clone still
/// waiting for the claim named `source` (`ClaimView::waits_for`, which the
/// release of a clone source asks of every cached claim).
pub fn waits_for(i: usize, c: &Claim, policy: bool, source: usize) -> bool {
    memo(&WAITS, (i, *c, policy, source), || {
        let obj = pvc(i, c, policy);
        ClaimView(&obj).waits_for(keys::CLAIM_KIND, "ns", &format!("claim-{source}"))
    })
}

/// PV names the model may use (claim UIDs).
const MAX_PVS: usize = 8;

/// The PV the product saves for the claim of UID `u` and name `i` (`provision::plan` and `build_pv`,
/// on the claim handed to us and the driver's answer), as the PV cache parses
/// it (`slim::Pv`, by serde from the object's JSON), with the UID the API
/// server gives it. Built once per name: only the version, phase and deletion
/// timestamp vary.
fn saved_pv(i: usize, u: usize, clones: Option<u8>) -> &'static slim::Pv {
    static SAVED: [OnceLock<slim::Pv>; MAX_PVS] = [const { OnceLock::new() }; MAX_PVS];
    SAVED[u].get_or_init(|| {
        let claim = pvc(
            i,
            &Claim {
                uid: u as u8,
                rv: 1,
                handed: true,
                intent: true,
                deleting: false,
                bound: false,
                handle: false,
                clones,
                protected: false,
            },
            false,
        );
        let driver = DriverInfo {
            name: DRIVER.into(),
            identity: "model".into(),
            capabilities: DriverCapabilities {
                controller_service: true,
                create_delete_volume: true,
                clone_volume: true,
                ..Default::default()
            },
        };
        let plan =
            plan(&claim, &CLASS_OBJ, &driver, &OPTIONS).expect("the model's claim is planned");
        let answer = pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                volume_id: format!("vol-{u}"),
                content_source: clones.map(|source| clone::from_volume(format!("vol-{source}"))),
                ..Default::default()
            }),
        };
        let pv = build_pv(&plan, &claim, &CLASS_OBJ, &answer, &driver, &OPTIONS)
            .expect("the model's PV is built");
        let json = serde_json::to_value(&pv).expect("a PV serialises");
        let mut slim: slim::Pv = serde_json::from_value(json).expect("the cache parses it");
        slim.metadata.uid = Some(format!("pv-u{u}"));
        slim
    })
}

/// PV `u` (of the claim of UID `u`, name `i`, a clone of `clones`) as the
/// API server would serve it.
pub fn pv_object(i: usize, u: usize, clones: Option<u8>, pv: &Pv) -> slim::Pv {
    let mut obj = saved_pv(i, u, clones).clone();
    obj.metadata.resource_version = Some(pv.rv.to_string());
    obj.metadata.deletion_timestamp = pv
        .deleting
        .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let phase = match pv.phase {
        Phase::Available => PvPhase::Available,
        Phase::Bound => PvPhase::Bound,
        Phase::Released => PvPhase::Released,
    };
    obj.status = Some(slim::PvStatus {
        phase: Some(phase.as_str().to_string()),
    });
    obj
}

/// The volume path's decision on PV `u` (its claim's name `i`) as a
/// replica's cache shows it, with what the process remembers (it finished the
/// PV's deletion): whether to delete it. Forget, wait and requeue do not act; our PVs are born with our
/// finalizer and policy Delete, so adding or removing it is never decided.
pub fn deletes(i: usize, u: usize, clones: Option<u8>, pv: &Pv, deleted: bool) -> bool {
    memo(&DELETES, (u, *pv, deleted), || {
        volume_decision(i, u, clones, pv, deleted)
    })
}

fn volume_decision(i: usize, u: usize, clones: Option<u8>, pv: &Pv, deleted: bool) -> bool {
    let obj = pv_object(i, u, clones, pv);
    let (decision, _attempt) = volume::decide(&volume::Facts {
        pv: &obj,
        driver: DRIVER,
        place: &Placement::Central,
        recall: volume::Recall {
            deleted,
            // Backoff is timing, as on the claim path.
            held: None,
        },
    });
    match decision {
        volume::Decision::Delete => true,
        volume::Decision::Forget | volume::Decision::Wait(_) | volume::Decision::Requeue(_) => {
            false
        }
        volume::Decision::AddFinalizer | volume::Decision::RemoveFinalizer => {
            panic!("outside the model (its PVs keep our finalizer and policy Delete): {decision:?}")
        }
    }
}

/// The product's answer to "is `fresh`, PV `u` as the API server has it,
/// still the PV decided on (`cached`) and still to be deleted?".
pub fn still_deletes(i: usize, u: usize, clones: Option<u8>, fresh: &Pv, cached: &Pv) -> bool {
    memo(&STILL_DELETES, (u, *fresh, *cached), || {
        let (fresh, cached) = (
            pv_object(i, u, clones, fresh),
            pv_object(i, u, clones, cached),
        );
        volume::still_to_delete(&fresh, &cached, DRIVER)
    })
}
