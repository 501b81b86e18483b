//! The sidecar's own metrics, read from its `/metrics` at the end of each phase
//! (start-up, provisioning, deletion, idle): the stage histograms, the freshness
//! rounds by outcome and size, the stale-cache answers and the events dropped
//! (issue 37, "measure first"). Pure: parsing the text format, differences
//! between two scrapes, sums over rounds and the report's table. The scrape
//! itself is in `runner`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::contender::Who;

/// The families kept (as exposed: counters end in `_total`, histograms come as
/// `_bucket`, `_sum` and `_count`). Upstream exposes none of them.
pub const FAMILIES: [&str; 5] = [
    "csi_provisioner_provision_stage_seconds",
    "csi_provisioner_freshness_checks_total",
    "csi_provisioner_freshness_round_size",
    "csi_provisioner_stale_cache_answers_total",
    "csi_provisioner_events_dropped_total",
];

/// Per contender: (the samples of the measured phase, those of the other phases).
pub type PerWho = BTreeMap<Who, (Vec<Sample>, Vec<Sample>)>;

/// One sample of the text format: `name{labels} value`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn key(&self) -> (String, BTreeMap<String, String>) {
        (self.name.clone(), self.labels.clone())
    }
}

/// The samples of [`FAMILIES`] in a Prometheus / OpenMetrics text page.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse_line)
        .filter(|s| {
            FAMILIES.iter().any(|f| {
                s.name
                    .strip_prefix(f.trim_end_matches("_total"))
                    .is_some_and(|rest| ["", "_total", "_bucket", "_sum", "_count"].contains(&rest))
            })
        })
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line[open..].rfind('}')? + open;
            (
                &line[..open],
                labels(&line[open + 1..close]),
                &line[close + 1..],
            )
        }
        None => {
            let space = line.find(' ')?;
            (&line[..space], BTreeMap::new(), &line[space..])
        }
    };
    // A timestamp may follow the value.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y"` (values without escaped quotes, as the sidecar's are).
fn labels(text: &str) -> BTreeMap<String, String> {
    text.split("\",")
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        })
        .collect()
}

/// What changed from `before` to `after` (both cumulative), zero samples left out.
pub fn since(after: &[Sample], before: &[Sample]) -> Vec<Sample> {
    let old: BTreeMap<_, f64> = before.iter().map(|s| (s.key(), s.value)).collect();
    after
        .iter()
        .map(|s| Sample {
            value: s.value - old.get(&s.key()).copied().unwrap_or(0.0),
            ..s.clone()
        })
        .filter(|s| s.value != 0.0)
        .collect()
}

/// Samples of several runs added up, by name and labels.
pub fn sum<'a>(runs: impl IntoIterator<Item = &'a [Sample]>) -> Vec<Sample> {
    let mut total: BTreeMap<(String, BTreeMap<String, String>), f64> = BTreeMap::new();
    for run in runs {
        for s in run {
            *total.entry(s.key()).or_default() += s.value;
        }
    }
    total
        .into_iter()
        .map(|((name, labels), value)| Sample {
            name,
            labels,
            value,
        })
        .collect()
}

fn value(samples: &[Sample], name: &str, label: (&str, &str)) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.name == name && s.labels.get(label.0).map(String::as_str) == Some(label.1))
        .map(|s| s.value)
}

/// The values of `label` among the samples of `name`.
fn label_values(samples: &[Sample], name: &str, label: &str) -> Vec<String> {
    let mut out: Vec<String> = samples
        .iter()
        .filter(|s| s.name == name)
        .filter_map(|s| s.labels.get(label).cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// One histogram series: count, mean and the bucket bound holding quantile `q`.
fn histogram(samples: &[Sample], family: &str, label: (&str, &str), q: f64) -> Option<String> {
    let count = value(samples, &format!("{family}_count"), label)?;
    let sum = value(samples, &format!("{family}_sum"), label).unwrap_or(0.0);
    if count <= 0.0 {
        return None;
    }
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| {
            s.name == format!("{family}_bucket")
                && s.labels.get(label.0).map(String::as_str) == Some(label.1)
        })
        .filter_map(|s| Some((bound(s.labels.get("le")?)?, s.value)))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let at = buckets
        .iter()
        .find(|(_, n)| *n >= q * count)
        .map_or("?".to_string(), |(le, _)| trim(*le));
    Some(format!(
        "{} × mean {}, p{:.0} ≤ {at}",
        count,
        trim(sum / count),
        q * 100.0
    ))
}

fn bound(le: &str) -> Option<f64> {
    if le == "+Inf" {
        Some(f64::INFINITY)
    } else {
        le.parse().ok()
    }
}

fn whole(x: f64) -> String {
    format!("{x:.0}")
}

fn trim(x: f64) -> String {
    if x.is_infinite() {
        "+Inf".into()
    } else if x >= 10.0 {
        format!("{x:.0}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A cell of the table from (the measured phase's samples, the other phases').
type Cell<'a> = dyn Fn(&[Sample], &[Sample]) -> Option<String> + 'a;

/// The rows of the table: (what, text per contender).
fn rows(per_who: &PerWho) -> Vec<(String, Vec<String>)> {
    let all: Vec<Sample> = per_who
        .values()
        .flat_map(|(p, w)| p.iter().chain(w))
        .cloned()
        .collect();
    let cell = |f: &Cell<'_>| {
        per_who
            .values()
            .map(|(p, w)| f(p, w).unwrap_or_else(|| "–".into()))
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    let stage = FAMILIES[0];
    for s in label_values(&all, &format!("{stage}_count"), "stage") {
        let cells = cell(&|p, _| histogram(p, stage, ("stage", &s), 0.99));
        out.push((format!("stage `{s}` (s)"), cells));
    }
    let counter_rows = |family: &str, label: &str, what: &str| {
        label_values(&all, family, label)
            .into_iter()
            .map(|v| {
                let cells = cell(&|p, _| value(p, family, (label, &v)).map(whole));
                (format!("{what} `{v}`"), cells)
            })
            .collect::<Vec<_>>()
    };
    out.extend(counter_rows(FAMILIES[1], "outcome", "freshness checks"));
    let round = FAMILIES[2];
    for r in label_values(&all, &format!("{round}_count"), "round") {
        let cells = cell(&|p, _| histogram(p, round, ("round", &r), 0.5));
        out.push((format!("freshness rounds `{r}` (claims)"), cells));
    }
    out.extend(counter_rows(FAMILIES[3], "object", "stale-cache answers"));
    for why in label_values(&all, FAMILIES[4], "why") {
        let cells = cell(&|p, w| {
            let n = value(p, FAMILIES[4], ("why", &why)).unwrap_or(0.0)
                + value(w, FAMILIES[4], ("why", &why)).unwrap_or(0.0);
            Some(whole(n))
        });
        out.push((format!("events dropped `{why}` (whole run)"), cells));
    }
    out
}

/// A compact table of the sidecar metrics of one scenario: per contender that
/// exposes them, the measured phase (`what`, e.g. "provisioning") summed over
/// rounds, and events dropped over every phase. `None` when no contender
/// exposed any.
///
/// `per_who` holds, per contender, (the measured phase's samples, the other phases').
pub fn table(scenario: &str, what: &str, per_who: &PerWho) -> Option<String> {
    let per_who: PerWho = per_who
        .iter()
        .filter(|(_, (p, w))| !p.is_empty() || !w.is_empty())
        .map(|(w, v)| (*w, v.clone()))
        .collect();
    if per_who.is_empty() {
        return None;
    }
    let mut out = format!(
        "Sidecar metrics, `{scenario}` (its `/metrics` after each phase; {what}, every round added up; \
         histograms as count × mean, with the bucket bound holding p99 for stages, p50 for rounds):\n\n| metric |"
    );
    for w in per_who.keys() {
        let _ = write!(out, " {} |", w.label());
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(per_who.len()));
    out.push('\n');
    for (what, cells) in rows(&per_who) {
        let _ = writeln!(out, "| {what} | {} |", cells.join(" | "));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP csi_provisioner_provision_stage_seconds Seconds one step took.
# TYPE csi_provisioner_provision_stage_seconds histogram
csi_provisioner_provision_stage_seconds_sum{stage="check"} 2.0
csi_provisioner_provision_stage_seconds_count{stage="check"} 4
csi_provisioner_provision_stage_seconds_bucket{le="0.1",stage="check"} 1
csi_provisioner_provision_stage_seconds_bucket{le="1.0",stage="check"} 4
csi_provisioner_provision_stage_seconds_bucket{le="+Inf",stage="check"} 4
# TYPE csi_provisioner_freshness_checks counter
csi_provisioner_freshness_checks_total{outcome="caught_up"} 3
csi_provisioner_freshness_checks_total{outcome="alone"} 1
csi_provisioner_events_dropped_total{why="queue_full"} 2 1700000000
csi_sidecar_operations_seconds_count{method_name="/csi.v1.Controller/CreateVolume"} 9
process_resident_memory_bytes 1e7
# EOF
"#;

    #[test]
    fn keeps_only_the_families_of_the_issue() {
        let samples = parse(PAGE);
        assert_eq!(samples.len(), 8);
        assert!(
            samples
                .iter()
                .all(|s| s.name.starts_with("csi_provisioner_"))
        );
        let inf = samples
            .iter()
            .find(|s| s.labels.get("le").map(String::as_str) == Some("+Inf"))
            .unwrap();
        assert_eq!(inf.value, 4.0);
        assert_eq!(inf.labels.get("stage").map(String::as_str), Some("check"));
        let dropped = samples.last().unwrap();
        assert_eq!(dropped.name, "csi_provisioner_events_dropped_total");
        assert_eq!(dropped.value, 2.0);
    }

    #[test]
    fn a_phase_is_the_difference_of_two_scrapes_and_rounds_add_up() {
        let before = parse(PAGE);
        let after: Vec<Sample> = before
            .iter()
            .map(|s| Sample {
                value: if s.labels.get("outcome").map(String::as_str) == Some("alone") {
                    s.value + 5.0
                } else {
                    s.value
                },
                ..s.clone()
            })
            .collect();
        let phase = since(&after, &before);
        assert_eq!(phase.len(), 1);
        assert_eq!(phase[0].value, 5.0);
        let total = sum([phase.as_slice(), phase.as_slice()]);
        assert_eq!(total[0].value, 10.0);
    }

    #[test]
    fn the_table_reads_histograms_and_counters() {
        let samples = parse(PAGE);
        let mut per_who = BTreeMap::new();
        per_who.insert(Who::Upstream, (Vec::new(), Vec::new()));
        per_who.insert(Who::Ours, (samples.clone(), samples));
        let table = table("burst", "provisioning", &per_who).unwrap();
        assert!(!table.contains("upstream"), "{table}");
        assert!(
            table.contains("| stage `check` (s) | 4 × mean 0.50, p99 ≤ 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| freshness checks `caught_up` | 3 |"),
            "{table}"
        );
        assert!(
            table.contains("| events dropped `queue_full` (whole run) | 4 |"),
            "{table}"
        );
        let none = BTreeMap::from([(Who::Upstream, (Vec::new(), Vec::new()))]);
        assert_eq!(super::table("burst", "provisioning", &none), None);
    }
}
