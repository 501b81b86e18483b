//! The fault injector: at random (seeded) moments it opens a window of API faults through
//! the proxy, disturbs watch streams, arms a driver fault, crashes the driver, SIGKILLs
//! a sidecar replica or the csi-snapshotter, fails the driver's snapshot calls, or freezes
//! the Lease holder (SIGSTOP) until another replica holds the Lease, or (policy mode) removes
//! the intent policies' bindings for a while; kills the sidecar at a step (a write or a CSI
//! call held before it leaves or after the server acted, the caller SIGKILLed meanwhile);
//! sends the sidecars to a second kube-apiserver cut off from etcd for a while (time
//! travel); and, when the run owns its control plane, it restarts kube-apiserver and etcd
//! once or twice. Every action is counted by kind for the report.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault as DriverFault;
use kube_fault_proxy::{Fault, Rule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::policies::{Policies, Which};
use crate::world::{LEASE_DURATION, Testbed, World, lease_holder};

/// Well below the sidecars' 10 s `--timeout`: slow, but answered within the caller's
/// deadline even on a loaded machine.
pub const DEFAULT_DRIVER_LATENCY_MAX: Duration = Duration::from_millis(4000);

/// Which families of faults a run injects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultMix {
    pub api: bool,
    pub watch: bool,
    pub driver: bool,
    pub kill: bool,
    /// SIGSTOP the replica holding the Lease until another replica holds it (at most the
    /// lease duration + [`PAUSE_MARGIN`]), then SIGCONT. Needs two replicas or more.
    pub pause: bool,
    /// Policy mode only: delete the binding of one or both intent policies, create it again
    /// 2–8 s later.
    pub policy: bool,
    /// Hold one write or CSI call before it leaves or after the server acted, SIGKILL its
    /// caller meanwhile, then drop it (the crash sweep's fault, at random).
    pub step: bool,
    /// Send the sidecars' requests to a second kube-apiserver whose link to etcd is frozen
    /// (its watch cache stale, its consistent reads and writes waiting) for a few seconds,
    /// then back; held requests complete late. Needs the test bed's directory.
    pub travel: bool,
    /// Restart kube-apiserver and etcd (`testbed/cluster.sh restart`) once in the load phase
    /// (twice from 6 minutes on). Only for a control plane the run owns (`make chaos` starts
    /// one): everyone else using it sees the outage too. [`FaultMix::all`] leaves it off;
    /// `chaos --restart-control-plane` turns it on.
    pub restart_control_plane: bool,
    /// Upper bound of injected driver latency. Above the sidecar's `--timeout` (10 s), a slow
    /// call is still *started* by the test driver after the caller gave up, and may then
    /// create a volume after a later call for the same name was answered and the volume
    /// deleted: a backend running stale requests out of order (see docs/reliability.md).
    pub driver_latency_max: Duration,
}

impl FaultMix {
    pub fn all() -> FaultMix {
        FaultMix {
            api: true,
            watch: true,
            driver: true,
            kill: true,
            pause: true,
            policy: true,
            step: true,
            travel: true,
            restart_control_plane: false,
            driver_latency_max: DEFAULT_DRIVER_LATENCY_MAX,
        }
    }

    pub fn none() -> FaultMix {
        FaultMix {
            api: false,
            watch: false,
            driver: false,
            kill: false,
            pause: false,
            policy: false,
            step: false,
            travel: false,
            restart_control_plane: false,
            driver_latency_max: DEFAULT_DRIVER_LATENCY_MAX,
        }
    }

    /// `api,watch,driver,kill,pause,policy,step,travel` (any subset), `all` or `none`. The control-plane
    /// restart is not a family here: it is never implied by `all`.
    pub fn parse(s: &str) -> Result<FaultMix, String> {
        let mut mix = FaultMix::none();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => mix = FaultMix::all(),
                "none" => mix = FaultMix::none(),
                "api" => mix.api = true,
                "watch" => mix.watch = true,
                "driver" => mix.driver = true,
                "kill" => mix.kill = true,
                "pause" => mix.pause = true,
                "policy" => mix.policy = true,
                "step" => mix.step = true,
                "travel" => mix.travel = true,
                other => return Err(format!("unknown fault family {other:?}")),
            }
        }
        Ok(mix)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    ApiError,
    ApiLostResponse,
    ApiSlow,
    WatchDelay,
    WatchDuplicate,
    WatchDrop,
    WatchHidePv,
    WatchCut,
    DriverCreateThenTimeout,
    DriverUnavailable,
    DriverLatency,
    DriverCrash,
    DriverSnapshotError,
    SidecarKill,
    SnapshotterKill,
    LeaderPause,
    /// A node deployment only: one node's driver has no room (`RESOURCE_EXHAUSTED` on
    /// `CreateVolume`), so that node gives its claims back to be raced for (or
    /// rescheduled) again.
    DriverNoRoom,
    /// Policy mode only: the binding of one or both intent policies deleted, created again
    /// later.
    PolicyRemoved,
    /// A write or CSI call held, its caller SIGKILLed, the request dropped.
    CrashAtStep,
    /// The sidecars sent to the second kube-apiserver while it is cut off from etcd.
    TimeTravel,
}

impl Action {
    fn label(self) -> &'static str {
        match self {
            Action::ApiError => "api: error status window (409/429/500/503)",
            Action::ApiLostResponse => "api: lost-response window (write done, error seen)",
            Action::ApiSlow => "api: slow-response window",
            Action::WatchDelay => "watch: delayed events window",
            Action::WatchDuplicate => "watch: duplicated events window",
            Action::WatchDrop => "watch: dropped events window (then relist)",
            Action::WatchHidePv => "watch: new PVs hidden window",
            Action::WatchCut => "watch: streams cut",
            Action::DriverCreateThenTimeout => "driver: CreateVolume done, DEADLINE_EXCEEDED",
            Action::DriverUnavailable => "driver: UNAVAILABLE errors",
            Action::DriverLatency => "driver: slow calls window",
            Action::DriverCrash => "driver: crash + restart",
            Action::DriverSnapshotError => "driver: UNAVAILABLE on Create/DeleteSnapshot",
            Action::DriverNoRoom => "driver: one node RESOURCE_EXHAUSTED on CreateVolume",
            Action::SidecarKill => "sidecar: SIGKILL + restart",
            Action::SnapshotterKill => "csi-snapshotter: SIGKILL + restart",
            // Logged when it starts; counted by its outcome (PAUSED, ...).
            Action::LeaderPause => "sidecar: SIGSTOP of the Lease holder",
            // Counted by which bindings went (POLICY_REMOVED_*).
            Action::PolicyRemoved => "policy: bindings removed",
            // Counted by where it struck (STEP_*), when it did.
            Action::CrashAtStep => "sidecar: SIGKILL at a held step",
            Action::TimeTravel => TRAVELLED,
        }
    }

    fn weight(self) -> u32 {
        match self {
            Action::ApiError => 3,
            Action::ApiLostResponse => 2,
            Action::ApiSlow => 2,
            Action::WatchDelay => 2,
            Action::WatchDuplicate => 1,
            Action::WatchDrop => 1,
            Action::WatchHidePv => 2,
            Action::WatchCut => 1,
            Action::DriverCreateThenTimeout => 3,
            Action::DriverUnavailable => 2,
            Action::DriverLatency => 2,
            Action::DriverCrash => 1,
            Action::DriverSnapshotError => 1,
            Action::DriverNoRoom => 3,
            Action::SidecarKill => 2,
            Action::SnapshotterKill => 1,
            Action::LeaderPause => 2,
            Action::PolicyRemoved => 2,
            Action::CrashAtStep => 3,
            Action::TimeTravel => 2,
        }
    }

    fn family_enabled(self, mix: &FaultMix) -> bool {
        match self {
            Action::ApiError | Action::ApiLostResponse | Action::ApiSlow => mix.api,
            Action::WatchDelay
            | Action::WatchDuplicate
            | Action::WatchDrop
            | Action::WatchHidePv
            | Action::WatchCut => mix.watch,
            Action::DriverCreateThenTimeout
            | Action::DriverUnavailable
            | Action::DriverLatency
            | Action::DriverCrash
            | Action::DriverSnapshotError
            | Action::DriverNoRoom => mix.driver,
            Action::SidecarKill | Action::SnapshotterKill => mix.kill,
            Action::LeaderPause => mix.pause,
            Action::PolicyRemoved => mix.policy,
            Action::CrashAtStep => mix.step,
            Action::TimeTravel => mix.travel,
        }
    }
}

// A new action goes last: a run without it draws the same schedule as before.
const ALL_ACTIONS: [Action; 20] = [
    Action::ApiError,
    Action::ApiLostResponse,
    Action::ApiSlow,
    Action::WatchDelay,
    Action::WatchDuplicate,
    Action::WatchDrop,
    Action::WatchHidePv,
    Action::WatchCut,
    Action::DriverCreateThenTimeout,
    Action::DriverUnavailable,
    Action::DriverLatency,
    Action::DriverCrash,
    Action::DriverSnapshotError,
    Action::SidecarKill,
    Action::SnapshotterKill,
    Action::LeaderPause,
    Action::DriverNoRoom,
    Action::PolicyRemoved,
    Action::CrashAtStep,
    Action::TimeTravel,
];

/// Report labels of the leader pause and the control-plane restart (counted when their
/// outcome is known, not when they start).
pub const PAUSED: &str = "sidecar: leader paused past its lease";
pub const PAUSED_NO_TAKEOVER: &str = "sidecar: leader paused, Lease not taken over";
pub const PAUSED_KILLED: &str = "sidecar: paused leader SIGKILLed while frozen";
pub const PAUSED_EXITED: &str = "sidecar: paused leader exited after SIGCONT";
pub const RESTARTED: &str = "control plane: kube-apiserver + etcd restarted";
pub const RESTART_FAILED: &str = "control plane: restart FAILED";
/// Report labels of the policy removal, by what was removed.
pub const POLICY_REMOVED_BOTH: &str = "policy: both bindings removed for a while";
pub const POLICY_REMOVED_PROVISIONING: &str = "policy: provisioning binding removed for a while";
pub const POLICY_REMOVED_RELEASE: &str = "policy: release binding removed for a while";
/// Report labels of the crash at a step, by where the request was held.
pub const STEP_BEFORE: &str = "sidecar: SIGKILL with a request held before it left";
pub const STEP_AFTER: &str = "sidecar: SIGKILL with a request done, its answer held";
/// Report label of the time travel.
pub const TRAVELLED: &str = "api: sidecars sent to a server cut off from etcd";

/// How long past the lease duration a frozen leader may wait for another replica to take
/// the Lease (the others poll every second and must see it unchanged for a whole term).
pub const PAUSE_MARGIN: Duration = Duration::from_secs(6);

/// Longest time `cluster.sh restart` may take (stop, etcd, kube-apiserver `/readyz`).
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// When, after the injector starts, to restart the control plane: once in a load phase
/// shorter than 6 minutes (between 20 % and 60 % of it), twice otherwise (15–40 %, 55–75 %),
/// so that the load goes on after it. Drawn from its own RNG: turning the restart on does
/// not change the rest of the schedule.
pub fn plan_restarts(seed: u64, load: Duration) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0a7_0e57);
    let spans: &[(f64, f64)] = if load >= Duration::from_secs(360) {
        &[(0.15, 0.4), (0.55, 0.75)]
    } else {
        &[(0.2, 0.6)]
    };
    spans
        .iter()
        .map(|&(from, to)| load.mul_f64(rng.random_range(from..to)))
        .collect()
}

/// The (verb, resource) pairs API faults aim at: everything a provisioner does.
const TARGETS: [(&str, &str); 12] = [
    ("create", "persistentvolumes"),
    ("get", "persistentvolumes"),
    ("delete", "persistentvolumes"),
    ("patch", "persistentvolumes"),
    ("update", "persistentvolumes"),
    ("get", "persistentvolumeclaims"),
    ("patch", "persistentvolumeclaims"),
    ("update", "persistentvolumeclaims"),
    ("get", "leases"),
    ("update", "leases"),
    ("create", "events"),
    ("list", "persistentvolumeclaims"),
];

/// Counts of injector actions, by label.
pub type Counts = Arc<Mutex<BTreeMap<&'static str, u64>>>;

/// What the injector did.
#[derive(Debug, Default)]
pub struct Injected {
    /// Actions by label.
    pub counts: BTreeMap<&'static str, u64>,
    /// Time spent in control-plane restarts (from the stop to `/readyz`).
    pub control_plane_restarting: Duration,
}

fn count(counts: &Counts, label: &'static str) {
    *counts.lock().expect("poisoned").entry(label).or_default() += 1;
}

/// Runs the injector until `stop` is cancelled. `load` is the expected length of the load
/// phase (when to restart the control plane). Returns what it did.
pub async fn inject(
    world: Arc<tokio::sync::Mutex<World>>,
    mix: FaultMix,
    seed: u64,
    load: Duration,
    stop: CancellationToken,
) -> Injected {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let latency_max = (mix.driver_latency_max.as_millis() as u64).max(501);
    let counts: Counts = Arc::default();
    let (replicas, node_deployment, policies, second) = {
        let w = world.lock().await;
        (
            w.replicas.len(),
            w.node_key.is_some(),
            w.policies.clone(),
            w.second.is_some(),
        )
    };
    let actions: Vec<Action> = ALL_ACTIONS
        .iter()
        .copied()
        .filter(|a| a.family_enabled(&mix))
        // Pausing the only replica would test nothing but a slow restart; in a node
        // deployment there is no Lease to lose.
        .filter(|a| *a != Action::LeaderPause || (replicas >= 2 && !node_deployment))
        // Without topology a full driver is only a final error, retried in place.
        .filter(|a| *a != Action::DriverNoRoom || node_deployment)
        // Policies can be removed only where they were installed; a second API server is
        // there only on a test bed whose directory is known.
        .filter(|a| *a != Action::PolicyRemoved || policies.is_some())
        .filter(|a| *a != Action::TimeTravel || second)
        // A node deployment makes no restores or clones: no snapshot faults either.
        .filter(|a| {
            !node_deployment || !matches!(a, Action::DriverSnapshotError | Action::SnapshotterKill)
        })
        .collect();
    let total_weight: u32 = actions.iter().map(|a| a.weight()).sum();
    let mut restarts = if mix.restart_control_plane {
        plan_restarts(seed, load)
    } else {
        Vec::new()
    }
    .into_iter()
    .peekable();
    if actions.is_empty() && restarts.peek().is_none() {
        stop.cancelled().await;
        return Injected::default();
    }
    let started = Instant::now();
    let restarting = Arc::new(Mutex::new(Duration::ZERO));
    // One frozen leader at a time, one trip to the past at a time.
    let pausing = Arc::new(AtomicBool::new(false));
    let travelling = Arc::new(AtomicBool::new(false));
    // Windows close by themselves; their tasks are awaited before returning so that no
    // fault outlives the injection phase.
    let mut windows = tokio::task::JoinSet::new();
    loop {
        let pause = Duration::from_millis(rng.random_range(400..1600));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => break,
        }
        if restarts.next_if(|at| started.elapsed() >= *at).is_some() {
            log_line(&world, "control plane: restarting kube-apiserver and etcd").await;
            let (w, counts, restarting) = (world.clone(), counts.clone(), restarting.clone());
            windows.spawn(async move {
                let outcome = restart_control_plane(&w).await;
                let line = match &outcome {
                    Ok(took) => {
                        *restarting.lock().expect("poisoned") += *took;
                        count(&counts, RESTARTED);
                        format!("{RESTARTED} in {} ms", took.as_millis())
                    }
                    Err(e) => {
                        eprintln!("chaos: restarting the control plane: {e}");
                        count(&counts, RESTART_FAILED);
                        format!("{RESTART_FAILED}: {e}")
                    }
                };
                log_line(&w, &line).await;
            });
            continue;
        }
        if actions.is_empty() {
            continue;
        }
        let mut pick = rng.random_range(0..total_weight);
        let action = *actions
            .iter()
            .find(|a| {
                if pick < a.weight() {
                    true
                } else {
                    pick -= a.weight();
                    false
                }
            })
            .expect("weights cover the range");
        let window = Duration::from_millis(rng.random_range(1000..5000));
        let done = if action == Action::LeaderPause {
            pause_leader(&world, &counts, &pausing, &stop, &mut windows).await
        } else if let (Action::PolicyRemoved, Some(p)) = (action, &policies) {
            remove_policies(&world, p, &counts, &mut rng, &stop, &mut windows).await
        } else if action == Action::CrashAtStep {
            crash_at_step(&world, &counts, window, &mut rng, &mut windows).await
        } else if action == Action::TimeTravel {
            travel(&world, &counts, &travelling, &mut rng, &mut windows).await
        } else {
            let done = apply(&world, action, window, latency_max, &mut rng, &mut windows).await;
            if done {
                count(&counts, action.label());
            }
            done
        };
        log_action(&world, action, window, done).await;
    }
    while windows.join_next().await.is_some() {}
    let counts = counts.lock().expect("poisoned").clone();
    let control_plane_restarting = *restarting.lock().expect("poisoned");
    Injected {
        counts,
        control_plane_restarting,
    }
}

/// Freezes the replica that holds the Lease (SIGSTOP) and starts the task that thaws it
/// (SIGCONT) once another replica holds the Lease, or after the lease duration +
/// [`PAUSE_MARGIN`]. The thawed process must not act on its stale term: our sidecar's
/// leader gate is closed by its own clock, and its next renewal finds the Lease taken and
/// exits. False (nothing done) when a pause is under way, or no running replica holds the
/// Lease (none elected yet, or the holder was just killed). The task counts the outcome.
async fn pause_leader(
    world: &Arc<tokio::sync::Mutex<World>>,
    counts: &Counts,
    pausing: &Arc<AtomicBool>,
    stop: &CancellationToken,
    windows: &mut tokio::task::JoinSet<()>,
) -> bool {
    if pausing.load(Ordering::SeqCst) {
        return false;
    }
    let (leases, name) = world.lock().await.lease();
    let Some(holder) = lease_holder(&leases, &name).await else {
        return false;
    };
    let (index, pid) = {
        let w = world.lock().await;
        let holders: Vec<usize> = (0..w.replicas.len())
            .filter(|&i| w.replicas[i].is_holder(&holder))
            .collect();
        let [index] = holders[..] else {
            return false;
        };
        let Some(pid) = w.replicas[index].pid() else {
            return false;
        };
        w.replicas[index].pause(pid);
        (index, pid)
    };
    pausing.store(true, Ordering::SeqCst);
    let (world, counts, pausing, stop) =
        (world.clone(), counts.clone(), pausing.clone(), stop.clone());
    windows.spawn(async move {
        let frozen = Instant::now();
        let deadline = frozen + LEASE_DURATION + PAUSE_MARGIN;
        let mut successor = None;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Some(h) = lease_holder(&leases, &name).await
                && h != holder
            {
                successor = Some(h);
                break;
            }
        }
        let (same, log) = {
            let w = world.lock().await;
            let same = w.replicas[index].pid() == Some(pid);
            w.replicas[index].cont();
            (same, w.dir.join(format!("sidecar-{index}.log")))
        };
        let frozen_for = frozen.elapsed().as_millis();
        let label = match (same, &successor) {
            (false, _) => PAUSED_KILLED,
            (true, Some(_)) => PAUSED,
            (true, None) => PAUSED_NO_TAKEOVER,
        };
        count(&counts, label);
        log_line(
            &world,
            &format!(
                "{label}: replica {index} (pid {pid}, {holder}) frozen {frozen_for} ms, Lease now \
                 held by {successor:?}; log {}",
                log.display()
            ),
        )
        .await;
        // A thawed leader that lost the Lease finds out at its next renewal and exits (ours,
        // and upstream's client-go). Watch for it for a renew deadline and some.
        if label == PAUSED {
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if world.lock().await.replicas[index].pid() != Some(pid) {
                    count(&counts, PAUSED_EXITED);
                    log_line(&world, &format!("{PAUSED_EXITED}: replica {index}")).await;
                    break;
                }
            }
        }
        pausing.store(false, Ordering::SeqCst);
    });
    true
}

/// Deletes the binding of both intent policies (half the time), or of one, and starts the
/// task that creates it again 2–8 s later (or when the injection stops). Claims handed over
/// meanwhile get no intent from admission (the sidecar writes it, fenced); claims bound
/// meanwhile keep it until the sidecar releases it. False (nothing done) when one of them is
/// still removed by an earlier window.
async fn remove_policies(
    world: &Arc<tokio::sync::Mutex<World>>,
    policies: &Arc<Policies>,
    counts: &Counts,
    rng: &mut StdRng,
    stop: &CancellationToken,
    windows: &mut tokio::task::JoinSet<()>,
) -> bool {
    let (which, label): (&'static [Which], _) = match rng.random_range(0..4) {
        0 | 1 => (&Which::BOTH, POLICY_REMOVED_BOTH),
        2 => (&[Which::Provisioning], POLICY_REMOVED_PROVISIONING),
        _ => (&[Which::Release], POLICY_REMOVED_RELEASE),
    };
    let gone_for = Duration::from_millis(rng.random_range(2000..8000));
    match policies.remove(which).await {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            eprintln!("chaos: removing a policy binding: {e}");
            return false;
        }
    }
    count(counts, label);
    log_line(world, &format!("{label}: for {} ms", gone_for.as_millis())).await;
    let (world, policies, stop) = (world.clone(), policies.clone(), stop.clone());
    windows.spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(gone_for) => {}
            _ = stop.cancelled() => {}
        }
        let line = match policies.restore(Some(which)).await {
            Ok(()) => format!("policy: {which:?} binding(s) installed again"),
            Err(e) => format!("policy: installing {which:?} again FAILED: {e}"),
        };
        log_line(&world, &line).await;
    });
    true
}

/// `testbed/cluster.sh restart <dir>`: kube-apiserver and etcd stopped and started again
/// with the same arguments (etcd keeps its data). Returns how long it took.
async fn restart_control_plane(world: &Arc<tokio::sync::Mutex<World>>) -> Result<Duration, String> {
    let (dir, log) = {
        let w = world.lock().await;
        (
            w.testbed.dir.clone(),
            w.dir.join("control-plane-restart.log"),
        )
    };
    let dir = dir.ok_or("CSI_TESTBED_DIR is not set: the run does not know its control plane")?;
    let script = Testbed::cluster_script();
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = tokio::time::timeout(
        RESTART_TIMEOUT,
        tokio::process::Command::new("bash")
            .arg(&script)
            .arg("restart")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .status(),
    )
    .await
    .map_err(|_| format!("no answer within {RESTART_TIMEOUT:?}"))?
    .map_err(|e| format!("running {}: {e}", script.display()))?;
    if status.success() {
        Ok(started.elapsed())
    } else {
        Err(format!(
            "{} restart {} failed ({status}): {}",
            script.display(),
            dir.display(),
            tail(&log, 5)
        ))
    }
}

/// The last `n` lines of a file, joined with ` | `.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Applies one action; false if it could not be (e.g. the driver was down).
async fn apply(
    world: &Arc<tokio::sync::Mutex<World>>,
    action: Action,
    window: Duration,
    latency_max: u64,
    rng: &mut StdRng,
    windows: &mut tokio::task::JoinSet<()>,
) -> bool {
    let probability = rng.random_range(0.25..0.6);
    let (verb, resource) = TARGETS[rng.random_range(0..TARGETS.len())];
    let watched = ["persistentvolumes", "persistentvolumeclaims"][rng.random_range(0..2)];
    let rule = match action {
        Action::ApiError => {
            // A write refused as stale: what a precondition or a changed object gets.
            let writes = matches!(verb, "update" | "patch" | "delete");
            let codes: &[u16] = if writes {
                &[409, 429, 500, 503]
            } else {
                &[429, 500, 503]
            };
            Some(
                Rule::new(Fault::Status {
                    code: codes[rng.random_range(0..codes.len())],
                })
                .verbs(&[verb])
                .resources(&[resource])
                .probability(probability),
            )
        }
        Action::ApiLostResponse => {
            let (verb, resource) = [
                ("create", "persistentvolumes"),
                ("delete", "persistentvolumes"),
                ("patch", "persistentvolumes"),
                ("patch", "persistentvolumeclaims"),
                ("update", "persistentvolumeclaims"),
            ][rng.random_range(0..5)];
            let code = if verb == "create" && rng.random_bool(0.5) {
                409
            } else {
                [500, 504][rng.random_range(0..2)]
            };
            Some(
                Rule::new(Fault::LostResponse { code })
                    .verbs(&[verb])
                    .resources(&[resource])
                    .probability(probability),
            )
        }
        Action::ApiSlow => Some(
            Rule::new(Fault::Delay {
                ms: rng.random_range(300..3000),
            })
            .verbs(&[verb])
            .resources(&[resource])
            .probability(probability),
        ),
        Action::WatchDelay => Some(
            Rule::new(Fault::DelayEvents {
                ms: rng.random_range(300..2500),
            })
            .verbs(&["watch"])
            .resources(&[watched]),
        ),
        Action::WatchDuplicate => Some(
            Rule::new(Fault::DuplicateEvents)
                .verbs(&["watch"])
                .resources(&[watched])
                .probability(probability),
        ),
        Action::WatchDrop => Some(
            Rule::new(Fault::DropEvents {
                relist_after_ms: rng.random_range(300..2000),
            })
            .verbs(&["watch"])
            .resources(&[watched])
            .probability(0.1),
        ),
        Action::WatchHidePv => Some(
            Rule::new(Fault::HideNew {
                ms: rng.random_range(1500..5000),
            })
            .verbs(&["watch"])
            .resources(&["persistentvolumes"])
            .probability(probability),
        ),
        _ => None,
    };
    if let Some(rule) = rule {
        let id = world.lock().await.proxy.add_rule(rule);
        let w = world.clone();
        windows.spawn(async move {
            tokio::time::sleep(window).await;
            w.lock().await.proxy.remove_rule(id);
        });
        return true;
    }
    let method = if rng.random_bool(0.75) {
        "CreateVolume"
    } else {
        "DeleteVolume"
    };
    // Which node's driver a driver fault hits (drawn only when there is a choice, so a
    // central run's schedule stays what it was).
    let drivers = 1 + world.lock().await.other_drivers.len();
    let node = if drivers > 1
        && matches!(
            action,
            Action::DriverCreateThenTimeout
                | Action::DriverUnavailable
                | Action::DriverLatency
                | Action::DriverCrash
                | Action::DriverNoRoom
        ) {
        rng.random_range(0..drivers)
    } else {
        0
    };
    match action {
        Action::WatchCut => {
            let w = world.lock().await;
            match rng.random_range(0..3) {
                0 => w.proxy.cut_watches(&[]),
                _ => w.proxy.cut_watches(&[watched]),
            }
            true
        }
        Action::DriverCreateThenTimeout => {
            let count = rng.random_range(2..7);
            driver_fault(
                world,
                node,
                "CreateVolume",
                DriverFault::CreateThenDeadlineExceeded { count },
            )
            .await
        }
        Action::DriverUnavailable => {
            let count = rng.random_range(1..4);
            driver_fault(
                world,
                node,
                method,
                DriverFault::Error {
                    code: GrpcCode::Unavailable,
                    count,
                    message: None,
                },
            )
            .await
        }
        Action::DriverNoRoom => {
            let count = rng.random_range(1..4);
            driver_fault(
                world,
                node,
                "CreateVolume",
                DriverFault::Error {
                    code: GrpcCode::ResourceExhausted,
                    count,
                    message: Some("injected: no room on this node".into()),
                },
            )
            .await
        }
        Action::DriverLatency => {
            let ms = rng.random_range(500..latency_max);
            if !driver_fault(world, node, method, DriverFault::Latency { ms }).await {
                return false;
            }
            let w = world.clone();
            windows.spawn(async move {
                tokio::time::sleep(window).await;
                // Latency 0 replaces the latency fault without touching the others.
                driver_fault(&w, node, method, DriverFault::Latency { ms: 0 }).await;
            });
            true
        }
        Action::DriverCrash => {
            let down = Duration::from_millis(rng.random_range(200..2000));
            world
                .lock()
                .await
                .driver_at(node)
                .crash_and_restart(down)
                .await
                .is_ok()
        }
        Action::DriverSnapshotError => {
            let method = ["CreateSnapshot", "DeleteSnapshot"][rng.random_range(0..2)];
            let count = rng.random_range(1..4);
            driver_fault(
                world,
                0,
                method,
                DriverFault::Error {
                    code: GrpcCode::Unavailable,
                    count,
                    message: None,
                },
            )
            .await
        }
        Action::SidecarKill => {
            let w = world.lock().await;
            if w.replicas.is_empty() {
                return false;
            }
            let i = rng.random_range(0..w.replicas.len());
            w.replicas[i].kill(Duration::from_millis(rng.random_range(200..3000)));
            true
        }
        Action::SnapshotterKill => {
            let w = world.lock().await;
            w.snapshotter
                .kill(Duration::from_millis(rng.random_range(200..3000)));
            true
        }
        _ => false,
    }
}

/// Holds the next matching write (through the proxy) or CSI call (at the first node's
/// driver) before it leaves or after the server acted; once held, SIGKILLs its caller (the
/// Lease holder; in a node deployment the first node's sidecar, CSI calls only) and drops
/// the request. Not held within the window: the hold is disarmed. Counts where it struck.
async fn crash_at_step(
    world: &Arc<tokio::sync::Mutex<World>>,
    counts: &Counts,
    window: Duration,
    rng: &mut StdRng,
    windows: &mut tokio::task::JoinSet<()>,
) -> bool {
    const STEPS: [(&str, &str); 6] = [
        ("create", "persistentvolumes"),
        ("delete", "persistentvolumes"),
        ("patch", "persistentvolumes"),
        // Both sidecars edit claims with `update` (the verb upstream's RBAC grants).
        ("update", "persistentvolumeclaims"),
        ("csi", "CreateVolume"),
        ("csi", "DeleteVolume"),
    ];
    let node_deployment = world.lock().await.node_key.is_some();
    let (verb, what) = if node_deployment {
        STEPS[rng.random_range(4..6)]
    } else {
        STEPS[rng.random_range(0..6)]
    };
    let after = rng.random_bool(0.5);
    let restart_after = Duration::from_millis(rng.random_range(200..3000));
    let rule = if verb == "csi" {
        if !driver_fault(world, 0, what, DriverFault::Hold { nth: 1, after }).await {
            return false;
        }
        None
    } else {
        let rule = Rule::new(Fault::Hold { after })
            .verbs(&[verb])
            .resources(&[what])
            .count(1);
        Some(world.lock().await.proxy.add_rule(rule))
    };
    let (w, counts) = (world.clone(), counts.clone());
    windows.spawn(async move {
        let until = Instant::now() + window;
        let control = w.lock().await.driver_at(0).control().await.ok();
        let held = loop {
            let held = match (&rule, &control) {
                (Some(_), _) => !w.lock().await.proxy.held().is_empty(),
                (None, Some(c)) => c
                    .stats()
                    .await
                    .is_ok_and(|s| s.held.get(what).copied().unwrap_or(0) > 0),
                (None, None) => false,
            };
            if held || Instant::now() >= until {
                break held;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if held {
            let killed = kill_caller(&w, node_deployment, restart_after).await;
            // The process is gone before its request is: it never learns either way.
            tokio::time::sleep(Duration::from_millis(300)).await;
            if killed {
                count(&counts, if after { STEP_AFTER } else { STEP_BEFORE });
            }
            log_line(
                &w,
                &format!(
                    "sidecar: SIGKILL at {verb} {what} held {} (killed: {killed})",
                    if after { "after" } else { "before" }
                ),
            )
            .await;
        }
        match (rule, &control) {
            (Some(id), _) => {
                let w = w.lock().await;
                w.proxy.remove_rule(id);
                w.proxy.drop_held();
            }
            (None, Some(c)) => {
                if !held {
                    // Disarmed: an unspent hold would catch a call nobody releases.
                    let _ = c.set_fault(what, DriverFault::Hold { nth: 0, after }).await;
                }
                let _ = c.drop_held(Some(what)).await;
            }
            (None, None) => {}
        }
    });
    true
}

/// SIGKILLs (then restarts) the replica that holds the Lease, or in a node deployment the
/// first node's; false when there is none to kill.
async fn kill_caller(
    world: &Arc<tokio::sync::Mutex<World>>,
    node_deployment: bool,
    restart_after: Duration,
) -> bool {
    let holder = if node_deployment {
        None
    } else {
        let (leases, name) = world.lock().await.lease();
        lease_holder(&leases, &name).await
    };
    let w = world.lock().await;
    let index = match holder {
        None if node_deployment => Some(0),
        None => None,
        Some(h) => (0..w.replicas.len()).find(|&i| w.replicas[i].is_holder(&h)),
    };
    match index {
        Some(i) if i < w.replicas.len() => {
            w.replicas[i].kill(restart_after);
            true
        }
        _ => false,
    }
}

/// Freezes the second API server's link to etcd and sends every request there (open
/// watches cut: they resume there) for 2–6 s, then sends them back to the first server and
/// thaws the link: requests still waiting there then complete, late. Well under the ~40 s
/// after which etcd's client would give up on a frozen link.
async fn travel(
    world: &Arc<tokio::sync::Mutex<World>>,
    counts: &Counts,
    travelling: &Arc<AtomicBool>,
    rng: &mut StdRng,
    windows: &mut tokio::task::JoinSet<()>,
) -> bool {
    if travelling.swap(true, Ordering::SeqCst) {
        return false;
    }
    let stay = Duration::from_millis(rng.random_range(2000..6000));
    {
        let w = world.lock().await;
        let Some(second) = &w.second else {
            travelling.store(false, Ordering::SeqCst);
            return false;
        };
        second.link.freeze(true);
        if w.proxy.set_upstream(second.config.clone()).is_err() {
            second.link.freeze(false);
            travelling.store(false, Ordering::SeqCst);
            return false;
        }
    }
    count(counts, TRAVELLED);
    let (w, travelling) = (world.clone(), travelling.clone());
    windows.spawn(async move {
        tokio::time::sleep(stay).await;
        {
            let w = w.lock().await;
            if let Err(e) = w.proxy.set_upstream(w.upstream.clone()) {
                eprintln!("chaos: back to the first API server: {e}");
            }
            if let Some(second) = &w.second {
                second.link.freeze(false);
            }
        }
        log_line(
            &w,
            &format!(
                "api: back from the cut-off server after {} ms",
                stay.as_millis()
            ),
        )
        .await;
        travelling.store(false, Ordering::SeqCst);
    });
    true
}

/// Appends the action to `<work dir>/faults.log`, to line up with the sidecars' logs.
async fn log_action(
    world: &Arc<tokio::sync::Mutex<World>>,
    action: Action,
    window: Duration,
    done: bool,
) {
    let rules = world.lock().await.proxy.rules();
    let line = format!(
        "{} window={}ms applied={} proxy_rules={:?}",
        action.label(),
        window.as_millis(),
        done,
        rules
    );
    log_line(world, &line).await;
}

/// Appends a time-stamped line to `<work dir>/faults.log`.
async fn log_line(world: &Arc<tokio::sync::Mutex<World>>, text: &str) {
    use std::io::Write;
    let path = world.lock().await.dir.join("faults.log");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!("{}.{:03} {text}\n", now.as_secs(), now.subsec_millis());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Arms `fault` on the driver of node `node` (the only driver in a central deployment).
async fn driver_fault(
    world: &Arc<tokio::sync::Mutex<World>>,
    node: usize,
    method: &str,
    fault: DriverFault,
) -> bool {
    let control = world.lock().await.driver_at(node).control().await;
    match control {
        Ok(c) => c.set_fault(method, fault).await.is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_pauses_the_leader_but_never_restarts_the_control_plane() {
        let all = FaultMix::all();
        assert!(all.pause && all.kill);
        assert!(!all.restart_control_plane);
        assert_eq!(FaultMix::parse("all"), Ok(all));
        let mix = FaultMix::parse("kill,pause").expect("parses");
        assert!(mix.kill && mix.pause && !mix.api && !mix.restart_control_plane);
        assert!(!mix.policy && FaultMix::all().policy);
        assert!(FaultMix::parse("policy").expect("parses").policy);
        assert!(FaultMix::parse("restart").is_err());
    }

    #[test]
    fn restarts_are_planned_inside_the_load_phase_once_or_twice() {
        let short = Duration::from_secs(75);
        for seed in 0..50 {
            let plan = plan_restarts(seed, short);
            assert_eq!(plan.len(), 1);
            assert!(plan[0] >= short.mul_f64(0.2) && plan[0] < short.mul_f64(0.6));
            assert_eq!(plan, plan_restarts(seed, short), "seeded");
        }
        let long = Duration::from_secs(900);
        for seed in 0..50 {
            let plan = plan_restarts(seed, long);
            assert_eq!(plan.len(), 2);
            assert!(plan[0] >= long.mul_f64(0.15) && plan[0] < long.mul_f64(0.4));
            assert!(plan[1] >= long.mul_f64(0.55) && plan[1] < long.mul_f64(0.75));
        }
    }
}
