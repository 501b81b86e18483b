//! The sidecar runs in the tests under the RBAC we ship: the ClusterRole and the leader-election
//! Role of `deploy/kubernetes/rbac.yaml`, parsed from the file and bound to the test bed's
//! non-admin user `csi-provisioner` instead of the ServiceAccount. A rule missing from the file
//! therefore fails the test whose sidecar needed it.
//!
//! A drop-in must also run under the RBAC upstream ships, which drivers' charts carry:
//! [`Rbac::Upstream`] is external-provisioner v6.4.0's `deploy/kubernetes/rbac.yaml`, read
//! verbatim from its Go module (the test bed copies it), with the optional rules uncommented as a
//! driver needing them would (secrets, referencegrants) and nothing else changed but the objects'
//! names (so that it does not overwrite ours on the shared control plane); it is bound to the
//! test bed's user `csi-provisioner-upstream-rbac`.
//!
//! The ClusterRole (and its binding) is applied once per test binary; the Role and RoleBinding
//! go into every namespace a test uses for its Lease ([`grant_lease_role`]). Everything is
//! server-side applied, so test binaries sharing a control plane converge on the same objects.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::OnceCell;

use super::{cluster, wait_for};

/// The test bed's non-admin identity (`testbed/cluster.sh`, `kubeconfig-provisioner`).
pub const PROVISIONER_USER: &str = "csi-provisioner";
/// The test bed's identity for upstream's RBAC (`kubeconfig-upstream-rbac`).
pub const UPSTREAM_RBAC_USER: &str = "csi-provisioner-upstream-rbac";
/// What the upstream RBAC's object names get, so that they are not ours.
const UPSTREAM_SUFFIX: &str = "-upstream-v6.4";
/// The rules upstream's file ships commented out that a driver needing them uncomments: secrets
/// (provisioning secrets) and referencegrants (cross-namespace data sources).
const UPSTREAM_OPTIONAL: [&str; 2] = ["secrets", "referencegrants"];

/// Which RBAC a sidecar runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rbac {
    /// Ours: deploy/kubernetes/rbac.yaml, as user [`PROVISIONER_USER`].
    Shipped,
    /// Upstream v6.4.0's deploy/kubernetes/rbac.yaml, as user [`UPSTREAM_RBAC_USER`].
    Upstream,
}

impl Rbac {
    fn user(self) -> &'static str {
        match self {
            Rbac::Shipped => PROVISIONER_USER,
            Rbac::Upstream => UPSTREAM_RBAC_USER,
        }
    }

    fn load(self) -> ShippedRbac {
        match self {
            Rbac::Shipped => ShippedRbac::load(),
            Rbac::Upstream => ShippedRbac::upstream(),
        }
    }
}
/// The namespace a sidecar without `--leader-election-namespace` or `POD_NAMESPACE` uses.
pub const DEFAULT_LEASE_NAMESPACE: &str = "default";

const FIELD_MANAGER: &str = "csi-provisioner-tests";
const RBAC_API_GROUP: &str = "rbac.authorization.k8s.io";

/// The objects of `deploy/kubernetes/rbac.yaml` the tests apply.
pub struct ShippedRbac {
    pub cluster_role: ClusterRole,
    pub cluster_role_binding: ClusterRoleBinding,
    pub role: Role,
    pub role_binding: RoleBinding,
}

impl ShippedRbac {
    /// Reads and checks the manifest: one ServiceAccount, ClusterRole, ClusterRoleBinding, Role
    /// and RoleBinding, the bindings pointing at the roles of the file.
    pub fn load() -> ShippedRbac {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/rbac.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        ShippedRbac::parse(&text)
    }

    /// Upstream v6.4.0's file as the test bed copied it from the release's Go module, its
    /// optional rules uncommented, its objects renamed with [`UPSTREAM_SUFFIX`].
    pub fn upstream() -> ShippedRbac {
        let path = super::testbed_bin("upstream-rbac.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut rbac = ShippedRbac::parse(&uncomment_rules(&text, &UPSTREAM_OPTIONAL));
        let rename = |name: &mut Option<String>| {
            *name = name.as_ref().map(|n| format!("{n}{UPSTREAM_SUFFIX}"));
        };
        rename(&mut rbac.cluster_role.metadata.name);
        rename(&mut rbac.cluster_role_binding.metadata.name);
        rbac.cluster_role_binding.role_ref.name += UPSTREAM_SUFFIX;
        rename(&mut rbac.role.metadata.name);
        rename(&mut rbac.role_binding.metadata.name);
        rbac.role_binding.role_ref.name += UPSTREAM_SUFFIX;
        rbac
    }

    pub fn parse(text: &str) -> ShippedRbac {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)
            .unwrap_or_else(|e| panic!("deploy/kubernetes/rbac.yaml is not valid YAML: {e}"));
        let (mut cluster_role, mut cluster_role_binding, mut role, mut role_binding) =
            (None, None, None, None);
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "ServiceAccount" => {}
                "ClusterRole" => cluster_role = Some(typed::<ClusterRole>(doc, &kind)),
                "ClusterRoleBinding" => {
                    cluster_role_binding = Some(typed::<ClusterRoleBinding>(doc, &kind))
                }
                "Role" => role = Some(typed::<Role>(doc, &kind)),
                "RoleBinding" => role_binding = Some(typed::<RoleBinding>(doc, &kind)),
                other => panic!("deploy/kubernetes/rbac.yaml: unexpected kind {other:?}"),
            }
        }
        let missing = |what: &str| format!("deploy/kubernetes/rbac.yaml has no {what}");
        let rbac = ShippedRbac {
            cluster_role: cluster_role.unwrap_or_else(|| panic!("{}", missing("ClusterRole"))),
            cluster_role_binding: cluster_role_binding
                .unwrap_or_else(|| panic!("{}", missing("ClusterRoleBinding"))),
            role: role.unwrap_or_else(|| panic!("{}", missing("Role"))),
            role_binding: role_binding.unwrap_or_else(|| panic!("{}", missing("RoleBinding"))),
        };
        let binds = |r: &k8s_openapi::api::rbac::v1::RoleRef, kind: &str, name: &Option<String>| {
            r.kind == kind
                && Some(&r.name) == name.as_ref()
                && r.api_group.as_deref() == Some(RBAC_API_GROUP)
        };
        assert!(
            binds(
                &rbac.cluster_role_binding.role_ref,
                "ClusterRole",
                &rbac.cluster_role.metadata.name
            ),
            "the ClusterRoleBinding must bind the file's ClusterRole"
        );
        assert!(
            binds(
                &rbac.role_binding.role_ref,
                "Role",
                &rbac.role.metadata.name
            ),
            "the RoleBinding must bind the file's Role"
        );
        rbac
    }
}

fn typed<K: serde::de::DeserializeOwned>(doc: serde_json::Value, kind: &str) -> K {
    serde_json::from_value(doc)
        .unwrap_or_else(|e| panic!("deploy/kubernetes/rbac.yaml: invalid {kind}: {e}"))
}

/// `text` with the commented-out rules for `resources` uncommented, as an operator uncomments
/// them: the `# - apiGroups:` line and the lines of its rule that follow, each losing the comment
/// marker (and the space after it where the rule's items are indented so). Panics if a rule is
/// not there: upstream changed its file, and the test must be looked at.
fn uncomment_rules(text: &str, resources: &[&str]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for resource in resources {
        let wanted = format!("resources: [\"{resource}\"]");
        let start = (0..lines.len().saturating_sub(1))
            .find(|&i| {
                let (head, next) = (lines[i].trim_start(), lines[i + 1].trim_start());
                head.starts_with('#')
                    && head
                        .trim_start_matches('#')
                        .trim_start()
                        .starts_with("- apiGroups:")
                    && next.starts_with('#')
                    && next.trim_start_matches('#').trim() == wanted
            })
            .unwrap_or_else(|| panic!("upstream's rbac.yaml has no commented rule for {resource}"));
        // The marker and the spaces between it and the item's dash go from every line.
        let indent = lines[start].len() - lines[start].trim_start().len();
        let after =
            lines[start][indent + 1..].len() - lines[start][indent + 1..].trim_start().len();
        let marker = format!("{}#{}", " ".repeat(indent), " ".repeat(after));
        for line in lines.iter_mut().skip(start).take(3) {
            let rest = line
                .strip_prefix(&marker)
                .unwrap_or_else(|| panic!("unexpected line in the rule for {resource}: {line:?}"))
                .to_string();
            *line = format!("{}{rest}", " ".repeat(indent));
        }
    }
    lines.join("\n")
}

fn subjects(rbac: Rbac) -> Vec<Subject> {
    vec![Subject {
        kind: "User".into(),
        name: rbac.user().into(),
        api_group: Some(RBAC_API_GROUP.into()),
        namespace: None,
    }]
}

/// Grants the shipped ClusterRole to the test user, and the leader-election Role in
/// [`DEFAULT_LEASE_NAMESPACE`]. Runs once per test binary; returns when the API server
/// authorizes with the new rules.
pub async fn grant_provisioner_rbac() {
    grant_rbac(Rbac::Shipped).await;
}

/// Grants `rbac`'s ClusterRole to its test user, and its leader-election Role in
/// [`DEFAULT_LEASE_NAMESPACE`]. Runs once per test binary and set.
pub async fn grant_rbac(rbac: Rbac) {
    static SHIPPED: OnceCell<()> = OnceCell::const_new();
    static UPSTREAM: OnceCell<()> = OnceCell::const_new();
    let once = match rbac {
        Rbac::Shipped => &SHIPPED,
        Rbac::Upstream => &UPSTREAM,
    };
    once.get_or_init(|| async {
        let objects = rbac.load();
        let client = cluster().await.client.clone();
        let mut role = objects.cluster_role.clone();
        strip_server_fields(&mut role.metadata);
        apply(&Api::<ClusterRole>::all(client.clone()), &role).await;
        let mut binding = objects.cluster_role_binding.clone();
        strip_server_fields(&mut binding.metadata);
        binding.subjects = Some(subjects(rbac));
        apply(&Api::<ClusterRoleBinding>::all(client.clone()), &binding).await;
        let first = first_rule(role.rules.as_deref(), "ClusterRole");
        wait_until_authorized(rbac, &first, None).await;
        grant_lease_role_from(rbac, &objects, DEFAULT_LEASE_NAMESPACE).await;
    })
    .await;
}

/// Puts the shipped leader-election Role and its binding (to the test user) into `namespace`,
/// for a sidecar started with `--leader-election-namespace=<namespace>`.
pub async fn grant_lease_role(namespace: &str) {
    grant_lease_role_for(Rbac::Shipped, namespace).await;
}

/// Puts `rbac`'s leader-election Role and its binding (to its test user) into `namespace`.
pub async fn grant_lease_role_for(rbac: Rbac, namespace: &str) {
    grant_lease_role_from(rbac, &rbac.load(), namespace).await;
}

async fn grant_lease_role_from(rbac: Rbac, objects: &ShippedRbac, namespace: &str) {
    let client = cluster().await.client.clone();
    let mut role = objects.role.clone();
    strip_server_fields(&mut role.metadata);
    role.metadata.namespace = Some(namespace.into());
    apply(&Api::<Role>::namespaced(client.clone(), namespace), &role).await;
    let mut binding = objects.role_binding.clone();
    strip_server_fields(&mut binding.metadata);
    binding.metadata.namespace = Some(namespace.into());
    binding.subjects = Some(subjects(rbac));
    apply(&Api::<RoleBinding>::namespaced(client, namespace), &binding).await;
    let first = first_rule(role.rules.as_deref(), "Role");
    wait_until_authorized(rbac, &first, Some(namespace)).await;
}

fn strip_server_fields(meta: &mut kube::api::ObjectMeta) {
    meta.resource_version = None;
    meta.uid = None;
    meta.creation_timestamp = None;
    meta.managed_fields = None;
}

async fn apply<K>(api: &Api<K>, obj: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let name = obj.meta().name.clone().expect("manifest objects are named");
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {} {name}: {e}", K::kind(&Default::default())));
}

/// One permission the role grants: (API group, resource, verb).
fn first_rule(
    rules: Option<&[k8s_openapi::api::rbac::v1::PolicyRule]>,
    what: &str,
) -> (String, String, String) {
    let rule = rules
        .and_then(|r| r.first())
        .unwrap_or_else(|| panic!("the shipped {what} has no rules"));
    let first = |v: &Option<Vec<String>>| {
        v.as_ref()
            .and_then(|v| v.first().cloned())
            .unwrap_or_default()
    };
    (
        first(&rule.api_groups),
        first(&rule.resources),
        rule.verbs.first().cloned().unwrap_or_default(),
    )
}

/// RBAC changes reach the API server's authorizer through a watch, a moment after they were
/// written; ask it (as the admin, about the test user) until it agrees.
async fn wait_until_authorized(
    rbac: Rbac,
    (group, resource, verb): &(String, String, String),
    ns: Option<&str>,
) {
    let user = rbac.user();
    let client = cluster().await.client.clone();
    let reviews: Api<SubjectAccessReview> = Api::all(client);
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.clone()),
                resource: Some(resource.clone()),
                verb: Some(verb.clone()),
                namespace: ns.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    wait_for(
        &format!("{user} to be allowed to {verb} {resource} ({ns:?})"),
        Duration::from_secs(30),
        || async {
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .expect("creating a SubjectAccessReview");
            match answer.status {
                Some(s) if s.allowed => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}
