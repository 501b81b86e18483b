//! Every upstream csi-provisioner flag (same names, defaults and value syntax,
//! including Go's `-single-dash` long flags and `--bool=false` form) and the
//! environment variables upstream reads, validated into one typed [`Config`].
//!
//! Two kinds of error, as upstream has two: a value that cannot be parsed
//! (`--timeout=10`, an unknown flag or feature gate) is a [`clap::Error`] from
//! [`parse_from`] (usage error, exit code 2); flags that parse but do not fit
//! together, or miss an environment variable, are a [`ConfigError`] from
//! [`Config::from_args`] (exit code 1).
//!
//! By section: `cli.rs` holds the top-level `Args` (each group flattened in)
//! and the help; `go_flags.rs` Go's flag syntax; `values.rs` the value
//! parsers; `gates.rs` the feature gates; `env.rs` the environment. Each
//! group of flags has a file of its own (`csi.rs`, `client.rs`,
//! `provisioning.rs`, `leader_election.rs`, `http.rs`, `capacity.rs`,
//! `node_deployment.rs`, `logging.rs`) with its clap struct, its part of
//! [`Config`] and the one function that validates it, destructuring the
//! group in full: a flag added there and left unused fails to compile.

mod capacity;
mod cli;
mod client;
mod csi;
mod env;
mod error;
mod gates;
mod go_flags;
mod http;
mod leader_election;
mod logging;
mod metadata;
mod node_deployment;
mod provisioning;
mod values;

use std::path::PathBuf;
use std::time::Duration;

pub use capacity::{CapacityArgs, CapacityConfig, CapacityOwner};
pub use cli::{Args, command, error_line, parse_from};
pub use client::{ClientArgs, ClientConfig, RateLimit};
pub use csi::{CsiArgs, csi_socket_path};
pub use env::{Env, SERVICE_ACCOUNT_NAMESPACE_FILE};
pub use error::ConfigError;
pub use gates::{FeatureGate, FeatureGates, GateKey, GateSettings};
pub use go_flags::normalize_args;
pub use http::{HttpArgs, HttpConfig};
pub use leader_election::{LeaderElectionArgs, LeaderElectionConfig};
pub use logging::{LogFormat, LoggingArgs, LoggingConfig};
pub use metadata::{MetadataArgs, MetadataConfig};
pub use node_deployment::{NodeDeploymentArgs, NodeDeploymentConfig};
pub use provisioning::{ProvisioningArgs, ProvisioningConfig, volume_name_uuid_length_of};
pub use values::{Keys, Labels, VModule, VModuleList, parse_byte_quantity};

/// Everything the program needs from flags and environment, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The driver's unix socket (`unix://` stripped).
    pub csi_socket: PathBuf,
    /// Timeout of each CSI call.
    pub timeout: Duration,
    pub client: ClientConfig,
    pub provisioning: ProvisioningConfig,
    /// Which claim and namespace labels and annotations are passed on.
    pub metadata: MetadataConfig,
    /// `None` without `--leader-election`.
    pub leader_election: Option<LeaderElectionConfig>,
    /// `None` when neither `--http-endpoint` nor `--metrics-address` is set.
    pub http: Option<HttpConfig>,
    /// `None` without `--enable-capacity`.
    pub capacity: Option<CapacityConfig>,
    /// `None` without `--node-deployment`.
    pub node_deployment: Option<NodeDeploymentConfig>,
    pub feature_gates: FeatureGates,
    pub logging: LoggingConfig,
}

impl Config {
    /// Validates parsed flags against each other and the environment.
    ///
    /// `--version` is not looked at: the caller prints the version before
    /// calling this, so that it works whatever else is on the command line.
    /// Each group is validated by its section, in the order the errors rank
    /// (the first one found is the one reported).
    pub fn from_args(args: &Args, env: &Env) -> Result<Config, ConfigError> {
        // Destructured in full, and each group again by its section, so that
        // a new flag cannot be left unused.
        let Args {
            version: _,
            // A Go runtime knob: nothing to apply here.
            automaxprocs: _,
            feature_gates,
            csi,
            client,
            provisioning,
            metadata,
            leader_election,
            http,
            capacity,
            node_deployment,
            logging,
        } = args;

        let feature_gates = FeatureGates::resolve(feature_gates);
        let logging = logging::validate(logging, &feature_gates)?;
        // Upstream's order: NODE_NAME, then the HTTP flags, then the rest.
        let node_deployment = node_deployment::validate(node_deployment, env)?;
        let http = http::validate(http, leader_election.leader_election)?;
        let client = client::validate(client, env)?;
        let provisioning = provisioning::validate(provisioning)?;
        if provisioning.admission_intent && node_deployment.is_some() {
            return Err(ConfigError::AdmissionIntentOnNodes);
        }
        let metadata = metadata::validate(metadata)?;
        // A zero --timeout ranks with the provisioning checks, an address
        // that is not a unix socket after every other check.
        let csi = csi::validate(csi);
        if let Err(ConfigError::ZeroTimeout) = csi {
            return Err(ConfigError::ZeroTimeout);
        }
        let leader_election = leader_election::validate(leader_election, env)?;
        let capacity = capacity::validate(capacity, env)?;
        let (csi_socket, timeout) = csi?;

        Ok(Config {
            csi_socket,
            timeout,
            client,
            provisioning,
            metadata,
            leader_election,
            http,
            capacity,
            node_deployment,
            feature_gates,
            logging,
        })
    }
}

#[cfg(test)]
mod tests;
