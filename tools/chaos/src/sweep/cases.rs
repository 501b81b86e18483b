//! The sweep's pure half: the flows, the steps a trace makes of the proxy's journal and the
//! driver's ledger, the cases, and the table of outcomes. The I/O half (stages, traces, the
//! crash itself) is `sweep.rs`.

use csi_test_driver::ledger::OperationRecord;
use kube_fault_proxy::WriteRecord;
use std::time::Duration;

use crate::check::{self, InvariantResult};
use crate::world::Sidecar;

/// The CSI calls the sweep crashes at: the provisioner's own.
const CSI_METHODS: [&str; 2] = ["CreateVolume", "DeleteVolume"];

/// A flow: a setup that is not swept, then a trigger whose consequences are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flow {
    /// A claim is created and provisioned.
    Provision,
    /// A claim restored from a ready VolumeSnapshot.
    Restore,
    /// A claim cloned from a Bound claim.
    Clone,
    /// A Bound claim is deleted: its PV is Released, the volume and the PV are deleted.
    Delete,
    /// A claim was deleted while its `CreateVolume` was in flight; the call then answers
    /// (the volume was made).
    Cleanup,
}

impl Flow {
    pub const ALL: [Flow; 5] = [
        Flow::Provision,
        Flow::Restore,
        Flow::Clone,
        Flow::Delete,
        Flow::Cleanup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Flow::Provision => "provision",
            Flow::Restore => "restore",
            Flow::Clone => "clone",
            Flow::Delete => "delete",
            Flow::Cleanup => "cleanup",
        }
    }

    /// `all`, or a comma-separated list of flow names.
    pub fn parse_list(s: &str) -> Result<Vec<Flow>, String> {
        if s == "all" {
            return Ok(Flow::ALL.to_vec());
        }
        s.split(',')
            .map(|name| {
                Flow::ALL
                    .into_iter()
                    .find(|f| f.name() == name.trim())
                    .ok_or_else(|| {
                        format!(
                            "unknown flow {name:?} (all, or some of provision, restore, clone, \
                             delete, cleanup)"
                        )
                    })
            })
            .collect()
    }

    /// What "deleted while the sidecar is down" deletes in this flow.
    /// (The claim of `delete` and `cleanup` is deleted already: their PV is.)
    pub(crate) fn deleted_while_down(self) -> &'static str {
        match self {
            Flow::Delete | Flow::Cleanup => "PV",
            Flow::Provision | Flow::Restore | Flow::Clone => "claim",
        }
    }
}

/// One request of a flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// An API write through the proxy: its verb and `resource[/subresource]`.
    Api { verb: String, resource: String },
    /// A CSI call to the driver.
    Csi { method: String },
}

/// The `nth` (from 1) request of its kind since the flow's trigger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub call: Call,
    pub nth: u32,
    /// The object (or the volume name) the trace's request was about.
    pub object: String,
    /// The trace made it only because an earlier request of its kind was answered 409
    /// Conflict (a retry, or a step shifted by one): a run without that conflict, which
    /// the sidecar does not choose, does not make it.
    pub after_conflict: bool,
}

impl Step {
    pub fn label(&self) -> String {
        match &self.call {
            Call::Api { verb, resource } => format!("{verb} {resource} #{}", self.nth),
            Call::Csi { method } => format!("{method} #{}", self.nth),
        }
    }
}

/// Whether a rule aimed at writes of `rule_resource` also counts a write of `resource`: a
/// rule for a resource covers its subresources too, one for a subresource only that one
/// (the proxy's matching).
fn counted_by(rule_resource: &str, resource: &str) -> bool {
    rule_resource == resource
        || (!rule_resource.contains('/') && resource.split('/').next() == Some(rule_resource))
}

/// The steps of a trace, in the order they happened: the writes (leader election's Lease
/// writes are not a flow's) and the provisioner's CSI calls made since `since_ms`.
pub fn steps(writes: &[WriteRecord], ops: &[OperationRecord], since_ms: u64) -> Vec<Step> {
    let mut all: Vec<(u64, Call, String, bool)> = writes
        .iter()
        .filter(|w| w.at_ms >= since_ms && !w.resource.starts_with("leases"))
        .map(|w| {
            let call = Call::Api {
                verb: w.verb.clone(),
                resource: w.resource.clone(),
            };
            let conflict = w.status == Some(409);
            (w.at_ms, call, w.name.clone().unwrap_or_default(), conflict)
        })
        .collect();
    all.extend(
        ops.iter()
            .filter(|o| o.at_ms >= since_ms && CSI_METHODS.contains(&o.method.as_str()))
            .map(|o| {
                let call = Call::Csi {
                    method: o.method.clone(),
                };
                let object = o.name.clone().or(o.volume_id.clone()).unwrap_or_default();
                (o.at_ms, call, object, false)
            }),
    );
    // Stable: writes before CSI calls of the same millisecond, each in its own order.
    all.sort_by_key(|(at, _, _, _)| *at);
    let mut out: Vec<(Step, bool)> = Vec::new();
    for (_, call, object, conflict) in all {
        let same_kind: Vec<&(Step, bool)> = out
            .iter()
            .filter(|(s, _)| match (&s.call, &call) {
                (
                    Call::Api {
                        verb: v1,
                        resource: r1,
                    },
                    Call::Api {
                        verb: v2,
                        resource: r2,
                    },
                ) => v1 == v2 && counted_by(r2, r1),
                (a, b) => a == b,
            })
            .collect();
        let step = Step {
            call,
            nth: 1 + same_kind.len() as u32,
            object,
            after_conflict: same_kind.iter().any(|(_, conflicted)| *conflicted),
        };
        out.push((step, conflict));
    }
    out.into_iter().map(|(step, _)| step).collect()
}

/// Where the sidecar dies at a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// The request is held before the API server (or the driver) sees it.
    Before,
    /// The API server (or the driver) acted; its answer is held.
    After,
}

impl Point {
    pub fn label(self) -> &'static str {
        match self {
            Point::Before => "before",
            Point::After => "after",
        }
    }
}

/// One cell of the sweep.
#[derive(Clone, Debug)]
pub struct Case {
    pub flow: Flow,
    pub step: Step,
    pub point: Point,
    /// The claim (the PV in the `delete` flow) deleted while the sidecar is down.
    pub delete_while_down: bool,
}

/// What became of a case.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub case: Case,
    /// The step was reached and held (false: the run went another way than the trace).
    pub reached: bool,
    /// The state once settled, before the teardown: the claim's phase (or "gone") and
    /// the backend's volumes.
    pub end: String,
    /// Violated invariants (the teardown's included), with their details.
    pub violations: Vec<InvariantResult>,
    /// A case that could not be run (setup failed): why.
    pub error: Option<String>,
}

impl Outcome {
    /// A step the trace made whatever the timing that this run did not reach: the run went
    /// another way than the trace, so the case proved nothing.
    pub fn missed(&self) -> bool {
        self.error.is_none() && !self.reached && !self.case.step.after_conflict
    }

    pub fn violation_count(&self) -> usize {
        check::total(&self.violations)
    }

    pub(crate) fn verdict(&self) -> String {
        if let Some(e) = &self.error {
            return format!("error: {e}");
        }
        if !self.reached && self.case.step.after_conflict {
            return "step not reached (in the trace it followed a conflict; this run had none)"
                .into();
        }
        if !self.reached {
            return "step not reached".into();
        }
        if self.violations.is_empty() {
            return "ok".into();
        }
        self.violations
            .iter()
            .map(|r| format!("**{}** ({})", r.name, r.violations.len()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Everything one sweep did.
#[derive(Debug)]
pub struct SweepReport {
    pub sidecar: Sidecar,
    pub policies: bool,
    /// Each flow's steps, as its trace recorded them.
    pub traces: Vec<(Flow, Vec<Step>)>,
    pub outcomes: Vec<Outcome>,
    /// Flows whose trace failed (their cases did not run), and why.
    pub trace_errors: Vec<(Flow, String)>,
    pub elapsed: Duration,
}

impl SweepReport {
    pub fn violations(&self) -> usize {
        self.outcomes.iter().map(Outcome::violation_count).sum()
    }

    /// The markdown table of docs/reliability.md, then the details of every violation.
    pub fn render(&self) -> String {
        let mut out = format!(
            "### Crash sweep: {}{}\n\n{} cases, {} steps not reached, {} errors, violations: {}; {:.0} s\n\n",
            self.sidecar.label(),
            if self.policies { " (policy mode)" } else { "" },
            self.outcomes.len(),
            self.outcomes.iter().filter(|o| o.missed()).count(),
            self.outcomes.iter().filter(|o| o.error.is_some()).count(),
            self.violations(),
            self.elapsed.as_secs_f64(),
        );
        for (flow, steps) in &self.traces {
            let list: Vec<String> = steps
                .iter()
                .map(|s| {
                    let retry = if s.after_conflict {
                        " (after a conflict)"
                    } else {
                        ""
                    };
                    format!("`{}`{retry}", s.label())
                })
                .collect();
            out.push_str(&format!(
                "- trace of `{}`: {}\n",
                flow.name(),
                list.join(", ")
            ));
        }
        for (flow, e) in &self.trace_errors {
            out.push_str(&format!(
                "- trace of `{}` FAILED (no case run): {e}\n",
                flow.name()
            ));
        }
        out.push_str(
            "\n| flow | step | crash | deleted while down | end state | outcome |\n|---|---|---|---|---|---|\n",
        );
        for o in &self.outcomes {
            out.push_str(&format!(
                "| {} | `{}` | {} | {} | {} | {} |\n",
                o.case.flow.name(),
                o.case.step.label(),
                o.case.point.label(),
                if o.case.delete_while_down {
                    o.case.flow.deleted_while_down()
                } else {
                    "–"
                },
                o.end,
                o.verdict(),
            ));
        }
        let details: Vec<String> = self
            .outcomes
            .iter()
            .flat_map(|o| {
                o.violations.iter().flat_map(move |r| {
                    r.violations.iter().map(move |v| {
                        format!(
                            "- {} / {} / {} / deleted {}: {}: {v}",
                            o.case.flow.name(),
                            o.case.step.label(),
                            o.case.point.label(),
                            o.case.delete_while_down,
                            r.name
                        )
                    })
                })
            })
            .collect();
        if !details.is_empty() {
            out.push_str("\nViolations:\n\n");
            out.push_str(&details.join("\n"));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_test_driver::code::GrpcCode;

    fn write(at_ms: u64, verb: &str, resource: &str, name: &str) -> WriteRecord {
        WriteRecord {
            at_ms,
            verb: verb.into(),
            resource: resource.into(),
            namespace: Some("n".into()),
            name: Some(name.into()),
            body: String::new(),
            status: Some(200),
        }
    }

    fn op(at_ms: u64, method: &str) -> OperationRecord {
        let mut o = OperationRecord::new(method, Some("pvc-1".into()), None);
        o.at_ms = at_ms;
        o.code = GrpcCode::Ok;
        o
    }

    #[test]
    fn a_trace_numbers_each_kind_of_request_as_the_hold_rules_count_them() {
        let writes = [
            write(5, "patch", "persistentvolumeclaims", "old"),
            write(10, "patch", "persistentvolumeclaims", "c"),
            write(12, "update", "leases", "lease"),
            write(30, "create", "persistentvolumes", "pvc-1"),
            write(31, "create", "events", "c.1"),
            write(40, "patch", "persistentvolumeclaims/status", "c"),
            write(41, "patch", "persistentvolumeclaims", "c"),
        ];
        let ops = [
            op(20, "CreateVolume"),
            op(21, "CreateSnapshot"),
            op(35, "CreateVolume"),
        ];
        let labels: Vec<String> = steps(&writes, &ops, 10).iter().map(Step::label).collect();
        assert_eq!(
            labels,
            [
                "patch persistentvolumeclaims #1",
                "CreateVolume #1",
                "create persistentvolumes #1",
                "create events #1",
                "CreateVolume #2",
                // A rule on the subresource counts only it; one on the resource counts the
                // subresource's writes too (the proxy's matching).
                "patch persistentvolumeclaims/status #1",
                "patch persistentvolumeclaims #3",
            ]
        );
    }

    #[test]
    fn a_write_made_after_a_conflict_of_its_kind_is_marked_as_the_conflict_s_consequence() {
        let mut conflicted = write(20, "update", "persistentvolumeclaims", "c");
        conflicted.status = Some(409);
        let writes = [
            write(10, "update", "persistentvolumeclaims", "c"),
            conflicted,
            write(21, "update", "persistentvolumeclaims", "c"),
            write(22, "create", "persistentvolumes", "pvc-1"),
        ];
        let after: Vec<(String, bool)> = steps(&writes, &[], 0)
            .iter()
            .map(|s| (s.label(), s.after_conflict))
            .collect();
        assert_eq!(
            after,
            [
                ("update persistentvolumeclaims #1".to_string(), false),
                // The conflicted write itself is made in every run: the first try.
                ("update persistentvolumeclaims #2".to_string(), false),
                ("update persistentvolumeclaims #3".to_string(), true),
                // Another kind's count is not shifted by the conflict.
                ("create persistentvolumes #1".to_string(), false),
            ]
        );
    }

    #[test]
    fn flows_parse_by_name_or_all() {
        assert_eq!(Flow::parse_list("all").unwrap(), Flow::ALL.to_vec());
        assert_eq!(
            Flow::parse_list("delete,provision").unwrap(),
            vec![Flow::Delete, Flow::Provision]
        );
        assert!(
            Flow::parse_list("bogus")
                .unwrap_err()
                .contains("unknown flow")
        );
    }
}
