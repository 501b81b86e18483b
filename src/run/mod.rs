//! Start-up and the lifetime of the process: connect to the driver, learn
//! what it is, serve HTTP, win the Lease, then run the claim and volume
//! reconcilers until SIGTERM (or a lost Lease, or a lost driver).
//! upstream: cmd/csi-provisioner/csi-provisioner.go main.
//!
//! `run` is the wiring; each step lives in a module of its own: the driver
//! (`driver`), the API clients and rate-limit lanes (`clients`), leader
//! election (`leader`), the HTTP server (`serve`), the caches' watches
//! (`watch`), the controllers (`controllers`), and the check that the
//! account may do what the configured features need (`access`).

mod access;
mod clients;
mod controllers;
mod driver;
mod leader;
mod serve;
mod watch;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::config::{self, Config, Env, FeatureGates, MetadataConfig, ProvisioningConfig};
use crate::entry::{self, Command, Signals};
use crate::logging;
use crate::metrics::Metrics;
use crate::provision::ProvisionOptions;
use clients::{Clients, serves_volume_attributes_class};
use controllers::{Capacity, Parts, Tuning};
use leader::Leadership;

/// Why the process stops with a non-zero code. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum FatalError {
    #[error(transparent)]
    Connect(#[from] crate::csi::ConnectError),
    #[error("CSI driver probe failed: {0}")]
    Probe(tonic::Status),
    #[error(transparent)]
    Identify(#[from] crate::csi::IdentifyError),
    #[error(transparent)]
    KubeConfig(#[from] crate::kube::client::ClientError),
    #[error("failed to serve HTTP on {addr}: {source}")]
    Http {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    LeaseLost(#[from] crate::kube::lease::LeaseError),
    #[error(transparent)]
    Capacity(#[from] crate::controller::capacity::StartError),
    #[error("failed to get node info from the CSI driver: {0}")]
    NodeInfo(tonic::Status),
    /// An opt-in feature the account's RBAC does not allow (`access`).
    #[error("{0}")]
    Rbac(String),
}

/// The sidecar as a command of [`crate::entry`]: its flags, its logging,
/// and a stop that never hangs.
pub struct Sidecar;

impl Command for Sidecar {
    type Config = Config;

    // Never hang on shutdown: stuck calls get a short grace period.
    const GRACE: Duration = Duration::from_secs(5);

    fn start(argv: Vec<String>) -> Result<Config, ExitCode> {
        let args = entry::flags(config::parse_from(argv.clone()))?;
        if args.version {
            let program = argv.first().map_or("csi-provisioner", String::as_str);
            let version = format!("{program} {}\n", env!("CARGO_PKG_VERSION"));
            return Err(entry::print(&version, ExitCode::SUCCESS));
        }
        let cfg = Config::from_args(&args, &Env::from_process()).map_err(|e| entry::fail(&e, 1))?;
        logging::init(&cfg.logging);
        Ok(cfg)
    }

    async fn run(cfg: Config) -> ExitCode {
        let signals = Signals::watch();
        tokio::spawn(hard_deadline(signals.clone()));
        match run(cfg, signals.stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("{e}");
                entry::fail(&e, 1)
            }
        }
    }
}

/// After the first signal, a second one or 30 s end the process: in-flight
/// calls are bounded by --timeout, so a stop that takes longer is stuck.
async fn hard_deadline(signals: Signals) {
    signals.stop.cancelled().await;
    tokio::select! {
        _ = signals.again.cancelled() => {},
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            error!("shutdown did not finish within 30s; exiting");
            crate::console::err("shutdown did not finish within 30s; exiting\n");
        }
    }
    std::process::exit(1);
}

/// The sidecar from its validated config until `stop` (or a fatal error).
/// Each group of the config goes, destructured, to the step that uses it.
pub async fn run(cfg: Config, stop: CancellationToken) -> Result<(), FatalError> {
    let Config {
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
        // Set up by `Sidecar::start`, before the runtime.
        logging: _,
    } = cfg;
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));

    let driver = driver::connect(
        &csi_socket,
        timeout,
        node_deployment,
        metrics.clone(),
        &stop,
    );
    let Some(driver) = driver.await? else {
        return Ok(());
    };
    let clients = Clients::new(client, provisioning.worker_threads).await?;
    let capacity = match capacity {
        None => None,
        Some(c) => Some(Capacity::prepare(c, &clients, &driver.info, &mut registry).await?),
    };
    let (options, tuning) =
        provisioning_options(provisioning, metadata, feature_gates, &clients).await?;

    let host = hostname();
    let mut leadership = Leadership::new(
        leader_election,
        &clients,
        &driver.info.name,
        &host,
        metrics.clone(),
    )
    .await?;
    serve::serve(
        http,
        Arc::new(registry),
        metrics.clone(),
        &leadership,
        &stop,
    )
    .await?;
    if !leadership.acquire(&stop).await {
        return Ok(());
    }

    let parts = Parts {
        driver,
        clients,
        options,
        tuning,
        capacity,
        metrics,
        gate: leadership.gate.clone(),
        host,
    };
    let started = controllers::start(parts, &stop).await;
    // Stop (SIGTERM) lets in-flight reconciles finish, then gives the Lease
    // up so a standby takes over at once; a lost Lease stops everything now.
    let result = leadership.lead(started.work, &stop).await;
    // Events of the last reconciles go out before the process does.
    started.shared.recorder.flush(Duration::from_secs(2)).await;
    leadership.step_down(result.is_ok()).await;
    started.classes.abort();
    if let Err(e) = &result {
        error!(error = %e, "stopping");
    }
    result
}

/// The provisioning and metadata flags and the feature gates, split between
/// what shapes each request and PV and what paces the controllers. Without
/// `--feature-gates=VolumeAttributesClass=...`, as upstream, the gate is on
/// unless the API server does not serve the kind. The account must be allowed
/// what the opt-in features need (`access`).
async fn provisioning_options(
    provisioning: ProvisioningConfig,
    metadata: MetadataConfig,
    gates: FeatureGates,
    clients: &Clients,
) -> Result<(ProvisionOptions, Tuning), FatalError> {
    let ProvisioningConfig {
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
    } = provisioning;
    let FeatureGates {
        topology,
        cross_namespace_volume_data_source,
        volume_attributes_class,
        // We always give the Lease up on a clean stop (docs/compatibility.md).
        release_leader_election_on_exit: _,
        // Read by the validation of the logging flags.
        contextual_logging: _,
        logging_alpha_options: _,
        logging_beta_options: _,
    } = gates;
    let volume_attributes_class = match volume_attributes_class {
        Some(on) => on,
        None => serves_volume_attributes_class(&clients.work).await,
    };
    let options = ProvisionOptions {
        volume_name_prefix,
        volume_name_uuid_length,
        extra_create_metadata,
        default_fstype,
        controller_publish_readonly,
        strict_topology,
        immediate_topology,
        topology_gate: topology,
        volume_attributes_class,
        prevent_volume_mode_conversion,
        cross_namespace_data_source: cross_namespace_volume_data_source,
        metadata,
    };
    let tuning = Tuning {
        workers: worker_threads,
        retry_start: retry_interval_start,
        retry_max: retry_interval_max,
        cloning_protection_threads,
        snapshot_sweep: snapshot_orphan_sweep_interval,
        admission_intent,
        freshness_from_writes,
    };
    access::check(&clients.work, &access::needs(&options))
        .await
        .map_err(FatalError::Rbac)?;
    Ok((options, tuning))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}
