//! What a controller remembers about an object between reconciles: one entry
//! per object UID (an object re-created under the same name is a new object
//! and inherits nothing), bounded, and forgotten in one place — when the
//! object is done or deleted. Every entry only saves work (a request, a call,
//! a wait) and can be recomputed from the API server, so a full map is simply
//! cleared.
//!
//! Each entry carries the object's retry state: how many attempts failed in a
//! row, and which attempt failed last and when it may run again. A reconcile
//! about to make that same attempt earlier waits out the rest of the backoff.
//! Without that, a failed attempt is repeated at once by the watch events it
//! caused itself — the intent finalizer it wrote, the PV it made Terminating,
//! the protection finalizers the control plane then drops — and a failing
//! backend is called three times in a few milliseconds. Any other attempt (the
//! claim was deleted meanwhile, its class changed, the PV's policy changed)
//! goes at once.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bound on remembered objects per controller; beyond it the map is cleared.
const MAX_OBJECTS: usize = 100_000;

/// What an attempt sets out to do, as a fingerprint of the inputs it is
/// decided on: two reconciles with equal attempts would make the same calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt(u64);

impl Attempt {
    pub fn of(inputs: impl Hash) -> Attempt {
        let mut h = DefaultHasher::new();
        inputs.hash(&mut h);
        Attempt(h.finish())
    }
}

/// Whether a failure holds back the attempt that failed (it did something:
/// a call, a write) or only delays the next look (nothing was tried, as when
/// this replica is not the leader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    Attempt,
    Nothing,
}

#[derive(Default)]
struct Slot<E> {
    failures: u32,
    /// The attempt of the reconcile now running or last run.
    attempt: Option<Attempt>,
    /// When the attempt that failed last may run again, and that attempt.
    due: Option<(Instant, Attempt)>,
    entry: E,
}

pub struct Memory<E> {
    retry_start: Duration,
    retry_max: Duration,
    objects: Mutex<HashMap<String, Slot<E>>>,
}

impl<E: Default> Memory<E> {
    /// `--retry-interval-start` doubling up to `--retry-interval-max`.
    pub fn new(retry_start: Duration, retry_max: Duration) -> Memory<E> {
        Memory {
            retry_start,
            retry_max,
            objects: Mutex::new(HashMap::new()),
        }
    }

    pub fn retry_max(&self) -> Duration {
        self.retry_max
    }

    fn slot<T>(&self, uid: &str, f: impl FnOnce(&mut Slot<E>) -> T) -> T {
        let mut objects = self.objects.lock().expect("object memory poisoned");
        if !objects.contains_key(uid) && objects.len() >= MAX_OBJECTS {
            objects.clear();
        }
        f(objects.entry(uid.to_string()).or_default())
    }

    /// Changes (creating it if needed) the entry of `uid`.
    pub fn with<T>(&self, uid: &str, f: impl FnOnce(&mut E) -> T) -> T {
        self.slot(uid, |s| f(&mut s.entry))
    }

    /// Reads the entry of `uid`, if there is one (reading creates nothing).
    pub fn read<T>(&self, uid: &str, f: impl FnOnce(&E) -> T) -> Option<T> {
        self.objects
            .lock()
            .expect("object memory poisoned")
            .get(uid)
            .map(|s| f(&s.entry))
    }

    /// The object is done, or deleted: everything about it goes.
    pub fn forget(&self, uid: &str) {
        self.objects
            .lock()
            .expect("object memory poisoned")
            .remove(uid);
    }

    pub fn len(&self) -> usize {
        self.objects.lock().expect("object memory poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The attempt that failed last and how long it is still held back, if
    /// it is (reading creates nothing).
    pub fn held(&self, uid: &str) -> Option<(Attempt, Duration)> {
        let now = Instant::now();
        let objects = self.objects.lock().expect("object memory poisoned");
        let (at, attempt) = objects.get(uid)?.due?;
        (at > now).then(|| (attempt, at - now))
    }

    /// Notes the attempt a reconcile makes now, for [`Memory::failed`].
    pub fn note(&self, uid: &str, attempt: Attempt) {
        self.slot(uid, |s| s.attempt = Some(attempt));
    }

    /// Before `attempt` is made: how long it must still wait because the same
    /// attempt failed, or `None` to go now. The attempt is noted.
    pub fn begin(&self, uid: &str, attempt: Attempt) -> Option<Duration> {
        let wait = still_held(self.held(uid), attempt);
        self.note(uid, attempt);
        wait
    }

    /// Records a failure of the attempt begun last; returns the wait before
    /// the next try: `start · 2^failures`, capped at `max`.
    pub fn failed(&self, uid: &str, hold: Hold) -> Duration {
        self.slot(uid, |s| {
            let delay =
                crate::controller::retry_delay(self.retry_start, self.retry_max, s.failures);
            s.failures = s.failures.saturating_add(1);
            hold_back(s, hold, delay);
            delay
        })
    }

    /// Records a failure that waits `delay` whatever the count (an
    /// infeasible request waits `--retry-interval-max`).
    pub fn failed_for(&self, uid: &str, delay: Duration) -> Duration {
        self.slot(uid, |s| {
            s.failures = s.failures.saturating_add(1);
            hold_back(s, Hold::Attempt, delay);
            delay
        })
    }

    /// Lets the held attempt go now, as if its backoff had passed.
    #[cfg(test)]
    pub fn expire_hold(&self, uid: &str) {
        if let Some(s) = self.objects.lock().expect("poisoned").get_mut(uid) {
            s.due = None;
        }
    }

    /// The attempt succeeded: the next failure starts the backoff afresh.
    pub fn succeeded(&self, uid: &str) {
        if let Some(s) = self
            .objects
            .lock()
            .expect("object memory poisoned")
            .get_mut(uid)
        {
            s.failures = 0;
            s.due = None;
        }
    }
}

/// How long `attempt` still waits, given what [`Memory::held`] says.
pub fn still_held(held: Option<(Attempt, Duration)>, attempt: Attempt) -> Option<Duration> {
    held.and_then(|(failed, wait)| (failed == attempt).then_some(wait))
}

fn hold_back<E>(s: &mut Slot<E>, hold: Hold, delay: Duration) {
    s.due = match (hold, s.attempt) {
        (Hold::Attempt, Some(attempt)) => Some((Instant::now() + delay, attempt)),
        _ => None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Memory<u32> {
        Memory::new(Duration::from_secs(1), Duration::from_secs(5))
    }

    #[test]
    fn backoff_doubles_up_to_max_per_object_and_resets_on_success() {
        let m = memory();
        let delays: Vec<u64> = (0..5)
            .map(|_| m.failed("a", Hold::Nothing).as_secs())
            .collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
        assert_eq!(m.failed("b", Hold::Nothing).as_secs(), 1, "independent");
        m.succeeded("a");
        assert_eq!(m.failed("a", Hold::Nothing).as_secs(), 1);
        for _ in 0..100 {
            m.failed("c", Hold::Nothing);
        }
        assert_eq!(m.failed("c", Hold::Nothing), Duration::from_secs(5));
    }

    #[test]
    fn the_same_attempt_waits_out_its_backoff_and_another_goes_at_once() {
        let m = memory();
        let create = Attempt::of(("provision", "node-1"));
        assert_eq!(m.begin("a", create), None, "nothing failed yet");
        m.failed("a", Hold::Attempt);
        let wait = m.begin("a", create).expect("the same attempt waits");
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        assert_eq!(
            m.begin("a", Attempt::of(("abandon", "node-1"))),
            None,
            "other work goes at once"
        );
        assert_eq!(
            m.begin("a", Attempt::of(("provision", "node-2"))),
            None,
            "other inputs go at once"
        );
        m.succeeded("a");
        assert_eq!(m.begin("a", create), None, "a success clears the hold");
    }

    #[test]
    fn a_failure_that_tried_nothing_holds_nothing_back() {
        let m = memory();
        let attempt = Attempt::of("delete");
        m.begin("a", attempt);
        m.failed("a", Hold::Nothing);
        assert_eq!(m.begin("a", attempt), None);
        m.failed_for("a", Duration::from_secs(60));
        assert!(m.begin("a", attempt).unwrap() > Duration::from_secs(59));
    }

    #[test]
    fn reading_creates_nothing_and_forgetting_starts_afresh() {
        let m = memory();
        assert_eq!(m.read("x", |e| *e), None);
        assert!(m.is_empty());
        m.with("x", |e| *e = 7);
        m.begin("x", Attempt::of(1));
        m.failed("x", Hold::Attempt);
        m.forget("x");
        assert!(m.is_empty());
        assert_eq!(m.begin("x", Attempt::of(1)), None, "no inherited hold");
        assert_eq!(m.failed("x", Hold::Nothing).as_secs(), 1, "no failures");
    }
}
