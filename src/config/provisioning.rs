//! Provisioning and deletion (`--volume-name-*`, `--retry-interval-*`,
//! `--worker-threads`, topology, fsType, and the flags of data sources):
//! what shapes each request and PV, and how the work is paced.

use std::time::Duration;

use super::ConfigError;
use super::cli::heading;
use super::values::to_usize;
use crate::duration::{format_go_duration, parse_go_duration};

/// Longest `--volume-name-uuid-length` that fits a dashless UID (32 hex
/// characters). Upstream slices the UID and panics above this.
const MAX_VOLUME_NAME_UUID_LENGTH: i64 = 32;

/// Provisioning and deletion of volumes.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::PROVISIONING)]
pub struct ProvisioningArgs {
    /// Prefix of the PersistentVolume name, which is also the name passed to CreateVolume.
    #[arg(long, default_value = "pvc", value_name = "PREFIX")]
    pub volume_name_prefix: String,

    /// Characters of the claim's UID in the volume name, dashes removed (at most 32);
    /// -1 keeps the whole UID with its dashes.
    #[arg(long, default_value_t = -1, value_name = "N")]
    pub volume_name_uuid_length: i64,

    /// First wait before retrying a failed provisioning or deletion; it doubles
    /// with each failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Longest wait between retries of a failed provisioning or deletion.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Claims provisioned at once (and volumes deleted at once).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub worker_threads: u64,

    /// Workers removing the finalizers that protect the source claim of a clone.
    #[arg(long, default_value_t = 1, value_name = "N", help_heading = heading::DATA_SOURCES)]
    pub cloning_protection_threads: u64,

    /// How often to look for snapshot source-protection finalizers left behind; 0 never.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration,
          value_name = "DURATION", help_heading = heading::DATA_SOURCES)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// With WaitForFirstConsumer: give CreateVolume only the selected node's topology.
    #[arg(long)]
    pub strict_topology: bool,

    /// With Immediate binding: give CreateVolume the topology of the whole cluster
    /// (true) or none (false).
    #[arg(long, default_value = "true")]
    pub immediate_topology: bool,

    /// Pass the claim's name and namespace and the PersistentVolume's name to
    /// CreateVolume as parameters.
    #[arg(long)]
    pub extra_create_metadata: bool,

    /// Filesystem type of volumes whose StorageClass sets none.
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Make the PersistentVolume read-only when the claim's only access mode is ReadOnlyMany.
    #[arg(long)]
    pub controller_publish_readonly: bool,

    /// Refuse to restore a snapshot into a volume of another mode (Filesystem, Block)
    /// unless the snapshot allows it.
    #[arg(long, default_value = "true", help_heading = heading::DATA_SOURCES)]
    pub prevent_volume_mode_conversion: bool,

    /// The provisioning intent is added by the control plane
    /// (deploy/kubernetes/provisioning-intent-policy.yaml): claims that carry it are
    /// checked against the claim cache in rounds shared by many claims instead of
    /// with a write each; a claim without it still gets the sidecar's own write. Not
    /// with --node-deployment.
    #[arg(long)]
    pub admission_intent: bool,

    /// With --admission-intent: during a burst, take the version those checks wait for
    /// from our own PV creates instead of a list request of its own. Used only while it
    /// agrees with the lists the checks send anyway, which it cannot where PVs and claims
    /// are kept in different etcds (--etcd-servers-overrides); false turns it off.
    #[arg(long, default_value = "true")]
    pub freshness_from_writes: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisioningConfig {
    pub volume_name_prefix: String,
    /// `None` (`-1`): the whole PVC UID, dashes included. `Some(n)`: the UID
    /// without dashes, cut to `n` characters (1..=32).
    pub volume_name_uuid_length: Option<usize>,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
    pub worker_threads: usize,
    pub cloning_protection_threads: usize,
    /// `None` (`0`): the orphaned-finalizer sweep is off.
    pub snapshot_orphan_sweep_interval: Option<Duration>,
    pub strict_topology: bool,
    pub immediate_topology: bool,
    pub extra_create_metadata: bool,
    /// `None`: leave fsType unset when the StorageClass has none.
    pub default_fstype: Option<String>,
    pub controller_publish_readonly: bool,
    pub prevent_volume_mode_conversion: bool,
    pub admission_intent: bool,
    pub freshness_from_writes: bool,
}

/// The provisioning group, validated.
pub(super) fn validate(args: &ProvisioningArgs) -> Result<ProvisioningConfig, ConfigError> {
    let ProvisioningArgs {
        volume_name_prefix,
        volume_name_uuid_length,
        retry_interval_start,
        retry_interval_max,
        worker_threads,
        cloning_protection_threads,
        snapshot_orphan_sweep_interval,
        strict_topology,
        immediate_topology,
        extra_create_metadata,
        default_fstype,
        controller_publish_readonly,
        prevent_volume_mode_conversion,
        admission_intent,
        freshness_from_writes,
    } = args;
    if volume_name_prefix.is_empty() {
        return Err(ConfigError::EmptyVolumeNamePrefix);
    }
    let volume_name_uuid_length = volume_name_uuid_length_of(*volume_name_uuid_length)?;
    if retry_interval_start > retry_interval_max {
        return Err(ConfigError::RetryIntervals {
            start: format_go_duration(*retry_interval_start),
            max: format_go_duration(*retry_interval_max),
        });
    }
    if *worker_threads == 0 {
        return Err(ConfigError::NoWorkers);
    }
    Ok(ProvisioningConfig {
        volume_name_prefix: volume_name_prefix.clone(),
        volume_name_uuid_length,
        retry_interval_start: *retry_interval_start,
        retry_interval_max: *retry_interval_max,
        worker_threads: to_usize(*worker_threads),
        cloning_protection_threads: to_usize(*cloning_protection_threads),
        snapshot_orphan_sweep_interval: Some(*snapshot_orphan_sweep_interval)
            .filter(|d| !d.is_zero()),
        strict_topology: *strict_topology,
        immediate_topology: *immediate_topology,
        extra_create_metadata: *extra_create_metadata,
        default_fstype: Some(default_fstype.clone()).filter(|f| !f.is_empty()),
        controller_publish_readonly: *controller_publish_readonly,
        prevent_volume_mode_conversion: *prevent_volume_mode_conversion,
        admission_intent: *admission_intent,
        freshness_from_writes: *freshness_from_writes,
    })
}

/// `--volume-name-uuid-length`: `None` for `-1` (the whole UID), else the
/// number of UID characters, 1 to 32.
pub fn volume_name_uuid_length_of(n: i64) -> Result<Option<usize>, ConfigError> {
    match n {
        -1 => Ok(None),
        1..=MAX_VOLUME_NAME_UUID_LENGTH => Ok(Some(n as usize)),
        n => Err(ConfigError::VolumeNameUuidLength(n)),
    }
}
