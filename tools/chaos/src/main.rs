//! chaos: run a random chaos run or a named scenario against the test bed and print the
//! invariant table. Exit status: 0 without violations, 1 with violations, 2 on error.

use std::process::ExitCode;

use chaos::{ChaosConfig, FaultMix, Scenario, Sidecar, Testbed, parse_duration};
use clap::Parser;

/// Chaos runs of a CSI provisioner sidecar against the local test bed.
#[derive(Parser, Debug)]
struct Args {
    /// Which sidecar: ours, upstream, or both (one after the other, same seed).
    #[arg(long, default_value = "ours")]
    sidecar: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Claims to create.
    #[arg(long, default_value_t = 200)]
    claims: usize,
    /// Longest time spent creating claims (Go syntax: 90s, 5m, 1m30s).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    duration: std::time::Duration,
    /// Claims created per second.
    #[arg(long, default_value_t = 3.0)]
    rate: f64,
    /// Share of the claims restored from a VolumeSnapshot of an earlier Bound claim (0–1).
    #[arg(long, default_value_t = chaos::run::DEFAULT_RESTORES, value_parser = share)]
    restores: f64,
    /// Share of the claims cloned from an earlier Bound claim (0–1).
    #[arg(long, default_value_t = chaos::run::DEFAULT_CLONES, value_parser = share)]
    clones: f64,
    /// Sidecar replicas contending for the Lease.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// A node deployment of this many nodes instead (each with its own test driver and a
    /// sidecar with --node-deployment and NODE_NAME, no Lease; WaitForFirstConsumer claims
    /// selected for a random node, Immediate ones raced for; no restores or clones).
    /// 0: the central deployment of --replicas.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Fault families: any of api,watch,driver,kill,pause,policy; or all, none. `kill`:
    /// SIGKILL a replica, restart it. `pause`: SIGSTOP the replica holding the Lease until
    /// another holds it (at most lease + 6s), then SIGCONT (only with 2+ replicas). `policy`
    /// (with --policies): delete the binding of one or both intent policies, create it again
    /// 2-8s later.
    #[arg(long, default_value = "all", value_parser = FaultMix::parse)]
    faults: FaultMix,
    /// Also restart kube-apiserver and etcd mid-run (`testbed/cluster.sh restart
    /// $CSI_TESTBED_DIR`; once, twice from a 6-minute load phase on). Only for a control
    /// plane this run owns: `make chaos` passes it when it starts its own. Never implied by
    /// `--faults all`.
    #[arg(long)]
    restart_control_plane: bool,
    /// Upper bound of injected driver latency (above the sidecar's 10s --timeout the test
    /// driver runs requests after their caller gave up; see docs/reliability.md).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    driver_latency_max: std::time::Duration,
    /// Longest time to settle once the faults stop.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    settle: std::time::Duration,
    /// Skip deleting every claim at the end (and checking that nothing is left).
    #[arg(long)]
    no_teardown_check: bool,
    /// Keep the work directory (sidecar, driver logs, ledger) and print its path.
    #[arg(long)]
    keep_logs: bool,
    /// Run a named scenario instead of a random run: issue-486, issue-1469,
    /// issue-1469-pv-gone, restart-during-cleanup.
    #[arg(long)]
    scenario: Option<String>,
    /// Policy mode: install the shipped intent policies (deploy/kubernetes/provisioning-
    /// intent-policy.yaml and release-intent-policy.yaml) for the run's driver, bound to the
    /// run's namespace, removed at the end; our sidecar runs with --admission-intent.
    /// Upstream's sidecar (--sidecar upstream or both) runs without them. Not with --nodes.
    #[arg(long)]
    policies: bool,
    /// The crash sweep instead of a random run: for every API write and CSI call of these
    /// flows (all, or some of provision,restore,clone,delete,cleanup), the sidecar killed
    /// before the request leaves and after the server acted, with and without the claim (the
    /// PV) deleted while it is down; a stage of its own per case. See docs/reliability.md.
    #[arg(long)]
    sweep: Option<String>,
    /// With --sweep: crash at the event writes too.
    #[arg(long)]
    sweep_events: bool,
    /// With --scenario: an environment variable for the sidecar, KEY=VALUE (repeatable);
    /// e.g. KUBE_FEATURE_WatchListClient=false makes upstream's client-go list from the
    /// API server's cache (resourceVersion=0), as older releases did.
    #[arg(long, value_parser = key_value)]
    sidecar_env: Vec<(String, String)>,
    /// With --sweep: only the cases of one cell, `STEP,before|after,deleted|kept` (STEP as the
    /// table writes it, e.g. `CreateVolume #1` or `patch persistentvolumeclaims #2`): to
    /// replay one.
    #[arg(long, value_parser = sweep_cell)]
    sweep_only: Option<(String, chaos::sweep::Point, bool)>,
    /// With --sweep: cases run at once (each on a stage of its own).
    #[arg(long, default_value_t = 2)]
    sweep_jobs: usize,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn sweep_cell(s: &str) -> Result<(String, chaos::sweep::Point, bool), String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let point = match parts.get(1) {
        Some(&"before") => chaos::sweep::Point::Before,
        Some(&"after") => chaos::sweep::Point::After,
        _ => return Err(format!("{s:?}: the crash point is before or after")),
    };
    let deleted = match parts.get(2) {
        Some(&"deleted") => true,
        Some(&"kept") => false,
        _ => return Err(format!("{s:?}: the third part is deleted or kept")),
    };
    Ok((parts[0].to_string(), point, deleted))
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(run(args));
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<usize, String> {
    let testbed = Testbed::from_env()?;
    let sidecars: Vec<Sidecar> = match args.sidecar.as_str() {
        "both" => vec![Sidecar::Ours, Sidecar::Upstream],
        s => vec![s.parse()?],
    };
    let scenario: Option<Scenario> = args.scenario.as_deref().map(str::parse).transpose()?;
    if args.policies && args.nodes > 0 && scenario.is_none() {
        return Err(
            "--policies cannot be used with --nodes (the sidecar refuses --admission-intent \
             with --node-deployment)"
                .into(),
        );
    }
    if args.restores + args.clones > 1.0 {
        return Err("--restores plus --clones must not exceed 1".into());
    }
    if args.restart_control_plane && scenario.is_none() && testbed.dir.is_none() {
        return Err(
            "--restart-control-plane needs CSI_TESTBED_DIR (the control plane's \
                    directory, from `testbed/cluster.sh up`)"
                .into(),
        );
    }
    let mut violations = 0;
    if let Some(flows) = &args.sweep {
        let flows = chaos::sweep::Flow::parse_list(flows)?;
        for sidecar in sidecars {
            let opts = chaos::sweep::SweepOptions {
                sidecar,
                flows: flows.clone(),
                policies: args.policies && sidecar == Sidecar::Ours,
                events: args.sweep_events,
                seed: args.seed,
                keep_dir: args.keep_logs,
                jobs: args.sweep_jobs,
                only: args.sweep_only.clone(),
            };
            let report = chaos::sweep::sweep(&testbed, &opts).await?;
            println!("{}", report.render());
            // A flow whose trace failed was not swept: that fails the run too.
            violations += report.violations() + report.trace_errors.len();
        }
        return Ok(violations);
    }
    for sidecar in sidecars {
        let report = match scenario {
            Some(s) => {
                chaos::scenarios::run_with_env(
                    &testbed,
                    s,
                    sidecar,
                    args.seed,
                    args.keep_logs,
                    args.policies,
                    args.sidecar_env.clone(),
                )
                .await?
            }
            None => {
                let cfg = ChaosConfig {
                    sidecar,
                    seed: args.seed,
                    claims: args.claims,
                    duration: args.duration,
                    rate: args.rate,
                    replicas: args.replicas,
                    nodes: args.nodes,
                    faults: FaultMix {
                        driver_latency_max: args.driver_latency_max,
                        restart_control_plane: args.restart_control_plane,
                        ..args.faults.clone()
                    },
                    settle: args.settle,
                    teardown_check: !args.no_teardown_check,
                    keep_dir: args.keep_logs,
                    restores: args.restores,
                    clones: args.clones,
                    policies: args.policies,
                };
                chaos::run(&testbed, &cfg).await?
            }
        };
        println!("{}", report.render());
        violations += report.violations();
    }
    Ok(violations)
}
