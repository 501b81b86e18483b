//! CSIStorageCapacity publishing (`--enable-capacity`, `--capacity-*`,
//! `--kube-api-capacity-*`): where the objects go, who owns them, how often
//! they follow the driver, and the rate of their own client.

use std::time::Duration;

use super::cli::heading;
use super::client::{RateLimit, rate_limit};
use super::values::to_usize;
use super::{ConfigError, Env};
use crate::duration::parse_go_duration;

/// CSIStorageCapacity publishing.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CAPACITY)]
pub struct CapacityArgs {
    /// Publish CSIStorageCapacity objects with what the driver's GetCapacity reports.
    #[arg(long)]
    pub enable_capacity: bool,

    /// Workers updating CSIStorageCapacity objects (accepted; here one pass
    /// brings every object up to date).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub capacity_threads: u64,

    /// Requests per second of the client that writes CSIStorageCapacity objects.
    #[arg(long, default_value_t = 1.0, value_name = "QPS")]
    pub kube_api_capacity_qps: f32,

    /// Burst of the client that writes CSIStorageCapacity objects.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub kube_api_capacity_burst: i64,

    /// Publish capacity for StorageClasses with Immediate binding too.
    #[arg(long)]
    pub capacity_for_immediate_binding: bool,

    /// How often to ask the driver for capacity.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub capacity_poll_interval: Duration,

    /// Owner of the CSIStorageCapacity objects: -1 none, 0 this pod, 1 its
    /// controller (a ReplicaSet), 2 that one's controller (a Deployment), ...
    #[arg(long, default_value_t = 1, value_name = "LEVEL")]
    pub capacity_ownerref_level: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CapacityConfig {
    /// `NAMESPACE`: where the CSIStorageCapacity objects live.
    pub namespace: String,
    /// `None` with a negative `--capacity-ownerref-level`: objects have no owner.
    pub owner: Option<CapacityOwner>,
    pub threads: usize,
    pub rate_limit: RateLimit,
    pub for_immediate_binding: bool,
    pub poll_interval: Duration,
}

/// Start and depth of the owner lookup: `levels` controller references up
/// from the pod `pod_name` (0 is the pod itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityOwner {
    pub pod_name: String,
    pub levels: u32,
}

/// The capacity group, validated: `None` without `--enable-capacity`.
pub(super) fn validate(
    args: &CapacityArgs,
    env: &Env,
) -> Result<Option<CapacityConfig>, ConfigError> {
    let CapacityArgs {
        enable_capacity,
        capacity_threads,
        kube_api_capacity_qps,
        kube_api_capacity_burst,
        capacity_for_immediate_binding,
        capacity_poll_interval,
        capacity_ownerref_level,
    } = args;
    if !*enable_capacity {
        return Ok(None);
    }
    let namespace = env
        .namespace
        .clone()
        .ok_or(ConfigError::CapacityNamespaceMissing)?;
    let owner = match u32::try_from(*capacity_ownerref_level) {
        Ok(levels) => Some(CapacityOwner {
            pod_name: env
                .pod_name
                .clone()
                .ok_or(ConfigError::CapacityPodNameMissing)?,
            levels,
        }),
        // Negative: no owner. (Above u32::MAX is no real hierarchy.)
        Err(_) => None,
    };
    Ok(Some(CapacityConfig {
        namespace,
        owner,
        threads: to_usize(*capacity_threads),
        rate_limit: rate_limit(
            f64::from(*kube_api_capacity_qps),
            *kube_api_capacity_burst,
            "--kube-api-capacity-qps",
            "--kube-api-capacity-burst",
        )?,
        for_immediate_binding: *capacity_for_immediate_binding,
        poll_interval: *capacity_poll_interval,
    }))
}
