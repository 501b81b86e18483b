//! The HTTP server (`--http-endpoint`, the deprecated `--metrics-address`,
//! `--metrics-path`, `--enable-pprof`): where metrics and the leader-election
//! health check are served.

use super::ConfigError;
use super::cli::heading;

/// The HTTP server (metrics, leader-election health check).
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::HTTP)]
pub struct HttpArgs {
    /// Serve metrics and /healthz/leader-election on this address (:8080,
    /// 127.0.0.1:8080). Off when empty.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// Deprecated: like --http-endpoint, without the leader-election health check.
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub metrics_address: String,

    /// Path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Serve profiles under /debug/pprof/ on the HTTP endpoint: the CPU
    /// profile (/debug/pprof/profile?seconds=N, pprof protobuf for `go tool
    /// pprof`) and the command line; Go-only profiles (goroutine, heap, …)
    /// answer 501. Nothing is served without --http-endpoint.
    #[arg(long)]
    pub enable_pprof: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Go-style listen address: `:8080` means every interface.
    pub address: String,
    pub metrics_path: String,
    /// Serve `/healthz/leader-election`: upstream does only with
    /// `--http-endpoint` (not the deprecated `--metrics-address`) and
    /// `--leader-election`.
    pub leader_election_health: bool,
    pub pprof: bool,
}

/// The HTTP group, validated: `None` when no address is set. The health
/// check needs `--leader-election`, given as `leader_election`.
pub(super) fn validate(
    args: &HttpArgs,
    leader_election: bool,
) -> Result<Option<HttpConfig>, ConfigError> {
    let HttpArgs {
        http_endpoint,
        metrics_address,
        metrics_path,
        enable_pprof,
    } = args;
    if !metrics_address.is_empty() && !http_endpoint.is_empty() {
        return Err(ConfigError::MetricsAddressAndHttpEndpoint);
    }
    Ok([http_endpoint, metrics_address]
        .into_iter()
        .find(|address| !address.is_empty())
        .map(|address| HttpConfig {
            address: address.clone(),
            metrics_path: metrics_path.clone(),
            leader_election_health: leader_election && !http_endpoint.is_empty(),
            pprof: *enable_pprof,
        }))
}
