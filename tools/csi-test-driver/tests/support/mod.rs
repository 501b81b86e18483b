//! Shared set-up for the driver's integration tests: start the real binary in a temporary
//! directory and talk gRPC to it over its unix socket.

#![allow(dead_code)] // Each test file uses a different part of this module.

use std::collections::HashMap;
use std::path::Path;

use csi_proto::v1;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_test_driver::control::Client;
use csi_test_driver::process::{DriverOptions, DriverProcess};
use tempfile::TempDir;
use tonic::transport::Channel;

pub const GIB: i64 = 1 << 30;

/// A running driver in its own temporary directory.
pub struct Harness {
    pub driver: DriverProcess,
    pub control: Client,
    // Dropped last: the process must die before its directory goes away.
    pub dir: TempDir,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(DriverOptions::default()).await
    }

    pub async fn start_with(options: DriverOptions) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let driver = DriverProcess::start(binary(), dir.path(), &options)
            .await
            .expect("driver starts");
        let control = driver.control().await.expect("control socket");
        Harness {
            driver,
            control,
            dir,
        }
    }

    pub async fn channel(&self) -> Channel {
        csi_proto::connect_unix(&self.driver.endpoint)
            .await
            .expect("CSI socket")
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }
}

pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_csi-test-driver"))
}

pub fn mount_capability() -> v1::VolumeCapability {
    v1::VolumeCapability {
        access_type: Some(v1::volume_capability::AccessType::Mount(
            v1::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(v1::volume_capability::AccessMode {
            mode: v1::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A CreateVolume request as the provisioner would send it.
pub fn create_request(name: &str, required_bytes: i64) -> v1::CreateVolumeRequest {
    v1::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(v1::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability()],
        parameters: HashMap::from([("type".to_string(), "fast".to_string())]),
        secrets: HashMap::from([("password".to_string(), "SENTINEL-SECRET-42".to_string())]),
        ..Default::default()
    }
}

pub fn delete_request(volume_id: &str) -> v1::DeleteVolumeRequest {
    v1::DeleteVolumeRequest {
        volume_id: volume_id.to_string(),
        secrets: HashMap::new(),
    }
}
