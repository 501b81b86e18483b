//! Process wiring: load the ledger, bind the CSI and control sockets, serve until SIGTERM/SIGINT
//! (or exit at once on `crash`).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;

use crate::args::Args;
use crate::control::{Request, Response, Stats};
use crate::driver::{CsiService, Driver, DriverConfig};
use crate::ledger::{Journal, compact, load_with_seq};

/// Exit status of the `crash` command, as a shell reports a `kill -9`ed process.
pub const CRASH_EXIT_CODE: i32 = 137;

/// How often call counters (the only lazily journaled part of the ledger) are flushed.
const COUNTS_FLUSH_INTERVAL: Duration = Duration::from_millis(200);

/// Runs the driver until SIGTERM or SIGINT.
pub async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let capabilities = args.controller_capabilities()?;
    let endpoint = csi_proto::parse_csi_address(&args.endpoint)?;
    std::fs::create_dir_all(&args.state_dir)?;

    // A start folds the journal into the snapshot (O(N) once), then journals from there.
    let (mut ledger, seq) = load_with_seq(&args.state_dir)?;
    ledger.starts += 1;
    compact(&ledger, seq, &args.state_dir)?;
    let journal = Journal::open(&args.state_dir, seq)?;
    tracing::info!(
        volumes = ledger.volumes.len(),
        starts = ledger.starts,
        state_dir = %args.state_dir.display(),
        "ledger loaded"
    );

    let driver = Arc::new(Driver::new(
        DriverConfig {
            name: args.drivername.clone(),
            vendor_version: args.vendor_version.clone(),
            node_id: args.node_id.clone(),
            capacity_bytes: args.capacity_bytes,
            topology: args.topology(),
            capabilities,
            mutable_keys: args.mutable_parameters.clone(),
            state_dir: args.state_dir.clone(),
            serialize_by_name: !args.allow_concurrent_calls_per_volume,
            volume_id_with_name: args.volume_id_with_name,
        },
        ledger,
        journal,
        args.seed,
    ));

    // The CSI socket is bound first: once the control socket answers, both are up.
    let csi_listener = bind_fresh(&endpoint)?;
    let control_listener = bind_fresh(&args.control)?;
    tracing::info!(
        endpoint = %endpoint.display(),
        control = %args.control.display(),
        driver = %args.drivername,
        "serving"
    );

    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("shutting down");
    };

    let service = CsiService(driver.clone());
    let grpc = tonic::transport::Server::builder()
        .add_service(v1::identity_server::IdentityServer::new(service.clone()))
        .add_service(v1::controller_server::ControllerServer::new(
            service.clone(),
        ))
        .add_service(v1::node_server::NodeServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(csi_listener), shutdown);

    let control = tokio::spawn(serve_control(control_listener, driver.clone()));
    let flusher = tokio::spawn({
        let driver = driver.clone();
        async move {
            let mut tick = tokio::time::interval(COUNTS_FLUSH_INTERVAL);
            loop {
                tick.tick().await;
                if let Err(err) = driver.flush_counts() {
                    tracing::warn!(%err, "cannot flush call counters to the ledger");
                }
            }
        }
    });

    let served = grpc.await;
    control.abort();
    flusher.abort();
    driver.flush_counts()?;
    for path in [endpoint.as_path(), args.control.as_path()] {
        let _ = std::fs::remove_file(path);
    }
    served?;
    Ok(())
}

/// Binds a unix socket, replacing a stale socket file left by a crashed predecessor.
fn bind_fresh(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    UnixListener::bind(path)
        .map_err(|err| io::Error::new(err.kind(), format!("cannot bind {}: {err}", path.display())))
}

async fn serve_control(listener: UnixListener, driver: Arc<Driver>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(control_connection(stream, driver.clone()));
            }
            Err(err) => {
                tracing::warn!(%err, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answers each request line on one connection until the client hangs up.
async fn control_connection(stream: UnixStream, driver: Arc<Driver>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(%err, "control connection read failed");
                return;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let (response, crash) = match serde_json::from_str::<Request>(&line) {
            Ok(request) => {
                tracing::info!(?request, "control");
                let crash = matches!(request, Request::Crash);
                (handle(&driver, request), crash)
            }
            Err(err) => (Response::error(format!("bad request: {err}")), false),
        };
        let mut out = serde_json::to_vec(&response).unwrap_or_else(|err| {
            format!(r#"{{"ok":false,"error":"cannot encode response: {err}"}}"#).into_bytes()
        });
        out.push(b'\n');
        let written = write.write_all(&out).await.and(write.flush().await);
        if crash {
            tracing::warn!("crash requested: exiting with {CRASH_EXIT_CODE} without cleanup");
            std::process::exit(CRASH_EXIT_CODE);
        }
        if written.is_err() {
            return;
        }
    }
}

fn handle(driver: &Driver, request: Request) -> Response {
    let result = match request {
        Request::Ledger => {
            return Response {
                ledger: Some(driver.ledger_snapshot()),
                ..Response::ok()
            };
        }
        Request::Stats => {
            let (calls, volumes) = driver.counts();
            return Response {
                stats: Some(Stats {
                    calls,
                    hung: driver.faults().hung(),
                    held: driver.faults().held(),
                    ready: driver.ready(),
                    volumes,
                }),
                ..Response::ok()
            };
        }
        Request::SetFault { method, fault } => driver.faults().set(&method, fault),
        Request::ClearFaults { method } => driver.faults().clear(method.as_deref()),
        Request::Release { method } => driver.faults().release(&method),
        Request::Drop { method } => driver.faults().drop_held(method.as_deref()).map(drop),
        // Answered first, then the connection handler exits the process.
        Request::Crash => Ok(()),
        Request::LoseVolume { volume_id } => driver.lose_volume(&volume_id),
        Request::SetReady { ready } => {
            driver.set_ready(ready);
            Ok(())
        }
    };
    match result {
        Ok(()) => Response::ok(),
        Err(message) => Response::error(message),
    }
}
