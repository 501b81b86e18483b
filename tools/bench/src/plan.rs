//! What a profile runs: the scenarios, their sizes and how many rounds. Pure,
//! so the sizes of `quick`, `full` and `scale` are visible in one place.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// CI-sized: under 10 minutes on the 2-core project machine.
    Quick,
    /// The sizes of the issue: bursts of 2,000, 20 PVCs/s for 60 s, 10,000 idle objects.
    Full,
    /// The cluster's size (issue 41): 1,000 to 50,000 bound PV/PVC pairs, and at each size
    /// start-up, idle memory, a burst into the full cluster, a forced relist, a `/metrics`
    /// scrape and an audit. `make bench-scale`; hours.
    Scale,
}

/// The cluster sizes of the scale profile: bound PV/PVC pairs.
pub const SCALE_PAIRS: [usize; 4] = [1_000, 10_000, 20_000, 50_000];
/// New claims of the scale profile's burst into the full cluster.
pub const SCALE_BURST: usize = 2_000;
/// How long each contender idles at each size before its RSS is read.
pub const SCALE_IDLE_SECS: u64 = 60;

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
    /// `pairs` bound PV/PVC pairs in the cluster (spread over namespaces and classes); each
    /// contender starts (a claim waiting), idles `idle_secs`, is scraped, provisions a burst
    /// of `burst` claims, relists (forced) and, ours, is audited.
    Scale {
        pairs: usize,
        burst: usize,
        idle_secs: u64,
    },
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
            Workload::Scale {
                pairs,
                burst,
                idle_secs,
            } => format!(
                "{pairs} bound PV/PVC pairs: start-up, {idle_secs} s idle, a burst of {burst} claims, a forced relist"
            ),
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
            Workload::Scale { burst, .. } => *burst,
        }
    }
}

/// The scale profile's scenarios (`scale-<pairs>`), smallest cluster first: each size fills
/// the cluster further, so the order is the order the pairs are created in.
pub fn scale_plan(pairs: &[usize], burst: usize, idle_secs: u64) -> Vec<Scenario> {
    let mut sizes = pairs.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .into_iter()
        .map(|pairs| {
            scenario(
                &format!("scale-{pairs}"),
                Workload::Scale {
                    pairs,
                    burst,
                    idle_secs,
                },
                RAISED_LIMITS,
                0,
                1,
            )
        })
        .collect()
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
        Profile::Scale => scale_plan(&SCALE_PAIRS, SCALE_BURST, SCALE_IDLE_SECS),
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
        for profile in [Profile::Quick, Profile::Full, Profile::Scale] {
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
    fn scale_has_the_sizes_of_its_issue_smallest_first() {
        let scale = plan(Profile::Scale);
        let names: Vec<&str> = scale.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["scale-1000", "scale-10000", "scale-20000", "scale-50000"]
        );
        for s in &scale {
            assert!(matches!(
                s.workload,
                Workload::Scale {
                    burst: 2000,
                    idle_secs: 60,
                    ..
                }
            ));
            assert_eq!(s.limits, RAISED_LIMITS, "the burst runs at raised limits");
            assert_eq!(s.volumes(), 2000);
            assert!(!s.own_control_plane);
        }
        // A chosen size list is sorted and deduplicated: the cluster only grows.
        let small = scale_plan(&[10_000, 1_000, 1_000], 100, 10);
        assert_eq!(small.len(), 2);
        assert_eq!(small[0].name, "scale-1000");
        assert_eq!(
            small[1].workload,
            Workload::Scale {
                pairs: 10_000,
                burst: 100,
                idle_secs: 10
            }
        );
        assert!(small[0].title().starts_with("1000 bound PV/PVC pairs"));
    }

    #[test]
    fn only_token_bucket_bound_scenarios_get_a_control_plane_of_their_own() {
        for profile in [Profile::Quick, Profile::Full, Profile::Scale] {
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
