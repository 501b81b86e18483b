//! Write-clocked freshness (DESIGN §2.2): the API server's version taken from a write of ours
//! instead of a request of its own. A PV we create gets the resourceVersion of the etcd revision
//! that wrote it, committed after the create reached the API server; so a create *dispatched*
//! after a check began (the innermost client layer numbers each stamped request as it leaves:
//! [`super::dispatch`]) answers with a version given after the check began, as a round's list
//! would, at no cost during a burst, where PV creates leave one after another.
//!
//! It holds only where PVs and claims share one etcd revision space (no `--etcd-servers-overrides`
//! for either). Nothing the sidecar can ask proves that, so a **detector** compares the clock with
//! every round list that runs anyway: a create completed before the list left must have a version
//! no newer than the list's, and the first create dispatched after the list answered a newer one.
//! The clock is used only while such a comparison passed within [`TRUST_FOR`]; one that fails
//! turns it off for the life of the process (logged), and `--freshness-from-writes=false` turns
//! it off altogether.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// How long a passed comparison is trusted; after it the next check sends a round list again.
pub const TRUST_FOR: Duration = Duration::from_secs(300);

/// The latest dispatched create that completed, by dispatch number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Completed {
    seq: u64,
    version: u64,
}

/// The clock: dispatch numbers, the latest completion, whether it is trusted.
pub struct WriteClock {
    dispatched: AtomicU64,
    completed: watch::Sender<Completed>,
    /// Stamped creates not completed yet (queued or in flight): a dispatch is coming.
    pending: AtomicUsize,
    /// Off for good: turned off, or a comparison failed.
    off: AtomicBool,
    /// When a comparison last passed.
    trusted_at: Mutex<Option<Instant>>,
}

impl WriteClock {
    pub fn new(on: bool) -> Arc<WriteClock> {
        Arc::new(WriteClock {
            dispatched: AtomicU64::new(0),
            completed: watch::Sender::new(Completed::default()),
            pending: AtomicUsize::new(0),
            off: AtomicBool::new(!on),
            trusted_at: Mutex::new(None),
        })
    }

    /// A stamp for a create about to be sent: carried in its request's extensions.
    pub fn stamp(self: &Arc<Self>) -> Stamp {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Stamp {
            clock: self.clone(),
            seq: Arc::new(AtomicU64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
        }
    }

    /// How many stamped creates have left so far.
    pub fn now(&self) -> u64 {
        self.dispatched.load(Ordering::SeqCst)
    }

    /// Whether the clock may answer a check now.
    pub fn trusted(&self) -> bool {
        !self.off.load(Ordering::SeqCst)
            && self
                .trusted_at
                .lock()
                .expect("clock poisoned")
                .is_some_and(|at| at.elapsed() < TRUST_FOR)
    }

    /// Whether a stamped create is queued or in flight (so one is about to answer).
    pub fn busy(&self) -> bool {
        self.pending.load(Ordering::SeqCst) > 0
    }

    /// The version of the first create dispatched after dispatch number `seq0` to complete, within
    /// `wait`.
    pub async fn version_after(&self, seq0: u64, wait: Duration) -> Option<u64> {
        let mut rx = self.completed.subscribe();
        let seen = tokio::time::timeout(wait, rx.wait_for(|c| c.seq > seq0)).await;
        match seen {
            Ok(Ok(c)) => Some(c.version),
            _ => None,
        }
    }

    /// What a comparison starts from, taken before a round list leaves: the latest completion.
    pub fn before_list(&self) -> (u64, u64) {
        let c = *self.completed.borrow();
        (c.seq, c.version)
    }

    /// Compares a round list's `version` with the creates around it: `before` (taken with
    /// [`Self::before_list`]) must not be newer; the first create dispatched after now must be.
    /// Waits for that create at most `wait`; passes, fails (off for good) or says nothing.
    pub async fn compare(&self, before: (u64, u64), version: u64, wait: Duration) {
        if self.off.load(Ordering::SeqCst) {
            return;
        }
        if before.0 > 0 && before.1 > version {
            return self.fail(format!(
                "a PV created before a round list has version {}, newer than the list's {version}",
                before.1
            ));
        }
        let Some(after) = self.version_after(self.now(), wait).await else {
            return;
        };
        if after <= version {
            return self.fail(format!(
                "a PV created after a round list has version {after}, not newer than the list's {version}"
            ));
        }
        let mut at = self.trusted_at.lock().expect("clock poisoned");
        if at.is_none() {
            info!(
                "freshness from writes: PVs and claims share one revision space; using the versions of our PV creates"
            );
        }
        *at = Some(Instant::now());
    }

    /// Trusts the clock as a passed comparison would (for tests of its users).
    #[cfg(test)]
    pub(crate) fn trust_for_test(&self) {
        *self.trusted_at.lock().expect("clock poisoned") = Some(Instant::now());
    }

    fn fail(&self, why: String) {
        if !self.off.swap(true, Ordering::SeqCst) {
            warn!(
                reason = %why,
                "freshness from writes turned off: PVs and claims do not look like one etcd revision space (--etcd-servers-overrides?); rounds ask the API server instead"
            );
        }
    }

    fn dispatch(&self) -> u64 {
        self.dispatched.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn complete(&self, seq: u64, version: Option<u64>) {
        if let Some(version) = version.filter(|_| seq > 0) {
            self.completed.send_if_modified(|c| {
                let newer = seq > c.seq;
                if newer {
                    *c = Completed { seq, version };
                }
                newer
            });
        }
    }
}

/// A create's stamp: numbered when it leaves, completed with the version it answered.
#[derive(Clone)]
pub struct Stamp {
    clock: Arc<WriteClock>,
    seq: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Stamp {
    /// Numbers the request as it leaves (the dispatch layer calls this).
    pub fn dispatched(&self) {
        if self.seq.load(Ordering::SeqCst) == 0 {
            self.seq.store(self.clock.dispatch(), Ordering::SeqCst);
        }
    }

    /// The create answered the object it made, at `version`; `None`: it made nothing.
    pub fn complete(&self, version: Option<&str>) {
        if !self.done.swap(true, Ordering::SeqCst) {
            let version = version.and_then(|v| v.parse().ok());
            self.clock
                .complete(self.seq.load(Ordering::SeqCst), version);
            self.clock.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Stamp {
    fn drop(&mut self) {
        // The last copy of a stamp never completed (its request failed or was dropped).
        if Arc::strong_count(&self.done) == 1 && !self.done.swap(true, Ordering::SeqCst) {
            self.clock.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Creates `pv` (as `Api::create` does), stamped when a clock is given: its dispatch is numbered
/// and its answer's version completes the stamp.
pub async fn create_pv(
    client: &kube::Client,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    stamp: Option<Stamp>,
) -> kube::Result<k8s_openapi::api::core::v1::PersistentVolume> {
    use kube::ResourceExt;
    let body = serde_json::to_vec(pv).map_err(kube::Error::SerdeError)?;
    let mut req = kube::core::Request::new("/api/v1/persistentvolumes")
        .create(&kube::api::PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    req.extensions_mut().insert("create");
    if let Some(stamp) = &stamp {
        req.extensions_mut().insert(stamp.clone());
    }
    let created: k8s_openapi::api::core::v1::PersistentVolume = client.request(req).await?;
    if let Some(stamp) = stamp {
        stamp.complete(created.resource_version().as_deref());
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(clock: &Arc<WriteClock>, version: &str) {
        let stamp = clock.stamp();
        stamp.dispatched();
        stamp.complete(Some(version));
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_takes_the_version_of_a_create_dispatched_after_it_began() {
        let clock = WriteClock::new(true);
        sent(&clock, "10");
        let seq0 = clock.now();
        // A create queued before the check but dispatched after it counts; one dispatched
        // before does not.
        let queued = clock.stamp();
        assert!(clock.busy());
        let waiting = tokio::spawn({
            let clock = clock.clone();
            async move { clock.version_after(seq0, Duration::from_secs(1)).await }
        });
        tokio::task::yield_now().await;
        queued.dispatched();
        queued.complete(Some("17"));
        assert_eq!(waiting.await.unwrap(), Some(17));
        assert!(!clock.busy());
        assert_eq!(
            clock
                .version_after(clock.now(), Duration::from_millis(10))
                .await,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_is_trusted_only_after_a_comparison_passed_and_never_after_one_failed() {
        let clock = WriteClock::new(true);
        assert!(!clock.trusted(), "not before any comparison");
        sent(&clock, "10");
        let before = clock.before_list();
        let compared = tokio::spawn({
            let clock = clock.clone();
            async move { clock.compare(before, 12, Duration::from_secs(1)).await }
        });
        tokio::task::yield_now().await;
        sent(&clock, "13");
        compared.await.unwrap();
        assert!(clock.trusted());
        tokio::time::sleep(TRUST_FOR).await;
        assert!(!clock.trusted(), "a comparison is trusted for a while only");
        // PVs on another etcd: their versions say nothing of the claims'.
        let before = clock.before_list();
        clock.compare(before, 5, Duration::from_secs(1)).await;
        assert!(!clock.trusted());
        let before = clock.before_list();
        let compared = tokio::spawn({
            let clock = clock.clone();
            async move { clock.compare(before, 20, Duration::from_secs(1)).await }
        });
        tokio::task::yield_now().await;
        sent(&clock, "21");
        compared.await.unwrap();
        assert!(!clock.trusted(), "off for good");
        assert!(!WriteClock::new(false).trusted(), "turned off");
    }

    #[test]
    fn a_stamp_dropped_unanswered_is_no_longer_pending() {
        let clock = WriteClock::new(true);
        let stamp = clock.stamp();
        let copy = stamp.clone();
        drop(copy);
        assert!(clock.busy(), "a copy went, the stamp did not");
        drop(stamp);
        assert!(!clock.busy());
    }
}
