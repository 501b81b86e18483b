//! What an [`Inventory`] shows (pure, table-tested): backend volumes no
//! PersistentVolume points to, PersistentVolumes whose volume the driver no
//! longer lists, and claims holding the provisioning intent for too long.
//!
//! Things half-done for a good reason are not findings but are listed apart
//! ("in progress"): a volume whose claim still waits for it (the sidecar saves
//! the PersistentVolume right after `CreateVolume`), a PersistentVolume being
//! deleted (its volume goes first).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::collect::{Backend, Inventory, intent_member, wrote};
use crate::csi::pb;
use crate::kube::slim::Pv;
use crate::names::{PvPhase, ReclaimPolicy};
use crate::provision::{ClaimView, UidInName, migration, uid_in_name};

/// How to read an inventory.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The sidecar's `--volume-name-prefix` and `--volume-name-uuid-length`.
    pub volume_name_prefix: String,
    pub volume_name_uuid_length: Option<usize>,
    pub intent_older_than: Duration,
}

/// What the audit found.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub driver: String,
    /// Whether the driver listed its volumes (it has `LIST_VOLUMES`); without
    /// it, volumes and PersistentVolumes were not compared.
    pub list_volumes: bool,
    /// Volumes the driver listed (`None` without `LIST_VOLUMES`).
    pub backend_volumes: Option<usize>,
    /// PersistentVolumes of the driver (the second list).
    pub persistent_volumes: usize,
    /// Claims of the driver holding the provisioning intent, however long.
    pub claims_holding_intent: usize,
    #[serde(serialize_with = "go_duration")]
    pub intent_older_than: Duration,
    /// The findings were looked for again this long after the first look,
    /// and only those seen both times are reported (`None`: one look).
    #[serde(serialize_with = "optional_go_duration")]
    pub rechecked_after: Option<Duration>,
    /// Seen at the first look, gone at the second: not reported.
    pub cleared_on_recheck: usize,
    pub findings: Vec<Finding>,
    pub in_progress: Vec<InProgress>,
}

/// Something wrong, for a person to look at. The audit changes nothing.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Finding {
    /// The driver lists a volume no PersistentVolume of the driver points to.
    #[serde(rename_all = "camelCase")]
    OrphanedVolume {
        volume_id: String,
        capacity_bytes: i64,
        /// The claim UID the volume's ID carries (all of it, or its start).
        claim_uid: Option<String>,
        /// That claim, as the API server has it now.
        claim: Option<ClaimSeen>,
    },
    /// A PersistentVolume of the driver whose volume the driver does not list.
    #[serde(rename_all = "camelCase")]
    MissingVolume {
        persistent_volume: String,
        volume_handle: String,
        phase: Option<String>,
        /// `namespace/name` of its claimRef.
        claim: Option<String>,
    },
    /// A claim of the driver holding the provisioning intent for longer than
    /// `--intent-older-than`.
    #[serde(rename_all = "camelCase")]
    StaleIntent {
        claim: String,
        uid: String,
        /// When the intent was written, at the latest (see [`IntentSince`]).
        since: String,
        since_from: IntentSince,
        #[serde(serialize_with = "go_duration")]
        held_for: Duration,
        phase: Option<String>,
        volume_name: Option<String>,
        deleting: bool,
    },
}

/// The claim a volume's name points to.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum ClaimSeen {
    /// No claim has that UID (any more).
    Gone,
    /// More than one claim's UID starts with it (a short `--volume-name-uuid-length`).
    Ambiguous { count: usize },
    #[serde(rename_all = "camelCase")]
    Found {
        claim: String,
        /// `Pending`, `Bound`, `Lost` (its PersistentVolume was deleted).
        phase: Option<String>,
        /// The PersistentVolume it is bound to.
        volume_name: Option<String>,
        deleting: bool,
    },
}

/// Where the time a claim's intent was written comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum IntentSince {
    /// The claim's managedFields: the last write of the field manager that
    /// owns the intent finalizer. That write may be later than the one that
    /// added the finalizer, never earlier, so the age is never overstated.
    ManagedFields,
    /// No managedFields entry shows the finalizer: the claim's creation.
    Created,
}

/// Half-done for a good reason: not a finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum InProgress {
    /// A volume without a PersistentVolume whose claim still waits for it
    /// (or is being deleted, and the volume with it).
    #[serde(rename_all = "camelCase")]
    VolumeBeingProvisioned {
        volume_id: String,
        claim: String,
        deleting: bool,
    },
    /// A PersistentVolume being deleted whose volume is already gone.
    #[serde(rename_all = "camelCase")]
    VolumeBeingDeleted {
        persistent_volume: String,
        volume_handle: String,
    },
}

impl Finding {
    /// What makes two findings the same finding (for the recheck).
    fn key(&self) -> (&'static str, &str) {
        match self {
            Finding::OrphanedVolume { volume_id, .. } => ("orphaned", volume_id),
            Finding::MissingVolume {
                persistent_volume, ..
            } => ("missing", persistent_volume),
            Finding::StaleIntent { uid, .. } => ("intent", uid),
        }
    }
}

impl Report {
    /// This (second) look, keeping only the findings `first` also had.
    pub fn confirming(mut self, first: &Report, after: Duration) -> Report {
        let earlier: HashSet<_> = first.findings.iter().map(Finding::key).collect();
        self.findings.retain(|f| earlier.contains(&f.key()));
        let kept: HashSet<_> = self.findings.iter().map(Finding::key).collect();
        self.cleared_on_recheck = first
            .findings
            .iter()
            .filter(|f| !kept.contains(&f.key()))
            .count();
        self.rechecked_after = Some(after);
        self
    }
}

/// Reads `inventory` at time `now`.
pub fn audit(inventory: &Inventory, rules: &Rules, now: Timestamp) -> Report {
    let mut findings = Vec::new();
    let mut in_progress = Vec::new();
    if let Backend::Listed(backend) = &inventory.backend {
        orphaned_volumes(inventory, backend, rules, &mut findings, &mut in_progress);
        missing_volumes(inventory, backend, &mut findings, &mut in_progress);
    }
    let holding = stale_intents(inventory, rules, now, &mut findings);
    Report {
        driver: inventory.driver.clone(),
        list_volumes: matches!(inventory.backend, Backend::Listed(_)),
        backend_volumes: match &inventory.backend {
            Backend::Listed(v) => Some(v.len()),
            Backend::Unlisted => None,
        },
        persistent_volumes: inventory.volumes_after.len(),
        claims_holding_intent: holding,
        intent_older_than: rules.intent_older_than,
        rechecked_after: None,
        cleared_on_recheck: 0,
        findings,
        in_progress,
    }
}

/// The volume handle a PersistentVolume points to: its CSI source's, or its
/// migrated in-tree source's as the volume path reads it for `DeleteVolume`.
/// `None` for one whose in-tree source does not translate (it points to no
/// volume the driver could list).
fn handle_of(pv: &Pv) -> Option<String> {
    migration::volume_handle(pv).and_then(Result::ok)
}

/// Backend volumes no PersistentVolume of either list points to: findings,
/// or in progress when their claim still waits for them.
fn orphaned_volumes(
    inventory: &Inventory,
    backend: &BTreeMap<String, pb::Volume>,
    rules: &Rules,
    findings: &mut Vec<Finding>,
    in_progress: &mut Vec<InProgress>,
) {
    let pointed_to: HashSet<String> = inventory
        .volumes_before
        .iter()
        .chain(&inventory.volumes_after)
        .filter_map(handle_of)
        .collect();
    let claims_by_uid: HashMap<&str, &PersistentVolumeClaim> = inventory
        .claims
        .iter()
        .map(|c| (ClaimView(c).uid(), c))
        .collect();
    for volume in backend.values() {
        if pointed_to.contains(&volume.volume_id) {
            continue;
        }
        let uid = volume_name_in(volume, rules);
        let claim = uid
            .as_ref()
            .map(|uid| claim_seen(uid, &claims_by_uid, &inventory.claims));
        if let Some(ClaimSeen::Found {
            claim,
            volume_name: None,
            deleting,
            ..
        }) = &claim
        {
            in_progress.push(InProgress::VolumeBeingProvisioned {
                volume_id: volume.volume_id.clone(),
                claim: claim.clone(),
                deleting: *deleting,
            });
            continue;
        }
        findings.push(Finding::OrphanedVolume {
            volume_id: volume.volume_id.clone(),
            capacity_bytes: volume.capacity_bytes,
            claim_uid: uid.map(|u| u.as_str().to_string()),
            claim,
        });
    }
}

/// PersistentVolumes of the second list whose volume the driver does not
/// list: findings, or in progress when they are being deleted.
fn missing_volumes(
    inventory: &Inventory,
    backend: &BTreeMap<String, pb::Volume>,
    findings: &mut Vec<Finding>,
    in_progress: &mut Vec<InProgress>,
) {
    let before: HashSet<&str> = inventory
        .volumes_before
        .iter()
        .filter_map(|pv| pv.metadata.uid.as_deref())
        .collect();
    for pv in &inventory.volumes_after {
        let Some(handle) = handle_of(pv) else {
            continue;
        };
        // Only a PersistentVolume that existed during the whole listing
        // can have been missed by it.
        let throughout = pv
            .metadata
            .uid
            .as_deref()
            .is_some_and(|uid| before.contains(uid));
        if !throughout || backend.contains_key(&handle) {
            continue;
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        if is_being_deleted(pv) {
            in_progress.push(InProgress::VolumeBeingDeleted {
                persistent_volume: name,
                volume_handle: handle,
            });
            continue;
        }
        findings.push(Finding::MissingVolume {
            persistent_volume: name,
            volume_handle: handle,
            phase: pv.status.as_ref().and_then(|s| s.phase.clone()),
            claim: pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .map(|r| {
                    format!(
                        "{}/{}",
                        r.namespace.as_deref().unwrap_or_default(),
                        r.name.as_deref().unwrap_or_default()
                    )
                }),
        });
    }
}

/// Claims of the driver holding the intent longer than the rules allow, as
/// findings; returns how many hold it at all.
fn stale_intents(
    inventory: &Inventory,
    rules: &Rules,
    now: Timestamp,
    findings: &mut Vec<Finding>,
) -> usize {
    let holding: Vec<&PersistentVolumeClaim> = inventory
        .claims
        .iter()
        .filter(|c| ClaimView(c).holds_intent() && ClaimView(c).asks(&inventory.driver))
        .collect();
    for claim in &holding {
        let view = ClaimView(claim);
        let Some((since, since_from)) = intent_since(claim) else {
            continue;
        };
        let held_for = Duration::from_millis(
            u64::try_from(now.as_millisecond() - since.as_millisecond()).unwrap_or(0),
        );
        if held_for <= rules.intent_older_than {
            continue;
        }
        findings.push(Finding::StaleIntent {
            claim: view.key(),
            uid: view.uid().to_string(),
            since: since.to_string(),
            since_from,
            held_for,
            phase: claim.status.as_ref().and_then(|s| s.phase.clone()),
            volume_name: view.volume_name().map(str::to_string),
            deleting: view.is_deleting(),
        });
    }
    holding.len()
}

/// The claim UID a volume carries: in its ID, else in a value of its
/// context (some drivers keep the `CreateVolume` name there).
fn volume_name_in(volume: &pb::Volume, rules: &Rules) -> Option<UidInName> {
    let find = |text: &str| {
        uid_in_name(
            text,
            &rules.volume_name_prefix,
            rules.volume_name_uuid_length,
        )
    };
    find(&volume.volume_id).or_else(|| {
        let mut context: Vec<(&String, &String)> = volume.volume_context.iter().collect();
        context.sort();
        context.into_iter().find_map(|(_, v)| find(v))
    })
}

fn claim_seen(
    uid: &UidInName,
    by_uid: &HashMap<&str, &PersistentVolumeClaim>,
    claims: &[PersistentVolumeClaim],
) -> ClaimSeen {
    let matching: Vec<&PersistentVolumeClaim> = match uid {
        UidInName::Whole(u) => by_uid
            .get(u.to_ascii_lowercase().as_str())
            .copied()
            .into_iter()
            .collect(),
        UidInName::Start(_) => claims
            .iter()
            .filter(|c| uid.matches(ClaimView(c).uid()))
            .collect(),
    };
    match matching.as_slice() {
        [] => ClaimSeen::Gone,
        [claim] => {
            let view = ClaimView(claim);
            ClaimSeen::Found {
                claim: view.key(),
                phase: claim.status.as_ref().and_then(|s| s.phase.clone()),
                volume_name: view.volume_name().map(str::to_string),
                deleting: view.is_deleting(),
            }
        }
        many => ClaimSeen::Ambiguous { count: many.len() },
    }
}

/// Being deleted, or released with reclaim policy Delete: the volume path
/// deletes the volume before the PersistentVolume goes.
fn is_being_deleted(pv: &Pv) -> bool {
    let released_for_deletion = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .and_then(PvPhase::parse)
        == Some(PvPhase::Released)
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .and_then(ReclaimPolicy::parse)
            == Some(ReclaimPolicy::Delete);
    pv.metadata.deletion_timestamp.is_some() || released_for_deletion
}

/// When the claim's intent was written, at the latest: the newest
/// managedFields entry whose field set holds the intent finalizer, else the
/// claim's creation.
pub fn intent_since(claim: &PersistentVolumeClaim) -> Option<(Timestamp, IntentSince)> {
    let member = intent_member();
    let owner_wrote = claim
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| wrote(entry, &member))
        .filter_map(|entry| entry.time.as_ref().map(|t| t.0))
        .max();
    owner_wrote
        .map(|t| (t, IntentSince::ManagedFields))
        .or_else(|| {
            claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| (t.0, IntentSince::Created))
        })
}

fn go_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::duration::format_go_duration(*d))
}

fn optional_go_duration<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => go_duration(d, s),
        None => s.serialize_none(),
    }
}

/// A report of `d.csi.example.com` with these findings, for the renderers' tests.
#[cfg(test)]
pub(super) fn example_report(findings: Vec<Finding>) -> Report {
    Report {
        driver: "d.csi.example.com".into(),
        list_volumes: true,
        backend_volumes: Some(3),
        persistent_volumes: 2,
        claims_holding_intent: 1,
        intent_older_than: Duration::from_secs(600),
        rechecked_after: None,
        cleared_on_recheck: 0,
        findings,
        in_progress: vec![],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::audit::collect::for_findings;
    use crate::keys;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimStatus;

    const DRIVER: &str = "audit.csi.example.com";
    const UID_A: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
    const UID_B: &str = "1b2c3d4e-5f60-789a-bcde-f0123456789a";

    fn rules() -> Rules {
        Rules {
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: None,
            intent_older_than: Duration::from_secs(600),
        }
    }

    fn volume(id: &str) -> pb::Volume {
        pb::Volume {
            volume_id: id.into(),
            capacity_bytes: 1 << 30,
            ..Default::default()
        }
    }

    fn pv(name: &str, uid: &str, handle: &str, phase: &str) -> Pv {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"csi": {"driver": DRIVER, "volumeHandle": handle},
                     "persistentVolumeReclaimPolicy": "Delete",
                     "claimRef": {"namespace": "ns", "name": "data"}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn claim(name: &str, uid: &str, extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut c = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {keys::ANN_STORAGE_PROVISIONER: DRIVER}},
            "spec": {},
            "status": {"phase": "Pending"}
        });
        merge(&mut c, extra);
        serde_json::from_value(c).unwrap()
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn inventory(
        volumes: &[&str],
        before: Vec<Pv>,
        after: Vec<Pv>,
        claims: Vec<PersistentVolumeClaim>,
    ) -> Inventory {
        Inventory {
            driver: DRIVER.into(),
            backend: Backend::Listed(
                volumes
                    .iter()
                    .map(|id| (id.to_string(), volume(id)))
                    .collect::<BTreeMap<_, _>>(),
            ),
            // As the audit collects them: PVs trimmed, claims cut.
            volumes_before: before.into_iter().map(trimmed).collect(),
            volumes_after: after.into_iter().map(trimmed).collect(),
            claims: claims.into_iter().map(for_findings).collect(),
        }
    }

    fn trimmed(mut pv: Pv) -> Pv {
        pv.trim();
        pv
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn kinds(report: &Report) -> Vec<String> {
        report
            .findings
            .iter()
            .map(|f| {
                serde_json::to_value(f).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn every_volume_with_its_persistent_volume_is_clean() {
        let pvs = vec![pv("pvc-a", "u1", "vol-1", "Bound")];
        let inv = inventory(&["vol-1"], pvs.clone(), pvs, vec![]);
        let report = audit(&inv, &rules(), at("2026-01-01T00:00:00Z"));
        assert_eq!(report.findings, vec![]);
        assert_eq!(report.in_progress, vec![]);
        assert_eq!(report.backend_volumes, Some(1));
        assert_eq!(report.persistent_volumes, 1);
    }

    #[test]
    fn a_volume_without_a_persistent_volume_says_which_claim_its_id_names() {
        let gone = format!("vol-1-pvc-{UID_A}");
        let bound_elsewhere = format!("vol-2-pvc-{UID_B}");
        let claims = vec![claim(
            "data",
            UID_B,
            json!({"spec": {"volumeName": "pvc-other"}, "status": {"phase": "Bound"}}),
        )];
        let inv = inventory(
            &[&gone, &bound_elsewhere, "anonymous"],
            vec![],
            vec![],
            claims,
        );
        let report = audit(&inv, &rules(), at("2026-01-01T00:00:00Z"));
        assert_eq!(
            report.findings,
            vec![
                Finding::OrphanedVolume {
                    volume_id: "anonymous".into(),
                    capacity_bytes: 1 << 30,
                    claim_uid: None,
                    claim: None,
                },
                Finding::OrphanedVolume {
                    volume_id: gone.clone(),
                    capacity_bytes: 1 << 30,
                    claim_uid: Some(UID_A.into()),
                    claim: Some(ClaimSeen::Gone),
                },
                Finding::OrphanedVolume {
                    volume_id: bound_elsewhere.clone(),
                    capacity_bytes: 1 << 30,
                    claim_uid: Some(UID_B.into()),
                    claim: Some(ClaimSeen::Found {
                        claim: "ns/data".into(),
                        phase: Some("Bound".into()),
                        volume_name: Some("pvc-other".into()),
                        deleting: false,
                    }),
                },
            ]
        );
    }

    #[test]
    fn the_claim_uid_is_also_found_in_the_volume_context_and_by_its_start() {
        let mut v = volume("opaque-id");
        v.volume_context
            .insert("name".into(), "pvc-0a1b2c3d4e5f".into());
        let inv = Inventory {
            backend: Backend::Listed(BTreeMap::from([("opaque-id".into(), v)])),
            ..inventory(
                &[],
                vec![],
                vec![],
                vec![claim("data", UID_A, json!({"spec": {"volumeName": "x"}}))],
            )
        };
        let short = Rules {
            volume_name_uuid_length: Some(12),
            ..rules()
        };
        let report = audit(&inv, &short, at("2026-01-01T00:00:00Z"));
        let [
            Finding::OrphanedVolume {
                claim_uid, claim, ..
            },
        ] = report.findings.as_slice()
        else {
            panic!("{report:?}");
        };
        assert_eq!(claim_uid.as_deref(), Some("0a1b2c3d4e5f"));
        assert!(matches!(claim, Some(ClaimSeen::Found { claim, .. }) if claim == "ns/data"));
    }

    #[test]
    fn a_volume_whose_claim_still_waits_for_it_is_in_progress_not_a_finding() {
        let id = format!("vol-1-pvc-{UID_A}");
        let deleting = format!("vol-2-pvc-{UID_B}");
        let claims = vec![
            claim("new", UID_A, json!({})),
            claim(
                "leaving",
                UID_B,
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
        ];
        let inv = inventory(&[&id, &deleting], vec![], vec![], claims);
        let report = audit(&inv, &rules(), at("2026-01-01T00:00:00Z"));
        assert_eq!(report.findings, vec![]);
        assert_eq!(
            report.in_progress,
            vec![
                InProgress::VolumeBeingProvisioned {
                    volume_id: id,
                    claim: "ns/new".into(),
                    deleting: false,
                },
                InProgress::VolumeBeingProvisioned {
                    volume_id: deleting,
                    claim: "ns/leaving".into(),
                    deleting: true,
                },
            ]
        );
    }

    #[test]
    fn a_persistent_volume_seen_in_either_list_covers_its_volume() {
        // Created during the listing (only in the second list), or deleted
        // during it (only in the first): either way the volume had a PV.
        let inv = inventory(
            &["vol-1", "vol-2"],
            vec![pv("pvc-a", "u1", "vol-1", "Bound")],
            vec![pv("pvc-b", "u2", "vol-2", "Bound")],
            vec![],
        );
        assert_eq!(
            audit(&inv, &rules(), at("2026-01-01T00:00:00Z")).findings,
            vec![]
        );
    }

    #[test]
    fn a_persistent_volume_whose_volume_is_not_listed_is_a_finding_only_if_it_existed_throughout() {
        let lost = pv("pvc-lost", "u1", "vol-1", "Bound");
        let created_meanwhile = pv("pvc-new", "u2", "vol-2", "Bound");
        let mut deleting = pv("pvc-del", "u3", "vol-3", "Bound");
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at("2026-01-01T00:00:00Z")),
        );
        let released = pv("pvc-rel", "u4", "vol-4", "Released");
        let inv = inventory(
            &[],
            vec![lost.clone(), deleting.clone(), released.clone()],
            vec![lost, created_meanwhile, deleting, released],
            vec![],
        );
        let report = audit(&inv, &rules(), at("2026-01-01T00:00:00Z"));
        assert_eq!(
            report.findings,
            vec![Finding::MissingVolume {
                persistent_volume: "pvc-lost".into(),
                volume_handle: "vol-1".into(),
                phase: Some("Bound".into()),
                claim: Some("ns/data".into()),
            }]
        );
        assert_eq!(
            report.in_progress,
            vec![
                InProgress::VolumeBeingDeleted {
                    persistent_volume: "pvc-del".into(),
                    volume_handle: "vol-3".into(),
                },
                InProgress::VolumeBeingDeleted {
                    persistent_volume: "pvc-rel".into(),
                    volume_handle: "vol-4".into(),
                },
            ]
        );
    }

    /// A PV of the in-tree EBS plugin, as the sidecar saves one for a claim of
    /// an in-tree class migrated to `ebs.csi.aws.com`.
    fn in_tree_pv(name: &str, uid: &str, volume_id: &str, phase: &str) -> Pv {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid, "annotations": {
                keys::ANN_PROVISIONED_BY: "kubernetes.io/aws-ebs",
                keys::ANN_MIGRATED_TO: "ebs.csi.aws.com"}},
            "spec": {"awsElasticBlockStore": {"volumeID": volume_id, "fsType": "ext4"},
                     "persistentVolumeReclaimPolicy": "Delete",
                     "claimRef": {"namespace": "ns", "name": "data"}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn a_migrated_in_tree_persistent_volume_points_to_its_translated_volume() {
        // The driver lists EBS volume ids; the in-tree PVs name them as the
        // in-tree plugin did, `aws://<zone>/<id>` or bare.
        let pvs = vec![
            in_tree_pv("pvc-a", "u1", "aws://us-east-1a/vol-0abc", "Bound"),
            in_tree_pv("pvc-b", "u2", "vol-0def", "Bound"),
        ];
        let inv = Inventory {
            driver: "ebs.csi.aws.com".into(),
            ..inventory(&["vol-0abc"], pvs.clone(), pvs, vec![])
        };
        let report = audit(&inv, &rules(), at("2026-01-01T00:00:00Z"));
        assert_eq!(
            report.findings,
            vec![Finding::MissingVolume {
                persistent_volume: "pvc-b".into(),
                volume_handle: "vol-0def".into(),
                phase: Some("Bound".into()),
                claim: Some("ns/data".into()),
            }]
        );
    }

    fn intent_claim(
        name: &str,
        uid: &str,
        managed_at: Option<&str>,
        provisioner: &str,
    ) -> PersistentVolumeClaim {
        let mut extra = json!({"metadata": {
            "finalizers": [keys::FINALIZER_PVC_INTENT],
            "annotations": {keys::ANN_STORAGE_PROVISIONER: provisioner},
        }});
        if let Some(t) = managed_at {
            let member = format!("v:\"{}\"", keys::FINALIZER_PVC_INTENT);
            extra["metadata"]["managedFields"] = json!([
                {"manager": "kube-controller-manager", "operation": "Update",
                 "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {}}}},
                {"manager": "csi-provisioner", "operation": "Update", "time": t,
                 "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:finalizers": {".": {}, member: {}}}}},
            ]);
        }
        claim(name, uid, extra)
    }

    #[test]
    fn a_claim_cut_for_the_findings_keeps_the_intents_write_and_nothing_unread() {
        let mut whole = intent_claim("c", UID_A, Some("2026-01-01T00:40:00Z"), DRIVER);
        whole.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
        let spec = whole.spec.get_or_insert_default();
        spec.storage_class_name = Some("fast".into());
        spec.volume_name = Some("pvc-1".into());
        let ann = whole.metadata.annotations.get_or_insert_default();
        ann.insert("example.com/note".into(), "x".repeat(4096));
        let cut = for_findings(whole.clone());
        assert_eq!(intent_since(&cut), intent_since(&whole));
        assert_eq!(
            intent_since(&cut).map(|(_, from)| from),
            Some(IntentSince::ManagedFields)
        );
        let (c, w) = (ClaimView(&cut), ClaimView(&whole));
        assert_eq!(
            (
                c.key(),
                c.uid(),
                c.volume_name(),
                c.holds_intent(),
                c.asks(DRIVER)
            ),
            (
                w.key(),
                w.uid(),
                w.volume_name(),
                w.holds_intent(),
                w.asks(DRIVER)
            )
        );
        assert_eq!(
            cut.status,
            whole.status.map(|s| PersistentVolumeClaimStatus {
                phase: s.phase,
                ..Default::default()
            })
        );
        let entries = cut.metadata.managed_fields.as_deref().unwrap_or_default();
        assert_eq!(entries.len(), 1, "only the intent's writer: {entries:?}");
        assert!(cut.metadata.labels.is_none());
        assert_eq!(
            cut.metadata.annotations.unwrap().len(),
            1,
            "its provisioner"
        );
        assert_eq!(cut.spec.unwrap().storage_class_name, None);
    }

    #[test]
    fn a_claim_holding_the_intent_too_long_is_a_finding_timed_from_the_finalizers_write() {
        let now = at("2026-01-01T01:00:00Z");
        let claims = vec![
            // Created an hour ago, intent written 20 minutes ago: stale.
            intent_claim("old", UID_A, Some("2026-01-01T00:40:00Z"), DRIVER),
            // Created an hour ago, intent written 5 minutes ago: not yet.
            intent_claim("recent", UID_B, Some("2026-01-01T00:55:00Z"), DRIVER),
            // No managedFields: the creation time is all there is.
            intent_claim("unmanaged", "u3", None, DRIVER),
            // Another driver's claim is another sidecar's business.
            intent_claim("theirs", "u4", None, "other.csi.example.com"),
        ];
        let inv = Inventory {
            backend: Backend::Unlisted,
            ..inventory(&[], vec![], vec![], claims)
        };
        let report = audit(&inv, &rules(), now);
        assert!(!report.list_volumes);
        assert_eq!(report.backend_volumes, None);
        assert_eq!(report.claims_holding_intent, 3);
        assert_eq!(kinds(&report), vec!["staleIntent", "staleIntent"]);
        let Finding::StaleIntent {
            claim,
            since,
            since_from,
            held_for,
            phase,
            ..
        } = &report.findings[0]
        else {
            panic!()
        };
        assert_eq!(claim, "ns/old");
        assert_eq!(since, "2026-01-01T00:40:00Z");
        assert_eq!(*since_from, IntentSince::ManagedFields);
        assert_eq!(*held_for, Duration::from_secs(1200));
        assert_eq!(phase.as_deref(), Some("Pending"));
        let Finding::StaleIntent {
            claim, since_from, ..
        } = &report.findings[1]
        else {
            panic!()
        };
        assert_eq!(claim, "ns/unmanaged");
        assert_eq!(*since_from, IntentSince::Created);
    }

    #[test]
    fn the_recheck_keeps_only_what_both_looks_found() {
        let first = audit(
            &inventory(&["vol-1", "vol-2"], vec![], vec![], vec![]),
            &rules(),
            at("2026-01-01T00:00:00Z"),
        );
        assert_eq!(first.findings.len(), 2);
        // vol-1 got its PV, vol-3 is new: neither was seen twice.
        let pvs = vec![pv("pvc-a", "u1", "vol-1", "Bound")];
        let second = audit(
            &inventory(&["vol-1", "vol-2", "vol-3"], pvs.clone(), pvs, vec![]),
            &rules(),
            at("2026-01-01T00:00:05Z"),
        )
        .confirming(&first, Duration::from_secs(5));
        let [Finding::OrphanedVolume { volume_id, .. }] = second.findings.as_slice() else {
            panic!("{second:?}");
        };
        assert_eq!(volume_id, "vol-2");
        assert_eq!(second.cleared_on_recheck, 1);
        assert_eq!(second.rechecked_after, Some(Duration::from_secs(5)));
    }
}
