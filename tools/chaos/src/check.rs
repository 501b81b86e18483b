//! The invariant checker: the driver's ledger (ground truth of what exists on the backend)
//! against the Kubernetes API (what the cluster believes), after the faults stopped and the
//! system settled. Pure: it judges a [`Snapshot`]; gathering one is the runner's job.
//! Restores and clones are judged the same way: from the ledger (which snapshot or volume
//! each `CreateVolume` asked for, and when sources were deleted) and from the objects'
//! finalizers, never from what the sidecar says about itself.

use std::collections::{BTreeMap, HashMap, HashSet};

use csi_test_driver::GrpcCode;
use csi_test_driver::ledger::{ContentSource, Ledger};

/// The provisioner's finalizer on a VolumeSnapshot a restore is using (ours and upstream's).
pub const SNAPSHOT_SOURCE_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// The provisioner's finalizer on a claim a clone is using (ours and upstream's).
pub const CLONE_SOURCE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
/// `dataSource.kind` of a restore and of a clone.
pub const SNAPSHOT_KIND: &str = "VolumeSnapshot";
pub const CLAIM_KIND: &str = "PersistentVolumeClaim";

/// The name csi-snapshotter gives the backend snapshot of a VolumeSnapshot (its default
/// `--snapshot-name-prefix`, then the VolumeSnapshot's UID).
pub fn backend_snapshot_name(snapshot_uid: &str) -> String {
    format!("snapshot-{snapshot_uid}")
}

/// A claim as the API server shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimState {
    pub name: String,
    pub uid: String,
    pub phase: String,
    /// `spec.volumeName`.
    pub volume_name: Option<String>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    /// `spec.dataSourceRef` (or `spec.dataSource`): kind and name.
    pub data_source: Option<(String, String)>,
    /// The `volume.kubernetes.io/selected-node` annotation.
    pub selected_node: Option<String>,
}

/// A VolumeSnapshot as the API server shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotState {
    pub name: String,
    pub uid: String,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    pub ready: bool,
}

/// What the runner made a data-source claim from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A restore from a VolumeSnapshot.
    Snapshot,
    /// A clone of a claim.
    Claim,
}

/// The source of a data-source claim, as the runner created it.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSource {
    pub kind: SourceKind,
    /// The VolumeSnapshot's or the source claim's name and UID.
    pub name: String,
    pub uid: String,
    /// The runner asked for the source's deletion (the claim may then never be provisioned).
    pub deleted: bool,
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
    /// The values of `spec.nodeAffinity.required`'s `In` expressions, by key: the
    /// topology the sidecar says the volume is accessible from.
    pub node_affinity: BTreeMap<String, Vec<String>>,
}

/// A claim the runner created, and whether it asked for its deletion.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedClaim {
    pub name: String,
    pub uid: String,
    pub deleted: bool,
    /// Restores and clones: what the claim was made from.
    pub source: Option<DataSource>,
}

/// Everything the checker looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub created: Vec<CreatedClaim>,
    pub claims: Vec<ClaimState>,
    pub volumes: Vec<VolumeState>,
    /// The run's VolumeSnapshots.
    pub snapshots: Vec<SnapshotState>,
    /// The backend: in a node deployment every node's ledger, merged ([`merge`]).
    pub ledger: Ledger,
    /// Messages of Warning `ProvisioningFailed` events, by claim name.
    pub failures: HashMap<String, Vec<String>>,
    /// A node deployment's topology key: each volume's node is its accessible topology's
    /// value of it (the test driver of each node reports its own name there).
    pub node_key: Option<String>,
    /// A node deployment: each node's own ledger counted before the merge (for the report).
    pub per_node: Vec<NodeTally>,
}

/// What one node's driver did, from its own ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeTally {
    pub node: String,
    pub volumes_created: u64,
    pub volumes_deleted: u64,
    /// `CreateVolume` calls answered `RESOURCE_EXHAUSTED` (the node sends the claim back).
    pub no_room: u64,
}

impl NodeTally {
    pub fn of(node: &str, ledger: &Ledger) -> NodeTally {
        NodeTally {
            node: node.to_string(),
            volumes_created: ledger
                .operations_of("CreateVolume")
                .filter(|op| op.created)
                .count() as u64,
            volumes_deleted: ledger
                .operations_of("DeleteVolume")
                .filter(|op| op.deleted)
                .count() as u64,
            no_room: ledger
                .operations_of("CreateVolume")
                .filter(|op| op.code == GrpcCode::ResourceExhausted)
                .count() as u64,
        }
    }
}

/// Every node's ledger as one backend: the volumes and snapshots they hold, their calls
/// added up, their operations in the order they finished (one host clock). A name created
/// on two nodes shows as two volumes of one name, which the rows judge as they judge a
/// volume created twice by one driver. Volume ids carry a per-driver random part, so two
/// nodes do not make the same id.
pub fn merge(ledgers: Vec<Ledger>) -> Ledger {
    let mut merged = Ledger::default();
    for l in ledgers {
        merged.volumes.extend(l.volumes);
        merged.snapshots.extend(l.snapshots);
        for (method, n) in l.calls {
            *merged.calls.entry(method).or_default() += n;
        }
        merged.operations.extend(l.operations);
        merged.starts += l.starts;
    }
    merged.operations.sort_by_key(|op| op.at_ms);
    merged
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
pub const SOURCES_RELEASED: &str = "no source-protection finalizer left behind";
pub const NO_RESTORE_FROM_DELETED: &str = "no restore from a deleted snapshot";
pub const CLONE_SOURCE_KEPT: &str = "no clone source deleted before its clone";
pub const MADE_FROM_SOURCE: &str = "bound claim's volume made from its own source";
pub const ON_SELECTED_NODE: &str = "bound claim's volume on its selected node";

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
            // Its source went before it was protected: upstream (and we) then refuse the
            // claim for as long as the source is gone or being deleted.
            Some(_) if c.source.as_ref().is_some_and(|src| src.deleted) => {}
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

    // A deleted clone source that a pending clone still names keeps its cloning protection
    // (and so its PV) by design; the clone is refused while its source is being deleted, as
    // upstream refuses it, until the clone goes too. Whether the protection is released once
    // no clone waits is the data-source rows' business.
    let clone_pending_for: HashSet<&str> = s
        .claims
        .iter()
        .filter(|c| c.phase != "Bound")
        .filter_map(|c| c.data_source.as_ref())
        .filter(|(kind, _)| kind == CLAIM_KIND)
        .map(|(_, name)| name.as_str())
        .collect();
    let held: HashSet<&str> = s
        .claims
        .iter()
        .filter(|c| {
            c.deleting
                && c.finalizers.iter().any(|f| f == CLONE_SOURCE_FINALIZER)
                && clone_pending_for.contains(c.name.as_str())
        })
        .map(|c| c.uid.as_str())
        .collect();

    let deleted_gone = s
        .created
        .iter()
        .filter(|c| c.deleted && live.contains_key(c.uid.as_str()))
        .filter(|c| !held.contains(c.uid.as_str()))
        .map(|c| format!("{}: still present after deletion", c.name))
        .collect();

    let reclaimed = s
        .volumes
        .iter()
        .filter(|v| {
            !v.claim_uid.as_deref().is_some_and(|u| {
                (wanted.contains_key(u) && live.contains_key(u)) || held.contains(u)
            })
        })
        .map(|v| {
            format!(
                "PV {} ({}) of a deleted claim still exists",
                v.name, v.phase
            )
        })
        .collect();

    let mut results = vec![
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
    ];
    results.extend(check_data_sources(s));
    if let Some(key) = &s.node_key {
        results.push(check_nodes(s, key, &pvs));
    }
    results
}

/// A node deployment: each Bound claim's volume is held by the node the claim was
/// selected for — by the scheduler (here: the runner) for WaitForFirstConsumer, by the
/// node that won the race for an Immediate claim (it writes itself as the selected node) —
/// and its PV is accessible from that node alone (node affinity), the node that deletes it.
fn check_nodes(s: &Snapshot, key: &str, pvs: &HashMap<&str, &VolumeState>) -> InvariantResult {
    let mut wrong = Vec::new();
    for c in s
        .claims
        .iter()
        .filter(|c| !c.deleting && c.phase == "Bound")
    {
        let Some((pv, volume)) = c
            .volume_name
            .as_deref()
            .and_then(|n| pvs.get(n))
            .and_then(|pv| Some((pv, s.ledger.volumes.get(&pv.handle)?)))
        else {
            // A missing volume is the first row's violation.
            continue;
        };
        let on: Vec<&str> = volume
            .accessible_topology
            .iter()
            .filter_map(|t| t.get(key).map(String::as_str))
            .collect();
        let affinity: Vec<&str> = pv
            .node_affinity
            .get(key)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        match &c.selected_node {
            Some(node) if on == [node.as_str()] && affinity == [node.as_str()] => {}
            selected => wrong.push(format!(
                "{}: selected node {selected:?}, volume {} on {on:?}, PV {} accessible from {affinity:?}",
                c.name, volume.volume_id, pv.name
            )),
        }
    }
    InvariantResult {
        name: ON_SELECTED_NODE,
        violations: wrong,
    }
}

/// The data-source rows: protections released, no source used after its deletion, every
/// restored or cloned volume made from the source its claim names.
fn check_data_sources(s: &Snapshot) -> Vec<InvariantResult> {
    // A source a claim still waits for may keep its protection.
    let pending_sources: HashSet<(&str, &str)> = s
        .claims
        .iter()
        .filter(|c| c.phase != "Bound")
        .filter_map(|c| c.data_source.as_ref())
        .map(|(kind, name)| (kind.as_str(), name.as_str()))
        .collect();
    let mut released = Vec::new();
    for vs in &s.snapshots {
        if vs.finalizers.iter().any(|f| f == SNAPSHOT_SOURCE_FINALIZER)
            && !pending_sources.contains(&(SNAPSHOT_KIND, vs.name.as_str()))
        {
            released.push(format!(
                "VolumeSnapshot {}{} keeps {SNAPSHOT_SOURCE_FINALIZER}; no pending claim restores from it",
                vs.name,
                if vs.deleting { " (being deleted)" } else { "" }
            ));
        }
    }
    // Upstream's cloning protection stays on a source claim until its deletion begins (only
    // then is it looked at): left behind is a claim being deleted that keeps it.
    for c in s.claims.iter().filter(|c| c.deleting) {
        if c.finalizers.iter().any(|f| f == CLONE_SOURCE_FINALIZER)
            && !pending_sources.contains(&(CLAIM_KIND, c.name.as_str()))
        {
            released.push(format!(
                "claim {} (being deleted) keeps {CLONE_SOURCE_FINALIZER}; no pending claim clones it",
                c.name,
            ));
        }
    }

    // The ledger is appended under the driver's lock: its order is the backend's order.
    let t0 = s.ledger.operations.first().map(|op| op.at_ms).unwrap_or(0);
    let mut snapshots_made: HashSet<&str> = HashSet::new();
    let mut snapshots_gone: HashMap<&str, u64> = HashMap::new();
    let mut volumes_made: HashSet<&str> = HashSet::new();
    let mut volumes_gone: HashMap<&str, u64> = HashMap::new();
    let mut restores = Vec::new();
    let mut clones = Vec::new();
    for op in &s.ledger.operations {
        let id = op.volume_id.as_deref().unwrap_or("");
        let name = op.name.as_deref().unwrap_or("");
        match op.method.as_str() {
            "CreateSnapshot" if op.created => {
                snapshots_made.insert(id);
            }
            "DeleteSnapshot" if op.deleted => {
                snapshots_gone.entry(id).or_insert(op.at_ms);
            }
            "DeleteVolume" if op.deleted => {
                volumes_gone.entry(id).or_insert(op.at_ms);
            }
            "CreateVolume" => {
                if op.created {
                    volumes_made.insert(id);
                }
                let at = op.at_ms.saturating_sub(t0);
                match &op.content_source {
                    Some(ContentSource::Snapshot { snapshot_id }) => {
                        if let Some(gone) = snapshots_gone.get(snapshot_id.as_str()) {
                            restores.push(format!(
                                "CreateVolume {name}{} ({:?}) at +{at}ms asked for snapshot {snapshot_id}, deleted at +{}ms",
                                claim_of(s, name),
                                op.code,
                                gone.saturating_sub(t0)
                            ));
                        } else if op.created && !snapshots_made.contains(snapshot_id.as_str()) {
                            restores.push(format!(
                                "volume {id} ({name}{}) made from snapshot {snapshot_id}, which the backend never made",
                                claim_of(s, name)
                            ));
                        }
                    }
                    Some(ContentSource::Volume { volume_id }) => {
                        if let Some(gone) = volumes_gone.get(volume_id.as_str()) {
                            clones.push(format!(
                                "CreateVolume {name}{} ({:?}) at +{at}ms cloned volume {volume_id}, deleted at +{}ms",
                                claim_of(s, name),
                                op.code,
                                gone.saturating_sub(t0)
                            ));
                        } else if op.created && !volumes_made.contains(volume_id.as_str()) {
                            clones.push(format!(
                                "volume {id} ({name}{}) cloned from volume {volume_id}, which the backend never made",
                                claim_of(s, name)
                            ));
                        }
                    }
                    None => {}
                }
            }
            _ => {}
        }
    }

    // What each name was made as on the backend: snapshot ids by CreateSnapshot name,
    // volume ids by CreateVolume name.
    let mut made: HashMap<(&str, &str), HashSet<&str>> = HashMap::new();
    for op in &s.ledger.operations {
        if let (Some(name), Some(id)) = (&op.name, &op.volume_id)
            && (op.method == "CreateSnapshot" || op.method == "CreateVolume")
        {
            made.entry((op.method.as_str(), name.as_str()))
                .or_default()
                .insert(id.as_str());
        }
    }
    let live: HashMap<&str, &ClaimState> = s.claims.iter().map(|c| (c.uid.as_str(), c)).collect();
    let pvs: HashMap<&str, &VolumeState> = s.volumes.iter().map(|v| (v.name.as_str(), v)).collect();
    let mut from_source = Vec::new();
    for c in s.created.iter().filter(|c| !c.deleted) {
        let Some(state) = live.get(c.uid.as_str()) else {
            continue;
        };
        if state.deleting || state.phase != "Bound" {
            continue;
        }
        let Some(volume) = state
            .volume_name
            .as_deref()
            .and_then(|n| pvs.get(n))
            .and_then(|pv| s.ledger.volumes.get(&pv.handle))
        else {
            // A missing volume is the first row's violation.
            continue;
        };
        let ok = match (&c.source, &volume.content_source) {
            (None, None) => true,
            (Some(src), Some(ContentSource::Snapshot { snapshot_id }))
                if src.kind == SourceKind::Snapshot =>
            {
                let name = backend_snapshot_name(&src.uid);
                made.get(&("CreateSnapshot", name.as_str()))
                    .is_some_and(|ids| ids.contains(snapshot_id.as_str()))
            }
            (Some(src), Some(ContentSource::Volume { volume_id }))
                if src.kind == SourceKind::Claim =>
            {
                let name = pv_name_of(&src.uid);
                made.get(&("CreateVolume", name.as_str()))
                    .is_some_and(|ids| ids.contains(volume_id.as_str()))
            }
            _ => false,
        };
        if !ok {
            from_source.push(format!(
                "{}: asked for {}, volume {} made from {:?}",
                c.name,
                match &c.source {
                    None => "no source".to_string(),
                    Some(src) => format!("{:?} {}", src.kind, src.name),
                },
                volume.volume_id,
                volume.content_source
            ));
        }
    }

    vec![
        InvariantResult {
            name: SOURCES_RELEASED,
            violations: released,
        },
        InvariantResult {
            name: NO_RESTORE_FROM_DELETED,
            violations: restores,
        },
        InvariantResult {
            name: CLONE_SOURCE_KEPT,
            violations: clones,
        },
        InvariantResult {
            name: MADE_FROM_SOURCE,
            violations: from_source,
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
                source: None,
            });
            self.0.claims.push(ClaimState {
                name: name.into(),
                uid: uid.clone(),
                phase: "Bound".into(),
                volume_name: Some(pv.clone()),
                deleting: false,
                finalizers: Vec::new(),
                data_source: None,
                selected_node: None,
            });
            self.0.volumes.push(VolumeState {
                name: pv.clone(),
                handle: id.clone(),
                claim_uid: Some(uid),
                phase: "Bound".into(),
                deleting: false,
                node_affinity: BTreeMap::new(),
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
                content_source: None,
                requisite: Vec::new(),
                preferred: Vec::new(),
                at_ms: 0,
            });
            self
        }

        /// A backend operation on `id`, appended to the ledger (its order is the backend's).
        fn op(mut self, method: &str, name: Option<&str>, id: &str, done: bool) -> World {
            let mut op = OperationRecord::new(method, name.map(Into::into), Some(id.into()));
            op.created = done && method.starts_with("Create");
            op.deleted = done && method.starts_with("Delete");
            self.0.ledger.operations.push(op);
            self
        }

        /// The backend snapshot `id` of VolumeSnapshot `vs` (UID `u-<vs>`).
        fn backend_snapshot(self, vs: &str, id: &str) -> World {
            let name = backend_snapshot_name(&format!("u-{vs}"));
            self.op("CreateSnapshot", Some(&name), id, true)
        }

        /// A VolumeSnapshot object.
        fn volume_snapshot(mut self, name: &str, finalizers: &[&str]) -> World {
            self.0.snapshots.push(SnapshotState {
                name: name.into(),
                uid: format!("u-{name}"),
                finalizers: finalizers.iter().map(|f| f.to_string()).collect(),
                deleting: false,
                ready: true,
            });
            self
        }

        /// Makes the last claim a restore or a clone of `source` whose volume was made from
        /// `made_from` (and says so in its `CreateVolume` record).
        fn made_from(mut self, kind: SourceKind, source: &str, made_from: ContentSource) -> World {
            let created = self.0.created.last_mut().expect("a claim");
            created.source = Some(DataSource {
                kind,
                name: source.into(),
                uid: format!("u-{source}"),
                deleted: false,
            });
            let claim = self.0.claims.last_mut().expect("a claim");
            claim.data_source = Some((
                match kind {
                    SourceKind::Snapshot => SNAPSHOT_KIND,
                    SourceKind::Claim => CLAIM_KIND,
                }
                .into(),
                source.into(),
            ));
            let pv = claim.volume_name.clone().expect("bound");
            let handle = self.0.volumes.last().expect("a PV").handle.clone();
            self.0
                .ledger
                .volumes
                .get_mut(&handle)
                .expect("volume")
                .content_source = Some(made_from.clone());
            let op = self
                .0
                .ledger
                .operations
                .iter_mut()
                .rev()
                .find(|op| op.name.as_deref() == Some(pv.as_str()))
                .expect("its CreateVolume");
            op.content_source = Some(made_from);
            self
        }

        fn deleted_claim(mut self, name: &str) -> World {
            self.0.created.push(CreatedClaim {
                name: name.into(),
                uid: format!("u-{name}"),
                deleted: true,
                source: None,
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

    /// `w`'s backend split as a node deployment's: the last claim's volume (and its
    /// CreateVolume) on node `on`, selected for node `selected`; every other claim selected
    /// for `n0`, where its volume is.
    fn on_nodes(mut w: World, selected: &str, on: &str) -> World {
        w.0.node_key = Some("node".into());
        for c in &mut w.0.claims {
            c.selected_node = Some("n0".into());
        }
        let claim = w.0.claims.last_mut().expect("a claim");
        claim.selected_node = Some(selected.into());
        let pv = claim.volume_name.clone().expect("bound");
        for v in &mut w.0.volumes {
            let node = if v.name == pv { on } else { "n0" };
            v.node_affinity = BTreeMap::from([("node".into(), vec![node.into()])]);
        }
        let mut ledger = std::mem::take(&mut w.0.ledger);
        let mut other = Ledger::default();
        for v in ledger.volumes.values_mut() {
            let node = if v.name == pv { on } else { "n0" };
            v.accessible_topology = vec![BTreeMap::from([("node".into(), node.into())])];
        }
        let ids: Vec<String> = ledger
            .volumes
            .values()
            .filter(|v| v.name == pv)
            .map(|v| v.volume_id.clone())
            .collect();
        for id in ids {
            let v = ledger.volumes.remove(&id).expect("volume");
            other.volumes.insert(id, v);
        }
        let (mine, theirs): (Vec<_>, Vec<_>) = ledger
            .operations
            .into_iter()
            .partition(|op| op.name.as_deref() != Some(pv.as_str()));
        ledger.operations = mine;
        other.operations = theirs;
        w.0.ledger = merge(vec![ledger, other]);
        w
    }

    #[test]
    fn in_a_node_deployment_a_volume_belongs_on_its_claims_selected_node() {
        let w = World::default().bound("a");
        let a = on_nodes(World::default().bound("a"), "n1", "n1");
        assert_eq!(a.violations(), BTreeMap::new());
        assert!(
            check(&a.0).iter().any(|r| r.name == ON_SELECTED_NODE),
            "the row is judged in a node deployment"
        );
        assert!(!check(&w.0).iter().any(|r| r.name == ON_SELECTED_NODE));
        let wrong = on_nodes(World::default().bound("b").bound("a"), "n1", "n2");
        assert_eq!(wrong.violations(), BTreeMap::from([(ON_SELECTED_NODE, 1)]));
        let mut unselected = on_nodes(World::default().bound("a"), "n1", "n1");
        unselected.0.claims[0].selected_node = None;
        assert_eq!(
            unselected.violations(),
            BTreeMap::from([(ON_SELECTED_NODE, 1)])
        );
    }

    #[test]
    fn in_a_node_deployment_a_pv_is_accessible_from_its_volumes_node_alone() {
        // The volume is on n1, where the claim was selected, but its PV names n2 (the node
        // that would delete it), or n1 and n2, or no node.
        for affinity in [vec!["n2"], vec!["n1", "n2"], vec![]] {
            let mut w = on_nodes(World::default().bound("b").bound("a"), "n1", "n1");
            let pv = w.0.claims[1].volume_name.clone().expect("bound");
            let v = w.0.volumes.iter_mut().find(|v| v.name == pv).expect("PV");
            v.node_affinity = BTreeMap::from([(
                "node".into(),
                affinity.iter().map(|n| n.to_string()).collect(),
            )]);
            assert_eq!(
                w.violations(),
                BTreeMap::from([(ON_SELECTED_NODE, 1)]),
                "PV accessible from {affinity:?}"
            );
        }
    }

    #[test]
    fn a_claim_provisioned_on_two_nodes_is_a_double_volume() {
        // Node n1 holds the claim's volume; node n2 made one of the same name too.
        let mut w = on_nodes(World::default().bound("a"), "n1", "n1");
        let mut n2 = Ledger::default();
        let mut second = World::default().volume("vol-a-on-n2", "pvc-u-a");
        n2.volumes.append(&mut second.0.ledger.volumes);
        n2.operations.append(&mut second.0.ledger.operations);
        w.0.ledger = merge(vec![std::mem::take(&mut w.0.ledger), n2]);
        assert_eq!(
            w.violations(),
            BTreeMap::from([(BOUND_HAS_ITS_VOLUME, 1), (NO_DUPLICATE, 1), (NO_LEAK, 1)])
        );
    }

    #[test]
    fn a_nodes_tally_counts_its_created_and_deleted_volumes_and_its_no_room_answers() {
        let mut l = World::default()
            .volume("vol-1", "pvc-1")
            .volume("vol-2", "pvc-2")
            .op("DeleteVolume", None, "vol-1", true)
            .op("DeleteVolume", None, "vol-9", false)
            .0
            .ledger;
        let mut full = OperationRecord::new("CreateVolume", Some("pvc-3".into()), None);
        full.code = GrpcCode::ResourceExhausted;
        full.injected = true;
        l.operations.push(full);
        assert_eq!(
            NodeTally::of("n1", &l),
            NodeTally {
                node: "n1".into(),
                volumes_created: 2,
                volumes_deleted: 1,
                no_room: 1,
            }
        );
    }

    #[test]
    fn merged_ledgers_keep_every_volume_call_and_the_order_of_operations() {
        let mut a = World::default().volume("vol-1", "pvc-1").0.ledger;
        let mut b = World::default().volume("vol-2", "pvc-2").0.ledger;
        a.operations[0].at_ms = 20;
        b.operations[0].at_ms = 10;
        a.calls.insert("CreateVolume".into(), 2);
        b.calls.insert("CreateVolume".into(), 3);
        let m = merge(vec![a, b]);
        assert_eq!(m.volumes.len(), 2);
        assert_eq!(m.call_count("CreateVolume"), 5);
        let order: Vec<_> = m.operations.iter().map(|op| op.volume_id.clone()).collect();
        assert_eq!(order, [Some("vol-2".into()), Some("vol-1".into())]);
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
            source: None,
        });
        w.0.claims.push(ClaimState {
            name: "p".into(),
            uid: "u-p".into(),
            phase: "Pending".into(),
            volume_name: None,
            deleting: false,
            finalizers: Vec::new(),
            data_source: None,
            selected_node: None,
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

    fn snapshot_source(id: &str) -> ContentSource {
        ContentSource::Snapshot {
            snapshot_id: id.into(),
        }
    }

    fn volume_source(id: &str) -> ContentSource {
        ContentSource::Volume {
            volume_id: id.into(),
        }
    }

    /// `a`, a snapshot `s` of it (backend snapshot `snap-1`), a restore `r` of `s` and a
    /// clone `k` of `a`.
    fn restore_and_clone() -> World {
        World::default()
            .bound("a")
            .volume_snapshot("s", &[])
            .backend_snapshot("s", "snap-1")
            .bound("r")
            .made_from(SourceKind::Snapshot, "s", snapshot_source("snap-1"))
            .bound("k")
            .made_from(SourceKind::Claim, "a", volume_source("vol-a"))
    }

    #[test]
    fn a_restore_and_a_clone_made_from_their_sources_have_no_violations() {
        assert_eq!(restore_and_clone().violations(), BTreeMap::new());
    }

    #[test]
    fn a_protection_no_pending_claim_needs_is_left_behind() {
        let mut w = restore_and_clone().volume_snapshot("old", &[SNAPSHOT_SOURCE_FINALIZER]);
        w.0.claims[0].finalizers.push(CLONE_SOURCE_FINALIZER.into());
        // A source claim keeps its cloning protection until its deletion begins.
        assert_eq!(w.violations(), BTreeMap::from([(SOURCES_RELEASED, 1)]));
        w.0.claims[0].deleting = true;
        assert_eq!(w.violations(), BTreeMap::from([(SOURCES_RELEASED, 2)]));
        // A claim still waiting for them keeps both protections rightly.
        for (kind, source) in [(SNAPSHOT_KIND, "old"), (CLAIM_KIND, "a")] {
            w.0.claims.push(ClaimState {
                name: format!("waits-for-{source}"),
                uid: format!("u-waits-for-{source}"),
                phase: "Pending".into(),
                volume_name: None,
                deleting: false,
                finalizers: Vec::new(),
                data_source: Some((kind.into(), source.into())),
                selected_node: None,
            });
        }
        assert_eq!(w.violations(), BTreeMap::new());
    }

    #[test]
    fn a_create_volume_from_a_snapshot_already_deleted_is_reported() {
        let mut w = restore_and_clone()
            .op("DeleteSnapshot", None, "snap-1", true)
            .op("CreateVolume", Some("pvc-u-late"), "", false);
        w.0.ledger.operations.last_mut().unwrap().content_source = Some(snapshot_source("snap-1"));
        assert_eq!(
            w.violations(),
            BTreeMap::from([(NO_RESTORE_FROM_DELETED, 1)])
        );
        // A DeleteSnapshot that failed (nothing deleted) does not count.
        let mut w = restore_and_clone()
            .op("DeleteSnapshot", None, "snap-1", false)
            .op("CreateVolume", Some("pvc-u-late"), "", false);
        w.0.ledger.operations.last_mut().unwrap().content_source = Some(snapshot_source("snap-1"));
        assert_eq!(w.violations(), BTreeMap::new());
    }

    #[test]
    fn a_volume_restored_from_a_snapshot_the_backend_never_made_is_reported() {
        let w = World::default()
            .volume_snapshot("s", &[])
            .bound("r")
            .made_from(SourceKind::Snapshot, "s", snapshot_source("snap-9"));
        assert_eq!(
            w.violations(),
            BTreeMap::from([(NO_RESTORE_FROM_DELETED, 1), (MADE_FROM_SOURCE, 1)])
        );
    }

    #[test]
    fn a_clone_of_a_volume_deleted_before_it_is_reported() {
        let mut w = restore_and_clone()
            .op("DeleteVolume", None, "vol-a", true)
            .op("CreateVolume", Some("pvc-u-late"), "", false);
        w.0.ledger.operations.last_mut().unwrap().content_source = Some(volume_source("vol-a"));
        let v = w.violations();
        assert_eq!(v.get(CLONE_SOURCE_KEPT), Some(&1), "{v:?}");
    }

    #[test]
    fn a_volume_made_from_another_source_or_from_none_is_reported() {
        // The clone of `a` made from the restore's volume; the restore made from nothing.
        let mut w = World::default()
            .bound("a")
            .volume_snapshot("s", &[])
            .backend_snapshot("s", "snap-1")
            .bound("r")
            .made_from(SourceKind::Snapshot, "s", snapshot_source("snap-1"))
            .bound("k")
            .made_from(SourceKind::Claim, "a", volume_source("vol-r"));
        w.0.ledger.volumes.get_mut("vol-r").unwrap().content_source = None;
        // A plain claim whose volume says it came from a snapshot.
        w.0.ledger.volumes.get_mut("vol-a").unwrap().content_source =
            Some(snapshot_source("snap-1"));
        let v = w.violations();
        assert_eq!(v.get(MADE_FROM_SOURCE), Some(&3), "{v:?}");
    }

    #[test]
    fn a_claim_whose_source_the_runner_deleted_may_stay_pending() {
        let mut w = World::default();
        w.0.created.push(CreatedClaim {
            name: "r".into(),
            uid: "u-r".into(),
            deleted: false,
            source: Some(DataSource {
                kind: SourceKind::Snapshot,
                name: "s".into(),
                uid: "u-s".into(),
                deleted: false,
            }),
        });
        w.0.claims.push(ClaimState {
            name: "r".into(),
            uid: "u-r".into(),
            phase: "Pending".into(),
            volume_name: None,
            deleting: false,
            finalizers: Vec::new(),
            data_source: Some((SNAPSHOT_KIND.into(), "s".into())),
            selected_node: None,
        });
        assert_eq!(w.violations(), BTreeMap::from([(SETTLED, 1)]));
        w.0.created[0].source.as_mut().unwrap().deleted = true;
        assert_eq!(w.violations(), BTreeMap::new());
    }

    #[test]
    fn a_deleted_clone_source_held_by_a_pending_clone_is_not_stuck() {
        let mut w = World::default().bound("a");
        w.0.created[0].deleted = true;
        w.0.claims[0].deleting = true;
        w.0.claims[0].finalizers.push(CLONE_SOURCE_FINALIZER.into());
        // Nothing waits for it: stuck, its PV not reclaimed, and its protection left behind.
        assert_eq!(
            w.violations(),
            BTreeMap::from([(DELETED_GONE, 1), (RECLAIMED, 1), (SOURCES_RELEASED, 1)])
        );
        // A clone of it still pending (refused while its source is being deleted) holds it.
        w.0.created.push(CreatedClaim {
            name: "k".into(),
            uid: "u-k".into(),
            deleted: false,
            source: Some(DataSource {
                kind: SourceKind::Claim,
                name: "a".into(),
                uid: "u-a".into(),
                deleted: true,
            }),
        });
        w.0.claims.push(ClaimState {
            name: "k".into(),
            uid: "u-k".into(),
            phase: "Pending".into(),
            volume_name: None,
            deleting: false,
            finalizers: Vec::new(),
            data_source: Some((CLAIM_KIND.into(), "a".into())),
            selected_node: None,
        });
        assert_eq!(w.violations(), BTreeMap::new());
    }
}
