//! The sidecar's HTTP server (`--http-endpoint`, `--metrics-address`):
//! the metrics at `--metrics-path`, with leader election the check of
//! `/healthz/leader-election`, with `--enable-pprof` the profiles.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::FatalError;
use super::leader::Leadership;
use crate::config::HttpConfig;
use crate::http::HttpServer;
use crate::metrics::Metrics;

/// Starts serving, until `stop`; nothing without an address.
pub(super) async fn serve(
    cfg: Option<HttpConfig>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    leadership: &Leadership,
    stop: &CancellationToken,
) -> Result<(), FatalError> {
    let Some(HttpConfig {
        address,
        metrics_path,
        leader_election_health,
        pprof,
    }) = cfg
    else {
        return Ok(());
    };
    let server = HttpServer {
        registry,
        metrics,
        metrics_path,
        leader: leadership.health().filter(|_| leader_election_health),
        pprof,
    };
    let local = server
        .serve(&address, stop.clone())
        .await
        .map_err(|source| FatalError::Http {
            addr: address.clone(),
            source,
        })?;
    info!(address = %local, "serving metrics");
    if pprof {
        // Upstream's line, with the address actually bound.
        info!(endpoint = %local, "Starting profiling");
    }
    Ok(())
}
