//! A fresh test driver (tools/csi-test-driver, release build) per run: its
//! own name, sockets and ledger. Started here rather than through
//! `csi_test_driver::process` because the benchmark needs its pid (CPU use).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use csi_test_driver::control::Client as Control;
use tokio::process::{Child, Command};

pub struct Driver {
    _child: Child,
    pub pid: u32,
    /// The CSI socket (a plain path, which both sidecars accept).
    pub endpoint: PathBuf,
    pub control: Control,
}

pub async fn start(binary: &Path, dir: &Path, name: &str) -> anyhow::Result<Driver> {
    std::fs::create_dir_all(dir)?;
    let endpoint = dir.join("csi.sock");
    let control_path = dir.join("control.sock");
    let log = std::fs::File::create(dir.join("driver.log"))?;
    let child = Command::new(binary)
        .arg(format!("--endpoint=unix://{}", endpoint.display()))
        .arg(format!("--control={}", control_path.display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg(format!("--drivername={name}"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting {}: {e}", binary.display()))?;
    let pid = child.id().unwrap_or(0);
    let t0 = Instant::now();
    loop {
        if let Ok(control) = Control::connect(&control_path).await
            && control.stats().await.is_ok()
        {
            return Ok(Driver {
                _child: child,
                pid,
                endpoint,
                control,
            });
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(20),
            "test driver not ready after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
