//! The bridge to the product: a model claim as the `PersistentVolumeClaim`
//! the sidecar would hold, and the product's own pure decisions taken on it
//! (`controller::claim::decide::{decide, still_creates}` and the claim
//! cache's `cached`). Nothing here decides anything itself.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use csi_provisioner::controller::claim::cached;
use csi_provisioner::controller::claim::decide::{
    CachedPv, Decision, Facts, Recall, decide, still_creates,
};
use csi_provisioner::controller::node::Placement;
use csi_provisioner::keys;
use csi_provisioner::kube::slim;
use csi_provisioner::provision::{ClaimView, ProvisionOptions};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::state::{Claim, Memory, Pv};

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

/// Claim `i` as the API server would serve it.
pub fn pvc(i: usize, c: &Claim, policy: bool) -> PersistentVolumeClaim {
    let mut annotations = BTreeMap::new();
    if c.handed {
        annotations.insert(
            keys::ANN_STORAGE_PROVISIONER.to_string(),
            DRIVER.to_string(),
        );
    }
    if c.handle {
        annotations.insert(keys::ANN_ABANDONED_HANDLE.to_string(), format!("vol-{i}"));
    }
    let labels = (policy && c.intent)
        .then(|| BTreeMap::from([(keys::LABEL_PROVISIONING.to_string(), DRIVER.to_string())]));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{i}")),
            namespace: Some("ns".into()),
            uid: Some(format!("u{i}")),
            resource_version: Some(c.rv.to_string()),
            annotations: Some(annotations),
            labels,
            finalizers: c
                .intent
                .then(|| vec![keys::FINALIZER_PVC_INTENT.to_string()]),
            deletion_timestamp: c
                .deleting
                .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(CLASS.into()),
            volume_name: c.bound.then(|| format!("pvc-u{i}")),
            ..Default::default()
        }),
        status: None,
    }
}

/// What the model carries out of a product decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Create,
    Abandon,
    ReleaseIntent,
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
            created: memory.created.then(|| csi_provisioner::csi::pb::Volume {
                volume_id: format!("v{i}"),
                ..Default::default()
            }),
            pv_saved: memory.pv_saved,
            intent_released: memory.intent_released,
            // Backoff is timing: a held attempt only delays what the model
            // lets happen in any order anyway.
            held: None,
        },
        pv: match pv {
            Some(_) => CachedPv::BoundTo(format!("u{i}")),
            None => CachedPv::Unknown,
        },
    });
    match decision {
        Decision::Create(..) => Some(Act::Create),
        Decision::Abandon(_) => Some(Act::Abandon),
        Decision::ReleaseIntent => Some(Act::ReleaseIntent),
        Decision::Forget
        | Decision::Wait(_)
        | Decision::Requeue(_)
        | Decision::Refuse(_)
        | Decision::Race(..)
        | Decision::ReleaseCloneSource => None,
    }
}

/// The product's answer to "does this claim, read again mid-attempt, still
/// need a volume from us?".
pub fn still_needs(i: usize, claim: &Claim, policy: bool) -> bool {
    let obj = pvc(i, claim, policy);
    still_creates(ClaimView(&obj), &CLASS_OBJ, DRIVER, &Placement::Central)
}

/// Whether the claim cache keeps the claim at all (a bound claim without our
/// finalizers is left out of it).
pub fn kept_in_cache(i: usize, claim: &Claim, policy: bool) -> bool {
    cached(&slim::Claim(pvc(i, claim, policy)))
}
