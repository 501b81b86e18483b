//! A test rig for our sidecar: its own namespace, a fault-injecting test driver
//! with a unique name, a StorageClass for that driver, and our `csi-provisioner`
//! process — everything a provisioning test needs, isolated from the other
//! tests sharing the control plane.
//!
//! ```ignore
//! let rig = Rig::builder("basic").sidecar_args(&["--timeout=2s"]).start().await;
//! let claim = rig.create_claim(PvcFixture::new("data", &rig.ns.name).class(&rig.class).size("1Gi")).await;
//! let pv = rig.wait_bound("data").await;
//! ```

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use csi_test_driver::control::Client as DriverControl;
use csi_test_driver::ledger::Ledger;
use csi_test_driver::process::{DriverOptions, DriverProcess, binary_path};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use super::{
    ChildProcess, PvcFixture, Rbac, StorageClassFixture, TestNamespace, cluster,
    grant_lease_role_for, grant_rbac, unique_name, wait_for, workspace_bin,
};

/// How long end-to-end steps may take before a test fails (a correctness
/// deadline on a loaded 2-core machine, not a performance assertion).
pub const DEADLINE: Duration = Duration::from_secs(90);

/// Which sidecar a side-by-side test runs next to the rig's driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sidecar {
    /// The upstream Go sidecar (v6.4.0) built by the test bed.
    Upstream,
    Ours,
}

pub struct RigBuilder {
    prefix: String,
    sidecar_args: Vec<String>,
    driver: DriverOptions,
    class: Option<Box<dyn FnOnce(StorageClassFixture) -> StorageClassFixture + Send>>,
    start_sidecar: bool,
    kubeconfig: Option<PathBuf>,
    rbac: Rbac,
    sidecar_binary: Option<PathBuf>,
}

impl RigBuilder {
    /// Extra flags for our sidecar (on top of `--csi-address`, `--kubeconfig`, `-v=5`).
    pub fn sidecar_args(mut self, args: &[&str]) -> Self {
        self.sidecar_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Adjusts the test driver's options (name and sockets are set by the rig).
    pub fn driver(mut self, f: impl FnOnce(&mut DriverOptions)) -> Self {
        f(&mut self.driver);
        self
    }

    /// Adjusts the StorageClass (provisioner = the rig's driver, reclaim Delete, Immediate).
    pub fn class(
        mut self,
        f: impl FnOnce(StorageClassFixture) -> StorageClassFixture + Send + 'static,
    ) -> Self {
        self.class = Some(Box::new(f));
        self
    }

    /// Do not start the sidecar yet (start it with [`Rig::start_sidecar`]).
    pub fn without_sidecar(mut self) -> Self {
        self.start_sidecar = false;
        self
    }

    /// Run the sidecar with this kubeconfig instead of the non-admin `csi-provisioner` one
    /// (which has exactly the rights of deploy/kubernetes/rbac.yaml).
    pub fn kubeconfig(mut self, path: PathBuf) -> Self {
        self.kubeconfig = Some(path);
        self
    }

    /// Run the sidecar under the RBAC upstream v6.4.0 ships instead of ours (`Rbac::Upstream`).
    pub fn rbac(mut self, rbac: Rbac) -> Self {
        self.rbac = rbac;
        self
    }

    /// Run this `csi-provisioner` executable instead of the workspace's (the one taken out
    /// of the container image).
    pub fn sidecar_binary(mut self, path: PathBuf) -> Self {
        self.sidecar_binary = Some(path);
        self
    }

    /// Starts the rig for `who`, without its sidecar ([`Rig::start_as`] starts it): upstream runs
    /// as the cluster admin (the shipped RBAC is ours, not its), ours under the shipped RBAC.
    pub async fn start_for(self, who: Sidecar) -> Rig {
        let builder = self.without_sidecar();
        match who {
            Sidecar::Upstream => {
                builder
                    .kubeconfig(cluster().await.kubeconfig.clone())
                    .start()
                    .await
            }
            Sidecar::Ours => builder.start().await,
        }
    }

    pub async fn start(self) -> Rig {
        let cluster = cluster().await;
        let dir = tempfile::Builder::new()
            .prefix("rig-")
            .tempdir()
            .expect("rig temp dir");
        let driver_name = format!("{}.csi.test", unique_name(&self.prefix));
        let mut options = self.driver;
        options.drivername = driver_name.clone();
        let binary = binary_path().expect(
            "csi-test-driver binary: run `cargo build --workspace --bins` (make test does)",
        );
        let driver = DriverProcess::start(&binary, dir.path(), &options)
            .await
            .expect("starting the test driver");
        let control = driver.control().await.expect("driver control socket");
        let ns = TestNamespace::create(&cluster.client, &self.prefix).await;
        let class = unique_name(&self.prefix);
        let mut fixture = StorageClassFixture::new(&class, &driver_name)
            .reclaim("Delete")
            .binding_mode("Immediate");
        if let Some(f) = self.class {
            fixture = f(fixture);
        }
        Api::<StorageClass>::all(cluster.client.clone())
            .create(&PostParams::default(), &fixture.build())
            .await
            .expect("creating the StorageClass");
        // By default the sidecar runs as the non-admin user under the shipped RBAC: the
        // ClusterRole, and the leader-election Role in the rig's namespace (the Lease namespace
        // of tests that pass `--leader-election-namespace=<rig namespace>`).
        let under_rbac = match self.rbac {
            Rbac::Shipped => cluster.provisioner_kubeconfig.clone(),
            Rbac::Upstream => cluster.upstream_rbac_kubeconfig.clone(),
        };
        let kubeconfig = self.kubeconfig.unwrap_or_else(|| under_rbac.clone());
        if kubeconfig == under_rbac {
            grant_rbac(self.rbac).await;
            grant_lease_role_for(self.rbac, &ns.name).await;
        }
        let mut args = vec![
            format!("--csi-address={}", driver.csi_address()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "-v=5".to_string(),
        ];
        args.extend(self.sidecar_args);
        let mut rig = Rig {
            client: cluster.client.clone(),
            ns,
            driver,
            control,
            driver_name,
            class,
            sidecar: None,
            binary: self
                .sidecar_binary
                .unwrap_or_else(|| workspace_bin("csi-provisioner")),
            args,
            env: Vec::new(),
            dir,
        };
        if self.start_sidecar {
            rig.start_sidecar();
        }
        rig
    }
}

pub struct Rig {
    pub client: kube::Client,
    pub ns: TestNamespace,
    pub driver: DriverProcess,
    pub control: DriverControl,
    pub driver_name: String,
    pub class: String,
    pub sidecar: Option<ChildProcess>,
    /// The `csi-provisioner` executable [`Rig::start_sidecar`] runs.
    pub binary: PathBuf,
    pub args: Vec<String>,
    /// Environment of the sidecar ([`Rig::start_sidecar`]), added to the test's.
    pub env: Vec<(String, String)>,
    pub dir: tempfile::TempDir,
}

impl Rig {
    pub fn builder(prefix: &str) -> RigBuilder {
        RigBuilder {
            prefix: prefix.to_string(),
            sidecar_args: Vec::new(),
            driver: DriverOptions::default(),
            class: None,
            start_sidecar: true,
            kubeconfig: None,
            rbac: Rbac::Shipped,
            sidecar_binary: None,
        }
    }

    /// Starts (or restarts) our sidecar with the rig's flags.
    pub fn start_sidecar(&mut self) {
        if let Some(mut old) = self.sidecar.take() {
            old.kill();
        }
        self.sidecar = Some(ChildProcess::spawn(
            Command::new(&self.binary)
                .args(&self.args)
                .envs(self.env.iter().cloned()),
        ));
    }

    /// Starts `who` with the rig's flags and `flags`: ours as the rig's sidecar, upstream as a
    /// process returned to the caller, who keeps it for as long as it should run.
    pub fn start_as(&mut self, who: Sidecar, flags: &[&str]) -> Option<ChildProcess> {
        match who {
            Sidecar::Ours => {
                self.args.extend(flags.iter().map(|f| f.to_string()));
                self.start_sidecar();
                None
            }
            Sidecar::Upstream => Some(ChildProcess::spawn(
                Command::new(super::testbed_bin("csi-provisioner-upstream"))
                    .args(&self.args)
                    .args(flags),
            )),
        }
    }

    /// SIGKILLs the sidecar (no cleanup, like a crash or OOM kill).
    pub fn kill_sidecar(&mut self) {
        if let Some(mut s) = self.sidecar.take() {
            s.kill();
        }
    }

    pub fn sidecar_log(&self) -> String {
        self.sidecar
            .as_ref()
            .map(|s| s.log_contents())
            .unwrap_or_default()
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        self.ns.api()
    }

    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// A claim fixture in the rig's namespace and class.
    pub fn claim(&self, name: &str) -> PvcFixture {
        PvcFixture::new(name, &self.ns.name)
            .class(&self.class)
            .size("1Gi")
    }

    pub async fn create_claim(&self, fixture: PvcFixture) -> PersistentVolumeClaim {
        self.claims()
            .create(&PostParams::default(), &fixture.build())
            .await
            .expect("creating the claim")
    }

    pub async fn delete_claim(&self, name: &str) {
        match self.claims().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => panic!("deleting claim {name}: {e}"),
        }
    }

    /// Waits until the claim is Bound and returns its PV.
    pub async fn wait_bound(&self, name: &str) -> PersistentVolume {
        let claims = self.claims();
        let pv_name = wait_for(&format!("claim {name} to be Bound"), DEADLINE, || async {
            let pvc = claims.get(name).await.expect("reading the claim");
            match (
                pvc.status.as_ref().and_then(|s| s.phase.as_deref()),
                pvc.spec.as_ref().and_then(|s| s.volume_name.clone()),
            ) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                _ => Err((pvc.status, self.sidecar_log_tail())),
            }
        })
        .await;
        self.volumes()
            .get(&pv_name)
            .await
            .expect("reading the bound PV")
    }

    /// Waits until the claim object is gone.
    pub async fn wait_claim_gone(&self, name: &str) {
        let claims = self.claims();
        wait_for(&format!("claim {name} to be gone"), DEADLINE, || async {
            match claims.get_opt(name).await.expect("reading the claim") {
                None => Ok(()),
                Some(c) => Err((
                    c.metadata.finalizers,
                    c.metadata.deletion_timestamp,
                    self.sidecar_log_tail(),
                )),
            }
        })
        .await
    }

    /// Waits until the PV is gone.
    pub async fn wait_pv_gone(&self, name: &str) {
        let volumes = self.volumes();
        wait_for(&format!("PV {name} to be gone"), DEADLINE, || async {
            match volumes.get_opt(name).await.expect("reading the PV") {
                None => Ok(()),
                Some(pv) => Err((pv.status, pv.metadata.finalizers, self.sidecar_log_tail())),
            }
        })
        .await
    }

    /// The driver's ledger, read through its control socket.
    /// Creates the Secret `name` in the rig's namespace with `data` (string data).
    pub async fn create_secret(&self, name: &str, data: &[(&str, &str)]) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        self.ns
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating a secret");
    }

    pub async fn ledger(&self) -> Ledger {
        self.control
            .ledger()
            .await
            .expect("reading the driver's ledger")
    }

    /// Events about the named object in the rig's namespace (PV events live in `default`).
    pub async fn events_for(&self, namespace: &str, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        events.list(&lp).await.expect("listing events").items
    }

    /// Waits until an event with `reason` (and containing `fragment`) is recorded on the claim.
    pub async fn wait_claim_event(&self, claim: &str, reason: &str, fragment: &str) -> Event {
        self.wait_event(&self.ns.name, claim, reason, fragment)
            .await
    }

    /// Waits until an event with `reason` (and containing `fragment`) is recorded on the
    /// object `namespace/name`.
    pub async fn wait_event(
        &self,
        namespace: &str,
        claim: &str,
        reason: &str,
        fragment: &str,
    ) -> Event {
        wait_for(
            &format!("event {reason} on {namespace}/{claim}"),
            DEADLINE,
            || async {
                let events = self.events_for(namespace, claim).await;
                match events.iter().find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.message.as_deref().unwrap_or_default().contains(fragment)
                }) {
                    Some(e) => Ok(e.clone()),
                    None => Err(events
                        .iter()
                        .map(|e| (e.reason.clone(), e.message.clone()))
                        .collect::<Vec<_>>()),
                }
            },
        )
        .await
    }

    pub fn sidecar_log_tail(&self) -> String {
        let log = self.sidecar_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }

    /// Creates a Node labelled `key=zone` and its CSINode listing the rig's
    /// driver with topology key `key` (there is no kubelet to do it).
    pub async fn node_in_zone(&self, key: &str, zone: &str) -> String {
        self.node_with(&[key], &[(key, zone)]).await
    }

    /// Creates a Node with `labels` and its CSINode listing the rig's driver
    /// with the topology keys `keys`, in that order.
    pub async fn node_with(&self, keys: &[&str], labels: &[(&str, &str)]) -> String {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
        use kube::api::ObjectMeta;
        let name = unique_name("node");
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("creating a Node");
        let csinode = CSINode {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: self.driver_name.clone(),
                    node_id: name.clone(),
                    topology_keys: Some(keys.iter().map(|k| k.to_string()).collect()),
                    ..Default::default()
                }],
            },
        };
        Api::<CSINode>::all(self.client.clone())
            .create(&PostParams::default(), &csinode)
            .await
            .expect("creating a CSINode");
        name
    }

    /// Creates a Node with `labels` whose CSINode does not list the rig's driver (the labels are
    /// there, the driver is not: another driver's node, say).
    pub async fn node_without_driver(&self, labels: &[(&str, &str)]) -> String {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::api::storage::v1::{CSINode, CSINodeSpec};
        use kube::api::ObjectMeta;
        let name = unique_name("node");
        let meta = |labels: Option<std::collections::BTreeMap<String, String>>| ObjectMeta {
            name: Some(name.clone()),
            labels,
            ..Default::default()
        };
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Api::<Node>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &Node {
                    metadata: meta(Some(labels)),
                    ..Default::default()
                },
            )
            .await
            .expect("creating a Node");
        Api::<CSINode>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &CSINode {
                    metadata: meta(None),
                    spec: CSINodeSpec {
                        drivers: Vec::new(),
                    },
                },
            )
            .await
            .expect("creating a CSINode");
        name
    }

    /// Removes what [`Rig::node_in_zone`] created.
    pub async fn remove_node(&self, name: &str) {
        use k8s_openapi::api::core::v1::Node;
        use k8s_openapi::api::storage::v1::CSINode;
        let _ = Api::<CSINode>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await;
        let _ = Api::<Node>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }

    /// Deletes the StorageClass and the namespace; leaves the processes to Drop.
    pub async fn cleanup(self) {
        let _ = Api::<StorageClass>::all(self.client.clone())
            .delete(&self.class, &DeleteParams::default())
            .await;
        self.ns.cleanup().await;
    }
}
