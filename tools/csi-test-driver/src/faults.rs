//! Runtime fault injection: which faults are armed per RPC method, and applying them to a call.
//!
//! Order for each call: hold (the n-th call, until released or dropped) → hang (until
//! released) → latency → "error for the next N calls" → "error with probability p". The last
//! two answer without running the method. The `create_then_deadline_exceeded` fault is
//! applied after the method ran (see [`FaultTable::take_deadline_after_create`]), and so is a
//! hold after the call ran ([`FaultTable::hold_answer`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Notify, oneshot};
use tonic::Status;

use crate::code::GrpcCode;
use crate::control::Fault;

/// Every RPC the driver serves, by its gRPC method name. Faults can target any of them.
pub const METHODS: &[&str] = &[
    // Identity
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    // Controller
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "ControllerListVolumeHealth",
    "ControllerGetVolumeHealth",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "ControllerGetNodeInfo",
    // Node
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeGetVolumeHealth",
    "NodeGetStorageHealth",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// The faults armed on one method.
#[derive(Debug, Default)]
struct MethodFaults {
    latency: Option<Duration>,
    fail_next: Option<(GrpcCode, u32, Option<String>)>,
    fail_probability: Option<(GrpcCode, f64)>,
    deadline_after_create: u32,
    /// Capacity to report instead of the real one, for this many more calls.
    reported_capacity: Option<(i64, u32)>,
    hang: bool,
    /// `hold`: calls left until the held one (1: the next), and whether it is held after it
    /// ran.
    hold: Option<(u32, bool)>,
    /// The rule-breaking behaviours (`Fault::CreateIgnoresParameters` and friends).
    ignore_parameters: bool,
    not_idempotent: bool,
    unknown_not_found: bool,
    again_not_found: bool,
    /// Calls currently waiting on `release`.
    hung: u64,
}

#[derive(Debug)]
struct Inner {
    methods: HashMap<&'static str, MethodFaults>,
    rng: StdRng,
    /// Calls held by a `hold` fault, by a running number: their method and who waits.
    held: BTreeMap<u64, (&'static str, oneshot::Sender<Decision>)>,
    next_held: u64,
}

/// What becomes of a call held by a `hold` fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It runs (held before) or sends its answer (held after).
    Release,
    /// It never runs (held before) or its answer is discarded (held after).
    Drop,
}

/// Faults for every method, shared by all calls.
#[derive(Debug)]
pub struct FaultTable {
    inner: Mutex<Inner>,
    /// One per method, woken by `release`.
    releases: HashMap<&'static str, Notify>,
}

/// The armed faults that change what a method does rather than how it answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misbehaviour {
    pub create_ignores_parameters: bool,
    pub create_not_idempotent: bool,
    pub delete_unknown_not_found: bool,
    pub delete_again_not_found: bool,
}

/// What the fault table decided before a call ran.
#[derive(Debug)]
pub enum Verdict {
    /// Run the method.
    Proceed,
    /// Run the method, then hold its answer ([`FaultTable::hold_answer`]).
    ProceedThenHold,
    /// A held call that was dropped: do nothing, answer `UNAVAILABLE`.
    Dropped,
    /// Answer with this status without running the method.
    Fail(Status),
}

impl FaultTable {
    /// An empty table whose probabilistic faults draw from an RNG seeded with `seed`, so a
    /// chaos run can be replayed.
    pub fn new(seed: u64) -> Self {
        FaultTable {
            inner: Mutex::new(Inner {
                methods: HashMap::new(),
                rng: StdRng::seed_from_u64(seed),
                held: BTreeMap::new(),
                next_held: 0,
            }),
            releases: METHODS.iter().map(|m| (*m, Notify::new())).collect(),
        }
    }

    /// The canonical `&'static str` for a method name, or an error naming the valid ones.
    pub fn method(name: &str) -> Result<&'static str, String> {
        METHODS
            .iter()
            .copied()
            .find(|m| *m == name)
            .ok_or_else(|| format!("unknown method {name:?}; known: {}", METHODS.join(", ")))
    }

    /// Arms `fault` on `method`, replacing a fault of the same kind.
    pub fn set(&self, method: &str, fault: Fault) -> Result<(), String> {
        let method = Self::method(method)?;
        let mut inner = self.lock();
        let faults = inner.methods.entry(method).or_default();
        match fault {
            Fault::Latency { ms } => faults.latency = Some(Duration::from_millis(ms)),
            Fault::Error {
                code,
                count,
                message,
            } => {
                if code == GrpcCode::Ok {
                    return Err("an error fault needs a non-OK code".into());
                }
                faults.fail_next = Some((code, count, message));
            }
            Fault::ErrorProbability { code, probability } => {
                if code == GrpcCode::Ok {
                    return Err("an error fault needs a non-OK code".into());
                }
                if !(0.0..=1.0).contains(&probability) {
                    return Err(format!("probability {probability} is not within 0..=1"));
                }
                faults.fail_probability = Some((code, probability));
            }
            Fault::CreateThenDeadlineExceeded { count } => {
                if method != "CreateVolume" {
                    return Err("create_then_deadline_exceeded applies to CreateVolume only".into());
                }
                faults.deadline_after_create = count;
            }
            Fault::CreateReportsCapacity { bytes, count } => {
                if method != "CreateVolume" {
                    return Err("create_reports_capacity applies to CreateVolume only".into());
                }
                if bytes < 0 {
                    return Err(format!("reported capacity {bytes} is negative"));
                }
                faults.reported_capacity = (count > 0).then_some((bytes, count));
            }
            Fault::Hang => faults.hang = true,
            // nth 0 disarms a hold that has not fired.
            Fault::Hold { nth, after } => faults.hold = (nth > 0).then_some((nth, after)),
            Fault::CreateIgnoresParameters | Fault::CreateNotIdempotent
                if method != "CreateVolume" =>
            {
                return Err("this fault applies to CreateVolume only".into());
            }
            Fault::DeleteUnknownNotFound | Fault::DeleteAgainNotFound
                if method != "DeleteVolume" =>
            {
                return Err("this fault applies to DeleteVolume only".into());
            }
            Fault::CreateIgnoresParameters => faults.ignore_parameters = true,
            Fault::CreateNotIdempotent => faults.not_idempotent = true,
            Fault::DeleteUnknownNotFound => faults.unknown_not_found = true,
            Fault::DeleteAgainNotFound => faults.again_not_found = true,
        }
        Ok(())
    }

    /// Disarms the faults of `method`, or of all methods. Hung calls stay hung.
    pub fn clear(&self, method: Option<&str>) -> Result<(), String> {
        let method = method.map(Self::method).transpose()?;
        let mut inner = self.lock();
        for (name, faults) in inner.methods.iter_mut() {
            if method.is_none_or(|m| m == *name) {
                let hung = faults.hung;
                *faults = MethodFaults {
                    hung,
                    ..MethodFaults::default()
                };
            }
        }
        Ok(())
    }

    /// Lets every call hung or held on `method` proceed and stops hanging new ones.
    pub fn release(&self, method: &str) -> Result<(), String> {
        let method = Self::method(method)?;
        let mut inner = self.lock();
        if let Some(faults) = inner.methods.get_mut(method) {
            faults.hang = false;
        }
        Self::decide(&mut inner, Some(method), Decision::Release);
        // Under the lock, so a call that saw `hang == true` has already registered its waiter.
        self.releases[method].notify_waiters();
        Ok(())
    }

    /// Ends the calls held on `method` (all methods when `None`); returns how many.
    pub fn drop_held(&self, method: Option<&str>) -> Result<usize, String> {
        let method = method.map(Self::method).transpose()?;
        Ok(Self::decide(&mut self.lock(), method, Decision::Drop))
    }

    fn decide(inner: &mut Inner, method: Option<&str>, decision: Decision) -> usize {
        let ids: Vec<u64> = inner
            .held
            .iter()
            .filter(|(_, (m, _))| method.is_none_or(|x| x == *m))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            if let Some((m, tx)) = inner.held.remove(id) {
                tracing::info!(method = m, ?decision, "held call decided");
                let _ = tx.send(decision);
            }
        }
        ids.len()
    }

    /// Calls currently held by a `hold` fault, per method.
    pub fn held(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (m, _) in self.lock().held.values() {
            *out.entry(m.to_string()).or_default() += 1;
        }
        out
    }

    /// Holds one call of `method` until `release` or `drop`.
    async fn wait_held(&self, method: &'static str) -> Decision {
        let (rx, id) = {
            let mut inner = self.lock();
            let (tx, rx) = oneshot::channel();
            inner.next_held += 1;
            let id = inner.next_held;
            inner.held.insert(id, (method, tx));
            (rx, id)
        };
        tracing::info!(method, "call held until released or dropped");
        // A caller that goes away (its process killed) takes this future with it: the call
        // is no longer held.
        struct Forget<'a>(&'a FaultTable, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.lock().held.remove(&self.1);
            }
        }
        let _forget = Forget(self, id);
        rx.await.unwrap_or(Decision::Drop)
    }

    /// For a call whose verdict was [`Verdict::ProceedThenHold`], after it ran: waits until
    /// its answer may be sent ([`Decision::Release`]) or must be discarded.
    pub async fn hold_answer(&self, method: &'static str) -> Decision {
        self.wait_held(method).await
    }

    /// Counts one call against the method's `hold` fault: `Some(after)` when this is the call
    /// to hold.
    fn take_hold(&self, method: &'static str) -> Option<bool> {
        let mut inner = self.lock();
        let faults = inner.methods.get_mut(method)?;
        let (left, after) = faults.hold.as_mut()?;
        *left -= 1;
        if *left > 0 {
            return None;
        }
        let after = *after;
        faults.hold = None;
        Some(after)
    }

    /// Calls currently hung, per method (only methods with at least one).
    pub fn hung(&self) -> BTreeMap<String, u64> {
        self.lock()
            .methods
            .iter()
            .filter(|(_, f)| f.hung > 0)
            .map(|(m, f)| (m.to_string(), f.hung))
            .collect()
    }

    /// Applies the faults armed on `method` to one call, waiting as they say.
    pub async fn before_call(&self, method: &'static str) -> Verdict {
        let hold_after = match self.take_hold(method) {
            Some(false) => {
                if self.wait_held(method).await == Decision::Drop {
                    return Verdict::Dropped;
                }
                false
            }
            Some(true) => true,
            None => false,
        };
        match self.other_faults(method).await {
            Verdict::Proceed if hold_after => Verdict::ProceedThenHold,
            verdict => verdict,
        }
    }

    /// Hang, latency and the error faults of one call.
    async fn other_faults(&self, method: &'static str) -> Verdict {
        // Created before looking at the flag: `notify_waiters` wakes every `Notified` that
        // exists when it runs, so a `release` racing with this call cannot be missed.
        let released = self.releases[method].notified();
        let hang = {
            let mut inner = self.lock();
            let faults = inner.methods.entry(method).or_default();
            if faults.hang {
                faults.hung += 1;
            }
            faults.hang
        };
        if hang {
            tracing::info!(method, "call hung until released");
            released.await;
            let mut inner = self.lock();
            if let Some(faults) = inner.methods.get_mut(method) {
                faults.hung = faults.hung.saturating_sub(1);
            }
            tracing::info!(method, "hung call released");
        } else {
            drop(released);
        }

        let latency = self.lock().methods.get(method).and_then(|f| f.latency);
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }

        let mut inner = self.lock();
        let Inner { methods, rng, .. } = &mut *inner;
        let Some(faults) = methods.get_mut(method) else {
            return Verdict::Proceed;
        };
        if let Some((code, remaining, message)) = faults.fail_next.as_mut() {
            let status = Status::new(
                (*code).into(),
                message
                    .clone()
                    .unwrap_or_else(|| format!("injected fault: {code}")),
            );
            *remaining = remaining.saturating_sub(1);
            if *remaining == 0 {
                faults.fail_next = None;
            }
            return Verdict::Fail(status);
        }
        if let Some((code, probability)) = faults.fail_probability
            && rng.random_bool(probability)
        {
            return Verdict::Fail(Status::new(
                code.into(),
                format!("injected fault: {code} (probability {probability})"),
            ));
        }
        Verdict::Proceed
    }

    /// For a `CreateVolume` call that succeeded: whether to answer `DEADLINE_EXCEEDED` instead
    /// (consuming one of the armed `create_then_deadline_exceeded` calls).
    pub fn take_deadline_after_create(&self) -> bool {
        let mut inner = self.lock();
        match inner.methods.get_mut("CreateVolume") {
            Some(faults) if faults.deadline_after_create > 0 => {
                faults.deadline_after_create -= 1;
                true
            }
            _ => false,
        }
    }

    /// For a `CreateVolume` call that succeeded: the capacity to report instead of the real
    /// one, if a `create_reports_capacity` fault is armed (consuming one of its calls).
    pub fn take_reported_capacity(&self) -> Option<i64> {
        let mut inner = self.lock();
        let faults = inner.methods.get_mut("CreateVolume")?;
        let (bytes, remaining) = faults.reported_capacity.as_mut()?;
        let bytes = *bytes;
        *remaining -= 1;
        if *remaining == 0 {
            faults.reported_capacity = None;
        }
        Some(bytes)
    }

    /// Which rule-breaking behaviours are armed (they last until cleared).
    pub fn misbehaviour(&self) -> Misbehaviour {
        let inner = self.lock();
        let create = inner.methods.get("CreateVolume");
        let delete = inner.methods.get("DeleteVolume");
        Misbehaviour {
            create_ignores_parameters: create.is_some_and(|f| f.ignore_parameters),
            create_not_idempotent: create.is_some_and(|f| f.not_idempotent),
            delete_unknown_not_found: delete.is_some_and(|f| f.unknown_not_found),
            delete_again_not_found: delete.is_some_and(|f| f.again_not_found),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock would be a bug in this file; keep serving anyway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(verdict: Verdict) -> Option<tonic::Code> {
        match verdict {
            Verdict::Proceed | Verdict::ProceedThenHold => None,
            Verdict::Dropped => Some(tonic::Code::Unavailable),
            Verdict::Fail(status) => Some(status.code()),
        }
    }

    #[tokio::test]
    async fn error_for_next_n_calls_then_proceeds() {
        let table = FaultTable::new(1);
        table
            .set(
                "DeleteVolume",
                Fault::Error {
                    code: GrpcCode::Unavailable,
                    count: 2,
                    message: None,
                },
            )
            .unwrap();
        assert_eq!(
            code_of(table.before_call("DeleteVolume").await),
            Some(tonic::Code::Unavailable)
        );
        assert_eq!(code_of(table.before_call("CreateVolume").await), None);
        assert_eq!(
            code_of(table.before_call("DeleteVolume").await),
            Some(tonic::Code::Unavailable)
        );
        assert_eq!(code_of(table.before_call("DeleteVolume").await), None);
    }

    #[tokio::test]
    async fn probability_is_reproducible_for_a_seed() {
        async fn draws(seed: u64) -> Vec<bool> {
            let table = FaultTable::new(seed);
            table
                .set(
                    "CreateVolume",
                    Fault::ErrorProbability {
                        code: GrpcCode::Aborted,
                        probability: 0.5,
                    },
                )
                .unwrap();
            let mut out = Vec::new();
            for _ in 0..64 {
                out.push(code_of(table.before_call("CreateVolume").await).is_some());
            }
            out
        }
        let a = draws(7).await;
        assert_eq!(a, draws(7).await);
        assert!(a.iter().any(|x| *x) && a.iter().any(|x| !*x));
    }

    #[tokio::test]
    async fn hang_blocks_until_release() {
        use std::sync::Arc;

        let table = Arc::new(FaultTable::new(1));
        table.set("CreateVolume", Fault::Hang).unwrap();
        let call = tokio::spawn({
            let table = table.clone();
            async move { code_of(table.before_call("CreateVolume").await) }
        });
        while table.hung().get("CreateVolume").copied() != Some(1) {
            tokio::task::yield_now().await;
        }
        assert!(!call.is_finished());
        table.release("CreateVolume").unwrap();
        assert_eq!(call.await.unwrap(), None);
        assert!(table.hung().is_empty());
        // Released means the hang fault is gone too.
        assert_eq!(code_of(table.before_call("CreateVolume").await), None);
    }

    #[tokio::test]
    async fn hold_takes_exactly_the_nth_call_before_or_after_it_runs() {
        use std::sync::Arc;

        let table = Arc::new(FaultTable::new(1));
        // nth 0 disarms.
        table
            .set(
                "DeleteVolume",
                Fault::Hold {
                    nth: 1,
                    after: false,
                },
            )
            .unwrap();
        table
            .set(
                "DeleteVolume",
                Fault::Hold {
                    nth: 0,
                    after: false,
                },
            )
            .unwrap();
        assert!(matches!(
            table.before_call("DeleteVolume").await,
            Verdict::Proceed
        ));
        table
            .set(
                "DeleteVolume",
                Fault::Hold {
                    nth: 2,
                    after: false,
                },
            )
            .unwrap();
        assert!(matches!(
            table.before_call("DeleteVolume").await,
            Verdict::Proceed
        ));
        let held = tokio::spawn({
            let table = table.clone();
            async move { table.before_call("DeleteVolume").await }
        });
        while table.held().get("DeleteVolume").copied() != Some(1) {
            tokio::task::yield_now().await;
        }
        assert_eq!(table.drop_held(Some("DeleteVolume")), Ok(1));
        assert!(matches!(held.await.unwrap(), Verdict::Dropped));
        assert!(matches!(
            table.before_call("DeleteVolume").await,
            Verdict::Proceed
        ));

        table
            .set(
                "CreateVolume",
                Fault::Hold {
                    nth: 1,
                    after: true,
                },
            )
            .unwrap();
        assert!(matches!(
            table.before_call("CreateVolume").await,
            Verdict::ProceedThenHold
        ));
        let answer = tokio::spawn({
            let table = table.clone();
            async move { table.hold_answer("CreateVolume").await }
        });
        while table.held().get("CreateVolume").copied() != Some(1) {
            tokio::task::yield_now().await;
        }
        table.release("CreateVolume").unwrap();
        assert_eq!(answer.await.unwrap(), Decision::Release);
        assert!(table.held().is_empty());
    }

    #[test]
    fn rejects_unknown_methods_and_bad_faults() {
        let table = FaultTable::new(1);
        assert!(table.set("CreateVolumes", Fault::Hang).is_err());
        assert!(
            table
                .set(
                    "Probe",
                    Fault::ErrorProbability {
                        code: GrpcCode::Internal,
                        probability: 1.5
                    }
                )
                .is_err()
        );
        assert!(
            table
                .set(
                    "DeleteVolume",
                    Fault::CreateThenDeadlineExceeded { count: 1 }
                )
                .is_err()
        );
        table
            .set(
                "CreateVolume",
                Fault::CreateThenDeadlineExceeded { count: 1 },
            )
            .unwrap();
        assert!(table.take_deadline_after_create());
        assert!(!table.take_deadline_after_create());
    }

    #[test]
    fn misbehaviours_apply_to_their_method_until_cleared() {
        let table = FaultTable::new(1);
        assert!(
            table
                .set("DeleteVolume", Fault::CreateNotIdempotent)
                .is_err()
        );
        assert!(
            table
                .set("CreateVolume", Fault::DeleteAgainNotFound)
                .is_err()
        );
        table
            .set("CreateVolume", Fault::CreateIgnoresParameters)
            .unwrap();
        table
            .set("DeleteVolume", Fault::DeleteUnknownNotFound)
            .unwrap();
        let armed = table.misbehaviour();
        assert!(armed.create_ignores_parameters && armed.delete_unknown_not_found);
        assert!(!armed.create_not_idempotent && !armed.delete_again_not_found);
        table.clear(Some("CreateVolume")).unwrap();
        assert!(!table.misbehaviour().create_ignores_parameters);
        assert!(table.misbehaviour().delete_unknown_not_found);
    }

    #[test]
    fn reported_capacity_applies_to_the_next_calls_only() {
        let table = FaultTable::new(1);
        let fault = |bytes, count| Fault::CreateReportsCapacity { bytes, count };
        assert!(table.set("DeleteVolume", fault(0, 1)).is_err());
        assert!(table.set("CreateVolume", fault(-1, 1)).is_err());
        assert_eq!(table.take_reported_capacity(), None);
        table.set("CreateVolume", fault(1024, 2)).unwrap();
        assert_eq!(table.take_reported_capacity(), Some(1024));
        assert_eq!(table.take_reported_capacity(), Some(1024));
        assert_eq!(table.take_reported_capacity(), None);
    }
}
