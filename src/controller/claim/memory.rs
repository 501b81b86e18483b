//! What the claim path remembers between reconciles, in one place, keyed by
//! claim UID (a claim re-created under the same name is a new claim and
//! inherits nothing). Every entry only saves work — a `CreateVolume`, a
//! request, a wait — and is recomputable from the API server, so the map is
//! bounded by simply clearing it when it fills. An entry is forgotten in one
//! place, [`ClaimMemory::forget`]: when its claim is done or deleted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::csi::pb;

/// Bound on remembered claims; beyond it the map is cleared (see above).
const MAX_CLAIMS: usize = 100_000;

#[derive(Default)]
struct Entry {
    /// When the first attempt started, for the provisioning-duration metric.
    started: Option<Instant>,
    /// Failed attempts in a row, for the per-claim exponential backoff.
    failures: u32,
    /// The driver's answer whose PV is not saved yet: a retry saves it
    /// without another `CreateVolume`.
    created: Option<pb::Volume>,
    /// The last `CreateVolume` was `InvalidArgument`: when, and the UID of the
    /// StorageClass it was built from (upstream's "infeasible" slow set).
    infeasible: Option<(Instant, String)>,
    /// This process saved (or found) the claim's PV: the PV cache may not
    /// show it yet.
    pv_saved: bool,
    /// This process removed the claim's intent: a stale cached copy that still
    /// shows it needs no second request.
    intent_released: bool,
}

pub struct ClaimMemory {
    retry_start: Duration,
    retry_max: Duration,
    claims: Mutex<HashMap<String, Entry>>,
}

impl ClaimMemory {
    pub fn new(retry_start: Duration, retry_max: Duration) -> ClaimMemory {
        ClaimMemory {
            retry_start,
            retry_max,
            claims: Mutex::new(HashMap::new()),
        }
    }

    fn with<T>(&self, uid: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut claims = self.claims.lock().expect("claim memory poisoned");
        if !claims.contains_key(uid) && claims.len() >= MAX_CLAIMS {
            claims.clear();
        }
        f(claims.entry(uid.to_string()).or_default())
    }

    fn read<T>(&self, uid: &str, f: impl FnOnce(&Entry) -> T) -> Option<T> {
        self.claims
            .lock()
            .expect("claim memory poisoned")
            .get(uid)
            .map(f)
    }

    /// The claim is done (bound, nothing of ours left on it) or deleted.
    pub fn forget(&self, uid: &str) {
        self.claims
            .lock()
            .expect("claim memory poisoned")
            .remove(uid);
    }

    pub fn len(&self) -> usize {
        self.claims.lock().expect("claim memory poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Notes the start of an attempt (the first one counts).
    pub fn attempt_started(&self, uid: &str) {
        self.with(uid, |e| {
            e.started.get_or_insert_with(Instant::now);
        });
    }

    /// How long ago the first attempt started, once, for the duration metric.
    pub fn take_started(&self, uid: &str) -> Option<Duration> {
        self.with(uid, |e| e.started.take().map(|t| t.elapsed()))
    }

    /// Records a failure and returns how long to wait before the next try:
    /// `--retry-interval-start · 2^failures`, capped at `--retry-interval-max`.
    pub fn next_delay(&self, uid: &str) -> Duration {
        self.with(uid, |e| {
            let delay =
                crate::controller::retry_delay(self.retry_start, self.retry_max, e.failures);
            e.failures = e.failures.saturating_add(1);
            delay
        })
    }

    pub fn succeeded(&self, uid: &str) {
        if let Some(e) = self.claims.lock().expect("poisoned").get_mut(uid) {
            e.failures = 0;
        }
    }

    pub fn created(&self, uid: &str) -> Option<pb::Volume> {
        self.read(uid, |e| e.created.clone()).flatten()
    }

    pub fn remember_created(&self, uid: &str, volume: &pb::Volume) {
        self.with(uid, |e| e.created = Some(volume.clone()));
    }

    pub fn forget_created(&self, uid: &str) {
        self.with(uid, |e| e.created = None);
    }

    /// Marks the claim's last `CreateVolume` infeasible, for the StorageClass
    /// with UID `class_uid`.
    pub fn mark_infeasible(&self, uid: &str, class_uid: &str) {
        self.with(uid, |e| {
            e.infeasible = Some((Instant::now(), class_uid.to_string()))
        });
    }

    /// How long an infeasible claim still waits: until `--retry-interval-max`
    /// has passed, or at once when its StorageClass changed.
    pub fn infeasible_wait(&self, uid: &str, class_uid: &str) -> Option<Duration> {
        let mut claims = self.claims.lock().expect("poisoned");
        let e = claims.get_mut(uid)?;
        let (at, class) = e.infeasible.as_ref()?;
        let elapsed = at.elapsed();
        if class != class_uid || elapsed >= self.retry_max {
            e.infeasible = None;
            return None;
        }
        Some(self.retry_max - elapsed)
    }

    pub fn mark_pv_saved(&self, uid: &str) {
        self.with(uid, |e| {
            e.pv_saved = true;
            e.created = None;
        });
    }

    pub fn pv_saved(&self, uid: &str) -> bool {
        self.read(uid, |e| e.pv_saved).unwrap_or(false)
    }

    pub fn mark_intent_released(&self, uid: &str) {
        self.with(uid, |e| e.intent_released = true);
    }

    pub fn intent_released(&self, uid: &str) -> bool {
        self.read(uid, |e| e.intent_released).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> ClaimMemory {
        ClaimMemory::new(Duration::from_secs(1), Duration::from_secs(5))
    }

    #[test]
    fn backoff_doubles_up_to_max_per_claim_and_resets_on_success() {
        let m = memory();
        let delays: Vec<u64> = (0..5).map(|_| m.next_delay("a").as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
        assert_eq!(m.next_delay("b").as_secs(), 1, "claims are independent");
        m.succeeded("a");
        assert_eq!(m.next_delay("a").as_secs(), 1);
        for _ in 0..100 {
            m.next_delay("c");
        }
        assert_eq!(m.next_delay("c"), Duration::from_secs(5), "no overflow");
    }

    #[test]
    fn a_forgotten_claim_starts_afresh() {
        let m = memory();
        m.next_delay("a");
        m.next_delay("a");
        m.mark_pv_saved("a");
        m.mark_intent_released("a");
        m.forget("a");
        assert!(m.is_empty());
        assert!(!m.pv_saved("a") && !m.intent_released("a"));
        assert_eq!(m.next_delay("a").as_secs(), 1, "no inherited failures");
    }

    #[test]
    fn reading_does_not_create_entries() {
        let m = memory();
        assert!(!m.pv_saved("x"));
        assert!(m.created("x").is_none());
        assert!(m.infeasible_wait("x", "c").is_none());
        assert!(m.is_empty());
    }

    #[test]
    fn infeasible_waits_until_the_class_changes() {
        let m = memory();
        m.mark_infeasible("a", "class-1");
        let wait = m.infeasible_wait("a", "class-1").expect("still waiting");
        assert!(wait <= Duration::from_secs(5) && wait > Duration::from_secs(4));
        assert_eq!(
            m.infeasible_wait("a", "class-2"),
            None,
            "a new class retries"
        );
        assert_eq!(
            m.infeasible_wait("a", "class-1"),
            None,
            "and clears the mark"
        );
    }

    #[test]
    fn a_saved_pv_drops_the_remembered_answer() {
        let m = memory();
        let v = pb::Volume {
            volume_id: "h".into(),
            ..Default::default()
        };
        m.remember_created("a", &v);
        assert_eq!(m.created("a").map(|v| v.volume_id), Some("h".into()));
        m.mark_pv_saved("a");
        assert!(m.created("a").is_none() && m.pv_saved("a"));
    }
}
