//! The pure decisions of the claim path: what a claim needs from us, and
//! whether its StorageClass lets us go ahead. Table-tested below; the
//! sequences in `create` and `abandon` only carry them out.

use k8s_openapi::api::storage::v1::StorageClass;

use crate::controller::memory::Attempt;
use crate::keys;
use crate::kube::slim::Claim;
use crate::provision::ClaimView;

/// What a claim needs from us right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Not ours, or nothing left to do: nothing to remember about it either.
    Nothing,
    /// Ours, without a volume: provision it.
    Provision,
    /// Deleted while we held the intent: make sure no backend volume is left.
    Abandon,
    /// Bound, and our intent is still on it: the intent has done its job.
    ReleaseIntent,
    /// Deleted, and protected as the source of clones: the protection goes
    /// once no clone of it is pending (any driver's claim, as upstream).
    ReleaseCloneSource,
}

pub fn work_for(claim: ClaimView, driver: &str) -> Work {
    if claim.is_deleting()
        && claim.has_finalizer(keys::FINALIZER_CLONE_SOURCE)
        && !(claim.asks(driver) && claim.holds_intent())
    {
        return Work::ReleaseCloneSource;
    }
    if !claim.asks(driver) {
        return Work::Nothing;
    }
    match (claim.is_deleting(), claim.is_bound(), claim.holds_intent()) {
        (true, _, true) => Work::Abandon,
        (true, _, false) => Work::Nothing,
        (false, false, _) => Work::Provision,
        (false, true, true) => Work::ReleaseIntent,
        (false, true, false) => Work::Nothing,
    }
}

/// What an attempt at `work` is decided on: a failed attempt is not made
/// again before its backoff unless one of these changed (the node the
/// scheduler chose, the class — re-created classes count as new).
pub fn attempt(claim: ClaimView, work: Work, class_uid: Option<&str>) -> Attempt {
    Attempt::of((work, claim.selected_node(), claim.class(), class_uid))
}

/// Whether a claim that needs a volume may get one from us now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The class belongs to another provisioner: not ours to act on.
    OtherProvisioner,
    /// WaitForFirstConsumer and the scheduler has not chosen a node yet.
    WaitingForNode,
    Go,
}

pub fn gate(claim: ClaimView, class: &StorageClass, driver: &str) -> Gate {
    if class.provisioner != driver && !crate::provision::migration::is_migrated_class(class, driver)
    {
        Gate::OtherProvisioner
    } else if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && claim.selected_node().is_none()
    {
        Gate::WaitingForNode
    } else {
        Gate::Go
    }
}

/// Trims a claim before it is cached. A claim bound to a PV and without our
/// intent has nothing left for any sidecar to do ([`work_for`] is `Nothing`
/// for it whatever its other fields say, deleted or not, and a bound claim
/// never becomes unbound), so only its identity, finalizers, deletion mark and
/// volume name are kept (of the bound claims, only [`cached`] ones stay: a
/// protected clone source). Claims still to be provisioned are cached whole.
pub fn trim(Claim(claim): &mut Claim) {
    let view = ClaimView(claim);
    if !view.is_bound() || view.has_finalizer(keys::FINALIZER_PVC_INTENT) {
        return;
    }
    claim.metadata.annotations = None;
    claim.metadata.labels = None;
    claim.metadata.owner_references = None;
    claim.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
        volume_name: claim.spec.as_mut().and_then(|s| s.volume_name.take()),
        ..Default::default()
    });
    claim.status = None;
}

/// Whether a claim is kept in the cache at all. A bound claim that carries
/// none of our finalizers (the intent, the cloning protection) has no work
/// for us now ([`work_for`] is `Nothing`) and none later that would not come
/// with a watch event of its own (a new finalizer, a deletion of a protected
/// source): it is left out, which in a cluster of bound claims is nearly the
/// whole cache. Its watch events reach the cache as deletions, so a copy
/// cached while it still had work goes too.
pub fn cached(Claim(claim): &Claim) -> bool {
    let view = ClaimView(claim);
    !view.is_bound() || view.holds_intent() || view.has_finalizer(keys::FINALIZER_CLONE_SOURCE)
}

/// Builder fixtures for claims and classes, for the tables here and the
/// sequence tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    pub const DRIVER: &str = "d";

    pub struct ClaimFixture(pub PersistentVolumeClaim);

    impl ClaimFixture {
        /// A claim of ours, waiting for a volume.
        pub fn ours() -> ClaimFixture {
            let mut c = crate::provision::fixtures::claim();
            c.metadata
                .annotations
                .get_or_insert_default()
                .insert(keys::ANN_STORAGE_PROVISIONER.into(), DRIVER.into());
            ClaimFixture(c)
        }
        pub fn of(mut self, driver: &str) -> Self {
            let ann = self.0.metadata.annotations.get_or_insert_default();
            ann.remove(keys::ANN_STORAGE_PROVISIONER);
            if !driver.is_empty() {
                ann.insert(keys::ANN_STORAGE_PROVISIONER.into(), driver.into());
            }
            self
        }
        pub fn beta(mut self) -> Self {
            let ann = self.0.metadata.annotations.get_or_insert_default();
            let who = ann
                .remove(keys::ANN_STORAGE_PROVISIONER)
                .unwrap_or_default();
            ann.insert(keys::ANN_BETA_STORAGE_PROVISIONER.into(), who);
            self
        }
        pub fn bound(mut self) -> Self {
            self.0.spec.get_or_insert_default().volume_name = Some("pv".into());
            self
        }
        pub fn intent(mut self) -> Self {
            self.0
                .metadata
                .finalizers
                .get_or_insert_default()
                .push(keys::FINALIZER_PVC_INTENT.into());
            self
        }
        pub fn clone_source(mut self) -> Self {
            self.0
                .metadata
                .finalizers
                .get_or_insert_default()
                .push(keys::FINALIZER_CLONE_SOURCE.into());
            self
        }
        pub fn deleting(mut self) -> Self {
            self.0.metadata.deletion_timestamp =
                Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            self
        }
        pub fn on_node(mut self, node: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(keys::ANN_SELECTED_NODE.into(), node.into());
            self
        }
    }

    pub fn class(provisioner: &str, mode: &str) -> StorageClass {
        StorageClass {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("fast".into()),
                uid: Some("class-uid".into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: Some(mode.into()),
            reclaim_policy: Some("Delete".into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{ClaimFixture as C, DRIVER, class};
    use super::*;

    #[test]
    fn decides_the_work_from_the_claim() {
        use Work::*;
        let cases = [
            (C::ours(), Provision, "ours, no volume"),
            (C::ours().beta(), Provision, "the beta annotation names us"),
            (C::ours().of("x"), Nothing, "another driver's"),
            (C::ours().of(""), Nothing, "no provisioner yet"),
            (C::ours().bound(), Nothing, "bound, done"),
            (
                C::ours().bound().intent(),
                ReleaseIntent,
                "bound with our intent",
            ),
            (
                C::ours().intent(),
                Provision,
                "intent, no volume yet: go on",
            ),
            (C::ours().intent().deleting(), Abandon, "deleted mid-flight"),
            (C::ours().deleting(), Nothing, "deleted before we began"),
            (
                C::ours().bound().clone_source(),
                Nothing,
                "a clone source in use stays protected",
            ),
            (
                C::ours().bound().clone_source().deleting(),
                ReleaseCloneSource,
                "a deleted clone source",
            ),
            (
                C::ours().of("x").bound().clone_source().deleting(),
                ReleaseCloneSource,
                "another driver's deleted clone source, as upstream",
            ),
            (
                C::ours().intent().clone_source().deleting(),
                Abandon,
                "our cleanup first, then the protection",
            ),
            (
                C::ours().bound().intent().deleting(),
                Abandon,
                "deleted, PV maybe saved",
            ),
            // Another driver's claims are never ours to touch, intent or not.
            (
                C::ours().of("x").intent(),
                Nothing,
                "another's, with an intent",
            ),
            (
                C::ours().of("x").bound().intent(),
                Nothing,
                "another's, bound",
            ),
            (
                C::ours().of("x").intent().deleting(),
                Nothing,
                "another's, deleted",
            ),
            (
                C::ours().of("").intent().deleting(),
                Nothing,
                "nobody's, deleted",
            ),
        ];
        for (c, want, what) in cases {
            assert_eq!(work_for(ClaimView(&c.0), DRIVER), want, "{what}");
            // A claim left out of the cache is never reconciled: it has no work.
            if !cached(&Claim(c.0.clone())) {
                assert_eq!(want, Nothing, "left out of the cache: {what}");
            }
            // The cache holds trimmed claims: trimming never changes the work.
            let mut trimmed = Claim(c.0.clone());
            trim(&mut trimmed);
            assert_eq!(
                work_for(ClaimView(&trimmed.0), DRIVER),
                want,
                "trimmed: {what}"
            );
        }
    }

    #[test]
    fn the_class_decides_whether_to_go() {
        let cases = [
            (C::ours(), class(DRIVER, "Immediate"), Gate::Go),
            (C::ours(), class("x", "Immediate"), Gate::OtherProvisioner),
            (
                C::ours(),
                class(DRIVER, "WaitForFirstConsumer"),
                Gate::WaitingForNode,
            ),
            (
                C::ours().on_node("n1"),
                class(DRIVER, "WaitForFirstConsumer"),
                Gate::Go,
            ),
            (
                C::ours().on_node(""),
                class(DRIVER, "WaitForFirstConsumer"),
                Gate::WaitingForNode,
            ),
        ];
        for (c, class, want) in cases {
            assert_eq!(
                gate(ClaimView(&c.0), &class, DRIVER),
                want,
                "{:?}",
                c.0.metadata.annotations
            );
        }
    }

    #[test]
    fn leaves_out_only_bound_claims_without_our_finalizers() {
        let cases = [
            (C::ours(), true, "waiting for a volume"),
            (C::ours().intent(), true, "provisioning"),
            (
                C::ours().bound().intent(),
                true,
                "bound, the intent still on",
            ),
            (
                C::ours().bound().clone_source(),
                true,
                "bound, a clone source",
            ),
            (
                C::ours().bound().clone_source().deleting(),
                true,
                "a deleted clone source",
            ),
            (
                C::ours().of("x"),
                true,
                "another driver's, pending (a clone may wait for ours)",
            ),
            (C::ours().bound(), false, "bound, done"),
            (C::ours().bound().deleting(), false, "bound, done, deleted"),
            (C::ours().of("x").bound(), false, "another driver's, bound"),
        ];
        for (c, want, what) in cases {
            assert_eq!(cached(&Claim(c.0)), want, "{what}");
        }
    }

    #[test]
    fn trims_only_bound_claims_without_the_intent() {
        let mut done = Claim(C::ours().bound().0);
        done.0
            .metadata
            .finalizers
            .get_or_insert_default()
            .push("kubernetes.io/pvc-protection".into());
        trim(&mut done);
        let Claim(done) = done;
        assert_eq!(done.metadata.annotations, None);
        assert_eq!(done.metadata.name.as_deref(), Some("data"));
        assert!(done.metadata.uid.is_some());
        assert_eq!(done.metadata.finalizers.as_ref().unwrap().len(), 1);
        assert_eq!(done.spec.unwrap().volume_name.as_deref(), Some("pv"));

        for c in [C::ours().0, C::ours().bound().intent().0] {
            let mut trimmed = Claim(c.clone());
            trim(&mut trimmed);
            assert_eq!(trimmed.0, c, "kept whole");
        }
    }
}
