//! Leader election on a coordination.k8s.io/v1 Lease, compatible with
//! client-go's (and so with upstream sidecars contending for the same Lease):
//! the same object, the same fields, the same "expired when not renewed within
//! leaseDurationSeconds of when *we* last saw it change" rule, and
//! optimistic concurrency through `resourceVersion`.
//!
//! Acting is fenced by time, not by a flag: [`LeaderGate::is_leader`] is true
//! only until `renew_deadline` after the last successful renewal, so a replica
//! that cannot reach the API server stops acting before anyone else can take
//! over (lease duration > renew deadline).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::is_status;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub labels: BTreeMap<String, String>,
}

/// Upstream's Lease name for a driver: `/` → `-`, then every character
/// outside `[a-zA-Z0-9-]` → `-`, and an `X` appended if it ends with `-`.
pub fn lease_name(driver: &str) -> String {
    let mut s: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.ends_with('-') {
        s.push('X');
    }
    s
}

/// Shared view of "may I act now?".
#[derive(Clone)]
pub struct LeaderGate {
    inner: Arc<Mutex<Option<Instant>>>,
    always: bool,
}

impl LeaderGate {
    /// Without leader election: always leading.
    pub fn always() -> LeaderGate {
        LeaderGate {
            inner: Arc::new(Mutex::new(None)),
            always: true,
        }
    }

    fn elected() -> LeaderGate {
        LeaderGate {
            inner: Arc::new(Mutex::new(None)),
            always: false,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.always
            || self
                .inner
                .lock()
                .expect("gate poisoned")
                .is_some_and(|until| Instant::now() < until)
    }

    /// While a renewal is overdue: by how much (the leader-election health check).
    pub fn overdue_by(&self) -> Option<Duration> {
        let until = (*self.inner.lock().expect("gate poisoned"))?;
        Instant::now().checked_duration_since(until)
    }

    fn extend(&self, until: Instant) {
        *self.inner.lock().expect("gate poisoned") = Some(until);
    }

    fn revoke(&self) {
        *self.inner.lock().expect("gate poisoned") = None;
    }
}

/// Why the elector stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("leader election lost: could not renew lease {0} within the renew deadline")]
    Lost(String),
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    gate: LeaderGate,
    /// The record as last observed, and when we observed it change.
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    pub fn new(client: Client, config: LeaseConfig) -> Elector {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            gate: LeaderGate::elected(),
            observed: None,
        }
    }

    pub fn gate(&self) -> LeaderGate {
        self.gate.clone()
    }

    /// Blocks until this replica holds the Lease (or `stop` fires: `false`).
    pub async fn acquire(&mut self, stop: &CancellationToken) -> bool {
        info!(lease = %format!("{}/{}", self.config.namespace, self.config.name), identity = %self.config.identity, "waiting to acquire the lease");
        loop {
            let attempt = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    self.gate.extend(attempt + self.config.renew_deadline);
                    info!(identity = %self.config.identity, "became leader");
                    return true;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "lease acquire attempt failed"),
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Keeps renewing. Returns `Err(Lost)` once renewal has failed for
    /// `renew_deadline` (the caller exits, as upstream does), `Ok` when `stop`
    /// fires; either way the gate is closed first, so nothing irreversible
    /// starts after this returns.
    pub async fn renew(&mut self, stop: &CancellationToken) -> Result<(), LeaseError> {
        let mut last_ok = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    self.gate.revoke();
                    return Ok(());
                }
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let attempt = Instant::now();
            match tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew())
                .await
            {
                Ok(Ok(true)) => {
                    last_ok = attempt;
                    self.gate.extend(attempt + self.config.renew_deadline);
                }
                Ok(Ok(false)) => {
                    self.gate.revoke();
                    return Err(LeaseError::Lost(self.config.name.clone()));
                }
                Ok(Err(e)) => warn!(error = %e, "lease renewal failed"),
                Err(_) => warn!("lease renewal timed out"),
            }
            if last_ok.elapsed() >= self.config.renew_deadline {
                self.gate.revoke();
                return Err(LeaseError::Lost(self.config.name.clone()));
            }
        }
    }

    /// One client-go style attempt: `Ok(true)` when we hold the Lease after it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration_s = self.config.lease_duration.as_secs().max(1) as i32;
        let existing = match self.api.get(&self.config.name).await {
            Ok(l) => Some(l),
            Err(e) if is_status(&e, 404) => None,
            Err(e) => return Err(e),
        };
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    labels: (!self.config.labels.is_empty()).then(|| self.config.labels.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration_s),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    self.observed = l.spec.map(|s| (s, Instant::now()));
                    Ok(true)
                }
                Err(e) if is_status(&e, 409) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let changed = self.observed.as_ref().is_none_or(|(s, _)| s != &spec);
        if changed {
            self.observed = Some((spec.clone(), Instant::now()));
        }
        let observed_at = self
            .observed
            .as_ref()
            .map(|(_, t)| *t)
            .unwrap_or_else(Instant::now);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let held_by_me = holder == self.config.identity;
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_s).max(0) as u64);
        let expired = holder.is_empty() || observed_at.elapsed() >= their_duration;
        if !held_by_me && !expired {
            return Ok(false);
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(self.config.identity.clone());
        new_spec.lease_duration_seconds = Some(duration_s);
        new_spec.renew_time = Some(MicroTime(now));
        if !held_by_me {
            new_spec.acquire_time = Some(MicroTime(now));
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        if !self.config.labels.is_empty() {
            let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(self.config.labels.clone());
        }
        // `replace` carries our resourceVersion: a concurrent writer makes it 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                self.observed = l.spec.map(|s| (s, Instant::now()));
                Ok(true)
            }
            Err(e) if is_status(&e, 409) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up on shutdown so a standby takes over at once: an
    /// update (the verb upstream's Role grants) that empties the holder, only
    /// if we still hold it (a conflict means someone else does: fine).
    pub async fn release(&mut self) {
        self.gate.revoke();
        let Ok(mut lease) = self.api.get(&self.config.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(identity = %self.config.identity, "released the lease"),
            Err(e) => warn!(error = %e, "failed to release the lease"),
        }
    }
}

fn jittered(d: Duration) -> Duration {
    d + d.mul_f64(rand::random::<f64>() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_match_upstream() {
        assert_eq!(lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
        assert_eq!(lease_name("a/b_c"), "a-b-c");
        assert_eq!(lease_name("driver."), "driver-X");
        assert_eq!(lease_name("Mixed-Case9"), "Mixed-Case9");
    }

    #[test]
    fn gate_without_election_is_open_and_elected_gate_expires() {
        assert!(LeaderGate::always().is_leader());
        let g = LeaderGate::elected();
        assert!(!g.is_leader());
        g.extend(Instant::now() + Duration::from_secs(60));
        assert!(g.is_leader());
        g.extend(Instant::now() - Duration::from_millis(1));
        assert!(
            !g.is_leader(),
            "an expired renewal closes the gate by itself"
        );
        g.extend(Instant::now() + Duration::from_secs(60));
        g.revoke();
        assert!(!g.is_leader());
    }
}
