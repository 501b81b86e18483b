//! The control plane the benchmark runs on (started with testbed/cluster.sh),
//! the identity the contenders run as, and how their API requests are counted.
//!
//! Attribution: every contender (upstream, ours, the floor) runs as the user
//! `csi-provisioner`, one at a time; the benchmark itself and
//! kube-controller-manager run as `admin`. FlowSchemas (API Priority and
//! Fairness) match that user's requests per verb and resource, and
//! kube-apiserver's own `/metrics` counts each dispatched request in
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`. The
//! FlowSchemas route to the `exempt` priority level, so counting adds no
//! queuing. Deltas of those counters around a phase are that contender's
//! requests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::json;

/// The user the contenders run as (testbed/cluster.sh's non-admin identity).
pub const CONTENDER_USER: &str = "csi-provisioner";
const FLOW_SCHEMA_PREFIX: &str = "bench-";

pub struct Cluster {
    pub dir: PathBuf,
    pub bin_dir: PathBuf,
    pub admin: Client,
    pub contender_kubeconfig: PathBuf,
    /// Started by us (and so stopped by us).
    owned: bool,
    pub repo: PathBuf,
}

impl Cluster {
    /// Uses the control plane described by `CSI_TESTBED_*` if `reuse`, else starts one
    /// in `dir` with testbed/cluster.sh (torn down by [`Cluster::down`], or by its
    /// watchdog if this process dies).
    pub async fn up(repo: &Path, dir: &Path, reuse: bool) -> anyhow::Result<Cluster> {
        Cluster::up_with(repo, dir, reuse, &[]).await
    }

    /// [`Cluster::up`] with `env` for testbed/cluster.sh (its `CSI_TESTBED_*` settings).
    pub async fn up_with(
        repo: &Path,
        dir: &Path,
        reuse: bool,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Cluster> {
        let (dir, owned) = if reuse {
            let d = std::env::var_os("CSI_TESTBED_DIR")
                .context("--reuse-cluster needs CSI_TESTBED_DIR (eval \"$(bash testbed/cluster.sh up DIR)\")")?;
            (PathBuf::from(d), false)
        } else {
            let out = Command::new("bash")
                .arg(repo.join("testbed/cluster.sh"))
                .arg("up")
                .arg(dir)
                .env("CSI_TESTBED_OWNER_PID", std::process::id().to_string())
                .envs(env.iter().copied())
                .stderr(std::process::Stdio::inherit())
                .output()
                .context("running testbed/cluster.sh up")?;
            if !out.status.success() {
                bail!("testbed/cluster.sh up {} failed", dir.display());
            }
            (dir.to_path_buf(), true)
        };
        let bin_dir = PathBuf::from(
            std::fs::read_to_string(dir.join("bin"))
                .with_context(|| format!("{}/bin: not a test bed directory", dir.display()))?
                .trim(),
        );
        let admin = client_for(&dir.join("kubeconfig")).await?;
        let cluster = Cluster {
            contender_kubeconfig: dir.join("kubeconfig-provisioner"),
            dir,
            bin_dir,
            admin,
            owned,
            repo: repo.to_path_buf(),
        };
        cluster.grant_and_count().await?;
        Ok(cluster)
    }

    /// The pids of kube-apiserver and etcd (testbed/cluster.sh's pid files):
    /// the control plane whose CPU a contender's requests cost.
    pub fn control_plane_pids(&self) -> Vec<u32> {
        ["kube-apiserver", "etcd"]
            .iter()
            .filter_map(|name| self.pid_of(name))
            .collect()
    }

    /// The pid of one of the test bed's processes (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`), from its pid file.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The size of etcd's database file (what `--quota-backend-bytes` bounds).
    pub fn etcd_db_bytes(&self) -> Option<u64> {
        std::fs::metadata(self.dir.join("etcd/member/snap/db"))
            .ok()
            .map(|m| m.len())
    }

    pub fn down(&self) {
        if self.owned {
            let _ = Command::new("bash")
                .arg(self.repo.join("testbed/cluster.sh"))
                .arg("down")
                .arg(&self.dir)
                .status();
        }
    }

    /// Lets the contender identity do anything (the benchmark measures speed, not RBAC),
    /// and installs the counting FlowSchemas.
    async fn grant_and_count(&self) -> anyhow::Result<()> {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-csi-provisioner"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": CONTENDER_USER}],
        });
        create_dynamic(
            &self.admin,
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            binding,
        )
        .await?;
        for fs in flow_schemas() {
            create_dynamic(
                &self.admin,
                "flowcontrol.apiserver.k8s.io",
                "v1",
                "FlowSchema",
                "flowschemas",
                fs,
            )
            .await?;
        }
        Ok(())
    }

    /// The contender user's requests so far, by `verb resource`.
    pub async fn request_counts(&self) -> anyhow::Result<Counts> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        let text = self
            .admin
            .request_text(req)
            .await
            .context("reading kube-apiserver /metrics")?;
        Ok(parse_dispatched(&text))
    }
}

pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

async fn create_dynamic(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    body: serde_json::Value,
) -> anyhow::Result<()> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let obj: DynamicObject = serde_json::from_value(body)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e)
            .with_context(|| format!("creating {kind} {}", obj.metadata.name.unwrap_or_default())),
    }
}

const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// (label, api groups, resources). `other` catches every remaining resource.
const RESOURCES: [(&str, &[&str], &[&str]); 6] = [
    (
        "persistentvolumes",
        &[""],
        &["persistentvolumes", "persistentvolumes/status"],
    ),
    (
        "persistentvolumeclaims",
        &[""],
        &["persistentvolumeclaims", "persistentvolumeclaims/status"],
    ),
    ("events", &["", "events.k8s.io"], &["events"]),
    ("leases", &["coordination.k8s.io"], &["leases"]),
    ("storageclasses", &["storage.k8s.io"], &["storageclasses"]),
    ("other", &["*"], &["*"]),
];

fn flow_schemas() -> Vec<serde_json::Value> {
    let subject = json!([{"kind": "User", "user": {"name": CONTENDER_USER}}]);
    let mut out = Vec::new();
    for verb in VERBS {
        for (label, groups, resources) in RESOURCES {
            out.push(json!({
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": format!("{FLOW_SCHEMA_PREFIX}{verb}.{label}")},
                "spec": {
                    // Below every built-in schema but `exempt`/`probes`; `other` after the specific ones.
                    "matchingPrecedence": if label == "other" { 70 } else { 60 },
                    "priorityLevelConfiguration": {"name": "exempt"},
                    "rules": [{
                        "subjects": subject,
                        "resourceRules": [{
                            "verbs": [verb], "apiGroups": groups, "resources": resources,
                            "clusterScope": true, "namespaces": ["*"],
                        }],
                    }],
                },
            }));
        }
    }
    out.push(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": format!("{FLOW_SCHEMA_PREFIX}nonresource.other")},
        "spec": {
            "matchingPrecedence": 70,
            "priorityLevelConfiguration": {"name": "exempt"},
            "rules": [{"subjects": subject, "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}],
        },
    }));
    out
}

/// Requests by `"verb resource"` (e.g. `"create persistentvolumes"`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Counts(pub BTreeMap<String, f64>);

impl Counts {
    /// `self - before`, dropping zeroes.
    pub fn since(&self, before: &Counts) -> Counts {
        Counts(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    pub fn total(&self) -> f64 {
        // `+ 0.0` turns the empty sum (-0.0) into 0.
        self.0.values().sum::<f64>() + 0.0
    }

    /// Summed by verb.
    pub fn by_verb(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            let verb = k.split(' ').next().unwrap_or(k).to_string();
            *out.entry(verb).or_insert(0.0) += v;
        }
        out
    }

    pub fn plus(&self, other: &Counts) -> Counts {
        let mut out = self.0.clone();
        for (k, v) in &other.0 {
            *out.entry(k.clone()).or_insert(0.0) += v;
        }
        Counts(out)
    }
}

/// Reads our FlowSchemas' `apiserver_flowcontrol_dispatched_requests_total`.
pub fn parse_dispatched(metrics: &str) -> Counts {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_flowcontrol_dispatched_requests_total{")
        else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(schema) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("flow_schema=\""))
            .and_then(|s| s.strip_suffix('"'))
        else {
            continue;
        };
        let Some(key) = schema.strip_prefix(FLOW_SCHEMA_PREFIX) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = key.replacen('.', " ", 1);
        *out.entry(key).or_insert(0.0) += value;
    }
    Counts(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_our_flow_schemas() {
        let text = "\
# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-create.persistentvolumes\",priority_level=\"exempt\"} 7
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"bench-watch.other\",priority_level=\"exempt\"} 2
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"exempt\",priority_level=\"exempt\"} 900
apiserver_flowcontrol_current_executing_requests{flow_schema=\"bench-get.other\",priority_level=\"exempt\"} 1
";
        let c = parse_dispatched(text);
        assert_eq!(c.0.len(), 2);
        assert_eq!(c.0["create persistentvolumes"], 7.0);
        assert_eq!(c.0["watch other"], 2.0);
    }

    #[test]
    fn deltas_and_verbs() {
        let before = Counts(
            [
                ("create events".to_string(), 2.0),
                ("get persistentvolumes".to_string(), 1.0),
            ]
            .into(),
        );
        let after = Counts(
            [
                ("create events".to_string(), 5.0),
                ("get persistentvolumes".to_string(), 1.0),
                ("create persistentvolumes".to_string(), 4.0),
            ]
            .into(),
        );
        let d = after.since(&before);
        assert_eq!(d.total(), 7.0);
        assert_eq!(d.0.len(), 2, "zero deltas are dropped: {d:?}");
        assert_eq!(d.by_verb()["create"], 7.0);
    }

    #[test]
    fn one_schema_per_verb_and_resource_plus_non_resource() {
        let fs = flow_schemas();
        assert_eq!(fs.len(), VERBS.len() * RESOURCES.len() + 1);
        let names: std::collections::BTreeSet<_> = fs
            .iter()
            .map(|f| f["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names.len(), fs.len());
        assert!(names.contains("bench-patch.persistentvolumeclaims"));
    }
}
