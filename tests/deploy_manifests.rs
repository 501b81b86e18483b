//! The manifests in deploy/kubernetes are real: the API server accepts every
//! object (server-side dry run), the Deployment's flags are ones our binary
//! takes, its probe points at an endpoint those flags turn on, and it runs as
//! the image's user (root, as upstream's); the audit's CronJob runs flags the
//! audit takes, as the audit's ServiceAccount, writing where it mounts.

mod support;

use std::path::Path;

use csi_provisioner::audit::args::{self as audit_args, AuditConfig, OutputFormat};
use csi_provisioner::config::{self, Config, Env};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde::de::DeserializeOwned;
use support::cluster;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn documents(path: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(&read(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn typed<K: DeserializeOwned>(doc: &serde_json::Value) -> K {
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", doc["kind"]))
}

fn the_deployment() -> Deployment {
    let docs = documents("deploy/kubernetes/deployment.yaml");
    assert_eq!(docs.len(), 1, "one Deployment");
    typed(&docs[0])
}

#[tokio::test]
async fn the_api_server_accepts_every_object_of_the_manifests() {
    let client = cluster().await.client.clone();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    // Named after upstream's objects, which may exist already (the tests apply the RBAC):
    // only "already exists" is an acceptable refusal.
    let accepted = |r: Result<(), kube::Error>, what: &str| match r {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("the API server refused {what}: {e}"),
    };
    let mut kinds = Vec::new();
    for path in [
        "deploy/kubernetes/rbac.yaml",
        "deploy/kubernetes/deployment.yaml",
        "deploy/kubernetes/release-intent-policy.yaml",
        "deploy/kubernetes/audit-rbac.yaml",
        "deploy/kubernetes/audit-cronjob.yaml",
    ] {
        for doc in documents(path) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
            let what = format!("{kind} in {path}");
            let r = match kind.as_str() {
                "ServiceAccount" => Api::<ServiceAccount>::namespaced(client.clone(), ns)
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "Role" => Api::<Role>::namespaced(client.clone(), ns)
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "RoleBinding" => Api::<RoleBinding>::namespaced(client.clone(), ns)
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "Deployment" => Api::<Deployment>::namespaced(client.clone(), ns)
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "CronJob" => Api::<CronJob>::namespaced(client.clone(), ns)
                    .create(&dry_run, &typed(&doc))
                    .await
                    .map(drop),
                "MutatingAdmissionPolicy" | "MutatingAdmissionPolicyBinding" => {
                    let resource = kube::api::ApiResource {
                        group: "admissionregistration.k8s.io".into(),
                        version: "v1".into(),
                        api_version: "admissionregistration.k8s.io/v1".into(),
                        kind: kind.clone(),
                        plural: if kind == "MutatingAdmissionPolicy" {
                            "mutatingadmissionpolicies".into()
                        } else {
                            "mutatingadmissionpolicybindings".into()
                        },
                    };
                    Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource)
                        .create(&dry_run, &typed(&doc))
                        .await
                        .map(drop)
                }
                other => panic!("{path}: unexpected kind {other}"),
            };
            accepted(r, &what);
            kinds.push(kind);
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "CronJob",
            "Deployment",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount",
            "ServiceAccount"
        ]
    );
}

#[test]
fn the_deployment_runs_our_flags_as_the_images_user_with_the_shipped_service_account() {
    let deployment = the_deployment();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let sidecar = pod
        .containers
        .iter()
        .find(|c| c.name == "csi-provisioner")
        .expect("the sidecar container");

    // The flags, with the container's $(ADDRESS) expanded as the kubelet does.
    let address = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "ADDRESS")
        .and_then(|e| e.value.clone())
        .expect("ADDRESS");
    let mut argv = vec!["csi-provisioner".to_string()];
    argv.extend(
        sidecar
            .args
            .iter()
            .flatten()
            .map(|a| a.replace("$(ADDRESS)", &address)),
    );
    let args = config::parse_from(argv.clone()).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let env = Env {
        service_account_namespace: Some("default".into()),
        ..Env::from_lookup(|_| None)
    };
    let cfg = Config::from_args(&args, &env).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert_eq!(cfg.csi_socket, Path::new(&address));
    assert!(
        cfg.leader_election.is_some(),
        "replicated: leader election on"
    );

    // The liveness probe asks an endpoint those flags serve, on the declared port.
    let http = cfg.http.expect("--http-endpoint");
    assert!(http.leader_election_health);
    let probe = sidecar
        .liveness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("an HTTP liveness probe");
    assert_eq!(probe.path.as_deref(), Some("/healthz/leader-election"));
    let port = sidecar
        .ports
        .iter()
        .flatten()
        .find(|p| {
            matches!(&probe.port,
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n)
                    if p.name.as_deref() == Some(n.as_str()))
        })
        .expect("the probe's named port");
    assert!(http.address.ends_with(&format!(":{}", port.container_port)));

    // The socket directory is shared with the driver.
    let mount = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| address.starts_with(&m.mount_path))
            .map(|m| m.name.clone())
    };
    let driver = pod
        .containers
        .iter()
        .find(|c| c.name != "csi-provisioner")
        .expect("a driver container");
    assert_eq!(mount(sidecar), mount(driver), "one socket directory");
    assert!(mount(sidecar).is_some());

    // The image's user, root as upstream's (no USER line), is left alone: a driver socket
    // created by root accepts it, and `runAsNonRoot` without a `runAsUser` would make the
    // kubelet refuse to start a root image.
    let dockerfile = read("Dockerfile");
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.trim_start().starts_with("USER ")),
        "the image runs as root, as upstream's"
    );
    for security in [
        pod.security_context.clone(),
        sidecar
            .security_context
            .as_ref()
            .map(|c| k8s_openapi::api::core::v1::PodSecurityContext {
                run_as_user: c.run_as_user,
                run_as_non_root: c.run_as_non_root,
                ..Default::default()
            }),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(security.run_as_user, None);
        assert_ne!(security.run_as_non_root, Some(true));
    }

    // The ServiceAccount is the one rbac.yaml creates and binds.
    let service_account = documents("deploy/kubernetes/rbac.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str().map(str::to_string));
    assert_eq!(pod.service_account_name, service_account);
}

#[test]
fn the_audit_cronjob_writes_prometheus_series_as_the_audits_service_account() {
    let docs = documents("deploy/kubernetes/audit-cronjob.yaml");
    assert_eq!(docs.len(), 1, "one CronJob");
    let cron: CronJob = typed(&docs[0]);
    let job = cron.spec.job_template.spec.unwrap();
    let pod = job.template.spec.unwrap();
    let account = documents("deploy/kubernetes/audit-rbac.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .expect("the audit's ServiceAccount");
    assert_eq!(
        pod.service_account_name.as_deref(),
        account["metadata"]["name"].as_str()
    );
    assert_eq!(
        cron.metadata.namespace.as_deref(),
        account["metadata"]["namespace"].as_str()
    );

    // The flags, as the audit parses them: series into a file on a mounted directory.
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert_eq!(args[0], "audit");
    let argv =
        std::iter::once("csi-provisioner audit".to_string()).chain(args[1..].iter().cloned());
    let parsed =
        audit_args::parse_from(argv).unwrap_or_else(|e| panic!("{}", config::error_line(&e)));
    let cfg = AuditConfig::from_args(&parsed, &Env::default()).unwrap();
    assert_eq!(cfg.output, OutputFormat::Prometheus);
    let file = cfg.output_file.expect("--output-file");
    assert_eq!(
        file.extension().and_then(|e| e.to_str()),
        Some("prom"),
        "the textfile collector reads *.prom"
    );
    let mounted = |path: &Path| {
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| path.starts_with(&m.mount_path))
    };
    assert!(mounted(&file), "{} is on no mount", file.display());
    assert!(
        mounted(&cfg.csi_socket),
        "{} is on no mount",
        cfg.csi_socket.display()
    );
    // Findings exit 0: a failed Job would be retried and alert a second time.
    assert_eq!(job.backoff_limit, Some(0));
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
}

/// Every (API group, resource, verb) a role's rules grant.
fn grants(
    rules: Option<&[k8s_openapi::api::rbac::v1::PolicyRule]>,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for rule in rules.unwrap_or_default() {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// What our rbac.yaml may grant beyond upstream v6.4's file (its optional rules uncommented), and
/// the README's RBAC table must name the feature that needs each.
const BEYOND_UPSTREAM: [(&str, &str, &str); 4] = [
    ("storage.k8s.io", "volumeattributesclasses", "get"),
    ("", "namespaces", "get"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
];

/// A driver's chart carries upstream's RBAC, and swapping the image must not need more: our file
/// grants nothing upstream v6.4's lacks but what the README's RBAC table says an opt-in feature
/// (or a kind of claim) needs. In particular no `patch` on claims or snapshots, where upstream
/// grants `update` only.
#[test]
fn our_rbac_grants_nothing_upstreams_lacks_but_what_the_readme_names() {
    let ours = support::ShippedRbac::load();
    let upstream = support::ShippedRbac::upstream();
    let readme = read("README.md");
    let table = readme
        .split("\n## RBAC\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README.md has an `## RBAC` section");
    for (what, ours, theirs) in [
        (
            "ClusterRole",
            grants(ours.cluster_role.rules.as_deref()),
            grants(upstream.cluster_role.rules.as_deref()),
        ),
        (
            "Role",
            grants(ours.role.rules.as_deref()),
            grants(upstream.role.rules.as_deref()),
        ),
    ] {
        for grant in &ours {
            if theirs.contains(grant) {
                continue;
            }
            let (group, resource, verb) = (&grant.0, &grant.1, &grant.2);
            assert!(
                BEYOND_UPSTREAM.contains(&(group.as_str(), resource.as_str(), verb.as_str())),
                "our {what} grants {verb:?} on {resource:?} ({group:?}), which upstream v6.4's \
                 rbac.yaml does not"
            );
            assert!(
                table.contains(&format!("`{resource}`")) && table.contains(&format!("`{verb}`")),
                "README.md's RBAC table does not say what needs {verb:?} on {resource:?}"
            );
        }
    }
}
