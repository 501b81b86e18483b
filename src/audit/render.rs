//! The report as text: sections of aligned columns for a person, or one JSON
//! document for a program (the [`Report`] as it is serialised).

use super::findings::{ClaimSeen, Finding, InProgress, Report};
use crate::duration::format_go_duration;
use crate::quantity::format_bytes;

/// The report as one pretty-printed JSON document, newline-terminated.
pub fn json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_else(|e| {
        // Serialising plain strings and numbers cannot fail; say so if it does.
        format!("{{\"error\": {:?}}}", e.to_string())
    });
    text.push('\n');
    text
}

/// The report as sections of aligned columns.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let listed = match report.backend_volumes {
        Some(n) => format!("{n} volume(s) listed by the driver"),
        None => "the driver cannot list its volumes (no LIST_VOLUMES capability): \
                 volumes and PersistentVolumes were not compared"
            .to_string(),
    };
    out.push_str(&format!(
        "Driver {}: {listed}, {} PersistentVolume(s), {} claim(s) holding the provisioning intent.\n",
        report.driver, report.persistent_volumes, report.claims_holding_intent
    ));
    let rows = |row: fn(&Finding) -> Option<Vec<String>>| -> Vec<Vec<String>> {
        report.findings.iter().filter_map(row).collect()
    };
    section(
        &mut out,
        "Volumes no PersistentVolume points to",
        &["VOLUME ID", "CAPACITY", "CLAIM UID IN ID", "CLAIM"],
        &rows(orphaned_row),
    );
    section(
        &mut out,
        "PersistentVolumes whose volume the driver does not list",
        &["PERSISTENTVOLUME", "VOLUME HANDLE", "PHASE", "CLAIM"],
        &rows(missing_row),
    );
    section(
        &mut out,
        &format!(
            "Claims holding the provisioning intent for more than {}",
            format_go_duration(report.intent_older_than)
        ),
        &["CLAIM", "HELD FOR", "PHASE", "VOLUME"],
        &rows(stale_row),
    );
    if !report.in_progress.is_empty() {
        out.push_str(&format!(
            "\nIn progress, not findings ({}):\n",
            report.in_progress.len()
        ));
        for item in &report.in_progress {
            out.push_str(&format!("  {}\n", in_progress_line(item)));
        }
    }
    out.push('\n');
    if let Some(after) = report.rechecked_after
        && report.cleared_on_recheck > 0
    {
        out.push_str(&format!(
            "{} finding(s) of the first look were gone {} later and are not reported.\n",
            report.cleared_on_recheck,
            format_go_duration(after)
        ));
    }
    match report.findings.len() {
        0 => out.push_str("No findings.\n"),
        n => out.push_str(&format!("{n} finding(s). Nothing was changed.\n")),
    }
    out
}

fn orphaned_row(finding: &Finding) -> Option<Vec<String>> {
    let Finding::OrphanedVolume {
        volume_id,
        capacity_bytes,
        claim_uid,
        claim,
    } = finding
    else {
        return None;
    };
    Some(vec![
        volume_id.clone(),
        format_bytes(*capacity_bytes),
        claim_uid.clone().unwrap_or_else(|| "-".into()),
        claim.as_ref().map_or_else(|| "-".into(), describe_claim),
    ])
}

fn missing_row(finding: &Finding) -> Option<Vec<String>> {
    let Finding::MissingVolume {
        persistent_volume,
        volume_handle,
        phase,
        claim,
    } = finding
    else {
        return None;
    };
    Some(vec![
        persistent_volume.clone(),
        volume_handle.clone(),
        phase.clone().unwrap_or_else(|| "-".into()),
        claim.clone().unwrap_or_else(|| "-".into()),
    ])
}

fn stale_row(finding: &Finding) -> Option<Vec<String>> {
    let Finding::StaleIntent {
        claim,
        held_for,
        phase,
        volume_name,
        deleting,
        ..
    } = finding
    else {
        return None;
    };
    Some(vec![
        claim.clone(),
        format!("{}+", format_go_duration(whole_seconds(*held_for))),
        match (deleting, phase) {
            (true, _) => "being deleted".to_string(),
            (false, Some(p)) => p.clone(),
            (false, None) => "-".to_string(),
        },
        volume_name.clone().unwrap_or_else(|| "-".into()),
    ])
}

fn in_progress_line(item: &InProgress) -> String {
    match item {
        InProgress::VolumeBeingProvisioned {
            volume_id,
            claim,
            deleting: false,
        } => format!("volume {volume_id}: claim {claim} still waits for it"),
        InProgress::VolumeBeingProvisioned {
            volume_id,
            claim,
            deleting: true,
        } => format!("volume {volume_id}: claim {claim} is being deleted, and the volume with it"),
        InProgress::VolumeBeingDeleted {
            persistent_volume,
            volume_handle,
        } => format!(
            "PersistentVolume {persistent_volume}: being deleted, its volume {volume_handle} already is"
        ),
    }
}

fn describe_claim(claim: &ClaimSeen) -> String {
    match claim {
        ClaimSeen::Gone => "gone".into(),
        ClaimSeen::Ambiguous { count } => format!("{count} claims match"),
        ClaimSeen::Found {
            claim,
            phase,
            volume_name,
            deleting,
        } => {
            let mut state: Vec<String> = Vec::new();
            if *deleting {
                state.push("being deleted".into());
            }
            state.extend(phase.clone());
            state.extend(volume_name.as_ref().map(|pv| format!("volume {pv}")));
            if state.is_empty() {
                claim.clone()
            } else {
                format!("{claim} ({})", state.join(", "))
            }
        }
    }
}

/// A held-for time shown to the second (the "+" after it says "at least").
fn whole_seconds(d: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(d.as_secs())
}

/// One titled section of aligned columns; nothing when `rows` is empty.
fn section(out: &mut String, title: &str, header: &[&str], rows: &[Vec<String>]) {
    if rows.is_empty() {
        return;
    }
    out.push_str(&format!("\n{title} ({}):\n", rows.len()));
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text = String::from("  ");
        let last = cells.len().saturating_sub(1);
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            text.push_str(cell);
            if i < last {
                text.push_str(&" ".repeat(w - cell.chars().count() + 2));
            }
        }
        text.push('\n');
        text
    };
    out.push_str(&line(header.to_vec()));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::audit::findings::IntentSince;

    fn report(findings: Vec<Finding>) -> Report {
        crate::audit::findings::example_report(findings)
    }

    fn all_kinds() -> Vec<Finding> {
        vec![
            Finding::OrphanedVolume {
                volume_id: "vol-1".into(),
                capacity_bytes: 1 << 30,
                claim_uid: Some("u-1".into()),
                claim: Some(ClaimSeen::Gone),
            },
            Finding::MissingVolume {
                persistent_volume: "pvc-2".into(),
                volume_handle: "vol-2".into(),
                phase: Some("Bound".into()),
                claim: Some("ns/data".into()),
            },
            Finding::StaleIntent {
                claim: "ns/stuck".into(),
                uid: "u-3".into(),
                since: "2026-01-01T00:00:00Z".into(),
                since_from: IntentSince::ManagedFields,
                held_for: Duration::from_millis(754_900),
                phase: Some("Pending".into()),
                volume_name: None,
                deleting: false,
            },
        ]
    }

    #[test]
    fn the_table_has_one_aligned_section_per_kind_of_finding() {
        let text = table(&report(all_kinds()));
        let want = "\
Driver d.csi.example.com: 3 volume(s) listed by the driver, 2 PersistentVolume(s), 1 claim(s) holding the provisioning intent.

Volumes no PersistentVolume points to (1):
  VOLUME ID  CAPACITY  CLAIM UID IN ID  CLAIM
  vol-1      1Gi       u-1              gone

PersistentVolumes whose volume the driver does not list (1):
  PERSISTENTVOLUME  VOLUME HANDLE  PHASE  CLAIM
  pvc-2             vol-2          Bound  ns/data

Claims holding the provisioning intent for more than 10m0s (1):
  CLAIM     HELD FOR  PHASE    VOLUME
  ns/stuck  12m34s+   Pending  -

3 finding(s). Nothing was changed.
";
        assert_eq!(text, want);
        assert!(table(&report(vec![])).ends_with("\nNo findings.\n"));
    }

    #[test]
    fn a_claim_named_by_a_volume_is_described_by_its_state() {
        let found = |phase: Option<&str>, pv: Option<&str>, deleting| ClaimSeen::Found {
            claim: "ns/data".into(),
            phase: phase.map(String::from),
            volume_name: pv.map(String::from),
            deleting,
        };
        let table = [
            (
                found(Some("Lost"), Some("pvc-1"), false),
                "ns/data (Lost, volume pvc-1)",
            ),
            (
                found(Some("Bound"), Some("pvc-1"), true),
                "ns/data (being deleted, Bound, volume pvc-1)",
            ),
            (found(None, None, false), "ns/data"),
            (ClaimSeen::Gone, "gone"),
            (ClaimSeen::Ambiguous { count: 2 }, "2 claims match"),
        ];
        for (claim, want) in table {
            assert_eq!(describe_claim(&claim), want);
        }
    }

    #[test]
    fn json_names_each_finding_by_kind_in_camel_case() {
        let value: serde_json::Value = serde_json::from_str(&json(&report(all_kinds()))).unwrap();
        assert_eq!(value["driver"], "d.csi.example.com");
        assert_eq!(value["listVolumes"], true);
        assert_eq!(value["intentOlderThan"], "10m0s");
        assert!(value.get("recheckedAfter").is_some_and(|v| v.is_null()));
        assert_eq!(value["clearedOnRecheck"], 0);
        let f = &value["findings"];
        assert_eq!(f[0]["kind"], "orphanedVolume");
        assert_eq!(f[0]["claim"]["state"], "gone");
        assert_eq!(f[0]["claimUid"], "u-1");
        assert_eq!(f[1]["kind"], "missingVolume");
        assert_eq!(f[1]["persistentVolume"], "pvc-2");
        assert_eq!(f[2]["kind"], "staleIntent");
        assert_eq!(f[2]["heldFor"], "12m34.9s");
        assert_eq!(f[2]["sinceFrom"], "managedFields");
    }
}
