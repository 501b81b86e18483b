//! The reconcilers. Each reads from the reflector caches to *find* work,
//! re-reads from the API server before any irreversible act (DESIGN §2.2),
//! decides through the pure `provision` module, acts, and records events.
//!
//! kube-runtime's `Controller` gives us the work queue: one reconcile per
//! object at a time, deduplicated triggers, bounded concurrency. What it lacks
//! — per-object exponential backoff — lives in [`Backoff`].

pub mod claim;
mod topology;
pub mod volume;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::reflector::Store;

use crate::csi::{CsiClient, pb};
use crate::kube::slim::Pv;
use crate::kube::{EventRecorder, LeaderGate};
use crate::metrics::Metrics;
use crate::provision::{DriverInfo, ProvisionOptions, SecretRef};

/// Everything the reconcilers share. Built once in `main`.
pub struct Context {
    pub client: Client,
    pub csi: CsiClient,
    pub driver: DriverInfo,
    pub options: ProvisionOptions,
    pub recorder: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub classes: Store<StorageClass>,
    pub leader: LeaderGate,
    pub claim_backoff: Backoff,
    pub volume_backoff: Backoff,
    /// Volumes the driver created whose PV is not saved yet, by claim UID.
    /// Only an optimisation (saves a `CreateVolume` on retry): after a restart
    /// the same volume is found again by its deterministic name.
    pub created: Mutex<HashMap<String, pb::Volume>>,
    /// Claims whose last `CreateVolume` was `InvalidArgument`: claim UID →
    /// (when, StorageClass UID). Retried only after `retry_max` or when the
    /// class changes (upstream: the lib's "infeasible" slow set).
    pub infeasible: Mutex<HashMap<String, (Instant, String)>>,
    /// First provisioning attempt per claim UID, for the duration metric.
    pub started: Mutex<HashMap<String, Instant>>,
    /// The PV cache: finds "this claim's PV exists" without a request. Only
    /// ever trusted for that answer (a PV once seen bound to the claim's UID
    /// did exist); "no PV" is always confirmed by the API server.
    pub volumes: Store<Pv>,
    /// PVs this process saved (or found saved) that the PV cache may not show
    /// yet, by PV name and claim UID ([`Context::remember_saved`]); an entry
    /// goes once the cache has the PV.
    pub saved: Remembered,
    /// Claims (UIDs) whose intent finalizer this process removed, so a stale
    /// cached copy that still shows it costs no second patch. An entry goes
    /// once the cache shows the claim without it.
    pub intent_dropped: Remembered,
    /// PVs (UIDs) whose deletion this process finished, so a stale cached
    /// copy that still shows them Released with our finalizer costs no
    /// second read. An entry goes once the cache shows the PV without it.
    pub deleted: Remembered,
}

/// A set of names this process knows to be done. The sets only save requests:
/// forgetting an entry costs one authoritative read, so when one fills it is
/// simply cleared.
#[derive(Default)]
pub struct Remembered(Mutex<HashSet<String>>);

/// The UID of the claim a PV is bound (or pre-bound) to.
pub fn bound_claim_uid(pv: &Pv) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
}

/// A PV name is derived from a (possibly truncated) claim UID, so "saved"
/// names both.
fn saved_key(pv_name: &str, claim_uid: &str) -> String {
    format!("{pv_name} {claim_uid}")
}

/// Bound on each [`Remembered`] set.
const MAX_REMEMBERED: usize = 100_000;

impl Remembered {
    pub fn insert(&self, key: &str) {
        let mut set = self.0.lock().expect("poisoned");
        if set.len() >= MAX_REMEMBERED {
            set.clear();
        }
        set.insert(key.to_string());
    }

    pub fn contains(&self, key: &str) -> bool {
        self.0.lock().expect("poisoned").contains(key)
    }

    pub fn remove(&self, key: &str) {
        self.0.lock().expect("poisoned").remove(key);
    }
}

/// Per-object exponential backoff: `start · 2^failures`, capped at `max`
/// (`--retry-interval-start`, `--retry-interval-max`).
pub struct Backoff {
    start: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(start: Duration, max: Duration) -> Backoff {
        Backoff {
            start,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next try.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("backoff map poisoned");
        let n = failures.entry(key.to_string()).or_insert(0);
        let delay = self
            .start
            .saturating_mul(2u32.saturating_pow((*n).min(31)))
            .min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .expect("backoff map poisoned")
            .remove(key);
    }

    pub fn max(&self) -> Duration {
        self.max
    }
}

impl Context {
    /// Reads the data of a secret the StorageClass refers to.
    pub async fn secret_data(&self, r: &SecretRef) -> Result<HashMap<String, String>, kube::Error> {
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &r.namespace);
        let secret = api.get(&r.name).await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// PVs as the sidecar reads, deletes and patches them: the slim shape.
    pub fn pv_api(&self) -> kube::Api<Pv> {
        kube::Api::all(self.client.clone())
    }

    /// PVs as the claim path creates them: the full object.
    pub fn pv_create_api(&self) -> kube::Api<PersistentVolume> {
        kube::Api::all(self.client.clone())
    }

    /// Whether the PV `name` is known, without a request, to exist and be
    /// bound to the claim with UID `claim_uid` (saved by us, or in the cache).
    pub fn pv_known_for(&self, name: &str, claim_uid: &str) -> bool {
        let cached = self
            .volumes
            .get(&kube::runtime::reflector::ObjectRef::new(name));
        if let Some(pv) = cached {
            self.saved.remove(&saved_key(name, claim_uid));
            return bound_claim_uid(&pv) == Some(claim_uid);
        }
        self.saved.contains(&saved_key(name, claim_uid))
    }

    /// Remembers that the PV `name`, bound to the claim `claim_uid`, is saved.
    pub fn remember_saved(&self, name: &str, claim_uid: &str) {
        self.saved.insert(&saved_key(name, claim_uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_max_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| b.next_delay("a").as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
        assert_eq!(b.next_delay("b").as_secs(), 1, "keys are independent");
        b.reset("a");
        assert_eq!(b.next_delay("a").as_secs(), 1);
        for _ in 0..100 {
            b.next_delay("c");
        }
        assert_eq!(b.next_delay("c"), Duration::from_secs(5), "no overflow");
    }
}
