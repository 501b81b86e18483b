//! The one decision of the volume path, pure: from the PV as cached, what
//! this process remembers about it and where this replica runs, what to do
//! now — forget it, wait, retry later, hold it with our finalizer, let it go,
//! or delete its volume. Table-tested below; `delete.rs` and `mod.rs` only
//! carry a decision out. upstream: lib controller.go `shouldDelete`.

use std::time::Duration;

use kube::ResourceExt;

use crate::controller::memory::{Attempt, still_held};
use crate::controller::node::Placement;
use crate::keys;
use crate::kube::has_finalizer;
use crate::kube::slim::Pv;
use crate::names::{PvPhase, ReclaimPolicy};
use crate::provision::migration;

/// What a PV needs from us, by its own fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    Nothing,
    /// Bound with policy Delete and no finalizer: hold it (also adopts
    /// statically provisioned PVs of our driver, as upstream does).
    AddFinalizer,
    /// Policy is no longer Delete: let the PV go, keep the volume.
    RemoveFinalizer,
    /// Released with policy Delete: delete the backend volume and the PV.
    Delete,
}

/// Whether the PV is our driver's: provisioned by it (or by the in-tree
/// plugin migrated to it), or a static PV naming it.
pub fn is_ours(pv: &Pv, driver: &str) -> bool {
    match pv.annotation(keys::ANN_PROVISIONED_BY) {
        Some(by) => {
            by == driver
                || pv.annotation(keys::ANN_MIGRATED_TO) == Some(driver)
                || migration::in_tree_plugin(driver) == Some(by)
        }
        None => pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == driver),
    }
}

pub fn work_for(pv: &Pv, driver: &str) -> Work {
    if !is_ours(pv, driver) {
        return Work::Nothing;
    }
    let held = has_finalizer(pv, keys::FINALIZER_PV);
    let deleting = pv.metadata.deletion_timestamp.is_some();
    // No policy at all is taken as Delete (the API server always sets one).
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .map_or(Some(ReclaimPolicy::Delete), ReclaimPolicy::parse);
    let phase = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .and_then(PvPhase::parse);
    if policy != Some(ReclaimPolicy::Delete) {
        return if held {
            Work::RemoveFinalizer
        } else {
            Work::Nothing
        };
    }
    match phase {
        // Being deleted without our finalizer: someone else's decision, as upstream.
        _ if deleting && !held => Work::Nothing,
        Some(PvPhase::Released) => Work::Delete,
        Some(PvPhase::Bound) if !held && !deleting => Work::AddFinalizer,
        _ => Work::Nothing,
    }
}

/// What this process remembers about a PV, as far as a decision needs it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Recall {
    /// This process finished the PV's deletion.
    pub deleted: bool,
    /// The attempt that failed last, and how long it is still held back.
    pub held: Option<(Attempt, Duration)>,
}

/// Everything one decision is made from.
pub struct Facts<'a> {
    pub pv: &'a Pv,
    pub driver: &'a str,
    pub place: &'a Placement,
    pub recall: Recall,
}

/// What to do with a PV now.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not ours, or done: nothing to remember about it.
    Forget,
    /// Nothing to do until the PV changes; why, for the log.
    Wait(&'static str),
    /// The same attempt failed a moment ago: try again after this.
    Requeue(Duration),
    AddFinalizer,
    RemoveFinalizer,
    Delete,
}

/// The decision, and the attempt it is (to hold back if it fails).
pub fn decide(f: &Facts) -> (Decision, Attempt) {
    let work = work_for(f.pv, f.driver);
    let attempt = Attempt::of(work);
    let decision = match work {
        Work::Nothing if !has_finalizer(f.pv, keys::FINALIZER_PV) => Decision::Forget,
        // The same work failed a moment ago: the updates its own DELETE caused
        // (the PV Terminating, the PV protection dropped) trigger reconciles.
        _ if let Some(wait) = still_held(f.recall.held, attempt) => Decision::Requeue(wait),
        Work::Nothing => Decision::Wait("held by our finalizer, nothing to do now"),
        Work::AddFinalizer => Decision::AddFinalizer,
        Work::RemoveFinalizer => Decision::RemoveFinalizer,
        Work::Delete if f.recall.deleted => Decision::Wait("deleted by this process"),
        // One sidecar per node: a PV made on another node is that node's to delete.
        Work::Delete if !f.place.may_delete(node_affinity(f.pv)) => {
            Decision::Wait("not provisioned on this node")
        }
        Work::Delete => Decision::Delete,
    };
    (decision, attempt)
}

fn node_affinity(pv: &Pv) -> Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity> {
    pv.spec.as_ref().and_then(|s| s.node_affinity.as_deref())
}

/// Whether `fresh`, the PV as the API server has it, is still the PV decided
/// on (`cached`, by UID) and still to be deleted: the decision taken again on
/// the authoritative copy before `DeleteVolume` (DESIGN §2.2).
pub fn still_to_delete(fresh: &Pv, cached: &Pv, driver: &str) -> bool {
    fresh.uid() == cached.uid() && work_for(fresh, driver) == Work::Delete
}

#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::Work;

    use crate::keys;
    use crate::kube::slim::{Pv, PvCsi, PvSpec, PvStatus};

    /// The test driver's name, the bench's (`controller::scripted`).
    pub use crate::controller::scripted::DRIVER;

    /// The decision table of upstream's `shouldDelete`, and ours beside it:
    /// each PV with the work decided for it (the decision's own rows, and the
    /// volume path's queue filter's, `volume::queues`).
    pub fn should_delete_table() -> Vec<(PvFixture, Work, &'static str)> {
        use Work::*;
        vec![
            (
                PvFixture::ours().phase("Released").held(),
                Delete,
                "released, delete policy",
            ),
            (
                PvFixture::ours().phase("Released"),
                Delete,
                "released without finalizer (older PV)",
            ),
            (
                PvFixture::ours().phase("Released").held().deleting(),
                Delete,
                "released and being deleted",
            ),
            (
                PvFixture::ours().phase("Released").deleting(),
                Nothing,
                "deleting without our finalizer",
            ),
            (
                PvFixture::ours().phase("Bound").held(),
                Nothing,
                "bound: never delete",
            ),
            (
                PvFixture::ours().phase("Bound").held().deleting(),
                Nothing,
                "bound while PV deleted: wait for release",
            ),
            (
                PvFixture::ours().phase("Bound"),
                AddFinalizer,
                "bound without finalizer: hold it",
            ),
            (
                PvFixture::static_of(DRIVER).phase("Bound"),
                AddFinalizer,
                "adopts static PVs of our driver",
            ),
            (
                PvFixture::static_of("other").phase("Released"),
                Nothing,
                "static PV of another driver",
            ),
            (
                PvFixture::ours().by("other").phase("Released"),
                Nothing,
                "provisioned by another",
            ),
            (
                PvFixture::ours().phase("Released").held().policy("Retain"),
                RemoveFinalizer,
                "switched to Retain",
            ),
            (
                PvFixture::ours().phase("Released").policy("Retain"),
                Nothing,
                "retain, no finalizer",
            ),
            (
                PvFixture::ours().phase("Released").held().no_policy(),
                Delete,
                "no policy: as Delete",
            ),
            (
                PvFixture::ours().phase("Released").held().policy("delete"),
                RemoveFinalizer,
                "a policy spelled otherwise is not Delete",
            ),
            (
                PvFixture::ours().phase("released").held(),
                Nothing,
                "a phase spelled otherwise is not Released",
            ),
            (
                PvFixture::ours().phase("Available").held(),
                Nothing,
                "available",
            ),
            (
                PvFixture::ours().phase("Pending").held(),
                Nothing,
                "pending",
            ),
        ]
    }

    /// A PV of ours by default: provisioned by `d`, policy Delete, handle `h`.
    #[derive(Clone)]
    pub struct PvFixture(pub Pv);

    impl PvFixture {
        pub fn ours() -> PvFixture {
            let mut pv = Pv::default();
            pv.metadata.name = Some("pvc-1".into());
            pv.metadata.uid = Some("pv-uid".into());
            pv.metadata.resource_version = Some("5".into());
            pv.metadata.annotations =
                Some([(keys::ANN_PROVISIONED_BY.to_string(), DRIVER.to_string())].into());
            pv.spec = Some(PvSpec {
                persistent_volume_reclaim_policy: Some("Delete".into()),
                csi: Some(PvCsi {
                    driver: DRIVER.into(),
                    volume_handle: "h".into(),
                }),
                ..Default::default()
            });
            PvFixture(pv)
        }
        pub fn static_of(driver: &str) -> PvFixture {
            let mut pv = PvFixture::ours();
            pv.0.metadata.annotations = None;
            pv.0.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = driver.into();
            pv
        }
        pub fn phase(mut self, p: &str) -> PvFixture {
            self.0.status = Some(PvStatus {
                phase: Some(p.into()),
            });
            self
        }
        pub fn policy(mut self, p: &str) -> PvFixture {
            self.0
                .spec
                .as_mut()
                .unwrap()
                .persistent_volume_reclaim_policy = Some(p.into());
            self
        }
        pub fn no_policy(mut self) -> PvFixture {
            self.0
                .spec
                .as_mut()
                .unwrap()
                .persistent_volume_reclaim_policy = None;
            self
        }
        pub fn held(mut self) -> PvFixture {
            self.0.metadata.finalizers = Some(vec![keys::FINALIZER_PV.into()]);
            self
        }
        pub fn deleting(mut self) -> PvFixture {
            self.0.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            self
        }
        pub fn by(mut self, who: &str) -> PvFixture {
            self.0.metadata.annotations =
                Some([(keys::ANN_PROVISIONED_BY.to_string(), who.to_string())].into());
            self
        }
        pub fn version(mut self, rv: &str) -> PvFixture {
            self.0.metadata.resource_version = Some(rv.into());
            self
        }
        pub fn uid(mut self, uid: &str) -> PvFixture {
            self.0.metadata.uid = Some(uid.into());
            self
        }
        pub fn handle(mut self, h: &str) -> PvFixture {
            self.0
                .spec
                .as_mut()
                .unwrap()
                .csi
                .as_mut()
                .unwrap()
                .volume_handle = h.into();
            self
        }
        pub fn annotate(mut self, key: &str, value: &str) -> PvFixture {
            self.0
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(key.into(), value.into());
            self
        }
        pub fn no_csi(mut self) -> PvFixture {
            self.0.spec.as_mut().unwrap().csi = None;
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{DRIVER, PvFixture, should_delete_table};
    use super::*;
    use crate::controller::node::NodeMode;

    #[test]
    fn decides_like_upstream_should_delete() {
        for (pv, want, what) in should_delete_table() {
            assert_eq!(work_for(&pv.0, DRIVER), want, "{what}");
            // The same decision on the PV as the cache keeps it.
            let mut cached = pv.0.clone();
            cached.trim();
            assert_eq!(work_for(&cached, DRIVER), want, "{what} (cached)");
        }
    }

    fn node(name: &str, zone: &str) -> Placement {
        Placement::Node(NodeMode {
            name: name.into(),
            topology: Some([("zone".to_string(), zone.to_string())].into()),
            immediate_binding: true,
            max_delay: Duration::from_secs(2),
            base_delay: Duration::from_secs(1),
        })
    }

    fn in_zone(pv: PvFixture, zone: &str) -> PvFixture {
        use k8s_openapi::api::core::v1::{
            NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
        };
        let mut pv = pv;
        pv.0.spec.as_mut().unwrap().node_affinity = Some(Box::new(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: Some(vec![zone.into()]),
                    }]),
                    ..Default::default()
                }],
            }),
        }));
        pv
    }

    /// Each decision, from the PV, the memory and the placement.
    #[test]
    fn every_decision() {
        let failed = Attempt::of(Work::Delete);
        let other = Attempt::of(Work::AddFinalizer);
        let held = |a| Recall {
            held: Some((a, Duration::from_secs(3))),
            ..Default::default()
        };
        let deleted = Recall {
            deleted: true,
            ..Default::default()
        };
        let released = || PvFixture::ours().phase("Released").held();
        // The placement: None = central, Some(zone) = a node in that zone.
        let rows: Vec<(PvFixture, Recall, Option<&str>, Decision, &str)> = vec![
            (
                PvFixture::static_of("other").phase("Released"),
                Recall::default(),
                None,
                Decision::Forget,
                "not ours",
            ),
            (
                PvFixture::ours().phase("Bound").held(),
                Recall::default(),
                None,
                Decision::Wait("held by our finalizer, nothing to do now"),
                "bound and held",
            ),
            (
                PvFixture::ours().phase("Bound"),
                Recall::default(),
                None,
                Decision::AddFinalizer,
                "bound, not held",
            ),
            (
                released().policy("Retain"),
                Recall::default(),
                None,
                Decision::RemoveFinalizer,
                "retained",
            ),
            (
                released(),
                Recall::default(),
                None,
                Decision::Delete,
                "released",
            ),
            (
                released(),
                held(failed),
                None,
                Decision::Requeue(Duration::from_secs(3)),
                "the same deletion failed a moment ago",
            ),
            (
                released(),
                held(other),
                None,
                Decision::Delete,
                "another attempt failed: this one goes",
            ),
            (
                released(),
                deleted,
                None,
                Decision::Wait("deleted by this process"),
                "a stale copy of a PV this process deleted",
            ),
            (
                in_zone(released(), "b"),
                Recall::default(),
                Some("a"),
                Decision::Wait("not provisioned on this node"),
                "another node's PV",
            ),
            (
                in_zone(released(), "a"),
                Recall::default(),
                Some("a"),
                Decision::Delete,
                "this node's PV",
            ),
            (
                PvFixture::ours().phase("Released").deleting(),
                held(failed),
                None,
                Decision::Forget,
                "someone else's deletion: forgotten even while held",
            ),
        ];
        for (pv, recall, zone, want, what) in rows {
            let place = zone.map_or(Placement::Central, |z| node("n1", z));
            let facts = Facts {
                pv: &pv.0,
                driver: DRIVER,
                place: &place,
                recall,
            };
            assert_eq!(decide(&facts).0, want, "{what}");
        }
    }

    #[test]
    fn the_fresh_copy_is_decided_again() {
        let cached = PvFixture::ours().phase("Released").held();
        let rows = [
            (
                PvFixture::ours().phase("Released").held().version("9"),
                true,
                "changed, still released",
            ),
            (
                PvFixture::ours().phase("Released").held().deleting(),
                true,
                "already Terminating: still ours to finish",
            ),
            (
                PvFixture::ours().phase("Released").held().uid("other"),
                false,
                "another PV under the name",
            ),
            (
                PvFixture::ours().phase("Released").held().policy("Retain"),
                false,
                "retained since",
            ),
            (
                PvFixture::ours().phase("Bound").held(),
                false,
                "bound again (pre-bound by an admin)",
            ),
        ];
        for (fresh, want, what) in rows {
            assert_eq!(still_to_delete(&fresh.0, &cached.0, DRIVER), want, "{what}");
        }
    }

    #[test]
    fn a_pv_of_ours_without_a_handle_is_still_decided_for_deletion() {
        // Whether its volume can be named is the act's to find out (a
        // `VolumeFailedDelete` and nothing touched), as upstream's.
        let pv = PvFixture::ours().no_csi().phase("Released").held();
        assert_eq!(work_for(&pv.0, DRIVER), Work::Delete);
        let unnamed = PvFixture::static_of(DRIVER)
            .no_csi()
            .phase("Released")
            .held();
        assert_eq!(
            work_for(&unnamed.0, DRIVER),
            Work::Nothing,
            "no annotation, no CSI source: not ours"
        );
    }
}
