//! The report of `csi-provisioner check`: text for a person, or JSON of a
//! documented, stable shape (README, "csi-provisioner check"). Both are built
//! from the same [`Report`], which holds only what happened.

use serde::Serialize;

use super::judge::{CheckId, Outcome, Verdict};
use super::session::Cleanup;

/// The version of the JSON shape; raised when a field changes meaning or goes.
pub const JSON_VERSION: u32 = 1;

#[derive(Clone, Debug)]
pub struct Report {
    pub address: String,
    pub timeout: String,
    /// `name version`, when GetPluginInfo answered.
    pub driver: Option<DriverInfo>,
    /// Every check, in [`CheckId::ALL`] order.
    pub checks: Vec<(CheckId, Outcome)>,
    pub cleanup: Cleanup,
    pub interrupted: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DriverInfo {
    pub name: String,
    pub vendor_version: String,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    version: u32,
    csi_address: &'a str,
    timeout: &'a str,
    driver: Option<&'a DriverInfo>,
    checks: Vec<JsonCheck<'a>>,
    summary: Summary,
    volumes: &'a Cleanup,
    interrupted: bool,
}

#[derive(Serialize)]
struct JsonCheck<'a> {
    id: &'static str,
    rule: &'static str,
    result: Verdict,
    detail: &'a str,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Report {
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        for (_, o) in &self.checks {
            match o.verdict {
                Verdict::Pass => s.passed += 1,
                Verdict::Fail => s.failed += 1,
                Verdict::Skip => s.skipped += 1,
            }
        }
        s
    }

    /// Whether every check passed or was skipped, nothing is left behind and
    /// the run was not interrupted: exit status 0.
    pub fn success(&self) -> bool {
        self.summary().failed == 0 && self.cleanup.left.is_empty() && !self.interrupted
    }

    pub fn json(&self) -> String {
        let report = JsonReport {
            version: JSON_VERSION,
            csi_address: &self.address,
            timeout: &self.timeout,
            driver: self.driver.as_ref(),
            checks: self
                .checks
                .iter()
                .map(|(id, o)| JsonCheck {
                    id: id.id(),
                    rule: id.rule(),
                    result: o.verdict,
                    detail: &o.detail,
                })
                .collect(),
            summary: self.summary(),
            volumes: &self.cleanup,
            interrupted: self.interrupted,
        };
        let mut text = serde_json::to_string_pretty(&report).unwrap_or_else(|e| {
            // Only plain strings, numbers and booleans: cannot fail.
            format!("{{\"error\":\"cannot encode the report: {e}\"}}")
        });
        text.push('\n');
        text
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let driver = match &self.driver {
            Some(d) if d.vendor_version.is_empty() => d.name.clone(),
            Some(d) => format!("{} {}", d.name, d.vendor_version),
            None => "a driver that did not name itself".to_string(),
        };
        out.push_str(&format!(
            "Checked {driver} at {} (--timeout={})\n\n",
            self.address, self.timeout
        ));
        let width = CheckId::ALL.iter().map(|c| c.id().len()).max().unwrap_or(0);
        for (id, o) in &self.checks {
            let label = match o.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
                Verdict::Skip => "SKIP",
            };
            out.push_str(&format!("{label}  {:width$}  {}\n", id.id(), id.rule()));
            out.push_str(&format!("      {:width$}  {}\n", "", o.detail));
        }
        out.push('\n');
        let created = &self.cleanup.created;
        let deleted = created.iter().filter(|c| c.deleted).count();
        if created.is_empty() {
            out.push_str("Volumes: none created.\n");
        } else {
            let names: Vec<String> = created
                .iter()
                .map(|c| format!("{} ({})", c.name, c.volume_id))
                .collect();
            out.push_str(&format!(
                "Volumes: created {}, deleted {deleted}: {}\n",
                created.len(),
                names.join(", ")
            ));
        }
        for left in &self.cleanup.left {
            out.push_str(&format!("LEFT  {}: {}\n", left.name, left.reason));
        }
        if self.interrupted {
            out.push_str("Interrupted: the checks not run are skipped.\n");
        }
        let s = self.summary();
        out.push_str(&format!(
            "Result: {} checks, {} passed, {} failed, {} skipped.\n",
            self.checks.len(),
            s.passed,
            s.failed,
            s.skipped
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::session::{CreatedVolume, LeftVolume};

    fn report(outcomes: &[Outcome], left: bool) -> Report {
        Report {
            address: "/run/csi.sock".into(),
            timeout: "10s".into(),
            driver: Some(DriverInfo {
                name: "d.example.com".into(),
                vendor_version: "1.2".into(),
            }),
            checks: CheckId::ALL
                .iter()
                .copied()
                .zip(outcomes.iter().cloned())
                .collect(),
            cleanup: Cleanup {
                created: vec![CreatedVolume {
                    name: "check-1-a".into(),
                    volume_id: "v1".into(),
                    deleted: !left,
                }],
                left: if left {
                    vec![LeftVolume {
                        name: "check-1-a".into(),
                        reason: "volume v1: DeleteVolume still answers INTERNAL: x".into(),
                    }]
                } else {
                    vec![]
                },
            },
            interrupted: false,
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let r = report(
            &[Outcome::pass("ok"), Outcome::fail("no"), Outcome::skip("?")],
            false,
        );
        let v: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["csi_address"], "/run/csi.sock");
        assert_eq!(v["driver"]["name"], "d.example.com");
        assert_eq!(v["checks"][0]["id"], "probe");
        assert_eq!(v["checks"][1]["result"], "fail");
        assert_eq!(v["checks"][1]["detail"], "no");
        assert_eq!(v["checks"][2]["result"], "skip");
        assert_eq!(v["summary"]["failed"], 1);
        assert_eq!(v["volumes"]["created"][0]["volume_id"], "v1");
        assert_eq!(v["volumes"]["created"][0]["deleted"], true);
        assert_eq!(v["interrupted"], false);
        assert!(!r.success());
    }

    #[test]
    fn a_volume_left_behind_is_shown_and_is_not_success() {
        let all_pass: Vec<Outcome> = CheckId::ALL.iter().map(|_| Outcome::pass("ok")).collect();
        assert!(report(&all_pass, false).success());
        let r = report(&all_pass, true);
        assert!(!r.success());
        assert!(
            r.text().contains("LEFT  check-1-a: volume v1"),
            "{}",
            r.text()
        );
        assert!(r.text().contains("12 checks, 12 passed"), "{}", r.text());
    }
}
