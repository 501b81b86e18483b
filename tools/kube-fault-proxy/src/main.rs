//! kube-fault-proxy: serve the fault-injecting proxy until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_fault_proxy::Proxy;

/// A fault-injecting proxy in front of kube-apiserver, for tests.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Kubeconfig of the real API server: its server URL, CA and credentials are used for
    /// every forwarded request.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Address to listen on (plain HTTP). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Unix socket for the JSON-lines control protocol.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Write a kubeconfig pointing at the proxy here (for the client under test).
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,
    /// Namespace of the written kubeconfig's context.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Seed of the RNG behind probabilistic faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-fault-proxy: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let proxy = Proxy::start(args.listen, config, args.seed).await?;
    if let Some(path) = &args.control {
        proxy.serve_control(path)?;
    }
    if let Some(path) = &args.write_kubeconfig {
        proxy.write_kubeconfig(path, &args.namespace)?;
    }
    println!("listening on {}", proxy.url());
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
