//! The stage of a chaos run on the test bed's control plane: a namespace, a node to select,
//! two StorageClasses (Immediate and WaitForFirstConsumer) of a driver with a unique name,
//! the fault-injecting test driver (with snapshots and clones), the csi-snapshotter next to
//! it with a VolumeSnapshotClass (the snapshot-controller runs with the control plane), the
//! fault-injecting API proxy, and the sidecar replicas (ours or upstream's) talking to the
//! API server only through the proxy. In policy mode, also the two shipped intent policies
//! for the driver, bound to the namespace, with our sidecars on `--admission-intent`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_fault_proxy::Proxy;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::policies::Policies;
use crate::procs::{Driver, Replica, SidecarCommand};

/// Which sidecar the run exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sidecar {
    /// Our `csi-provisioner` (from this workspace's target directory).
    Ours,
    /// Upstream external-provisioner v6 from the test bed (`csi-provisioner-upstream`).
    Upstream,
}

impl Sidecar {
    pub fn label(self) -> &'static str {
        match self {
            Sidecar::Ours => "ours",
            Sidecar::Upstream => "upstream",
        }
    }
}

impl std::str::FromStr for Sidecar {
    type Err = String;
    fn from_str(s: &str) -> Result<Sidecar, String> {
        match s {
            "ours" => Ok(Sidecar::Ours),
            "upstream" => Ok(Sidecar::Upstream),
            other => Err(format!("unknown sidecar {other:?} (ours, upstream)")),
        }
    }
}

/// The sidecars' `--leader-election-lease-duration`.
pub const LEASE_DURATION: Duration = Duration::from_secs(6);

/// Where the test bed is (from `testbed/cluster.sh up`'s variables).
#[derive(Clone, Debug)]
pub struct Testbed {
    pub kubeconfig: PathBuf,
    pub bin_dir: PathBuf,
    /// The control plane's state directory (`CSI_TESTBED_DIR`), needed only to restart it.
    pub dir: Option<PathBuf>,
}

impl Testbed {
    pub fn from_env() -> Result<Testbed, String> {
        let var = |name: &str| match std::env::var_os(name) {
            Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
            _ => Err(format!(
                "{name} is not set: run through `make test`/`make chaos`, or start the control \
                 plane with `eval \"$(bash testbed/cluster.sh up /tmp/tb-dev)\"`"
            )),
        };
        Ok(Testbed {
            kubeconfig: var("CSI_TESTBED_KUBECONFIG")?,
            bin_dir: var("CSI_TESTBED_BIN")?,
            dir: var("CSI_TESTBED_DIR").ok(),
        })
    }

    /// `testbed/cluster.sh` of this repository (`CSI_TESTBED_CLUSTER_SH` wins).
    pub fn cluster_script() -> PathBuf {
        match std::env::var_os("CSI_TESTBED_CLUSTER_SH") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed/cluster.sh"),
        }
    }
}

/// A binary of this workspace, next to the running executable (`target/<profile>`), or
/// from `$<NAME>_BIN` (upper case, `-` → `_`).
pub fn workspace_bin(name: &str) -> Result<PathBuf, String> {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(p) = std::env::var_os(&var) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = exe.parent().ok_or("no executable directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().ok_or("no target directory")?;
    }
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: run `cargo build --workspace --bins` first (or set {var})",
            path.display()
        ))
    }
}

/// The topology key of each node's segment in a node deployment (the test driver reports
/// it with the node's name as its value).
pub const NODE_KEY: &str = "topology.chaos.example.com/node";

/// Knobs of the stage.
#[derive(Clone, Debug)]
pub struct StageOptions {
    pub sidecar: Sidecar,
    /// Replicas of a central deployment, contending for the Lease (ignored with `nodes`).
    pub replicas: usize,
    /// 0: one central deployment. N: a node deployment: N nodes, each with a driver of its
    /// own (its own ledger, node id and topology segment) and one sidecar with
    /// `--node-deployment` and `NODE_NAME`, without leader election.
    pub nodes: usize,
    pub seed: u64,
    /// Sidecar `--timeout` (per CSI call).
    pub csi_timeout: String,
    /// A central deployment's replicas contend for the Lease (false: `--leader-election=false`,
    /// for a scenario whose API server cannot answer a consistent read for a while).
    pub leader_election: bool,
    /// Extra flags for every replica.
    pub extra_args: Vec<String>,
    /// Start a second kube-apiserver on the same etcd, its link to etcd freezable (the
    /// `travel` fault). Only where the test bed's directory is known (else none).
    pub time_travel: bool,
    /// Extra environment for every replica (say, a client-go feature gate of upstream's:
    /// `KUBE_FEATURE_WatchListClient=false`).
    pub sidecar_env: Vec<(String, String)>,
    /// Keep the work directory (logs, ledger) after the run.
    pub keep_dir: bool,
    /// Policy mode: the shipped intent policies installed for the driver (bound to the
    /// namespace) and our sidecar started with `--admission-intent`. Ours only, central
    /// deployment only.
    pub policies: bool,
}

pub struct World {
    pub client: Client,
    pub ns: String,
    pub driver_name: String,
    pub class_immediate: String,
    pub class_wffc: String,
    /// The node a WaitForFirstConsumer claim is selected for (the first of `nodes`).
    pub node: String,
    /// Every node of the stage: one in a central deployment, one per sidecar in a node
    /// deployment (`drivers()` lines up with it there).
    pub nodes: Vec<String>,
    /// A node deployment's topology key ([`NODE_KEY`]); `None` in a central deployment.
    pub node_key: Option<String>,
    /// The driver; in a node deployment, the first node's.
    pub driver: Driver,
    /// The other nodes' drivers in a node deployment (empty otherwise).
    pub other_drivers: Vec<Driver>,
    pub proxy: Proxy,
    pub replicas: Vec<Replica>,
    /// The VolumeSnapshotClass of the driver (deletion policy Delete).
    pub snapshot_class: String,
    /// csi-snapshotter for the driver, restarted like a replica when it exits (it exits
    /// when it loses the driver's socket, e.g. after a driver crash).
    pub snapshotter: Replica,
    pub stop: CancellationToken,
    pub dir: PathBuf,
    pub sidecar: Sidecar,
    /// Policy mode: the installed policies (removed at teardown).
    pub policies: Option<Arc<Policies>>,
    /// The kube config the proxy forwards with (to the test bed's API server).
    pub upstream: kube::Config,
    /// A second kube-apiserver for the `travel` fault (see [`StageOptions::time_travel`]).
    pub second: Option<crate::timetravel::SecondApiserver>,
    pub testbed: Testbed,
    tmp: Option<tempfile::TempDir>,
}

/// Upstream's (and our) Lease name for a driver.
pub fn lease_name(driver: &str) -> String {
    let mut s: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.ends_with('-') {
        s.push('X');
    }
    s
}

/// The Lease's holder now (`None` if unreadable or held by nobody).
pub async fn lease_holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    let lease = leases.get_opt(name).await.ok()??;
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// The API resource of a snapshot.storage.k8s.io/v1 kind.
pub fn snapshot_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "snapshot.storage.k8s.io",
        "v1",
        kind,
    ))
}

/// Controller capabilities the test driver adds to its defaults in a chaos run.
pub const DRIVER_CAPABILITIES: &str = "+CLONE_VOLUME,+CREATE_DELETE_SNAPSHOT,+LIST_SNAPSHOTS";

pub async fn admin_client(kubeconfig: &Path) -> Result<(Client, kube::Config), String> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = Client::try_from(config.clone()).map_err(|e| e.to_string())?;
    Ok((client, config))
}

impl World {
    pub async fn setup(testbed: &Testbed, opts: &StageOptions) -> Result<World, String> {
        if opts.policies && (opts.sidecar != Sidecar::Ours || opts.nodes > 0) {
            return Err(
                "policy mode is for our sidecar in a central deployment only (upstream would \
                 never remove our intent; --admission-intent is refused with --node-deployment)"
                    .into(),
            );
        }
        let (client, config) = admin_client(&testbed.kubeconfig).await?;
        let base = format!("chaos-{}-{:04x}", opts.seed, rand::random::<u16>());
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{base}-"))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let dir = tmp.path().to_path_buf();
        let ns = base.clone();
        let driver_name = format!("{base}.csi.test");
        let nodes: Vec<String> = if opts.nodes == 0 {
            vec![format!("{base}-node")]
        } else {
            (0..opts.nodes)
                .map(|i| format!("{base}-node-{i}"))
                .collect()
        };
        let node = nodes[0].clone();
        let node_key = (opts.nodes > 0).then(|| NODE_KEY.to_string());
        let class_immediate = format!("{base}-immediate");
        let class_wffc = format!("{base}-wffc");
        let snapshot_class = format!("{base}-snapshots");

        let err = |what: &str, e: kube::Error| format!("{what}: {e}");
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await
            .map_err(|e| err("creating the namespace", e))?;
        for node in &nodes {
            let labels = match &node_key {
                Some(key) => json!({ key.as_str(): node }),
                None => json!({}),
            };
            Api::<Node>::all(client.clone())
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": node, "labels": labels}}))
                        .expect("node"),
                )
                .await
                .map_err(|e| err("creating a node", e))?;
        }
        let classes = Api::<StorageClass>::all(client.clone());
        for (name, mode) in [
            (&class_immediate, "Immediate"),
            (&class_wffc, "WaitForFirstConsumer"),
        ] {
            let sc: StorageClass = serde_json::from_value(json!({
                "metadata": {"name": name},
                "provisioner": driver_name,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": mode,
                "parameters": {"type": "chaos"},
            }))
            .expect("storage class");
            classes
                .create(&PostParams::default(), &sc)
                .await
                .map_err(|e| err("creating a StorageClass", e))?;
        }
        let vsc: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": snapshot_class},
            "driver": driver_name,
            "deletionPolicy": "Delete",
        }))
        .expect("snapshot class");
        Api::<DynamicObject>::all_with(client.clone(), &snapshot_resource("VolumeSnapshotClass"))
            .create(&PostParams::default(), &vsc)
            .await
            .map_err(|e| {
                err(
                    "creating the VolumeSnapshotClass (snapshot CRDs installed?)",
                    e,
                )
            })?;

        let mut drivers = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let mut args = vec![format!("--capabilities={DRIVER_CAPABILITIES}")];
            let driver_dir = match &node_key {
                None => dir.join("driver"),
                Some(key) => {
                    args.extend([
                        format!("--node-id={node}"),
                        format!("--topology-key={key}"),
                        format!("--topology-value={node}"),
                    ]);
                    dir.join(format!("driver-{i}"))
                }
            };
            std::fs::create_dir_all(&driver_dir).map_err(|e| e.to_string())?;
            let driver = Driver::start(
                &workspace_bin("csi-test-driver")?,
                &driver_dir,
                &driver_name,
                opts.seed + i as u64,
                &args,
            )
            .await
            .map_err(|e| format!("starting the test driver: {e}"))?;
            drivers.push(driver);
        }
        let mut drivers = drivers.into_iter();
        let driver = drivers.next().expect("one driver at least");
        let other_drivers: Vec<Driver> = drivers.collect();

        let listen: SocketAddr = "127.0.0.1:0".parse().expect("loopback");
        let upstream = config.clone();
        let proxy = Proxy::start(listen, config, opts.seed)
            .await
            .map_err(|e| format!("starting the API proxy: {e}"))?;
        let kubeconfig = dir.join("proxy.kubeconfig");
        proxy
            .write_kubeconfig(&kubeconfig, &ns)
            .map_err(|e| e.to_string())?;

        let stop = CancellationToken::new();
        let snapshotter_bin = testbed.bin_dir.join("csi-snapshotter");
        if !snapshotter_bin.is_file() {
            return Err(format!(
                "{} not found (make testbed)",
                snapshotter_bin.display()
            ));
        }
        // Straight to the API server: the proxy's faults are aimed at the provisioner. Its
        // retries are capped low so that a snapshot that failed is retried within a run.
        let snapshotter = Replica::start(
            SidecarCommand {
                program: snapshotter_bin,
                args: vec![
                    format!("--csi-address={}", driver.endpoint.display()),
                    format!("--kubeconfig={}", testbed.kubeconfig.display()),
                    "--leader-election=false".into(),
                    "--timeout=10s".into(),
                    "--retry-interval-start=500ms".into(),
                    "--retry-interval-max=5s".into(),
                    "--v=4".into(),
                ],
                env: vec![(
                    "KUBECONFIG".to_string(),
                    testbed.kubeconfig.display().to_string(),
                )],
                log: dir.join("snapshotter.log"),
                identity: None,
            },
            stop.clone(),
        );
        let mut world = World {
            client,
            ns,
            driver_name,
            class_immediate,
            class_wffc,
            node,
            nodes,
            node_key,
            driver,
            other_drivers,
            proxy,
            replicas: Vec::new(),
            snapshot_class,
            snapshotter,
            stop,
            dir,
            sidecar: opts.sidecar,
            policies: None,
            upstream,
            second: None,
            testbed: testbed.clone(),
            tmp: Some(tmp),
        };
        if opts.policies {
            // Before any replica starts: every claim of the run is handed over under them.
            let installed = Policies::install(&world.client, &world.driver_name, &world.ns).await;
            match installed {
                Ok(p) => world.policies = Some(Arc::new(p)),
                Err(e) => {
                    world.teardown().await;
                    return Err(e);
                }
            }
        }
        if opts.time_travel
            && let Some(tb_dir) = &testbed.dir
        {
            let log = world.dir.join("apiserver-2.log");
            match crate::timetravel::SecondApiserver::start(tb_dir, &testbed.kubeconfig, log).await
            {
                Ok(second) => world.second = Some(second),
                Err(e) => {
                    world.teardown().await;
                    return Err(e);
                }
            }
        }
        if opts.keep_dir
            && let Some(t) = world.tmp.take()
        {
            let _ = t.keep();
        }
        let replicas = if opts.nodes > 0 {
            opts.nodes
        } else {
            opts.replicas
        };
        for i in 0..replicas {
            let command = world.sidecar_command(testbed, opts, i, &kubeconfig)?;
            world
                .replicas
                .push(Replica::start(command, world.stop.clone()));
        }
        Ok(world)
    }

    fn sidecar_command(
        &self,
        testbed: &Testbed,
        opts: &StageOptions,
        index: usize,
        kubeconfig: &Path,
    ) -> Result<SidecarCommand, String> {
        let node_deployment = opts.nodes > 0;
        let driver = if node_deployment {
            self.drivers().nth(index).ok_or("no driver for this node")?
        } else {
            &self.driver
        };
        let mut args = vec![
            format!("--csi-address=unix://{}", driver.endpoint.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        if node_deployment {
            // One sidecar per node, no Lease (as upstream deploys it); Immediate claims are
            // raced for after a short delay, so that the race happens within a run.
            args.extend([
                "--leader-election=false".to_string(),
                "--node-deployment".into(),
                "--node-deployment-immediate-binding".into(),
                "--node-deployment-base-delay=300ms".into(),
                "--node-deployment-max-delay=3s".into(),
            ]);
        } else if !opts.leader_election {
            args.push("--leader-election=false".to_string());
        } else {
            args.extend([
                "--leader-election".to_string(),
                format!("--leader-election-namespace={}", self.ns),
                format!(
                    "--leader-election-lease-duration={}s",
                    LEASE_DURATION.as_secs()
                ),
                "--leader-election-renew-deadline=4s".into(),
                "--leader-election-retry-period=1s".into(),
            ]);
        }
        args.extend([
            format!("--timeout={}", opts.csi_timeout),
            "--retry-interval-start=500ms".into(),
            "--retry-interval-max=5s".into(),
            "--worker-threads=10".into(),
            // A protection left on a VolumeSnapshot (a release that failed under faults) is
            // swept within a settle phase, not after upstream's default 5m.
            "--snapshot-orphan-sweep-interval=10s".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
            format!(
                "-v={}",
                std::env::var("CHAOS_SIDECAR_V").unwrap_or_else(|_| "4".into())
            ),
        ]);
        if opts.policies {
            args.push("--admission-intent".into());
        }
        args.extend(opts.extra_args.iter().cloned());
        let log = self.dir.join(format!("sidecar-{index}.log"));
        let mut env = opts.sidecar_env.clone();
        // Neither sidecar may see the runner's kubeconfig through the environment.
        env.push(("KUBECONFIG".to_string(), kubeconfig.display().to_string()));
        if node_deployment {
            env.push(("NODE_NAME".to_string(), self.nodes[index].clone()));
        }
        Ok(match opts.sidecar {
            Sidecar::Ours => SidecarCommand {
                program: workspace_bin("csi-provisioner")?,
                args,
                env,
                log,
                identity: None,
            },
            Sidecar::Upstream => {
                let program = testbed.bin_dir.join("csi-provisioner-upstream");
                if !program.is_file() {
                    return Err(format!("{} not found (make testbed)", program.display()));
                }
                if node_deployment || opts.replicas < 2 {
                    SidecarCommand {
                        program,
                        args,
                        env,
                        log,
                        identity: None,
                    }
                } else {
                    // Upstream's Lease identity is the host name: replicas on one host
                    // would all believe they lead. Each gets a host name of its own (a UTS
                    // namespace; needs root or CAP_SYS_ADMIN), as pods do.
                    let host = format!("{}-{index}", self.ns);
                    let mut wrapped = vec![
                        "--uts".to_string(),
                        "sh".into(),
                        "-c".into(),
                        "hostname \"$0\" && exec \"$@\"".into(),
                        host.clone(),
                        program.display().to_string(),
                    ];
                    wrapped.extend(args);
                    // `unshare` and `sh` exec: the sidecar keeps the pid the runner signals.
                    SidecarCommand {
                        program: PathBuf::from("unshare"),
                        args: wrapped,
                        env,
                        log,
                        identity: Some(host),
                    }
                }
            }
        })
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Every driver of the stage (in a node deployment, in the order of `nodes`).
    pub fn drivers(&self) -> impl Iterator<Item = &Driver> {
        std::iter::once(&self.driver).chain(self.other_drivers.iter())
    }

    pub fn drivers_mut(&mut self) -> impl Iterator<Item = &mut Driver> {
        std::iter::once(&mut self.driver).chain(self.other_drivers.iter_mut())
    }

    /// The `i`-th driver (modulo their number).
    pub fn driver_at(&mut self, i: usize) -> &mut Driver {
        let n = 1 + self.other_drivers.len();
        match i % n {
            0 => &mut self.driver,
            k => &mut self.other_drivers[k - 1],
        }
    }

    /// The run's VolumeSnapshots.
    pub fn snapshots(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &snapshot_resource("VolumeSnapshot"),
        )
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The sidecars' Lease: the API and its name.
    pub fn lease(&self) -> (Api<Lease>, String) {
        (self.leases(), lease_name(&self.driver_name))
    }

    /// PVs of this run's driver.
    pub async fn volumes(&self) -> Result<Vec<PersistentVolume>, kube::Error> {
        let all = Api::<PersistentVolume>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        Ok(all
            .items
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == self.driver_name)
            })
            .collect())
    }

    /// Counts changes of the Lease holder until cancelled.
    pub fn track_leader(&self, stop: CancellationToken) -> Arc<LeaderTrack> {
        let track = Arc::new(LeaderTrack::default());
        let leases = self.leases();
        let name = lease_name(&self.driver_name);
        let t = track.clone();
        tokio::spawn(async move {
            let mut last: Option<String> = None;
            loop {
                if let Ok(Some(lease)) = leases.get_opt(&name).await {
                    let holder = lease.spec.and_then(|s| s.holder_identity);
                    if holder.is_some() && holder != last {
                        if last.is_some() {
                            t.changes.fetch_add(1, Ordering::Relaxed);
                        }
                        t.holders
                            .lock()
                            .expect("poisoned")
                            .insert(holder.clone().unwrap_or_default(), ());
                        last = holder;
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        track
    }

    /// Stops the sidecars and the driver and removes everything the run created from the
    /// cluster (finalizers included, so nothing is left Terminating on a shared test bed).
    pub async fn teardown(mut self) {
        if let Some(p) = self.policies.take() {
            p.uninstall().await;
        }
        if let Some(second) = self.second.take() {
            let _ = self.proxy.set_upstream(self.upstream.clone());
            second.stop().await;
        }
        self.stop.cancel();
        for r in self.replicas.drain(..) {
            r.join().await;
        }
        self.snapshotter.stopped().await;
        for driver in self.drivers_mut() {
            driver.stop().await;
        }
        let unblock = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let snapshots = self.snapshots();
        if let Ok(list) = snapshots.list(&ListParams::default()).await {
            for vs in list.items {
                if let Some(name) = vs.metadata.name {
                    let _ = snapshots.delete(&name, &DeleteParams::default()).await;
                    let _ = snapshots
                        .patch(&name, &PatchParams::default(), &unblock)
                        .await;
                }
            }
        }
        let contents = Api::<DynamicObject>::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotContent"),
        );
        if let Ok(list) = contents.list(&ListParams::default()).await {
            for c in list.items {
                let ours = c.data.pointer("/spec/driver").and_then(|d| d.as_str())
                    == Some(self.driver_name.as_str());
                if let (true, Some(name)) = (ours, c.metadata.name) {
                    let _ = contents.delete(&name, &DeleteParams::default()).await;
                    let _ = contents
                        .patch(&name, &PatchParams::default(), &unblock)
                        .await;
                }
            }
        }
        let _ = Api::<DynamicObject>::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotClass"),
        )
        .delete(&self.snapshot_class, &DeleteParams::default())
        .await;
        let claims = self.claims();
        if let Ok(list) = claims.list(&ListParams::default()).await {
            for c in list.items {
                if let Some(name) = c.metadata.name {
                    let _ = claims
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            }
        }
        let pvs = Api::<PersistentVolume>::all(self.client.clone());
        if let Ok(list) = self.volumes().await {
            for pv in list {
                if let Some(name) = pv.metadata.name {
                    let _ = pvs.delete(&name, &DeleteParams::default()).await;
                    let _ = pvs
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            }
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        let classes = Api::<StorageClass>::all(self.client.clone());
        for c in [&self.class_immediate, &self.class_wffc] {
            let _ = classes.delete(c, &DeleteParams::default()).await;
        }
        for node in &self.nodes {
            let _ = Api::<Node>::all(self.client.clone())
                .delete(node, &DeleteParams::default())
                .await;
        }
    }
}

/// What the leader tracker saw.
#[derive(Default)]
pub struct LeaderTrack {
    pub changes: AtomicU64,
    pub holders: std::sync::Mutex<BTreeMap<String, ()>>,
}
