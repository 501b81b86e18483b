//! csi-provisioner: parse flags, set up logging, run until SIGTERM.

use std::process::ExitCode;

use csi_provisioner::config::{self, Config, Env, LogFormat};
use csi_provisioner::console;
use csi_provisioner::logging;
use csi_provisioner::provision::ProvisionOptions;
use csi_provisioner::run::{LeaderElection, RunConfig, run};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // The operator commands; everything else is the sidecar's command line.
    match argv.get(1).map(String::as_str) {
        Some("check") => return csi_provisioner::check::main(argv),
        Some("audit") => return csi_provisioner::audit::main(argv),
        _ => {}
    }
    let args = match config::parse_from(argv.clone()) {
        Ok(a) => a,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            return print(&e.render().to_string());
        }
        Err(e) => {
            console::err(&format!("{}\n", config::error_line(&e)));
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    if args.version {
        let program = argv.first().map_or("csi-provisioner", String::as_str);
        return print(&format!("{program} {}\n", env!("CARGO_PKG_VERSION")));
    }
    let cfg = match Config::from_args(&args, &Env::from_process()) {
        Ok(c) => c,
        Err(e) => {
            console::err(&format!("{e}\n"));
            return ExitCode::from(1);
        }
    };
    // --log-flush-frequency and --log-*-info-buffer-size are validated but
    // have nothing to act on: every line is written when it is logged.
    logging::init(&logging::Options {
        verbosity: cfg.logging.verbosity,
        vmodule: cfg.logging.vmodule.clone(),
        format: match cfg.logging.format {
            LogFormat::Text => logging::Format::Text,
            LogFormat::Json => logging::Format::Json,
        },
        split_stream: cfg.logging.split_stream,
    });

    let Some(runtime) = csi_provisioner::run::runtime() else {
        return ExitCode::from(1);
    };
    let code = runtime.block_on(async {
        let stop = CancellationToken::new();
        tokio::spawn(shutdown_on_signal(stop.clone()));
        match run(run_config(&cfg), stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                console::err(&format!("{e}\n"));
                ExitCode::from(1)
            }
        }
    });
    // Never hang on shutdown: stuck calls get a short grace period.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    code
}

/// Prints what the user asked for (help, version): success, also when the
/// reader stopped reading; 1 when stdout cannot be written.
fn print(text: &str) -> ExitCode {
    match console::out(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            console::err(&format!("failed to write to stdout: {e}\n"));
            ExitCode::from(1)
        }
    }
}

fn run_config(cfg: &Config) -> RunConfig {
    let p = &cfg.provisioning;
    RunConfig {
        csi_socket: cfg.csi_socket.clone(),
        kubeconfig: cfg.client.kubeconfig.clone(),
        master: cfg.client.master.clone(),
        rate_limit: cfg.client.rate_limit,
        timeout: cfg.timeout,
        retry_start: p.retry_interval_start,
        retry_max: p.retry_interval_max,
        worker_threads: p.worker_threads,
        cloning_protection_threads: p.cloning_protection_threads,
        provision: ProvisionOptions {
            volume_name_prefix: p.volume_name_prefix.clone(),
            volume_name_uuid_length: p.volume_name_uuid_length.map_or(-1, |n| n as i32),
            extra_create_metadata: p.extra_create_metadata,
            default_fstype: p.default_fstype.clone().unwrap_or_default(),
            controller_publish_readonly: p.controller_publish_readonly,
            strict_topology: p.strict_topology,
            immediate_topology: p.immediate_topology,
            topology_gate: cfg.feature_gates.topology,
            volume_attributes_class: cfg.feature_gates.volume_attributes_class.unwrap_or(true),
            prevent_volume_mode_conversion: p.prevent_volume_mode_conversion,
            cross_namespace_data_source: cfg.feature_gates.cross_namespace_volume_data_source,
        },
        discover_volume_attributes_class: cfg.feature_gates.volume_attributes_class.is_none(),
        snapshot_orphan_sweep_interval: p.snapshot_orphan_sweep_interval,
        capacity: cfg.capacity.clone(),
        node_deployment: cfg.node_deployment.clone(),
        http_endpoint: cfg.http.as_ref().map(|h| h.address.clone()),
        leader_health: cfg.http.as_ref().is_some_and(|h| h.leader_election_health),
        metrics_path: cfg
            .http
            .as_ref()
            .map(|h| h.metrics_path.clone())
            .unwrap_or_else(|| "/metrics".into()),
        admission_intent: false,
        leader_election: cfg.leader_election.as_ref().map(|le| LeaderElection {
            namespace: le.namespace.clone(),
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
            labels: le.labels.clone(),
        }),
    }
}

/// SIGTERM or SIGINT cancels the token; a second signal exits at once.
async fn shutdown_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("shutting down");
    stop.cancel();
    // A hard deadline: in-flight calls are bounded by --timeout, so a stop
    // that takes longer than this is stuck; never hang on shutdown.
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
        _ = tokio::time::sleep(std::time::Duration::from_secs(30)) => {
            tracing::error!("shutdown did not finish within 30s; exiting");
            console::err("shutdown did not finish within 30s; exiting\n");
        }
    }
    std::process::exit(1);
}
