//! Policy mode: the two shipped MutatingAdmissionPolicies (deploy/kubernetes/provisioning-intent-policy.yaml
//! and release-intent-policy.yaml, built into the runner) installed for the run's driver with
//! each binding narrowed to the run's namespace, so a shared control plane is not affected;
//! their bindings removed and re-installed mid-run as a fault; all of it removed at the end.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

/// The finalizer the policies add and drop (our provisioning intent).
pub const INTENT: &str = "csi-provisioner.rs/provisioning-intent";
/// The driver name the shipped provisioning policy lists, for the operator to edit.
pub const PLACEHOLDER_DRIVER: &str = "csi-driver.example.com";
/// kube-controller-manager's hand-over annotation, which the provisioning policy reacts to.
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// How long the runner retries its own requests (longer than a control-plane restart).
const PATIENCE: Duration = Duration::from_secs(180);

/// One of the two shipped policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Which {
    /// provisioning-intent-policy.yaml: the intent added in the hand-over update.
    Provisioning,
    /// release-intent-policy.yaml: the intent dropped in the binder's update.
    Release,
}

impl Which {
    pub const BOTH: [Which; 2] = [Which::Provisioning, Which::Release];

    fn yaml(self) -> &'static str {
        match self {
            Which::Provisioning => {
                include_str!("../../../deploy/kubernetes/provisioning-intent-policy.yaml")
            }
            Which::Release => include_str!("../../../deploy/kubernetes/release-intent-policy.yaml"),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Which::Provisioning => "provisioning-intent",
            Which::Release => "release-intent",
        }
    }
}

/// The API resource of `MutatingAdmissionPolicy` or `MutatingAdmissionPolicyBinding`.
fn resource(kind: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let plural = match kind {
        "MutatingAdmissionPolicy" => "mutatingadmissionpolicies",
        _ => "mutatingadmissionpolicybindings",
    };
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

/// The shipped policy and binding of `which` for `driver`, named after `ns` and with the
/// binding matching only the namespace `ns`: (policy, binding).
pub fn documents(which: Which, driver: &str, ns: &str) -> Result<(Value, Value), String> {
    let text = which.yaml();
    if which == Which::Provisioning && !text.contains(PLACEHOLDER_DRIVER) {
        return Err(format!(
            "{} no longer names the placeholder driver {PLACEHOLDER_DRIVER}",
            which.label()
        ));
    }
    let text = text.replace(PLACEHOLDER_DRIVER, driver);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| format!("reading the shipped {} policy: {e}", which.label()))?;
    let name = format!("{}-{ns}", which.label());
    let (mut policy, mut binding) = (None, None);
    for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
        doc["metadata"] = json!({"name": name});
        match doc["kind"].as_str() {
            Some("MutatingAdmissionPolicy") => policy = Some(doc),
            Some("MutatingAdmissionPolicyBinding") => {
                doc["spec"]["policyName"] = name.clone().into();
                doc["spec"]["matchResources"] = json!({"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": ns}
                }});
                binding = Some(doc);
            }
            other => {
                return Err(format!(
                    "unexpected {other:?} in the {} policy",
                    which.label()
                ));
            }
        }
    }
    match (policy, binding) {
        (Some(p), Some(b)) => Ok((p, b)),
        _ => Err(format!(
            "the shipped {} policy lacks its policy or binding",
            which.label()
        )),
    }
}

/// One shipped policy as installed.
struct Installed {
    which: Which,
    name: String,
    binding: Value,
    /// The binding is deleted (the fault is on).
    removed: bool,
}

/// The policies installed for a run.
pub struct Policies {
    client: Client,
    installed: Mutex<Vec<Installed>>,
}

impl Policies {
    /// Installs both policies for `driver`, bound to `ns`, and waits until the provisioning
    /// policy acts (a dry-run CREATE of a claim annotated for `driver` gets the intent).
    /// On failure whatever was created is removed again.
    pub async fn install(client: &Client, driver: &str, ns: &str) -> Result<Policies, String> {
        let mut installed = Vec::new();
        let mut created = Vec::new();
        for which in Which::BOTH {
            let (policy, binding) = documents(which, driver, ns)?;
            let name = policy["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            installed.push(Installed {
                which,
                name,
                binding: binding.clone(),
                removed: false,
            });
            created.push(("MutatingAdmissionPolicy", policy));
            created.push(("MutatingAdmissionPolicyBinding", binding));
        }
        let policies = Policies {
            client: client.clone(),
            installed: Mutex::new(installed),
        };
        let mut result = Ok(());
        for (kind, doc) in created {
            result = create(client, kind, &doc).await;
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = wait_enforced(client, driver, ns).await;
        }
        match result {
            Ok(()) => Ok(policies),
            Err(e) => {
                policies.uninstall().await;
                Err(format!("installing the intent policies: {e}"))
            }
        }
    }

    /// Deletes the bindings of `which`; false (nothing done) if one of them is already
    /// removed.
    pub async fn remove(&self, which: &[Which]) -> Result<bool, String> {
        let names: Vec<String> = {
            let mut installed = self.installed.lock().expect("poisoned");
            let chosen: Vec<&mut Installed> = installed
                .iter_mut()
                .filter(|i| which.contains(&i.which))
                .collect();
            if chosen.iter().any(|i| i.removed) {
                return Ok(false);
            }
            chosen
                .into_iter()
                .map(|i| {
                    i.removed = true;
                    i.name.clone()
                })
                .collect()
        };
        for name in names {
            delete(&self.client, "MutatingAdmissionPolicyBinding", &name).await?;
        }
        Ok(true)
    }

    /// Creates again every binding that is removed (those of `which`, or all).
    pub async fn restore(&self, which: Option<&[Which]>) -> Result<(), String> {
        let bindings: Vec<(Which, Value)> = self
            .installed
            .lock()
            .expect("poisoned")
            .iter()
            .filter(|i| i.removed && which.is_none_or(|w| w.contains(&i.which)))
            .map(|i| (i.which, i.binding.clone()))
            .collect();
        for (which, binding) in bindings {
            create(&self.client, "MutatingAdmissionPolicyBinding", &binding).await?;
            let mut installed = self.installed.lock().expect("poisoned");
            if let Some(i) = installed.iter_mut().find(|i| i.which == which) {
                i.removed = false;
            }
        }
        Ok(())
    }

    /// Removes the bindings and the policies (whatever is there).
    pub async fn uninstall(&self) {
        let names: Vec<String> = self
            .installed
            .lock()
            .expect("poisoned")
            .iter()
            .map(|i| i.name.clone())
            .collect();
        for kind in ["MutatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"] {
            for name in &names {
                if let Err(e) = delete(&self.client, kind, name).await {
                    eprintln!("chaos: removing {kind} {name}: {e}");
                }
            }
        }
    }
}

/// Creates the object, retrying API errors for [`PATIENCE`]; one already there is fine.
async fn create(client: &Client, kind: &str, doc: &Value) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(kind));
    let object: DynamicObject = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let until = Instant::now() + PATIENCE;
    loop {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
            // Not served: no point in retrying.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(format!(
                    "creating a {kind}: {} (is MutatingAdmissionPolicy v1 served? Kubernetes 1.36+)",
                    s.message
                ));
            }
            Err(e) if Instant::now() >= until => return Err(format!("creating a {kind}: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Deletes the object, retrying API errors for [`PATIENCE`]; one already gone is fine.
async fn delete(client: &Client, kind: &str, name: &str) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(kind));
    let until = Instant::now() + PATIENCE;
    loop {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) if Instant::now() >= until => {
                return Err(format!("deleting {kind} {name}: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Waits until a dry-run CREATE of a claim already annotated for `driver` comes back with
/// the intent (the policy is loaded and matches the namespace). Nothing is stored.
async fn wait_enforced(client: &Client, driver: &str, ns: &str) -> Result<(), String> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let probe: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "policy-probe", "annotations": {STORAGE_PROVISIONER: driver}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
        },
    }))
    .expect("probe claim");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let until = Instant::now() + Duration::from_secs(60);
    let mut last = String::from("no answer");
    while Instant::now() < until {
        match api.create(&dry_run, &probe).await {
            Ok(c) if c.metadata.finalizers.iter().flatten().any(|f| f == INTENT) => return Ok(()),
            Ok(_) => last = "a dry-run claim got no intent".into(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "the provisioning-intent policy did not act within 60 s: {last}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_policies_are_renamed_for_the_driver_and_bound_to_the_namespace() {
        for which in Which::BOTH {
            let (policy, binding) = documents(which, "x.csi.test", "chaos-1-ab").expect("docs");
            let name = format!("{}-chaos-1-ab", which.label());
            assert_eq!(policy["kind"], "MutatingAdmissionPolicy");
            assert_eq!(policy["metadata"]["name"], name.as_str());
            assert_eq!(binding["metadata"]["name"], name.as_str());
            assert_eq!(binding["spec"]["policyName"], name.as_str());
            assert_eq!(
                binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                "chaos-1-ab"
            );
            let text = policy.to_string();
            assert!(!text.contains(PLACEHOLDER_DRIVER), "{text}");
            if which == Which::Provisioning {
                assert!(text.contains("x.csi.test"), "{text}");
            }
            assert!(text.contains(INTENT), "{text}");
        }
    }
}
