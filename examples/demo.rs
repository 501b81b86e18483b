//! `make demo`: our sidecar doing its real job against a private local control plane.
//!
//! `scripts/demo.sh` builds everything, starts the control plane (`testbed/cluster.sh`) and
//! exports `CSI_TESTBED_KUBECONFIG`; this program then starts the fault-injecting test driver
//! and `target/debug/csi-provisioner`, provisions a handful of claims, deletes them, shows a
//! claim deleted while the driver hangs being cleaned up, and checks the driver's ledger for
//! leaked or duplicate volumes. It exits non-zero when any check fails.

use std::collections::BTreeSet;
use std::error::Error;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use csi_provisioner::keys;
use csi_test_driver::control::{Client as DriverControl, Fault};
use csi_test_driver::ledger::Ledger;
use csi_test_driver::process::{DriverOptions, DriverProcess};
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::process::{Child, Command};

type Result<T, E = Box<dyn Error + Send + Sync>> = std::result::Result<T, E>;

/// The driver name, which is also the provisioner name of the StorageClass.
const DRIVER: &str = "demo.csi.example.com";
const NAMESPACE: &str = "demo";
const CLASS: &str = "demo-fast";
/// The sidecar's per-call CSI timeout: short, so that the slow-driver scene is short.
const CSI_TIMEOUT: &str = "3s";
/// How long any one step may take before the demo gives up (a loaded 2-core machine is slow,
/// a healthy run takes a few seconds per step).
const STEP_DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(250);
/// Longest status line drawn on a terminal (narrower than the classic 80 columns).
const STATUS_WIDTH: usize = 79;

/// The claims of the main scene: different sizes, access modes and volume modes.
struct ClaimSpec {
    name: &'static str,
    size: &'static str,
    modes: &'static [&'static str],
    block: bool,
}

const CLAIMS: [ClaimSpec; 5] = [
    ClaimSpec {
        name: "web",
        size: "1Gi",
        modes: &["ReadWriteOnce"],
        block: false,
    },
    ClaimSpec {
        name: "postgres",
        size: "5Gi",
        modes: &["ReadWriteOncePod"],
        block: false,
    },
    ClaimSpec {
        name: "media",
        size: "20Gi",
        modes: &["ReadWriteMany"],
        block: false,
    },
    ClaimSpec {
        name: "datasets",
        size: "2Gi",
        modes: &["ReadOnlyMany"],
        block: false,
    },
    ClaimSpec {
        name: "scratch",
        size: "512Mi",
        modes: &["ReadWriteOnce"],
        block: true,
    },
];

const SLOW_CLAIM: &str = "slow";

/// The restore scene: a snapshot of one claim of the main scene, and a claim made from it.
const SNAPSHOT_OF: &str = "postgres";
const SNAPSHOT: &str = "postgres-snap";
const SNAPSHOT_CLASS: &str = "demo-snapshots";
const RESTORED: &str = "postgres-restored";

#[tokio::main]
async fn main() -> ExitCode {
    let mut out = Out::new();
    let mut demo = Demo::default();
    // Err(None): interrupted, Err(Some(_)): the demo failed.
    let result = tokio::select! {
        r = demo.run(&mut out) => r.map_err(Some),
        signal = shutdown_signal() => {
            eprintln!("\ndemo: interrupted by {signal}; stopping the driver and the sidecar");
            Err(None)
        }
    };
    out.clear_status();
    // Stop and reap whatever is still running, on every path (success, failure, signal).
    demo.kill_children().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(None) => ExitCode::from(130),
        Err(Some(err)) => {
            eprintln!("demo: FAILED: {err}");
            if let Some(log) = &demo.sidecar_log {
                eprintln!("demo: last lines of the sidecar's log ({}):", log.display());
                for line in tail(log, 15) {
                    eprintln!("    {line}");
                }
            }
            ExitCode::FAILURE
        }
    }
}

async fn shutdown_signal() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// What the demo started, kept outside `run` so `main` can report and clean up after a failure.
#[derive(Default)]
struct Demo {
    sidecar_log: Option<PathBuf>,
    sidecar: Option<Child>,
    snapshotter: Option<Child>,
    driver: Option<DriverProcess>,
    work: Option<tempfile::TempDir>,
}

/// When the demo first saw each step of a claim's clean-up, since the claims were deleted.
#[derive(Default)]
struct Cleanup {
    claim_gone: Option<Duration>,
    released: Option<Duration>,
    volume_gone: Option<Duration>,
    pv_gone: Option<Duration>,
    reported: bool,
}

/// One provisioned claim of the main scene, as the demo observed it.
struct Provisioned {
    name: &'static str,
    pv: String,
    handle: String,
    bound_after: Duration,
}

impl Demo {
    async fn run(&mut self, out: &mut Out) -> Result<()> {
        let kubeconfig = std::env::var_os("CSI_TESTBED_KUBECONFIG")
            .map(PathBuf::from)
            .ok_or("CSI_TESTBED_KUBECONFIG is not set: run the demo with `make demo`")?;
        let bin_dir = workspace_bin_dir()?;
        let out_dir = std::env::var_os("CSI_DEMO_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| bin_dir.join("demo"));
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
        let client = kube_client(&kubeconfig).await?;

        // ---- set-up -------------------------------------------------------------------------
        out.heading("Starting a CSI driver and our sidecar");
        let work = tempfile::Builder::new().prefix("csi-demo-").tempdir()?;
        let driver_bin = bin_dir.join("csi-test-driver");
        let options = DriverOptions {
            drivername: DRIVER.to_string(),
            capabilities: vec!["+CREATE_DELETE_SNAPSHOT".to_string()],
            ..DriverOptions::default()
        };
        let driver = DriverProcess::start(&driver_bin, work.path(), &options)
            .await
            .map_err(|e| format!("starting {}: {e}", driver_bin.display()))?;
        let control = driver.control().await?;
        out.say(&format!(
            "csi-test-driver \"{DRIVER}\" on {} (an in-memory backend that records every volume in a ledger)",
            driver.endpoint.display()
        ));
        let csi_address = driver.csi_address();
        let state_dir = driver.state_dir.clone();
        self.driver = Some(driver);
        self.work = Some(work);

        let sidecar_bin = bin_dir.join("csi-provisioner");
        let log_path = out_dir.join("csi-provisioner.log");
        let args = [
            format!("--csi-address={csi_address}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--timeout={CSI_TIMEOUT}"),
            "-v=5".to_string(),
        ];
        out.say(&format!("starting csi-provisioner {}", args.join(" ")));
        out.say(&format!("  its log: {}", log_path.display()));
        let log =
            File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
        let sidecar = Command::new(&sidecar_bin)
            .args(&args)
            // The sidecar would take KUBECONFIG over --kubeconfig; the demo's control plane
            // must win over whatever cluster the caller's shell points at.
            .env_remove("KUBECONFIG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", sidecar_bin.display()))?;
        self.sidecar = Some(sidecar);
        self.sidecar_log = Some(log_path.clone());
        let started = Instant::now();
        loop {
            if let Some(status) = self.sidecar.as_mut().and_then(|c| c.try_wait().ok()?) {
                return Err(format!("csi-provisioner exited during start-up ({status})").into());
            }
            if tail(&log_path, usize::MAX)
                .iter()
                .any(|l| l.trim_end().ends_with(" started"))
            {
                break;
            }
            deadline(started, "csi-provisioner to start")?;
            out.waiting(&format!(
                "csi-provisioner starting ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }
        out.say(&format!(
            "csi-provisioner is up: probed the driver, learned its name and capabilities ({:.1}s)",
            started.elapsed().as_secs_f64()
        ));

        let namespaces: Api<Namespace> = Api::all(client.clone());
        let creating = Instant::now();
        loop {
            let ns = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
            match namespaces.create(&PostParams::default(), &ns).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.is_already_exists() => {
                    // A previous demo on this control plane deletes it on the way out.
                    let terminating = namespaces
                        .get_opt(NAMESPACE)
                        .await?
                        .is_none_or(|n| n.metadata.deletion_timestamp.is_some());
                    if !terminating {
                        return Err(format!(
                            "namespace {NAMESPACE} already exists: the demo wants a control plane \
                             of its own (`make demo` starts one)"
                        )
                        .into());
                    }
                    deadline(
                        creating,
                        &format!("the old namespace {NAMESPACE} to be deleted"),
                    )?;
                    out.waiting(&format!(
                        "namespace {NAMESPACE} of a previous run is still being deleted"
                    ));
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => return Err(format!("creating namespace {NAMESPACE}: {e}").into()),
            }
        }
        let classes: Api<StorageClass> = Api::all(client.clone());
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": CLASS},
                    "provisioner": DRIVER,
                    "reclaimPolicy": "Delete",
                    "volumeBindingMode": "Immediate",
                    "parameters": {"type": "fast", "csi.storage.k8s.io/fstype": "ext4"},
                }))?,
            )
            .await?;
        out.say(&format!(
            "StorageClass {CLASS}: provisioner {DRIVER}, reclaimPolicy Delete, parameters type=fast fstype=ext4"
        ));

        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let volumes: Api<PersistentVolume> = Api::all(client.clone());

        // ---- provisioning -------------------------------------------------------------------
        out.heading(&format!(
            "Provisioning {} claims in namespace {NAMESPACE}",
            CLAIMS.len()
        ));
        let mut created_at = Vec::new();
        for c in &CLAIMS {
            claims
                .create(
                    &PostParams::default(),
                    &claim_object(c.name, c.size, c.modes, c.block),
                )
                .await?;
            created_at.push(Instant::now());
            out.say(&format!(
                "created claim {:<9} {:>5} {:<5} {:<10} Pending",
                c.name,
                c.size,
                c.modes
                    .iter()
                    .map(|m| short_mode(m))
                    .collect::<Vec<_>>()
                    .join(","),
                if c.block { "Block" } else { "Filesystem" },
            ));
        }
        let phase_started = Instant::now();
        let mut provisioned: Vec<Option<Provisioned>> = CLAIMS.iter().map(|_| None).collect();
        while provisioned.iter().any(Option::is_none) {
            let list = claims.list(&ListParams::default()).await?;
            for (i, c) in CLAIMS.iter().enumerate() {
                if provisioned[i].is_some() {
                    continue;
                }
                let Some(pvc) = list
                    .items
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(c.name))
                else {
                    return Err(format!("claim {} disappeared", c.name).into());
                };
                if phase(pvc) != "Bound" {
                    continue;
                }
                let bound_after = created_at[i].elapsed();
                let pv_name = pvc
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.clone())
                    .ok_or("a Bound claim without spec.volumeName")?;
                let pv = volumes.get(&pv_name).await?;
                let handle = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|csi| csi.volume_handle.clone())
                    .ok_or_else(|| format!("PV {pv_name} has no CSI source"))?;
                out.say(&format!(
                    "{:<9} → {pv_name} → {handle}  (Bound in {:.1}s)",
                    c.name,
                    bound_after.as_secs_f64()
                ));
                provisioned[i] = Some(Provisioned {
                    name: c.name,
                    pv: pv_name,
                    handle,
                    bound_after,
                });
            }
            if provisioned.iter().all(Option::is_some) {
                break;
            }
            deadline(phase_started, "the claims to be Bound")?;
            let waiting: Vec<&str> = CLAIMS
                .iter()
                .zip(&provisioned)
                .filter(|(_, p)| p.is_none())
                .map(|(c, _)| c.name)
                .collect();
            out.waiting(&format!(
                "{}/{} Bound; waiting for {} ({:.0}s)",
                CLAIMS.len() - waiting.len(),
                CLAIMS.len(),
                waiting.join(", "),
                phase_started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }
        let provisioned: Vec<Provisioned> = provisioned.into_iter().flatten().collect();

        // Cross-check with the backend: one volume per PV, named after it, same handle.
        let ledger = control.ledger().await?;
        for p in &provisioned {
            let vol = ledger.volume_by_name(&p.pv).ok_or_else(|| {
                format!(
                    "the driver holds no volume named {} (claim {})",
                    p.pv, p.name
                )
            })?;
            if vol.volume_id != p.handle {
                return Err(format!(
                    "PV {} points at {} but the driver's volume of that name is {}",
                    p.pv, p.handle, vol.volume_id
                )
                .into());
            }
        }
        if ledger.volumes.len() != provisioned.len() {
            return Err(format!(
                "the driver holds {} volumes for {} claims",
                ledger.volumes.len(),
                provisioned.len()
            )
            .into());
        }
        let slowest = provisioned
            .iter()
            .map(|p| p.bound_after)
            .max()
            .unwrap_or_default();
        out.say(&format!(
            "all {} Bound, slowest in {:.1}s; the driver's ledger holds exactly these {} volumes ({} in all), \
             each named after its PV",
            provisioned.len(),
            slowest.as_secs_f64(),
            ledger.volumes.len(),
            human_bytes(ledger.used_bytes()),
        ));

        self.restore(out, &client, &control, &out_dir).await?;

        // ---- deletion -----------------------------------------------------------------------
        out.heading("Deleting the claims (reclaimPolicy Delete)");
        let phase_started = Instant::now();
        for p in &provisioned {
            claims.delete(p.name, &DeleteParams::default()).await?;
        }
        out.say(&format!(
            "deleted {} claims; kube-controller-manager releases their PVs, the sidecar deletes the \
             backend volumes, then the PVs (times since the delete)",
            provisioned.len()
        ));
        // When each step of the clean-up was first seen, per claim.
        let mut seen: Vec<Cleanup> = provisioned.iter().map(|_| Cleanup::default()).collect();
        loop {
            let claim_list = claims.list(&ListParams::default()).await?.items;
            let claims_left = names(&claim_list);
            let pvs: Vec<PersistentVolume> = volumes.list(&ListParams::default()).await?.items;
            let ledger = control.ledger().await?;
            let now = phase_started.elapsed();
            let mut waiting = Vec::new();
            for (p, seen) in provisioned.iter().zip(seen.iter_mut()) {
                if seen.reported {
                    continue;
                }
                let pv = pvs
                    .iter()
                    .find(|v| v.metadata.name.as_deref() == Some(&p.pv));
                if !claims_left.contains(p.name) {
                    seen.claim_gone.get_or_insert(now);
                }
                if pv.is_none_or(|pv| pv_phase(pv) != "Bound") {
                    seen.released.get_or_insert(now);
                }
                if !ledger.volumes.contains_key(&p.handle) {
                    seen.volume_gone.get_or_insert(now);
                }
                if pv.is_none() {
                    seen.pv_gone.get_or_insert(now);
                }
                if let Cleanup {
                    claim_gone: Some(claim_gone),
                    released: Some(released),
                    volume_gone: Some(volume_gone),
                    pv_gone: Some(pv_gone),
                    ..
                } = *seen
                {
                    out.say(&format!(
                        "{:<9} claim gone {:.1}s → PV Released {:.1}s → {} deleted {:.1}s → PV gone {:.1}s",
                        p.name,
                        claim_gone.as_secs_f64(),
                        released.as_secs_f64(),
                        p.handle,
                        volume_gone.as_secs_f64(),
                        pv_gone.as_secs_f64(),
                    ));
                    seen.reported = true;
                } else {
                    let state = match (claims_left.contains(p.name), pv) {
                        (true, _) => "claim terminating".to_string(),
                        (false, Some(pv)) => format!("PV {}", pv_phase(pv)),
                        (false, None) => "backend volume".to_string(),
                    };
                    waiting.push(format!("{}: {state}", p.name));
                }
            }
            if waiting.is_empty() {
                break;
            }
            deadline(phase_started, "the claims, PVs and volumes to be deleted")?;
            out.waiting(&format!(
                "waiting for {} ({:.0}s)",
                waiting.join(", "),
                phase_started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }

        // ---- a claim deleted while the driver hangs ----------------------------------------
        out.heading("A claim deleted while the driver hangs in CreateVolume");
        control.set_fault("CreateVolume", Fault::Hang).await?;
        out.say("driver: CreateVolume now hangs until released (a slow or stuck backend)");
        let slow = claims
            .create(
                &PostParams::default(),
                &claim_object(SLOW_CLAIM, "1Gi", &["ReadWriteOnce"], false),
            )
            .await?;
        let slow_uid = slow.metadata.uid.clone().unwrap_or_default();
        let slow_pv = format!("pvc-{slow_uid}");
        out.say(&format!("created claim {SLOW_CLAIM} 1Gi RWO"));
        let scene_started = Instant::now();
        wait_hung(out, &control, 1, scene_started).await?;
        let pvc = claims.get(SLOW_CLAIM).await?;
        if !has_finalizer(&pvc, keys::FINALIZER_PVC_INTENT) {
            return Err(format!(
                "claim {SLOW_CLAIM} has a CreateVolume in flight but no {} finalizer",
                keys::FINALIZER_PVC_INTENT
            )
            .into());
        }
        out.say(&format!(
            "CreateVolume(name={slow_pv}) is hung in the driver; the sidecar recorded its intent first: \
             finalizer {} on the claim",
            keys::FINALIZER_PVC_INTENT
        ));
        claims.delete(SLOW_CLAIM, &DeleteParams::default()).await?;
        let pvc = claims.get_opt(SLOW_CLAIM).await?;
        let terminating = pvc
            .as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        if !terminating {
            return Err(format!(
                "claim {SLOW_CLAIM} vanished at once although a CreateVolume was in flight"
            )
            .into());
        }
        out.say(&format!(
            "deleted claim {SLOW_CLAIM} mid-call: it stays Terminating, held by that finalizer"
        ));
        let deleted_at = Instant::now();
        // The sidecar gives up on the call after --timeout (the volume may still be created:
        // DEADLINE_EXCEEDED), then asks the driver again under the same name to learn whether a
        // volume exists; the driver, still busy with the first call, answers ABORTED.
        let calls_before = control
            .stats()
            .await?
            .calls
            .get("CreateVolume")
            .copied()
            .unwrap_or(0);
        loop {
            let calls = control
                .stats()
                .await?
                .calls
                .get("CreateVolume")
                .copied()
                .unwrap_or(0);
            if calls > calls_before {
                break;
            }
            deadline(deleted_at, "the sidecar to retry CreateVolume")?;
            out.waiting(&format!(
                "waiting for the sidecar's retry ({:.0}s)",
                deleted_at.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }
        out.say(&format!(
            "after --timeout={CSI_TIMEOUT} the sidecar gave up waiting and asked again with the same name \
             (idempotent CreateVolume); the driver answers ABORTED while the first call is pending ({:.1}s after the delete)",
            deleted_at.elapsed().as_secs_f64()
        ));
        control.release("CreateVolume").await?;
        control.clear_faults().await?;
        out.say("driver: released; the backend now finishes the first call, long after its caller gave up");
        let released_at = Instant::now();
        loop {
            let gone = claims.get_opt(SLOW_CLAIM).await?.is_none();
            let pv_gone = volumes.get_opt(&slow_pv).await?.is_none();
            let ledger = control.ledger().await?;
            let held = ledger.volume_by_name(&slow_pv).is_some();
            if gone && pv_gone && !held {
                break;
            }
            deadline(released_at, "the deleted claim's volume to be cleaned up")?;
            out.waiting(&format!(
                "waiting: claim {}, backend volume {} ({:.0}s)",
                if gone { "gone" } else { "terminating" },
                if held { "exists" } else { "absent" },
                released_at.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }
        out.say(&format!(
            "claim {SLOW_CLAIM} gone {:.1}s after the release; what the driver's ledger recorded for {slow_pv}:",
            released_at.elapsed().as_secs_f64()
        ));
        let ledger = control.ledger().await?;
        let slow_ids: BTreeSet<String> = ledger
            .operations
            .iter()
            .filter(|op| op.name.as_deref() == Some(slow_pv.as_str()))
            .filter_map(|op| op.volume_id.clone())
            .collect();
        for op in ledger.operations.iter().filter(|op| {
            op.name.as_deref() == Some(slow_pv.as_str())
                || op
                    .volume_id
                    .as_ref()
                    .is_some_and(|id| slow_ids.contains(id))
        }) {
            let what = match (op.method.as_str(), op.created, op.deleted) {
                ("CreateVolume", true, _) => "created the volume",
                ("CreateVolume", false, _) if op.volume_id.is_some() => {
                    "found the same volume (idempotent by name)"
                }
                ("DeleteVolume", _, true) => "deleted the volume",
                ("DeleteVolume", _, false) => "nothing to delete",
                _ => "no volume",
            };
            out.say(&format!(
                "  {:<13} {:<20} {:<18} {what}",
                op.method,
                op.volume_id.as_deref().unwrap_or("-"),
                op.code.to_string(),
            ));
        }
        let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
        let lp = ListParams::default().fields(&format!("involvedObject.name={SLOW_CLAIM}"));
        let mut claim_events = events.list(&lp).await?.items;
        claim_events.sort_by_key(|e| e.metadata.creation_timestamp.clone());
        out.say(&format!("events on claim {SLOW_CLAIM}:"));
        for e in &claim_events {
            out.say(&format!(
                "  {:<7} {:<22} {}",
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                shorten(e.message.as_deref().unwrap_or("").trim(), 100)
            ));
        }
        if ledger
            .operations_of("CreateVolume")
            .filter(|op| op.name.as_deref() == Some(&slow_pv))
            .count()
            == 0
        {
            return Err(format!("the driver saw no CreateVolume for {slow_pv}").into());
        }

        // ---- summary ------------------------------------------------------------------------
        out.heading("Summary");
        self.stop_sidecar(out).await?;
        let ledger = control.ledger().await?;
        let created = ledger
            .operations_of("CreateVolume")
            .filter(|op| op.created)
            .count();
        let deleted = ledger
            .operations_of("DeleteVolume")
            .filter(|op| op.deleted)
            .count();
        let mut per_name = std::collections::BTreeMap::<&str, usize>::new();
        for op in ledger.operations_of("CreateVolume").filter(|op| op.created) {
            *per_name
                .entry(op.name.as_deref().unwrap_or(""))
                .or_default() += 1;
        }
        let duplicates = per_name.values().filter(|n| **n > 1).count();
        let pvs_left = volumes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|csi| csi.driver == DRIVER)
            })
            .count();
        let leaks = ledger.volumes.len();
        out.say(&format!(
            "claims: {}   volumes created: {created}   deleted: {deleted}   leaked: {leaks}   \
             duplicates: {duplicates}   PVs left: {pvs_left}",
            CLAIMS.len() + 2
        ));
        out.say(&format!(
            "driver calls: CreateVolume {}, DeleteVolume {}, Probe {} (faulted calls included)",
            ledger.call_count("CreateVolume"),
            ledger.call_count("DeleteVolume"),
            ledger.call_count("Probe"),
        ));
        let saved = out_dir.join("ledger.json");
        ledger.save(&out_dir)?;
        out.say(&format!("driver ledger: {}", saved.display()));
        out.say(&format!("sidecar log:   {}", log_path.display()));
        check_disk_ledger(&state_dir, &ledger)?;
        if leaks != 0
            || duplicates != 0
            || pvs_left != 0
            || created != CLAIMS.len() + 2
            || deleted != created
        {
            return Err(format!(
                "ledger check failed: {created} created, {deleted} deleted, {leaks} leaked, \
                 {duplicates} claims with more than one volume, {pvs_left} PVs left"
            )
            .into());
        }
        out.say("OK: every claim got exactly one volume and every volume was deleted: 0 leaks");

        // Leave the control plane as we found it (the namespace goes in the background), so
        // the demo can run on it again.
        classes.delete(CLASS, &DeleteParams::default()).await?;
        namespaces
            .delete(NAMESPACE, &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// A snapshot of one claim and a new claim restored from it: the snapshot-controller (part
    /// of the control plane) and the csi-snapshotter sidecar make the snapshot; our sidecar
    /// restores it. Then both go again.
    async fn restore(
        &mut self,
        out: &mut Out,
        client: &kube::Client,
        control: &DriverControl,
        out_dir: &Path,
    ) -> Result<()> {
        out.heading(&format!(
            "Restoring a claim from a snapshot of {SNAPSHOT_OF}"
        ));
        let testbed = std::env::var_os("CSI_TESTBED_BIN")
            .map(PathBuf::from)
            .ok_or("CSI_TESTBED_BIN is not set: run the demo with `make demo`")?;
        let kubeconfig = std::env::var("CSI_TESTBED_KUBECONFIG")?;
        let csi_address = self.driver.as_ref().ok_or("no driver")?.csi_address();
        let log_path = out_dir.join("csi-snapshotter.log");
        let log = File::create(&log_path)?;
        self.snapshotter = Some(
            Command::new(testbed.join("csi-snapshotter"))
                .args([
                    format!("--csi-address={csi_address}"),
                    format!("--kubeconfig={kubeconfig}"),
                    "--leader-election=false".to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("starting csi-snapshotter: {e}"))?,
        );
        out.say(&format!(
            "started csi-snapshotter (upstream's, next to the driver; its log: {})",
            log_path.display()
        ));
        let resource = |kind: &str| {
            ApiResource::from_gvk(&GroupVersionKind::gvk(
                "snapshot.storage.k8s.io",
                "v1",
                kind,
            ))
        };
        let classes: Api<DynamicObject> =
            Api::all_with(client.clone(), &resource("VolumeSnapshotClass"));
        let snapshots: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NAMESPACE, &resource("VolumeSnapshot"));
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshotClass",
                    "metadata": {"name": SNAPSHOT_CLASS},
                    "driver": DRIVER,
                    "deletionPolicy": "Delete",
                }))?,
            )
            .await?;
        snapshots
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshot",
                    "metadata": {"name": SNAPSHOT, "namespace": NAMESPACE},
                    "spec": {
                        "volumeSnapshotClassName": SNAPSHOT_CLASS,
                        "source": {"persistentVolumeClaimName": SNAPSHOT_OF},
                    },
                }))?,
            )
            .await?;
        out.say(&format!(
            "created VolumeSnapshot {SNAPSHOT} of claim {SNAPSHOT_OF} (class {SNAPSHOT_CLASS})"
        ));
        let started = Instant::now();
        let status = loop {
            let snap = snapshots.get(SNAPSHOT).await?;
            let status = snap.data.get("status").cloned().unwrap_or_default();
            if status.get("readyToUse") == Some(&json!(true)) {
                break status;
            }
            deadline(started, "the snapshot to be ready")?;
            out.waiting(&format!(
                "snapshot {SNAPSHOT} not ready yet ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        };
        let ledger = control.ledger().await?;
        let backend = ledger
            .snapshots
            .values()
            .next()
            .cloned()
            .ok_or("the driver holds no snapshot")?;
        out.say(&format!(
            "{SNAPSHOT} ready in {:.1}s: restoreSize {}, backend snapshot {} of volume {}",
            started.elapsed().as_secs_f64(),
            status["restoreSize"].as_str().unwrap_or("?"),
            backend.snapshot_id,
            backend.source_volume_id,
        ));

        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let mut restored = claim_object(RESTORED, "5Gi", &["ReadWriteOncePod"], false);
        restored
            .spec
            .as_mut()
            .ok_or("claim without spec")?
            .data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: SNAPSHOT.into(),
        });
        claims.create(&PostParams::default(), &restored).await?;
        out.say(&format!(
            "created claim {RESTORED} 5Gi RWOP with dataSource VolumeSnapshot {SNAPSHOT}"
        ));
        let started = Instant::now();
        let pv_name = loop {
            let pvc = claims.get(RESTORED).await?;
            if phase(&pvc) == "Bound" {
                break pvc
                    .spec
                    .and_then(|s| s.volume_name)
                    .ok_or("a Bound claim without spec.volumeName")?;
            }
            deadline(started, "the restored claim to be Bound")?;
            out.waiting(&format!(
                "{RESTORED} Pending ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        };
        let ledger = control.ledger().await?;
        let volume = ledger
            .volume_by_name(&pv_name)
            .ok_or_else(|| format!("the driver holds no volume named {pv_name}"))?;
        let from = match &volume.content_source {
            Some(csi_test_driver::ledger::ContentSource::Snapshot { snapshot_id })
                if *snapshot_id == backend.snapshot_id =>
            {
                snapshot_id.clone()
            }
            other => {
                return Err(format!(
                    "the restored volume's content source is {other:?}, not {}",
                    backend.snapshot_id
                )
                .into());
            }
        };
        out.say(&format!(
            "{RESTORED} → {pv_name} → {}  (Bound in {:.1}s), restored from backend snapshot {from}",
            volume.volume_id,
            started.elapsed().as_secs_f64()
        ));
        // The protection goes right after the PV is saved (the claim may be Bound a moment
        // before).
        let started = Instant::now();
        loop {
            let finalizers = snapshots
                .get(SNAPSHOT)
                .await?
                .metadata
                .finalizers
                .unwrap_or_default();
            if !finalizers
                .iter()
                .any(|f| f == keys::FINALIZER_SNAPSHOT_SOURCE)
            {
                break;
            }
            deadline(started, "the snapshot's source protection to be removed")?;
            tokio::time::sleep(POLL).await;
        }
        out.say("the source-protection finalizer our sidecar put on the snapshot before CreateVolume is off again");

        // Both go again: the claim (its volume with it) and the snapshot (the backend's with it).
        claims.delete(RESTORED, &DeleteParams::default()).await?;
        snapshots.delete(SNAPSHOT, &DeleteParams::default()).await?;
        let started = Instant::now();
        loop {
            let ledger = control.ledger().await?;
            let volume_left = ledger.volume_by_name(&pv_name).is_some();
            if !volume_left && ledger.snapshots.is_empty() {
                break;
            }
            deadline(
                started,
                "the restored volume and the snapshot to be deleted",
            )?;
            out.waiting(&format!(
                "deleting {RESTORED} and {SNAPSHOT} ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            tokio::time::sleep(POLL).await;
        }
        out.say(&format!(
            "deleted {RESTORED} and {SNAPSHOT}: the backend volume and snapshot are gone ({:.1}s)",
            started.elapsed().as_secs_f64()
        ));
        classes
            .delete(SNAPSHOT_CLASS, &DeleteParams::default())
            .await?;
        if let Some(mut snapshotter) = self.snapshotter.take() {
            let _ = snapshotter.start_kill();
            let _ = snapshotter.wait().await;
        }
        Ok(())
    }

    /// SIGKILLs and reaps the driver and (if still running) the sidecar.
    /// Best effort: a process that already exited has nothing left to kill.
    async fn kill_children(&mut self) {
        if let Some(mut snapshotter) = self.snapshotter.take() {
            let _ = snapshotter.start_kill();
            let _ = snapshotter.wait().await;
        }
        if let Some(mut sidecar) = self.sidecar.take() {
            let _ = sidecar.start_kill();
            let _ = sidecar.wait().await;
        }
        if let Some(mut driver) = self.driver.take() {
            let _ = driver.kill().await;
        }
    }

    /// SIGTERM, as the kubelet would send; the sidecar must exit cleanly within 10 s.
    async fn stop_sidecar(&mut self, out: &mut Out) -> Result<()> {
        let Some(mut child) = self.sidecar.take() else {
            return Ok(());
        };
        let Some(pid) = child.id() else {
            return Ok(());
        };
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {pid} failed").into());
        }
        let stopping = Instant::now();
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(status) => {
                let status = status?;
                out.say(&format!(
                    "csi-provisioner stopped on SIGTERM in {:.1}s ({status})",
                    stopping.elapsed().as_secs_f64()
                ));
                if !status.success() {
                    return Err(format!("csi-provisioner exited with {status} on SIGTERM").into());
                }
                Ok(())
            }
            Err(_) => {
                child.kill().await?;
                Err("csi-provisioner did not exit within 10s of SIGTERM (killed)".into())
            }
        }
    }
}

/// Waits until `count` CreateVolume calls are hung in the driver.
async fn wait_hung(
    out: &mut Out,
    control: &DriverControl,
    count: u64,
    since: Instant,
) -> Result<()> {
    loop {
        let hung = control
            .stats()
            .await?
            .hung
            .get("CreateVolume")
            .copied()
            .unwrap_or(0);
        if hung >= count {
            return Ok(());
        }
        deadline(since, &format!("{count} hung CreateVolume calls"))?;
        out.waiting(&format!(
            "{hung} CreateVolume call(s) hung, waiting for {count} ({:.0}s)",
            since.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(POLL).await;
    }
}

/// The on-disk ledger (what survives a crash of the driver) agrees with the live one.
fn check_disk_ledger(state_dir: &Path, live: &Ledger) -> Result<()> {
    let disk = Ledger::load(state_dir)?;
    if disk.volumes.len() != live.volumes.len() || disk.operations.len() != live.operations.len() {
        return Err(format!(
            "the on-disk ledger ({} volumes, {} operations) disagrees with the driver's memory ({}, {})",
            disk.volumes.len(),
            disk.operations.len(),
            live.volumes.len(),
            live.operations.len()
        )
        .into());
    }
    Ok(())
}

fn deadline(since: Instant, what: &str) -> Result<()> {
    if since.elapsed() > STEP_DEADLINE {
        return Err(format!("gave up after {STEP_DEADLINE:?} waiting for {what}").into());
    }
    Ok(())
}

fn claim_object(name: &str, size: &str, modes: &[&str], block: bool) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "storageClassName": CLASS,
            "accessModes": modes,
            "volumeMode": if block { "Block" } else { "Filesystem" },
            "resources": {"requests": {"storage": size}},
        },
    }))
    .expect("a valid claim")
}

fn phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn pv_phase(pv: &PersistentVolume) -> &str {
    if pv.metadata.deletion_timestamp.is_some() {
        return "terminating";
    }
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn has_finalizer(pvc: &PersistentVolumeClaim, finalizer: &str) -> bool {
    pvc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

fn names(items: &[PersistentVolumeClaim]) -> BTreeSet<&str> {
    items
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect()
}

fn short_mode(mode: &str) -> &str {
    match mode {
        "ReadWriteOnce" => "RWO",
        "ReadWriteOncePod" => "RWOP",
        "ReadWriteMany" => "RWX",
        "ReadOnlyMany" => "ROX",
        other => other,
    }
}

fn human_bytes(bytes: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if bytes % GI == 0 {
        format!("{}Gi", bytes / GI)
    } else if bytes >= GI {
        format!("{:.1}Gi", bytes as f64 / GI as f64)
    } else {
        format!("{}Mi", bytes / MI)
    }
}

fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The last `n` lines of a file (empty when unreadable).
fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// Where cargo put this workspace's binaries: this example runs from `<target>/<profile>/examples/`.
fn workspace_bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().ok_or("no parent directory")?;
    if dir.ends_with("examples") || dir.ends_with("deps") {
        dir = dir.parent().ok_or("no parent directory")?;
    }
    for bin in ["csi-provisioner", "csi-test-driver"] {
        if !dir.join(bin).is_file() {
            return Err(format!(
                "{} not found: build it first (`cargo build --workspace --bins`; make demo does)",
                dir.join(bin).display()
            )
            .into());
        }
    }
    Ok(dir.to_path_buf())
}

async fn kube_client(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;
    client.apiserver_version().await.map_err(|e| {
        format!(
            "the control plane of {} is not answering: {e}",
            path.display()
        )
    })?;
    Ok(client)
}

/// The demo's output: timestamped lines, and while waiting a status line that a terminal
/// rewrites in place (elsewhere, a plain line every few seconds, so logs stay clean).
struct Out {
    start: Instant,
    tty: bool,
    status: bool,
    last: Instant,
}

impl Out {
    fn new() -> Self {
        Out {
            start: Instant::now(),
            tty: std::io::stdout().is_terminal(),
            status: false,
            last: Instant::now(),
        }
    }

    fn say(&mut self, msg: &str) {
        self.clear_status();
        println!("[{:>5.1}s] {msg}", self.start.elapsed().as_secs_f64());
        self.last = Instant::now();
    }

    fn heading(&mut self, msg: &str) {
        self.clear_status();
        println!("\n== {msg}");
        self.last = Instant::now();
    }

    fn waiting(&mut self, msg: &str) {
        if self.tty {
            // One physical line only: a wrapped line could not be erased by `\r` + clear-line.
            let line = format!("[{:>5.1}s] … {msg}", self.start.elapsed().as_secs_f64());
            print!("\r\x1b[2K{}", shorten(&line, STATUS_WIDTH));
            let _ = std::io::stdout().flush();
            self.status = true;
        } else if self.last.elapsed() >= Duration::from_secs(3) {
            self.say(&format!("… {msg}"));
        }
    }

    fn clear_status(&mut self) {
        if self.status {
            print!("\r\x1b[2K");
            let _ = std::io::stdout().flush();
            self.status = false;
        }
    }
}
