//! The invariant checker: the driver's ledger (ground truth of what exists on the backend)
//! against the Kubernetes API (what the cluster believes), after the faults stopped and the
//! system settled. Pure: it judges a [`Snapshot`]; gathering one is the runner's job.

use std::collections::{BTreeMap, HashMap, HashSet};

use csi_test_driver::ledger::Ledger;

/// A claim as the API server shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimState {
    pub name: String,
    pub uid: String,
    pub phase: String,
    /// `spec.volumeName`.
    pub volume_name: Option<String>,
    pub deleting: bool,
}

/// A PV of the driver under test as the API server shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeState {
    pub name: String,
    pub handle: String,
    /// `spec.claimRef.uid`.
    pub claim_uid: Option<String>,
    pub phase: String,
    pub deleting: bool,
}

/// A claim the runner created, and whether it asked for its deletion.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedClaim {
    pub name: String,
    pub uid: String,
    pub deleted: bool,
}

/// Everything the checker looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub created: Vec<CreatedClaim>,
    pub claims: Vec<ClaimState>,
    pub volumes: Vec<VolumeState>,
    pub ledger: Ledger,
    /// Messages of Warning `ProvisioningFailed` events, by claim name.
    pub failures: HashMap<String, Vec<String>>,
}

/// One invariant and what broke it (one line per violation).
#[derive(Debug, Clone, PartialEq)]
pub struct InvariantResult {
    pub name: &'static str,
    pub violations: Vec<String>,
}

/// The names of the invariants, in report order.
pub const BOUND_HAS_ITS_VOLUME: &str = "bound claim has exactly its PV's volume";
pub const NO_LEAK: &str = "no leaked backend volume";
pub const NO_LOSS: &str = "no PV pointing to a deleted volume";
pub const NO_DUPLICATE: &str = "no claim got two backend volumes";
pub const SETTLED: &str = "every claim Bound or with a final error";
pub const DELETED_GONE: &str = "deleted claims are gone";
pub const RECLAIMED: &str = "PVs of deleted claims are reclaimed";

/// gRPC codes after which upstream (and we) stop retrying a claim: a `ProvisioningFailed`
/// event carrying one of these, not caused by an injected fault, is a final error.
const FINAL_CODES: [&str; 9] = [
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "FailedPrecondition",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "DataLoss",
];

fn has_final_error(messages: &[String]) -> bool {
    messages.iter().any(|m| {
        !m.contains("injected")
            && FINAL_CODES
                .iter()
                .any(|code| m.contains(&format!("code = {code} ")))
    })
}

/// The backend's history of one name, for a violation line: each `CreateVolume` and
/// `DeleteVolume` outcome with its time relative to the first.
fn history(ledger: &Ledger, name: &str) -> String {
    let ops: Vec<_> = ledger
        .operations
        .iter()
        .filter(|op| op.name.as_deref() == Some(name))
        .collect();
    let t0 = ops.first().map(|op| op.at_ms).unwrap_or(0);
    ops.iter()
        .map(|op| {
            format!(
                "{}{}({:?}{}{}) +{}ms",
                if op.method == "CreateVolume" {
                    "C"
                } else {
                    "D"
                },
                op.volume_id
                    .as_deref()
                    .map(|v| format!("[{v}]"))
                    .unwrap_or_default(),
                op.code,
                if op.created { ",created" } else { "" },
                if op.deleted { ",deleted" } else { "" },
                op.at_ms.saturating_sub(t0)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn pv_name_of(uid: &str) -> String {
    format!("pvc-{uid}")
}

/// The runner's name of the claim a volume name belongs to, for violation lines.
fn claim_of(s: &Snapshot, volume_name: &str) -> String {
    s.created
        .iter()
        .find(|c| pv_name_of(&c.uid) == volume_name)
        .map(|c| {
            format!(
                " (claim {}{})",
                c.name,
                if c.deleted { ", deleted" } else { "" }
            )
        })
        .unwrap_or_default()
}

/// Judges a settled system.
pub fn check(s: &Snapshot) -> Vec<InvariantResult> {
    let live: HashMap<&str, &ClaimState> = s.claims.iter().map(|c| (c.uid.as_str(), c)).collect();
    let wanted: HashMap<&str, &CreatedClaim> = s
        .created
        .iter()
        .filter(|c| !c.deleted)
        .map(|c| (c.uid.as_str(), c))
        .collect();
    let pvs: HashMap<&str, &VolumeState> = s.volumes.iter().map(|v| (v.name.as_str(), v)).collect();
    let handles: HashSet<&str> = s.volumes.iter().map(|v| v.handle.as_str()).collect();
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for v in s.ledger.volumes.values() {
        by_name
            .entry(v.name.as_str())
            .or_default()
            .push(v.volume_id.as_str());
    }

    let mut bound = Vec::new();
    for c in s
        .claims
        .iter()
        .filter(|c| !c.deleting && c.phase == "Bound")
    {
        let Some(pv_name) = &c.volume_name else {
            bound.push(format!("{}: Bound without a volume name", c.name));
            continue;
        };
        let Some(pv) = pvs.get(pv_name.as_str()) else {
            bound.push(format!(
                "{}: bound to {pv_name}, which does not exist",
                c.name
            ));
            continue;
        };
        let ids = by_name.get(pv_name.as_str()).cloned().unwrap_or_default();
        if ids != [pv.handle.as_str()] {
            bound.push(format!(
                "{}: PV {pv_name} has handle {}, the backend holds {:?} under that name",
                c.name, pv.handle, ids
            ));
        }
    }

    let mut leaks = Vec::new();
    for v in s.ledger.volumes.values() {
        if handles.contains(v.volume_id.as_str()) {
            continue;
        }
        // A claim still being provisioned may hold a volume whose PV is not saved yet.
        let provisioning = s.claims.iter().any(|c| {
            !c.deleting
                && c.volume_name.is_none()
                && wanted.contains_key(c.uid.as_str())
                && pv_name_of(&c.uid) == v.name
        });
        if !provisioning {
            leaks.push(format!(
                "volume {} (name {}{}) has no PV and no live claim; backend: {}",
                v.volume_id,
                v.name,
                claim_of(s, &v.name),
                history(&s.ledger, &v.name)
            ));
        }
    }

    let mut loss = Vec::new();
    for v in &s.volumes {
        if !s.ledger.volumes.contains_key(&v.handle) {
            let claim_live = v.claim_uid.as_deref().is_some_and(|u| live.contains_key(u));
            if claim_live || v.phase != "Released" {
                loss.push(format!(
                    "PV {} ({}) points to volume {}, which the backend no longer has",
                    v.name, v.phase, v.handle
                ));
            }
        }
    }

    let mut created_count: BTreeMap<&str, usize> = BTreeMap::new();
    for op in s
        .ledger
        .operations_of("CreateVolume")
        .filter(|op| op.created)
    {
        if let Some(name) = &op.name {
            *created_count.entry(name.as_str()).or_default() += 1;
        }
    }
    let duplicates = created_count
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(name, n)| {
            format!(
                "{name}{}: {n} backend volumes created; backend: {}",
                claim_of(s, name),
                history(&s.ledger, name)
            )
        })
        .collect();

    let mut settled = Vec::new();
    for c in s.created.iter().filter(|c| !c.deleted) {
        match live.get(c.uid.as_str()) {
            None => settled.push(format!("{}: vanished without being deleted", c.name)),
            Some(state) if state.phase == "Bound" => {}
            Some(state) => {
                let failures = s.failures.get(&c.name).map(Vec::as_slice).unwrap_or(&[]);
                if !has_final_error(failures) {
                    settled.push(format!(
                        "{}: {} without a final error{}",
                        c.name,
                        state.phase,
                        failures
                            .last()
                            .map(|m| format!(" (last: {m})"))
                            .unwrap_or_default()
                    ));
                }
            }
        }
    }

    let deleted_gone = s
        .created
        .iter()
        .filter(|c| c.deleted && live.contains_key(c.uid.as_str()))
        .map(|c| format!("{}: still present after deletion", c.name))
        .collect();

    let reclaimed = s
        .volumes
        .iter()
        .filter(|v| {
            !v.claim_uid
                .as_deref()
                .is_some_and(|u| wanted.contains_key(u) && live.contains_key(u))
        })
        .map(|v| {
            format!(
                "PV {} ({}) of a deleted claim still exists",
                v.name, v.phase
            )
        })
        .collect();

    vec![
        InvariantResult {
            name: BOUND_HAS_ITS_VOLUME,
            violations: bound,
        },
        InvariantResult {
            name: NO_LEAK,
            violations: leaks,
        },
        InvariantResult {
            name: NO_LOSS,
            violations: loss,
        },
        InvariantResult {
            name: NO_DUPLICATE,
            violations: duplicates,
        },
        InvariantResult {
            name: SETTLED,
            violations: settled,
        },
        InvariantResult {
            name: DELETED_GONE,
            violations: deleted_gone,
        },
        InvariantResult {
            name: RECLAIMED,
            violations: reclaimed,
        },
    ]
}

pub fn total(results: &[InvariantResult]) -> usize {
    results.iter().map(|r| r.violations.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_test_driver::GrpcCode;
    use csi_test_driver::ledger::{OperationRecord, VolumeRecord};

    /// A world built claim by claim.
    #[derive(Default)]
    struct World(Snapshot);

    impl World {
        /// A live claim bound to its PV, backed by one volume.
        fn bound(mut self, name: &str) -> World {
            let uid = format!("u-{name}");
            let pv = pv_name_of(&uid);
            let id = format!("vol-{name}");
            self.0.created.push(CreatedClaim {
                name: name.into(),
                uid: uid.clone(),
                deleted: false,
            });
            self.0.claims.push(ClaimState {
                name: name.into(),
                uid: uid.clone(),
                phase: "Bound".into(),
                volume_name: Some(pv.clone()),
                deleting: false,
            });
            self.0.volumes.push(VolumeState {
                name: pv.clone(),
                handle: id.clone(),
                claim_uid: Some(uid),
                phase: "Bound".into(),
                deleting: false,
            });
            self.volume(&id, &pv)
        }

        fn volume(mut self, id: &str, name: &str) -> World {
            self.0.ledger.volumes.insert(
                id.into(),
                VolumeRecord {
                    volume_id: id.into(),
                    name: name.into(),
                    capacity_bytes: 1,
                    parameters: Default::default(),
                    mutable_parameters: Default::default(),
                    secret_keys: vec![],
                    volume_context: Default::default(),
                    content_source: None,
                    accessible_topology: vec![],
                    published_nodes: Default::default(),
                    created_at_ms: 0,
                },
            );
            self.created_op(id, name)
        }

        fn created_op(mut self, id: &str, name: &str) -> World {
            self.0.ledger.operations.push(OperationRecord {
                method: "CreateVolume".into(),
                name: Some(name.into()),
                volume_id: Some(id.into()),
                code: GrpcCode::Ok,
                message: String::new(),
                injected: false,
                created: true,
                deleted: false,
                secret_keys: Vec::new(),
                at_ms: 0,
            });
            self
        }

        fn deleted_claim(mut self, name: &str) -> World {
            self.0.created.push(CreatedClaim {
                name: name.into(),
                uid: format!("u-{name}"),
                deleted: true,
            });
            self
        }

        fn violations(&self) -> BTreeMap<&'static str, usize> {
            check(&self.0)
                .into_iter()
                .filter(|r| !r.violations.is_empty())
                .map(|r| (r.name, r.violations.len()))
                .collect()
        }
    }

    #[test]
    fn a_healthy_world_has_no_violations() {
        let w = World::default().bound("a").bound("b").deleted_claim("gone");
        assert_eq!(w.violations(), BTreeMap::new());
    }

    #[test]
    fn a_volume_without_pv_or_claim_is_a_leak() {
        let w = World::default()
            .bound("a")
            .deleted_claim("x")
            .volume("vol-x", "pvc-u-x");
        assert_eq!(w.violations(), BTreeMap::from([(NO_LEAK, 1)]));
    }

    #[test]
    fn a_volume_of_a_claim_still_provisioning_is_not_a_leak_but_unsettled() {
        let mut w = World::default().volume("vol-p", "pvc-u-p");
        w.0.created.push(CreatedClaim {
            name: "p".into(),
            uid: "u-p".into(),
            deleted: false,
        });
        w.0.claims.push(ClaimState {
            name: "p".into(),
            uid: "u-p".into(),
            phase: "Pending".into(),
            volume_name: None,
            deleting: false,
        });
        assert_eq!(w.violations(), BTreeMap::from([(SETTLED, 1)]));
        w.0.failures.insert(
            "p".into(),
            vec!["rpc error: code = InvalidArgument desc = bad parameter".into()],
        );
        assert_eq!(w.violations(), BTreeMap::new(), "a final error settles it");
        w.0.failures.insert(
            "p".into(),
            vec!["rpc error: code = Internal desc = injected fault".into()],
        );
        assert_eq!(
            w.violations(),
            BTreeMap::from([(SETTLED, 1)]),
            "injected errors are not final"
        );
    }

    #[test]
    fn a_pv_whose_volume_is_gone_is_a_loss_and_a_bound_mismatch() {
        let mut w = World::default().bound("a");
        w.0.ledger.volumes.clear();
        assert_eq!(
            w.violations(),
            BTreeMap::from([(BOUND_HAS_ITS_VOLUME, 1), (NO_LOSS, 1)])
        );
    }

    #[test]
    fn two_created_volumes_for_one_name_are_a_duplicate() {
        // Created, deleted, created again (upstream #1469): one survives, two were created.
        let w = World::default().bound("a").created_op("vol-old", "pvc-u-a");
        assert_eq!(w.violations(), BTreeMap::from([(NO_DUPLICATE, 1)]));
    }

    #[test]
    fn a_second_volume_under_a_bound_claims_name_breaks_the_bound_invariant() {
        let w = World::default().bound("a").volume("vol-a2", "pvc-u-a");
        assert_eq!(
            w.violations(),
            BTreeMap::from([(BOUND_HAS_ITS_VOLUME, 1), (NO_LEAK, 1), (NO_DUPLICATE, 1)])
        );
    }

    #[test]
    fn stuck_deleted_claims_and_unreclaimed_pvs_are_reported() {
        let mut w = World::default().bound("a");
        w.0.created[0].deleted = true;
        w.0.claims[0].deleting = true;
        assert_eq!(
            w.violations(),
            BTreeMap::from([(DELETED_GONE, 1), (RECLAIMED, 1)])
        );
    }

    #[test]
    fn a_claim_that_vanished_without_deletion_is_unsettled() {
        let mut w = World::default().bound("a");
        w.0.claims.clear();
        let v = w.violations();
        assert_eq!(v.get(SETTLED), Some(&1));
    }
}
