//! Starting the `csi-test-driver` binary from tests: sockets and state in one directory,
//! readiness wait, crash and restart on the same ledger.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::control::{Client, ClientError};
use crate::ledger::Ledger;

/// How long [`DriverProcess::start`] waits for the sockets to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the `csi-test-driver` binary is: `$CSI_TEST_DRIVER_BIN` if set, else next to the
/// running test executable's directory (`target/<profile>/deps/..`), where cargo puts the
/// binaries of the workspace (build them first, e.g. `cargo build --workspace --bins`).
pub fn binary_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CSI_TEST_DRIVER_BIN") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    if dir.ends_with("deps") {
        dir = dir.parent()?;
    }
    let candidate = dir.join("csi-test-driver");
    candidate.is_file().then_some(candidate)
}

/// Flags for a driver process beyond the socket and state paths.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub drivername: String,
    pub node_id: String,
    pub capacity_bytes: Option<i64>,
    pub topology: Option<(String, String)>,
    /// Passed as `--capabilities` (comma-joined) when not empty.
    pub capabilities: Vec<String>,
    pub seed: u64,
    /// `RUST_LOG` for the child, unless the environment already sets one.
    pub log: String,
    /// Passed as `--volume-id-with-name`: volume IDs embed the CreateVolume name.
    pub volume_id_with_name: bool,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            drivername: "test.csi.example.com".into(),
            node_id: "node-1".into(),
            capacity_bytes: None,
            topology: None,
            capabilities: Vec::new(),
            seed: 1,
            log: "warn".into(),
            volume_id_with_name: false,
        }
    }
}

/// A running driver process. Killed when dropped.
#[derive(Debug)]
pub struct DriverProcess {
    binary: PathBuf,
    args: Vec<String>,
    log: String,
    child: Child,
    /// The CSI unix socket.
    pub endpoint: PathBuf,
    /// The control unix socket.
    pub control_path: PathBuf,
    /// The directory holding `ledger.json`.
    pub state_dir: PathBuf,
}

impl DriverProcess {
    /// Starts `binary` with its sockets (`csi.sock`, `control.sock`) and state (`state/`) in
    /// `dir`, and waits until the control socket answers.
    pub async fn start(
        binary: &Path,
        dir: &Path,
        options: &DriverOptions,
    ) -> Result<DriverProcess, ClientError> {
        let endpoint = dir.join("csi.sock");
        let control_path = dir.join("control.sock");
        let state_dir = dir.join("state");
        let mut args = vec![
            format!("--endpoint=unix://{}", endpoint.display()),
            format!("--control={}", control_path.display()),
            format!("--state-dir={}", state_dir.display()),
            format!("--drivername={}", options.drivername),
            format!("--node-id={}", options.node_id),
            format!("--seed={}", options.seed),
        ];
        if let Some(capacity) = options.capacity_bytes {
            args.push(format!("--capacity-bytes={capacity}"));
        }
        if let Some((key, value)) = &options.topology {
            args.push(format!("--topology-key={key}"));
            args.push(format!("--topology-value={value}"));
        }
        if !options.capabilities.is_empty() {
            args.push(format!("--capabilities={}", options.capabilities.join(",")));
        }
        if options.volume_id_with_name {
            args.push("--volume-id-with-name".into());
        }
        let child = spawn(binary, &args, &options.log)?;
        let mut process = DriverProcess {
            binary: binary.to_path_buf(),
            args,
            log: options.log.clone(),
            child,
            endpoint,
            control_path,
            state_dir,
        };
        process.wait_ready().await?;
        Ok(process)
    }

    /// A control client for this process (it keeps working across restarts).
    pub async fn control(&self) -> Result<Client, ClientError> {
        Client::connect(&self.control_path).await
    }

    /// `unix://` address of the CSI socket, as the sidecar's `--csi-address` takes it.
    pub fn csi_address(&self) -> String {
        format!("unix://{}", self.endpoint.display())
    }

    /// The ledger as last written to disk (works while the process is down).
    pub fn ledger_on_disk(&self) -> std::io::Result<Ledger> {
        Ledger::load(&self.state_dir)
    }

    /// Waits for the process to exit (after `crash`, say).
    pub async fn wait_exit(&mut self, timeout: Duration) -> std::io::Result<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "driver did not exit"))?
    }

    /// Kills the process with SIGKILL and reaps it.
    pub async fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill().await
    }

    /// Starts the same binary with the same flags again (same sockets, same ledger). The
    /// previous process must have exited or is killed first.
    pub async fn restart(&mut self) -> Result<(), ClientError> {
        if self.child.try_wait()?.is_none() {
            self.child.kill().await?;
        }
        self.child = spawn(&self.binary, &self.args, &self.log)?;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(ClientError::Io(std::io::Error::other(format!(
                    "csi-test-driver exited during start-up: {status}"
                ))));
            }
            // Stale sockets of a crashed predecessor may still accept nothing: a successful
            // request is the only proof the new process is serving.
            if let Ok(client) = Client::connect(&self.control_path).await
                && client.stats().await.is_ok()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClientError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("csi-test-driver not ready after {START_TIMEOUT:?}"),
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn spawn(binary: &Path, args: &[String], log: &str) -> std::io::Result<Child> {
    let mut command = Command::new(binary);
    command.args(args).stdin(Stdio::null()).kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", log);
    }
    command.spawn().map_err(|err| {
        std::io::Error::new(
            err.kind(),
            format!("cannot start {}: {err}", binary.display()),
        )
    })
}
