//! The control protocol: how tests steer a running driver (inject faults, release hung calls,
//! crash it, read its ledger) over a unix socket.
//!
//! One JSON object per line in each direction: a [`Request`] tagged by `"cmd"`, answered by a
//! [`Response`] (`{"ok":true,...}` or `{"ok":false,"error":"..."}`). Any language (or `socat`)
//! can speak it; Rust tests use [`Client`].

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::code::GrpcCode;
use crate::ledger::Ledger;

/// A control command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The whole ledger, as held in memory (the file may lag behind for call counts only).
    Ledger,
    /// Call counts, hung calls and readiness.
    Stats,
    /// Adds or replaces one fault on one RPC method (`CreateVolume`, `Probe`, ...). Faults of
    /// different kinds on the same method combine.
    SetFault { method: String, fault: Fault },
    /// Removes the faults of `method`, or of every method when absent. Calls already hung stay
    /// hung until `release`.
    ClearFaults {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
    },
    /// Lets every call hung or held on `method` proceed (a call held after it ran sends its
    /// answer), and stops hanging new ones.
    Release { method: String },
    /// Ends every call held by a `hold` fault on `method` (every method when absent): one
    /// held before it ran never runs, one held after it ran has its answer discarded. Both
    /// answer `UNAVAILABLE` (the caller is normally gone by then).
    Drop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
    },
    /// Exits the process at once with status 137, as if `kill -9`ed: no cleanup, sockets left
    /// behind. The response is sent before exiting (best effort).
    Crash,
    /// What `Probe` answers in `ready`.
    SetReady { ready: bool },
    /// Forgets a volume without a `DeleteVolume`, as when the storage system loses it: gone
    /// from the ledger's volumes, and no operation records it.
    LoseVolume { volume_id: String },
}

/// A fault on one RPC method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Every call waits `ms` milliseconds before doing anything.
    Latency { ms: u64 },
    /// The next `count` calls fail with `code` without doing anything.
    Error {
        code: GrpcCode,
        count: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Each call fails with `code` with the given probability (0.0..=1.0), drawn from the
    /// driver's seeded RNG (`--seed`), without doing anything.
    ErrorProbability { code: GrpcCode, probability: f64 },
    /// `CreateVolume` only: the next `count` calls that would succeed create (or find) the
    /// volume, record it, and then answer `DEADLINE_EXCEEDED`, like a backend that finished
    /// after the caller gave up.
    CreateThenDeadlineExceeded { count: u32 },
    /// `CreateVolume` only: the next `count` calls that succeed answer with `capacity_bytes`
    /// set to `bytes` (0: "unknown", or less than asked) while the volume keeps its real
    /// size, like a backend that rounds down or does not report sizes.
    CreateReportsCapacity { bytes: i64, count: u32 },
    /// Every call blocks until a `release` command for this method.
    Hang,
    /// The `nth` call of this method from now on (1: the next one) is held until `release`
    /// or `drop`: before it does anything (`after: false`), or after it ran — its outcome
    /// in the ledger — with its answer held (`after: true`). The calls before it pass.
    /// `nth: 0` disarms a hold that has not fired.
    Hold {
        nth: u32,
        #[serde(default)]
        after: bool,
    },
    /// `CreateVolume` only: a name that exists is answered with its volume whatever the
    /// parameters, like a backend that never compares them (the spec asks for
    /// `ALREADY_EXISTS`).
    CreateIgnoresParameters,
    /// `CreateVolume` only: a name that exists, asked again with a compatible request, gets a new
    /// volume of its own instead of the existing one (an incompatible request still gets
    /// `ALREADY_EXISTS`), like a backend that checks names for conflicts but does not use them
    /// as its idempotency key.
    CreateNotIdempotent,
    /// `DeleteVolume` only: an id this driver never held is answered `NOT_FOUND` (the spec
    /// asks for `OK`).
    DeleteUnknownNotFound,
    /// `DeleteVolume` only: an id this driver held and deleted is answered `NOT_FOUND` (the
    /// spec asks for `OK`: a second `DeleteVolume` succeeds).
    DeleteAgainNotFound,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<Ledger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

impl Response {
    pub fn ok() -> Self {
        Response {
            ok: true,
            error: None,
            ledger: None,
            stats: None,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Response {
            ok: false,
            error: Some(message.into()),
            ledger: None,
            stats: None,
        }
    }
}

/// Live counters of a running driver.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Calls received per method since the ledger was created (survives restarts).
    pub calls: BTreeMap<String, u64>,
    /// Calls currently blocked by a `hang` fault, per method.
    pub hung: BTreeMap<String, u64>,
    /// Calls currently held by a `hold` fault, per method.
    #[serde(default)]
    pub held: BTreeMap<String, u64>,
    /// What `Probe` answers.
    pub ready: bool,
    /// Volumes currently held.
    pub volumes: usize,
}

/// Why a control request failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket could not be reached or the connection broke.
    Io(io::Error),
    /// The driver sent something that is not a [`Response`].
    Protocol(String),
    /// The driver understood the request and refused it.
    Refused(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(err) => write!(f, "control socket: {err}"),
            ClientError::Protocol(message) => write!(f, "control protocol: {message}"),
            ClientError::Refused(message) => write!(f, "driver refused: {message}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Io(err) => Some(err),
            _ => None,
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(err: io::Error) -> Self {
        ClientError::Io(err)
    }
}

/// Async client of the control socket.
///
/// Each request uses a fresh connection, so one client keeps working across driver restarts
/// (as long as the new process uses the same control socket path).
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
}

impl Client {
    /// Checks that the control socket accepts connections and returns a client for it.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let client = Client {
            path: path.as_ref().to_path_buf(),
        };
        UnixStream::connect(&client.path).await?;
        Ok(client)
    }

    /// Like [`Client::connect`], retrying until `timeout`: for a driver that is still starting.
    pub async fn connect_with_timeout(
        path: impl AsRef<Path>,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            match Client::connect(path.as_ref()).await {
                Ok(client) => return Ok(client),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The control socket this client talks to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and returns the driver's response, refused or not.
    pub async fn request(&self, request: &Request) -> Result<Response, ClientError> {
        let stream = UnixStream::connect(&self.path).await?;
        let (read, mut write) = stream.into_split();
        let mut line =
            serde_json::to_string(request).map_err(|err| ClientError::Protocol(err.to_string()))?;
        line.push('\n');
        write.write_all(line.as_bytes()).await?;
        write.flush().await?;

        let mut reply = String::new();
        let read_bytes = BufReader::new(read).read_line(&mut reply).await?;
        if read_bytes == 0 {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "driver closed the control connection without answering",
            )));
        }
        serde_json::from_str(&reply)
            .map_err(|err| ClientError::Protocol(format!("{err}: {:?}", reply.trim_end())))
    }

    /// Sends a request and turns `{"ok":false}` into [`ClientError::Refused`].
    async fn expect_ok(&self, request: &Request) -> Result<Response, ClientError> {
        let response = self.request(request).await?;
        if response.ok {
            Ok(response)
        } else {
            Err(ClientError::Refused(
                response
                    .error
                    .unwrap_or_else(|| "no reason given".to_string()),
            ))
        }
    }

    /// The driver's ledger, from memory.
    pub async fn ledger(&self) -> Result<Ledger, ClientError> {
        self.expect_ok(&Request::Ledger)
            .await?
            .ledger
            .ok_or_else(|| ClientError::Protocol("ledger response without a ledger".into()))
    }

    /// Call counts, hung calls and readiness.
    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.expect_ok(&Request::Stats)
            .await?
            .stats
            .ok_or_else(|| ClientError::Protocol("stats response without stats".into()))
    }

    /// Adds or replaces a fault on `method` (an RPC name such as `CreateVolume`).
    pub async fn set_fault(&self, method: &str, fault: Fault) -> Result<(), ClientError> {
        self.expect_ok(&Request::SetFault {
            method: method.to_string(),
            fault,
        })
        .await
        .map(drop)
    }

    /// Removes every fault of every method.
    pub async fn clear_faults(&self) -> Result<(), ClientError> {
        self.expect_ok(&Request::ClearFaults { method: None })
            .await
            .map(drop)
    }

    /// Removes every fault of one method.
    pub async fn clear_method_faults(&self, method: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::ClearFaults {
            method: Some(method.to_string()),
        })
        .await
        .map(drop)
    }

    /// Lets the calls hung on `method` proceed and stops hanging new ones.
    pub async fn release(&self, method: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::Release {
            method: method.to_string(),
        })
        .await
        .map(drop)
    }

    /// Ends the calls held on `method` (every method when `None`) without running them or
    /// sending their answers.
    pub async fn drop_held(&self, method: Option<&str>) -> Result<(), ClientError> {
        self.expect_ok(&Request::Drop {
            method: method.map(str::to_string),
        })
        .await
        .map(drop)
    }

    /// Makes the driver exit at once (status 137). Succeeds when the driver acknowledged or
    /// went away; it does not wait for the process to be reaped.
    pub async fn crash(&self) -> Result<(), ClientError> {
        match self.request(&Request::Crash).await {
            Ok(response) if response.ok => Ok(()),
            Ok(response) => Err(ClientError::Refused(response.error.unwrap_or_default())),
            // The process may die before its answer is read: that is the point.
            Err(ClientError::Io(_)) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Sets what `Probe` answers.
    pub async fn set_ready(&self, ready: bool) -> Result<(), ClientError> {
        self.expect_ok(&Request::SetReady { ready }).await.map(drop)
    }

    /// Forgets a volume behind its users' backs (see [`Request::LoseVolume`]).
    pub async fn lose_volume(&self, volume_id: &str) -> Result<(), ClientError> {
        self.expect_ok(&Request::LoseVolume {
            volume_id: volume_id.to_string(),
        })
        .await
        .map(drop)
    }

    /// Waits until at least `count` calls of `method` are blocked by a `hang` fault.
    pub async fn wait_for_hung(
        &self,
        method: &str,
        count: u64,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        self.wait_for(method, count, timeout, |s| &s.hung).await
    }

    /// Waits until at least `count` calls of `method` are held by a `hold` fault.
    pub async fn wait_for_held(
        &self,
        method: &str,
        count: u64,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        self.wait_for(method, count, timeout, |s| &s.held).await
    }

    async fn wait_for(
        &self,
        method: &str,
        count: u64,
        timeout: Duration,
        which: fn(&Stats) -> &BTreeMap<String, u64>,
    ) -> Result<(), ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats().await?;
            let hung = which(&stats).get(method).copied().unwrap_or(0);
            if hung >= count {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{hung} of {count} {method} calls waiting after {timeout:?}"),
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_shape() {
        let cases = [
            (Request::Ledger, r#"{"cmd":"ledger"}"#),
            (
                Request::SetFault {
                    method: "CreateVolume".into(),
                    fault: Fault::Error {
                        code: GrpcCode::Unavailable,
                        count: 2,
                        message: None,
                    },
                },
                r#"{"cmd":"set_fault","method":"CreateVolume","fault":{"kind":"error","code":"UNAVAILABLE","count":2}}"#,
            ),
            (
                Request::SetFault {
                    method: "CreateVolume".into(),
                    fault: Fault::CreateThenDeadlineExceeded { count: 1 },
                },
                r#"{"cmd":"set_fault","method":"CreateVolume","fault":{"kind":"create_then_deadline_exceeded","count":1}}"#,
            ),
            (
                Request::ClearFaults { method: None },
                r#"{"cmd":"clear_faults"}"#,
            ),
            (
                Request::SetFault {
                    method: "DeleteVolume".into(),
                    fault: Fault::Hold {
                        nth: 2,
                        after: true,
                    },
                },
                r#"{"cmd":"set_fault","method":"DeleteVolume","fault":{"kind":"hold","nth":2,"after":true}}"#,
            ),
            (
                Request::Drop {
                    method: Some("CreateVolume".into()),
                },
                r#"{"cmd":"drop","method":"CreateVolume"}"#,
            ),
            (
                Request::SetReady { ready: false },
                r#"{"cmd":"set_ready","ready":false}"#,
            ),
            (
                Request::LoseVolume {
                    volume_id: "vol-1".into(),
                },
                r#"{"cmd":"lose_volume","volume_id":"vol-1"}"#,
            ),
        ];
        for (request, json) in cases {
            assert_eq!(serde_json::to_string(&request).unwrap(), json);
            assert_eq!(serde_json::from_str::<Request>(json).unwrap(), request);
        }
        assert_eq!(
            serde_json::to_string(&Response::error("nope")).unwrap(),
            r#"{"ok":false,"error":"nope"}"#
        );
    }
}
