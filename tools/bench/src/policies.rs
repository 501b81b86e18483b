//! The `ours+policies` contender's cluster side: the two shipped intent
//! policies of deploy/kubernetes/ (the provisioning intent made in
//! kube-controller-manager's hand-over update, released in the binder's),
//! installed for one run's driver before the contender starts and removed
//! after it, enforced before anything is measured and no longer acting once
//! removed (the scale profile's runs share one driver: a policy still acting
//! would put the intent on the next contender's claims).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

const FILES: [&str; 2] = [
    "provisioning-intent-policy.yaml",
    "release-intent-policy.yaml",
];
/// The driver name the shipped provisioning-intent policy lists.
const PLACEHOLDER_DRIVER: &str = "csi-driver.example.com";
const INTENT: &str = "csi-provisioner.rs/provisioning-intent";
const PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// Policies and bindings created for one run: (kind, name), and the driver and
/// namespace they were checked with.
pub struct Installed {
    objects: Vec<(String, String)>,
    driver: String,
    ns: String,
}

fn resource(kind: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()).replace("policys", "policies"),
    }
}

/// Installs both policies for `driver` (named after it, cluster-wide as an
/// operator installs them) and waits until a claim of `ns` made already
/// handed to `driver` gets the intent at CREATE.
pub async fn install(
    client: &Client,
    repo: &Path,
    driver: &str,
    ns: &str,
) -> anyhow::Result<Installed> {
    let mut created = Vec::new();
    for file in FILES {
        let path = repo.join("deploy/kubernetes").join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .replace(PLACEHOLDER_DRIVER, driver);
        let name = format!("{}-{driver}", file.trim_end_matches(".yaml"));
        for mut doc in serde_saphyr::from_multiple::<serde_json::Value>(&text)? {
            if doc.is_null() {
                continue;
            }
            let kind = doc["kind"].as_str().context("a kind")?.to_string();
            doc["metadata"]["name"] = name.clone().into();
            if kind == "MutatingAdmissionPolicyBinding" {
                doc["spec"]["policyName"] = name.clone().into();
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(&kind));
            api.create(&PostParams::default(), &serde_json::from_value(doc)?)
                .await
                .with_context(|| format!("creating the {kind} of {file}"))?;
            created.push((kind, name.clone()));
        }
    }
    let installed = Installed {
        objects: created,
        driver: driver.to_string(),
        ns: ns.to_string(),
    };
    if let Err(e) = acting(client, driver, ns, true).await {
        installed.remove(client).await;
        return Err(e);
    }
    Ok(installed)
}

/// Waits until the provisioning-intent policy acts, or (`acting` false) no longer
/// does: a policy takes a moment to load, and to unload.
async fn acting(client: &Client, driver: &str, ns: &str, acting: bool) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let t0 = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let name = format!("policy-{}-{n}", if acting { "probe" } else { "gone" });
        let probe: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "annotations": {PROVISIONER: driver}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))?;
        let c = claims.create(&PostParams::default(), &probe).await?;
        let held = c.metadata.finalizers.iter().flatten().any(|f| f == INTENT);
        // The probe goes at once; the finalizer first, or it would stay.
        if held {
            let mut c = c;
            c.metadata.finalizers = None;
            claims.replace(&name, &PostParams::default(), &c).await?;
        }
        claims.delete(&name, &DeleteParams::default()).await?;
        if held == acting {
            return Ok(());
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(120),
            "the provisioning-intent policy was still {} after 120 s",
            if acting { "not enforced" } else { "acting" }
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Installed {
    /// Deletes the policies and bindings, and waits until a claim made for the
    /// driver no longer gets the intent.
    pub async fn remove(self, client: &Client) {
        for (kind, name) in self.objects.into_iter().rev() {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(&kind));
            if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                eprintln!("bench: removing the {kind} {name}: {e}");
            }
        }
        if let Err(e) = acting(client, &self.driver, &self.ns, false).await {
            eprintln!("bench: {e:#}");
        }
    }
}
