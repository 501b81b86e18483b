//! The fault injector: at random (seeded) moments it opens a window of API faults through
//! the proxy, disturbs watch streams, arms a driver fault, crashes the driver, or SIGKILLs
//! a sidecar replica. Every action is counted by kind for the report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_test_driver::GrpcCode;
use csi_test_driver::control::Fault as DriverFault;
use kube_fault_proxy::{Fault, Rule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::world::World;

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
            driver_latency_max: DEFAULT_DRIVER_LATENCY_MAX,
        }
    }

    pub fn none() -> FaultMix {
        FaultMix {
            api: false,
            watch: false,
            driver: false,
            kill: false,
            driver_latency_max: DEFAULT_DRIVER_LATENCY_MAX,
        }
    }

    /// `api,watch,driver,kill` (any subset), `all` or `none`.
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
    SidecarKill,
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
            Action::SidecarKill => "sidecar: SIGKILL + restart",
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
            Action::SidecarKill => 2,
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
            | Action::DriverCrash => mix.driver,
            Action::SidecarKill => mix.kill,
        }
    }
}

const ALL_ACTIONS: [Action; 13] = [
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
    Action::SidecarKill,
];

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

/// Runs the injector until `stop` is cancelled. Returns the action counts.
pub async fn inject(
    world: Arc<tokio::sync::Mutex<World>>,
    mix: FaultMix,
    seed: u64,
    stop: CancellationToken,
) -> BTreeMap<&'static str, u64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let latency_max = (mix.driver_latency_max.as_millis() as u64).max(501);
    let counts: Counts = Arc::default();
    let actions: Vec<Action> = ALL_ACTIONS
        .iter()
        .copied()
        .filter(|a| a.family_enabled(&mix))
        .collect();
    let total_weight: u32 = actions.iter().map(|a| a.weight()).sum();
    if actions.is_empty() {
        stop.cancelled().await;
        return BTreeMap::new();
    }
    // Windows close by themselves; their tasks are awaited before returning so that no
    // fault outlives the injection phase.
    let mut windows = tokio::task::JoinSet::new();
    loop {
        let pause = Duration::from_millis(rng.random_range(400..1600));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => break,
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
        let done = apply(&world, action, window, latency_max, &mut rng, &mut windows).await;
        log_action(&world, action, window, done).await;
        if done {
            *counts
                .lock()
                .expect("poisoned")
                .entry(action.label())
                .or_default() += 1;
        }
    }
    while windows.join_next().await.is_some() {}
    counts.lock().expect("poisoned").clone()
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
                "CreateVolume",
                DriverFault::CreateThenDeadlineExceeded { count },
            )
            .await
        }
        Action::DriverUnavailable => {
            let count = rng.random_range(1..4);
            driver_fault(
                world,
                method,
                DriverFault::Error {
                    code: GrpcCode::Unavailable,
                    count,
                    message: None,
                },
            )
            .await
        }
        Action::DriverLatency => {
            let ms = rng.random_range(500..latency_max);
            if !driver_fault(world, method, DriverFault::Latency { ms }).await {
                return false;
            }
            let w = world.clone();
            windows.spawn(async move {
                tokio::time::sleep(window).await;
                // Latency 0 replaces the latency fault without touching the others.
                driver_fault(&w, method, DriverFault::Latency { ms: 0 }).await;
            });
            true
        }
        Action::DriverCrash => {
            let down = Duration::from_millis(rng.random_range(200..2000));
            world
                .lock()
                .await
                .driver
                .crash_and_restart(down)
                .await
                .is_ok()
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
        _ => false,
    }
}

/// Appends the action to `<work dir>/faults.log`, to line up with the sidecars' logs.
async fn log_action(
    world: &Arc<tokio::sync::Mutex<World>>,
    action: Action,
    window: Duration,
    done: bool,
) {
    use std::io::Write;
    let (path, rules) = {
        let w = world.lock().await;
        (w.dir.join("faults.log"), w.proxy.rules())
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!(
        "{}.{:03} {} window={}ms applied={} proxy_rules={:?}\n",
        now.as_secs(),
        now.subsec_millis(),
        action.label(),
        window.as_millis(),
        done,
        rules
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

async fn driver_fault(
    world: &Arc<tokio::sync::Mutex<World>>,
    method: &str,
    fault: DriverFault,
) -> bool {
    let control = world.lock().await.driver.control().await;
    match control {
        Ok(c) => c.set_fault(method, fault).await.is_ok(),
        Err(_) => false,
    }
}
