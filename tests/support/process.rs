//! Programs a test runs (CSI drivers, the upstream sidecar, ours), which must never outlive the
//! test: not when it passes, not when it panics, not when the whole test process is killed.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::wait_for;

/// Lines of a child's log shown when a test panics while the child is still owned by it.
const LOG_TAIL_LINES: usize = 40;

/// A running program whose stdout and stderr go to one log file in a temporary directory.
///
/// Dropping it sends SIGKILL and reaps the process (what tokio's `kill_on_drop` promises, but
/// synchronously: tokio reaps lazily on a runtime that may be gone by then). That covers a
/// test that returns or panics. A test process that dies outright (SIGKILL, abort, a double
/// panic) runs no destructors, so each child also gets a watchdog: a tiny `sh` reading a pipe
/// only this process holds, which SIGKILLs the child when the pipe closes, i.e. when this
/// process is gone.
///
/// On a panic the log directory is kept and the log's last lines are printed, so a failing
/// test shows what its driver or sidecar said.
pub struct ChildProcess {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
    watchdog: Option<Watchdog>,
    log_path: PathBuf,
    log_dir: Option<tempfile::TempDir>,
}

struct Watchdog {
    process: Child,
    /// The pipe whose closing makes the watchdog kill the child; dropped only after the
    /// watchdog itself is dead.
    pipe: ChildStdin,
}

impl ChildProcess {
    /// Starts `command` (program, args and env as set by the caller; stdin, stdout and stderr
    /// are taken over). Panics if it cannot be started.
    pub fn spawn(command: &mut Command) -> ChildProcess {
        let name = Path::new(command.get_program())
            .file_name()
            .unwrap_or(OsStr::new("child"))
            .to_string_lossy()
            .into_owned();
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir()
            .expect("creating a log directory");
        let log_path = log_dir.path().join(format!("{name}.log"));
        let log = File::create(&log_path).expect("creating a log file");
        let log_err = log.try_clone().expect("duplicating the log file handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let watchdog = Watchdog::start(child.id());
        ChildProcess {
            name,
            child,
            exit: None,
            watchdog: Some(watchdog),
            log_path,
            log_dir: Some(log_dir),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything the program wrote to stdout and stderr so far.
    pub fn log_contents(&self) -> String {
        let bytes = std::fs::read(&self.log_path).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether the program has not exited yet (reaps it if it has).
    pub fn is_running(&mut self) -> bool {
        self.try_exit_status().is_none()
    }

    /// The exit status if the program has exited (reaping it), `None` while it runs.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_some() {
            return self.exit;
        }
        if let Some(status) = self.child.try_wait().expect("waitpid") {
            self.exited(status);
        }
        self.exit
    }

    /// SIGKILL and reap; does nothing if the program already exited.
    pub fn kill(&mut self) {
        if self.exit.is_none() {
            // Fails only if it already exited, which the wait below collects either way.
            let _ = self.child.kill();
            let status = self.child.wait().expect("waitpid");
            self.exited(status);
        }
    }

    /// Sends SIGTERM (a graceful shutdown request) without waiting; see [`Self::wait_exit`].
    pub fn terminate(&mut self) {
        if self.try_exit_status().is_none() {
            let status = Command::new("kill")
                .args(["-TERM", &self.pid().to_string()])
                .status()
                .expect("running kill");
            assert!(status.success(), "kill -TERM {} failed", self.pid());
        }
    }

    /// Waits for the program to exit on its own; panics with its log after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return status;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "{} (pid {}) still running after {timeout:?}; log {}:\n{}",
                    self.name,
                    self.pid(),
                    self.log_path.display(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the log contains `needle`; panics early if the program exits first.
    pub async fn wait_for_log(&mut self, needle: &str, timeout: Duration) {
        let what = format!("{} to log {needle:?}", self.name);
        wait_for(&what, timeout, || {
            let log = self.log_contents();
            let status = self.try_exit_status();
            let what = what.as_str();
            async move {
                if log.contains(needle) {
                    return Ok(());
                }
                if let Some(status) = status {
                    panic!("{what}: it exited ({status}) first; log:\n{log}");
                }
                Err(tail(&log, LOG_TAIL_LINES))
            }
        })
        .await
    }

    fn log_tail(&self) -> String {
        tail(&self.log_contents(), LOG_TAIL_LINES)
    }

    fn exited(&mut self, status: ExitStatus) {
        self.exit = Some(status);
        // With the child reaped its pid may be reused: the watchdog must not kill it any more.
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            return;
        }
        if let Some(dir) = self.log_dir.take() {
            let kept = dir.keep();
            eprintln!(
                "--- {} log (kept in {}), last {LOG_TAIL_LINES} lines:\n{}",
                self.name,
                kept.display(),
                self.log_tail()
            );
        }
    }
}

impl Watchdog {
    fn start(pid: u32) -> Watchdog {
        // Ignores the terminal's signals so that a Ctrl-C, which kills the test process, still
        // lets it see the pipe close; `read` fails at end of file.
        let script =
            r#"trap '' INT TERM HUP; while read -r _line; do :; done; kill -9 "$1" 2>/dev/null"#;
        let mut process = Command::new("sh")
            .args(["-c", script, "csi-test-watchdog", &pid.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the watchdog shell");
        let pipe = process.stdin.take().expect("watchdog stdin is piped");
        Watchdog { process, pipe }
    }

    fn stop(mut self) {
        // SIGKILL is pending before the pipe closes, so the script cannot reach its `kill`.
        let _ = self.process.kill();
        let _ = self.process.wait();
        drop(self.pipe);
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A binary built by cargo from this workspace (`csi-provisioner`, `csi-test-driver`), found
/// next to the test executable (`target/<profile>/deps/<test>-<hash>` → `target/<profile>/`).
///
/// `cargo test` only builds the binaries of the package under test; `make test` builds them all
/// first (`cargo build --workspace --bins --tests`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("locating the test executable");
    let mut dir = exe.parent().expect("test executable has a directory");
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir = dir.parent().expect("deps has a parent");
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} is not built; run `cargo build --workspace --bins` (which `make test` does)",
        path.display()
    );
    path
}

/// Waits until something accepts connections on the unix socket `path` (a driver that was just
/// started); panics with the owner's log if it exits first.
pub async fn wait_for_socket(owner: &mut ChildProcess, path: &Path, timeout: Duration) {
    let what = format!("{} to listen on {}", owner.name, path.display());
    wait_for(&what, timeout, || {
        let exited = owner.try_exit_status();
        let log = owner.log_contents();
        let what = what.as_str();
        async move {
            if let Some(status) = exited {
                panic!("{what}: it exited ({status}) first; log:\n{log}");
            }
            tokio::net::UnixStream::connect(path).await.map(drop)
        }
    })
    .await
}

/// A test driver that calls itself `name` (a migration target, say) rather than a rig's unique
/// name, reporting `topology` for its volumes when given, in a temporary directory that must
/// live as long as the driver.
pub async fn driver_named(
    name: &str,
    topology: Option<(&str, &str)>,
) -> (tempfile::TempDir, csi_test_driver::process::DriverProcess) {
    use csi_test_driver::process::{DriverOptions, DriverProcess, binary_path};
    let dir = tempfile::tempdir().expect("a directory for the test driver");
    let driver = DriverProcess::start(
        &binary_path().expect("csi-test-driver binary"),
        dir.path(),
        &DriverOptions {
            drivername: name.into(),
            topology: topology.map(|(k, v)| (k.to_string(), v.to_string())),
            ..DriverOptions::default()
        },
    )
    .await
    .expect("starting the test driver");
    (dir, driver)
}
