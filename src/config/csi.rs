//! The CSI driver connection (`--csi-address`, `--timeout`): where the
//! driver's socket is and how long each call to it may take.

use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;
use super::cli::heading;
use crate::duration::parse_go_duration;

/// The CSI driver connection.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CSI)]
pub struct CsiArgs {
    /// The driver's unix socket: /path, unix:///path or unix:path.
    #[arg(long, default_value = "/run/csi/socket", value_name = "PATH")]
    pub csi_address: String,

    /// Time limit of each call to the driver (CreateVolume, DeleteVolume, Probe, ...).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub timeout: Duration,
}

/// The CSI group, validated: the driver's socket path and the call timeout.
pub(super) fn validate(args: &CsiArgs) -> Result<(PathBuf, Duration), ConfigError> {
    let CsiArgs {
        csi_address,
        timeout,
    } = args;
    // Upstream does not check this, but a zero timeout fails every call.
    if timeout.is_zero() {
        return Err(ConfigError::ZeroTimeout);
    }
    Ok((csi_socket_path(csi_address)?, *timeout))
}

/// Upstream hands the address to gRPC, which (for the addresses a sidecar
/// uses) means a unix socket: `/path`, `unix:///path` or `unix:path`.
pub fn csi_socket_path(address: &str) -> Result<PathBuf, ConfigError> {
    csi_proto::parse_csi_address(address).map_err(|_| ConfigError::CsiAddress(address.to_string()))
}
