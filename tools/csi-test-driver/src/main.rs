//! `csi-test-driver`: parse flags, set up logging, run.

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = csi_test_driver::Args::parse();
    if let Err(err) = csi_test_driver::run(args).await {
        tracing::error!("{err}");
        eprintln!("csi-test-driver: {err}");
        std::process::exit(1);
    }
}
