//! Time travel: a second kube-apiserver on the same etcd, whose link to etcd can be frozen
//! (a partition), so that its watch cache is held behind while the first one moves on. A
//! client that lists or watches from the cache there (`resourceVersion=0`, or a watch from
//! an old resourceVersion) sees the past; a consistent read there waits for etcd.
//!
//! The second server runs with the first one's command line (`kube-apiserver.cmd` of the
//! test bed's directory: same certificates, tokens, authorization), on a port of its own,
//! with `--etcd-servers` pointing at an [`EtcdLink`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::procs::Proc;
use crate::world::admin_client;

/// A TCP forwarder between a kube-apiserver and etcd (plain HTTP/2 on loopback in the test
/// bed) that can be frozen: no byte goes either way until it thaws. Connections made while
/// frozen are accepted and held the same way.
pub struct EtcdLink {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl EtcdLink {
    /// Listens on a free loopback port and forwards to `etcd` (`host:port`).
    pub async fn start(etcd: String) -> std::io::Result<EtcdLink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, _) = watch::channel(false);
        let gate = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (etcd, gate) = (etcd.clone(), gate.subscribe());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&etcd).await else {
                        return;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, gate.clone()), pump(sr, cw, gate));
                });
            }
        });
        Ok(EtcdLink { addr, frozen, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Freezes (`true`) or thaws the link.
    pub fn freeze(&self, on: bool) {
        self.frozen.send_replace(on);
    }
}

impl Drop for EtcdLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies bytes from `from` to `to`, waiting while the gate says frozen (before reading and
/// before writing: a chunk read just before a freeze is held too).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if gate.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The value of `--flag=` in a NUL-separated command line.
fn arg_of<'a>(cmdline: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("--{flag}=");
    cmdline.iter().find_map(|a| a.strip_prefix(&prefix))
}

/// The first one's command line, for a second server: its own port and etcd.
pub fn second_command_line(first: &[String], port: u16, etcd_url: &str) -> Vec<String> {
    first
        .iter()
        .map(|a| {
            if a.starts_with("--secure-port=") {
                format!("--secure-port={port}")
            } else if a.starts_with("--etcd-servers=") {
                format!("--etcd-servers={etcd_url}")
            } else {
                a.clone()
            }
        })
        .collect()
}

/// A second kube-apiserver of the test bed, its etcd reached through an [`EtcdLink`].
pub struct SecondApiserver {
    proc: Proc,
    pub link: EtcdLink,
    /// The admin's kube config, pointed at this server.
    pub config: kube::Config,
    pub client: kube::Client,
}

impl SecondApiserver {
    /// Starts it from `dir/kube-apiserver.cmd` and waits until it is ready.
    pub async fn start(dir: &Path, admin_kubeconfig: &Path, log: PathBuf) -> Result<Self, String> {
        let text = std::fs::read(dir.join("kube-apiserver.cmd"))
            .map_err(|e| format!("reading {}/kube-apiserver.cmd: {e}", dir.display()))?;
        let first: Vec<String> = text
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let etcd = arg_of(&first, "etcd-servers")
            .and_then(|u| u.strip_prefix("http://"))
            .ok_or("kube-apiserver.cmd has no plain http --etcd-servers")?
            .to_string();
        let link = EtcdLink::start(etcd)
            .await
            .map_err(|e| format!("starting the etcd link: {e}"))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let args = second_command_line(&first, port, &link.url());
        let (program, args) = args.split_first().ok_or("empty kube-apiserver.cmd")?;
        let proc = Proc::spawn(Path::new(program), args, &[], &log).map_err(|e| e.to_string())?;
        let (_, mut config) = admin_client(admin_kubeconfig).await?;
        config.cluster_url = format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let client = kube::Client::try_from(config.clone()).map_err(|e| e.to_string())?;
        let server = SecondApiserver {
            proc,
            link,
            config,
            client,
        };
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = server
                .client
                .request_text(
                    http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| e.to_string())?,
                )
                .await;
            if ready.is_ok() {
                return Ok(server);
            }
            if Instant::now() >= until {
                return Err(format!(
                    "the second kube-apiserver is not ready after 120 s (log {})",
                    log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The claims of `ns` as this server's watch cache has them (`resourceVersion=0`).
    pub async fn cached_claims(&self, ns: &str) -> Result<Vec<PersistentVolumeClaim>, String> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().match_any())
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string())
    }

    /// Whether the cache shows claim `uid`, and not deleting.
    pub async fn shows_live(&self, ns: &str, uid: &str) -> bool {
        self.cached_claims(ns).await.is_ok_and(|claims| {
            claims
                .iter()
                .any(|c| c.uid().as_deref() == Some(uid) && c.metadata.deletion_timestamp.is_none())
        })
    }

    pub async fn stop(mut self) {
        self.link.freeze(false);
        self.proc.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_server_differs_only_in_port_and_etcd() {
        let first: Vec<String> = [
            "/bin/kube-apiserver",
            "--etcd-servers=http://127.0.0.1:2379",
            "--secure-port=6443",
            "--cert-dir=/d/pki",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            arg_of(&first, "etcd-servers"),
            Some("http://127.0.0.1:2379")
        );
        assert_eq!(
            second_command_line(&first, 7443, "http://127.0.0.1:9999"),
            [
                "/bin/kube-apiserver",
                "--etcd-servers=http://127.0.0.1:9999",
                "--secure-port=7443",
                "--cert-dir=/d/pki",
            ]
        );
    }

    #[tokio::test]
    async fn a_frozen_link_holds_bytes_until_it_thaws() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut b = [0u8; 4];
            while s.read_exact(&mut b).await.is_ok() {
                s.write_all(&b).await.unwrap();
            }
        });
        let link = EtcdLink::start(target).await.unwrap();
        let mut c = TcpStream::connect(link.addr).await.unwrap();
        let mut b = [0u8; 4];
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        link.freeze(true);
        c.write_all(b"pong").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut b)).await;
        assert!(held.is_err(), "nothing passes while frozen");
        link.freeze(false);
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
    }
}
