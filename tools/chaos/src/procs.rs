//! The processes of a chaos run: sidecar replicas under a supervisor that restarts them
//! (after a SIGKILL or a crash, like a kubelet would) and can freeze them (SIGSTOP, SIGCONT),
//! and the test driver. None of them outlives the runner: each child has a watchdog that
//! SIGKILLs it when the runner is gone.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

    /// The child's pid while it has not been reaped (after that, `None`: a recycled pid is
    /// never signalled).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends a signal by name (`STOP`, `CONT`) with `kill(1)`; false if the child is gone or
    /// `kill` failed.
    pub fn signal(&self, name: &str) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
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
    /// Restart a held replica; SIGCONT a running one (so nothing stays frozen).
    Resume,
    /// SIGSTOP the running process if it is still this pid (a replica frozen in place: GC
    /// pause, throttled VM); an order that arrives after a restart freezes nothing.
    Pause(u32),
    /// SIGCONT the running process.
    Continue,
}

/// The running process of a replica, as far as the supervisor knows.
#[derive(Clone, Copy, Debug, Default)]
struct Current {
    pid: u32,
    /// Length of the log file when the process started: its own output begins there.
    log_from: u64,
}

/// One sidecar replica under supervision.
pub struct Replica {
    orders: mpsc::UnboundedSender<Order>,
    pub stats: Arc<ReplicaStats>,
    task: tokio::task::JoinHandle<()>,
    current: Arc<Mutex<Option<Current>>>,
    identity: Option<String>,
    log: PathBuf,
}

/// How to start a sidecar.
#[derive(Clone, Debug)]
pub struct SidecarCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// The Lease identity every process of this replica uses, when known beforehand
    /// (upstream's host name); otherwise it is read from the process's log.
    pub identity: Option<String>,
}

impl Replica {
    pub fn start(command: SidecarCommand, stop: CancellationToken) -> Replica {
        let (orders, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(ReplicaStats::default());
        let current = Arc::new(Mutex::new(None));
        let identity = command.identity.clone();
        let log = command.log.clone();
        let task = tokio::spawn(supervise(command, rx, stats.clone(), current.clone(), stop));
        Replica {
            orders,
            stats,
            task,
            current,
            identity,
            log,
        }
    }

    /// The pid of the running process, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.current.lock().expect("poisoned").map(|c| c.pid)
    }

    /// Whether the running process uses `holder` as its Lease identity: upstream's is known
    /// beforehand; ours (`<host>_<random>`) is logged when the process starts contending.
    pub fn is_holder(&self, holder: &str) -> bool {
        if holder.is_empty() {
            return false;
        }
        let Some(current) = *self.current.lock().expect("poisoned") else {
            return false;
        };
        if let Some(identity) = &self.identity {
            return identity == holder;
        }
        // The identity is logged within the process's first lines; 4 MiB is plenty.
        let mut text = Vec::new();
        let read = std::fs::File::open(&self.log).and_then(|mut f| {
            f.seek(SeekFrom::Start(current.log_from))?;
            f.take(4 << 20).read_to_end(&mut text)
        });
        read.is_ok() && contains_word(&String::from_utf8_lossy(&text), holder)
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

    /// SIGSTOP the process `pid` if it still runs (it stays frozen until [`Replica::cont`]
    /// or `resume`).
    pub fn pause(&self, pid: u32) {
        let _ = self.orders.send(Order::Pause(pid));
    }

    /// SIGCONT the running process.
    pub fn cont(&self) {
        let _ = self.orders.send(Order::Continue);
    }

    /// Waits for the supervisor to stop (after the stop token was cancelled).
    pub async fn join(mut self) {
        self.stopped().await;
    }

    /// Like [`Replica::join`], for a replica that stays in place.
    pub async fn stopped(&mut self) {
        let _ = (&mut self.task).await;
    }
}

async fn supervise(
    command: SidecarCommand,
    mut orders: mpsc::UnboundedReceiver<Order>,
    stats: Arc<ReplicaStats>,
    current: Arc<Mutex<Option<Current>>>,
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
        let log_from = std::fs::metadata(&command.log).map_or(0, |m| m.len());
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
        *current.lock().expect("poisoned") = proc.pid().map(|pid| Current { pid, log_from });
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
                    // Already running: make sure it is not frozen.
                    Some(Order::Resume | Order::Continue) => {
                        proc.signal("CONT");
                    }
                    Some(Order::Pause(pid)) => {
                        if proc.pid() == Some(pid) {
                            proc.signal("STOP");
                        }
                    }
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
        *current.lock().expect("poisoned") = None;
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Whether `word` occurs in `text` not as part of a longer identifier (an identity `a_1`
/// must not match `a_12`).
fn contains_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
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
        extra_args: &[String],
    ) -> std::io::Result<Driver> {
        let endpoint = dir.join("csi.sock");
        let control_path = dir.join("control.sock");
        let state_dir = dir.join("state");
        let mut args = vec![
            format!("--endpoint=unix://{}", endpoint.display()),
            format!("--control={}", control_path.display()),
            format!("--state-dir={}", state_dir.display()),
            format!("--drivername={name}"),
            format!("--seed={seed}"),
        ];
        args.extend(extra_args.iter().cloned());
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

#[cfg(test)]
mod tests {
    use super::contains_word;

    #[test]
    fn an_identity_matches_only_as_a_whole_word() {
        let log = "INFO waiting to acquire the lease identity=host_0000beef lease=ns/x\n";
        assert!(contains_word(log, "host_0000beef"));
        assert!(!contains_word(log, "host_0000bee"));
        assert!(!contains_word(log, "ost_0000beef"));
        assert!(contains_word("\"identity\":\"h_1\"", "h_1"));
        assert!(!contains_word("identity=h_12", "h_1"));
    }
}
