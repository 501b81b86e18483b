//! deploy/monitoring names only what the sidecar exports: every metric in the
//! Grafana dashboard's queries and the alert rules' expressions, and every
//! label they select, group or template by, is checked against the registry
//! the sidecar serves on /metrics (`Metrics::register`, as `run` builds it),
//! scraped in both formats Prometheus may ask for, and against what
//! `csi-provisioner audit --output=prometheus` prints (its alerts). A
//! dashboard that names a metric we do not export fails here, not on
//! someone's empty panel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use csi_provisioner::audit::findings::Report;
use csi_provisioner::audit::prometheus as audit;
use csi_provisioner::metrics::{
    ClaimGauges, ClaimLabels, CsiOperationLabels, LeaseLabels, Metrics, StageLabels, VolumeLabels,
};
use prometheus_client::registry::Registry;

const DASHBOARD: &str = "deploy/monitoring/grafana-dashboard.json";
const ALERTS: &str = "deploy/monitoring/alerts.yaml";

/// Labels Prometheus gives every scraped target (the Prometheus operator adds
/// the Kubernetes ones): not ours to export, but fine to select and group by.
const TARGET_LABELS: [&str; 7] = [
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "endpoint",
    "service",
];

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// What the sidecar exports
// ---------------------------------------------------------------------------

/// Sample names (`foo_total`, `foo_bucket`, ...) and the label names of each.
type Exported = BTreeMap<String, BTreeSet<String>>;

/// The registry `run` serves, with one series in every family so that each
/// family's sample names and label names show in a scrape.
fn exported() -> Exported {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry);
    m.csi_operations
        .get_or_create(&CsiOperationLabels {
            driver_name: "d".into(),
            method_name: "/csi.v1.Controller/CreateVolume".into(),
            grpc_status_code: "OK".into(),
            migrated: None,
        })
        .observe(0.1);
    let claim = ClaimLabels {
        class: "c".into(),
        source: String::new(),
    };
    m.provision_total.get_or_create(&claim).inc();
    m.provision_failed_total.get_or_create(&claim).inc();
    m.provision_duration.get_or_create(&claim).observe(1.0);
    let volume = VolumeLabels { class: "c".into() };
    m.delete_total.get_or_create(&volume).inc();
    m.delete_failed_total.get_or_create(&volume).inc();
    m.delete_duration.get_or_create(&volume).observe(1.0);
    let lease = LeaseLabels { name: "l".into() };
    m.leader_status.get_or_create(&lease).set(1);
    m.leader_slowpath.get_or_create(&lease).inc();
    let _claims = m.work_queue("claims");
    m.provision_stage
        .get_or_create(&StageLabels {
            stage: "check".into(),
        })
        .observe(0.005);
    m.stale("claim");
    m.read_claims_from(ClaimGauges::default);

    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    let (a, b) = (samples(&openmetrics), samples(&text));
    // Prometheus asks for OpenMetrics first and falls back to the text format:
    // a name the dashboards use must be there in both.
    let mut exported: Exported = a
        .into_iter()
        .filter_map(|(name, labels)| {
            let other = b.get(&name)?;
            Some((name, labels.intersection(other).cloned().collect()))
        })
        .collect();
    exported.extend(audit_exported());
    exported
}

/// What `audit --output=prometheus` prints (node-exporter's textfile collector serves it as
/// it is), for a report and for a run that failed.
fn audit_exported() -> Exported {
    let report = Report {
        driver: "d".into(),
        list_volumes: true,
        backend_volumes: Some(1),
        persistent_volumes: 1,
        claims_holding_intent: 0,
        intent_older_than: std::time::Duration::from_secs(600),
        rechecked_after: None,
        cleared_on_recheck: 0,
        findings: vec![],
        in_progress: vec![],
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut exported = samples(&audit::exposition(&report, now));
    for (name, labels) in samples(&audit::failure(now)) {
        exported.entry(name).or_default().extend(labels);
    }
    exported
}

/// The samples of a scrape by name, with their label names. Panics on a
/// family without samples: it would hide its labels, so populate it above.
fn samples(scrape: &str) -> Exported {
    let mut out = Exported::new();
    for line in scrape.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        out.entry(name.to_string())
            .or_default()
            .extend(series_labels(labels));
    }
    for line in scrape.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let family = family.split(' ').next().unwrap_or_default();
            let of_family = |sample: &str| {
                sample.strip_prefix(family).is_some_and(|suffix| {
                    [
                        "", "_total", "_bucket", "_sum", "_count", "_created", "_info",
                    ]
                    .contains(&suffix)
                })
            };
            assert!(
                out.keys().any(|s| of_family(s)),
                "{family} has no sample: give it one in exported() so its labels show:\n{scrape}"
            );
        }
    }
    out
}

/// Label names of `a="x",b="y"` (values here have no quotes or commas).
fn series_labels(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split("\",")
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.split_once('=').map(|(k, _)| k.to_string()))
}

// ---------------------------------------------------------------------------
// What a PromQL expression names
// ---------------------------------------------------------------------------

/// The metrics and labels one PromQL expression names.
#[derive(Debug, Default, PartialEq)]
struct Names {
    /// Metric name and the label names of its matchers, in order of appearance.
    selectors: Vec<(String, Vec<String>)>,
    /// Labels of `by (...)`: what the result keeps.
    by: Vec<String>,
    /// Labels of `without`, `on`, `ignoring`, `group_left`, `group_right`.
    other: Vec<String>,
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// What `expr` names. Enough PromQL for dashboards and alert rules:
/// selectors with matchers, functions, aggregations with `by`/`without`,
/// vector matching, ranges, `offset`, numbers, strings and Grafana's `$vars`.
/// `label_values(selector, label)` (a Grafana variable query) is understood too.
fn names(expr: &str) -> Names {
    if let Some(inner) = expr
        .trim()
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
    {
        let (selector, label) = inner.rsplit_once(',').unwrap_or(("", inner));
        let mut n = names(selector);
        n.by.push(label.trim().to_string());
        return n;
    }
    let chars: Vec<char> = expr.chars().collect();
    let mut n = Names::default();
    let mut i = 0;
    let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_space = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = end_of_string(&chars, i),
            '[' => {
                i = chars[i..]
                    .iter()
                    .position(|&c| c == ']')
                    .map_or(chars.len(), |p| i + p + 1)
            }
            '$' => {
                i += 1;
                while i < chars.len() && (word_char(chars[i]) || chars[i] == '{' || chars[i] == '}')
                {
                    i += 1;
                }
            }
            '{' => {
                // Matchers without a metric name before them (`{__name__=~...}`).
                let (labels, end) = matchers(&chars, i);
                n.selectors.push((String::new(), labels));
                i = end;
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (word_char(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && word_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = skip_space(i);
                let followed_by = chars.get(next).copied();
                if LABEL_LISTS.contains(&word.as_str()) {
                    if followed_by == Some('(') {
                        let close = chars[next..]
                            .iter()
                            .position(|&c| c == ')')
                            .map_or(chars.len(), |p| next + p);
                        let list: String = chars[next + 1..close].iter().collect();
                        let labels = list
                            .split(',')
                            .map(|l| l.trim().to_string())
                            .filter(|l| !l.is_empty());
                        if word == "by" {
                            n.by.extend(labels);
                        } else {
                            n.other.extend(labels);
                        }
                        i = close + 1;
                    }
                } else if word == "offset" {
                    // The duration after it.
                    i = next;
                    while i < chars.len() && word_char(chars[i]) {
                        i += 1;
                    }
                } else if followed_by == Some('(')
                    || AGGREGATIONS.contains(&word.as_str())
                    || KEYWORDS.contains(&word.as_str())
                {
                    // A function, an aggregation (`sum by (x) (...)`) or an operator.
                } else if followed_by == Some('{') {
                    let (labels, end) = matchers(&chars, next);
                    n.selectors.push((word, labels));
                    i = end;
                } else {
                    n.selectors.push((word, Vec::new()));
                }
            }
            _ => i += 1,
        }
    }
    n
}

/// Index after the string literal that starts at `start`.
fn end_of_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The label names of the matchers `{a="x", b=~"y"}` starting at `open`, and
/// the index after the closing brace.
fn matchers(chars: &[char], open: usize) -> (Vec<String>, usize) {
    let mut labels = Vec::new();
    let mut i = open + 1;
    let mut current = String::new();
    while i < chars.len() && chars[i] != '}' {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = end_of_string(chars, i);
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            current.push(c);
        } else if matches!(c, '=' | '!') && !current.is_empty() {
            labels.push(std::mem::take(&mut current));
        } else if !c.is_whitespace() {
            current.clear();
        }
        i += 1;
    }
    (labels, i + 1)
}

// ---------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------

/// What is wrong with `expr` (from `place`) against `exported`; empty when
/// it names only exported metrics and labels.
fn problems(place: &str, expr: &str, exported: &Exported) -> Vec<String> {
    let n = names(expr);
    let mut out = Vec::new();
    if n.selectors.is_empty() {
        out.push(format!("{place}: no metric in {expr:?}"));
    }
    let target = |l: &str| TARGET_LABELS.contains(&l);
    let mut known_labels = BTreeSet::new();
    for (metric, matchers) in &n.selectors {
        let Some(labels) = exported.get(metric) else {
            out.push(format!(
                "{place}: {metric:?} is not a metric we export (in {expr:?})"
            ));
            continue;
        };
        known_labels.extend(labels.iter().cloned());
        for label in matchers {
            if !labels.contains(label) && !target(label) {
                out.push(format!(
                    "{place}: {metric} has no label {label:?} (it has {labels:?})"
                ));
            }
        }
    }
    for label in n.by.iter().chain(&n.other) {
        if !known_labels.contains(label) && !target(label) {
            out.push(format!(
                "{place}: no metric of {expr:?} has the label {label:?}"
            ));
        }
    }
    out
}

/// Every string under a key `expr` (panel targets) and every variable query
/// of the dashboard, with where it is.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let here = match map.get("title").and_then(|t| t.as_str()) {
                        Some(title) => format!("{path} > {title:?}"),
                        None => path.to_string(),
                    };
                    if k == "expr"
                        && let Some(expr) = v.as_str()
                    {
                        out.push((here.clone(), expr.to_string()));
                    }
                    walk(v, &here, out);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, path, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], "panels", &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let query = var["query"]["query"]
                .as_str()
                .or(var["query"].as_str())
                .unwrap_or_else(|| panic!("variable without a query: {var}"));
            out.push((format!("variable {}", var["name"]), query.to_string()));
        }
    }
    out
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// The rules of the PrometheusRule.
fn alert_rules() -> Vec<serde_json::Value> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&read(ALERTS)).unwrap_or_else(|e| panic!("{ALERTS}: {e}"));
    let docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 1, "one PrometheusRule");
    assert_eq!(docs[0]["kind"], "PrometheusRule");
    assert_eq!(docs[0]["apiVersion"], "monitoring.coreos.com/v1");
    docs[0]["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

#[test]
fn the_dashboard_names_only_metrics_and_labels_we_export() {
    let exported = exported();
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 10, "{queries:?}");
    let found: Vec<String> = queries
        .iter()
        .flat_map(|(place, expr)| problems(place, expr, &exported))
        .collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_dashboard_shows_what_an_operator_asks_first() {
    let queries: Vec<String> = dashboard_queries(&dashboard())
        .into_iter()
        .map(|(_, q)| q)
        .collect();
    let uses = |metric: &str| queries.iter().any(|q| q.contains(metric));
    for metric in [
        // provisioning rate, failures and latency
        "controller_persistentvolumeclaim_provision_total",
        "controller_persistentvolumeclaim_provision_failed_total",
        "controller_persistentvolumeclaim_provision_duration_seconds_bucket",
        "controller_persistentvolume_delete_total",
        // the driver's answers by gRPC code
        "csi_sidecar_operations_seconds_count",
        // the leader
        "leader_election_master_status",
        // work in flight
        "workqueue_longest_running_processor_seconds",
        "workqueue_unfinished_work_seconds",
    ] {
        assert!(uses(metric), "no panel shows {metric}");
    }
    assert!(queries.iter().any(|q| q.contains("grpc_status_code")));
    assert!(queries.iter().any(|q| q.contains("by (class)")));
}

#[test]
fn every_panel_has_a_unique_id_and_the_chosen_data_source() {
    let dashboard = dashboard();
    assert_eq!(dashboard["uid"], "csi-provisioner");
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{panel}");
            assert!(target["refId"].is_string(), "{panel}");
        }
    }
}

#[test]
fn the_alert_rules_name_only_metrics_and_labels_we_export() {
    let exported = exported();
    let rules = alert_rules();
    assert!(rules.len() >= 5, "{rules:?}");
    let mut found = Vec::new();
    for rule in &rules {
        let alert = rule["alert"].as_str().expect("every rule is an alert");
        let expr = rule["expr"].as_str().expect("expr");
        found.extend(problems(alert, expr, &exported));
        // The annotations' {{ $labels.x }} are labels the result keeps.
        let kept = names(expr).by;
        for text in rule["annotations"]
            .as_object()
            .expect("annotations")
            .values()
        {
            let text = text.as_str().unwrap_or_default();
            for label in text.split("$labels.").skip(1) {
                let label: String = label
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !kept.contains(&label) {
                    found.push(format!(
                        "{alert}: $labels.{label} is not kept by {expr:?} (by: {kept:?})"
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Whether `expr` selects `metric`.
fn selects(expr: &str, metric: &str) -> bool {
    names(expr).selectors.iter().any(|(name, _)| name == metric)
}

#[test]
fn an_alert_fires_on_each_kind_of_audit_finding() {
    let rules = alert_rules();
    let on_findings = rules
        .iter()
        .find(|r| {
            r["expr"]
                .as_str()
                .is_some_and(|e| selects(e, "csi_provisioner_audit_findings"))
        })
        .expect("an alert on csi_provisioner_audit_findings");
    let expr = on_findings["expr"].as_str().unwrap();
    assert!(
        names(expr).by.iter().any(|l| l == "kind"),
        "{expr}: one alert per kind"
    );
    for kind in audit::FINDING_KINDS {
        let description = on_findings["annotations"]["description"].as_str().unwrap();
        assert!(description.contains(kind), "{kind} not explained");
    }
    let watched = |metric: &str| {
        rules
            .iter()
            .any(|r| r["expr"].as_str().is_some_and(|e| selects(e, metric)))
    };
    assert!(watched("csi_provisioner_audit_success"), "a failing audit");
    assert!(
        watched("csi_provisioner_audit_last_run_timestamp_seconds"),
        "an audit not run"
    );
}

#[test]
fn every_alert_says_how_long_how_bad_and_what_to_do() {
    let mut names = BTreeSet::new();
    for rule in alert_rules() {
        let alert = rule["alert"].as_str().expect("alert").to_string();
        assert!(names.insert(alert.clone()), "{alert} twice");
        assert!(rule["for"].is_string(), "{alert}: no `for`");
        assert!(
            matches!(
                rule["labels"]["severity"].as_str(),
                Some("critical" | "warning" | "info")
            ),
            "{alert}: severity"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{alert}: no {key}"
            );
        }
    }
}

/// The check itself: a name we do not export, or a label a metric does not
/// have, is found, and each kind of PromQL is read right.
#[test]
fn the_check_finds_a_metric_or_label_we_do_not_export() {
    let exported = exported();
    let wrong = [
        "rate(csi_no_such_metric_total[5m])",
        // A counter without its `_total`, as a dashboard for another client might write it.
        "rate(controller_persistentvolumeclaim_provision[5m])",
        // A histogram's buckets under a name that is not a histogram.
        "rate(controller_persistentvolumeclaim_provision_total_bucket[5m])",
        "sum by (storage_class) (rate(controller_persistentvolumeclaim_provision_total[5m]))",
        r#"csi_sidecar_operations_seconds_count{grpc_code="OK"}"#,
        r#"label_values(csi_sidecar_operations_seconds_count, driver)"#,
    ];
    for expr in wrong {
        assert!(
            !problems("test", expr, &exported).is_empty(),
            "{expr} passed"
        );
    }
    let right = [
        r#"histogram_quantile(0.99, sum by (method_name, le) (rate(csi_sidecar_operations_seconds_bucket{driver_name=~"$driver", job=~"$job"}[$__rate_interval])))"#,
        r#"sum(leader_election_master_status{namespace=~"$namespace"}) or vector(0)"#,
        "count by (namespace) (workqueue_adds_total{name=\"claims\"} offset 5m) unless on (namespace) process_open_fds",
        "label_values(csi_sidecar_operations_seconds_count{job=~\"$job\"}, driver_name)",
    ];
    for expr in right {
        let found = problems("test", expr, &exported);
        assert!(found.is_empty(), "{expr}: {found:?}");
    }
}

#[test]
fn promql_names_are_read_as_prometheus_reads_them() {
    let n = names(
        r#"sum by (class, source) (rate(a_total{x="1, y=\"2\"", z!~"{w}"}[5m] offset 1h)) / ignoring (q) b * 2.5e3 > bool 1"#,
    );
    assert_eq!(
        n.selectors,
        vec![
            (
                "a_total".to_string(),
                vec!["x".to_string(), "z".to_string()]
            ),
            ("b".to_string(), vec![]),
        ]
    );
    assert_eq!(n.by, ["class", "source"]);
    assert_eq!(n.other, ["q"]);
}

/// The memory alert warns at 80 % of the limit deploy/kubernetes/deployment.yaml gives the
/// sidecar's container, and selects that container by its name: raising one without the other
/// would silence the alert or make it fire on a healthy replica.
#[test]
fn the_memory_alert_is_set_at_80_percent_of_the_deployments_limit() {
    const DEPLOYMENT: &str = "deploy/kubernetes/deployment.yaml";
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&read(DEPLOYMENT))
        .unwrap_or_else(|e| panic!("{DEPLOYMENT}: {e}"));
    let container = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|c| {
            c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("csi-provisioner"))
        })
        .expect("the sidecar's container in the Deployment");
    let name = container["name"].as_str().expect("a container name");
    let limit = container["resources"]["limits"]["memory"]
        .as_str()
        .expect("a memory limit");
    let mebibytes: u64 = limit
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{limit}: a limit in Mi"));
    let rules = alert_rules();
    let rule = rules
        .iter()
        .find(|r| r["alert"] == "CSIProvisionerMemoryNearLimit")
        .expect("a memory alert");
    let expr = rule["expr"].as_str().unwrap();
    assert!(
        selects(expr, "process_resident_memory_bytes"),
        "{expr}: on the resident memory"
    );
    assert!(
        expr.contains(&format!("container=\"{name}\"")),
        "{expr}: selects the container {name}"
    );
    let threshold = expr
        .rsplit_once("> 0.8 *")
        .map(|(_, n)| n.trim())
        .unwrap_or_else(|| panic!("{expr}: `> 0.8 * <limit in bytes>`"));
    assert_eq!(
        threshold,
        (mebibytes * 1024 * 1024).to_string(),
        "{expr}: 80 % of {limit}"
    );
}
