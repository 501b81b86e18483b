//! The scale profile's report: for each figure a table (one row per size, one column per
//! contender, the ratios to upstream and the target) and a plot (size on the x-axis,
//! one series per contender); the test bed at each size; how each of ours' costs grows.
//! Pure but for the plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::Extra;
use crate::contender::Who;
use crate::plot::{self, Series, Style};
use crate::report::{COLUMNS, JUDGED, Target, Verdict, fmt};
use crate::runner::RunResult;
use crate::stats::{median, percentile};

const MIB: f64 = 1024.0 * 1024.0;

/// Where the target applies.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    EverySize,
    /// Only at the largest size measured (the "at 50,000 pairs").
    Largest,
}

/// One figure: a table and a plot.
pub struct Figure {
    /// File name part of its plot (`scale-<slug>.png`).
    pub slug: &'static str,
    pub title: &'static str,
    /// The plot's y-axis.
    pub axis: &'static str,
    pub decimals: usize,
    pub get: fn(&RunResult) -> Option<f64>,
    target: Option<(Target, Scope)>,
    /// What the table says under its title (e.g. which contender cannot have the figure).
    pub note: Option<&'static str>,
}

fn extra(r: &RunResult) -> Option<&Extra> {
    r.scale.as_ref()
}

fn mib(kib: u64) -> Option<f64> {
    (kib > 0).then(|| kib as f64 / 1024.0)
}

/// Every figure of the profile, in the order of the report.
pub fn figures() -> Vec<Figure> {
    let f = |slug, title, axis, decimals, get: fn(&RunResult) -> Option<f64>| Figure {
        slug,
        title,
        axis,
        decimals,
        get,
        target: None,
        note: None,
    };
    let target = |mut fig: Figure, bound: f64, scope: Scope| {
        fig.target = Some((Target::at_most(bound), scope));
        fig
    };
    let note = |mut fig: Figure, note: &'static str| {
        fig.note = Some(note);
        fig
    };
    vec![
        target(
            f(
                "startup",
                "Start-up: spawn → PV of a claim waiting at the start (s)",
                "seconds",
                2,
                |r| r.startup_secs,
            ),
            1.0,
            Scope::EverySize,
        ),
        f(
            "startup-requests",
            "Start-up: API requests (spawn → that claim's volume deleted)",
            "requests",
            0,
            |r| r.startup_secs.map(|_| r.api_startup.total()),
        ),
        note(
            f(
                "startup-read",
                "Start-up: MiB read from the API server (spawn → that claim's volume deleted)",
                "MiB",
                1,
                |r| r.startup_bytes.map(|b| b as f64 / MIB),
            ),
            "Response bodies as the contender read them through the proxy: uncompressed \
             (the proxy asks for plain bodies), watch streams as JSON.",
        ),
        target(
            f(
                "idle-rss",
                "Idle RSS (MiB, VmRSS after idling)",
                "MiB",
                1,
                |r| r.idle_rss_kib.and_then(mib),
            ),
            0.3,
            Scope::EverySize,
        ),
        f(
            "startup-peak",
            "Peak RSS of start-up (MiB, VmHWM after idling)",
            "MiB",
            1,
            |r| extra(r)?.startup_peak_kib.and_then(mib),
        ),
        f(
            "burst-rate",
            "Burst into the full cluster: volumes/s (claims ÷ time to the last PV)",
            "volumes/s",
            1,
            |r| r.all_pv_secs.map(|t| r.claims as f64 / t),
        ),
        f(
            "burst-p99",
            "Burst into the full cluster: claim → PV latency p99 (s)",
            "seconds",
            2,
            |r| {
                r.all_pv_secs?;
                percentile(&r.latency_pv, 99.0)
            },
        ),
        f(
            "burst-cpu",
            "Burst into the full cluster: CPU-seconds per 1,000 volumes provisioned",
            "CPU-seconds",
            1,
            |r| {
                r.all_pv_secs?;
                (r.claims > 0).then(|| 1000.0 * r.cpu_provision_secs / r.claims as f64)
            },
        ),
        f(
            "burst-peak",
            "Peak RSS by the end of the burst and its deletion (MiB, VmHWM since spawn)",
            "MiB",
            1,
            |r| mib(r.peak_rss_kib),
        ),
        target(
            f(
                "relist",
                "Forced relist: cut → PV of a claim created after the cut (s)",
                "seconds",
                2,
                |r| extra(r)?.relist.as_ref()?.secs,
            ),
            1.0,
            Scope::Largest,
        ),
        target(
            f(
                "relist-peak",
                "Forced relist: peak RSS (MiB, from the cut to 5 s after that PV)",
                "MiB",
                1,
                |r| extra(r)?.relist.as_ref()?.peak_kib.and_then(mib),
            ),
            0.3,
            Scope::EverySize,
        ),
        f(
            "relist-read",
            "Forced relist: MiB read from the API server",
            "MiB",
            1,
            |r| Some(extra(r)?.relist.as_ref()?.bytes as f64 / MIB),
        ),
        note(
            f(
                "scrape",
                "One `/metrics` scrape after idling (ms, connect → last byte)",
                "milliseconds",
                2,
                |r| extra(r)?.scrape_secs.map(|s| s * 1000.0),
            ),
            "The floor serves no `/metrics`: \"–\".",
        ),
        note(
            f(
                "scrape-size",
                "One `/metrics` scrape: page size (KiB)",
                "KiB",
                1,
                |r| extra(r)?.scrape_bytes.map(|b| b as f64 / 1024.0),
            ),
            "The floor serves no `/metrics`: \"–\".",
        ),
        note(
            f(
                "audit",
                "`csi-provisioner audit --output=json --recheck-after=0s`: wall clock (s)",
                "seconds",
                2,
                |r| Some(extra(r)?.audit.as_ref()?.secs),
            ),
            "One run per size, in ours' turn, as admin straight to the API server: a program \
             of ours, not a contender's cost (upstream and the floor have none).",
        ),
        note(
            f(
                "audit-peak",
                "`csi-provisioner audit`: peak RSS (MiB, VmHWM)",
                "MiB",
                1,
                |r| extra(r)?.audit.as_ref().and_then(|a| mib(a.peak_kib)),
            ),
            "As above: ours only.",
        ),
    ]
}

/// The sizes measured, smallest first.
pub fn sizes(results: &[RunResult]) -> Vec<usize> {
    let mut sizes: Vec<usize> = results
        .iter()
        .filter_map(|r| Some(extra(r)?.pairs))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// A figure's value for one contender at one size (the median if it ran more than once).
fn value(results: &[RunResult], fig: &Figure, who: Who, pairs: usize) -> Option<f64> {
    median(
        results
            .iter()
            .filter(|r| r.who == Some(who) && extra(r).is_some_and(|e| e.pairs == pairs))
            .map(|r| (fig.get)(r)),
    )
}

/// `1,000`, `50,000`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The table of one figure; pushes its verdicts (ours and ours+policies against upstream).
pub fn figure_table(fig: &Figure, results: &[RunResult], verdicts: &mut Vec<Verdict>) -> String {
    let sizes = sizes(results);
    let largest = sizes.last().copied();
    let mut out = format!("#### {}\n\n", fig.title);
    if let Some(note) = fig.note {
        let _ = write!(out, "{note}\n\n");
    }
    out.push_str(
        "| pairs | upstream | ours | ours+policies | floor | ours / upstream | ours+policies / upstream | target |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for &pairs in &sizes {
        let values = COLUMNS.map(|w| value(results, fig, w, pairs));
        let target = fig
            .target
            .filter(|(_, scope)| *scope == Scope::EverySize || Some(pairs) == largest)
            .map(|(t, _)| t);
        let mut cells = Vec::new();
        for (i, who) in JUDGED.iter().enumerate() {
            let ratio = match (values[i + 1], values[0]) {
                (Some(a), Some(u)) if u > 0.0 => Some(a / u),
                _ => None,
            };
            let mark = match (target, ratio) {
                (Some(t), Some(x)) if t.met(x) => " ✓",
                (Some(_), Some(_)) => " ✗",
                _ => "",
            };
            cells.push(ratio.map_or("–".into(), |x| format!("{x:.2}×{mark}")));
            if let Some(t) = target {
                verdicts.push(Verdict {
                    scenario: format!("scale-{pairs}"),
                    who: *who,
                    metric: fig.title.to_string(),
                    ratio,
                    target: t.text(),
                    met: ratio.map(|x| t.met(x)),
                });
            }
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            thousands(pairs),
            fmt(values[0], fig.decimals),
            fmt(values[1], fig.decimals),
            fmt(values[2], fig.decimals),
            fmt(values[3], fig.decimals),
            cells[0],
            cells[1],
            target.map(|t| t.text()).unwrap_or_default(),
        );
    }
    out
}

/// Least-squares slope of `points` (x, y): y's growth per unit of x; `None` below two
/// distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

/// How each contender's costs grow: MiB of idle RSS per 10,000 pairs (the slope over the
/// sizes), and the largest size's figure ÷ the smallest's for the costs the issue wants flat.
pub fn growth_table(results: &[RunResult]) -> String {
    let sizes = sizes(results);
    let figs = figures();
    let by_slug = |slug: &str| figs.iter().find(|f| f.slug == slug);
    let mut out = String::from(
        "| contender | idle RSS, MiB per 10,000 pairs | start-up peak, MiB per 10,000 pairs | \
         `/metrics` scrape, largest ÷ smallest (target ≤ 2×) | burst volumes/s, largest ÷ smallest | \
         burst p99, largest ÷ smallest |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let (Some(&small), Some(&large)) = (sizes.first(), sizes.last()) else {
        return out;
    };
    for who in COLUMNS {
        let per_10k = |slug: &str| {
            let fig = by_slug(slug)?;
            let points: Vec<(f64, f64)> = sizes
                .iter()
                .filter_map(|&p| Some((p as f64, value(results, fig, who, p)?)))
                .collect();
            slope(&points).map(|s| s * 10_000.0)
        };
        let growth = |slug: &str| {
            let fig = by_slug(slug)?;
            let (a, b) = (
                value(results, fig, who, small)?,
                value(results, fig, who, large)?,
            );
            (a > 0.0 && large > small).then(|| b / a)
        };
        let ratio = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.2}×"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            who.label(),
            fmt(per_10k("idle-rss"), 1),
            fmt(per_10k("startup-peak"), 1),
            ratio(growth("scrape")),
            ratio(growth("burst-rate")),
            ratio(growth("burst-p99")),
        );
    }
    out
}

/// The test bed at each size: the fill, the control plane's memory and etcd's database.
pub fn bed_table(results: &[RunResult]) -> String {
    let mut out = String::from(
        "| pairs | + claims waiting (another driver's) | pairs added | fill (s) | pairs/s | \
         kube-apiserver RSS / peak (MiB) | etcd RSS (MiB) | etcd database (MiB) | \
         kube-controller-manager CPU while idle (s/min) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for pairs in sizes(results) {
        let at: Vec<&Extra> = results
            .iter()
            .filter_map(extra)
            .filter(|e| e.pairs == pairs)
            .collect();
        let Some(first) = at.first() else { continue };
        let max = |f: fn(&Extra) -> u64| at.iter().map(|e| f(e)).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} / {} | {} | {} | {} |",
            thousands(pairs),
            super::layout::pending_count(pairs),
            thousands(first.fill.added),
            first.fill.secs,
            fmt(first.fill.pairs_per_sec(), 0),
            fmt(mib(max(|e| e.control_plane.apiserver_rss_kib)), 0),
            fmt(mib(max(|e| e.control_plane.apiserver_peak_kib)), 0),
            fmt(mib(max(|e| e.control_plane.etcd_rss_kib)), 0),
            fmt(
                Some(max(|e| e.control_plane.etcd_db_bytes) as f64 / MIB).filter(|x| *x > 0.0),
                0
            ),
            fmt(
                median(at.iter().map(|e| e.controller_manager_cpu_per_min)),
                1
            ),
        );
    }
    out
}

/// Notes of runs that did not go as planned (a phase that failed, a relist that did not
/// happen), so a "–" in a table has its reason next to it.
pub fn notes(results: &[RunResult]) -> String {
    let mut out = String::new();
    for r in results.iter().filter(|r| !r.notes.is_empty()) {
        let who = r.who.map_or("(fill)", Who::label);
        let _ = writeln!(out, "- `{}` {who}: {}", r.scenario, r.notes.join("; "));
    }
    out
}

/// Draws one plot per figure into `dir`; returns (file, caption) by figure slug.
pub fn draw_plots(dir: &Path, results: &[RunResult]) -> BTreeMap<&'static str, (String, String)> {
    let sizes = sizes(results);
    let mut out = BTreeMap::new();
    for fig in figures() {
        let series: Vec<Series> = COLUMNS
            .iter()
            .filter_map(|&w| {
                let points: Vec<(f64, f64)> = sizes
                    .iter()
                    .filter_map(|&p| Some((p as f64, value(results, &fig, w, p)?)))
                    .collect();
                (!points.is_empty()).then(|| Series {
                    label: w.label().into(),
                    color: crate::series_color(w),
                    points,
                })
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let file = format!("scale-{}.png", fig.slug);
        let caption = format!("{} by cluster size", fig.title.replace('`', ""));
        match plot::draw(
            &dir.join(&file),
            &caption,
            "bound PV/PVC pairs",
            fig.axis,
            &series,
            Style::LinesAndPoints,
        ) {
            Ok(()) => {
                out.insert(fig.slug, (file, caption));
            }
            Err(e) => eprintln!("bench: {e:#}"),
        }
    }
    out
}

/// The generated body of the profile (below its header): the targets, the test bed, the
/// growth, then each figure's table with its plot (`plots` from [`draw_plots`], linked
/// relative to `rel`).
pub fn body(
    results: &[RunResult],
    plots: &BTreeMap<&'static str, (String, String)>,
    rel: &str,
) -> (String, Vec<Verdict>) {
    let mut verdicts = Vec::new();
    let mut tables = String::new();
    for fig in figures() {
        tables.push_str(&figure_table(&fig, results, &mut verdicts));
        if let Some((file, caption)) = plots.get(fig.slug) {
            let _ = write!(tables, "\n![{caption}]({rel}/{file})\n");
        }
        tables.push('\n');
    }
    let mut out = format!(
        "#### Ours against the targets (scale)\n\n{}\n",
        crate::report::verdict_table(&verdicts)
    );
    let _ = write!(
        out,
        "#### The test bed at each size\n\n{}\n#### How the costs grow\n\n{}\n",
        bed_table(results),
        growth_table(results)
    );
    let notes = notes(results);
    if !notes.is_empty() {
        let _ = write!(out, "#### What did not go as planned\n\n{notes}\n");
    }
    out.push_str(&tables);
    (out, verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::{Audit, Relist};

    fn run(who: Who, pairs: usize, idle_mib: u64, scrape_ms: f64) -> RunResult {
        RunResult {
            scenario: format!("scale-{pairs}"),
            who: Some(who),
            claims: 100,
            startup_secs: Some(2.0),
            all_pv_secs: Some(10.0),
            idle_rss_kib: Some(idle_mib * 1024),
            latency_pv: (1..=100).map(f64::from).collect(),
            scale: Some(Extra {
                pairs,
                scrape_secs: (who != Who::Floor).then_some(scrape_ms / 1000.0),
                relist: Some(Relist {
                    secs: Some(3.0),
                    gone: 2,
                    ..Default::default()
                }),
                audit: (who == Who::Ours).then(|| Audit {
                    secs: 1.5,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn runs() -> Vec<RunResult> {
        let mut out = Vec::new();
        for (pairs, up, ours) in [(1_000, 40, 10), (10_000, 140, 20), (20_000, 240, 30)] {
            out.push(run(Who::Upstream, pairs, up, 1.0));
            out.push(run(Who::Ours, pairs, ours, 1.5));
            out.push(run(Who::Floor, pairs, 5, 0.0));
        }
        out
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(50_000), "50,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_slope_is_the_growth_per_pair() {
        assert_eq!(slope(&[(1_000.0, 40.0), (10_000.0, 130.0)]), Some(0.01));
        let s = slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((s - 2.0).abs() < 1e-12);
        assert_eq!(slope(&[(1.0, 1.0)]), None);
        assert_eq!(slope(&[(1.0, 1.0), (1.0, 2.0)]), None);
    }

    #[test]
    fn a_figure_table_has_a_row_per_size_and_judges_ours() {
        let results = runs();
        let figs = figures();
        let idle = figs.iter().find(|f| f.slug == "idle-rss").unwrap();
        let mut verdicts = Vec::new();
        let table = figure_table(idle, &results, &mut verdicts);
        assert!(
            table.contains("| 1,000 | 40.0 | 10.0 | – | 5.0 | 0.25× ✓ | – | ≤ 0.3× |"),
            "{table}"
        );
        assert!(table.contains("| 20,000 | 240.0 | 30.0 |"), "{table}");
        // Ours and ours+policies at each of the three sizes.
        assert_eq!(verdicts.len(), 6);
        assert_eq!(verdicts.iter().filter(|v| v.met == Some(true)).count(), 3);
        assert_eq!(verdicts.iter().filter(|v| v.met.is_none()).count(), 3);
    }

    #[test]
    fn a_target_at_the_largest_size_is_judged_there_only() {
        let results = runs();
        let relist = figures().into_iter().find(|f| f.slug == "relist").unwrap();
        let mut verdicts = Vec::new();
        let table = figure_table(&relist, &results, &mut verdicts);
        assert_eq!(verdicts.len(), 2, "{table}");
        assert!(verdicts.iter().all(|v| v.scenario == "scale-20000"));
        assert!(
            table.contains("| 1,000 | 3.00 | 3.00 | – | 3.00 | 1.00× | – |  |"),
            "{table}"
        );
    }

    #[test]
    fn what_a_contender_cannot_have_is_a_dash() {
        let results = runs();
        let figs = figures();
        let scrape = figs.iter().find(|f| f.slug == "scrape").unwrap();
        let table = figure_table(scrape, &results, &mut Vec::new());
        assert!(table.contains("| 1,000 | 1.00 | 1.50 | – | – |"), "{table}");
        let audit = figs.iter().find(|f| f.slug == "audit").unwrap();
        let table = figure_table(audit, &results, &mut Vec::new());
        assert!(
            table.contains("| 1,000 | – | 1.50 | – | – | – | – |"),
            "{table}"
        );
    }

    #[test]
    fn growth_is_per_ten_thousand_pairs_and_largest_over_smallest() {
        let table = growth_table(&runs());
        // Upstream's idle RSS: 40 → 140 → 240 MiB over 1,000 → 10,000 → 20,000 pairs: the
        // least-squares line rises 1.9e6 / 180.67e6 MiB per pair.
        assert!(
            table.contains("| upstream | 105.2 |"),
            "least squares over three sizes: {table}"
        );
        assert!(table.contains("| ours | 10.5 |"), "{table}");
        // The scrape took as long at every size.
        assert!(table.contains("| 1.00× | 1.00× | 1.00× |"), "{table}");
        assert!(growth_table(&[]).lines().count() == 2, "just the header");
    }

    #[test]
    fn the_bed_table_reads_the_fill_and_the_control_plane() {
        let mut results = runs();
        for r in &mut results {
            let e = r.scale.as_mut().unwrap();
            e.fill.added = e.pairs;
            e.fill.secs = 10.0;
            e.control_plane.etcd_db_bytes = 64 << 20;
            e.controller_manager_cpu_per_min = Some(1.5);
        }
        let table = bed_table(&results);
        assert!(
            table.contains("| 10,000 | 50 | 10,000 | 10 | 1000 | – / – | – | 64 | 1.5 |"),
            "{table}"
        );
    }

    #[test]
    fn sizes_come_from_the_results() {
        assert_eq!(sizes(&runs()), [1_000, 10_000, 20_000]);
        assert!(sizes(&[RunResult::default()]).is_empty());
    }
}
