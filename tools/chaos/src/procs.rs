//! The processes of a chaos run: sidecar replicas under a supervisor that restarts them
//! (after a SIGKILL or a crash, like a kubelet would), and the test driver. None of them
//! outlives the runner: each child has a watchdog that SIGKILLs it when the runner is gone.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use csi_test_driver::control::Client as DriverControl;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A child process whose output is appended to a log file.
pub struct Proc {
    child: Child,
    /// `sh` that SIGKILLs the child when its stdin (held only by us) closes.
    watchdog: Option<(std::process::Child, std::process::ChildStdin)>,
}

impl Proc {
    pub fn spawn(
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> std::io::Result<Proc> {
        let out = OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("starting {}: {e}", program.display()))
            })?;
        let pid = child.id().unwrap_or_default();
        let mut watchdog = std::process::Command::new("sh")
            .args([
                "-c",
                "cat >/dev/null; kill -9 \"$0\" 2>/dev/null",
                &pid.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pipe = watchdog.stdin.take().expect("piped stdin");
        Ok(Proc {
            child,
            watchdog: Some((watchdog, pipe)),
        })
    }

    /// Stops the watchdog first, so it can never kill a recycled pid.
    fn disarm(&mut self) {
        if let Some((mut watchdog, pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            drop(pipe);
        }
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) {
        self.disarm();
        let _ = self.child.kill().await;
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        self.disarm();
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.disarm();
        let _ = self.child.start_kill();
    }
}

/// Restart counters of the sidecar replicas.
#[derive(Default)]
pub struct ReplicaStats {
    pub starts: AtomicU64,
    pub kills: AtomicU64,
    /// Exits the runner did not cause (lost Lease, lost driver, panic).
    pub exits: AtomicU64,
}

enum Order {
    /// SIGKILL, restart after the delay.
    Kill(Duration),
    /// SIGKILL, restart only on `Resume`.
    KillAndHold,
    Resume,
}

/// One sidecar replica under supervision.
pub struct Replica {
    orders: mpsc::UnboundedSender<Order>,
    pub stats: Arc<ReplicaStats>,
    task: tokio::task::JoinHandle<()>,
}

/// How to start a sidecar.
#[derive(Clone, Debug)]
pub struct SidecarCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
}

impl Replica {
    pub fn start(command: SidecarCommand, stop: CancellationToken) -> Replica {
        let (orders, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(ReplicaStats::default());
        let task = tokio::spawn(supervise(command, rx, stats.clone(), stop));
        Replica {
            orders,
            stats,
            task,
        }
    }

    pub fn kill(&self, restart_after: Duration) {
        let _ = self.orders.send(Order::Kill(restart_after));
    }

    pub fn kill_and_hold(&self) {
        let _ = self.orders.send(Order::KillAndHold);
    }

    pub fn resume(&self) {
        let _ = self.orders.send(Order::Resume);
    }

    /// Waits for the supervisor to stop (after the stop token was cancelled).
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

async fn supervise(
    command: SidecarCommand,
    mut orders: mpsc::UnboundedReceiver<Order>,
    stats: Arc<ReplicaStats>,
    stop: CancellationToken,
) {
    let mut held = false;
    loop {
        if held {
            tokio::select! {
                order = orders.recv() => match order {
                    Some(Order::Resume) | None => held = false,
                    Some(_) => {}
                },
                _ = stop.cancelled() => return,
            }
            continue;
        }
        let mut proc =
            match Proc::spawn(&command.program, &command.args, &command.env, &command.log) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("chaos: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = stop.cancelled() => return,
                    }
                }
            };
        stats.starts.fetch_add(1, Ordering::Relaxed);
        let pause = loop {
            tokio::select! {
                _ = proc.wait() => {
                    stats.exits.fetch_add(1, Ordering::Relaxed);
                    // A kubelet restarts a crashed container after a back-off; keep it short.
                    break Duration::from_millis(500);
                }
                order = orders.recv() => match order {
                    Some(Order::Kill(after)) => {
                        proc.kill().await;
                        stats.kills.fetch_add(1, Ordering::Relaxed);
                        break after;
                    }
                    Some(Order::KillAndHold) => {
                        proc.kill().await;
                        stats.kills.fetch_add(1, Ordering::Relaxed);
                        held = true;
                        break Duration::ZERO;
                    }
                    // Already running.
                    Some(Order::Resume) => {}
                    None => {
                        proc.kill().await;
                        return;
                    }
                },
                _ = stop.cancelled() => {
                    proc.kill().await;
                    return;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The test driver process, restartable on the same ledger.
pub struct Driver {
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    proc: Option<Proc>,
    pub endpoint: PathBuf,
    pub control_path: PathBuf,
    pub state_dir: PathBuf,
    pub crashes: u64,
}

impl Driver {
    pub async fn start(
        program: &Path,
        dir: &Path,
        name: &str,
        seed: u64,
    ) -> std::io::Result<Driver> {
        let endpoint = dir.join("csi.sock");
        let control_path = dir.join("control.sock");
        let state_dir = dir.join("state");
        let args = vec![
            format!("--endpoint=unix://{}", endpoint.display()),
            format!("--control={}", control_path.display()),
            format!("--state-dir={}", state_dir.display()),
            format!("--drivername={name}"),
            format!("--seed={seed}"),
        ];
        let mut driver = Driver {
            program: program.to_path_buf(),
            args,
            log: dir.join("driver.log"),
            proc: None,
            endpoint,
            control_path,
            state_dir,
            crashes: 0,
        };
        driver.spawn().await?;
        Ok(driver)
    }

    async fn spawn(&mut self) -> std::io::Result<()> {
        let env = [("RUST_LOG".to_string(), "warn".to_string())];
        self.proc = Some(Proc::spawn(&self.program, &self.args, &env, &self.log)?);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(c) = DriverControl::connect(&self.control_path).await
                && c.stats().await.is_ok()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(std::io::Error::other("csi-test-driver did not come up"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn control(&self) -> std::io::Result<DriverControl> {
        DriverControl::connect(&self.control_path)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// `crash` through the control socket (exit 137, as `kill -9`), then start again after
    /// `down_for` on the same ledger.
    pub async fn crash_and_restart(&mut self, down_for: Duration) -> std::io::Result<()> {
        if let Ok(c) = self.control().await {
            let _ = c.crash().await;
        }
        if let Some(mut p) = self.proc.take() {
            let exited = tokio::time::timeout(Duration::from_secs(5), p.wait())
                .await
                .is_ok();
            if !exited {
                p.kill().await;
            }
        }
        self.crashes += 1;
        tokio::time::sleep(down_for).await;
        self.spawn().await
    }

    /// Starts the driver again if it is not answering.
    pub async fn ensure_running(&mut self) -> std::io::Result<()> {
        if let Ok(c) = self.control().await
            && c.stats().await.is_ok()
        {
            return Ok(());
        }
        if let Some(mut p) = self.proc.take() {
            p.kill().await;
        }
        self.spawn().await
    }

    pub async fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill().await;
        }
    }
}
