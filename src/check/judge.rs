//! The rules of `csi-provisioner check`, each a pure function from what the
//! driver answered to a result. No I/O here: `session.rs` makes the calls and
//! hands the answers over, so every rule is table-tested without a driver.
//!
//! The rules are the CSI spec's (spec.md of CSI v1.13, "CreateVolume",
//! "DeleteVolume", "CapacityRange", "Volume"): a same-name request compatible
//! with the existing volume MUST get it (`0 OK`), an incompatible one
//! (capacity range, capabilities, parameters) `ALREADY_EXISTS`; `DeleteVolume`
//! of a volume that does not exist MUST reply `0 OK`; `capacity_bytes` 0 means
//! unknown, otherwise the volume is at least `required_bytes` and at most
//! `limit_bytes` (each 0: unspecified).

use std::time::Duration;

use serde::Serialize;
use tonic::Code;

use crate::csi::{DriverCapabilities, code_name, pb};
use crate::duration::format_go_duration;

/// The checks, in the order they run and are reported. The id is the stable
/// name used in the report and its JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckId {
    Probe,
    PluginCapabilities,
    ControllerCapabilities,
    CreateVolume,
    CreateIdempotent,
    CreateOtherParameters,
    Capacity,
    DeleteUnknown,
    DeleteVolume,
    DeleteTwice,
    CapabilitiesConsistent,
    Timeouts,
}

impl CheckId {
    pub const ALL: [CheckId; 12] = [
        CheckId::Probe,
        CheckId::PluginCapabilities,
        CheckId::ControllerCapabilities,
        CheckId::CreateVolume,
        CheckId::CreateIdempotent,
        CheckId::CreateOtherParameters,
        CheckId::Capacity,
        CheckId::DeleteUnknown,
        CheckId::DeleteVolume,
        CheckId::DeleteTwice,
        CheckId::CapabilitiesConsistent,
        CheckId::Timeouts,
    ];

    pub fn id(self) -> &'static str {
        match self {
            CheckId::Probe => "probe",
            CheckId::PluginCapabilities => "plugin-capabilities",
            CheckId::ControllerCapabilities => "controller-capabilities",
            CheckId::CreateVolume => "create-volume",
            CheckId::CreateIdempotent => "create-idempotent",
            CheckId::CreateOtherParameters => "create-other-parameters",
            CheckId::Capacity => "capacity",
            CheckId::DeleteUnknown => "delete-unknown",
            CheckId::DeleteVolume => "delete-volume",
            CheckId::DeleteTwice => "delete-twice",
            CheckId::CapabilitiesConsistent => "capabilities-consistent",
            CheckId::Timeouts => "timeouts",
        }
    }

    /// What the rule is, in one line.
    pub fn rule(self) -> &'static str {
        match self {
            CheckId::Probe => "GetPluginInfo names the driver and Probe answers ready",
            CheckId::PluginCapabilities => "GetPluginCapabilities advertises CONTROLLER_SERVICE",
            CheckId::ControllerCapabilities => {
                "ControllerGetCapabilities advertises CREATE_DELETE_VOLUME"
            }
            CheckId::CreateVolume => "CreateVolume of a new name creates a volume",
            CheckId::CreateIdempotent => {
                "CreateVolume again with the same name and parameters returns the same volume"
            }
            CheckId::CreateOtherParameters => {
                "CreateVolume with the same name and other parameters answers ALREADY_EXISTS"
            }
            CheckId::Capacity => {
                "capacity_bytes is 0 (unknown) or within the requested required_bytes..limit_bytes"
            }
            CheckId::DeleteUnknown => "DeleteVolume of an id the driver never issued succeeds",
            CheckId::DeleteVolume => "DeleteVolume of a created volume succeeds",
            CheckId::DeleteTwice => "DeleteVolume of a deleted volume succeeds",
            CheckId::CapabilitiesConsistent => {
                "the advertised capabilities agree with the calls that work"
            }
            CheckId::Timeouts => "every call is answered within --timeout",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// The result of one check: the verdict and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    pub detail: String,
}

impl Outcome {
    pub fn pass(detail: impl Into<String>) -> Outcome {
        Outcome {
            verdict: Verdict::Pass,
            detail: detail.into(),
        }
    }
    pub fn fail(detail: impl Into<String>) -> Outcome {
        Outcome {
            verdict: Verdict::Fail,
            detail: detail.into(),
        }
    }
    pub fn skip(detail: impl Into<String>) -> Outcome {
        Outcome {
            verdict: Verdict::Skip,
            detail: detail.into(),
        }
    }
}

/// How a call ended, as far as a rule cares.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer<T> {
    Ok(T),
    /// The driver answered with an error.
    Failed {
        code: Code,
        message: String,
    },
    /// No answer within `--timeout`.
    TimedOut,
}

impl<T> Answer<T> {
    pub fn failed(code: Code, message: &str) -> Answer<T> {
        Answer::Failed {
            code,
            message: message.to_string(),
        }
    }

    pub fn ok(&self) -> Option<&T> {
        match self {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the call is implemented, as far as the answer tells: `None`
    /// when it timed out.
    fn works(&self) -> Option<Works> {
        match self {
            Answer::Ok(_) => Some(Works::Yes),
            Answer::Failed {
                code: Code::Unimplemented,
                ..
            } => Some(Works::Unimplemented),
            Answer::Failed { .. } => Some(Works::Refused),
            Answer::TimedOut => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Works {
    Yes,
    Unimplemented,
    /// Implemented, but this call was refused.
    Refused,
}

/// A gRPC code as the CSI spec writes it (`ALREADY_EXISTS`).
pub fn spec_code(code: Code) -> String {
    if code == Code::Cancelled {
        return "CANCELLED".into();
    }
    let mut out = String::new();
    for (i, c) in code_name(code).chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// `NOT_FOUND ("what the driver said")`.
fn error_text(code: Code, message: &str) -> String {
    if message.is_empty() {
        spec_code(code)
    } else {
        format!("{} ({message:?})", spec_code(code))
    }
}

fn timed_out(call: &str) -> Outcome {
    Outcome::skip(format!(
        "{call} did not answer within --timeout, so this could not be judged (see timeouts)"
    ))
}

fn unimplemented(call: &str) -> Outcome {
    Outcome::skip(format!(
        "{call} answered UNIMPLEMENTED (judged by capabilities-consistent)"
    ))
}

pub fn probe(
    info: &Answer<pb::GetPluginInfoResponse>,
    probe: &Answer<pb::ProbeResponse>,
) -> Outcome {
    let name = match info {
        Answer::Ok(i) if i.name.is_empty() => {
            return Outcome::fail("GetPluginInfo answered no driver name");
        }
        Answer::Ok(i) => format!("{} {}", i.name, i.vendor_version),
        Answer::Failed { code, message } => {
            return Outcome::fail(format!(
                "GetPluginInfo failed: {}",
                error_text(*code, message)
            ));
        }
        Answer::TimedOut => return timed_out("GetPluginInfo"),
    };
    match probe {
        Answer::Ok(p) if p.ready == Some(false) => Outcome::fail(format!(
            "{name}: Probe answered ready=false (a provisioner waits until it is ready)"
        )),
        Answer::Ok(_) => Outcome::pass(format!("{name}: Probe answered ready")),
        Answer::Failed { code, message } => {
            Outcome::fail(format!("Probe failed: {}", error_text(*code, message)))
        }
        Answer::TimedOut => timed_out("Probe"),
    }
}

pub fn plugin_capabilities(answer: &Answer<pb::GetPluginCapabilitiesResponse>) -> Outcome {
    match answer {
        Answer::Ok(r) if DriverCapabilities::from_responses(r, None).controller_service => {
            Outcome::pass("CONTROLLER_SERVICE advertised")
        }
        Answer::Ok(_) => Outcome::fail(
            "CONTROLLER_SERVICE not advertised: a provisioner refuses to provision with this driver",
        ),
        Answer::Failed { code, message } => Outcome::fail(format!(
            "GetPluginCapabilities failed: {}",
            error_text(*code, message)
        )),
        Answer::TimedOut => timed_out("GetPluginCapabilities"),
    }
}

/// The controller RPC capabilities advertised, by their spec names.
fn rpc_names(r: &pb::ControllerGetCapabilitiesResponse) -> Vec<&'static str> {
    use pb::controller_service_capability::Type;
    use pb::controller_service_capability::rpc::Type as Rpc;
    r.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Rpc(rpc)) => Rpc::try_from(rpc.r#type).ok().map(|t| t.as_str_name()),
            None => None,
        })
        .collect()
}

pub fn controller_capabilities(answer: &Answer<pb::ControllerGetCapabilitiesResponse>) -> Outcome {
    match answer {
        Answer::Ok(r) => {
            let names = rpc_names(r);
            let all = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            if names.contains(&"CREATE_DELETE_VOLUME") {
                Outcome::pass(format!("advertised: {all}"))
            } else {
                Outcome::fail(format!(
                    "CREATE_DELETE_VOLUME not advertised (advertised: {all}): a provisioner \
                     refuses to provision with this driver"
                ))
            }
        }
        Answer::Failed { code, message } => Outcome::fail(format!(
            "ControllerGetCapabilities failed: {}",
            error_text(*code, message)
        )),
        Answer::TimedOut => timed_out("ControllerGetCapabilities"),
    }
}

pub fn create_volume(name: &str, answer: &Answer<pb::Volume>) -> Outcome {
    match answer {
        Answer::Ok(v) if v.volume_id.is_empty() => Outcome::fail(format!(
            "CreateVolume {name} answered OK without a volume_id"
        )),
        Answer::Ok(v) => Outcome::pass(format!(
            "{name} created as volume {} ({} bytes)",
            v.volume_id, v.capacity_bytes
        )),
        Answer::Failed {
            code: Code::Unimplemented,
            ..
        } => unimplemented("CreateVolume"),
        Answer::Failed { code, message } => Outcome::fail(format!(
            "CreateVolume {name} failed: {}",
            error_text(*code, message)
        )),
        Answer::TimedOut => timed_out("CreateVolume"),
    }
}

pub fn create_idempotent(first: &pb::Volume, again: &Answer<pb::Volume>) -> Outcome {
    match again {
        Answer::Ok(v) if v.volume_id == first.volume_id => Outcome::pass(format!(
            "the second CreateVolume answered the same volume {}",
            v.volume_id
        )),
        Answer::Ok(v) => Outcome::fail(format!(
            "the second CreateVolume answered another volume {} (the first was {}): a \
             provisioner that retries a call it lost the answer of would leak volumes",
            v.volume_id, first.volume_id
        )),
        Answer::Failed { code, message } => Outcome::fail(format!(
            "the second CreateVolume failed ({}) instead of answering volume {} again",
            error_text(*code, message),
            first.volume_id
        )),
        Answer::TimedOut => timed_out("The second CreateVolume"),
    }
}

pub fn create_other_parameters(first: &pb::Volume, other: &Answer<pb::Volume>) -> Outcome {
    match other {
        Answer::Failed {
            code: Code::AlreadyExists,
            ..
        } => Outcome::pass("answered ALREADY_EXISTS"),
        Answer::Ok(v) if v.volume_id == first.volume_id => Outcome::fail(format!(
            "answered OK with the existing volume {} instead of ALREADY_EXISTS: the volume \
             was made with other parameters than asked",
            v.volume_id
        )),
        Answer::Ok(v) => Outcome::fail(format!(
            "answered OK with a second volume {} of the same name (the first is {}) instead \
             of ALREADY_EXISTS",
            v.volume_id, first.volume_id
        )),
        Answer::Failed {
            code: Code::InvalidArgument,
            message,
        } => Outcome::skip(format!(
            "the driver refused the other parameters as invalid ({}); give \
             --other-parameter with parameters it accepts",
            error_text(Code::InvalidArgument, message)
        )),
        Answer::Failed { code, message } => Outcome::fail(format!(
            "answered {} instead of ALREADY_EXISTS",
            error_text(*code, message)
        )),
        Answer::TimedOut => timed_out("CreateVolume with other parameters"),
    }
}

/// One `CreateVolume` whose answered capacity is judged against what it asked.
pub struct CapacitySample<'a> {
    pub required: i64,
    /// 0: no limit.
    pub limit: i64,
    pub answer: &'a Answer<pb::Volume>,
}

pub fn capacity(samples: &[CapacitySample<'_>]) -> Outcome {
    let mut seen = Vec::new();
    let mut wrong = Vec::new();
    let mut timed = false;
    for s in samples {
        let asked = if s.limit > 0 {
            format!("{}..{} bytes", s.required, s.limit)
        } else {
            format!("at least {} bytes", s.required)
        };
        match s.answer {
            Answer::Ok(v) => {
                let c = v.capacity_bytes;
                if c == 0 {
                    seen.push(format!(
                        "0 (unknown: a provisioner records the size asked) for {asked}"
                    ));
                } else if c < 0 {
                    wrong.push(format!("{c} bytes (negative) for {asked}"));
                } else if c < s.required {
                    wrong.push(format!(
                        "{c} bytes for {asked}: less than asked (a provisioner deletes such a volume)"
                    ));
                } else if s.limit > 0 && c > s.limit {
                    wrong.push(format!("{c} bytes for {asked}: more than limit_bytes"));
                } else {
                    seen.push(format!("{c} bytes for {asked}"));
                }
            }
            Answer::Failed { code, message } => wrong.push(format!(
                "CreateVolume for {asked} failed: {}",
                error_text(*code, message)
            )),
            Answer::TimedOut => timed = true,
        }
    }
    if !wrong.is_empty() {
        Outcome::fail(wrong.join("; "))
    } else if !seen.is_empty() {
        Outcome::pass(seen.join("; "))
    } else if timed {
        timed_out("CreateVolume")
    } else {
        Outcome::skip("no volume was created")
    }
}

/// Which `DeleteVolume` is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteKind {
    /// Of an id the driver never issued.
    Unknown,
    /// Of a volume just created.
    Created,
    /// Of the same volume again.
    Again,
}

pub fn delete(kind: DeleteKind, volume_id: &str, answer: &Answer<()>) -> Outcome {
    let what = match kind {
        DeleteKind::Unknown => {
            format!("DeleteVolume of {volume_id}, which the driver never issued,")
        }
        DeleteKind::Created => format!("DeleteVolume of {volume_id}"),
        DeleteKind::Again => format!("the second DeleteVolume of {volume_id}"),
    };
    match answer {
        Answer::Ok(()) => Outcome::pass(format!("{what} answered OK")),
        Answer::Failed {
            code: Code::NotFound,
            message,
        } if kind != DeleteKind::Created => Outcome::fail(format!(
            "{what} answered {} instead of OK: the spec makes DeleteVolume of a volume that \
             does not exist a success",
            error_text(Code::NotFound, message)
        )),
        Answer::Failed {
            code: Code::Unimplemented,
            ..
        } => unimplemented("DeleteVolume"),
        Answer::Failed { code, message } => {
            Outcome::fail(format!("{what} failed: {}", error_text(*code, message)))
        }
        Answer::TimedOut => timed_out("DeleteVolume"),
    }
}

/// What the capabilities said and how the calls went, for
/// [`capabilities_consistent`].
#[derive(Default)]
pub struct Observed<'a> {
    /// `None` when GetPluginCapabilities gave no answer.
    pub controller_service: Option<bool>,
    /// `None` when ControllerGetCapabilities gave no answer.
    pub create_delete_volume: Option<bool>,
    /// Whether ControllerGetCapabilities answered at all (a Controller call).
    pub controller_answered: bool,
    pub creates: Vec<&'a Answer<pb::Volume>>,
    pub deletes: Vec<&'a Answer<()>>,
}

pub fn capabilities_consistent(o: &Observed<'_>) -> Outcome {
    let creates: Vec<Works> = o.creates.iter().filter_map(|a| a.works()).collect();
    let deletes: Vec<Works> = o.deletes.iter().filter_map(|a| a.works()).collect();
    let created = creates.contains(&Works::Yes);
    let deleted = deletes.contains(&Works::Yes);
    let mut wrong = Vec::new();
    let mut agreed = Vec::new();
    match o.create_delete_volume {
        Some(true) => {
            if creates.contains(&Works::Unimplemented) {
                wrong.push(
                    "CREATE_DELETE_VOLUME is advertised but CreateVolume answers UNIMPLEMENTED",
                );
            }
            if deletes.contains(&Works::Unimplemented) {
                wrong.push(
                    "CREATE_DELETE_VOLUME is advertised but DeleteVolume answers UNIMPLEMENTED",
                );
            }
            if created || deleted {
                agreed
                    .push("CREATE_DELETE_VOLUME is advertised and CreateVolume/DeleteVolume work");
            }
        }
        Some(false) => {
            if created {
                wrong.push(
                    "CREATE_DELETE_VOLUME is not advertised but CreateVolume created a volume",
                );
            }
            if deleted {
                wrong.push("CREATE_DELETE_VOLUME is not advertised but DeleteVolume answered OK");
            }
            if creates.contains(&Works::Unimplemented) {
                agreed.push(
                    "CREATE_DELETE_VOLUME is not advertised and CreateVolume answers UNIMPLEMENTED",
                );
            }
        }
        None => {}
    }
    if o.controller_service == Some(false) && (o.controller_answered || created) {
        wrong.push("CONTROLLER_SERVICE is not advertised but Controller calls answer");
    }
    if o.controller_service == Some(true) && o.controller_answered {
        agreed.push("CONTROLLER_SERVICE is advertised and the Controller service answers");
    }
    if !wrong.is_empty() {
        Outcome::fail(wrong.join("; "))
    } else if !agreed.is_empty() {
        Outcome::pass(agreed.join("; "))
    } else {
        Outcome::skip("no capability could be compared with a call")
    }
}

/// One call made to the driver, for the `timeouts` check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    pub method: &'static str,
    pub elapsed: Duration,
    pub timed_out: bool,
}

pub fn timeouts(calls: &[CallRecord], limit: Duration) -> Outcome {
    let limit_text = format_go_duration(limit);
    let late: Vec<&CallRecord> = calls.iter().filter(|c| c.timed_out).collect();
    if !late.is_empty() {
        let mut methods: Vec<&str> = late.iter().map(|c| c.method).collect();
        methods.dedup();
        return Outcome::fail(format!(
            "{} of {} calls not answered within {limit_text}: {}",
            late.len(),
            calls.len(),
            methods.join(", ")
        ));
    }
    match calls.iter().max_by_key(|c| c.elapsed) {
        Some(slowest) => Outcome::pass(format!(
            "{} calls, the slowest {} in {} (limit {limit_text})",
            calls.len(),
            slowest.method,
            format_go_duration(round_to_millis(slowest.elapsed))
        )),
        None => Outcome::skip("no call was made"),
    }
}

fn round_to_millis(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(id: &str, capacity: i64) -> pb::Volume {
        pb::Volume {
            volume_id: id.into(),
            capacity_bytes: capacity,
            ..Default::default()
        }
    }

    fn failed<T>(code: Code) -> Answer<T> {
        Answer::failed(code, "said the driver")
    }

    #[test]
    fn spec_codes_are_spelled_as_the_spec_does() {
        assert_eq!(spec_code(Code::AlreadyExists), "ALREADY_EXISTS");
        assert_eq!(spec_code(Code::NotFound), "NOT_FOUND");
        assert_eq!(spec_code(Code::Cancelled), "CANCELLED");
        assert_eq!(spec_code(Code::Internal), "INTERNAL");
    }

    #[test]
    fn create_idempotent_wants_the_same_volume() {
        let first = vol("v1", 10);
        use Verdict::*;
        let table = [
            (Answer::Ok(vol("v1", 10)), Pass),
            (Answer::Ok(vol("v1", 0)), Pass),
            (Answer::Ok(vol("v2", 10)), Fail),
            (failed(Code::AlreadyExists), Fail),
            (Answer::TimedOut, Skip),
        ];
        for (answer, want) in table {
            assert_eq!(
                create_idempotent(&first, &answer).verdict,
                want,
                "{answer:?}"
            );
        }
    }

    #[test]
    fn other_parameters_want_already_exists() {
        let first = vol("v1", 10);
        use Verdict::*;
        let table = [
            (failed(Code::AlreadyExists), Pass),
            (Answer::Ok(vol("v1", 10)), Fail),
            (Answer::Ok(vol("v2", 10)), Fail),
            (failed(Code::InvalidArgument), Skip),
            (failed(Code::Internal), Fail),
            (Answer::TimedOut, Skip),
        ];
        for (answer, want) in table {
            assert_eq!(
                create_other_parameters(&first, &answer).verdict,
                want,
                "{answer:?}"
            );
        }
    }

    #[test]
    fn capacity_zero_is_unknown_and_a_range_is_held() {
        use Verdict::*;
        let table: [(i64, i64, Answer<pb::Volume>, Verdict); 8] = [
            (100, 0, Answer::Ok(vol("v", 100)), Pass),
            (100, 0, Answer::Ok(vol("v", 1000)), Pass),
            (100, 0, Answer::Ok(vol("v", 0)), Pass),
            (100, 0, Answer::Ok(vol("v", 99)), Fail),
            (100, 200, Answer::Ok(vol("v", 200)), Pass),
            (100, 200, Answer::Ok(vol("v", 201)), Fail),
            (100, 200, failed(Code::OutOfRange), Fail),
            (100, 200, Answer::TimedOut, Skip),
        ];
        for (required, limit, answer, want) in table {
            let got = capacity(&[CapacitySample {
                required,
                limit,
                answer: &answer,
            }]);
            assert_eq!(
                got.verdict, want,
                "{required}..{limit} {answer:?}: {}",
                got.detail
            );
        }
        let zero = Answer::Ok(vol("v", 0));
        let got = capacity(&[CapacitySample {
            required: 1,
            limit: 0,
            answer: &zero,
        }]);
        assert!(got.detail.contains("unknown"), "{}", got.detail);
        // One sample out of range fails the check, whatever the others say.
        let good = Answer::Ok(vol("a", 150));
        let bad = Answer::Ok(vol("b", 50));
        let got = capacity(&[
            CapacitySample {
                required: 100,
                limit: 200,
                answer: &good,
            },
            CapacitySample {
                required: 100,
                limit: 0,
                answer: &bad,
            },
        ]);
        assert_eq!(got.verdict, Fail);
        assert!(got.detail.contains("50 bytes"), "{}", got.detail);
    }

    #[test]
    fn deleting_what_does_not_exist_is_ok_not_not_found() {
        use DeleteKind::*;
        use Verdict::*;
        let table = [
            (Unknown, Answer::Ok(()), Pass),
            (Unknown, failed(Code::NotFound), Fail),
            (Again, failed(Code::NotFound), Fail),
            (Again, Answer::Ok(()), Pass),
            (Created, failed(Code::FailedPrecondition), Fail),
            (Created, failed(Code::Unimplemented), Skip),
            (Unknown, Answer::TimedOut, Skip),
        ];
        for (kind, answer, want) in table {
            assert_eq!(
                delete(kind, "id", &answer).verdict,
                want,
                "{kind:?} {answer:?}"
            );
        }
    }

    #[test]
    fn capabilities_are_compared_with_the_calls() {
        let created = Answer::Ok(vol("v", 1));
        let unimplemented = failed::<pb::Volume>(Code::Unimplemented);
        let deleted = Answer::Ok(());
        fn observed<'a>(
            create_delete: Option<bool>,
            creates: Vec<&'a Answer<pb::Volume>>,
            deleted: &'a Answer<()>,
        ) -> Observed<'a> {
            Observed {
                controller_service: Some(true),
                create_delete_volume: create_delete,
                controller_answered: true,
                creates,
                deletes: vec![deleted],
            }
        }
        let o = |create_delete, creates| observed(create_delete, creates, &deleted);
        use Verdict::*;
        assert_eq!(
            capabilities_consistent(&o(Some(true), vec![&created])).verdict,
            Pass
        );
        assert_eq!(
            capabilities_consistent(&o(Some(true), vec![&unimplemented])).verdict,
            Fail
        );
        assert_eq!(
            capabilities_consistent(&o(Some(false), vec![&created])).verdict,
            Fail
        );
        let not_advertised = Observed {
            deletes: vec![],
            ..o(Some(false), vec![&unimplemented])
        };
        assert_eq!(capabilities_consistent(&not_advertised).verdict, Pass);
        let no_controller = Observed {
            controller_service: Some(false),
            ..o(Some(true), vec![&created])
        };
        assert_eq!(capabilities_consistent(&no_controller).verdict, Fail);
    }

    #[test]
    fn a_late_call_fails_timeouts() {
        let call = |method, ms, timed_out| CallRecord {
            method,
            elapsed: Duration::from_millis(ms),
            timed_out,
        };
        let ok = timeouts(
            &[call("Probe", 3, false), call("CreateVolume", 40, false)],
            Duration::from_secs(1),
        );
        assert_eq!(ok.verdict, Verdict::Pass);
        assert!(ok.detail.contains("CreateVolume in 40ms"), "{}", ok.detail);
        let late = timeouts(
            &[call("Probe", 3, false), call("CreateVolume", 1000, true)],
            Duration::from_secs(1),
        );
        assert_eq!(late.verdict, Verdict::Fail);
        assert!(
            late.detail
                .contains("1 of 2 calls not answered within 1s: CreateVolume"),
            "{}",
            late.detail
        );
    }

    #[test]
    fn probe_needs_a_name_and_readiness() {
        let info = |name: &str| {
            Answer::Ok(pb::GetPluginInfoResponse {
                name: name.into(),
                vendor_version: "1.0".into(),
                ..Default::default()
            })
        };
        let ready = |r| Answer::Ok(pb::ProbeResponse { ready: r });
        assert_eq!(probe(&info("d"), &ready(None)).verdict, Verdict::Pass);
        assert_eq!(probe(&info("d"), &ready(Some(true))).verdict, Verdict::Pass);
        assert_eq!(
            probe(&info("d"), &ready(Some(false))).verdict,
            Verdict::Fail
        );
        assert_eq!(probe(&info(""), &ready(None)).verdict, Verdict::Fail);
    }
}
