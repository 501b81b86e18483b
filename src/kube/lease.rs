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
//!
//! A leader renews as client-go does: first an optimistic update of the Lease
//! it last wrote (one request; its `resourceVersion` fences it), and only if
//! that fails the slow path, a read then an update, counted in
//! `leader_election_slowpath_total`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{is_conflict, is_not_found};
use crate::metrics::{LeaseLabels, Metrics};

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

    /// A gate that is never open: a replica that never wins (tests).
    #[cfg(test)]
    pub fn never() -> LeaderGate {
        LeaderGate::elected()
    }

    /// A gate open for `lease` from now, then closed, as a leader's whose
    /// renewals stopped (tests).
    #[cfg(test)]
    pub fn open_for(lease: Duration) -> LeaderGate {
        let gate = LeaderGate::elected();
        gate.extend(Instant::now() + lease);
        gate
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
    /// The Lease as last read or written: the base of an optimistic renewal.
    last: Option<Lease>,
    /// `leader_election_slowpath_total` and this Lease's series in it.
    slowpath: Option<(Family<LeaseLabels, Counter>, LeaseLabels)>,
}

impl Elector {
    pub fn new(client: Client, config: LeaseConfig) -> Elector {
        Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            gate: LeaderGate::elected(),
            observed: None,
            last: None,
            slowpath: None,
        }
    }

    /// Counts slow-path renewals in `metrics` (labelled with the Lease name).
    /// As client-go, the series appears with the first slow path.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Elector {
        let labels = LeaseLabels {
            name: self.config.name.clone(),
        };
        self.slowpath = Some((metrics.leader_slowpath.clone(), labels));
        self
    }

    fn count_slow_path(&self) {
        if let Some((family, labels)) = &self.slowpath {
            family.get_or_create(labels).inc();
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
    /// upstream: client-go leaderelection.go tryAcquireOrRenew.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration_s = self.config.lease_duration.as_secs().max(1) as i32;
        // Fast path: while our own term is valid, update the Lease we last
        // saw without reading it; a concurrent writer makes that a 409.
        if let Some(lease) = self.optimistic_renewal(now, duration_s) {
            match self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
            {
                Ok(l) => {
                    self.remember_written(l);
                    return Ok(true);
                }
                Err(e) => warn!(error = %e, "optimistic lease renewal failed; reading the lease"),
            }
        }
        let lease = match self.api.get(&self.config.name).await {
            Ok(l) => l,
            Err(e) if is_not_found(&e) => {
                let created = self
                    .api
                    .create(&PostParams::default(), &self.new_lease(now, duration_s))
                    .await;
                return self.written(created);
            }
            Err(e) => return Err(e),
        };
        self.last = Some(lease.clone());
        let spec = lease.spec.clone().unwrap_or_default();
        let expired = self.observe_term(&spec, duration_s);
        let held_by_me =
            spec.holder_identity.as_deref().unwrap_or_default() == self.config.identity;
        if !held_by_me && !expired {
            return Ok(false);
        }
        if held_by_me {
            // Renewing our own term took a read: client-go's slow path.
            self.count_slow_path();
        }
        let lease = self.our_term(lease, spec, held_by_me, now, duration_s);
        // `replace` carries our resourceVersion: a concurrent writer makes it 409.
        let replaced = self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await;
        self.written(replaced)
    }

    /// The Lease to create when there is none: ours from now on.
    fn new_lease(&self, now: Timestamp, duration_s: i32) -> Lease {
        Lease {
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
        }
    }

    /// Notes the record `spec` as just read (on every read, also of our own
    /// term), and says whether its holder's term has run out: no holder, or the
    /// record unchanged for its duration since *we* saw it change (client-go's
    /// rule: no clocks are compared across machines).
    fn observe_term(&mut self, spec: &LeaseSpec, duration_s: i32) -> bool {
        let changed = self.observed.as_ref().is_none_or(|(s, _)| s != spec);
        if changed {
            self.observed = Some((spec.clone(), Instant::now()));
        }
        let observed_at = self
            .observed
            .as_ref()
            .map(|(_, t)| *t)
            .unwrap_or_else(Instant::now);
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration_s).max(0) as u64);
        spec.holder_identity
            .as_deref()
            .unwrap_or_default()
            .is_empty()
            || observed_at.elapsed() >= their_duration
    }

    /// `lease` (as read, `spec` its record) with us as holder from `now`: a
    /// renewal of our term, or a new term (acquired now, one more transition).
    fn our_term(
        &self,
        mut lease: Lease,
        spec: LeaseSpec,
        renewal: bool,
        now: Timestamp,
        duration_s: i32,
    ) -> Lease {
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(self.config.identity.clone());
        new_spec.lease_duration_seconds = Some(duration_s);
        new_spec.renew_time = Some(MicroTime(now));
        if !renewal {
            new_spec.acquire_time = Some(MicroTime(now));
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        if !self.config.labels.is_empty() {
            let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(self.config.labels.clone());
        }
        lease
    }

    /// The answer to a create or update of the Lease: written (remembered, we
    /// hold it), or someone else wrote first (409: we do not).
    fn written(&mut self, answer: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
        match answer {
            Ok(l) => {
                self.remember_written(l);
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remember_written(&mut self, lease: Lease) {
        self.observed = lease.spec.clone().map(|s| (s, Instant::now()));
        self.last = Some(lease);
    }

    /// The renewal to send without reading first, when we hold the Lease and
    /// our term has not run out since we last saw it (client-go: `IsLeader()
    /// && isLeaseValid(now)`); `None` means read first (the slow path).
    fn optimistic_renewal(&self, now: Timestamp, duration_s: i32) -> Option<Lease> {
        let (spec, seen_at) = self.observed.as_ref()?;
        let term = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str())
            || seen_at.elapsed() >= term
        {
            return None;
        }
        let mut lease = self.last.clone()?;
        let renewed = lease.spec.get_or_insert_with(Default::default);
        renewed.lease_duration_seconds = Some(duration_s);
        renewed.renew_time = Some(MicroTime(now));
        if !self.config.labels.is_empty() {
            let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(self.config.labels.clone());
        }
        Some(lease)
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

    /// An API server holding one Lease, with optimistic concurrency, that
    /// logs the verb of every request.
    #[derive(Clone, Default)]
    struct FakeLeases {
        lease: Arc<Mutex<Option<serde_json::Value>>>,
        version: Arc<Mutex<u64>>,
        verbs: Arc<Mutex<Vec<String>>>,
    }

    impl FakeLeases {
        fn client(&self) -> Client {
            let fake = self.clone();
            let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let fake = fake.clone();
                async move { Ok::<_, std::convert::Infallible>(fake.answer(req).await) }
            });
            Client::new(service, "default")
        }

        async fn answer(
            &self,
            req: http::Request<kube::client::Body>,
        ) -> http::Response<kube::client::Body> {
            use http_body_util::BodyExt;
            let method = req.method().to_string();
            self.verbs.lock().unwrap().push(method.clone());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let mut stored = self.lease.lock().unwrap();
            let (code, reply) = match (method.as_str(), stored.as_ref()) {
                ("GET", Some(l)) => (200, l.clone()),
                ("GET", None) => (404, status(404, "NotFound")),
                ("POST", Some(_)) => (409, status(409, "AlreadyExists")),
                ("PUT", None) => (404, status(404, "NotFound")),
                ("POST", None) | ("PUT", Some(_)) => {
                    let mut new: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let current_rv = stored
                        .as_ref()
                        .map(|l| l["metadata"]["resourceVersion"].clone());
                    if method == "PUT"
                        && Some(new["metadata"]["resourceVersion"].clone()) != current_rv
                    {
                        (409, status(409, "Conflict"))
                    } else {
                        new["metadata"]["resourceVersion"] = self.bump().into();
                        *stored = Some(new.clone());
                        (200, new)
                    }
                }
                _ => (405, status(405, "MethodNotAllowed")),
            };
            http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(
                    serde_json::to_vec(&reply).unwrap(),
                ))
                .unwrap()
        }

        fn bump(&self) -> String {
            let mut v = self.version.lock().unwrap();
            *v += 1;
            v.to_string()
        }

        /// Another writer changes the Lease (new resourceVersion).
        fn edit(&self, change: impl FnOnce(&mut serde_json::Value)) {
            let mut stored = self.lease.lock().unwrap();
            let lease = stored.as_mut().unwrap();
            change(lease);
            lease["metadata"]["resourceVersion"] = self.bump().into();
        }

        fn take_verbs(&self) -> Vec<String> {
            std::mem::take(&mut *self.verbs.lock().unwrap())
        }
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": reason, "code": code, "message": reason,
        })
    }

    fn slow_paths(registry: &prometheus_client::registry::Registry) -> Option<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .find(|l| l.starts_with("leader_election_slowpath_total{"))
            .map(str::to_string)
    }

    #[tokio::test]
    async fn a_leader_renews_with_one_update_and_counts_the_slow_path_when_that_fails() {
        let fake = FakeLeases::default();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let mut elector = Elector::new(
            fake.client(),
            LeaseConfig {
                name: "example-csi".into(),
                namespace: "default".into(),
                identity: "me".into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
                labels: BTreeMap::new(),
            },
        )
        .with_metrics(&metrics);

        assert!(elector.try_acquire_or_renew().await.unwrap());
        assert_eq!(fake.take_verbs(), ["GET", "POST"], "acquiring reads first");
        assert!(elector.try_acquire_or_renew().await.unwrap());
        assert_eq!(
            fake.take_verbs(),
            ["PUT"],
            "renewing our own term needs no read"
        );
        assert_eq!(
            slow_paths(&registry),
            None,
            "as client-go: no series before a slow path"
        );

        // Someone touched the Lease (still ours): the blind update conflicts,
        // the read shows it is ours, the renewal goes through the slow path.
        fake.edit(|l| l["metadata"]["labels"] = serde_json::json!({"touched": "yes"}));
        assert!(elector.try_acquire_or_renew().await.unwrap());
        assert_eq!(fake.take_verbs(), ["PUT", "GET", "PUT"]);
        assert_eq!(
            slow_paths(&registry).as_deref(),
            Some("leader_election_slowpath_total{name=\"example-csi\"} 1")
        );
        assert_eq!(
            fake.lease.lock().unwrap().as_ref().unwrap()["metadata"]["labels"]["touched"],
            "yes",
            "the slow path keeps what the other writer wrote"
        );

        // Taken over by another holder: the conflict is not papered over.
        fake.edit(|l| l["spec"]["holderIdentity"] = "other".into());
        assert!(!elector.try_acquire_or_renew().await.unwrap());
        assert_eq!(fake.take_verbs(), ["PUT", "GET"]);
        assert_eq!(
            slow_paths(&registry).as_deref(),
            Some("leader_election_slowpath_total{name=\"example-csi\"} 1"),
            "only renewals of our own term count"
        );
        assert!(
            elector.try_acquire_or_renew().await.is_ok_and(|held| !held),
            "a standby reads before every attempt"
        );
        assert_eq!(fake.take_verbs(), ["GET"]);
    }

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
