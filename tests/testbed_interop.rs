//! Proof that our generated CSI client (`csi-proto`, from `proto/csi.proto`) and an independent
//! CSI implementation agree on the wire: k8s's in-memory mock CSI driver, compiled from the Go
//! spec bindings (`testbed/cmd/csi-mock-driver`), answers every call we make with the fields
//! we expect, including oneof capabilities, wrapper types and status codes.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use csi_proto::v1;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

use support::{ChildProcess, testbed_bin, unique_name, wait_for_socket};

const GIB: i64 = 1 << 30;

/// One mock driver on its own socket, with a unique name.
struct MockDriver {
    name: String,
    channel: Channel,
    // Field order: the connection goes before the process, the process before its socket dir.
    process: ChildProcess,
    _socket_dir: tempfile::TempDir,
}

impl MockDriver {
    async fn start() -> MockDriver {
        let name = format!("{}.csi.invalid", unique_name("interop"));
        let socket_dir = tempfile::tempdir().expect("creating a socket directory");
        let socket: PathBuf = socket_dir.path().join("csi.sock");
        let mut process = ChildProcess::spawn(
            Command::new(testbed_bin("csi-mock-driver"))
                .arg(format!("--endpoint=unix://{}", socket.display()))
                .arg(format!("--drivername={name}")),
        );
        wait_for_socket(&mut process, &socket, Duration::from_secs(30)).await;
        let channel = csi_proto::connect_unix(&socket)
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
        MockDriver {
            name,
            channel,
            process,
            _socket_dir: socket_dir,
        }
    }

    fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
}

fn mount_capability() -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_type: Some(v1::volume_capability::AccessType::Mount(
            v1::volume_capability::MountVolume {
                fs_type: "ext4".to_string(),
                mount_flags: vec!["noatime".to_string()],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(v1::volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn create_request(name: &str, required_bytes: i64) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability()],
        parameters: [("type".to_string(), "fast".to_string())].into(),
        ..Default::default()
    }
}

/// Ids of the volumes the driver holds (the mock starts with three of its own, "Mock Volume 1..3").
async fn listed_volume_ids(driver: &MockDriver) -> Vec<String> {
    driver
        .controller()
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume.map(|v| v.volume_id))
        .collect()
}

#[tokio::test]
async fn identity_service_reports_readiness_name_and_controller_service() {
    let driver = MockDriver::start().await;
    let mut identity = driver.identity();

    let probe = identity
        .probe(v1::ProbeRequest {})
        .await
        .expect("Probe")
        .into_inner();
    // `ready` is a google.protobuf.BoolValue: set and true.
    assert_eq!(probe.ready, Some(true));

    let info = identity
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo")
        .into_inner();
    assert_eq!(info.name, driver.name);
    assert!(!info.vendor_version.is_empty(), "{info:?}");

    let capabilities = identity
        .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
        .await
        .expect("GetPluginCapabilities")
        .into_inner()
        .capabilities;
    use v1::plugin_capability::{Type, service};
    let services: Vec<i32> = capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert!(
        services.contains(&(service::Type::ControllerService as i32)),
        "{capabilities:?}"
    );
    // The mock also advertises online expansion, through the other arm of the oneof.
    assert!(
        capabilities
            .iter()
            .any(|c| matches!(c.r#type, Some(Type::VolumeExpansion(_)))),
        "{capabilities:?}"
    );
    assert!(driver.process.log_contents().contains(&driver.name));
}

#[tokio::test]
async fn controller_advertises_create_delete_volume() {
    let driver = MockDriver::start().await;
    let capabilities = driver
        .controller()
        .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
        .await
        .expect("ControllerGetCapabilities")
        .into_inner()
        .capabilities;
    use v1::controller_service_capability::{Type, rpc};
    let rpcs: Vec<rpc::Type> = capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Rpc(r)) => rpc::Type::try_from(r.r#type).ok(),
            _ => None,
        })
        .collect();
    assert!(rpcs.contains(&rpc::Type::CreateDeleteVolume), "{rpcs:?}");
    assert!(rpcs.contains(&rpc::Type::ListVolumes), "{rpcs:?}");
    // Attach is disabled in testbed/cmd/csi-mock-driver, so the mock must not claim it.
    assert!(
        !rpcs.contains(&rpc::Type::PublishUnpublishVolume),
        "{rpcs:?}"
    );
}

#[tokio::test]
async fn create_volume_twice_with_one_name_returns_the_same_volume() {
    let driver = MockDriver::start().await;
    let mut controller = driver.controller();

    let first = controller
        .create_volume(create_request("pvc-interop-1", GIB))
        .await
        .expect("first CreateVolume")
        .into_inner()
        .volume
        .expect("CreateVolume returns a volume");
    assert!(!first.volume_id.is_empty());
    assert_eq!(first.capacity_bytes, GIB);
    // The mock echoes the CSI name into the volume context.
    assert_eq!(
        first.volume_context.get("name").map(String::as_str),
        Some("pvc-interop-1")
    );

    let second = controller
        .create_volume(create_request("pvc-interop-1", GIB))
        .await
        .expect("second CreateVolume with the same name")
        .into_inner()
        .volume
        .expect("CreateVolume returns a volume");
    assert_eq!(second.volume_id, first.volume_id);
    let listed = listed_volume_ids(&driver).await;
    assert_eq!(
        listed.iter().filter(|id| **id == first.volume_id).count(),
        1,
        "{listed:?}"
    );

    // Another name is another volume.
    let other = controller
        .create_volume(create_request("pvc-interop-2", GIB))
        .await
        .expect("CreateVolume of a second name")
        .into_inner()
        .volume
        .expect("CreateVolume returns a volume");
    assert_ne!(other.volume_id, first.volume_id);
}

#[tokio::test]
async fn create_volume_larger_than_the_existing_one_of_that_name_is_already_exists() {
    let driver = MockDriver::start().await;
    let mut controller = driver.controller();
    controller
        .create_volume(create_request("pvc-interop-grow", GIB))
        .await
        .expect("CreateVolume");
    let status = controller
        .create_volume(create_request("pvc-interop-grow", 2 * GIB))
        .await
        .expect_err("an incompatible CreateVolume under an existing name must fail");
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");

    // A request without capabilities is the caller's fault.
    let status = controller
        .create_volume(v1::CreateVolumeRequest {
            name: "pvc-interop-nocaps".to_string(),
            ..Default::default()
        })
        .await
        .expect_err("CreateVolume without capabilities must fail");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn delete_volume_twice_succeeds_both_times_and_removes_the_volume() {
    let driver = MockDriver::start().await;
    let mut controller = driver.controller();
    let volume = controller
        .create_volume(create_request("pvc-interop-del", GIB))
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("CreateVolume returns a volume");
    assert!(listed_volume_ids(&driver).await.contains(&volume.volume_id));

    for attempt in ["first", "second"] {
        controller
            .delete_volume(v1::DeleteVolumeRequest {
                volume_id: volume.volume_id.clone(),
                secrets: [("token".to_string(), "not-a-real-secret".to_string())].into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{attempt} DeleteVolume: {e:?}"));
    }
    let listed = listed_volume_ids(&driver).await;
    assert!(!listed.contains(&volume.volume_id), "{listed:?}");
}
