//! The control protocol: how a test steers a running proxy over a unix socket.
//!
//! One JSON object per line in each direction, like the test driver's: a [`Request`] tagged
//! by `"cmd"`, answered by a [`Response`] (`{"ok":true,...}` or `{"ok":false,"error":"..."}`).
//! From a shell: `echo '{"cmd":"stats"}' | socat - UNIX-CONNECT:/tmp/proxy.sock`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::hold::{Decision, HeldRequest, WriteRecord};
use crate::rules::{Rule, Stats};
use crate::server::{CutOrder, Shared};

/// A control command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Adds a rule; the answer carries its `id`.
    AddRule { rule: Rule },
    /// Removes one rule.
    RemoveRule { id: u64 },
    /// Removes every rule and forgets hidden objects.
    Clear,
    /// Lists the rules (`rules`: `[[id, rule], ...]`).
    Rules,
    /// Counters of injected faults and forwarded requests.
    Stats,
    /// Cuts the open watch streams of these resources now (every stream when empty); with
    /// `expire`, each client's watch from where it was is answered 410 Gone (it relists).
    Cut {
        #[serde(default)]
        resources: Vec<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        expire: bool,
    },
    /// The requests `hold` rules hold now (`held`).
    Held,
    /// Lets every held request go on: forwarded, or its answer sent (`count`: how many).
    Release,
    /// Ends every held request without forwarding it or sending its real answer (`count`).
    Drop,
    /// Starts a fresh journal of the writes (create, update, patch, delete) that go through.
    Record,
    /// The writes since `record`, in arrival order (`journal`).
    Journal,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<(u64, Rule)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Vec<HeldRequest>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<Vec<WriteRecord>>,
}

impl Response {
    fn ok() -> Response {
        Response {
            ok: true,
            ..Default::default()
        }
    }
}

fn answer(shared: &Shared, request: Request) -> Response {
    match request {
        Request::AddRule { rule } => Response {
            id: Some(shared.rules().add(rule)),
            ..Response::ok()
        },
        Request::RemoveRule { id } => {
            if shared.rules().remove(id) {
                Response::ok()
            } else {
                Response {
                    ok: false,
                    error: Some(format!("no rule {id}")),
                    ..Default::default()
                }
            }
        }
        Request::Clear => {
            shared.rules().clear();
            Response::ok()
        }
        Request::Rules => Response {
            rules: Some(shared.rules().rules()),
            ..Response::ok()
        },
        Request::Stats => Response {
            stats: Some(shared.stats()),
            ..Response::ok()
        },
        Request::Cut { resources, expire } => {
            let _ = shared.cuts.send(CutOrder { resources, expire });
            Response::ok()
        }
        Request::Held => Response {
            held: Some(shared.holds.held()),
            ..Response::ok()
        },
        Request::Release | Request::Drop => {
            let decision = match request {
                Request::Release => Decision::Release,
                _ => Decision::Drop,
            };
            Response {
                count: Some(shared.holds.decide(decision)),
                ..Response::ok()
            }
        }
        Request::Record => {
            shared.holds.record();
            Response::ok()
        }
        Request::Journal => Response {
            journal: Some(shared.holds.journal()),
            ..Response::ok()
        },
    }
}

pub(crate) fn serve(
    path: &Path,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let path = path.to_path_buf();
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                },
                _ = stopped.changed() => break,
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let response = match serde_json::from_str::<Request>(&line) {
                        Ok(request) => answer(&shared, request),
                        Err(e) => Response {
                            ok: false,
                            error: Some(format!("bad request: {e}")),
                            ..Default::default()
                        },
                    };
                    let mut out = serde_json::to_vec(&response).unwrap_or_default();
                    out.push(b'\n');
                    if write.write_all(&out).await.is_err() {
                        break;
                    }
                }
            });
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

/// A client of the control socket.
pub struct Client {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    write: tokio::net::unix::OwnedWriteHalf,
    path: PathBuf,
}

impl Client {
    pub async fn connect(path: &Path) -> std::io::Result<Client> {
        let stream = UnixStream::connect(path).await?;
        let (read, write) = stream.into_split();
        Ok(Client {
            lines: BufReader::new(read).lines(),
            write,
            path: path.to_path_buf(),
        })
    }

    /// Sends one request and returns the answer; a refusal is an error.
    pub async fn request(&mut self, request: &Request) -> std::io::Result<Response> {
        let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.write.write_all(&line).await?;
        let answer = self.lines.next_line().await?.ok_or_else(|| {
            std::io::Error::other(format!("{}: connection closed", self.path.display()))
        })?;
        let response: Response = serde_json::from_str(&answer).map_err(std::io::Error::other)?;
        if !response.ok {
            return Err(std::io::Error::other(
                response.error.unwrap_or_else(|| "refused".into()),
            ));
        }
        Ok(response)
    }

    pub async fn add_rule(&mut self, rule: Rule) -> std::io::Result<u64> {
        Ok(self
            .request(&Request::AddRule { rule })
            .await?
            .id
            .unwrap_or_default())
    }

    pub async fn clear(&mut self) -> std::io::Result<()> {
        self.request(&Request::Clear).await.map(|_| ())
    }

    pub async fn stats(&mut self) -> std::io::Result<Stats> {
        Ok(self
            .request(&Request::Stats)
            .await?
            .stats
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Fault;

    #[test]
    fn requests_have_a_stable_wire_form() {
        let add = Request::AddRule {
            rule: Rule::new(Fault::Status { code: 429 })
                .verbs(&["patch"])
                .resources(&["persistentvolumeclaims"])
                .probability(0.1),
        };
        let text = serde_json::to_string(&add).unwrap();
        assert_eq!(
            text,
            r#"{"cmd":"add_rule","rule":{"verbs":["patch"],"resources":["persistentvolumeclaims"],"probability":0.1,"fault":{"kind":"status","code":429}}}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), add);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"cut"}"#).unwrap(),
            Request::Cut {
                resources: vec![],
                expire: false
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(
                r#"{"cmd":"cut","resources":["persistentvolumes"],"expire":true}"#
            )
            .unwrap(),
            Request::Cut {
                resources: vec!["persistentvolumes".into()],
                expire: true
            }
        );
        let hold = Request::AddRule {
            rule: Rule::new(Fault::Hold { after: true })
                .verbs(&["create"])
                .resources(&["persistentvolumes"])
                .skip(1)
                .count(1),
        };
        let text = serde_json::to_string(&hold).unwrap();
        assert_eq!(
            text,
            r#"{"cmd":"add_rule","rule":{"verbs":["create"],"resources":["persistentvolumes"],"probability":1.0,"count":1,"skip":1,"fault":{"kind":"hold","after":true}}}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), hold);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"drop"}"#).unwrap(),
            Request::Drop
        );
    }
}
