//! The fault-injecting API proxy (`kube-fault-proxy`) between a sidecar and the test bed's
//! API server, with a kubeconfig that points at it.

use std::path::PathBuf;

use super::cluster;

pub struct FaultyApi {
    pub proxy: kube_fault_proxy::Proxy,
    /// A kubeconfig for the proxy (admin credentials, namespace `default`).
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// Starts a proxy to the test bed's API server with admin credentials.
pub async fn faulty_api() -> FaultyApi {
    let cluster = cluster().await;
    let admin = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let proxy = kube_fault_proxy::Proxy::start("127.0.0.1:0".parse().unwrap(), admin, 1)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("proxy.kubeconfig");
    proxy.write_kubeconfig(&kubeconfig, "default").unwrap();
    FaultyApi {
        proxy,
        kubeconfig,
        _dir: dir,
    }
}
