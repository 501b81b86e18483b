//! What the scale profile's cluster holds, object by object: which namespace and class each
//! bound pair goes to, and the claims and PVs as a provisioner and the binder leave them.
//! Pure, so the shape of the cluster is tested without one.

use serde_json::{Value, json};

/// Namespaces the pairs are spread over (`scale-0` … `scale-9`).
pub const NAMESPACES: usize = 10;
/// The driver of the third class: another CSI driver of the same cluster, which no
/// contender serves (its claims and PVs are in every contender's caches all the same).
pub const OTHER_DRIVER: &str = "other.bench.csi";
/// One pending claim of the other driver per this many pairs (see [`pending_claim`]).
pub const PENDING_EVERY: usize = 200;
/// The label every object of the fill carries (`pair` or `pending`), to count them.
pub const FILL_LABEL: &str = "bench-scale";
/// Each claim's size.
pub const SIZE: &str = "1Gi";

const PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
const INTENT: &str = "csi-provisioner.rs/provisioning-intent";
const INTENT_LABEL: &str = "csi-provisioner.rs/provisioning";
const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The three classes, in the order pairs are dealt to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The benchmark's driver, reclaim `Delete`: what dynamic provisioning makes by default.
    Fast,
    /// The benchmark's driver, reclaim `Retain`.
    Kept,
    /// [`OTHER_DRIVER`], reclaim `Delete`.
    Other,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Fast, Class::Kept, Class::Other];

    pub fn name(self) -> &'static str {
        match self {
            Class::Fast => "scale-fast",
            Class::Kept => "scale-kept",
            Class::Other => "scale-other",
        }
    }

    /// Whether the benchmark's driver holds this class's volumes.
    pub fn ours(self) -> bool {
        self != Class::Other
    }

    fn reclaim(self) -> &'static str {
        match self {
            Class::Kept => "Retain",
            _ => "Delete",
        }
    }

    pub fn driver(self, ours: &str) -> String {
        if self.ours() {
            ours.to_string()
        } else {
            OTHER_DRIVER.to_string()
        }
    }

    /// The StorageClass.
    pub fn object(self, ours: &str) -> Value {
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": self.name()},
            "provisioner": self.driver(ours),
            "reclaimPolicy": self.reclaim(),
            "volumeBindingMode": "Immediate",
        })
    }
}

/// Where pair `index` goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub index: usize,
    pub namespace: String,
    pub claim: String,
    pub class: Class,
}

pub fn namespace(k: usize) -> String {
    format!("scale-{k}")
}

/// Pair `index`: namespaces in turn, classes in turn (so every namespace holds every class).
pub fn pair(index: usize) -> Pair {
    Pair {
        index,
        namespace: namespace(index % NAMESPACES),
        claim: format!("data-{index:06}"),
        class: Class::ALL[(index / NAMESPACES) % Class::ALL.len()],
    }
}

/// The pairs whose index also brings a pending claim of the other driver.
pub fn brings_pending(index: usize) -> bool {
    (index + 1).is_multiple_of(PENDING_EVERY)
}

/// How many pending claims a cluster of `pairs` pairs holds.
pub fn pending_count(pairs: usize) -> usize {
    pairs / PENDING_EVERY
}

/// The PV's name, shaped (and as long) as a provisioner's `pvc-<claim uid>`. The claim is
/// created naming its volume, so the name cannot wait for the claim's UID.
pub fn pv_name(index: usize) -> String {
    format!("pvc-5ca1e000-0000-4000-8000-{index:012}")
}

/// The claim of a pair as created: handed to its driver and naming its PV. Created without
/// `bind-completed`, the binder only waits (claim `Pending`) while its PV does not exist
/// yet; with it, it would call the claim `Lost`. [`bind_marks`] and [`claim_status`] then
/// make it what the binder leaves.
pub fn bound_claim(p: &Pair, ours: &str) -> Value {
    let driver = p.class.driver(ours);
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": p.claim, "namespace": p.namespace,
            "labels": {FILL_LABEL: "pair"},
            "annotations": {PROVISIONER: driver, PROVISIONER_BETA: driver},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": p.class.name(),
            "resources": {"requests": {"storage": SIZE}},
            "volumeName": pv_name(p.index),
        },
    })
}

/// The annotations the binder puts on a claim it bound (a merge patch).
pub fn bind_marks() -> Value {
    json!({"metadata": {"annotations": {
        "pv.kubernetes.io/bind-completed": "yes",
        "pv.kubernetes.io/bound-by-controller": "yes",
    }}})
}

/// The PV of a pair, as a provisioner saves it: its `claimRef` naming the claim and its
/// UID, the provisioner's annotation and (reclaim `Delete`) finalizer, the driver's volume.
pub fn pv(p: &Pair, ours: &str, claim_uid: &str, volume_handle: &str) -> Value {
    let driver = p.class.driver(ours);
    let finalizers: Vec<&str> = if p.class.reclaim() == "Delete" {
        vec![PV_FINALIZER]
    } else {
        Vec::new()
    };
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name(p.index),
            "labels": {FILL_LABEL: "pair"},
            "annotations": {"pv.kubernetes.io/provisioned-by": driver},
            "finalizers": finalizers,
        },
        "spec": {
            "capacity": {"storage": SIZE},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": p.class.reclaim(),
            "storageClassName": p.class.name(),
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": p.namespace, "name": p.claim, "uid": claim_uid,
            },
            "csi": {"driver": driver, "volumeHandle": volume_handle, "fsType": "ext4"},
        },
    })
}

/// The status the binder writes on a bound claim (a merge patch of `status`).
pub fn claim_status() -> Value {
    json!({"status": {
        "phase": "Bound",
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": SIZE},
    }})
}

/// The status the binder writes on a bound PV.
pub fn pv_status() -> Value {
    json!({"status": {"phase": "Bound"}})
}

/// A claim of the other driver waiting for its volume, as a policy-mode cluster shows one
/// whose sidecar is slow or down: handed to that driver, holding the provisioning intent
/// (finalizer) and the label the provisioning-intent policy puts on with it. It stays
/// pending: nothing serves that driver.
pub fn pending_claim(index: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("waiting-{index:06}"),
            "namespace": namespace(index % NAMESPACES),
            "labels": {FILL_LABEL: "pending", INTENT_LABEL: OTHER_DRIVER},
            "annotations": {PROVISIONER: OTHER_DRIVER, PROVISIONER_BETA: OTHER_DRIVER},
            "finalizers": [INTENT],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": Class::Other.name(),
            "resources": {"requests": {"storage": SIZE}},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_dealt_over_every_namespace_and_class() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..NAMESPACES * Class::ALL.len() {
            let p = pair(i);
            seen.insert((p.namespace.clone(), p.class.name()));
        }
        assert_eq!(seen.len(), NAMESPACES * Class::ALL.len(), "{seen:?}");
        assert_eq!(pair(0).namespace, "scale-0");
        assert_eq!(pair(12).namespace, "scale-2");
        assert_eq!(pair(12).class, Class::Kept);
        assert_eq!(pair(12).claim, "data-000012");
        // Two thirds of the pairs are the benchmark driver's.
        let ours = (0..3000).filter(|&i| pair(i).class.ours()).count();
        assert_eq!(ours, 2000);
    }

    #[test]
    fn one_pending_claim_per_two_hundred_pairs() {
        assert_eq!(pending_count(1_000), 5);
        assert_eq!(pending_count(50_000), 250);
        assert_eq!((0..1_000).filter(|&i| brings_pending(i)).count(), 5);
        // Growing the cluster in steps brings as many as filling it at once.
        let stepwise = (0..1_000).filter(|&i| brings_pending(i)).count()
            + (1_000..10_000).filter(|&i| brings_pending(i)).count();
        assert_eq!(stepwise, pending_count(10_000));
    }

    #[test]
    fn the_pv_points_at_its_claim_as_a_provisioner_saves_it() {
        let p = pair(7);
        let pv = pv(&p, "d.csi", "1234", "vol-1");
        assert_eq!(
            pv["metadata"]["name"],
            "pvc-5ca1e000-0000-4000-8000-000000000007"
        );
        assert_eq!(
            pv_name(7).len(),
            "pvc-".len() + "0b3c7f5e-9a2d-4c1b-8e6f-123456789abc".len(),
            "as long as a provisioner's name"
        );
        assert_eq!(
            bound_claim(&p, "d.csi")["spec"]["volumeName"],
            pv["metadata"]["name"]
        );
        assert_eq!(pv["spec"]["claimRef"]["uid"], "1234");
        assert_eq!(pv["spec"]["claimRef"]["namespace"], p.namespace.as_str());
        assert_eq!(pv["spec"]["csi"]["driver"], "d.csi");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(pv["metadata"]["finalizers"][0], PV_FINALIZER);
        let kept = pair(NAMESPACES);
        assert_eq!(kept.class, Class::Kept);
        let pv = super::pv(&kept, "d.csi", "1", "v");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(pv["metadata"]["finalizers"], json!([]));
        let other = pair(2 * NAMESPACES);
        assert_eq!(
            super::pv(&other, "d.csi", "1", "v")["spec"]["csi"]["driver"],
            OTHER_DRIVER
        );
    }

    #[test]
    fn claims_carry_the_marks_of_their_state() {
        let c = bound_claim(&pair(0), "d.csi");
        assert_eq!(c["metadata"]["annotations"][PROVISIONER], "d.csi");
        // Not at creation: the binder would call the claim Lost until its PV exists.
        assert!(
            c["metadata"]["annotations"]
                .get("pv.kubernetes.io/bind-completed")
                .is_none()
        );
        assert_eq!(
            bind_marks()["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"],
            "yes"
        );
        // A bound claim keeps no intent: the release policy (or the sidecar) took it off.
        assert!(c["metadata"].get("finalizers").is_none());
        assert!(c["metadata"]["labels"].get(INTENT_LABEL).is_none());
        let w = pending_claim(199);
        assert_eq!(w["metadata"]["finalizers"][0], INTENT);
        assert_eq!(w["metadata"]["labels"][INTENT_LABEL], OTHER_DRIVER);
        assert_eq!(w["spec"]["storageClassName"], "scale-other");
        assert!(w["spec"].get("volumeName").is_none());
        assert_eq!(Class::Kept.object("d.csi")["reclaimPolicy"], "Retain");
        assert_eq!(Class::Other.object("d.csi")["provisioner"], OTHER_DRIVER);
    }
}
