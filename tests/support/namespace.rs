//! A namespace of its own for each test.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use super::unique_name;

/// Label put on every test namespace, to find leftovers of crashed runs.
pub const TEST_NAMESPACE_LABEL: &str = "csi-provisioner.test/namespace";

/// A freshly created namespace with a unique name. Deleting it (and so everything namespaced a
/// test created in it) is explicit, with [`TestNamespace::cleanup`]: the control plane of a run
/// is thrown away at its end anyway, so a failed test leaving it behind does no harm and keeps
/// its objects around to look at.
pub struct TestNamespace {
    pub name: String,
    client: kube::Client,
}

impl TestNamespace {
    pub async fn create(client: &kube::Client, prefix: &str) -> TestNamespace {
        let name = unique_name(prefix);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// `Api` for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Starts deleting the namespace; the namespace controller removes its contents.
    pub async fn cleanup(self) {
        match Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => panic!("deleting namespace {}: {e}", self.name),
        }
    }
}
