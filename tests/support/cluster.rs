//! The local control plane that `testbed/cluster.sh up` started, found through the
//! `CSI_TESTBED_*` variables it prints, and one admin client to it shared by all tests of a
//! test binary.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::OnceCell;

const HOW_TO_RUN: &str = "the end-to-end tests need the local control plane: run them through \
`make test`, or start it by hand with `eval \"$(bash testbed/cluster.sh up /tmp/tb-dev)\"` and \
then `cargo test`";

/// The control plane the tests run against.
pub struct Cluster {
    /// Admin (`system:masters`) client. Safe to use from any test's runtime (see [`cluster`]).
    pub client: kube::Client,
    /// Admin kubeconfig, for child processes (the upstream sidecar, ours).
    pub kubeconfig: PathBuf,
    /// Kubeconfig of the non-admin user `csi-provisioner`, which has no RBAC until a test binds it.
    pub provisioner_kubeconfig: PathBuf,
    /// Kubeconfig of the non-admin user `csi-provisioner-upstream-rbac`, for the tests that bind it
    /// to the RBAC upstream ships (`support::rbac::Rbac::Upstream`).
    pub upstream_rbac_kubeconfig: PathBuf,
    /// Directory holding the test bed's Go binaries (`csi-mock-driver`, `csi-provisioner-upstream`, ...).
    pub bin_dir: PathBuf,
    /// The control plane's state directory (logs of etcd, kube-apiserver, kube-controller-manager).
    pub dir: PathBuf,
}

impl Cluster {
    /// Path of one of the test bed's Go binaries; panics if it is not there.
    pub fn bin(&self, name: &str) -> PathBuf {
        existing_bin(&self.bin_dir, name)
    }

    /// A client for another kubeconfig (e.g. [`Cluster::provisioner_kubeconfig`]), usable from
    /// any test's runtime like [`Cluster::client`].
    pub async fn client_for(&self, kubeconfig: &Path) -> kube::Client {
        client_from_kubeconfig(kubeconfig).await
    }
}

/// The shared control plane, connected on first use.
///
/// Panics (never skips) when the test bed's environment is missing.
pub async fn cluster() -> &'static Cluster {
    static CLUSTER: OnceCell<Cluster> = OnceCell::const_new();
    CLUSTER
        .get_or_init(|| async {
            let dir = env_path("CSI_TESTBED_DIR");
            let bin_dir = env_path("CSI_TESTBED_BIN");
            let kubeconfig = env_path("CSI_TESTBED_KUBECONFIG");
            let provisioner_kubeconfig = env_path("CSI_TESTBED_PROVISIONER_KUBECONFIG");
            let upstream_rbac_kubeconfig = env_path("CSI_TESTBED_UPSTREAM_RBAC_KUBECONFIG");
            let client = client_from_kubeconfig(&kubeconfig).await;
            if let Err(e) = client.apiserver_version().await {
                panic!(
                    "kube-apiserver of {} is not answering ({e}); is the control plane still \
                     running? {HOW_TO_RUN}",
                    kubeconfig.display()
                );
            }
            Cluster {
                client,
                kubeconfig,
                provisioner_kubeconfig,
                upstream_rbac_kubeconfig,
                bin_dir,
                dir,
            }
        })
        .await
}

/// Path of one of the test bed's Go binaries, for tests that need no control plane (only
/// `CSI_TESTBED_BIN`).
pub fn testbed_bin(name: &str) -> PathBuf {
    existing_bin(&env_path("CSI_TESTBED_BIN"), name)
}

fn existing_bin(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} does not exist; build the test bed with `make testbed` ({HOW_TO_RUN})",
        path.display()
    );
    path
}

fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!("{var} is not set: {HOW_TO_RUN}"),
    }
}

/// Builds a client whose background tasks live on [`io_runtime`] instead of the caller's.
///
/// `#[tokio::test]` gives every test its own runtime, dropped when the test ends. A plain
/// `kube::Client` spawns its request buffer on the runtime that created it and its HTTP
/// connections on the runtime that first sent a request, so a client shared through a static
/// fails with `Service(Closed)` (the buffer worker died with its runtime) as soon as the first
/// test finishes. Here every request is sent from a task of one process-wide runtime; callers
/// only await the response, which works from any runtime.
async fn client_from_kubeconfig(path: &Path) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("reading kubeconfig {}: {e}; {HOW_TO_RUN}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading kubeconfig {}: {e}", path.display()));
    let default_ns = config.default_namespace.clone();

    let _on_io_runtime = io_runtime().enter();
    let inner = kube::Client::try_from(config)
        .unwrap_or_else(|e| panic!("building a client from {}: {e}", path.display()));
    let service = tower::service_fn(move |request| {
        let inner = inner.clone();
        async move {
            io_runtime()
                .spawn(async move { inner.send(request).await })
                .await
                .unwrap_or_else(|e| Err(kube::Error::Service(Box::new(e))))
        }
    });
    kube::Client::new(service, default_ns)
}

/// One small runtime that lives as long as the test process, for the shared clients' I/O.
fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("support-kube-io")
            .enable_all()
            .build()
            .expect("building the shared I/O runtime")
    })
}
