//! The sidecar runs in the tests under the RBAC we ship: the ClusterRole and the leader-election
//! Role of `deploy/kubernetes/rbac.yaml`, parsed from the file and bound to the test bed's
//! non-admin user `csi-provisioner` instead of the ServiceAccount. A rule missing from the file
//! therefore fails the test whose sidecar needed it.
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

fn test_user() -> Vec<Subject> {
    vec![Subject {
        kind: "User".into(),
        name: PROVISIONER_USER.into(),
        api_group: Some(RBAC_API_GROUP.into()),
        namespace: None,
    }]
}

/// Grants the shipped ClusterRole to the test user, and the leader-election Role in
/// [`DEFAULT_LEASE_NAMESPACE`]. Runs once per test binary; returns when the API server
/// authorizes with the new rules.
pub async fn grant_provisioner_rbac() {
    static GRANTED: OnceCell<()> = OnceCell::const_new();
    GRANTED
        .get_or_init(|| async {
            let rbac = ShippedRbac::load();
            let client = cluster().await.client.clone();
            let mut role = rbac.cluster_role.clone();
            strip_server_fields(&mut role.metadata);
            apply(&Api::<ClusterRole>::all(client.clone()), &role).await;
            let mut binding = rbac.cluster_role_binding.clone();
            strip_server_fields(&mut binding.metadata);
            binding.subjects = Some(test_user());
            apply(&Api::<ClusterRoleBinding>::all(client.clone()), &binding).await;
            let first = first_rule(role.rules.as_deref(), "ClusterRole");
            wait_until_authorized(&first, None).await;
            grant_lease_role_from(&rbac, DEFAULT_LEASE_NAMESPACE).await;
        })
        .await;
}

/// Puts the shipped leader-election Role and its binding (to the test user) into `namespace`,
/// for a sidecar started with `--leader-election-namespace=<namespace>`.
pub async fn grant_lease_role(namespace: &str) {
    grant_lease_role_from(&ShippedRbac::load(), namespace).await;
}

async fn grant_lease_role_from(rbac: &ShippedRbac, namespace: &str) {
    let client = cluster().await.client.clone();
    let mut role = rbac.role.clone();
    strip_server_fields(&mut role.metadata);
    role.metadata.namespace = Some(namespace.into());
    apply(&Api::<Role>::namespaced(client.clone(), namespace), &role).await;
    let mut binding = rbac.role_binding.clone();
    strip_server_fields(&mut binding.metadata);
    binding.metadata.namespace = Some(namespace.into());
    binding.subjects = Some(test_user());
    apply(&Api::<RoleBinding>::namespaced(client, namespace), &binding).await;
    let first = first_rule(role.rules.as_deref(), "Role");
    wait_until_authorized(&first, Some(namespace)).await;
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
    (group, resource, verb): &(String, String, String),
    ns: Option<&str>,
) {
    let client = cluster().await.client.clone();
    let reviews: Api<SubjectAccessReview> = Api::all(client);
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(PROVISIONER_USER.into()),
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
        &format!("{PROVISIONER_USER} to be allowed to {verb} {resource} ({ns:?})"),
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
