//! A CSI client over a unix socket. Every call is bounded by `--timeout`,
//! recorded in `csi_sidecar_operations_seconds`, and logged at debug level with
//! secrets redacted (the generated `Debug` of messages with secrets never
//! prints their values).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::debug;

use super::pb;
use super::socket_access::{PermissionDenied, io_error_kind};
use crate::keys;
use crate::metrics::{CsiOperationLabels, Metrics};

/// Why [`CsiClient::identify`] failed (upstream's texts).
#[derive(Debug, thiserror::Error)]
pub enum IdentifyError {
    #[error("error getting CSI driver name: {0}")]
    PluginInfo(Status),
    #[error("CSI driver returned an empty name")]
    EmptyDriverName,
    #[error("error getting CSI driver capabilities: {0}")]
    Capabilities(Status),
}

/// What the driver told us it can do, read once at start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    pub controller_service: bool,
    pub accessibility_constraints: bool,
    pub create_delete_volume: bool,
    pub publish_unpublish_volume: bool,
    pub clone_volume: bool,
    pub create_delete_snapshot: bool,
    pub single_node_multi_writer: bool,
    pub modify_volume: bool,
    pub get_capacity: bool,
    /// `ListVolumes` (only `csi-provisioner audit` asks).
    pub list_volumes: bool,
}

impl DriverCapabilities {
    pub fn from_responses(
        plugin: &pb::GetPluginCapabilitiesResponse,
        controller: Option<&pb::ControllerGetCapabilitiesResponse>,
    ) -> DriverCapabilities {
        use pb::controller_service_capability::rpc::Type as Rpc;
        use pb::plugin_capability::service::Type as Svc;
        let mut caps = DriverCapabilities::default();
        for cap in &plugin.capabilities {
            if let Some(pb::plugin_capability::Type::Service(s)) = &cap.r#type {
                match Svc::try_from(s.r#type) {
                    Ok(Svc::ControllerService) => caps.controller_service = true,
                    Ok(Svc::VolumeAccessibilityConstraints) => {
                        caps.accessibility_constraints = true
                    }
                    _ => {}
                }
            }
        }
        for cap in controller
            .map(|c| c.capabilities.as_slice())
            .unwrap_or_default()
        {
            if let Some(pb::controller_service_capability::Type::Rpc(r)) = &cap.r#type {
                match Rpc::try_from(r.r#type) {
                    Ok(Rpc::CreateDeleteVolume) => caps.create_delete_volume = true,
                    Ok(Rpc::PublishUnpublishVolume) => caps.publish_unpublish_volume = true,
                    Ok(Rpc::CloneVolume) => caps.clone_volume = true,
                    Ok(Rpc::CreateDeleteSnapshot) => caps.create_delete_snapshot = true,
                    Ok(Rpc::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                    Ok(Rpc::ModifyVolume) => caps.modify_volume = true,
                    Ok(Rpc::GetCapacity) => caps.get_capacity = true,
                    Ok(Rpc::ListVolumes) => caps.list_volumes = true,
                    _ => {}
                }
            }
        }
        caps
    }

    /// Upstream refuses every Provision/Delete (but still starts) when this is false.
    pub fn supports_provisioning(&self) -> bool {
        self.controller_service && self.create_delete_volume
    }
}

/// Why [`CsiClient::connect`] gave up after its dial timeout.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The socket, or its directory, refuses our UID.
    #[error("{0}")]
    PermissionDenied(PermissionDenied),
    /// No socket, nobody listening, or the HTTP/2 handshake failed.
    #[error("failed to connect to CSI driver at {}: {}", path.display(), with_sources(source))]
    Unreachable {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}

/// An error and its sources in one line: tonic's own text is only
/// "transport error", the reason (`No such file or directory`) is a source.
pub fn with_sources(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = e.source();
    }
    line
}

#[derive(Clone)]
pub struct CsiClient {
    channel: Channel,
    timeout: Duration,
    driver_name: Arc<str>,
    /// The `migrated` label of this client's calls: `None` unless the driver
    /// is the target of an in-tree plugin's migration (then `false`, or
    /// `true` on the client [`CsiClient::for_migrated`] returns).
    migrated: Option<bool>,
    metrics: Arc<Metrics>,
}

impl CsiClient {
    /// Connects to the unix socket at `path`, retrying until `dial_timeout`
    /// (upstream: 30 s, then exit). A socket that refuses our UID is reported
    /// at once, in one line that says what to change, and still retried: a
    /// driver may fix the socket's mode just after creating it.
    pub async fn connect(
        path: &Path,
        timeout: Duration,
        dial_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<CsiClient, ConnectError> {
        let deadline = Instant::now() + dial_timeout;
        let mut last_log = Instant::now();
        let mut refusal_reported = false;
        let channel = loop {
            let e = match csi_proto::connect_unix(path).await {
                Ok(channel) => break channel,
                Err(e) => e,
            };
            let refused = io_error_kind(&e) == Some(std::io::ErrorKind::PermissionDenied);
            if Instant::now() >= deadline {
                return Err(if refused {
                    ConnectError::PermissionDenied(PermissionDenied::observe(path))
                } else {
                    ConnectError::Unreachable {
                        path: path.to_path_buf(),
                        source: e,
                    }
                });
            }
            if refused && !refusal_reported {
                tracing::warn!("{}", PermissionDenied::observe(path));
                refusal_reported = true;
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                tracing::warn!(address = %path.display(), "still connecting to the CSI driver");
                last_log = Instant::now();
            }
            debug!(error = %with_sources(&e), "CSI connect failed; retrying");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        Ok(CsiClient {
            channel,
            timeout,
            driver_name: Arc::from(""),
            migrated: None,
            metrics,
        })
    }

    /// Records the driver name (from `GetPluginInfo`) used as a metric label.
    /// A driver an in-tree plugin migrates to also gets the `migrated` label
    /// on every call from now on, as upstream's metrics manager "with
    /// migration" does.
    pub fn set_driver_name(&mut self, name: &str) {
        self.driver_name = Arc::from(name);
        self.migrated = keys::MIGRATED_PLUGINS
            .iter()
            .any(|(_, driver)| *driver == name)
            .then_some(false);
    }

    /// The same connection, its calls labelled `migrated="true"` when
    /// `migrated` (the create or delete of an in-tree plugin's volume) and the
    /// driver is a migration target; unchanged otherwise.
    pub fn for_migrated(&self, migrated: bool) -> CsiClient {
        CsiClient {
            migrated: self.migrated.map(|_| migrated),
            ..self.clone()
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same connection with another per-call time limit.
    pub fn with_timeout(&self, timeout: Duration) -> CsiClient {
        CsiClient {
            timeout,
            ..self.clone()
        }
    }

    fn identity(&self) -> pb::identity_client::IdentityClient<Channel> {
        pb::identity_client::IdentityClient::new(self.channel.clone())
    }

    fn node(&self) -> pb::node_client::NodeClient<Channel> {
        pb::node_client::NodeClient::new(self.channel.clone())
    }

    /// `NodeGetInfo`: the node's id and topology (`--node-deployment`).
    pub async fn node_get_info(&self) -> Result<pb::NodeGetInfoResponse, Status> {
        // The topology comes from the node plugin, as upstream v6.4 (spec v1.13, without
        // `controller_get_node_info`) has it.
        let request = pb::NodeGetInfoRequest {
            controller_get_node_info: false,
        };
        self.call(
            "/csi.v1.Node/NodeGetInfo",
            self.node().node_get_info(request),
        )
        .await
    }

    fn controller(&self) -> pb::controller_client::ControllerClient<Channel> {
        pb::controller_client::ControllerClient::new(self.channel.clone())
    }

    /// Runs one call with the per-call timeout, records its duration and code.
    async fn call<T, F>(&self, method: &'static str, fut: F) -> Result<T, Status>
    where
        F: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r
                .map(tonic::Response::into_inner)
                .map_err(transport_unavailable),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{method} timed out after {:?}",
                self.timeout
            ))),
        };
        let code = match &result {
            Ok(_) => "OK".to_string(),
            Err(s) => code_name(s.code()).to_string(),
        };
        self.metrics
            .csi_operations
            .get_or_create(&CsiOperationLabels {
                driver_name: self.driver_name.to_string(),
                method_name: method.to_string(),
                grpc_status_code: code,
                migrated: self.migrated,
            })
            .observe(start.elapsed().as_secs_f64());
        result
    }

    pub async fn probe(&self) -> Result<pb::ProbeResponse, Status> {
        self.call(
            "/csi.v1.Identity/Probe",
            self.identity().probe(pb::ProbeRequest {}),
        )
        .await
    }

    pub async fn get_plugin_info(&self) -> Result<pb::GetPluginInfoResponse, Status> {
        self.call(
            "/csi.v1.Identity/GetPluginInfo",
            self.identity().get_plugin_info(pb::GetPluginInfoRequest {}),
        )
        .await
    }

    pub async fn get_plugin_capabilities(
        &self,
    ) -> Result<pb::GetPluginCapabilitiesResponse, Status> {
        self.call(
            "/csi.v1.Identity/GetPluginCapabilities",
            self.identity()
                .get_plugin_capabilities(pb::GetPluginCapabilitiesRequest {}),
        )
        .await
    }

    pub async fn controller_get_capabilities(
        &self,
    ) -> Result<pb::ControllerGetCapabilitiesResponse, Status> {
        self.call(
            "/csi.v1.Controller/ControllerGetCapabilities",
            self.controller()
                .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {}),
        )
        .await
    }

    pub async fn create_volume(
        &self,
        req: pb::CreateVolumeRequest,
    ) -> Result<pb::CreateVolumeResponse, Status> {
        debug!(request = ?req, "CreateVolume");
        let res = self
            .call(
                "/csi.v1.Controller/CreateVolume",
                self.controller().create_volume(req),
            )
            .await;
        debug!(response = ?res, "CreateVolume done");
        res
    }

    /// `DeleteVolume` of `volume_id`. `NotFound` is what was wanted: the
    /// volume is gone, so it is success (CSI makes the call idempotent).
    pub async fn delete_volume(
        &self,
        volume_id: &str,
        secrets: std::collections::HashMap<String, String>,
    ) -> Result<(), Status> {
        match self.delete_volume_as_answered(volume_id, secrets).await {
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            other => other,
        }
    }

    /// `DeleteVolume` of `volume_id`, with the driver's answer as it is
    /// (`csi-provisioner check` judges whether `NotFound` was said).
    pub async fn delete_volume_as_answered(
        &self,
        volume_id: &str,
        secrets: std::collections::HashMap<String, String>,
    ) -> Result<(), Status> {
        let req = pb::DeleteVolumeRequest {
            volume_id: volume_id.to_string(),
            secrets,
        };
        debug!(request = ?req, "DeleteVolume");
        let res = self
            .call(
                "/csi.v1.Controller/DeleteVolume",
                self.controller().delete_volume(req),
            )
            .await;
        debug!(response = ?res, "DeleteVolume done");
        res.map(drop)
    }

    /// One page of `ListVolumes`: at most `max_entries` (0: the driver
    /// chooses), from `starting_token` (empty: the first page).
    pub async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> Result<pb::ListVolumesResponse, Status> {
        self.call(
            "/csi.v1.Controller/ListVolumes",
            self.controller().list_volumes(pb::ListVolumesRequest {
                max_entries,
                starting_token,
            }),
        )
        .await
    }

    /// Probes until the driver says it is ready (upstream ProbeForever): absent
    /// `ready` means ready; `ready=false` and timeouts are retried every second;
    /// any other error is returned (the caller exits).
    /// The driver's name (`GetPluginInfo`, also used from now on in the
    /// metrics) and its capabilities: what every user of a driver asks
    /// first, after `Probe`.
    pub async fn identify(
        &mut self,
    ) -> Result<(pb::GetPluginInfoResponse, DriverCapabilities), IdentifyError> {
        let info = self
            .get_plugin_info()
            .await
            .map_err(IdentifyError::PluginInfo)?;
        if info.name.is_empty() {
            return Err(IdentifyError::EmptyDriverName);
        }
        self.set_driver_name(&info.name);
        let plugin = self
            .get_plugin_capabilities()
            .await
            .map_err(IdentifyError::Capabilities)?;
        let controller = if DriverCapabilities::from_responses(&plugin, None).controller_service {
            Some(
                self.controller_get_capabilities()
                    .await
                    .map_err(IdentifyError::Capabilities)?,
            )
        } else {
            None
        };
        let capabilities = DriverCapabilities::from_responses(&plugin, controller.as_ref());
        Ok((info, capabilities))
    }

    /// `GetCapacity` for a class's parameters in a topology segment (`None`:
    /// the driver has no topology), as the capacity tracker asks it.
    pub async fn get_capacity(
        &self,
        parameters: std::collections::HashMap<String, String>,
        segment: Option<std::collections::HashMap<String, String>>,
    ) -> Result<pb::GetCapacityResponse, Status> {
        let req = pb::GetCapacityRequest {
            volume_capabilities: Vec::new(),
            parameters,
            accessible_topology: segment.map(|segments| pb::Topology { segments }),
        };
        debug!(request = ?req, "GetCapacity");
        let res = self
            .call(
                "/csi.v1.Controller/GetCapacity",
                self.controller().get_capacity(req),
            )
            .await;
        debug!(response = ?res, "GetCapacity done");
        res
    }

    pub async fn probe_until_ready(&self) -> Result<(), Status> {
        loop {
            match self.probe().await {
                Ok(r) if r.ready.unwrap_or(true) => return Ok(()),
                Ok(_) => tracing::info!("CSI driver is not ready yet"),
                Err(s) if s.code() == Code::DeadlineExceeded => {
                    tracing::info!("CSI Probe timed out")
                }
                Err(s) => return Err(s),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// gRPC code names as Go's `codes.Code.String()` spells them (metric label values).
/// A call cut by the connection (the driver died mid-call, a reset) is, as
/// gRPC-Go reports it, `Unavailable`: the request may have reached the driver.
/// tonic reports it as `Unknown` with the transport error as its source, which
/// would read as a final answer from the driver ("nothing was created").
fn transport_unavailable(status: Status) -> Status {
    if status.code() == Code::Unknown && std::error::Error::source(&status).is_some() {
        Status::unavailable(format!(
            "connection to the driver lost: {}",
            status.message()
        ))
    } else {
        status
    }
}

pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let err = CsiClient::connect(
            &path,
            Duration::from_secs(1),
            Duration::ZERO,
            Arc::new(Metrics::unregistered()),
        )
        .await
        .err()
        .expect("nothing listens there");
        // The kernel's answer is found through tonic's wrapping: this is how
        // an EACCES is recognised (which a test running as root cannot cause).
        let ConnectError::Unreachable { source, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(io_error_kind(source), Some(std::io::ErrorKind::NotFound));
        let line = err.to_string();
        assert!(
            line.starts_with(&format!(
                "failed to connect to CSI driver at {}: transport error: ",
                path.display()
            )),
            "{line}"
        );
        assert!(line.contains("No such file or directory"), "{line}");
    }

    #[test]
    fn a_call_cut_by_the_connection_is_unavailable_not_a_final_unknown() {
        let cut = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset",
        )));
        assert_eq!(cut.code(), Code::Unknown, "how tonic reports it");
        let seen = transport_unavailable(cut);
        assert_eq!(seen.code(), Code::Unavailable);
        assert!(crate::csi::classify(seen.code(), false).volume_may_exist());

        // The driver's own Unknown stays what the driver said.
        let driver = Status::unknown("backend said so");
        assert_eq!(transport_unavailable(driver).code(), Code::Unknown);
    }
}
