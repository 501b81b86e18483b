//! The driver, first thing at start-up: connect (30 s, as upstream), wait
//! for `Probe`, learn its name and capabilities, and with `--node-deployment`
//! what it says about this node; the PVs' provisioner identity follows.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::FatalError;
use crate::config::NodeDeploymentConfig;
use crate::controller::node::{NodeMode, Placement};
use crate::csi::{CsiClient, DriverCapabilities, pb};
use crate::metrics::Metrics;
use crate::provision::DriverInfo;

/// The driver as the reconcilers know it.
pub(super) struct Driver {
    pub csi: CsiClient,
    pub info: DriverInfo,
    /// Where this replica runs: centrally, or one per node (`--node-deployment`).
    pub place: Placement,
}

/// Connects to the driver at `socket` (each call limited to `timeout`) and
/// learns what it is. `None` when `stop` comes before the driver answered:
/// a stop during start-up ends it at once (upstream dies on the signal).
pub(super) async fn connect(
    socket: &Path,
    timeout: Duration,
    node_deployment: Option<NodeDeploymentConfig>,
    metrics: Arc<Metrics>,
    stop: &CancellationToken,
) -> Result<Option<Driver>, FatalError> {
    let (csi, info, capabilities) = tokio::select! {
        r = identify(socket, timeout, metrics) => r?,
        _ = stop.cancelled() => return Ok(None),
    };
    let identity = format!(
        "{}-{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
        rand::random_range(0..10000),
        info.name
    );
    let place = match node_deployment {
        None => Placement::Central,
        Some(nd) => Placement::Node(node_mode(&csi, nd).await?),
    };
    // The identity names the node too.
    let identity = place.identity(identity);
    info!(driver = %info.name, version = %info.vendor_version, ?capabilities, "connected to CSI driver");
    let info = DriverInfo {
        name: info.name,
        identity,
        capabilities,
    };
    Ok(Some(Driver { csi, info, place }))
}

/// Connects, waits for `Probe`, and reads the driver's name and capabilities.
async fn identify(
    socket: &Path,
    timeout: Duration,
    metrics: Arc<Metrics>,
) -> Result<(CsiClient, pb::GetPluginInfoResponse, DriverCapabilities), FatalError> {
    let mut csi = CsiClient::connect(socket, timeout, Duration::from_secs(30), metrics).await?;
    csi.probe_until_ready().await.map_err(FatalError::Probe)?;
    let (info, capabilities) = csi.identify().await?;
    if !capabilities.supports_provisioning() {
        warn!(driver = %info.name, "driver does not support dynamic provisioning; every claim will fail");
    }
    Ok((csi, info, capabilities))
}

/// One sidecar per node: what the driver says about this node, fatal on
/// error as upstream.
async fn node_mode(csi: &CsiClient, nd: NodeDeploymentConfig) -> Result<NodeMode, FatalError> {
    let NodeDeploymentConfig {
        node_name,
        immediate_binding,
        base_delay,
        max_delay,
    } = nd;
    let info = csi.node_get_info().await.map_err(FatalError::NodeInfo)?;
    let topology = info
        .accessible_topology
        .map(|t| t.segments.into_iter().collect());
    info!(node = %node_name, node_id = %info.node_id, ?topology, "node deployment");
    Ok(NodeMode {
        name: node_name,
        topology,
        immediate_binding,
        base_delay,
        max_delay,
    })
}
