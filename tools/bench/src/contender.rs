//! The three programs compared: the upstream Go sidecar, ours, and the floor
//! (this binary's `floor` subcommand). Each gets the same flags.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::plan::Limits;

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Who {
    Upstream,
    Ours,
    /// Ours with `--admission-intent` and the two intent policies of
    /// deploy/kubernetes/ installed for its driver.
    #[serde(rename = "ours+policies")]
    #[value(name = "ours-policies")]
    OursPolicies,
    Floor,
}

impl Who {
    pub const ALL: [Who; 4] = [Who::Upstream, Who::Ours, Who::OursPolicies, Who::Floor];

    /// The label as it may appear in object and file names.
    pub fn slug(self) -> &'static str {
        match self {
            Who::OursPolicies => "ours-policies",
            other => other.label(),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Who::Upstream => "upstream",
            Who::Ours => "ours",
            Who::OursPolicies => "ours+policies",
            Who::Floor => "floor",
        }
    }
}

/// Where each program is.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub upstream: PathBuf,
    pub ours: PathBuf,
    pub bench: PathBuf,
    pub driver: PathBuf,
}

impl Binaries {
    pub fn check(&self) -> anyhow::Result<()> {
        for p in [&self.upstream, &self.ours, &self.bench, &self.driver] {
            anyhow::ensure!(
                p.is_file(),
                "{} is missing (make bench builds it)",
                p.display()
            );
        }
        Ok(())
    }
}

/// The flags every contender gets, in the same order. `http` is where the
/// sidecars serve `/metrics` (the floor takes the flag and serves nothing).
pub fn common_flags(
    socket: &Path,
    kubeconfig: &Path,
    limits: Limits,
    worker_threads: u32,
    http: SocketAddr,
) -> Vec<String> {
    vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--kube-api-qps={}", limits.qps),
        format!("--kube-api-burst={}", limits.burst),
        format!("--worker-threads={worker_threads}"),
        "--leader-election=false".to_string(),
        format!("--http-endpoint={http}"),
    ]
}

/// A free local port for a contender's `--http-endpoint` (taken, then let go:
/// nothing else on the machine races for it in practice).
pub fn free_local_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

pub struct Running {
    pub who: Who,
    pub child: Child,
    pub pid: u32,
    pub log: PathBuf,
    /// Where its `/metrics` is served (not the floor's).
    pub metrics: Option<SocketAddr>,
}

pub fn spawn(
    who: Who,
    bins: &Binaries,
    flags: &[String],
    log: PathBuf,
    metrics: SocketAddr,
) -> anyhow::Result<Running> {
    let mut cmd = match who {
        Who::Upstream => Command::new(&bins.upstream),
        Who::Ours => Command::new(&bins.ours),
        Who::OursPolicies => {
            let mut c = Command::new(&bins.ours);
            c.arg("--admission-intent");
            c
        }
        Who::Floor => {
            let mut c = Command::new(&bins.bench);
            c.arg("floor");
            c
        }
    };
    let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let child = cmd
        .args(flags)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", who.label()))?;
    let pid = child.id().context("contender pid")?;
    Ok(Running {
        who,
        child,
        pid,
        log,
        metrics: (who != Who::Floor).then_some(metrics),
    })
}

impl Running {
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
