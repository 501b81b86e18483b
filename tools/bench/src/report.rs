//! Turns run results into figures per contender (medians over rounds), ratios
//! against the targets of the benchmark issue, and Markdown tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::contender::Who;
use crate::plan::{DEFAULT_LIMITS, Scenario, WORKER_THREADS, Workload};
use crate::runner::RunResult;
use crate::scrape;
use crate::stats::{median, percentile};

/// Figures of one contender in one scenario (medians over its rounds).
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub rounds: usize,
    pub complete_rounds: usize,
    pub volumes_per_sec: Option<f64>,
    pub all_pv_secs: Option<f64>,
    pub all_bound_secs: Option<f64>,
    pub all_gone_secs: Option<f64>,
    pub deletes_per_sec: Option<f64>,
    pub cpu_per_1000: Option<f64>,
    pub cpu_provision_per_1000: Option<f64>,
    pub cpu_delete_per_1000: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub idle_rss_mib: Option<f64>,
    pub api_per_volume: Option<f64>,
    pub api_provision_per_volume: Option<f64>,
    pub api_delete_per_volume: Option<f64>,
    /// Per volume, by `verb resource`, provisioning + deletion.
    pub api_detail: BTreeMap<String, f64>,
    pub api_by_verb: BTreeMap<String, f64>,
    pub csi_per_volume: BTreeMap<String, f64>,
    pub startup_secs: Option<f64>,
    pub startup_api: Option<f64>,
    pub idle_api: Option<f64>,
    pub latency_pv: [Option<f64>; 3],
    pub latency_bound: [Option<f64>; 3],
    pub driver_cpu_per_1000: Option<f64>,
    /// kube-apiserver + etcd CPU-seconds per 1,000 volumes (provision + delete).
    pub control_plane_cpu_per_1000: Option<f64>,
    /// Claims ÷ time to the last claim Bound.
    pub bound_per_sec: Option<f64>,
}

pub fn figures(runs: &[&RunResult]) -> Figures {
    let per_vol = |r: &RunResult, x: f64| {
        if r.claims > 0 {
            Some(x / r.claims as f64)
        } else {
            None
        }
    };
    let med = |f: &dyn Fn(&RunResult) -> Option<f64>| median(runs.iter().map(|r| f(r)));
    let complete = |r: &RunResult| r.all_pv_secs.is_some() && r.all_gone_secs.is_some();
    let finished = |r: &RunResult| complete(r) || r.idle_rss_kib.is_some();
    let mut api_detail = BTreeMap::new();
    let mut api_by_verb = BTreeMap::new();
    let mut csi = BTreeMap::new();
    let keys = |f: &dyn Fn(&RunResult) -> Vec<String>| {
        let mut k: Vec<String> = runs.iter().flat_map(|r| f(r)).collect();
        k.sort();
        k.dedup();
        k
    };
    for key in keys(&|r| {
        r.api_provision
            .plus(&r.api_delete)
            .0
            .keys()
            .cloned()
            .collect()
    }) {
        if let Some(v) = med(&|r| {
            per_vol(
                r,
                r.api_provision
                    .plus(&r.api_delete)
                    .0
                    .get(&key)
                    .copied()
                    .unwrap_or(0.0),
            )
        }) {
            api_detail.insert(key, v);
        }
    }
    for key in keys(&|r| {
        r.api_provision
            .plus(&r.api_delete)
            .by_verb()
            .keys()
            .cloned()
            .collect()
    }) {
        if let Some(v) = med(&|r| {
            per_vol(
                r,
                r.api_provision
                    .plus(&r.api_delete)
                    .by_verb()
                    .get(&key)
                    .copied()
                    .unwrap_or(0.0),
            )
        }) {
            api_by_verb.insert(key, v);
        }
    }
    for key in keys(&|r| r.csi_calls.keys().cloned().collect()) {
        if let Some(v) = med(&|r| per_vol(r, r.csi_calls.get(&key).copied().unwrap_or(0.0))) {
            csi.insert(key, v);
        }
    }
    let pooled = |f: &dyn Fn(&RunResult) -> &Vec<f64>| {
        let all: Vec<f64> = runs.iter().flat_map(|r| f(r).iter().copied()).collect();
        [
            percentile(&all, 50.0),
            percentile(&all, 90.0),
            percentile(&all, 99.0),
        ]
    };
    let mib = |k: u64| if k > 0 { Some(k as f64 / 1024.0) } else { None };
    Figures {
        rounds: runs.len(),
        complete_rounds: runs.iter().filter(|r| finished(r)).count(),
        volumes_per_sec: med(&|r| r.all_pv_secs.map(|t| r.claims as f64 / t)),
        all_pv_secs: med(&|r| r.all_pv_secs),
        all_bound_secs: med(&|r| r.all_bound_secs),
        all_gone_secs: med(&|r| r.all_gone_secs),
        deletes_per_sec: med(&|r| r.all_gone_secs.map(|t| r.claims as f64 / t)),
        cpu_per_1000: med(&|r| {
            complete(r)
                .then(|| per_vol(r, 1000.0 * (r.cpu_provision_secs + r.cpu_delete_secs)))
                .flatten()
        }),
        cpu_provision_per_1000: med(&|r| {
            r.all_pv_secs
                .and_then(|_| per_vol(r, 1000.0 * r.cpu_provision_secs))
        }),
        cpu_delete_per_1000: med(&|r| {
            r.all_gone_secs
                .and_then(|_| per_vol(r, 1000.0 * r.cpu_delete_secs))
        }),
        peak_rss_mib: med(&|r| mib(r.peak_rss_kib)),
        idle_rss_mib: med(&|r| r.idle_rss_kib.and_then(mib)),
        api_per_volume: med(&|r| {
            complete(r)
                .then(|| per_vol(r, r.api_provision.total() + r.api_delete.total()))
                .flatten()
        }),
        api_provision_per_volume: med(&|r| {
            r.all_pv_secs
                .and_then(|_| per_vol(r, r.api_provision.total()))
        }),
        api_delete_per_volume: med(&|r| {
            r.all_gone_secs
                .and_then(|_| per_vol(r, r.api_delete.total()))
        }),
        api_detail,
        api_by_verb,
        csi_per_volume: csi,
        startup_secs: med(&|r| r.startup_secs),
        startup_api: med(&|r| r.startup_secs.map(|_| r.api_startup.total())),
        idle_api: med(&|r| r.idle_rss_kib.map(|_| r.api_idle.total())),
        latency_pv: pooled(&|r| &r.latency_pv),
        latency_bound: pooled(&|r| &r.latency_bound),
        driver_cpu_per_1000: med(&|r| {
            complete(r)
                .then(|| per_vol(r, 1000.0 * r.driver_cpu_secs))
                .flatten()
        }),
        control_plane_cpu_per_1000: med(&|r| {
            let cpu = r.control_plane_cpu_provision_secs + r.control_plane_cpu_delete_secs;
            (complete(r) && cpu > 0.0)
                .then(|| per_vol(r, 1000.0 * cpu))
                .flatten()
        }),
        bound_per_sec: med(&|r| r.all_bound_secs.map(|t| r.claims as f64 / t)),
    }
}

/// Whether bigger is better for a row (decides how the ratio is read).
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Higher,
    Lower,
}

/// A target on ours/upstream: `(bound, better)`; met if the ratio is on the right side.
#[derive(Clone, Copy)]
pub struct Target {
    bound: f64,
    better: Better,
}

impl Target {
    /// Met when the ratio is at most `bound`.
    pub(crate) const fn at_most(bound: f64) -> Target {
        Target {
            bound,
            better: Better::Lower,
        }
    }

    pub(crate) fn text(&self) -> String {
        match self.better {
            Better::Higher => format!("≥ {}×", trim(self.bound)),
            Better::Lower => format!("≤ {}", frac(self.bound)),
        }
    }

    pub(crate) fn met(&self, ratio: f64) -> bool {
        match self.better {
            Better::Higher => ratio >= self.bound,
            Better::Lower => ratio <= self.bound + 1e-9,
        }
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn frac(x: f64) -> String {
    if (x - 1.0 / 3.0).abs() < 1e-6 {
        "1/3".into()
    } else if (x - 0.25).abs() < 1e-9 {
        "1/4".into()
    } else {
        format!("{}×", trim(x))
    }
}

pub(crate) fn fmt(v: Option<f64>, decimals: usize) -> String {
    v.map_or("–".to_string(), |x| format!("{x:.decimals$}"))
}

/// The contenders of a table's columns, in order.
pub(crate) const COLUMNS: [Who; 4] = [Who::Upstream, Who::Ours, Who::OursPolicies, Who::Floor];
/// The contenders whose ratios are judged against the targets.
pub(crate) const JUDGED: [Who; 2] = [Who::Ours, Who::OursPolicies];

struct Row {
    label: String,
    values: [Option<f64>; 4],
    decimals: usize,
    target: Option<Target>,
    better: Better,
}

fn row(
    label: &str,
    f: &BTreeMap<Who, Figures>,
    get: impl Fn(&Figures) -> Option<f64>,
    decimals: usize,
    better: Better,
    target: Option<Target>,
) -> Row {
    let v = |w: Who| f.get(&w).and_then(&get);
    Row {
        label: label.to_string(),
        values: COLUMNS.map(v),
        decimals,
        target,
        better,
    }
}

/// One verdict line of the summary.
pub struct Verdict {
    pub scenario: String,
    pub who: Who,
    pub metric: String,
    pub ratio: Option<f64>,
    pub target: String,
    pub met: Option<bool>,
}

fn table(rows: &[Row], verdicts: &mut Vec<Verdict>, scenario: &str) -> String {
    let mut out = String::from(
        "| | upstream | ours | ours+policies | floor | ours / upstream | ours+policies / upstream | floor / upstream | target |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let ratio = |a: Option<f64>| match (a, r.values[0]) {
            (Some(a), Some(u)) if u > 0.0 => Some(a / u),
            _ => None,
        };
        let ratios = [ratio(r.values[1]), ratio(r.values[2]), ratio(r.values[3])];
        let cell = |x: Option<f64>, judged: bool| {
            let mark = match (r.target, x) {
                (Some(t), Some(x)) if judged => {
                    if t.met(x) {
                        " ✓"
                    } else {
                        " ✗"
                    }
                }
                _ => "",
            };
            x.map_or("–".into(), |x| format!("{x:.2}×{mark}"))
        };
        if let Some(t) = r.target {
            for (who, ratio) in JUDGED.iter().zip(ratios) {
                verdicts.push(Verdict {
                    scenario: scenario.to_string(),
                    who: *who,
                    metric: r.label.clone(),
                    ratio,
                    target: t.text(),
                    met: ratio.map(|x| t.met(x)),
                });
            }
        }
        let _ = r.better;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            fmt(r.values[0], r.decimals),
            fmt(r.values[1], r.decimals),
            fmt(r.values[2], r.decimals),
            fmt(r.values[3], r.decimals),
            cell(ratios[0], true),
            cell(ratios[1], true),
            cell(ratios[2], false),
            r.target.map(|t| t.text()).unwrap_or_default(),
        );
    }
    out
}

/// The Markdown section of one scenario; pushes its verdicts.
pub fn scenario_section(
    sc: &Scenario,
    figs: &BTreeMap<Who, Figures>,
    verdicts: &mut Vec<Verdict>,
) -> String {
    let mut out = format!(
        "### {} — `{}`\n\n{}\n\n",
        sc.title(),
        sc.name,
        rounds_line(sc, figs)
    );
    let hi = Better::Higher;
    let lo = Better::Lower;
    // The targets of the claim-path issue (12), ours / upstream on the same run.
    let cpu_target = Some(Target {
        bound: 0.5,
        better: lo,
    });
    let rss_target = Some(Target {
        bound: 0.3,
        better: lo,
    });
    // The targets of the issue on the price of safety (28), met by ours
    // with the intent policies; ours without them is read against the
    // figures of the full run before it (docs/benchmarks.md).
    let api_target = Some(Target {
        bound: 0.95,
        better: lo,
    });
    let control_plane_target = Some(Target {
        bound: 1.0,
        better: lo,
    });
    let latency_target = Some(Target {
        bound: 1.0,
        better: lo,
    });
    let speed_target = Some(Target {
        bound: if sc.limits == DEFAULT_LIMITS {
            1.0
        } else {
            1.2
        },
        better: hi,
    });
    let mut rows = Vec::new();
    match &sc.workload {
        Workload::Burst { .. } | Workload::Steady { .. } => {
            let steady = matches!(sc.workload, Workload::Steady { .. });
            if !steady {
                rows.push(row(
                    "provisioning: volumes/s (claims ÷ time to the last PV)",
                    figs,
                    |f| f.volumes_per_sec,
                    1,
                    hi,
                    speed_target,
                ));
                rows.push(row(
                    "provisioning: volumes Bound/s (claims ÷ time to the last Bound)",
                    figs,
                    |f| f.bound_per_sec,
                    1,
                    hi,
                    None,
                ));
            }
            rows.push(row(
                "time to every PV (s)",
                figs,
                |f| f.all_pv_secs,
                1,
                lo,
                None,
            ));
            rows.push(row(
                "time to every claim Bound (s)",
                figs,
                |f| f.all_bound_secs,
                1,
                lo,
                None,
            ));
            rows.push(row(
                "deletion: time to every backend volume gone (s)",
                figs,
                |f| f.all_gone_secs,
                1,
                lo,
                None,
            ));
            rows.push(row(
                "deletion: volumes/s",
                figs,
                |f| f.deletes_per_sec,
                1,
                hi,
                None,
            ));
            rows.push(row(
                "claim → PV latency p50 (s)",
                figs,
                |f| f.latency_pv[0],
                2,
                lo,
                None,
            ));
            rows.push(row(
                "claim → PV latency p90 (s)",
                figs,
                |f| f.latency_pv[1],
                2,
                lo,
                None,
            ));
            rows.push(row(
                "claim → PV latency p99 (s)",
                figs,
                |f| f.latency_pv[2],
                2,
                lo,
                if steady { None } else { latency_target },
            ));
            if steady {
                rows.push(row(
                    "claim → Bound latency p50 (s)",
                    figs,
                    |f| f.latency_bound[0],
                    2,
                    lo,
                    None,
                ));
                rows.push(row(
                    "claim → Bound latency p99 (s)",
                    figs,
                    |f| f.latency_bound[2],
                    2,
                    lo,
                    None,
                ));
            }
            rows.push(row(
                "CPU-seconds per 1,000 volumes (provision + delete)",
                figs,
                |f| f.cpu_per_1000,
                1,
                lo,
                cpu_target,
            ));
            rows.push(row(
                "— of which provisioning",
                figs,
                |f| f.cpu_provision_per_1000,
                1,
                lo,
                None,
            ));
            rows.push(row(
                "— of which deletion",
                figs,
                |f| f.cpu_delete_per_1000,
                1,
                lo,
                None,
            ));
            rows.push(row(
                "control plane (kube-apiserver + etcd) CPU-seconds per 1,000 volumes",
                figs,
                |f| f.control_plane_cpu_per_1000,
                1,
                lo,
                control_plane_target,
            ));
            rows.push(row(
                "peak RSS (MiB, VmHWM)",
                figs,
                |f| f.peak_rss_mib,
                1,
                lo,
                rss_target,
            ));
            rows.push(row(
                "API requests per volume (provision + delete)",
                figs,
                |f| f.api_per_volume,
                2,
                lo,
                api_target,
            ));
            rows.push(row(
                "— during provisioning",
                figs,
                |f| f.api_provision_per_volume,
                2,
                lo,
                None,
            ));
            rows.push(row(
                "— during deletion",
                figs,
                |f| f.api_delete_per_volume,
                2,
                lo,
                None,
            ));
            let mut verbs: Vec<String> = figs
                .values()
                .flat_map(|f| f.api_by_verb.keys().cloned())
                .collect();
            verbs.sort();
            verbs.dedup();
            for v in verbs {
                rows.push(row(
                    &format!("— `{v}` per volume"),
                    figs,
                    |f| Some(f.api_by_verb.get(&v).copied().unwrap_or(0.0)),
                    2,
                    lo,
                    None,
                ));
            }
            let mut methods: Vec<String> = figs
                .values()
                .flat_map(|f| f.csi_per_volume.keys().cloned())
                .collect();
            methods.sort();
            methods.dedup();
            for m in methods {
                rows.push(row(
                    &format!("CSI `{m}` calls per volume"),
                    figs,
                    |f| Some(f.csi_per_volume.get(&m).copied().unwrap_or(0.0)),
                    2,
                    lo,
                    None,
                ));
            }
            rows.push(row(
                "start-up: spawn → first PV (s)",
                figs,
                |f| f.startup_secs,
                2,
                lo,
                None,
            ));
            rows.push(row(
                "test driver CPU-s per 1,000 volumes (same driver for all)",
                figs,
                |f| f.driver_cpu_per_1000,
                1,
                lo,
                None,
            ));
        }
        Workload::Idle { objects, idle_secs } => {
            rows.push(row(
                &format!(
                    "RSS idle with {objects} bound PVs + claims (MiB, VmRSS after {idle_secs} s)"
                ),
                figs,
                |f| f.idle_rss_mib,
                1,
                lo,
                rss_target,
            ));
            rows.push(row(
                "peak RSS (MiB, VmHWM: start-up with those objects)",
                figs,
                |f| f.peak_rss_mib,
                1,
                lo,
                rss_target,
            ));
            rows.push(row(
                "start-up: spawn → first PV (s)",
                figs,
                |f| f.startup_secs,
                2,
                lo,
                None,
            ));
            rows.push(row(
                "API requests from spawn to first PV deleted",
                figs,
                |f| f.startup_api,
                0,
                lo,
                None,
            ));
            rows.push(row(
                &format!("API requests while idle ({idle_secs} s)"),
                figs,
                |f| f.idle_api,
                0,
                lo,
                None,
            ));
        }
        // The scale profile has a report of its own (`scale::report`).
        Workload::Scale { .. } => {}
    }
    out.push_str(&table(&rows, verdicts, &sc.name));
    out
}

fn rounds_line(sc: &Scenario, figs: &BTreeMap<Who, Figures>) -> String {
    let parts: Vec<String> = Who::ALL
        .iter()
        .filter_map(|w| {
            figs.get(w)
                .map(|f| format!("{} {}/{}", w.label(), f.complete_rounds, f.rounds))
        })
        .collect();
    let what = match sc.workload {
        Workload::Idle { .. } => "runs".to_string(),
        _ => "complete rounds".to_string(),
    };
    format!("Medians over rounds ({what}: {}).", parts.join(", "))
}

/// API requests per volume by verb and resource, side by side.
pub fn api_detail_section(sc: &Scenario, figs: &BTreeMap<Who, Figures>) -> String {
    let mut keys: Vec<String> = figs
        .values()
        .flat_map(|f| f.api_detail.keys().cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let mut out = format!(
        "API requests per volume by verb and resource, `{}` (provisioning + deletion):\n\n| verb resource | upstream | ours | ours+policies | floor |\n|---|---:|---:|---:|---:|\n",
        sc.name
    );
    for k in keys {
        let v = |w: Who| {
            fmt(
                figs.get(&w)
                    .map(|f| f.api_detail.get(&k).copied().unwrap_or(0.0)),
                2,
            )
        };
        let _ = writeln!(
            out,
            "| {k} | {} | {} | {} | {} |",
            v(Who::Upstream),
            v(Who::Ours),
            v(Who::OursPolicies),
            v(Who::Floor)
        );
    }
    out
}

/// The sidecar metrics of `sc` (see `scrape::table`): per contender, the
/// measured phase (provisioning; in the idle scenario start-up, the probe
/// claim with every object in the caches) summed over its rounds, and the
/// other phases'.
pub fn metrics_section(sc: &Scenario, results: &[RunResult]) -> Option<String> {
    let (measured, what) = match sc.workload {
        Workload::Idle { .. } => ("startup", "start-up"),
        _ => ("provision", "provisioning"),
    };
    let per_who: scrape::PerWho = Who::ALL
        .iter()
        .map(|&who| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.scenario == sc.name && r.who == Some(who))
                .collect();
            let phase = |keep: &dyn Fn(&str) -> bool| {
                scrape::sum(runs.iter().flat_map(|r| {
                    r.sidecar_metrics
                        .iter()
                        .filter(|(p, _)| keep(p))
                        .map(|(_, s)| s.as_slice())
                }))
            };
            (who, (phase(&|p| p == measured), phase(&|p| p != measured)))
        })
        .collect();
    scrape::table(&sc.name, what, &per_who)
}

/// A line for the report's header when the contenders ran with other than
/// upstream's default `--worker-threads` (an experiment, not the benchmark).
pub fn worker_threads_line(results: &[RunResult]) -> Option<String> {
    let mut threads: Vec<u32> = results
        .iter()
        .map(|r| r.worker_threads)
        .filter(|&n| n != 0 && n != WORKER_THREADS)
        .collect();
    threads.sort_unstable();
    threads.dedup();
    (!threads.is_empty()).then(|| {
        let list: Vec<String> = threads.iter().map(|n| format!("`--worker-threads={n}`")).collect();
        format!(
            "- Every contender ran with {} (upstream's default is {WORKER_THREADS}): an experiment, \
             not the benchmark's figures.\n",
            list.join(", ")
        )
    })
}

pub fn verdict_table(verdicts: &[Verdict]) -> String {
    let mut out = String::from(
        "| scenario | contender | figure | ratio to upstream | target | met |\n|---|---|---|---:|---|---|\n",
    );
    for v in verdicts {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            v.scenario,
            v.who.label(),
            v.metric,
            v.ratio.map_or("–".into(), |x| format!("{x:.2}×")),
            v.target,
            match v.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not measured",
            }
        );
    }
    out
}

/// Replaces the text between the markers of `key` in `doc` (appending the
/// marked block if absent).
pub fn replace_section(doc: &str, key: &str, body: &str) -> String {
    let begin = format!("<!-- BEGIN GENERATED: {key} -->");
    let end = format!("<!-- END GENERATED: {key} -->");
    let block = format!("{begin}\n{body}\n{end}");
    match (doc.find(&begin), doc.find(&end)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &doc[..b], block, &doc[e + end.len()..]),
        _ => format!("{}\n\n{block}\n", doc.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Counts;

    fn run(claims: usize, pv: f64, gone: f64, cpu: f64, api: f64) -> RunResult {
        RunResult {
            claims,
            all_pv_secs: Some(pv),
            all_bound_secs: Some(pv + 1.0),
            all_gone_secs: Some(gone),
            cpu_provision_secs: cpu,
            api_provision: Counts([("create persistentvolumes".to_string(), api)].into()),
            latency_pv: vec![1.0, 2.0, 3.0],
            ..Default::default()
        }
    }

    #[test]
    fn figures_are_medians_per_volume() {
        let a = run(100, 10.0, 5.0, 2.0, 100.0);
        let b = run(100, 20.0, 5.0, 4.0, 300.0);
        let c = run(100, 40.0, 5.0, 6.0, 200.0);
        let f = figures(&[&a, &b, &c]);
        assert_eq!(f.volumes_per_sec, Some(5.0));
        assert_eq!(f.cpu_per_1000, Some(40.0));
        assert_eq!(f.api_per_volume, Some(2.0));
        assert_eq!(f.api_detail["create persistentvolumes"], 2.0);
        assert_eq!(f.latency_pv[0], Some(2.0));
        assert_eq!(f.complete_rounds, 3);
    }

    #[test]
    fn incomplete_rounds_give_no_throughput() {
        let mut a = run(100, 10.0, 5.0, 2.0, 100.0);
        a.all_pv_secs = None;
        let f = figures(&[&a]);
        assert_eq!(f.volumes_per_sec, None);
        assert_eq!(f.cpu_per_1000, None);
        assert_eq!(f.complete_rounds, 0);
    }

    #[test]
    fn targets_read_in_the_right_direction() {
        let faster = Target {
            bound: 1.5,
            better: Better::Higher,
        };
        assert!(faster.met(1.6) && !faster.met(1.4));
        let leaner = Target {
            bound: 0.25,
            better: Better::Lower,
        };
        assert!(leaner.met(0.2) && leaner.met(0.25) && !leaner.met(0.3));
        assert_eq!(leaner.text(), "≤ 1/4");
        let half = Target {
            bound: 0.5,
            better: Better::Lower,
        };
        assert_eq!(half.text(), "≤ 0.5×");
        assert_eq!(faster.text(), "≥ 1.5×");
    }

    #[test]
    fn sections_are_replaced_in_place_or_appended() {
        let doc = "# T\n\n<!-- BEGIN GENERATED: q -->\nold\n<!-- END GENERATED: q -->\n\ntail\n";
        let new = replace_section(doc, "q", "new");
        assert!(new.contains("\nnew\n") && !new.contains("old") && new.ends_with("tail\n"));
        let appended = replace_section("# T\n", "f", "x");
        assert!(appended.contains("<!-- BEGIN GENERATED: f -->\nx\n<!-- END GENERATED: f -->"));
    }
}
