//! The Kubernetes API client (`--master`, `--kubeconfig`, `--kube-api-qps`,
//! `--kube-api-burst`), and client-go's reading of a QPS and a burst, which
//! the capacity client's flags share.

use std::path::PathBuf;

use super::cli::heading;
use super::{ConfigError, Env};

/// The Kubernetes API client.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::CLIENT)]
pub struct ClientArgs {
    /// API server URL, instead of the kubeconfig's.
    #[arg(long, default_value = "", value_name = "URL")]
    pub master: String,

    /// Kubeconfig file; without one, the pod's service account is used
    /// (in-cluster config). KUBECONFIG, when set, takes precedence.
    #[arg(long, default_value = "", value_name = "PATH")]
    pub kubeconfig: String,

    /// Requests per second to the API server (client-side limit).
    #[arg(long, default_value_t = 5.0, value_name = "QPS")]
    pub kube_api_qps: f64,

    /// Requests to the API server allowed in a burst above --kube-api-qps.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub kube_api_burst: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// `--master`: API server URL overriding the kubeconfig's.
    pub master: Option<String>,
    /// `KUBECONFIG`, else `--kubeconfig`; `None` means in-cluster config.
    pub kubeconfig: Option<PathBuf>,
    pub rate_limit: RateLimit,
}

/// Client-side throttling of API requests, as client-go derives it from QPS
/// and burst: QPS 0 means client-go's default 5, burst 0 its default 10, a
/// negative QPS turns throttling off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RateLimit {
    Unlimited,
    TokenBucket { qps: f32, burst: u32 },
}

/// The client group, validated; `KUBECONFIG` wins over `--kubeconfig`.
pub(super) fn validate(args: &ClientArgs, env: &Env) -> Result<ClientConfig, ConfigError> {
    let ClientArgs {
        master,
        kubeconfig,
        kube_api_qps,
        kube_api_burst,
    } = args;
    Ok(ClientConfig {
        master: Some(master.clone()).filter(|m| !m.is_empty()),
        kubeconfig: env
            .kubeconfig
            .clone()
            .or_else(|| Some(kubeconfig.clone()).filter(|k| !k.is_empty()))
            .map(PathBuf::from),
        rate_limit: rate_limit(
            *kube_api_qps,
            *kube_api_burst,
            "--kube-api-qps",
            "--kube-api-burst",
        )?,
    })
}

/// QPS/burst as client-go applies them (`rest.RESTClientFor`,
/// `kubernetes.NewForConfig`).
pub(super) fn rate_limit(
    qps: f64,
    burst: i64,
    qps_flag: &'static str,
    burst_flag: &'static str,
) -> Result<RateLimit, ConfigError> {
    const DEFAULT_QPS: f32 = 5.0;
    const DEFAULT_BURST: u32 = 10;
    if qps.is_nan() {
        return Err(ConfigError::QpsNotANumber(qps_flag));
    }
    if qps < 0.0 {
        return Ok(RateLimit::Unlimited);
    }
    let burst_error = ConfigError::Burst {
        qps: qps_flag,
        burst: burst_flag,
    };
    let (qps, burst) = if qps == 0.0 {
        // client-go substitutes its defaults for zeros.
        let burst = match burst {
            0 => DEFAULT_BURST,
            b => u32::try_from(b).map_err(|_| burst_error)?,
        };
        (DEFAULT_QPS, burst)
    } else {
        let burst = u32::try_from(burst)
            .ok()
            .filter(|b| *b > 0)
            .ok_or(burst_error)?;
        (qps as f32, burst)
    };
    Ok(RateLimit::TokenBucket { qps, burst })
}
