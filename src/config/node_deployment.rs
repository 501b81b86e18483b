//! One provisioner per node (`--node-deployment*`, `NODE_NAME`): the node
//! this replica works for and how it races for claims with Immediate binding.

use std::time::Duration;

use super::cli::heading;
use super::{ConfigError, Env};
use crate::duration::parse_go_duration;

/// One provisioner per node, for node-local volumes.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::NODE_DEPLOYMENT)]
pub struct NodeDeploymentArgs {
    /// Run on every node next to the driver, provisioning the node's own volumes
    /// (needs NODE_NAME).
    #[arg(long)]
    pub node_deployment: bool,

    /// In a node deployment, also take claims with Immediate binding.
    #[arg(long, default_value = "true")]
    pub node_deployment_immediate_binding: bool,

    /// In a node deployment, first wait before taking an Immediate-binding claim.
    #[arg(long, default_value = "20s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub node_deployment_base_delay: Duration,

    /// In a node deployment, longest wait before taking an Immediate-binding claim.
    #[arg(long, default_value = "60s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub node_deployment_max_delay: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDeploymentConfig {
    /// `NODE_NAME`: the node this replica provisions for.
    pub node_name: String,
    pub immediate_binding: bool,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

/// The node-deployment group, validated: `None` without `--node-deployment`.
pub(super) fn validate(
    args: &NodeDeploymentArgs,
    env: &Env,
) -> Result<Option<NodeDeploymentConfig>, ConfigError> {
    let NodeDeploymentArgs {
        node_deployment,
        node_deployment_immediate_binding,
        node_deployment_base_delay,
        node_deployment_max_delay,
    } = args;
    if !*node_deployment {
        return Ok(None);
    }
    Ok(Some(NodeDeploymentConfig {
        node_name: env.node_name.clone().ok_or(ConfigError::NodeNameMissing)?,
        immediate_binding: *node_deployment_immediate_binding,
        base_delay: *node_deployment_base_delay,
        max_delay: *node_deployment_max_delay,
    }))
}
