//! The random chaos run: claims created and deleted at a steady rate while the injector
//! disturbs everything, then faults off, settle, check, and (optionally) delete everything
//! and check that nothing is left. A share of the claims are restores (from a
//! VolumeSnapshot of an earlier Bound claim) and clones (of an earlier Bound claim); some of
//! their sources are deleted while they are pending.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::check::{
    self, CLAIM_KIND, ClaimState, CreatedClaim, DataSource, InvariantResult, NodeTally,
    SNAPSHOT_KIND, Snapshot, SnapshotState, SourceKind, VolumeState,
};
use crate::faults::{self, FaultMix};
use crate::intent::IntentTally;
use crate::report::{Mode, Report};
use crate::world::{Sidecar, StageOptions, Testbed, World};

/// The scheduler's annotation of a WaitForFirstConsumer claim; in a node deployment the
/// node that wins an Immediate claim writes it too.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

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
    /// Replicas of a central deployment, contending for the Lease (ignored with `nodes`).
    pub replicas: usize,
    /// 0: a central deployment. N: a node deployment of N nodes, each with its own driver
    /// and sidecar; WaitForFirstConsumer claims are selected for a random node, Immediate
    /// ones raced for by all. No restores or clones then (the csi-snapshotter serves the
    /// first node's driver only).
    pub nodes: usize,
    pub faults: FaultMix,
    /// How long the system may take to settle once faults stop.
    pub settle: Duration,
    /// Delete every claim at the end and check that no volume is left.
    pub teardown_check: bool,
    pub keep_dir: bool,
    /// Share of the claims restored from a VolumeSnapshot of an earlier Bound claim.
    pub restores: f64,
    /// Share of the claims cloned from an earlier Bound claim.
    pub clones: f64,
    /// Policy mode: the shipped intent policies installed for the run (our sidecar with
    /// `--admission-intent`; upstream's runs without them, as without this).
    pub policies: bool,
}

/// Default shares of restores and clones among the claims of a run.
pub const DEFAULT_RESTORES: f64 = 0.2;
pub const DEFAULT_CLONES: f64 = 0.1;
/// Share of restores (clones) whose snapshot (source claim) the runner deletes while they
/// are pending, 0–3 s after creating them. Each such restore or clone that was not yet
/// protected stays Pending for good (refused as upstream refuses it), and so do earlier
/// restores of that snapshot: kept low so that most data-source claims get made.
const SOURCE_DELETED_SHARE: f64 = 0.15;
/// VolumeSnapshots kept at once: beyond this the oldest is deleted (snapshot churn).
const LIVE_SNAPSHOTS: usize = 6;

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            sidecar: Sidecar::Ours,
            seed: 1,
            claims: 200,
            duration: Duration::from_secs(120),
            rate: 3.0,
            replicas: 2,
            nodes: 0,
            faults: FaultMix::all(),
            settle: Duration::from_secs(120),
            teardown_check: true,
            keep_dir: false,
            restores: DEFAULT_RESTORES,
            clones: DEFAULT_CLONES,
            policies: false,
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
    /// Restores and clones: the VolumeSnapshot or claim it was made from (`deleted` is
    /// filled in from the book when the checker asks).
    pub source: Option<DataSource>,
}

/// A VolumeSnapshot the runner created.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotRecord {
    pub uid: String,
    pub delete_scheduled: bool,
    pub deleted: bool,
}

/// The runner's book of claims (and of VolumeSnapshots).
#[derive(Default)]
pub(crate) struct Book {
    records: Mutex<BTreeMap<String, Record>>,
    /// Deletions scheduled and not finished (claims and snapshots).
    pending: AtomicUsize,
    snapshots: Mutex<BTreeMap<String, SnapshotRecord>>,
    /// Claims seen Bound that the runner keeps: sources for snapshots and clones, with
    /// whether their class is WaitForFirstConsumer (a clone uses its source's class).
    sources: Mutex<BTreeMap<String, bool>>,
    /// Claims some VolumeSnapshot was taken of: never deleted on purpose mid-run, so that
    /// a snapshot does not fail for lack of its source.
    snapshotted: Mutex<BTreeSet<String>>,
    /// WaitForFirstConsumer claims a node sent back that the runner selected a node for again.
    rescheduled: AtomicUsize,
    /// Where the claims' intent came from (admission or the sidecar's write).
    pub(crate) intents: IntentTally,
}

impl Book {
    pub(crate) fn add(&self, r: Record) {
        self.records
            .lock()
            .expect("poisoned")
            .insert(r.name.clone(), r);
    }

    pub(crate) fn created(&self) -> Vec<CreatedClaim> {
        let records = self.records.lock().expect("poisoned");
        let snapshots = self.snapshots.lock().expect("poisoned");
        records
            .values()
            .map(|r| CreatedClaim {
                name: r.name.clone(),
                uid: r.uid.clone(),
                deleted: r.deleted,
                source: r.source.clone().map(|mut src| {
                    src.deleted = match src.kind {
                        SourceKind::Snapshot => snapshots.get(&src.name).is_some_and(|s| s.deleted),
                        SourceKind::Claim => records.get(&src.name).is_some_and(|c| c.deleted),
                    };
                    src
                }),
            })
            .collect()
    }

    /// Snapshots not (scheduled to be) deleted, oldest first.
    fn live_snapshots(&self) -> Vec<String> {
        self.snapshots
            .lock()
            .expect("poisoned")
            .iter()
            .filter(|(_, s)| !s.delete_scheduled)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Marks the snapshot's deletion as scheduled; false if it already was.
    fn schedule_snapshot(&self, name: &str) -> bool {
        let mut snapshots = self.snapshots.lock().expect("poisoned");
        match snapshots.get_mut(name) {
            Some(s) if !s.delete_scheduled => {
                s.delete_scheduled = true;
                self.pending.fetch_add(1, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    fn sources(&self) -> Vec<(String, bool)> {
        self.sources
            .lock()
            .expect("poisoned")
            .iter()
            .map(|(k, v)| (k.clone(), *v))
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

    /// Ends a scheduled deletion. One that gave up is no longer scheduled either, so that
    /// the teardown deletes the claim again rather than leave it and call it a leak.
    pub(crate) fn finish_delete(&self, name: &str, deleted: bool) {
        if let Some(r) = self.records.lock().expect("poisoned").get_mut(name) {
            r.deleted = deleted;
            r.delete_scheduled = deleted;
        }
        if deleted {
            self.sources.lock().expect("poisoned").remove(name);
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
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
        let result = retry_delete(&api, &name).await;
        if let Err(e) = &result {
            eprintln!("chaos: deleting claim {name} gave up: {e}");
        }
        book.finish_delete(&name, result.is_ok());
    });
}

/// Selects `node` for a WaitForFirstConsumer claim that has none, as the scheduler does,
/// retrying API errors; a claim that got one meanwhile or went is left alone.
fn reschedule(api: Api<PersistentVolumeClaim>, book: Arc<Book>, name: String, node: String) {
    tokio::spawn(async move {
        let until = Instant::now() + API_PATIENCE;
        while Instant::now() < until {
            let Ok(Some(claim)) = api.get_opt(&name).await else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            let taken = claim
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(SELECTED_NODE));
            if taken || claim.metadata.deletion_timestamp.is_some() {
                return;
            }
            // Fenced on the copy read, as the scheduler's update is.
            let body = json!({"metadata": {
                "resourceVersion": claim.metadata.resource_version,
                "annotations": {SELECTED_NODE: node},
            }});
            match api
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&body),
                )
                .await
            {
                Ok(_) => {
                    book.rescheduled.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    });
}

/// Deletes `name`, retrying API errors for [`API_PATIENCE`]; gone already counts as deleted.
async fn retry_delete<K>(api: &Api<K>, name: &str) -> Result<(), String>
where
    K: Clone
        + kube::core::Resource
        + for<'de> k8s_openapi::serde::Deserialize<'de>
        + std::fmt::Debug,
{
    let until = Instant::now() + API_PATIENCE;
    let mut last = String::new();
    while Instant::now() < until {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(last)
}

/// Deletes a VolumeSnapshot after `after` (retrying API errors), records it, counts down.
fn delete_snapshot_later(api: Api<DynamicObject>, book: Arc<Book>, name: String, after: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let result = retry_delete(&api, &name).await;
        if let Err(e) = &result {
            eprintln!("chaos: deleting VolumeSnapshot {name} gave up: {e}");
        }
        if let Some(s) = book.snapshots.lock().expect("poisoned").get_mut(&name) {
            // Not deleted: no longer scheduled either, so that the teardown deletes it.
            s.deleted = result.is_ok();
            s.delete_scheduled = result.is_ok();
        }
        book.pending.fetch_sub(1, Ordering::SeqCst);
    });
}

/// A 1Gi claim, restored or cloned from `source` (kind, name) if given.
pub(crate) fn claim_body_from(
    name: &str,
    class: &str,
    selected_node: Option<&str>,
    source: Option<(&str, &str)>,
) -> PersistentVolumeClaim {
    let mut meta = json!({"name": name});
    if let Some(node) = selected_node {
        meta["annotations"] = json!({"volume.kubernetes.io/selected-node": node});
    }
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": class,
    });
    match source {
        Some((SNAPSHOT_KIND, snapshot)) => {
            spec["dataSource"] = json!({
                "apiGroup": "snapshot.storage.k8s.io",
                "kind": SNAPSHOT_KIND,
                "name": snapshot,
            });
        }
        Some((kind, claim)) => spec["dataSource"] = json!({"kind": kind, "name": claim}),
        None => {}
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec})).expect("claim")
}

/// Creates a VolumeSnapshot of `claim` in `class`, retrying API errors; returns its UID.
async fn create_snapshot(
    api: &Api<DynamicObject>,
    name: &str,
    class: &str,
    claim: &str,
) -> Result<String, String> {
    let body: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {
            "volumeSnapshotClassName": class,
            "source": {"persistentVolumeClaimName": claim},
        },
    }))
    .expect("snapshot");
    let mut last = String::new();
    let until = Instant::now() + API_PATIENCE;
    while Instant::now() < until {
        match api.create(&PostParams::default(), &body).await {
            Ok(s) => return Ok(s.uid().unwrap_or_default()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                if let Ok(s) = api.get(name).await {
                    return Ok(s.uid().unwrap_or_default());
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("creating VolumeSnapshot {name}: {last}"))
}

/// Creates a VolumeSnapshot of `claim` and enters it in the book (the claim as snapshotted
/// first, so that nothing deletes it on purpose meanwhile); returns its UID.
pub(crate) async fn make_snapshot(
    book: &Book,
    api: &Api<DynamicObject>,
    name: &str,
    class: &str,
    claim: &str,
) -> Result<String, String> {
    book.snapshotted
        .lock()
        .expect("poisoned")
        .insert(claim.to_string());
    let uid = create_snapshot(api, name, class, claim).await?;
    book.snapshots.lock().expect("poisoned").insert(
        name.to_string(),
        SnapshotRecord {
            uid: uid.clone(),
            delete_scheduled: false,
            deleted: false,
        },
    );
    Ok(uid)
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

/// Watches the claims and deletes those meant to go once they are Bound; and, as the
/// scheduler would for the pod of a WaitForFirstConsumer claim, chooses a node again for
/// such a claim that a node sent back (`ResourceExhausted` there).
fn observe(world: &World, book: Arc<Book>, seed: u64, stop: CancellationToken) {
    let api = world.claims();
    let (class_wffc, nodes) = (world.class_wffc.clone(), world.nodes.clone());
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5c4e_d01e);
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
            book.intents.see(&claim);
            let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let name = claim.name_any();
            let sent_back = !bound
                && claim.metadata.deletion_timestamp.is_none()
                && claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref())
                    == Some(class_wffc.as_str())
                && !claim
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(SELECTED_NODE));
            if sent_back {
                let node = nodes[rng.random_range(0..nodes.len())].clone();
                reschedule(api.clone(), book.clone(), name.clone(), node);
            }
            let fate = book.fate(&name);
            if let (true, Some(Fate::DeleteAfterBound(after))) = (bound, fate)
                && book.schedule(&name)
            {
                delete_later(api.clone(), book.clone(), name, after);
            } else if bound
                && fate == Some(Fate::Keep)
                && claim.metadata.deletion_timestamp.is_none()
            {
                let wffc = claim
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("volume.kubernetes.io/selected-node"));
                let deleted = book
                    .records
                    .lock()
                    .expect("poisoned")
                    .get(&name)
                    .is_some_and(|r| r.delete_scheduled);
                if !deleted {
                    book.sources.lock().expect("poisoned").insert(name, wffc);
                }
            }
        }
    });
}

/// Reads the API and the ledger into a [`Snapshot`].
/// The values of a PV's required node affinity `In` expressions, by key.
fn required_affinity(pv: &PersistentVolume) -> BTreeMap<String, Vec<String>> {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let terms = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    for e in terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.operator == "In")
    {
        by_key
            .entry(e.key.clone())
            .or_default()
            .extend(e.values.iter().flatten().cloned());
    }
    by_key
}

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
            selected_node: c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SELECTED_NODE).cloned()),
            finalizers: c.metadata.finalizers.clone().unwrap_or_default(),
            data_source: c.spec.as_ref().and_then(|s| {
                s.data_source_ref
                    .as_ref()
                    .map(|r| (r.kind.clone(), r.name.clone()))
                    .or_else(|| {
                        s.data_source
                            .as_ref()
                            .map(|r| (r.kind.clone(), r.name.clone()))
                    })
            }),
        })
        .collect();
    let snapshots: Vec<SnapshotState> = world
        .snapshots()
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing VolumeSnapshots: {e}"))?
        .items
        .into_iter()
        .map(|vs| SnapshotState {
            name: vs.name_any(),
            uid: vs.uid().unwrap_or_default(),
            ready: vs.data.pointer("/status/readyToUse") == Some(&json!(true)),
            finalizers: vs.metadata.finalizers.clone().unwrap_or_default(),
            deleting: vs.metadata.deletion_timestamp.is_some(),
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
            node_affinity: required_affinity(&pv),
        })
        .collect();
    let mut ledgers = Vec::new();
    for driver in world.drivers() {
        ledgers.push(
            driver
                .control()
                .await
                .map_err(|e| format!("driver control: {e}"))?
                .ledger()
                .await
                .map_err(|e| format!("reading the ledger: {e}"))?,
        );
    }
    let per_node = if world.node_key.is_some() {
        world
            .nodes
            .iter()
            .zip(&ledgers)
            .map(|(node, l)| NodeTally::of(node, l))
            .collect()
    } else {
        Vec::new()
    };
    let ledger = if ledgers.len() == 1 {
        ledgers.pop().expect("one")
    } else {
        check::merge(ledgers)
    };
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
        snapshots,
        ledger,
        failures,
        node_key: world.node_key.clone(),
        per_node,
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
            for driver in w.drivers_mut() {
                let _ = driver.ensure_running().await;
            }
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

pub const TEARDOWN: &str =
    "deleting every claim and snapshot leaves no volume, snapshot, PV or claim";

/// Deletes every claim and VolumeSnapshot still wanted, waits, and reports whatever is left.
pub(crate) async fn teardown_check(
    world: &Arc<tokio::sync::Mutex<World>>,
    book: &Arc<Book>,
    within: Duration,
) -> InvariantResult {
    let (api, snapshots) = {
        let w = world.lock().await;
        (w.claims(), w.snapshots())
    };
    for r in book.records() {
        if !r.deleted && book.schedule(&r.name) {
            delete_later(api.clone(), book.clone(), r.name.clone(), Duration::ZERO);
        }
    }
    for name in book.live_snapshots() {
        if book.schedule_snapshot(&name) {
            delete_snapshot_later(snapshots.clone(), book.clone(), name, Duration::ZERO);
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
            if snap.snapshots.is_empty() {
                release_snapshot_controller_claims(&api, &snap.claims).await;
            }
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
            left.extend(snap.claims.iter().map(|c| {
                format!(
                    "claim {} ({}{}) left, finalizers {:?}",
                    c.name,
                    c.phase,
                    if c.deleting { ", being deleted" } else { "" },
                    c.finalizers
                )
            }));
            left.extend(
                snap.ledger
                    .snapshots
                    .values()
                    .map(|s| format!("backend snapshot {} (name {}) left", s.snapshot_id, s.name)),
            );
            left.extend(snap.snapshots.iter().map(|s| {
                format!(
                    "VolumeSnapshot {} left (finalizers {:?})",
                    s.name, s.finalizers
                )
            }));
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

/// The snapshot-controller's finalizer on a snapshot's source claim.
pub const PVC_AS_SOURCE: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";

/// Once no VolumeSnapshot is left, removes the snapshot-controller's
/// `pvc-as-source-protection` from deleted claims, as an operator would: that
/// controller keeps it only while a snapshot is being made from the claim, and
/// drops it only when it syncs such a snapshot again, so a claim it missed
/// (its snapshot deleted while the content was being made; external-snapshotter
/// #1305 is one open case) keeps it with no snapshot left to sync. Not a
/// finalizer of either sidecar: what is behind the claim (its PV and volume)
/// is still the sidecar's to reclaim, and is judged. Each removal is printed.
pub async fn release_snapshot_controller_claims(
    api: &Api<PersistentVolumeClaim>,
    claims: &[ClaimState],
) {
    for c in claims
        .iter()
        .filter(|c| c.deleting && c.finalizers.iter().any(|f| f == PVC_AS_SOURCE))
    {
        let body = json!({"metadata": {"uid": c.uid, "$deleteFromPrimitiveList/finalizers": [PVC_AS_SOURCE]}});
        match api
            .patch(
                &c.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(&body),
            )
            .await
        {
            Ok(_) => eprintln!(
                "chaos: teardown: no VolumeSnapshot left; removed the snapshot-controller's {PVC_AS_SOURCE} from deleted claim {} (harness)",
                c.name
            ),
            Err(e) => eprintln!(
                "chaos: teardown: removing {PVC_AS_SOURCE} from {}: {e}",
                c.name
            ),
        }
    }
}

/// Turns every fault off and makes sure the driver and every replica run.
pub(crate) async fn faults_off(world: &Arc<tokio::sync::Mutex<World>>) {
    let mut w = world.lock().await;
    w.proxy.clear();
    if let Some(p) = &w.policies
        && let Err(e) = p.restore(None).await
    {
        eprintln!("chaos: installing the policies again: {e}");
    }
    for driver in w.drivers_mut() {
        let _ = driver.ensure_running().await;
        if let Ok(c) = driver.control().await {
            let _ = c.clear_faults().await;
            for m in ["CreateVolume", "DeleteVolume"] {
                let _ = c.release(m).await;
            }
        }
    }
    for r in &w.replicas {
        r.resume();
    }
    w.snapshotter.resume();
}

/// Runs a random chaos run and reports it.
pub async fn run(testbed: &Testbed, cfg: &ChaosConfig) -> Result<Report, String> {
    let started = Instant::now();
    let mode = Mode::of(cfg.policies, cfg.sidecar);
    let world = World::setup(
        testbed,
        &StageOptions {
            sidecar: cfg.sidecar,
            replicas: cfg.replicas,
            nodes: cfg.nodes,
            seed: cfg.seed,
            // Both sidecars' default; injected driver latency stays well below it.
            leader_election: true,
            csi_timeout: "10s".into(),
            extra_args: Vec::new(),
            time_travel: cfg.faults.travel,
            sidecar_env: Vec::new(),
            keep_dir: cfg.keep_dir,
            policies: mode == Mode::Policies,
        },
    )
    .await?;
    let api = world.claims();
    let (class_immediate, class_wffc, nodes) = (
        world.class_immediate.clone(),
        world.class_wffc.clone(),
        world.nodes.clone(),
    );
    // The csi-snapshotter serves one driver: no data sources in a node deployment.
    let (restores, clones) = if cfg.nodes > 0 {
        (0.0, 0.0)
    } else {
        (cfg.restores, cfg.clones)
    };
    let background = CancellationToken::new();
    let leader = world.track_leader(background.clone());
    let book = Arc::new(Book::default());
    observe(&world, book.clone(), cfg.seed, background.clone());
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
    let (snapshots, snapshot_class) = {
        let w = world.lock().await;
        (w.snapshots(), w.snapshot_class.clone())
    };
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
        let kind = rng.random_range(0.0..1.0);
        let mut class = if wffc { &class_wffc } else { &class_immediate };
        // A restore or a clone needs a source; until a claim is Bound there is none, and the
        // claim is a plain one.
        let mut source = None;
        let mut delete_source = None;
        if kind < restores {
            let live = book.live_snapshots();
            let pick = if live.is_empty() || rng.random_bool(0.4) {
                let claims = book.sources();
                if claims.is_empty() {
                    None
                } else {
                    let (claim, _) = claims[rng.random_range(0..claims.len())].clone();
                    let vs = format!("s-{i:05}");
                    match make_snapshot(&book, &snapshots, &vs, &snapshot_class, &claim).await {
                        Ok(_) => {
                            workload.snapshots += 1;
                            // Churn: the oldest snapshots go (restores of them may be pending).
                            let live = book.live_snapshots();
                            for old in &live[..live.len().saturating_sub(LIVE_SNAPSHOTS)] {
                                if book.schedule_snapshot(old) {
                                    workload.snapshots_retired += 1;
                                    delete_snapshot_later(
                                        snapshots.clone(),
                                        book.clone(),
                                        old.clone(),
                                        Duration::ZERO,
                                    );
                                }
                            }
                            Some(vs)
                        }
                        Err(e) => {
                            eprintln!("chaos: {e}");
                            None
                        }
                    }
                }
            } else {
                Some(live[rng.random_range(0..live.len())].clone())
            };
            if let Some(vs) = pick {
                let uid = book
                    .snapshots
                    .lock()
                    .expect("poisoned")
                    .get(&vs)
                    .map(|s| s.uid.clone())
                    .unwrap_or_default();
                if rng.random_bool(SOURCE_DELETED_SHARE) {
                    delete_source = Some(Duration::from_millis(rng.random_range(0..3000)));
                }
                source = Some(DataSource {
                    kind: SourceKind::Snapshot,
                    name: vs,
                    uid,
                    deleted: false,
                });
            }
        } else if kind < restores + clones {
            let claims = book.sources();
            if !claims.is_empty() {
                let (claim, source_wffc) = claims[rng.random_range(0..claims.len())].clone();
                // Same class as the source (upstream requires it).
                class = if source_wffc {
                    &class_wffc
                } else {
                    &class_immediate
                };
                let uid = book
                    .records
                    .lock()
                    .expect("poisoned")
                    .get(&claim)
                    .map(|r| r.uid.clone())
                    .unwrap_or_default();
                let snapshotted = book.snapshotted.lock().expect("poisoned").contains(&claim);
                if !snapshotted && rng.random_bool(SOURCE_DELETED_SHARE) {
                    delete_source = Some(Duration::from_millis(rng.random_range(0..3000)));
                    // No later snapshot or clone picks it.
                    book.sources.lock().expect("poisoned").remove(&claim);
                }
                source = Some(DataSource {
                    kind: SourceKind::Claim,
                    name: claim,
                    uid,
                    deleted: false,
                });
            }
        }
        let wffc = class == &class_wffc;
        let reference = source.as_ref().map(|s| {
            (
                match s.kind {
                    SourceKind::Snapshot => SNAPSHOT_KIND,
                    SourceKind::Claim => CLAIM_KIND,
                },
                s.name.as_str(),
            )
        });
        // The scheduler's choice for a WaitForFirstConsumer claim (drawn only when there
        // is a choice, so a central run's schedule stays what it was).
        let node = if nodes.len() > 1 {
            &nodes[rng.random_range(0..nodes.len())]
        } else {
            &nodes[0]
        };
        let body = claim_body_from(&name, class, wffc.then_some(node.as_str()), reference);
        match create_claim(&api, &body).await {
            Ok(uid) => {
                workload.created += 1;
                workload.wffc += wffc as usize;
                match source.as_ref().map(|s| s.kind) {
                    Some(SourceKind::Snapshot) => workload.restores += 1,
                    Some(SourceKind::Claim) => workload.clones += 1,
                    None => {}
                }
                if let (Some(src), Some(after)) = (&source, delete_source) {
                    match src.kind {
                        SourceKind::Snapshot => {
                            if book.schedule_snapshot(&src.name) {
                                workload.snapshots_deleted_mid_restore += 1;
                                delete_snapshot_later(
                                    snapshots.clone(),
                                    book.clone(),
                                    src.name.clone(),
                                    after,
                                );
                            }
                        }
                        SourceKind::Claim => {
                            if book.schedule(&src.name) {
                                workload.sources_deleted_mid_clone += 1;
                                delete_later(api.clone(), book.clone(), src.name.clone(), after);
                            }
                        }
                    }
                }
                book.add(Record {
                    name: name.clone(),
                    uid,
                    fate,
                    delete_scheduled: false,
                    deleted: false,
                    source,
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
    let title = if cfg.nodes > 0 {
        format!("random, {}, node deployment", cfg.sidecar.label())
    } else {
        format!("random, {}", cfg.sidecar.label())
    };
    let mut report = Report::new(&title, cfg.seed);
    report.sidecar = cfg.sidecar;
    report.mode = mode;
    report.replicas = w.replicas.len();
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
        (
            "WaitForFirstConsumer claims sent back, node selected again",
            book.rescheduled.load(Ordering::SeqCst) as u64,
        ),
        ("restores (from a VolumeSnapshot)", workload.restores as u64),
        (
            "  restores Bound at the end",
            bound_at_end(&snap, SourceKind::Snapshot),
        ),
        ("clones (of a Bound claim)", workload.clones as u64),
        (
            "  clones Bound at the end",
            bound_at_end(&snap, SourceKind::Claim),
        ),
        ("VolumeSnapshots created", workload.snapshots as u64),
        (
            "snapshots deleted while a restore was pending",
            workload.snapshots_deleted_mid_restore as u64,
        ),
        (
            "source claims deleted while a clone was pending",
            workload.sources_deleted_mid_clone as u64,
        ),
        (
            "oldest snapshots deleted (churn)",
            workload.snapshots_retired as u64,
        ),
    ];
    report.add_intents(&book.intents.counts(&snap));
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
    restores: usize,
    clones: usize,
    snapshots: usize,
    snapshots_deleted_mid_restore: usize,
    sources_deleted_mid_clone: usize,
    snapshots_retired: usize,
}

/// Restores (or clones) the runner still wants that are Bound in the settled state.
fn bound_at_end(snap: &Snapshot, kind: SourceKind) -> u64 {
    let bound: BTreeSet<&str> = snap
        .claims
        .iter()
        .filter(|c| c.phase == "Bound" && !c.deleting)
        .map(|c| c.uid.as_str())
        .collect();
    snap.created
        .iter()
        .filter(|c| !c.deleted && c.source.as_ref().is_some_and(|s| s.kind == kind))
        .filter(|c| bound.contains(c.uid.as_str()))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            uid: format!("uid-{name}"),
            fate: Fate::Keep,
            delete_scheduled: false,
            deleted: false,
            source: None,
        }
    }

    #[test]
    fn a_deletion_is_scheduled_once() {
        let book = Book::default();
        book.add(record("c-1"));
        assert!(book.schedule("c-1"));
        assert!(!book.schedule("c-1"), "already scheduled");
        assert!(!book.schedule("c-2"), "not in the book");
        assert_eq!(book.pending(), 1);
    }

    #[test]
    fn a_finished_deletion_is_not_scheduled_again() {
        let book = Book::default();
        book.add(record("c-1"));
        assert!(book.schedule("c-1"));
        book.finish_delete("c-1", true);
        assert_eq!(book.pending(), 0);
        assert!(book.records()[0].deleted);
        assert!(
            !book.schedule("c-1"),
            "deleted claims are not deleted again"
        );
    }

    #[test]
    fn a_deletion_that_gave_up_leaves_the_claim_to_the_teardown() {
        let book = Book::default();
        book.add(record("c-1"));
        assert!(book.schedule("c-1"));
        book.finish_delete("c-1", false);
        assert_eq!(book.pending(), 0);
        assert!(!book.records()[0].deleted);
        assert!(book.schedule("c-1"), "the teardown can schedule it again");
    }
}
