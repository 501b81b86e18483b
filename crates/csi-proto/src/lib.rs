//! CSI v1 wire types and gRPC stubs generated from `proto/csi.proto` (spec v1.14.0), plus a
//! client channel over a unix socket. `tests/spec.rs` checks the proto against the spec's own.
//!
//! Every message with a `secrets` field has a generated `Debug` that never prints the secret
//! values (see `build.rs`), so `{:?}` of a request is safe to log.

use std::fmt;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Generated CSI messages, clients (`identity_client`, `controller_client`, ...) and servers
/// (`identity_server`, `controller_server`, ...).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
    include!(concat!(env!("OUT_DIR"), "/csi.v1.redacted_debug.rs"));
}

/// Stands in for a `secrets` field in generated `Debug` output.
///
/// Only how many secrets there are is shown; keys and values never are.
#[derive(Clone, Copy)]
pub struct RedactedSecrets {
    count: Option<usize>,
}

impl RedactedSecrets {
    /// A secrets map or list holding `count` entries.
    pub fn counted(count: usize) -> Self {
        Self { count: Some(count) }
    }

    /// A secret field whose size is not meaningful.
    pub fn opaque() -> Self {
        Self { count: None }
    }
}

impl fmt::Debug for RedactedSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count {
            Some(n) => write!(f, "***stripped*** ({n} entries)"),
            None => f.write_str("***stripped***"),
        }
    }
}

/// Turns a CSI address (`unix:///abs/path`, `unix:path` or `/abs/path`) into a socket path: the
/// one parser of CSI addresses, for the sidecar's `--csi-address` and the test driver's endpoint.
/// A relative path needs the `unix:` scheme (gRPC's own spelling); any other scheme is rejected
/// because CSI drivers listen on unix sockets.
pub fn parse_csi_address(address: &str) -> Result<PathBuf, String> {
    let path = if let Some(rest) = address.strip_prefix("unix://") {
        // `unix://` must be followed by an absolute path (no authority).
        Some(rest).filter(|p| p.starts_with('/'))
    } else if let Some(rest) = address.strip_prefix("unix:") {
        Some(rest).filter(|p| !p.is_empty())
    } else {
        // A bare path must be absolute (upstream makes `/x` into `unix:///x`
        // and hands anything else to gRPC's name resolution).
        Some(address).filter(|p| p.starts_with('/'))
    };
    path.map(PathBuf::from).ok_or_else(|| {
        format!(
            "unsupported CSI address {address:?}: only unix sockets (/path, unix:///path or unix:path) are supported"
        )
    })
}

/// Opens a gRPC channel to a CSI driver listening on the unix socket at `path`.
///
/// The HTTP/2 connection is established before returning, so a missing socket fails here. The
/// URI is a placeholder required by tonic; every connection goes to `path`. Reconnects (after the
/// driver restarts) reuse the same socket path.
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    endpoint()
        .connect_with_connector(unix_connector(path))
        .await
}

/// Like [`connect_unix`], but connects on first use instead of now: useful when the driver may
/// not be up yet and the caller retries calls (e.g. a `Probe` loop).
pub fn connect_unix_lazy(path: &Path) -> Channel {
    endpoint().connect_with_connector_lazy(unix_connector(path))
}

/// Like [`connect_unix`], taking a CSI address as accepted by [`parse_csi_address`].
pub async fn connect(address: &str) -> Result<Channel, ConnectError> {
    let path = parse_csi_address(address).map_err(ConnectError::Address)?;
    connect_unix(&path).await.map_err(ConnectError::Transport)
}

/// Why [`connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    /// The address is not a unix socket address.
    Address(String),
    /// The socket could not be reached or the HTTP/2 handshake failed.
    Transport(tonic::transport::Error),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Address(message) => f.write_str(message),
            Self::Transport(err) => write!(f, "connecting to the CSI driver: {err}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Address(_) => None,
            Self::Transport(err) => Some(err),
        }
    }
}

fn endpoint() -> Endpoint {
    // Never resolved: the connector below ignores the URI.
    Endpoint::from_static("http://[::]:50051")
}

fn unix_connector(
    path: &Path,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<tokio::net::UnixStream>>> + Send,
> + Clone
+ Send
+ 'static {
    let path = path.to_path_buf();
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::v1;
    use super::*;

    const SENTINEL: &str = "SENTINEL-SECRET-42";

    fn secrets() -> HashMap<String, String> {
        HashMap::from([
            ("password".to_string(), SENTINEL.to_string()),
            ("token".to_string(), format!("prefix-{SENTINEL}")),
        ])
    }

    fn assert_redacted(debug: &str, expected_visible: &[&str]) {
        assert!(
            !debug.contains(SENTINEL),
            "secret value leaked into Debug output: {debug}"
        );
        assert!(
            debug.contains("***stripped***"),
            "no redaction marker: {debug}"
        );
        for visible in expected_visible {
            assert!(debug.contains(visible), "{visible:?} missing from {debug}");
        }
    }

    #[test]
    fn create_volume_request_debug_never_shows_secret_values() {
        let request = v1::CreateVolumeRequest {
            name: "pvc-1234".to_string(),
            parameters: HashMap::from([("type".to_string(), "fast".to_string())]),
            secrets: secrets(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        for debug in [format!("{request:?}"), format!("{request:#?}")] {
            assert_redacted(&debug, &["pvc-1234", "fast", "1073741824", "2 entries"]);
        }
    }

    #[test]
    fn delete_volume_request_debug_never_shows_secret_values() {
        let request = v1::DeleteVolumeRequest {
            volume_id: "vol-77".to_string(),
            secrets: secrets(),
        };
        for debug in [format!("{request:?}"), format!("{request:#?}")] {
            assert_redacted(&debug, &["vol-77"]);
        }
    }

    /// `{:#?}` of every message that carries secrets, each holding the two sentinel secrets, by
    /// full name. `the_redacted_messages_are_those_the_proto_marks_secret` keeps the list whole.
    fn debug_of_every_secret_bearing_message() -> Vec<(String, String)> {
        macro_rules! with_secrets {
            ($($message:ident),* $(,)?) => {
                vec![$((format!("csi.v1.{}", stringify!($message)), {
                    let mut message = v1::$message::default();
                    message.secrets = secrets();
                    format!("{message:#?}")
                })),*]
            };
        }
        with_secrets![
            CreateVolumeRequest,
            DeleteVolumeRequest,
            ControllerPublishVolumeRequest,
            ControllerUnpublishVolumeRequest,
            ValidateVolumeCapabilitiesRequest,
            ControllerListVolumeHealthRequest,
            ControllerGetVolumeHealthRequest,
            ControllerModifyVolumeRequest,
            CreateSnapshotRequest,
            DeleteSnapshotRequest,
            ListSnapshotsRequest,
            GetSnapshotRequest,
            ControllerExpandVolumeRequest,
            NodeStageVolumeRequest,
            NodePublishVolumeRequest,
            NodeGetStorageHealthRequest,
            NodeExpandVolumeRequest,
            CreateVolumeGroupSnapshotRequest,
            DeleteVolumeGroupSnapshotRequest,
            GetVolumeGroupSnapshotRequest,
            GetMetadataAllocatedRequest,
            GetMetadataDeltaRequest,
        ]
    }

    #[test]
    fn every_message_with_secrets_is_redacted() {
        for (name, debug) in debug_of_every_secret_bearing_message() {
            assert!(!debug.contains(SENTINEL), "{name} leaks a secret: {debug}");
            assert!(
                debug.contains("***stripped*** (2 entries)"),
                "{name} is not redacted: {debug}"
            );
        }
    }

    /// The list above is every message whose proto marks a field `(csi_secret)`, and build.rs,
    /// which redacts the fields named `secrets`, sees each of those fields: a spec that adds a
    /// secret field, or names one otherwise, fails here until it is covered.
    #[test]
    fn the_redacted_messages_are_those_the_proto_marks_secret() {
        let proto_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
        let mut compiler = protox::Compiler::new([&proto_dir]).unwrap();
        compiler.open_file("csi.proto").unwrap();
        let pool = compiler.descriptor_pool();
        let csi_secret = pool.get_extension_by_name("csi.v1.csi_secret").unwrap();
        let mut marked = Vec::new();
        for message in pool.all_messages() {
            for field in message.fields() {
                if field.options().has_extension(&csi_secret) {
                    assert!(
                        field.name() == "secrets" && field.is_map(),
                        "{} is secret, but build.rs redacts only the maps named `secrets`",
                        field.full_name()
                    );
                    marked.push(message.full_name().to_string());
                }
            }
        }
        marked.sort();
        let mut tested: Vec<String> = debug_of_every_secret_bearing_message()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        tested.sort();
        assert_eq!(tested, marked);
    }

    #[test]
    fn redaction_keeps_oneof_and_nested_fields_and_hides_secrets() {
        // A sample across services, including oneof-bearing and nested-message fields.
        let debugs = [
            format!(
                "{:?}",
                v1::ControllerPublishVolumeRequest {
                    volume_id: "vol-1".into(),
                    secrets: secrets(),
                    volume_capability: Some(v1::VolumeCapability {
                        access_type: Some(v1::volume_capability::AccessType::Mount(
                            v1::volume_capability::MountVolume::default()
                        )),
                        access_mode: None,
                    }),
                    ..Default::default()
                }
            ),
            format!(
                "{:#?}",
                v1::CreateSnapshotRequest {
                    name: "snap-1".into(),
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                v1::NodeExpandVolumeRequest {
                    volume_id: "vol-1".into(),
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                v1::GetMetadataDeltaRequest {
                    base_snapshot_id: "snap-1".into(),
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
        ];
        for debug in &debugs {
            assert!(!debug.contains(SENTINEL), "leak: {debug}");
            assert!(debug.contains("***stripped***"), "not redacted: {debug}");
        }
    }

    #[test]
    fn messages_without_secrets_keep_derived_debug() {
        let response = v1::GetPluginInfoResponse {
            name: "example.csi.io".into(),
            vendor_version: "1.0".into(),
            manifest: HashMap::new(),
        };
        let debug = format!("{response:?}");
        assert!(debug.contains("example.csi.io"));
        assert!(!debug.contains("stripped"));
    }

    #[test]
    fn parse_csi_address_accepts_unix_forms() {
        let cases = [
            ("unix:///run/csi/socket", Ok("/run/csi/socket")),
            ("unix:/run/csi/socket", Ok("/run/csi/socket")),
            ("unix:csi.sock", Ok("csi.sock")),
            ("/run/csi/socket", Ok("/run/csi/socket")),
            ("  /run/csi/socket ", Err(())),
            ("csi.sock", Err(())),
            ("unix://relative", Err(())),
            ("unix:", Err(())),
            ("", Err(())),
            ("unix://", Err(())),
            ("tcp://127.0.0.1:10000", Err(())),
        ];
        for (input, expected) in cases {
            let got = parse_csi_address(input);
            match expected {
                Ok(path) => assert_eq!(got, Ok(PathBuf::from(path)), "input {input:?}"),
                Err(()) => assert!(got.is_err(), "input {input:?} gave {got:?}"),
            }
        }
    }

    /// A real gRPC round trip over a unix socket through [`connect_unix`].
    #[tokio::test]
    async fn connect_unix_talks_to_a_server_on_a_socket() {
        use tonic::{Request, Response, Status};

        struct Identity;

        #[tonic::async_trait]
        impl v1::identity_server::Identity for Identity {
            async fn get_plugin_info(
                &self,
                _: Request<v1::GetPluginInfoRequest>,
            ) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
                Ok(Response::new(v1::GetPluginInfoResponse {
                    name: "roundtrip.csi.example.com".into(),
                    vendor_version: "0.0.1".into(),
                    manifest: HashMap::new(),
                }))
            }
            async fn get_plugin_capabilities(
                &self,
                _: Request<v1::GetPluginCapabilitiesRequest>,
            ) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
                Err(Status::unimplemented("not needed"))
            }
            async fn probe(
                &self,
                _: Request<v1::ProbeRequest>,
            ) -> Result<Response<v1::ProbeResponse>, Status> {
                Ok(Response::new(v1::ProbeResponse { ready: Some(true) }))
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::identity_server::IdentityServer::new(Identity))
                .serve_with_incoming(incoming),
        );

        let address = format!("unix://{}", socket.display());
        let channel = connect(&address).await.unwrap();
        let mut client = v1::identity_client::IdentityClient::new(channel);
        let info = client
            .get_plugin_info(v1::GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "roundtrip.csi.example.com");
        let probe = client
            .probe(v1::ProbeRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(probe.ready, Some(true));

        let missing = connect_unix(&dir.path().join("absent.sock")).await;
        assert!(missing.is_err());
    }
}
