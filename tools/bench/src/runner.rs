//! Runs one contender through one scenario round and measures it.
//!
//! Each run gets a fresh test driver (own name, own ledger), its own
//! StorageClass and namespace, so nothing of a previous run is in its way.
//! Sequence: probe claim → start the contender → time to its PV (start-up) →
//! delete the probe → workload → delete everything → wait until the driver
//! holds no volume → read peak RSS → stop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use csi_test_driver::control::{Client as Control, Fault};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cluster::{Cluster, Counts};
use crate::contender::{self, Binaries, Running, Who};
use crate::driver::Driver;
use crate::observe::Observer;
use crate::plan::{Limits, Scenario, Workload};
use crate::procfs::{self, ProcSample};
use crate::scrape::{self, Sample};

/// CSI methods the contenders call; all get the scenario's latency.
const CSI_METHODS: [&str; 6] = [
    "Probe",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
    "CreateVolume",
    "DeleteVolume",
];
/// Claims created or deleted at once by the benchmark itself.
const CLIENT_CONCURRENCY: usize = 64;

/// One point of a run's timeline (seconds since the workload started).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Tick {
    pub t: f64,
    pub pvs: usize,
    pub bound: usize,
    pub cpu_secs: f64,
    pub rss_kib: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    pub scenario: String,
    pub who: Option<Who>,
    pub round: u32,
    /// Claims in the workload.
    pub claims: usize,
    pub provisioned: usize,
    pub bound: usize,
    /// Spawn → PV of a claim that existed before the start.
    pub startup_secs: Option<f64>,
    /// From the first claim created to the last PV / last Bound.
    pub all_pv_secs: Option<f64>,
    pub all_bound_secs: Option<f64>,
    /// From the first claim deleted to the last backend volume gone.
    pub all_gone_secs: Option<f64>,
    pub cpu_provision_secs: f64,
    pub cpu_delete_secs: f64,
    /// kube-apiserver + etcd CPU-seconds during provisioning and deletion
    /// (the contender runs alone: its requests, and the binder's same work).
    #[serde(default)]
    pub control_plane_cpu_provision_secs: f64,
    #[serde(default)]
    pub control_plane_cpu_delete_secs: f64,
    pub peak_rss_kib: u64,
    pub idle_rss_kib: Option<u64>,
    pub api_provision: Counts,
    pub api_delete: Counts,
    pub api_startup: Counts,
    /// Requests while idle (idle scenario only).
    pub api_idle: Counts,
    /// Bytes the contender read from spawn to the probe's volume deleted, when it reached
    /// the API server through the fault proxy (scale profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_bytes: Option<u64>,
    /// The scale profile's figures beyond these (`scale::Extra`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<crate::scale::Extra>,
    pub csi_calls: BTreeMap<String, f64>,
    /// Claim created → its PV seen, per claim (seconds).
    pub latency_pv: Vec<f64>,
    pub latency_bound: Vec<f64>,
    pub timeline: Vec<Tick>,
    pub driver_cpu_secs: f64,
    pub notes: Vec<String>,
    /// `--worker-threads` every contender of the run got.
    #[serde(default)]
    pub worker_threads: u32,
    /// The sidecar's own metrics by phase (`startup`, `provision`, `delete`,
    /// `idle`), each what changed during it (`scrape::FAMILIES`; empty for a
    /// contender that exposes none of them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sidecar_metrics: BTreeMap<String, Vec<Sample>>,
}

pub struct Ctx {
    pub cluster: Cluster,
    pub bins: Binaries,
    pub work_dir: PathBuf,
    pub ticks: f64,
    pub started: Instant,
    /// Makes names unique per invocation (a namespace of a previous run may still be terminating).
    pub run_id: u32,
    /// Prefix of progress lines (a scenario running alongside others names itself).
    pub track: String,
    /// The contenders to run (`--who`); empty means all.
    pub who: Vec<Who>,
    /// `--worker-threads` for every contender (`plan::WORKER_THREADS` unless overridden).
    pub worker_threads: u32,
}

impl Ctx {
    /// `order` without the contenders `--who` left out.
    pub fn chosen(&self, mut order: Vec<Who>) -> Vec<Who> {
        if !self.who.is_empty() {
            order.retain(|w| self.who.contains(w));
        }
        order
    }

    pub(crate) fn say(&self, msg: &str) {
        eprintln!(
            "[{:>7.1}s] {}{msg}",
            self.started.elapsed().as_secs_f64(),
            self.track
        );
    }
}

/// Per-phase safety deadline: generous, never a measurement.
fn deadline(claims: usize, limits: Limits) -> Duration {
    Duration::from_secs_f64(300.0 + claims as f64 * 12.0 / f64::from(limits.qps))
}

/// What one run works in: its driver, namespace and class, what watches them, and how the
/// contender reaches the API server.
pub(crate) struct Setup {
    pub tag: String,
    pub ns: String,
    pub class: String,
    pub driver_name: String,
    /// The run's own driver, or one shared by the runs of a cluster (scale profile).
    pub driver: Arc<Driver>,
    pub control: Control,
    pub observer: Arc<Observer>,
    /// The contender's kubeconfig: its identity, directly or through `proxy`.
    pub kubeconfig: PathBuf,
    /// The fault proxy between the contender and the API server, if any (scale profile:
    /// the forced relist, and the bytes the contender reads).
    pub proxy: Option<Arc<kube_fault_proxy::Proxy>>,
}

async fn setup(
    ctx: &Ctx,
    tag: &str,
    driver_name: &str,
    ns: &str,
    class: &str,
    latency_ms: u64,
) -> anyhow::Result<Setup> {
    let dir = ctx.work_dir.join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let driver = crate::driver::start(&ctx.bins.driver, &dir.join("driver"), driver_name).await?;
    if latency_ms > 0 {
        for m in CSI_METHODS {
            driver
                .control
                .set_fault(m, Fault::Latency { ms: latency_ms })
                .await
                .map_err(|e| anyhow::anyhow!("setting latency: {e}"))?;
        }
    }
    prepare(ctx, tag, Arc::new(driver), driver_name, ns, class).await
}

/// A run's namespace and class (reclaim `Delete`, `Immediate`) for `driver`, and the
/// observer of both; the contender gets the contender identity's kubeconfig.
pub(crate) async fn prepare(
    ctx: &Ctx,
    tag: &str,
    driver: Arc<Driver>,
    driver_name: &str,
    ns: &str,
    class: &str,
) -> anyhow::Result<Setup> {
    std::fs::create_dir_all(ctx.work_dir.join(tag))?;
    let control = driver.control.clone();
    let client = &ctx.cluster.admin;
    create_or_exists(
        &Api::<StorageClass>::all(client.clone()),
        serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": driver_name, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        }))?,
    )
    .await?;
    create_or_exists(
        &Api::<Namespace>::all(client.clone()),
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )?,
    )
    .await?;
    let observer = Arc::new(Observer::start(client, ns).await?);
    Ok(Setup {
        tag: tag.to_string(),
        ns: ns.to_string(),
        class: class.to_string(),
        driver_name: driver_name.to_string(),
        driver,
        control,
        observer,
        kubeconfig: ctx.cluster.contender_kubeconfig.clone(),
        proxy: None,
    })
}

pub(crate) async fn create_or_exists<K>(api: &Api<K>, obj: K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn claim(name: &str, ns: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .expect("claim literal")
}

pub(crate) async fn create_claim(
    client: &Client,
    obs: &Observer,
    ns: &str,
    class: &str,
    name: &str,
) -> anyhow::Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut tries = 0;
    loop {
        match api
            .create(&PostParams::default(), &claim(name, ns, class))
            .await
        {
            Ok(_) => {
                obs.created(name, Instant::now());
                return Ok(());
            }
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("bench: creating claim {name}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context(format!("creating claim {name}")),
        }
    }
}

pub(crate) async fn delete_claims(client: &Client, ns: &str, names: &[String]) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(names)
        .for_each_concurrent(CLIENT_CONCURRENCY, |n| {
            let api = api.clone();
            async move {
                if let Err(e) = api.delete(n, &DeleteParams::default()).await
                    && !matches!(&e, kube::Error::Api(s) if s.code == 404)
                {
                    eprintln!("bench: deleting claim {n}: {e}");
                }
            }
        })
        .await;
}

/// Waits until `done` or the deadline or the contender's death; returns whether done.
pub(crate) async fn wait_until(
    ctx: &Ctx,
    running: &mut Running,
    what: &str,
    limit: Duration,
    mut progress: impl AsyncFnMut() -> (bool, String),
) -> bool {
    let t0 = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let (done, line) = progress().await;
        if done {
            return true;
        }
        if last_print.elapsed() >= Duration::from_secs(3) {
            ctx.say(&format!("  {what}: {line}"));
            last_print = Instant::now();
        }
        if !running.alive() {
            ctx.say(&format!(
                "  {} exited during {what}; last log lines:\n{}",
                running.who.label(),
                running.log_tail(15)
            ));
            return false;
        }
        if t0.elapsed() > limit {
            ctx.say(&format!("  {what}: gave up after {limit:?} ({line})"));
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn sample(ctx: &Ctx, r: &Running) -> ProcSample {
    procfs::sample(r.pid, ctx.ticks).unwrap_or_default()
}

/// CPU-seconds kube-apiserver and etcd have used so far.
fn control_plane_cpu(ctx: &Ctx) -> f64 {
    ctx.cluster
        .control_plane_pids()
        .into_iter()
        .filter_map(|pid| procfs::sample(pid, ctx.ticks).ok())
        .map(|p| p.cpu_secs)
        .sum()
}

async fn driver_stats(control: &Control) -> (usize, BTreeMap<String, f64>) {
    match control.stats().await {
        Ok(s) => (
            s.volumes,
            s.calls.into_iter().map(|(k, v)| (k, v as f64)).collect(),
        ),
        Err(_) => (usize::MAX, BTreeMap::new()),
    }
}

/// Starts the contender with a probe claim waiting; returns it and the time to
/// that claim's PV. Then deletes the probe and waits for its volume to go.
pub(crate) async fn start_contender(
    ctx: &Ctx,
    s: &Setup,
    who: Who,
    limits: Limits,
    result: &mut RunResult,
) -> anyhow::Result<Running> {
    let client = &ctx.cluster.admin;
    let probe = "probe";
    create_claim(client, &s.observer, &s.ns, &s.class, probe).await?;
    let http = contender::free_local_addr()?;
    let flags = contender::common_flags(
        &s.driver.endpoint,
        &s.kubeconfig,
        limits,
        ctx.worker_threads,
        http,
    );
    result.worker_threads = ctx.worker_threads;
    let log = ctx
        .work_dir
        .join(&s.tag)
        .join(format!("{}.log", who.slug()));
    let before = ctx.cluster.request_counts().await?;
    let read_before = s.proxy.as_ref().map(|p| p.stats().bytes_sent);
    let t_spawn = Instant::now();
    let mut running = contender::spawn(who, &ctx.bins, &flags, log, http)?;
    let ok = wait_until(
        ctx,
        &mut running,
        "start-up",
        // A safety limit, not a measurement: the scale profile's largest cluster is listed first.
        Duration::from_secs(600),
        async || {
            (
                s.observer.times(probe).pv.is_some(),
                "waiting for the probe claim's PV".into(),
            )
        },
    )
    .await;
    anyhow::ensure!(ok, "{} did not provision the probe claim", who.label());
    result.startup_secs = s
        .observer
        .times(probe)
        .pv
        .map(|t| (t - t_spawn).as_secs_f64());
    delete_claims(client, &s.ns, &[probe.to_string()]).await;
    let ok = wait_until(
        ctx,
        &mut running,
        "probe deletion",
        Duration::from_secs(180),
        async || {
            let gone = s.observer.state().pv_gone(probe);
            (gone, format!("probe PV gone: {gone}"))
        },
    )
    .await;
    if !ok {
        let left = volume_state(ctx, s, probe).await;
        anyhow::bail!("{} did not delete the probe volume ({left})", who.label());
    }
    result.api_startup = ctx.cluster.request_counts().await?.since(&before);
    result.startup_bytes = s
        .proxy
        .as_ref()
        .zip(read_before)
        .map(|(p, b)| p.stats().bytes_sent - b);
    phase_metrics(&running, result, "startup", &[]).await;
    Ok(running)
}

/// What is left of `claim` and its PV, for a note when its volume was not deleted in time.
async fn volume_state(ctx: &Ctx, s: &Setup, claim: &str) -> String {
    let client = &ctx.cluster.admin;
    let claim_left = match Api::<PersistentVolumeClaim>::namespaced(client.clone(), &s.ns)
        .get_opt(claim)
        .await
    {
        Ok(Some(c)) => format!(
            "claim still there: phase {:?}, volume {:?}, deleting {}, finalizers {:?}",
            c.status.as_ref().and_then(|st| st.phase.clone()),
            c.spec.as_ref().and_then(|sp| sp.volume_name.clone()),
            c.metadata.deletion_timestamp.is_some(),
            c.finalizers()
        ),
        Ok(None) => "claim gone".into(),
        Err(e) => format!("claim: {e}"),
    };
    let pv_name = s.observer.state().pv_of.get(claim).cloned();
    let pv_left = match pv_name {
        None => "no PV seen".into(),
        Some(name) => match Api::<PersistentVolume>::all(client.clone())
            .get_opt(&name)
            .await
        {
            Ok(Some(pv)) => format!(
                "PV {name}: phase {:?}, deleting {}, finalizers {:?}",
                pv.status.as_ref().and_then(|st| st.phase.clone()),
                pv.metadata.deletion_timestamp.is_some(),
                pv.finalizers()
            ),
            Ok(None) => format!("PV {name} gone"),
            Err(e) => format!("PV {name}: {e}"),
        },
    };
    format!("{claim_left}; {pv_left}")
}

/// The scrape at the end of start-up (cumulative: the phase began at spawn).
pub(crate) fn startup_metrics(result: &RunResult) -> Vec<Sample> {
    result
        .sidecar_metrics
        .get("startup")
        .cloned()
        .unwrap_or_default()
}

/// Reads the contender's `/metrics` (nothing for the floor, or when it does
/// not answer: noted in the result).
async fn scrape_metrics(running: &Running, result: &mut RunResult) -> Vec<Sample> {
    let Some(addr) = running.metrics else {
        return Vec::new();
    };
    match read_metrics_page(addr).await {
        Ok((page, _)) => scrape::parse(&page),
        Err(e) => {
            result.notes.push(format!("reading {addr}/metrics: {e}"));
            Vec::new()
        }
    }
}

/// One `GET /metrics` of `addr`: the body, and the time from connecting to its last byte.
pub(crate) async fn read_metrics_page(addr: SocketAddr) -> std::io::Result<(String, Duration)> {
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<(String, Duration)> {
        use std::io::{Read as _, Write as _};
        let t0 = Instant::now();
        let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut page = String::new();
        conn.read_to_string(&mut page)?;
        let took = t0.elapsed();
        let body = page.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((body.to_string(), took))
    })
    .await;
    read.unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Scrapes the contender at the end of `phase` and keeps what changed since
/// `before` (the scrape at the end of the previous phase); returns the scrape.
pub(crate) async fn phase_metrics(
    running: &Running,
    result: &mut RunResult,
    phase: &str,
    before: &[Sample],
) -> Vec<Sample> {
    let now = scrape_metrics(running, result).await;
    let changed = scrape::since(&now, before);
    if !changed.is_empty() {
        result.sidecar_metrics.insert(phase.to_string(), changed);
    }
    now
}

pub async fn run_workload(ctx: &Ctx, sc: &Scenario, who: Who, round: u32) -> RunResult {
    let tag = format!("{}-{}-r{}", sc.name, who.slug(), round);
    let mut result = RunResult {
        scenario: sc.name.clone(),
        who: Some(who),
        round,
        claims: sc.volumes(),
        ..Default::default()
    };
    ctx.say(&format!("{tag}: {}", sc.title()));
    let ns = format!("bench-{tag}-{}", ctx.run_id);
    let driver_name = format!("{tag}-{}.bench.csi", ctx.run_id);
    let setup = match setup(ctx, &tag, &driver_name, &ns, &ns, sc.latency_ms).await {
        Ok(s) => s,
        Err(e) => {
            result.notes.push(format!("setup failed: {e:#}"));
            ctx.say(&format!("{tag}: setup failed: {e:#}"));
            return result;
        }
    };
    let policies = match install_policies(ctx, who, &driver_name, &ns).await {
        Ok(p) => p,
        Err(e) => {
            result.notes.push(format!("installing the policies: {e:#}"));
            ctx.say(&format!("{tag}: installing the policies: {e:#}"));
            cleanup(ctx, &setup, LeftPvs::OfTheDriver).await;
            return result;
        }
    };
    match measure(ctx, sc, who, &setup, &mut result).await {
        Ok(()) => {}
        Err(e) => {
            ctx.say(&format!("{tag}: {e:#}"));
            result.notes.push(format!("{e:#}"));
        }
    }
    if let Some(p) = policies {
        p.remove(&ctx.cluster.admin).await;
    }
    cleanup(ctx, &setup, LeftPvs::OfTheDriver).await;
    summary(ctx, &tag, &result);
    result
}

/// The intent policies for `ours+policies` (none for the others).
pub(crate) async fn install_policies(
    ctx: &Ctx,
    who: Who,
    driver_name: &str,
    ns: &str,
) -> anyhow::Result<Option<crate::policies::Installed>> {
    if who != Who::OursPolicies {
        return Ok(None);
    }
    let p = crate::policies::install(&ctx.cluster.admin, &ctx.cluster.repo, driver_name, ns);
    Ok(Some(p.await?))
}

fn summary(ctx: &Ctx, tag: &str, r: &RunResult) {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}s"));
    ctx.say(&format!(
        "{tag}: done. start-up {}, {}/{} PVs in {}, Bound in {}, deleted in {}, CPU {:.1}s+{:.1}s, peak RSS {} MiB, API requests {:.0}+{:.0}",
        f(r.startup_secs),
        r.provisioned,
        r.claims,
        f(r.all_pv_secs),
        f(r.all_bound_secs),
        f(r.all_gone_secs),
        r.cpu_provision_secs,
        r.cpu_delete_secs,
        r.peak_rss_kib / 1024,
        r.api_provision.total(),
        r.api_delete.total()
    ));
}

async fn measure(
    ctx: &Ctx,
    sc: &Scenario,
    who: Who,
    s: &Setup,
    result: &mut RunResult,
) -> anyhow::Result<()> {
    let driver_cpu0 = procfs::sample(s.driver_pid(), ctx.ticks)
        .unwrap_or_default()
        .cpu_secs;
    let mut running = start_contender(ctx, s, who, sc.limits, result).await?;
    let after_startup = startup_metrics(result);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcome = workload(
        ctx,
        sc,
        s,
        &mut running,
        result,
        &after_startup,
        driver_cpu0,
    )
    .await;
    running.stop().await;
    outcome
}

/// The scenario's claims against a started contender (all at once, or on a schedule), then
/// all deleted: the figures of provisioning and deletion. Done when the driver holds as
/// many volumes as before and no PV of the run's namespace is left.
pub(crate) async fn workload(
    ctx: &Ctx,
    sc: &Scenario,
    s: &Setup,
    running: &mut Running,
    result: &mut RunResult,
    after_startup: &[Sample],
    driver_cpu0: f64,
) -> anyhow::Result<()> {
    let who = running.who;
    let client = ctx.cluster.admin.clone();
    let names: Vec<String> = (0..sc.volumes()).map(|i| format!("c-{i:05}")).collect();
    let m1 = ctx.cluster.request_counts().await?;
    let (volumes_before, d1) = driver_stats(&s.control).await;
    let c1 = sample(ctx, running);
    let cp1 = control_plane_cpu(ctx);
    let t0 = Instant::now();

    // Create: all at once (burst) or on a schedule (steady).
    let creator = {
        let (client, names, obs_ns, class) =
            (client.clone(), names.clone(), s.ns.clone(), s.class.clone());
        let obs = s.observer_handle();
        let workload = sc.workload.clone();
        tokio::spawn(async move {
            match workload {
                Workload::Steady { rate, .. } => {
                    let start = tokio::time::Instant::now();
                    let tasks: Vec<_> = names
                        .into_iter()
                        .enumerate()
                        .map(|(i, n)| {
                            let (client, obs, ns, class) =
                                (client.clone(), obs.clone(), obs_ns.clone(), class.clone());
                            let at = start + Duration::from_secs_f64(i as f64 / rate);
                            tokio::spawn(async move {
                                tokio::time::sleep_until(at).await;
                                create_claim(&client, &obs, &ns, &class, &n).await
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await??;
                    }
                    Ok::<(), anyhow::Error>(())
                }
                _ => {
                    futures::stream::iter(names)
                        .map(|n| {
                            let (client, obs, ns, class) =
                                (client.clone(), obs.clone(), obs_ns.clone(), class.clone());
                            async move { create_claim(&client, &obs, &ns, &class, &n).await }
                        })
                        .buffer_unordered(CLIENT_CONCURRENCY)
                        .collect::<Vec<_>>()
                        .await
                        .into_iter()
                        .collect::<anyhow::Result<Vec<()>>>()?;
                    Ok(())
                }
            }
        })
    };

    let n = names.len();
    let limit = deadline(n, sc.limits)
        + match sc.workload {
            Workload::Steady { secs, .. } => Duration::from_secs(secs),
            _ => Duration::ZERO,
        };
    let mut timeline = Vec::new();
    let mut last_tick = Instant::now() - Duration::from_secs(1);
    let ok = {
        let running_pid = running.pid;
        wait_until(
            ctx,
            running,
            &format!("{} provisioning", who.label()),
            limit,
            async || {
                let st = s.observer.state();
                let is_claim = |k: &str| k != "probe";
                let pvs = st
                    .claims
                    .iter()
                    .filter(|(k, c)| is_claim(k) && c.pv.is_some())
                    .count();
                let bound = st
                    .claims
                    .iter()
                    .filter(|(k, c)| is_claim(k) && c.bound.is_some())
                    .count();
                drop(st);
                if last_tick.elapsed() >= Duration::from_millis(500) {
                    let p = procfs::sample(running_pid, ctx.ticks).unwrap_or_default();
                    timeline.push(Tick {
                        t: t0.elapsed().as_secs_f64(),
                        pvs,
                        bound,
                        cpu_secs: p.cpu_secs - c1.cpu_secs,
                        rss_kib: p.rss_kib,
                    });
                    last_tick = Instant::now();
                }
                let secs = t0.elapsed().as_secs_f64();
                (
                    pvs == n && bound == n,
                    format!(
                        "{pvs}/{n} PVs, {bound} Bound, {:.1} PVs/s",
                        pvs as f64 / secs.max(0.001)
                    ),
                )
            },
        )
        .await
    };
    if let Ok(Err(e)) | Err(e) = creator.await.map_err(anyhow::Error::from) {
        result.notes.push(format!("creating claims: {e:#}"));
    }
    if !ok {
        result.notes.push("provisioning did not complete".into());
    }
    let c2 = sample(ctx, running);
    let cp2 = control_plane_cpu(ctx);
    let m2 = ctx.cluster.request_counts().await?;
    // After the figures of the phase, so the scrape is not counted in them.
    let after_provision = phase_metrics(running, result, "provision", after_startup).await;
    {
        let st = s.observer.state();
        let mut last_pv = None::<Instant>;
        let mut last_bound = None::<Instant>;
        for name in &names {
            let c = st.claims.get(name).copied().unwrap_or_default();
            if let (Some(created), Some(pv)) = (c.created, c.pv) {
                result
                    .latency_pv
                    .push(pv.saturating_duration_since(created).as_secs_f64());
                last_pv = last_pv.max(Some(pv));
                result.provisioned += 1;
            }
            if let (Some(created), Some(b)) = (c.created, c.bound) {
                result
                    .latency_bound
                    .push(b.saturating_duration_since(created).as_secs_f64());
                last_bound = last_bound.max(Some(b));
                result.bound += 1;
            }
        }
        if result.provisioned == n {
            result.all_pv_secs = last_pv.map(|t| (t - t0).as_secs_f64());
        }
        if result.bound == n {
            result.all_bound_secs = last_bound.map(|t| (t - t0).as_secs_f64());
        }
    }
    result.timeline = timeline;

    // Delete everything; done when the driver holds the volumes it held before and no PV
    // of the run is left.
    ctx.say(&format!("  {}: deleting {n} claims", who.label()));
    let t1 = Instant::now();
    delete_claims(&client, &s.ns, &names).await;
    let control = s.control.clone();
    let mut volumes_left = usize::MAX;
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let ok = wait_until(
        ctx,
        running,
        &format!("{} deletion", who.label()),
        deadline(n, sc.limits),
        async || {
            if last_poll.elapsed() >= Duration::from_millis(200) {
                // The driver's volume count (cheap: no ledger copy).
                volumes_left = driver_stats(&control).await.0;
                last_poll = Instant::now();
            }
            let pvs = s.observer.state().pvs_alive.len();
            (
                volumes_left == volumes_before && pvs == 0,
                format!("{volumes_left} backend volumes, {pvs} PVs left"),
            )
        },
    )
    .await;
    if ok {
        result.all_gone_secs = Some(t1.elapsed().as_secs_f64());
    } else {
        result.notes.push("deletion did not complete".into());
    }
    let c3 = sample(ctx, running);
    let cp3 = control_plane_cpu(ctx);
    let m3 = ctx.cluster.request_counts().await?;
    let (_, d3) = driver_stats(&s.control).await;
    phase_metrics(running, result, "delete", &after_provision).await;
    result.cpu_provision_secs = c2.cpu_secs - c1.cpu_secs;
    result.cpu_delete_secs = c3.cpu_secs - c2.cpu_secs;
    result.control_plane_cpu_provision_secs = cp2 - cp1;
    result.control_plane_cpu_delete_secs = cp3 - cp2;
    result.peak_rss_kib = c3.hwm_kib;
    result.api_provision = m2.since(&m1);
    result.api_delete = m3.since(&m2);
    result.csi_calls = d3
        .iter()
        .map(|(k, v)| (k.clone(), v - d1.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    result.driver_cpu_secs = procfs::sample(s.driver_pid(), ctx.ticks)
        .unwrap_or_default()
        .cpu_secs
        - driver_cpu0;
    Ok(())
}

impl Setup {
    fn driver_pid(&self) -> u32 {
        self.driver.pid
    }

    fn observer_handle(&self) -> Arc<Observer> {
        self.observer.clone()
    }
}

/// Which PVs [`cleanup`] removes.
pub(crate) enum LeftPvs {
    /// Every PV of the run's driver.
    OfTheDriver,
    /// Only the PVs the run's observer saw alive (the scale profile: its pairs, of the same
    /// driver, stay).
    SeenByTheRun,
}

/// Removes what a run left: finalizers that a dead contender could not drop,
/// the claims, the PVs `which` names, the namespace, the class.
pub(crate) async fn cleanup(ctx: &Ctx, s: &Setup, which: LeftPvs) {
    let client = &ctx.cluster.admin;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &s.ns);
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    if let Ok(list) = claims.list(&ListParams::default()).await {
        for c in list {
            let _ = claims
                .patch(&c.name_any(), &PatchParams::default(), &unfinalize)
                .await;
            let _ = claims.delete(&c.name_any(), &DeleteParams::default()).await;
        }
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let left: Vec<String> = match which {
        LeftPvs::SeenByTheRun => s.observer.state().pvs_alive.iter().cloned().collect(),
        LeftPvs::OfTheDriver => match pvs.list(&ListParams::default()).await {
            Ok(list) => list
                .into_iter()
                .filter(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.csi.as_ref())
                        .map(|c| c.driver.as_str())
                        == Some(s.driver_name.as_str())
                })
                .map(|pv| pv.name_any())
                .collect(),
            Err(_) => Vec::new(),
        },
    };
    for pv in left {
        let _ = pvs.patch(&pv, &PatchParams::default(), &unfinalize).await;
        let _ = pvs.delete(&pv, &DeleteParams::default()).await;
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&s.ns, &DeleteParams::default())
        .await;
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(&s.class, &DeleteParams::default())
        .await;
}

/// The idle scenario: `objects` bound PVs and claims of one driver exist; each
/// contender starts (start-up = time to provision a probe claim with all of
/// them in its caches), deletes the probe, then idles; its RSS is read at the end.
pub async fn run_idle(ctx: &Ctx, sc: &Scenario, order: &[Who]) -> Vec<RunResult> {
    let Workload::Idle { objects, .. } = sc.workload else {
        return Vec::new();
    };
    let ns = format!("bench-idle-{}", ctx.run_id);
    let driver_name = format!("idle-{}.bench.csi", ctx.run_id);
    let (ns, class, driver_name) = (ns.as_str(), ns.as_str(), driver_name.as_str());
    let mut results = Vec::new();
    if let Err(e) = populate(ctx, ns, class, driver_name, objects).await {
        ctx.say(&format!("idle: populating failed: {e:#}"));
        results.push(RunResult {
            scenario: sc.name.clone(),
            notes: vec![format!("populating failed: {e:#}")],
            ..Default::default()
        });
        return results;
    }
    for &who in order {
        let tag = format!("idle-{}", who.slug());
        ctx.say(&format!("{tag}: {}", sc.title()));
        let mut result = RunResult {
            scenario: sc.name.clone(),
            who: Some(who),
            claims: objects,
            ..Default::default()
        };
        let outcome = async {
            let s = setup(ctx, &tag, driver_name, ns, class, 0).await?;
            // Installed before the start, as for the workloads (the probe
            // claim then takes the policy path).
            let policies = install_policies(ctx, who, driver_name, ns).await?;
            let measured = idle(ctx, sc, &s, who, &mut result).await;
            if let Some(p) = policies {
                p.remove(&ctx.cluster.admin).await;
            }
            measured
        }
        .await;
        if let Err(e) = outcome {
            ctx.say(&format!("{tag}: {e:#}"));
            result.notes.push(format!("{e:#}"));
        }
        ctx.say(&format!(
            "{tag}: start-up {:.1}s, idle RSS {} MiB, peak RSS {} MiB",
            result.startup_secs.unwrap_or(f64::NAN),
            result.idle_rss_kib.unwrap_or(0) / 1024,
            result.peak_rss_kib / 1024
        ));
        results.push(result);
    }
    // Leave the cluster as we found it (the PVs go once their claims are gone).
    let client = &ctx.cluster.admin;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::default())
        .await;
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("bench={ns}")),
        )
        .await;
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(class, &DeleteParams::default())
        .await;
    results
}

/// One contender's idle run on the populated cluster.
async fn idle(
    ctx: &Ctx,
    sc: &Scenario,
    s: &Setup,
    who: Who,
    result: &mut RunResult,
) -> anyhow::Result<()> {
    let Workload::Idle { idle_secs, .. } = sc.workload else {
        return Ok(());
    };
    let running = start_contender(ctx, s, who, sc.limits, result).await?;
    let after_startup = startup_metrics(result);
    ctx.say(&format!("  {}: idle for {idle_secs} s", who.label()));
    let m0 = ctx.cluster.request_counts().await?;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let p = sample(ctx, &running);
    result.idle_rss_kib = Some(p.rss_kib);
    result.peak_rss_kib = p.hwm_kib;
    result.cpu_provision_secs = p.cpu_secs;
    result.api_idle = ctx.cluster.request_counts().await?.since(&m0);
    phase_metrics(&running, result, "idle", &after_startup).await;
    running.stop().await;
    Ok(())
}

/// Creates `objects` pre-bound PV/claim pairs (reclaim Retain, so no contender
/// has anything to do with them) and waits until the binder has bound them.
async fn populate(
    ctx: &Ctx,
    ns: &str,
    class: &str,
    driver: &str,
    objects: usize,
) -> anyhow::Result<()> {
    let client = ctx.cluster.admin.clone();
    create_or_exists(
        &Api::<StorageClass>::all(client.clone()),
        serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": class},
            "provisioner": driver, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        }))?,
    )
    .await?;
    create_or_exists(
        &Api::<Namespace>::all(client.clone()),
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )?,
    )
    .await?;
    let observer = Observer::start(&client, ns).await?;
    ctx.say(&format!("idle: creating {objects} bound PVs and claims"));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let created = futures::stream::iter(0..objects)
        .map(|i| {
            let (pvs, claims) = (pvs.clone(), claims.clone());
            async move {
                let (pv_name, claim_name) = (format!("{ns}-{i:05}"), format!("idle-{i:05}"));
                let pv: PersistentVolume = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": pv_name, "labels": {"bench": ns},
                                 "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
                    "spec": {
                        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                        "claimRef": {"namespace": ns, "name": claim_name},
                        "csi": {"driver": driver, "volumeHandle": format!("idle-{i:05}")},
                    },
                }))?;
                create_or_exists(&pvs, pv).await?;
                let mut c = claim(&claim_name, ns, class);
                c.spec.as_mut().expect("spec").volume_name = Some(pv_name);
                create_or_exists(&claims, c).await
            }
        })
        .buffer_unordered(CLIENT_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let t0 = Instant::now();
    loop {
        let bound = observer.state().count(|c| c.bound.is_some());
        if bound >= objects {
            break;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(900),
            "only {bound}/{objects} bound after 900 s"
        );
        if t0.elapsed().as_secs().is_multiple_of(5) {
            ctx.say(&format!("idle: {bound}/{objects} bound"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ctx.say(&format!(
        "idle: {objects} bound in {:.0} s",
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}
