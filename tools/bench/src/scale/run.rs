//! One size of the scale profile: the cluster grown to it, then each contender in turn:
//! start-up with a claim waiting, idle, one `/metrics` scrape, the burst (the same
//! measurement as the burst scenarios), a forced relist, and, in ours' turn, one audit.
//! Each contender reaches the API server through an in-process kube-fault-proxy of its own
//! (the forced relist, the bytes read), with the contender identity's credentials, so the
//! API server still counts its requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_fault_proxy::Proxy;

use super::fill::{self, Bed};
use super::{Audit, ControlPlane, Extra, Relist};
use crate::contender::{Running, Who};
use crate::plan::{Scenario, Workload};
use crate::procfs;
use crate::runner::{
    Ctx, LeftPvs, RunResult, Setup, cleanup, create_claim, delete_claims, install_policies,
    phase_metrics, prepare, read_metrics_page, sample, start_contender, startup_metrics,
    wait_until, workload,
};

/// The claim created right after the cut.
const RELIST_CLAIM: &str = "after-relist";
/// How long after that claim's PV the relist's peak is read (the other watches may still
/// be listing).
const RELIST_SETTLE: Duration = Duration::from_secs(5);

/// Grows the cluster to `sc`'s size (starting the profile's driver on the first size) and
/// runs each contender of `order` on it.
pub async fn run_size(
    ctx: &Ctx,
    sc: &Scenario,
    order: &[Who],
    bed: &mut Option<Bed>,
) -> Vec<RunResult> {
    let Workload::Scale {
        pairs, idle_secs, ..
    } = sc.workload
    else {
        return Vec::new();
    };
    let failed = |e: anyhow::Error| {
        ctx.say(&format!("{}: {e:#}", sc.name));
        vec![RunResult {
            scenario: sc.name.clone(),
            notes: vec![format!("filling the cluster failed: {e:#}")],
            ..Default::default()
        }]
    };
    if bed.is_none() {
        match fill::start(ctx).await {
            Ok(b) => *bed = Some(b),
            Err(e) => return failed(e),
        }
    }
    let Some(bed) = bed.as_mut() else {
        return Vec::new();
    };
    let fill = match fill::grow(ctx, bed, pairs).await {
        Ok(f) => f,
        Err(e) => return failed(e),
    };
    let mut results = Vec::new();
    for &who in order {
        let mut result = RunResult {
            scenario: sc.name.clone(),
            who: Some(who),
            round: 1,
            claims: sc.volumes(),
            ..Default::default()
        };
        let mut extra = Extra {
            pairs,
            idle_secs,
            fill: fill.clone(),
            ..Default::default()
        };
        ctx.say(&format!("{}-{}: {}", sc.name, who.slug(), sc.title()));
        if let Err(e) = one(ctx, sc, who, bed, &mut result, &mut extra).await {
            ctx.say(&format!("{}-{}: {e:#}", sc.name, who.slug()));
            result.notes.push(format!("{e:#}"));
        }
        extra.control_plane = control_plane(ctx);
        say_done(ctx, sc, who, &result, &extra);
        result.scale = Some(extra);
        results.push(result);
    }
    results
}

/// One contender at one size: its namespace, class and proxy, the policies for
/// ours+policies, the measurement, then everything of the run removed (the pairs stay).
async fn one(
    ctx: &Ctx,
    sc: &Scenario,
    who: Who,
    bed: &Bed,
    result: &mut RunResult,
    extra: &mut Extra,
) -> anyhow::Result<()> {
    let tag = format!("{}-{}", sc.name, who.slug());
    let ns = format!("bench-{tag}-{}", ctx.run_id);
    let mut s = prepare(ctx, &tag, bed.driver.clone(), &bed.driver_name, &ns, &ns).await?;
    let proxy = start_proxy(ctx).await?;
    let kubeconfig = ctx.work_dir.join(&tag).join("kubeconfig-proxy");
    proxy.write_kubeconfig(&kubeconfig, "default")?;
    s.kubeconfig = kubeconfig;
    s.proxy = Some(Arc::new(proxy));
    let outcome = match install_policies(ctx, who, &bed.driver_name, &ns).await {
        Ok(policies) => {
            let measured = measure(ctx, sc, who, bed, &s, result, extra).await;
            if let Some(p) = policies {
                p.remove(&ctx.cluster.admin).await;
            }
            measured
        }
        Err(e) => Err(e.context("installing the policies")),
    };
    // Its claims and their PVs; the pairs stay.
    cleanup(ctx, &s, LeftPvs::SeenByTheRun).await;
    outcome
}

/// A fault proxy in front of the API server with the contender identity's credentials.
async fn start_proxy(ctx: &Ctx) -> anyhow::Result<Proxy> {
    let kc = Kubeconfig::read_from(&ctx.cluster.contender_kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Proxy::start("127.0.0.1:0".parse()?, config, 1).await?)
}

async fn measure(
    ctx: &Ctx,
    sc: &Scenario,
    who: Who,
    bed: &Bed,
    s: &Setup,
    result: &mut RunResult,
    extra: &mut Extra,
) -> anyhow::Result<()> {
    let mut running = start_contender(ctx, s, who, sc.limits, result).await?;
    let outcome = phases(ctx, sc, who, bed, s, &mut running, result, extra).await;
    running.stop().await;
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn phases(
    ctx: &Ctx,
    sc: &Scenario,
    who: Who,
    bed: &Bed,
    s: &Setup,
    running: &mut Running,
    result: &mut RunResult,
    extra: &mut Extra,
) -> anyhow::Result<()> {
    let after_startup = startup_metrics(result);

    ctx.say(&format!(
        "  {}: idle for {} s",
        who.label(),
        extra.idle_secs
    ));
    let kcm = ctx.cluster.pid_of("kube-controller-manager");
    let kcm_cpu = || {
        kcm.and_then(|p| procfs::sample(p, ctx.ticks).ok())
            .map(|p| p.cpu_secs)
    };
    let (m0, kcm0) = (ctx.cluster.request_counts().await?, kcm_cpu());
    tokio::time::sleep(Duration::from_secs(extra.idle_secs)).await;
    let p = sample(ctx, running);
    result.idle_rss_kib = Some(p.rss_kib);
    extra.startup_peak_kib = Some(p.hwm_kib);
    result.api_idle = ctx.cluster.request_counts().await?.since(&m0);
    if let (Some(a), Some(b)) = (kcm0, kcm_cpu())
        && extra.idle_secs > 0
    {
        extra.controller_manager_cpu_per_min = Some((b - a) * 60.0 / extra.idle_secs as f64);
    }
    let after_idle = phase_metrics(running, result, "idle", &after_startup).await;

    if let Some(addr) = running.metrics {
        match read_metrics_page(addr).await {
            Ok((page, took)) => {
                extra.scrape_secs = Some(took.as_secs_f64());
                extra.scrape_bytes = Some(page.len() as u64);
            }
            Err(e) => result.notes.push(format!("scraping {addr}/metrics: {e}")),
        }
    }

    let driver_cpu0 = procfs::sample(bed.driver.pid, ctx.ticks)
        .unwrap_or_default()
        .cpu_secs;
    workload(ctx, sc, s, running, result, &after_idle, driver_cpu0).await?;

    match relist(ctx, s, running).await {
        Ok(r) => {
            if r.gone == 0 {
                result
                    .notes
                    .push("the cut made no watch relist (no resume was answered 410)".into());
            }
            extra.relist = Some(r);
        }
        Err(e) => result.notes.push(format!("relist: {e:#}")),
    }

    if who == Who::Ours {
        match audit(ctx, bed, extra.pairs).await {
            Ok(a) => extra.audit = Some(a),
            Err(e) => result.notes.push(format!("audit: {e:#}")),
        }
    }
    Ok(())
}

/// Cuts every watch stream of the contender with its resume expired, creates a claim at
/// once, and measures until its PV (and the peak memory meanwhile); then deletes it.
async fn relist(ctx: &Ctx, s: &Setup, running: &mut Running) -> anyhow::Result<Relist> {
    let proxy = s.proxy.as_ref().context("the contender has no proxy")?;
    ctx.say(&format!(
        "  {}: forced relist (watches cut, resumes answered 410)",
        running.who.label()
    ));
    let pid = running.pid;
    let reset = procfs::reset_peak(pid).is_ok();
    let before = proxy.stats();
    let t0 = Instant::now();
    proxy.expire_watches(&[]);
    create_claim(
        &ctx.cluster.admin,
        &s.observer,
        &s.ns,
        &s.class,
        RELIST_CLAIM,
    )
    .await?;
    let mut sampled = 0u64;
    let served = wait_until(
        ctx,
        running,
        "relist",
        Duration::from_secs(600),
        async || {
            sampled = sampled.max(procfs::sample(pid, ctx.ticks).unwrap_or_default().rss_kib);
            (
                s.observer.times(RELIST_CLAIM).pv.is_some(),
                "waiting for the PV of a claim made after the cut".into(),
            )
        },
    )
    .await;
    let secs = s
        .observer
        .times(RELIST_CLAIM)
        .pv
        .filter(|_| served)
        .map(|t| t.saturating_duration_since(t0).as_secs_f64());
    let settle = Instant::now();
    while settle.elapsed() < RELIST_SETTLE {
        sampled = sampled.max(procfs::sample(pid, ctx.ticks).unwrap_or_default().rss_kib);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let p = procfs::sample(pid, ctx.ticks).unwrap_or_default();
    let after = proxy.stats();
    let gone = |st: &kube_fault_proxy::Stats| st.injected.get("watch-gone").copied().unwrap_or(0);
    let relist = Relist {
        secs,
        peak_kib: Some(if reset { p.hwm_kib } else { sampled }),
        peak_from: if reset { "VmHWM" } else { "sampled" }.into(),
        bytes: after.bytes_sent.saturating_sub(before.bytes_sent),
        gone: gone(&after).saturating_sub(gone(&before)),
    };
    delete_claims(&ctx.cluster.admin, &s.ns, &[RELIST_CLAIM.to_string()]).await;
    wait_until(
        ctx,
        running,
        "the relist claim's deletion",
        Duration::from_secs(180),
        async || (s.observer.state().pv_gone(RELIST_CLAIM), String::new()),
    )
    .await;
    Ok(relist)
}

/// One `csi-provisioner audit` against the profile's driver (as admin, straight to the API
/// server), its peak memory read while it runs.
async fn audit(ctx: &Ctx, bed: &Bed, pairs: usize) -> anyhow::Result<Audit> {
    ctx.say("  ours: csi-provisioner audit");
    let out = ctx.work_dir.join(format!("audit-{pairs}.json"));
    let err = ctx.work_dir.join(format!("audit-{pairs}.log"));
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(&ctx.bins.ours)
        .arg("audit")
        .arg(format!("--csi-address={}", bed.driver.endpoint.display()))
        .arg(format!(
            "--kubeconfig={}",
            ctx.cluster.dir.join("kubeconfig").display()
        ))
        .args(["--output=json", "--recheck-after=0s"])
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .kill_on_drop(true)
        .spawn()
        .context("starting csi-provisioner audit")?;
    let pid = child.id().context("the audit's pid")?;
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        peak = peak.max(procfs::sample(pid, ctx.ticks).map_or(0, |p| p.hwm_kib));
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(900),
            "the audit ran for 900 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    let report: Option<serde_json::Value> = std::fs::read(&out)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    Ok(Audit {
        secs,
        peak_kib: peak,
        exit: status.code(),
        findings: report.and_then(|r| r["findings"].as_array().map(Vec::len)),
    })
}

fn control_plane(ctx: &Ctx) -> ControlPlane {
    let read = |name: &str| {
        ctx.cluster
            .pid_of(name)
            .and_then(|p| procfs::sample(p, ctx.ticks).ok())
            .unwrap_or_default()
    };
    let (apiserver, etcd) = (read("kube-apiserver"), read("etcd"));
    ControlPlane {
        apiserver_rss_kib: apiserver.rss_kib,
        apiserver_peak_kib: apiserver.hwm_kib,
        etcd_rss_kib: etcd.rss_kib,
        etcd_db_bytes: ctx.cluster.etcd_db_bytes().unwrap_or(0),
    }
}

fn say_done(ctx: &Ctx, sc: &Scenario, who: Who, r: &RunResult, e: &Extra) {
    let secs = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}s"));
    let mib = |k: Option<u64>| k.map_or("-".to_string(), |v| format!("{} MiB", v / 1024));
    ctx.say(&format!(
        "{}-{}: start-up {}, idle RSS {}, burst {}/{} PVs in {}, relist {} (peak {}), scrape {}, audit {}",
        sc.name,
        who.slug(),
        secs(r.startup_secs),
        mib(r.idle_rss_kib),
        r.provisioned,
        r.claims,
        secs(r.all_pv_secs),
        secs(e.relist.as_ref().and_then(|x| x.secs)),
        mib(e.relist.as_ref().and_then(|x| x.peak_kib)),
        e.scrape_secs
            .map_or("-".to_string(), |s| format!("{:.1} ms", s * 1000.0)),
        secs(e.audit.as_ref().map(|a| a.secs)),
    ));
}
