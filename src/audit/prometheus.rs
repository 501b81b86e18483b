//! The report as Prometheus series (`--output=prometheus`), for node-exporter's textfile
//! collector or a push: one gauge per kind of finding (0 included), the counts the audit
//! compared, whether the audit could be made, and when it ran. Text format 0.0.4, written here
//! in a fixed order (prometheus-client's families come out in hash order; a file diffed or
//! read by a person should not reshuffle from run to run).

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;

use super::findings::{Finding, InProgress, Report};

/// Every series' name starts with this.
pub const PREFIX: &str = "csi_provisioner_audit_";

/// The kinds of finding, as `--output=json` names them: each has a series, 0 when none was found.
pub const FINDING_KINDS: [&str; 3] = ["orphanedVolume", "missingVolume", "staleIntent"];

/// The kinds of half-done work (not findings), named as in `--output=json`.
pub const IN_PROGRESS_KINDS: [&str; 2] = ["volumeBeingProvisioned", "volumeBeingDeleted"];

/// The series of one run, as text.
struct Exposition {
    text: String,
    /// `driver="…"`, escaped.
    driver: String,
}

impl Exposition {
    fn new(driver: &str) -> Exposition {
        Exposition {
            text: String::new(),
            driver: format!("driver=\"{}\"", escape(driver)),
        }
    }

    /// A gauge family's header, then one sample per `(extra labels, value)`.
    fn gauge(&mut self, name: &str, help: &str, samples: &[(String, f64)]) {
        let t = &mut self.text;
        let _ = writeln!(t, "# HELP {PREFIX}{name} {help}");
        let _ = writeln!(t, "# TYPE {PREFIX}{name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(t, "{PREFIX}{name}{{{}{labels}}} {value}", self.driver);
        }
    }

    /// A gauge with only the driver label.
    fn single(&mut self, name: &str, help: &str, value: f64) {
        self.gauge(name, help, &[(String::new(), value)]);
    }

    /// One sample per kind, each kind present (0 when `count` finds none).
    fn per_kind(&mut self, name: &str, help: &str, kinds: &[&str], count: impl Fn(&str) -> usize) {
        let samples: Vec<(String, f64)> = kinds
            .iter()
            .map(|kind| (format!(",kind=\"{kind}\""), count(kind) as f64))
            .collect();
        self.gauge(name, help, &samples);
    }

    /// Whether the run could be made, and when it ended.
    fn outcome(mut self, success: bool, at: Timestamp) -> String {
        self.single(
            "success",
            "Whether the last audit could be made (1) or not (0: the driver or the API server failed it).",
            f64::from(u8::from(success)),
        );
        self.single(
            "last_run_timestamp_seconds",
            "When the last audit ended, in seconds since the Unix epoch.",
            at.as_millisecond() as f64 / 1000.0,
        );
        self.text
    }
}

/// The series of a report, as of `at` (when it was made).
pub fn exposition(report: &Report, at: Timestamp) -> String {
    let mut out = Exposition::new(&report.driver);
    out.per_kind(
        "findings",
        "Findings of the last audit, by kind (orphanedVolume, missingVolume, staleIntent).",
        &FINDING_KINDS,
        |kind| {
            report
                .findings
                .iter()
                .filter(|f| kind_of(f) == kind)
                .count()
        },
    );
    out.per_kind(
        "in_progress",
        "Half-done work seen by the last audit, by kind: not findings.",
        &IN_PROGRESS_KINDS,
        |kind| {
            report
                .in_progress
                .iter()
                .filter(|i| in_progress_kind(i) == kind)
                .count()
        },
    );
    out.single(
        "list_volumes",
        "Whether the driver listed its volumes (1); 0: no LIST_VOLUMES, volumes were not compared.",
        f64::from(u8::from(report.list_volumes)),
    );
    let counts = [
        (
            "backend_volumes",
            "Volumes the driver listed.",
            report.backend_volumes.unwrap_or(0),
        ),
        (
            "persistent_volumes",
            "PersistentVolumes of the driver.",
            report.persistent_volumes,
        ),
        (
            "claims_holding_intent",
            "Claims of the driver holding the provisioning intent, however long.",
            report.claims_holding_intent,
        ),
    ];
    for (name, help, value) in counts {
        out.single(name, help, value as f64);
    }
    out.outcome(true, at)
}

/// The series of a run that could not be made: `success` 0 and its time, with an empty
/// `driver` (the driver's name is not known before it answers).
pub fn failure(at: Timestamp) -> String {
    Exposition::new("").outcome(false, at)
}

fn kind_of(finding: &Finding) -> &'static str {
    match finding {
        Finding::OrphanedVolume { .. } => FINDING_KINDS[0],
        Finding::MissingVolume { .. } => FINDING_KINDS[1],
        Finding::StaleIntent { .. } => FINDING_KINDS[2],
    }
}

fn in_progress_kind(item: &InProgress) -> &'static str {
    match item {
        InProgress::VolumeBeingProvisioned { .. } => IN_PROGRESS_KINDS[0],
        InProgress::VolumeBeingDeleted { .. } => IN_PROGRESS_KINDS[1],
    }
}

/// A label value as the text format escapes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(findings: Vec<Finding>) -> Report {
        Report {
            in_progress: vec![InProgress::VolumeBeingDeleted {
                persistent_volume: "pvc-9".into(),
                volume_handle: "vol-9".into(),
            }],
            ..crate::audit::findings::example_report(findings)
        }
    }

    fn orphan(id: &str) -> Finding {
        Finding::OrphanedVolume {
            volume_id: id.into(),
            capacity_bytes: 1 << 30,
            claim_uid: None,
            claim: None,
        }
    }

    #[test]
    fn one_series_per_kind_zero_included_and_the_runs_outcome() {
        let at: Timestamp = "2026-12-06T07:00:00.5Z".parse().unwrap();
        let text = exposition(&report(vec![orphan("vol-1"), orphan("vol-2")]), at);
        let d = "driver=\"d.csi.example.com\"";
        for line in [
            "# TYPE csi_provisioner_audit_findings gauge".to_string(),
            format!("csi_provisioner_audit_findings{{{d},kind=\"orphanedVolume\"}} 2"),
            format!("csi_provisioner_audit_findings{{{d},kind=\"missingVolume\"}} 0"),
            format!("csi_provisioner_audit_findings{{{d},kind=\"staleIntent\"}} 0"),
            format!("csi_provisioner_audit_in_progress{{{d},kind=\"volumeBeingProvisioned\"}} 0"),
            format!("csi_provisioner_audit_in_progress{{{d},kind=\"volumeBeingDeleted\"}} 1"),
            format!("csi_provisioner_audit_list_volumes{{{d}}} 1"),
            format!("csi_provisioner_audit_backend_volumes{{{d}}} 3"),
            format!("csi_provisioner_audit_persistent_volumes{{{d}}} 2"),
            format!("csi_provisioner_audit_claims_holding_intent{{{d}}} 1"),
            format!("csi_provisioner_audit_success{{{d}}} 1"),
            format!("csi_provisioner_audit_last_run_timestamp_seconds{{{d}}} 1796540400.5"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        // Kinds in their fixed order, run after run.
        let kinds: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split("kind=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(kinds[..3], FINDING_KINDS);
        assert_eq!(kinds[3..], IN_PROGRESS_KINDS);
    }

    #[test]
    fn a_run_that_could_not_be_made_says_so_with_its_time() {
        let at: Timestamp = "2026-12-06T07:00:00Z".parse().unwrap();
        let text = failure(at);
        assert!(
            text.contains("csi_provisioner_audit_success{driver=\"\"} 0\n"),
            "{text}"
        );
        assert!(text.contains(
            "csi_provisioner_audit_last_run_timestamp_seconds{driver=\"\"} 1796540400\n"
        ));
        assert!(!text.contains("findings"), "{text}");
    }
}
