//! `make bench` / `make bench-quick` / `make bench-scale`: our csi-provisioner against
//! the upstream Go sidecar and a minimal floor client, on one local control plane with the
//! test driver, same flags, alternating, several rounds. Prints progress,
//! then a table per scenario (per figure for `scale`), and writes them (with plots) into
//! docs/benchmarks.md. A benchmark, not a test: nothing here asserts speed.

mod cluster;
mod contender;
mod driver;
mod floor;
mod observe;
mod plan;
mod plot;
mod policies;
mod procfs;
mod report;
mod runner;
mod scale;
mod scrape;
mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};

use contender::{Binaries, Who};
use plan::{Profile, Scenario, Workload};
use runner::{Ctx, RunResult};

#[derive(Parser)]
#[command(
    name = "bench",
    about = "Benchmark csi-provisioner against the upstream Go sidecar"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the benchmark (start a control plane, run every scenario, write the report).
    Run(RunArgs),
    /// The floor client (started by `run` as a contender; takes the sidecars' flags).
    Floor(floor::FloorArgs),
    /// Write the report of a profile from the results of one or more earlier runs (e.g.
    /// scenarios run separately with --only and --no-doc); no cluster needed.
    Report {
        #[arg(long, value_enum, default_value_t = Profile::Quick)]
        profile: Profile,
        /// A results.json written by `run` (in its --work-dir); repeatable, merged in order.
        #[arg(long, required = true)]
        results: Vec<PathBuf>,
        /// The report to update (its generated section for this profile).
        #[arg(long, default_value = "docs/benchmarks.md")]
        doc: PathBuf,
    },
    /// Redraw the plots of a profile from its results JSON (no cluster needed).
    Plot {
        #[arg(long, value_enum, default_value_t = Profile::Quick)]
        profile: Profile,
        /// Default: docs/benchmarks/<profile>-results.json.
        #[arg(long)]
        results: Option<PathBuf>,
        #[arg(long, default_value = "docs/benchmarks")]
        dir: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, value_enum, default_value_t = Profile::Quick)]
    profile: Profile,
    /// Use the control plane of CSI_TESTBED_DIR instead of starting one.
    #[arg(long)]
    reuse_cluster: bool,
    /// Where to start the control plane (default /tmp/tb-bench-<pid>).
    #[arg(long)]
    cluster_dir: Option<PathBuf>,
    /// Only these scenarios (by name, e.g. burst-raised-0ms); repeatable.
    #[arg(long)]
    only: Vec<String>,
    /// Only these contenders (e.g. `--who ours` to profile one side); repeatable.
    /// The report's ratios need all three.
    #[arg(long, value_enum)]
    who: Vec<Who>,
    /// Override the number of rounds of every non-idle scenario.
    #[arg(long)]
    rounds: Option<u32>,
    /// Override the size of every burst (for a quick look; the report says what ran).
    #[arg(long)]
    claims: Option<usize>,
    /// Scale profile: these cluster sizes (bound PV/PVC pairs) instead of 1,000, 10,000,
    /// 20,000 and 50,000; repeatable (e.g. `--pairs 1000` for a small run).
    #[arg(long)]
    pairs: Vec<usize>,
    /// Scale profile: claims in the burst into the full cluster (default 2,000).
    #[arg(long)]
    burst: Option<usize>,
    /// Scale and idle scenarios: seconds of idling before the RSS is read.
    #[arg(long)]
    idle_secs: Option<u64>,
    /// `--worker-threads` for every contender (default: upstream's 100). For the
    /// experiment "slot-bound or machine-bound?": `--worker-threads 200` at raised limits.
    #[arg(long, env = "BENCH_WORKER_THREADS", default_value_t = plan::WORKER_THREADS)]
    worker_threads: u32,
    /// The report to update (its generated section for this profile).
    #[arg(long, default_value = "docs/benchmarks.md")]
    doc: PathBuf,
    /// Print the tables but leave docs/ alone.
    #[arg(long)]
    no_doc: bool,
    /// Logs and per-run state.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
    #[arg(long, default_value = "target/release/csi-provisioner")]
    ours: PathBuf,
    #[arg(long, default_value = "target/release/csi-test-driver")]
    driver: PathBuf,
    /// Default: $CSI_TESTBED_BIN/csi-provisioner-upstream of the control plane.
    #[arg(long)]
    upstream: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Floor(args) => floor::run(args).await,
        Cmd::Run(args) => run(args).await,
        Cmd::Report {
            profile,
            results,
            doc,
        } => {
            let repo = std::env::current_dir()?;
            let mut merged: Vec<RunResult> = Vec::new();
            for path in &results {
                let runs: Vec<RunResult> = serde_json::from_slice(&std::fs::read(path)?)?;
                merged.extend(runs);
            }
            let scenarios = scenarios_that_ran(profile, &merged);
            anyhow::ensure!(!scenarios.is_empty(), "no results of profile {profile:?}");
            let files: Vec<String> = results.iter().map(|p| p.display().to_string()).collect();
            let header = Machine::read(&repo)
                .describe_merged(&format!("{profile:?}").to_lowercase(), &files);
            write_report(&repo, &doc, profile, &scenarios, &merged, header, false)
        }
        Cmd::Plot {
            profile,
            results,
            dir,
        } => {
            let name = format!("{profile:?}").to_lowercase();
            let path = results.unwrap_or_else(|| dir.join(format!("{name}-results.json")));
            let results: Vec<RunResult> = serde_json::from_slice(&std::fs::read(&path)?)?;
            let files: Vec<String> = if profile == Profile::Scale {
                scale::report::draw_plots(&dir, &results)
                    .into_values()
                    .map(|(file, _)| file)
                    .collect()
            } else {
                draw_plots(&dir, &name, &plan::plan(profile), &results)
                    .into_iter()
                    .map(|(file, _)| file)
                    .collect()
            };
            for file in files {
                eprintln!("bench: wrote {}", dir.join(file).display());
            }
            Ok(())
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let repo = std::env::current_dir()?;
    anyhow::ensure!(
        args.profile == Profile::Scale || (args.pairs.is_empty() && args.burst.is_none()),
        "--pairs and --burst are the scale profile's"
    );
    let planned = if args.pairs.is_empty() {
        plan::plan(args.profile)
    } else {
        plan::scale_plan(&args.pairs, plan::SCALE_BURST, plan::SCALE_IDLE_SECS)
    };
    let mut scenarios: Vec<Scenario> = planned
        .into_iter()
        .filter(|s| args.only.is_empty() || args.only.contains(&s.name))
        .collect();
    anyhow::ensure!(
        !scenarios.is_empty(),
        "no scenario matches --only {:?}",
        args.only
    );
    if let Some(r) = args.rounds {
        for s in scenarios
            .iter_mut()
            .filter(|s| !matches!(s.workload, Workload::Idle { .. }))
        {
            s.rounds = r;
        }
    }
    if let Some(n) = args.claims {
        for s in scenarios.iter_mut() {
            if let Workload::Burst { claims } = &mut s.workload {
                *claims = n;
            }
        }
    }
    for s in scenarios.iter_mut() {
        match &mut s.workload {
            Workload::Scale {
                burst, idle_secs, ..
            } => {
                *burst = args.burst.unwrap_or(*burst);
                *idle_secs = args.idle_secs.unwrap_or(*idle_secs);
            }
            Workload::Idle { idle_secs, .. } => {
                *idle_secs = args.idle_secs.unwrap_or(*idle_secs);
            }
            _ => {}
        }
    }
    let machine = Machine::read(&repo);
    let cluster_dir = args
        .cluster_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/tb-bench-{}", std::process::id())));
    eprintln!(
        "bench: profile {:?}, {} scenarios; control plane in {}",
        args.profile,
        scenarios.len(),
        cluster_dir.display()
    );
    let cluster = cluster::Cluster::up_with(
        &repo,
        &cluster_dir,
        args.reuse_cluster,
        testbed_settings(args.profile),
    )
    .await?;
    let bins = Binaries {
        upstream: args
            .upstream
            .clone()
            .unwrap_or_else(|| cluster.bin_dir.join("csi-provisioner-upstream")),
        ours: abs(&repo, &args.ours),
        bench: std::env::current_exe()?,
        driver: abs(&repo, &args.driver),
    };
    let work_dir = abs(&repo, &args.work_dir).join(format!("{:?}", args.profile).to_lowercase());
    std::fs::create_dir_all(&work_dir)?;
    let ctx = Ctx {
        cluster,
        bins,
        work_dir: work_dir.clone(),
        ticks: procfs::clock_ticks(),
        started,
        run_id: std::process::id() % 100_000,
        track: String::new(),
        who: args.who.clone(),
        worker_threads: args.worker_threads,
    };
    let sink = ResultSink::new(work_dir.join("results.json"));
    // Everything runs in turn on this control plane, except the scenarios bound
    // by the client token bucket: after the rest, those run side by side, each
    // on a control plane of its own (two 2,000-claim creations at once would
    // disturb the CPU-bound raised-limit runs; they do not disturb each other).
    let (alone, shared): (Vec<&Scenario>, Vec<&Scenario>) =
        scenarios.iter().partition(|s| s.own_control_plane);
    let side_tracks = alone.iter().map(|sc| {
        let (repo, ctx, sink) = (&repo, &ctx, &sink);
        let dir = PathBuf::from(format!("{}-{}", cluster_dir.display(), sc.name));
        async move {
            let side = Ctx {
                cluster: cluster::Cluster::up(repo, &dir, false).await?,
                bins: ctx.bins.clone(),
                work_dir: ctx.work_dir.clone(),
                ticks: ctx.ticks,
                started: ctx.started,
                run_id: ctx.run_id,
                track: format!("{}: ", sc.name),
                who: ctx.who.clone(),
                worker_threads: ctx.worker_threads,
            };
            let outcome = run_track(&side, &[sc], sink).await;
            side.cluster.down();
            outcome
        }
    });
    let outcome = async {
        ctx.bins.check()?;
        run_track(&ctx, &shared, &sink).await?;
        ctx.cluster.down();
        futures::future::join_all(side_tracks)
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<()>>>()?;
        anyhow::Ok(())
    }
    .await;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    ctx.cluster.down();
    outcome?;
    let results = sink.take();
    std::fs::write(
        work_dir.join("results.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;

    let elapsed = started.elapsed().as_secs_f64();
    let header = machine.describe(
        &format!("{:?}", args.profile).to_lowercase(),
        elapsed,
        &load_after,
    );
    write_report(
        &repo,
        &args.doc,
        args.profile,
        &scenarios,
        &results,
        header,
        args.no_doc,
    )
}

/// testbed/cluster.sh's settings for a profile. Scale: the binder's periodic sync at
/// Kubernetes' default (15 s, not the tests' 2 s), so that at 50,000 pairs it does not walk
/// 100,000 objects every 2 s on the machine the contenders are measured on; etcd's quota at
/// its suggested maximum, 8 GiB, not its default 2 GiB: 1,000 pairs and four small runs
/// left a 17 MiB database, which grows with the pairs toward 1 GiB at 50,000 before the
/// bursts' history, and a full database turns etcd read-only hours into a run
/// (docs/benchmarks.md, "Scale").
fn testbed_settings(profile: Profile) -> &'static [(&'static str, &'static str)] {
    match profile {
        Profile::Scale => &[
            ("CSI_TESTBED_PV_SYNC_PERIOD", "15s"),
            ("CSI_TESTBED_ETCD_QUOTA_BYTES", "8589934592"),
        ],
        Profile::Quick | Profile::Full => &[],
    }
}

/// Results as they come in, from every track, saved after each run so an
/// interrupted benchmark keeps what it measured.
struct ResultSink {
    path: PathBuf,
    results: std::sync::Mutex<Vec<RunResult>>,
}

impl ResultSink {
    fn new(path: PathBuf) -> ResultSink {
        ResultSink {
            path,
            results: Default::default(),
        }
    }

    fn push(&self, runs: Vec<RunResult>) -> anyhow::Result<()> {
        let mut results = self.results.lock().expect("poisoned");
        results.extend(runs);
        std::fs::write(&self.path, serde_json::to_vec_pretty(&*results)?)?;
        Ok(())
    }

    fn take(self) -> Vec<RunResult> {
        self.results.into_inner().expect("poisoned")
    }
}

/// Runs `scenarios` one after the other on `ctx`'s control plane, contenders
/// alternating within each.
async fn run_track(ctx: &Ctx, scenarios: &[&Scenario], sink: &ResultSink) -> anyhow::Result<()> {
    // The scale profile's cluster, grown size after size.
    let mut bed = None;
    for (i, sc) in scenarios.iter().enumerate() {
        if let Workload::Scale { .. } = sc.workload {
            // Each size starts with another contender.
            let order = ctx.chosen(rotation(i as u32));
            sink.push(scale::run_size(ctx, sc, &order, &mut bed).await)?;
        } else if let Workload::Idle { .. } = sc.workload {
            // ours+policies too: its start-up and idle cost are measured, not assumed.
            let order = ctx.chosen(rotation(0));
            sink.push(runner::run_idle(ctx, sc, &order).await)?;
        } else {
            for round in 0..sc.rounds {
                for who in ctx.chosen(rotation(round)) {
                    sink.push(vec![runner::run_workload(ctx, sc, who, round + 1).await])?;
                }
            }
        }
    }
    Ok(())
}

/// Prints the tables and, unless `no_doc`, rewrites the profile's generated
/// section of `doc`, its plots and its raw results next to it.
fn write_report(
    repo: &Path,
    doc: &Path,
    profile: Profile,
    scenarios: &[Scenario],
    results: &[RunResult],
    header: String,
    no_doc: bool,
) -> anyhow::Result<()> {
    if profile == Profile::Scale {
        return write_scale_report(repo, doc, scenarios, results, header, no_doc);
    }
    let mut verdicts = Vec::new();
    let mut sections = String::new();
    for sc in scenarios {
        let figs = figures_of(sc, results);
        sections.push_str(&report::scenario_section(sc, &figs, &mut verdicts));
        sections.push('\n');
        if let Some(metrics) = report::metrics_section(sc, results) {
            sections.push_str(&metrics);
            sections.push('\n');
        }
        if sc.name == "burst-raised-0ms" {
            sections.push_str(&report::api_detail_section(sc, &figs));
            sections.push('\n');
        }
    }
    let profile = format!("{profile:?}").to_lowercase();
    let summary = report::verdict_table(&verdicts);
    println!("\n## Ours against the targets\n\n{summary}\n{sections}");

    if !no_doc {
        let doc_path = abs(repo, doc);
        let asset_dir = doc_path.with_extension("");
        std::fs::create_dir_all(&asset_dir)?;
        let plots = draw_plots(&asset_dir, &profile, scenarios, results);
        std::fs::write(
            asset_dir.join(format!("{profile}-results.json")),
            serde_json::to_vec(results)?,
        )?;
        let rel = asset_dir
            .file_name()
            .map(|d| d.to_string_lossy().to_string())
            .unwrap_or_default();
        let mut body = header;
        body.push_str(&report::worker_threads_line(results).unwrap_or_default());
        body.push_str(&format!(
            "\n#### Ours against the targets ({profile})\n\n{summary}\n"
        ));
        body.push_str(&sections.replace("### ", "#### "));
        for (file, caption) in plots {
            body.push_str(&format!("\n![{caption}]({rel}/{file})\n\n*{caption}*\n"));
        }
        body.push_str(&format!(
            "\nRaw per-round data: [`{rel}/{profile}-results.json`]({rel}/{profile}-results.json).\n"
        ));
        let text = std::fs::read_to_string(&doc_path).unwrap_or_else(|_| "# Benchmarks\n".into());
        std::fs::write(
            &doc_path,
            report::replace_section(&text, &format!("bench {profile}"), &body),
        )?;
        eprintln!(
            "bench: wrote {} ({} scenarios)",
            doc_path.display(),
            scenarios.len()
        );
    }
    Ok(())
}

/// The scale profile's report: a table and a plot per figure (`scale::report`), then the
/// sidecar metrics of the largest size.
fn write_scale_report(
    repo: &Path,
    doc: &Path,
    scenarios: &[Scenario],
    results: &[RunResult],
    header: String,
    no_doc: bool,
) -> anyhow::Result<()> {
    let doc_path = abs(repo, doc);
    let asset_dir = doc_path.with_extension("");
    let rel = asset_dir
        .file_name()
        .map(|d| d.to_string_lossy().to_string())
        .unwrap_or_default();
    let plots = if no_doc {
        BTreeMap::new()
    } else {
        std::fs::create_dir_all(&asset_dir)?;
        scale::report::draw_plots(&asset_dir, results)
    };
    let (mut text, _) = scale::report::body(results, &plots, &rel);
    if let Some(largest) = scenarios.last()
        && let Some(metrics) = report::metrics_section(largest, results)
    {
        text.push_str(&metrics.replace("### ", "#### "));
        text.push('\n');
    }
    println!("\n{text}");
    if !no_doc {
        std::fs::write(
            asset_dir.join("scale-results.json"),
            serde_json::to_vec(results)?,
        )?;
        let mut body = header;
        body.push_str(&report::worker_threads_line(results).unwrap_or_default());
        body.push('\n');
        body.push_str(&text);
        body.push_str(&format!(
            "\nRaw per-run data: [`{rel}/scale-results.json`]({rel}/scale-results.json).\n"
        ));
        let old = std::fs::read_to_string(&doc_path).unwrap_or_else(|_| "# Benchmarks\n".into());
        std::fs::write(
            &doc_path,
            report::replace_section(&old, "bench scale", &body),
        )?;
        eprintln!(
            "bench: wrote {} ({} sizes)",
            doc_path.display(),
            scenarios.len()
        );
    }
    Ok(())
}

/// The scenarios of `profile` that have results, with the burst sizes that ran
/// (a run may have overridden them with `--claims`; for `scale`, the sizes, bursts and
/// idle times the results record).
fn scenarios_that_ran(profile: Profile, results: &[RunResult]) -> Vec<Scenario> {
    if profile == Profile::Scale {
        let mut out: Vec<Scenario> = Vec::new();
        for r in results {
            if let Some(e) = &r.scale
                && !out.iter().any(|s| s.name == r.scenario)
            {
                out.extend(plan::scale_plan(&[e.pairs], r.claims, e.idle_secs));
            }
        }
        out.sort_by_key(|s| match s.workload {
            Workload::Scale { pairs, .. } => pairs,
            _ => 0,
        });
        return out;
    }
    plan::plan(profile)
        .into_iter()
        .filter_map(|mut s| {
            let ran = results.iter().find(|r| r.scenario == s.name)?;
            if let Workload::Burst { claims } = &mut s.workload {
                *claims = ran.claims;
            }
            Some(s)
        })
        .collect()
}

/// Round r starts with a different contender, so no one always goes first.
fn rotation(round: u32) -> Vec<Who> {
    let mut order = Who::ALL.to_vec();
    let n = order.len();
    order.rotate_left(round as usize % n);
    order
}

fn abs(repo: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        repo.join(p)
    }
}

fn figures_of(sc: &Scenario, results: &[RunResult]) -> BTreeMap<Who, report::Figures> {
    let mut out = BTreeMap::new();
    for who in Who::ALL {
        let runs: Vec<&RunResult> = results
            .iter()
            .filter(|r| r.scenario == sc.name && r.who == Some(who))
            .collect();
        if !runs.is_empty() {
            out.insert(who, report::figures(&runs));
        }
    }
    out
}

fn series_color(who: Who) -> plotters::style::RGBColor {
    match who {
        Who::Upstream => plot::UPSTREAM,
        Who::Ours => plot::OURS,
        Who::OursPolicies => plot::OURS_POLICIES,
        Who::Floor => plot::FLOOR,
    }
}

/// Plots of the first round: PVs over time in the raised-limit burst, and
/// claim → PV latency over arrival time in the steady run. Returns (file, caption).
fn draw_plots(
    dir: &Path,
    profile: &str,
    scenarios: &[Scenario],
    results: &[RunResult],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let first = |name: &str, who: Who| {
        results
            .iter()
            .find(|r| r.scenario == name && r.who == Some(who) && r.round == 1)
    };
    if let Some(sc) = scenarios.iter().find(|s| s.name == "burst-raised-0ms") {
        let series: Vec<plot::Series> = Who::ALL
            .iter()
            .filter_map(|&w| {
                first(&sc.name, w).map(|r| plot::Series {
                    label: w.label().into(),
                    color: series_color(w),
                    points: r.timeline.iter().map(|t| (t.t, t.pvs as f64)).collect(),
                })
            })
            .collect();
        let file = format!("{profile}-burst-throughput.png");
        let caption = format!(
            "{}: burst of {} claims, qps {}, CSI latency {} ms — PVs created over time, round 1",
            sc.name,
            sc.volumes(),
            sc.limits.qps,
            sc.latency_ms
        );
        match plot::draw(
            &dir.join(&file),
            &caption,
            "seconds since the first claim",
            "PVs created",
            &series,
            plot::Style::Lines,
        ) {
            Ok(()) => out.push((file, caption)),
            Err(e) => eprintln!("bench: {e:#}"),
        }
    }
    if let Some(sc) = scenarios.iter().find(|s| s.name == "steady-raised-0ms")
        && let Workload::Steady { rate, .. } = sc.workload
    {
        let series: Vec<plot::Series> = Who::ALL
            .iter()
            .filter_map(|&w| {
                first(&sc.name, w).map(|r| plot::Series {
                    label: w.label().into(),
                    color: series_color(w),
                    points: r
                        .latency_pv
                        .iter()
                        .enumerate()
                        .map(|(i, l)| (i as f64 / rate, *l))
                        .collect(),
                })
            })
            .collect();
        let file = format!("{profile}-steady-latency.png");
        let caption = format!(
            "{}: {rate} claims/s, qps {} — claim → PV latency by arrival time, round 1",
            sc.name, sc.limits.qps
        );
        match plot::draw(
            &dir.join(&file),
            &caption,
            "claim arrival (s)",
            "claim → PV latency (s)",
            &series,
            plot::Style::Points,
        ) {
            Ok(()) => out.push((file, caption)),
            Err(e) => eprintln!("bench: {e:#}"),
        }
    }
    if !plot::fonts_available() {
        eprintln!("bench: no TrueType font found; plots were drawn without text");
    }
    out
}

/// What the numbers were measured on.
struct Machine {
    cpu: String,
    cores: usize,
    mem_gib: f64,
    kernel: String,
    load_before: String,
    rustc: String,
    commit: String,
    go_mod: String,
}

impl Machine {
    fn read(repo: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let cmd = |c: &str, a: &[&str]| {
            std::process::Command::new(c)
                .args(a)
                .current_dir(repo)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        let dirty = !cmd("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
        Machine {
            cpu: cpuinfo
                .lines()
                .find_map(|l| {
                    l.strip_prefix("model name")
                        .and_then(|r| r.split_once(':'))
                        .map(|(_, v)| v.trim().to_string())
                })
                .unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            mem_gib: procfs::status_kib(&meminfo, "MemTotal").unwrap_or(0) as f64 / 1024.0 / 1024.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            load_before: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_string(),
            rustc: cmd("rustc", &["--version"]),
            commit: format!(
                "{}{}",
                cmd("git", &["rev-parse", "--short", "HEAD"]),
                if dirty {
                    " (with uncommitted changes)"
                } else {
                    ""
                }
            ),
            // The control plane's module, then the upstream sidecar's (testbed/upstream).
            go_mod: ["testbed/go.mod", "testbed/upstream/go.mod"]
                .iter()
                .filter_map(|f| std::fs::read_to_string(repo.join(f)).ok())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    fn version(&self, module: &str) -> String {
        self.go_mod
            .lines()
            .map(str::trim)
            .find_map(|l| {
                l.strip_prefix(module)
                    .and_then(|r| r.strip_prefix(' '))
                    .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            })
            .unwrap_or_else(|| "?".into())
    }

    /// The header of a report merged by `bench report` from separate runs.
    fn describe_merged(&self, profile: &str, files: &[String]) -> String {
        format!(
            "### Profile `{profile}`: merged from separate runs\n\n\
             - Command: `{}`, merging `{}` (each written by a `bench run --profile {profile} --only ...`; \
               see the text above this section for how and when each ran).\n\
             - Machine: {} × {}, {:.1} GiB, Linux {}.\n\
             - Versions: ours as built for those runs (the text above names the commit); upstream \
               external-provisioner {}; kube-apiserver and kube-controller-manager {}; etcd {}.\n",
            std::env::args().collect::<Vec<_>>().join(" "),
            files.join("`, `"),
            self.cores,
            self.cpu,
            self.mem_gib,
            self.kernel,
            self.version("github.com/kubernetes-csi/external-provisioner/v6"),
            self.version("k8s.io/kubernetes"),
            self.version("go.etcd.io/etcd/server/v3"),
        )
    }

    fn describe(&self, profile: &str, elapsed: f64, load_after: &str) -> String {
        let date = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let target = match profile {
            "quick" => "make bench-quick",
            "scale" => "make bench-scale",
            _ => "make bench",
        };
        format!(
            "### Profile `{profile}`: last run {date}\n\n\
             - Command: `{target}` (`{}`), {:.1} min wall clock.\n\
             - Machine: {} × {}, {:.1} GiB, Linux {}. Load average before: `{}`; after: `{}` \
               (other engineers' tests share this machine).\n\
             - Versions: ours at commit {} built with {} (`cargo build --release`); upstream external-provisioner {}; \
               kube-apiserver and kube-controller-manager {}; etcd {}.\n",
            std::env::args().collect::<Vec<_>>().join(" "),
            elapsed / 60.0,
            self.cores,
            self.cpu,
            self.mem_gib,
            self.kernel,
            self.load_before,
            load_after.trim(),
            self.commit,
            self.rustc,
            self.version("github.com/kubernetes-csi/external-provisioner/v6"),
            self.version("k8s.io/kubernetes"),
            self.version("go.etcd.io/etcd/server/v3"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_report_shows_the_scenarios_and_sizes_that_ran() {
        let ran = |scenario: &str, claims: usize| RunResult {
            scenario: scenario.into(),
            claims,
            ..Default::default()
        };
        let results = vec![ran("idle", 1), ran("burst-default-0ms", 500)];
        let scenarios = scenarios_that_ran(Profile::Full, &results);
        let names: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["burst-default-0ms", "idle"],
            "plan order, only what ran"
        );
        assert_eq!(scenarios[0].workload, Workload::Burst { claims: 500 });
        assert!(scenarios[0].title().starts_with("Burst of 500 claims"));
    }

    #[test]
    fn every_contender_goes_first_once_in_four_rounds() {
        let firsts: Vec<Who> = (0..4).map(|r| rotation(r)[0]).collect();
        assert_eq!(
            firsts,
            vec![Who::Upstream, Who::Ours, Who::OursPolicies, Who::Floor]
        );
    }
}
