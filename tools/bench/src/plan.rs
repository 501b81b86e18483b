//! What a profile runs: the scenarios, their sizes and how many rounds. Pure,
//! so the sizes of `quick` and `full` are visible in one place.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// CI-sized: under 10 minutes on the 2-core project machine.
    Quick,
    /// The sizes of the issue: bursts of 2,000, 20 PVCs/s for 60 s, 10,000 idle objects.
    Full,
}

/// Client-side API rate limits, passed as `--kube-api-qps` / `--kube-api-burst`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Limits {
    pub qps: u32,
    pub burst: u32,
}

/// Upstream's defaults, what most users run.
pub const DEFAULT_LIMITS: Limits = Limits { qps: 5, burst: 10 };
/// High enough that the client limiter is not the bottleneck.
pub const RAISED_LIMITS: Limits = Limits {
    qps: 1000,
    burst: 2000,
};
/// `--worker-threads` for every contender (upstream's default).
pub const WORKER_THREADS: u32 = 100;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Workload {
    /// N claims at once; then all deleted at once.
    Burst { claims: usize },
    /// Claims arriving at `rate` per second for `secs` seconds; then all deleted.
    Steady { rate: f64, secs: u64 },
    /// `objects` bound PVs and PVCs in the cluster; the contender starts, provisions one
    /// probe claim, and then idles for `idle_secs`.
    Idle { objects: usize, idle_secs: u64 },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    /// Short stable name (`burst-raised-0ms`), used in file names and `--only`.
    pub name: String,
    pub workload: Workload,
    pub limits: Limits,
    /// Latency the test driver adds to every CSI call.
    pub latency_ms: u64,
    pub rounds: u32,
    /// Runs on a control plane of its own, after the other scenarios and side
    /// by side with the rest of its kind. Only for scenarios bound by the
    /// client's token bucket (5 requests/s), which leave the machine nearly
    /// idle: the full profile's default-limit bursts, over an hour each.
    pub own_control_plane: bool,
}

impl Scenario {
    pub fn title(&self) -> String {
        let limits = if self.limits == DEFAULT_LIMITS {
            "default client limits"
        } else {
            "raised client limits"
        };
        let what = match &self.workload {
            Workload::Burst { claims } => format!("Burst of {claims} claims"),
            Workload::Steady { rate, secs } => {
                format!("Steady arrival, {rate} claims/s for {secs} s")
            }
            Workload::Idle { objects, .. } => format!("Idle with {objects} bound PVs and PVCs"),
        };
        format!(
            "{what}, {limits} (--kube-api-qps={} --kube-api-burst={}), CSI latency {} ms",
            self.limits.qps, self.limits.burst, self.latency_ms
        )
    }

    /// How many volumes one run provisions (for per-volume figures).
    pub fn volumes(&self) -> usize {
        match &self.workload {
            Workload::Burst { claims } => *claims,
            Workload::Steady { rate, secs } => (rate * *secs as f64).round() as usize,
            Workload::Idle { .. } => 1,
        }
    }
}

fn scenario(
    name: &str,
    workload: Workload,
    limits: Limits,
    latency_ms: u64,
    rounds: u32,
) -> Scenario {
    Scenario {
        name: name.to_string(),
        workload,
        limits,
        latency_ms,
        rounds,
        own_control_plane: false,
    }
}

/// A scenario run on a control plane of its own (see `own_control_plane`).
fn alongside(mut s: Scenario) -> Scenario {
    s.own_control_plane = true;
    s
}

pub fn plan(profile: Profile) -> Vec<Scenario> {
    use Workload::*;
    match profile {
        // Sized for < 10 minutes: at 5 requests/s a sidecar that needs several
        // requests per volume provisions about one volume per second, so the
        // default-limit burst is small; the steady run is shorter and slower.
        Profile::Quick => vec![
            scenario(
                "burst-raised-0ms",
                Burst { claims: 500 },
                RAISED_LIMITS,
                0,
                2,
            ),
            scenario(
                "burst-raised-50ms",
                Burst { claims: 500 },
                RAISED_LIMITS,
                50,
                1,
            ),
            scenario(
                "burst-default-0ms",
                Burst { claims: 20 },
                DEFAULT_LIMITS,
                0,
                1,
            ),
            scenario(
                "steady-raised-0ms",
                Steady {
                    rate: 10.0,
                    secs: 20,
                },
                RAISED_LIMITS,
                0,
                1,
            ),
            scenario(
                "idle",
                Idle {
                    objects: 1000,
                    idle_secs: 10,
                },
                RAISED_LIMITS,
                0,
                1,
            ),
        ],
        Profile::Full => vec![
            scenario(
                "burst-raised-0ms",
                Burst { claims: 2000 },
                RAISED_LIMITS,
                0,
                3,
            ),
            scenario(
                "burst-raised-50ms",
                Burst { claims: 2000 },
                RAISED_LIMITS,
                50,
                2,
            ),
            alongside(scenario(
                "burst-default-0ms",
                Burst { claims: 2000 },
                DEFAULT_LIMITS,
                0,
                1,
            )),
            alongside(scenario(
                "burst-default-50ms",
                Burst { claims: 2000 },
                DEFAULT_LIMITS,
                50,
                1,
            )),
            scenario(
                "steady-raised-0ms",
                Steady {
                    rate: 20.0,
                    secs: 60,
                },
                RAISED_LIMITS,
                0,
                2,
            ),
            scenario(
                "idle",
                Idle {
                    objects: 10_000,
                    idle_secs: 30,
                },
                RAISED_LIMITS,
                0,
                1,
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_has_the_sizes_of_the_issue() {
        let full = plan(Profile::Full);
        assert!(
            full.iter()
                .any(|s| s.workload == Workload::Burst { claims: 2000 }
                    && s.limits == DEFAULT_LIMITS)
        );
        assert!(
            full.iter()
                .any(|s| s.workload == Workload::Burst { claims: 2000 }
                    && s.limits == RAISED_LIMITS
                    && s.latency_ms == 50)
        );
        assert!(full.iter().any(|s| s.workload
            == Workload::Steady {
                rate: 20.0,
                secs: 60
            }));
        assert!(full.iter().any(|s| matches!(
            s.workload,
            Workload::Idle {
                objects: 10_000,
                ..
            }
        )));
    }

    #[test]
    fn names_are_unique_and_quick_bursts_are_500_at_raised_limits() {
        for profile in [Profile::Quick, Profile::Full] {
            let p = plan(profile);
            let mut names: Vec<_> = p.iter().map(|s| s.name.clone()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), p.len());
        }
        let quick = plan(Profile::Quick);
        assert!(quick.iter().any(|s| s.workload == Workload::Burst { claims: 500 } && s.limits == RAISED_LIMITS));
        assert_eq!(quick[3].volumes(), 200);
    }

    #[test]
    fn only_token_bucket_bound_scenarios_get_a_control_plane_of_their_own() {
        for profile in [Profile::Quick, Profile::Full] {
            for s in plan(profile) {
                if s.own_control_plane {
                    assert_eq!(s.limits, DEFAULT_LIMITS, "{}", s.name);
                    assert!(matches!(s.workload, Workload::Burst { .. }), "{}", s.name);
                }
            }
        }
        assert!(plan(Profile::Quick).iter().all(|s| !s.own_control_plane));
        assert_eq!(
            plan(Profile::Full)
                .iter()
                .filter(|s| s.own_control_plane)
                .count(),
            2
        );
    }
}
