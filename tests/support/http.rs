//! Plain HTTP against the sidecar's endpoint (`--http-endpoint`): a free loopback address, one
//! GET, and waiting until a path answers.

use std::net::TcpListener;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{DEADLINE, Rig, wait_for};

/// A loopback address nothing listens on (the kernel picked the port; we let it go again).
pub fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().unwrap().to_string()
}

pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    /// The body as sent (a profile is not text).
    pub bytes: Vec<u8>,
}

/// One HTTP/1.0 GET (the server closes the connection after answering).
pub async fn get(address: &str, path: &str, accept: Option<&str>) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect(address).await?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n{accept}\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, bytes) = match split {
        Some(at) => (&raw[..at], raw[at + 4..].to_vec()),
        None => (&raw[..], Vec::new()),
    };
    let head = String::from_utf8_lossy(head);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        })
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Ok(Reply {
        status,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    })
}

/// Waits until the endpoint answers `path` with 200.
pub async fn wait_serving(rig: &Rig, address: &str, path: &str) -> Reply {
    wait_for(&format!("{path} on {address}"), DEADLINE, || async {
        match get(address, path, None).await {
            Ok(r) if r.status == 200 => Ok(r),
            Ok(r) => Err(format!("HTTP {}: {}", r.status, r.body)),
            Err(e) => Err(format!("{e}; sidecar log:\n{}", rig.sidecar_log())),
        }
    })
    .await
}
