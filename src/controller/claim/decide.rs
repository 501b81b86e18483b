//! The one decision of the claim path, pure: from the claim as cached, its
//! StorageClass, what this process remembers about it and where this replica
//! runs, what to do now — forget it, wait, retry later, race for it, refuse
//! it, create its volume, clean up after it, release its intent or its
//! source's protection. Table-tested below; `create`, `abandon` and the rest
//! only carry a decision out.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::StorageClass;

use super::error::ClaimError;
use crate::controller::memory::{Attempt, still_held};
use crate::controller::node::{NodeGate, NodeMode, Placement};
use crate::csi::pb;
use crate::keys;
use crate::kube::slim::Claim;
use crate::metrics::ClaimGauges;
use crate::names::BindingMode;
use crate::provision::{ClaimView, ProvisionError, ProvisionOptions, migration, volume_name};

/// What a claim needs from us, by its own fields.
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

/// What this process remembers about a claim, as far as a decision and its
/// acts need it: read once per attempt (`ClaimMemory::recall`).
#[derive(Clone, Debug, Default)]
pub struct Recall {
    /// The driver's answer whose PV is not saved yet: a retry saves it
    /// without another `CreateVolume`.
    pub created: Option<pb::Volume>,
    /// This process saved (or found) the claim's PV.
    pub pv_saved: bool,
    /// This process removed the claim's intent.
    pub intent_released: bool,
    /// The attempt that failed last, and how long it is still held back.
    pub held: Option<(Attempt, Duration)>,
}

/// The PV under the claim's deterministic name, as the PV cache shows it.
/// "No PV" is never taken from the cache as an answer: the create finds out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CachedPv {
    /// Not in the cache (or the cache cannot be asked).
    Unknown,
    /// In the cache, bound (or pre-bound) to the claim with this UID (`""`:
    /// none).
    BoundTo(String),
}

/// Everything one decision is made from.
pub struct Facts<'a, 'p> {
    pub claim: ClaimView<'a>,
    pub driver: &'a str,
    pub options: &'a ProvisionOptions,
    /// The claim's StorageClass as the cache has it.
    pub class: Option<Arc<StorageClass>>,
    pub place: &'p Placement,
    pub recall: Recall,
    pub pv: CachedPv,
}

/// What to do with a claim now.
#[derive(Debug)]
pub enum Decision<'a> {
    /// Nothing of ours on it, now or later: forget it.
    Forget,
    /// Nothing to do until the claim (or its class) changes; why, for the log.
    Wait(&'static str),
    /// The same attempt failed a moment ago: try again after this.
    Requeue(Duration),
    /// One sidecar per node, an Immediate claim: race the other nodes for it.
    Race(Arc<StorageClass>, &'a NodeMode),
    /// Not without a change: shown on the claim, retried with backoff.
    Refuse(ClaimError),
    /// Make its volume and PV (the class in our driver's terms).
    Create(Arc<StorageClass>, Answered),
    Abandon(Answered),
    ReleaseIntent,
    ReleaseCloneSource,
}

/// What the acts of a create or a cleanup take from the memory, as recalled
/// with the facts: they do not read the memory again.
#[derive(Clone, Debug, Default)]
pub struct Answered {
    /// The driver's answer whose PV is not saved yet.
    pub created: Option<pb::Volume>,
    /// This process saved (or found) the claim's PV.
    pub pv_saved: bool,
}

fn answered(recall: &Recall) -> Answered {
    Answered {
        created: recall.created.clone(),
        pv_saved: recall.pv_saved,
    }
}

/// The decision, and the attempt it is (to hold back if it fails).
pub fn decide<'p>(f: &Facts<'_, 'p>) -> (Decision<'p>, Attempt) {
    let view = f.claim;
    let work = match work_for(view, f.driver) {
        // Our cleanup is the node's the volume was made on.
        Work::Abandon | Work::ReleaseIntent if !f.place.cleans_up(view) => Work::Nothing,
        work => work,
    };
    let class_uid = f.class.as_ref().and_then(|c| c.metadata.uid.as_deref());
    let attempt = Attempt::of((work, view.selected_node(), view.class(), class_uid));
    let decision = match work {
        Work::Nothing => Decision::Forget,
        Work::ReleaseIntent if f.recall.intent_released => Decision::Wait("its intent is released"),
        _ if let Some(wait) = still_held(f.recall.held, attempt) => Decision::Requeue(wait),
        Work::ReleaseIntent => Decision::ReleaseIntent,
        Work::Abandon => Decision::Abandon(answered(&f.recall)),
        Work::ReleaseCloneSource => Decision::ReleaseCloneSource,
        Work::Provision => without_volume(f),
    };
    (decision, attempt)
}

/// A claim of ours without a volume: its class, its node, its PV decide.
fn without_volume<'p>(f: &Facts<'_, 'p>) -> Decision<'p> {
    let Some(class) = f.class.clone() else {
        return Decision::Refuse(ClaimError::StorageClassNotFound {
            name: f.claim.class().unwrap_or_default().to_string(),
        });
    };
    // A class of the in-tree plugin migrated to our driver, in our driver's
    // terms (upstream: csi-translation-lib); its provisioner stays in-tree.
    let class = if migration::is_migrated_class(&class, f.driver) {
        match migration::translate_class(&class) {
            Ok(c) => Arc::new(c),
            Err(e) => return Decision::Refuse(ProvisionError::Migration(e).into()),
        }
    } else {
        class
    };
    if let Some(why) = class_holds_back(f.claim, &class, f.driver) {
        return Decision::Wait(why);
    }
    match f.place.claim(f.claim, &class) {
        NodeGate::ThisNode => {}
        NodeGate::OtherNode => return Decision::Wait("another node's claim"),
        NodeGate::NotHere => return Decision::Wait("not for this node now"),
        NodeGate::RaceForIt(node) => return Decision::Race(class, node),
    }
    // Saved already: binding is kube-controller-manager's step, and the
    // intent leaves with it (`ReleaseIntent`).
    const SAVED: &str = "its PV exists: waiting for the binder";
    if f.recall.pv_saved {
        return Decision::Wait(SAVED);
    }
    match &f.pv {
        CachedPv::Unknown => Decision::Create(class, answered(&f.recall)),
        CachedPv::BoundTo(uid) if uid == f.claim.uid() => Decision::Wait(SAVED),
        // Our deterministic name is taken: no CreateVolume (it would make a
        // volume no PV can point to). Safe on a stale cache: a retry looks again.
        CachedPv::BoundTo(other) => Decision::Refuse(
            match volume_name(
                &f.options.volume_name_prefix,
                f.claim.uid(),
                f.options.volume_name_uuid_length,
            ) {
                Ok(name) => ClaimError::PvOfAnotherClaim {
                    name,
                    other: other.clone(),
                },
                Err(e) => e.into(),
            },
        ),
    }
}

/// Why the class does not let us provision the claim now, if it does not:
/// it must name our driver (or an in-tree plugin migrated to it), and a
/// WaitForFirstConsumer claim must have a node.
fn class_holds_back(claim: ClaimView, class: &StorageClass, driver: &str) -> Option<&'static str> {
    if class.provisioner != driver && !migration::is_migrated_class(class, driver) {
        Some("a class of another provisioner")
    } else if class
        .volume_binding_mode
        .as_deref()
        .and_then(BindingMode::parse)
        == Some(BindingMode::WaitForFirstConsumer)
        && claim.selected_node().is_none()
    {
        Some("WaitForFirstConsumer: waiting for the scheduler's node")
    } else {
        None
    }
}

/// Whether a claim read again mid-attempt (it changed since the cache saw
/// it) still needs a volume from this replica, with the class decided on.
pub fn still_creates(
    claim: ClaimView,
    class: &StorageClass,
    driver: &str,
    place: &Placement,
) -> bool {
    work_for(claim, driver) == Work::Provision
        && class_holds_back(claim, class, driver).is_none()
        && place.claim(claim, class) == NodeGate::ThisNode
}

/// What the claim cache says now, for the gauges an operator alerts on:
/// the claims of `driver` holding our intent, and those waiting for a
/// volume, with how long ago the oldest of each was created (`now`: seconds
/// since the Unix epoch).
pub fn gauges(claims: &[Arc<Claim>], driver: &str, now: f64) -> ClaimGauges {
    let mut g = ClaimGauges::default();
    for Claim(claim) in claims.iter().map(|c| c.as_ref()) {
        let view = ClaimView(claim);
        if !view.asks(driver) {
            continue;
        }
        let age = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0.0, |t| (now - t.0.as_second() as f64).max(0.0));
        if view.holds_intent() {
            g.holding_intent += 1;
            g.oldest_intent_age = g.oldest_intent_age.max(age);
        }
        if work_for(view, driver) == Work::Provision {
            g.waiting += 1;
            g.oldest_waiting_age = g.oldest_waiting_age.max(age);
        }
    }
    g
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

    /// The test driver's name, the bench's (`controller::scripted`).
    pub use crate::controller::scripted::DRIVER;

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

    /// A name for each decision, for the table.
    fn kind(d: &Decision) -> String {
        match d {
            Decision::Forget => "forget".into(),
            Decision::Wait(_) => "wait".into(),
            Decision::Requeue(_) => "requeue".into(),
            Decision::Race(..) => "race".into(),
            Decision::Refuse(e) => format!("refuse: {}", e.label()),
            Decision::Create(..) => "create".into(),
            Decision::Abandon(_) => "abandon".into(),
            Decision::ReleaseIntent => "release intent".into(),
            Decision::ReleaseCloneSource => "release clone source".into(),
        }
    }

    /// The facts of one row: a claim of ours and our class, centrally, with
    /// nothing remembered and nothing in the PV cache; each row changes one.
    struct Row {
        claim: C,
        class: Option<StorageClass>,
        place: Placement,
        recall: Recall,
        pv: CachedPv,
    }

    impl Row {
        fn of(claim: C) -> Row {
            Row {
                claim,
                class: Some(class(DRIVER, "Immediate")),
                place: Placement::Central,
                recall: Recall::default(),
                pv: CachedPv::Unknown,
            }
        }
        fn class(mut self, class: Option<StorageClass>) -> Row {
            self.class = class;
            self
        }
        fn on(mut self, node: &str, immediate_binding: bool) -> Row {
            self.place = Placement::Node(crate::controller::node::NodeMode {
                name: node.into(),
                topology: None,
                immediate_binding,
                base_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(2),
            });
            self
        }
        fn recall(mut self, recall: Recall) -> Row {
            self.recall = recall;
            self
        }
        fn pv(mut self, pv: CachedPv) -> Row {
            self.pv = pv;
            self
        }
        fn decide(&self) -> (Decision<'_>, Attempt) {
            let options = ProvisionOptions::default();
            decide(&Facts {
                claim: ClaimView(&self.claim.0),
                driver: DRIVER,
                options: &options,
                class: self.class.clone().map(Arc::new),
                place: &self.place,
                recall: self.recall.clone(),
                pv: self.pv.clone(),
            })
        }
    }

    #[test]
    fn decides_what_to_do_now() {
        let wffc = || Some(class(DRIVER, "WaitForFirstConsumer"));
        let uid = C::ours().0.metadata.uid.unwrap();
        // The attempt a plain create is: what a failure of it holds back.
        let create = Row::of(C::ours()).decide().1;
        let held = |attempt| Recall {
            held: Some((attempt, Duration::from_secs(1))),
            ..Default::default()
        };
        let rows = [
            (Row::of(C::ours()), "create", "ours, our class, no PV known"),
            (Row::of(C::ours().of("x")), "forget", "another driver's"),
            (Row::of(C::ours().bound()), "forget", "bound, done"),
            (
                Row::of(C::ours()).class(None),
                "refuse: storage_class_not_found",
                "no class in the cache",
            ),
            (
                Row::of(C::ours()).class(Some(class("x", "Immediate"))),
                "wait",
                "a class of another provisioner",
            ),
            (
                Row::of(C::ours()).class(wffc()),
                "wait",
                "waiting for the scheduler",
            ),
            (
                Row::of(C::ours().on_node("n1")).class(wffc()),
                "create",
                "the scheduler chose",
            ),
            (
                Row::of(C::ours().on_node("n1"))
                    .class(wffc())
                    .on("n1", false),
                "create",
                "chosen for this node",
            ),
            (
                Row::of(C::ours().on_node("n2"))
                    .class(wffc())
                    .on("n1", false),
                "wait",
                "chosen for another node",
            ),
            (
                Row::of(C::ours()).on("n1", true),
                "race",
                "Immediate, one sidecar per node",
            ),
            (
                Row::of(C::ours()).on("n1", false),
                "wait",
                "Immediate, not taken by nodes",
            ),
            (
                Row::of(C::ours()).pv(CachedPv::BoundTo(uid.clone())),
                "wait",
                "its PV is cached: the binder's turn",
            ),
            (
                Row::of(C::ours()).recall(Recall {
                    pv_saved: true,
                    ..Default::default()
                }),
                "wait",
                "this process saved its PV",
            ),
            (
                Row::of(C::ours()).pv(CachedPv::BoundTo("other".into())),
                "refuse: pv_of_another_claim",
                "our name is another claim's PV",
            ),
            (
                Row::of(C::ours()).recall(held(create)),
                "requeue",
                "the same attempt failed a moment ago",
            ),
            (
                Row::of(C::ours().on_node("n9")).recall(held(create)),
                "create",
                "another node now: another attempt",
            ),
            (
                Row::of(C::ours().intent().deleting()).recall(held(create)),
                "abandon",
                "deleted since: cleaned up at once",
            ),
            (
                Row::of(C::ours().bound().intent()),
                "release intent",
                "bound with our intent",
            ),
            (
                Row::of(C::ours().bound().intent()).recall(Recall {
                    intent_released: true,
                    ..Default::default()
                }),
                "wait",
                "released already by this process",
            ),
            (
                Row::of(C::ours().intent().deleting().on_node("n2")).on("n1", false),
                "forget",
                "another node's volume to clean up",
            ),
            (
                Row::of(C::ours().intent().deleting().on_node("n1")).on("n1", false),
                "abandon",
                "this node's volume to clean up",
            ),
            (
                Row::of(C::ours().bound().clone_source().deleting()),
                "release clone source",
                "a deleted clone source",
            ),
        ];
        for (row, want, what) in rows {
            assert_eq!(kind(&row.decide().0), want, "{what}");
        }
    }

    #[test]
    fn the_gauges_count_claims_holding_the_intent_and_waiting() {
        let at = |c: C, secs: i64| {
            let mut c = c.0;
            c.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
                ));
            Arc::new(Claim(c))
        };
        let claims = vec![
            at(C::ours(), 900),                     // waiting 100 s
            at(C::ours().intent(), 500),            // waiting and holding, 500 s
            at(C::ours().bound().intent(), 950),    // holding (bound, not released yet)
            at(C::ours().intent().deleting(), 990), // holding (cleanup)
            at(C::ours().of("x"), 0),               // another driver's: not counted
        ];
        let g = gauges(&claims, DRIVER, 1000.0);
        assert_eq!((g.holding_intent, g.waiting), (3, 2));
        assert_eq!((g.oldest_intent_age, g.oldest_waiting_age), (500.0, 500.0));
        assert_eq!(gauges(&[], DRIVER, 1000.0), ClaimGauges::default());
    }

    #[test]
    fn a_migrated_class_is_decided_on_in_our_drivers_terms() {
        let mut in_tree = class("kubernetes.io/aws-ebs", "Immediate");
        in_tree.parameters = Some([("type".to_string(), "gp3".to_string())].into());
        let place = Placement::Central;
        let row = |driver: &str| {
            let options = ProvisionOptions::default();
            let c = C::ours().of(driver);
            decide(&Facts {
                claim: ClaimView(&c.0),
                driver,
                options: &options,
                class: Some(Arc::new(in_tree.clone())),
                place: &place,
                recall: Recall::default(),
                pv: CachedPv::Unknown,
            })
            .0
        };
        match row("ebs.csi.aws.com") {
            Decision::Create(class, _) => assert_eq!(class.provisioner, "kubernetes.io/aws-ebs"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            kind(&row("other.csi.example.com")),
            "wait",
            "not migrated to us"
        );
    }

    #[test]
    fn a_claim_read_again_is_still_ours_only_if_nothing_that_matters_changed() {
        let central = Placement::Central;
        let immediate = class(DRIVER, "Immediate");
        let still = |c: C| still_creates(ClaimView(&c.0), &immediate, DRIVER, &central);
        assert!(still(C::ours()));
        assert!(still(C::ours().intent()));
        assert!(!still(C::ours().bound()), "bound meanwhile");
        assert!(!still(C::ours().intent().deleting()), "deleted meanwhile");
        assert!(!still(C::ours().of("x")), "handed to another driver");
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
