//! Lease-based leader election (`--leader-election*`): whether to elect,
//! the Lease's namespace and labels, and client-go's rules for its timings.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ArgAction;

use super::cli::heading;
use super::values::{Labels, parse_labels};
use super::{ConfigError, Env};
use crate::duration::{format_go_duration, parse_go_duration};

/// client-go's leader-election `JitterFactor`: the renew deadline must exceed
/// the retry period by this factor (upstream: client-go `NewLeaderElector`).
const LEADER_ELECTION_JITTER_FACTOR: f64 = 1.2;

/// Lease-based leader election.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::LEADER_ELECTION)]
pub struct LeaderElectionArgs {
    /// Act only while holding a Lease, so that several replicas can run.
    #[arg(long)]
    pub leader_election: bool,

    /// Namespace of the Lease. When empty: POD_NAMESPACE, else the pod's own
    /// namespace, else default.
    #[arg(long, default_value = "", value_name = "NAMESPACE")]
    pub leader_election_namespace: String,

    /// How long a standby replica waits for the leader to renew before taking over.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leading.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// Wait between attempts to take or renew the Lease.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration,
          value_name = "DURATION")]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while this replica leads, KEY:VALUE,... (repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_labels,
          value_name = "KEY:VALUE,...")]
    pub leader_election_labels: Vec<Labels>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// `--leader-election-namespace`, else `POD_NAMESPACE`, else the
    /// service-account namespace, else `default`.
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub labels: BTreeMap<String, String>,
}

/// The leader-election group, validated: `None` without `--leader-election`.
pub(super) fn validate(
    args: &LeaderElectionArgs,
    env: &Env,
) -> Result<Option<LeaderElectionConfig>, ConfigError> {
    let LeaderElectionArgs {
        leader_election,
        leader_election_namespace,
        leader_election_lease_duration,
        leader_election_renew_deadline,
        leader_election_retry_period,
        leader_election_labels,
    } = args;
    if !*leader_election {
        return Ok(None);
    }
    check_leader_election_timing(
        *leader_election_lease_duration,
        *leader_election_renew_deadline,
        *leader_election_retry_period,
    )?;
    let namespace = [
        Some(leader_election_namespace.clone()).filter(|ns| !ns.is_empty()),
        env.pod_namespace.clone(),
        env.service_account_namespace.clone(),
    ]
    .into_iter()
    .flatten()
    .next()
    .unwrap_or_else(|| "default".to_string());
    Ok(Some(LeaderElectionConfig {
        namespace,
        lease_duration: *leader_election_lease_duration,
        renew_deadline: *leader_election_renew_deadline,
        retry_period: *leader_election_retry_period,
        labels: leader_election_labels
            .iter()
            .flat_map(|l| l.0.clone())
            .collect(),
    }))
}

/// client-go's rules (`NewLeaderElector`): all positive, lease > renew
/// deadline > 1.2 × retry period.
fn check_leader_election_timing(
    lease: Duration,
    renew: Duration,
    retry: Duration,
) -> Result<(), ConfigError> {
    for (flag, d) in [
        ("--leader-election-lease-duration", lease),
        ("--leader-election-renew-deadline", renew),
        ("--leader-election-retry-period", retry),
    ] {
        if d.is_zero() {
            return Err(ConfigError::NotPositive { flag });
        }
    }
    if lease <= renew {
        return Err(ConfigError::LeaseNotLongerThanRenew {
            lease: format_go_duration(lease),
            renew: format_go_duration(renew),
        });
    }
    if renew.as_secs_f64() <= LEADER_ELECTION_JITTER_FACTOR * retry.as_secs_f64() {
        return Err(ConfigError::RenewNotLongerThanRetry {
            renew: format_go_duration(renew),
            retry: format_go_duration(retry),
        });
    }
    Ok(())
}
