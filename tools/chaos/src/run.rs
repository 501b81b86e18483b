//! The random chaos run: claims created and deleted at a steady rate while the injector
//! disturbs everything, then faults off, settle, check, and (optionally) delete everything
//! and check that nothing is left.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::check::{self, ClaimState, CreatedClaim, InvariantResult, Snapshot, VolumeState};
use crate::faults::{self, FaultMix};
use crate::report::Report;
use crate::world::{Sidecar, StageOptions, Testbed, World};

/// Everything a random run needs to know.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub sidecar: Sidecar,
    pub seed: u64,
    /// Claims to create (the run stops creating at `duration` even if fewer were made).
    pub claims: usize,
    pub duration: Duration,
    /// Claims created per second.
    pub rate: f64,
    pub replicas: usize,
    pub faults: FaultMix,
    /// How long the system may take to settle once faults stop.
    pub settle: Duration,
    /// Delete every claim at the end and check that no volume is left.
    pub teardown_check: bool,
    pub keep_dir: bool,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            sidecar: Sidecar::Ours,
            seed: 1,
            claims: 200,
            duration: Duration::from_secs(120),
            rate: 3.0,
            replicas: 2,
            faults: FaultMix::all(),
            settle: Duration::from_secs(120),
            teardown_check: true,
            keep_dir: false,
        }
    }
}

/// What happens to a claim after it is created.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fate {
    Keep,
    /// Deleted this long after creation, whatever state it is in.
    DeleteWhileProvisioning(Duration),
    /// Deleted this long after it is seen Bound.
    DeleteAfterBound(Duration),
}

#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub name: String,
    pub uid: String,
    pub fate: Fate,
    pub delete_scheduled: bool,
    pub deleted: bool,
}

/// The runner's book of claims.
#[derive(Default)]
pub(crate) struct Book {
    records: Mutex<BTreeMap<String, Record>>,
    /// Deletions scheduled and not finished.
    pending: AtomicUsize,
}

impl Book {
    pub(crate) fn add(&self, r: Record) {
        self.records
            .lock()
            .expect("poisoned")
            .insert(r.name.clone(), r);
    }

    pub(crate) fn created(&self) -> Vec<CreatedClaim> {
        self.records
            .lock()
            .expect("poisoned")
            .values()
            .map(|r| CreatedClaim {
                name: r.name.clone(),
                uid: r.uid.clone(),
                deleted: r.deleted,
            })
            .collect()
    }

    fn records(&self) -> Vec<Record> {
        self.records
            .lock()
            .expect("poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Marks the claim's deletion as scheduled; false if it already was.
    pub(crate) fn schedule(&self, name: &str) -> bool {
        let mut records = self.records.lock().expect("poisoned");
        match records.get_mut(name) {
            Some(r) if !r.delete_scheduled => {
                r.delete_scheduled = true;
                self.pending.fetch_add(1, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    fn fate(&self, name: &str) -> Option<Fate> {
        self.records
            .lock()
            .expect("poisoned")
            .get(name)
            .map(|r| r.fate)
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }
}

/// How long the runner's own requests keep being retried: longer than a control-plane
/// restart, so that one does not make the runner lose track of a claim.
const API_PATIENCE: Duration = Duration::from_secs(180);

/// Deletes a claim after `after` (retrying API errors), records it, and counts down.
pub(crate) fn delete_later(
    api: Api<PersistentVolumeClaim>,
    book: Arc<Book>,
    name: String,
    after: Duration,
) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let until = Instant::now() + API_PATIENCE;
        while Instant::now() < until {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    mark_deleted(&book, &name);
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    mark_deleted(&book, &name);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        book.pending.fetch_sub(1, Ordering::SeqCst);
    });
}

fn mark_deleted(book: &Book, name: &str) {
    if let Some(r) = book.records.lock().expect("poisoned").get_mut(name) {
        r.deleted = true;
    }
}

pub(crate) fn claim_body(
    name: &str,
    class: &str,
    selected_node: Option<&str>,
) -> PersistentVolumeClaim {
    let mut meta = json!({"name": name});
    if let Some(node) = selected_node {
        meta["annotations"] = json!({"volume.kubernetes.io/selected-node": node});
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": class,
        }
    }))
    .expect("claim")
}

/// Creates a claim, retrying API errors; returns its UID.
pub(crate) async fn create_claim(
    api: &Api<PersistentVolumeClaim>,
    body: &PersistentVolumeClaim,
) -> Result<String, String> {
    let mut last = String::new();
    let until = Instant::now() + API_PATIENCE;
    while Instant::now() < until {
        match api.create(&PostParams::default(), body).await {
            Ok(c) => return Ok(c.uid().unwrap_or_default()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Our earlier attempt went through; read what it created.
                if let Ok(c) = api.get(&body.name_any()).await {
                    return Ok(c.uid().unwrap_or_default());
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("creating claim {}: {last}", body.name_any()))
}

/// Watches the claims and deletes those meant to go once they are Bound.
fn observe(world: &World, book: Arc<Book>, stop: CancellationToken) {
    let api = world.claims();
    tokio::spawn(async move {
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = stop.cancelled() => return,
            };
            let Some(Ok(claim)) = next else {
                if next.is_none() {
                    return;
                }
                continue;
            };
            let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let name = claim.name_any();
            if let (true, Some(Fate::DeleteAfterBound(after))) = (bound, book.fate(&name))
                && book.schedule(&name)
            {
                delete_later(api.clone(), book.clone(), name, after);
            }
        }
    });
}

/// Reads the API and the ledger into a [`Snapshot`].
pub(crate) async fn snapshot(world: &World, book: &Book) -> Result<Snapshot, String> {
    let claims: Vec<ClaimState> = world
        .claims()
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing claims: {e}"))?
        .items
        .into_iter()
        .map(|c| ClaimState {
            name: c.name_any(),
            uid: c.uid().unwrap_or_default(),
            phase: c
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            volume_name: c
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .filter(|v| !v.is_empty()),
            deleting: c.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    let volumes: Vec<VolumeState> = world
        .volumes()
        .await
        .map_err(|e| format!("listing PVs: {e}"))?
        .into_iter()
        .map(|pv| VolumeState {
            name: pv.name_any(),
            handle: pv
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.volume_handle.clone())
                .unwrap_or_default(),
            claim_uid: pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.clone()),
            phase: pv
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            deleting: pv.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    let ledger = world
        .driver
        .control()
        .await
        .map_err(|e| format!("driver control: {e}"))?
        .ledger()
        .await
        .map_err(|e| format!("reading the ledger: {e}"))?;
    let mut failures: HashMap<String, Vec<String>> = HashMap::new();
    if claims.iter().any(|c| c.phase != "Bound" && !c.deleting) {
        let events: Api<Event> = Api::namespaced(world.client.clone(), &world.ns);
        if let Ok(list) = events
            .list(&ListParams::default().fields("reason=ProvisioningFailed"))
            .await
        {
            for e in list.items {
                if let (Some(name), Some(message)) = (e.involved_object.name, e.message) {
                    failures.entry(name).or_default().push(message);
                }
            }
        }
    }
    Ok(Snapshot {
        created: book.created(),
        claims,
        volumes,
        ledger,
        failures,
    })
}

/// Checks repeatedly until the system has settled, or `within` has passed; returns the last
/// verdict and snapshot. Settled: clean twice in a row with no CSI call in between, or, with
/// violations, nothing changed (verdict, backend, API) for 20 s: four times the sidecars'
/// longest retry interval, so a claim still backing off is not judged early.
pub(crate) async fn settle(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Book,
    within: Duration,
) -> (Vec<InvariantResult>, Snapshot) {
    const UNCHANGED: Duration = Duration::from_secs(20);
    let until = Instant::now() + within;
    let mut last: Option<(String, Instant)> = None;
    let mut clean = 0;
    loop {
        let snap = {
            let mut w = world.lock().await;
            let _ = w.driver.ensure_running().await;
            snapshot(&w, book).await
        };
        if let Ok(snap) = snap {
            let results = check::check(&snap);
            let fingerprint = format!(
                "{:?}|{}|{}|{}|{}",
                results,
                snap.ledger.operations.len(),
                snap.claims.len(),
                snap.volumes.len(),
                book.pending()
            );
            let since = match &last {
                Some((f, since)) if *f == fingerprint => *since,
                _ => Instant::now(),
            };
            let unchanged = last.as_ref().is_some_and(|(f, _)| *f == fingerprint);
            last = Some((fingerprint, since));
            let total = check::total(&results);
            clean = if total == 0 && book.pending() == 0 && unchanged {
                clean + 1
            } else {
                0
            };
            if clean >= 1 || (total > 0 && since.elapsed() >= UNCHANGED) || Instant::now() >= until
            {
                return (results, snap);
            }
        } else if Instant::now() >= until {
            return (Vec::new(), Snapshot::default());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

pub const TEARDOWN: &str = "deleting every claim leaves no volume, PV or claim";

/// Deletes every claim still wanted, waits, and reports whatever is left.
pub(crate) async fn teardown_check(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    within: Duration,
) -> InvariantResult {
    let api = world.lock().await.claims();
    for r in book.records() {
        if !r.deleted && book.schedule(&r.name) {
            delete_later(api.clone(), book.clone(), r.name.clone(), Duration::ZERO);
        }
    }
    let until = Instant::now() + within;
    loop {
        let snap = {
            let w = world.lock().await;
            snapshot(&w, book).await
        };
        let mut left = Vec::new();
        if let Ok(snap) = &snap {
            left.extend(
                snap.ledger
                    .volumes
                    .values()
                    .map(|v| format!("volume {} (name {}) left", v.volume_id, v.name)),
            );
            left.extend(
                snap.volumes
                    .iter()
                    .map(|v| format!("PV {} ({}) left", v.name, v.phase)),
            );
            left.extend(
                snap.claims
                    .iter()
                    .map(|c| format!("claim {} ({}) left", c.name, c.phase)),
            );
        } else {
            left.push("could not read the state".into());
        }
        if (left.is_empty() && book.pending() == 0) || Instant::now() >= until {
            return InvariantResult {
                name: TEARDOWN,
                violations: left,
            };
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Turns every fault off and makes sure the driver and every replica run.
pub(crate) async fn faults_off(world: &Arc<tokio::sync::Mutex<World>>) {
    let mut w = world.lock().await;
    w.proxy.clear();
    let _ = w.driver.ensure_running().await;
    if let Ok(c) = w.driver.control().await {
        let _ = c.clear_faults().await;
        for m in ["CreateVolume", "DeleteVolume"] {
            let _ = c.release(m).await;
        }
    }
    for r in &w.replicas {
        r.resume();
    }
}

/// Runs a random chaos run and reports it.
pub async fn run(testbed: &Testbed, cfg: &ChaosConfig) -> Result<Report, String> {
    let started = Instant::now();
    let world = World::setup(
        testbed,
        &StageOptions {
            sidecar: cfg.sidecar,
            replicas: cfg.replicas,
            seed: cfg.seed,
            // Both sidecars' default; injected driver latency stays well below it.
            csi_timeout: "10s".into(),
            extra_args: Vec::new(),
            keep_dir: cfg.keep_dir,
        },
    )
    .await?;
    let api = world.claims();
    let (class_immediate, class_wffc, node) = (
        world.class_immediate.clone(),
        world.class_wffc.clone(),
        world.node.clone(),
    );
    let background = CancellationToken::new();
    let leader = world.track_leader(background.clone());
    let book = Arc::new(Book::default());
    observe(&world, book.clone(), background.clone());
    let world = Arc::new(tokio::sync::Mutex::new(world));

    let stop_faults = CancellationToken::new();
    // The load phase ends at `duration` or after `claims` at `rate`, whichever comes first.
    let expected_load = cfg.duration.min(Duration::from_secs_f64(
        cfg.claims as f64 / cfg.rate.max(0.01),
    ));
    let injector = tokio::spawn(faults::inject(
        world.clone(),
        cfg.faults.clone(),
        cfg.seed,
        expected_load,
        stop_faults.clone(),
    ));

    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let interval = Duration::from_secs_f64(1.0 / cfg.rate.max(0.01));
    let deadline = started + cfg.duration;
    let mut next = tokio::time::Instant::now();
    let mut workload = WorkloadCounts::default();
    for i in 0..cfg.claims {
        if Instant::now() >= deadline {
            break;
        }
        let name = format!("c-{i:05}");
        let wffc = rng.random_bool(0.2);
        let fate = match rng.random_range(0..100) {
            0..50 => Fate::Keep,
            50..75 => {
                Fate::DeleteWhileProvisioning(Duration::from_millis(rng.random_range(0..1500)))
            }
            _ => Fate::DeleteAfterBound(Duration::from_millis(rng.random_range(0..3000))),
        };
        let body = if wffc {
            claim_body(&name, &class_wffc, Some(&node))
        } else {
            claim_body(&name, &class_immediate, None)
        };
        match create_claim(&api, &body).await {
            Ok(uid) => {
                workload.created += 1;
                workload.wffc += wffc as usize;
                book.add(Record {
                    name: name.clone(),
                    uid,
                    fate,
                    delete_scheduled: false,
                    deleted: false,
                });
                match fate {
                    Fate::DeleteWhileProvisioning(after) => {
                        workload.deleted_while_provisioning += 1;
                        if book.schedule(&name) {
                            delete_later(api.clone(), book.clone(), name, after);
                        }
                    }
                    Fate::DeleteAfterBound(_) => workload.deleted_after_bound += 1,
                    Fate::Keep => {}
                }
            }
            Err(e) => eprintln!("chaos: {e}"),
        }
        next += interval;
        tokio::time::sleep_until(next).await;
    }
    let load_time = started.elapsed();
    stop_faults.cancel();
    let injected = injector.await.unwrap_or_default();
    faults_off(&world).await;
    let (mut invariants, snap) = settle(&world, &book, cfg.settle).await;
    let settle_time = started.elapsed() - load_time;
    let live_at_end = snap.claims.len();
    if cfg.teardown_check {
        // Every live claim now needs a DeleteVolume and a PV deletion.
        let within = cfg.settle + Duration::from_millis(250) * live_at_end as u32;
        invariants.push(teardown_check(&world, &book, within).await);
    }
    background.cancel();
    let w = Arc::try_unwrap(world)
        .map_err(|_| "world still shared".to_string())?
        .into_inner();
    let mut report = Report::new(&format!("random, {}", cfg.sidecar.label()), cfg.seed);
    report.sidecar = cfg.sidecar;
    report.replicas = cfg.replicas;
    report.workload = vec![
        ("claims created", workload.created as u64),
        ("  of them WaitForFirstConsumer", workload.wffc as u64),
        (
            "claims deleted while provisioning",
            workload.deleted_while_provisioning as u64,
        ),
        (
            "claims deleted after bound",
            workload.deleted_after_bound as u64,
        ),
        ("claims live at the end", live_at_end as u64),
    ];
    report.timing = vec![
        ("load phase", load_time),
        ("settle phase", settle_time),
        ("total", started.elapsed()),
    ];
    if cfg.faults.restart_control_plane {
        report.timing.push((
            "control-plane restarts (stop to /readyz)",
            injected.control_plane_restarting,
        ));
    }
    report.actions = injected.counts;
    report.fill_from(&w, &leader, &snap);
    report.invariants = invariants;
    report.dir = cfg.keep_dir.then(|| w.dir.clone());
    w.teardown().await;
    Ok(report)
}

#[derive(Default)]
struct WorkloadCounts {
    created: usize,
    wffc: usize,
    deleted_while_provisioning: usize,
    deleted_after_bound: usize,
}
