//! The watch-stream filter: a JSON watch response is split into events, and each event is
//! delivered, delayed, duplicated, dropped or held according to the rules, before the
//! stream may be cut. Per-object order is always kept; events of different objects may
//! overtake each other only while one of them is held (hidden or delayed).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};

use crate::ProxyBody;
use crate::rules::RequestInfo;
use crate::server::{CutOrder, Shared};

#[derive(Deserialize)]
struct EventHead {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: Option<ObjectHead>,
}

#[derive(Deserialize)]
struct ObjectHead {
    #[serde(default)]
    metadata: Option<MetaHead>,
}

#[derive(Deserialize)]
struct MetaHead {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

struct Held {
    bytes: Bytes,
    resource_version: Option<String>,
}

/// Wraps the upstream watch body in the fault filter and returns the body to send on.
pub(crate) fn filter(
    shared: Arc<Shared>,
    info: RequestInfo,
    upstream: kube::client::Body,
) -> ProxyBody {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let cuts = shared.cuts.subscribe();
    tokio::spawn(run(shared, info, upstream, tx, cuts));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, crate::BoxError>(Frame::data(b)), rx))
    });
    StreamBody::new(stream).boxed_unsync()
}

struct Stream {
    shared: Arc<Shared>,
    info: RequestInfo,
    tx: mpsc::Sender<Bytes>,
    pending: BTreeMap<(Instant, u64), Held>,
    seq: u64,
    /// Per object: when its last event is released, so that its events stay in order.
    last_for_object: HashMap<String, Instant>,
    /// The resourceVersion of the last event the client received: where it will resume.
    last_rv: Option<String>,
    /// Events were dropped, or the cut asked for it: the client's resume point must be
    /// expired when the stream ends.
    expire_resume: bool,
    cut_at: Option<Instant>,
}

async fn run(
    shared: Arc<Shared>,
    info: RequestInfo,
    mut upstream: kube::client::Body,
    tx: mpsc::Sender<Bytes>,
    mut cuts: broadcast::Receiver<CutOrder>,
) {
    let mut s = Stream {
        last_rv: info.resource_version.clone(),
        shared,
        info,
        tx,
        pending: BTreeMap::new(),
        seq: 0,
        last_for_object: HashMap::new(),
        expire_resume: false,
        cut_at: None,
    };
    let mut buf = BytesMut::new();
    let mut upstream_done = false;
    let mut cuts_open = true;
    loop {
        let next_due = s.pending.keys().next().map(|k| k.0);
        tokio::select! {
            biased;
            _ = s.tx.closed() => return,
            msg = cuts.recv(), if cuts_open => match msg {
                Ok(order) => {
                    if order.resources.is_empty() || order.resources.contains(&s.info.resource) {
                        s.cut_at = Some(Instant::now());
                        s.expire_resume |= order.expire;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => cuts_open = false,
            },
            _ = sleep_until(s.cut_at), if s.cut_at.is_some() => {
                s.flush_all().await;
                break;
            }
            _ = sleep_until(next_due), if next_due.is_some() => {
                if !s.emit_due().await {
                    return;
                }
            }
            frame = upstream.frame(), if !upstream_done => match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                            let line = buf.split_to(pos + 1).freeze();
                            s.on_event(line);
                        }
                    }
                }
                Some(Err(_)) | None => upstream_done = true,
            },
        }
        if upstream_done && s.pending.is_empty() {
            if !buf.is_empty() {
                let _ = s.tx.send(buf.split().freeze()).await;
            }
            break;
        }
    }
    if s.expire_resume
        && let Some(rv) = &s.last_rv
    {
        s.shared.rules().expire(&s.info.resource, rv);
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

impl Stream {
    fn on_event(&mut self, line: Bytes) {
        let now = Instant::now();
        let head: Option<EventHead> = serde_json::from_slice(&line).ok();
        let (kind, meta) = match head {
            Some(h) => (h.kind, h.object.and_then(|o| o.metadata)),
            None => (String::new(), None),
        };
        let rv = meta.as_ref().and_then(|m| m.resource_version.clone());
        let object_key = meta.as_ref().and_then(|m| m.name.as_ref()).map(|name| {
            format!(
                "{}/{}/{}",
                self.info.resource,
                meta.as_ref()
                    .and_then(|m| m.namespace.as_deref())
                    .unwrap_or(""),
                name
            )
        });
        let ordinary = matches!(kind.as_str(), "ADDED" | "MODIFIED" | "DELETED");
        let (plan, key) = match (&object_key, ordinary) {
            (Some(key), true) => (
                self.shared.rules().plan_event(&self.info, &kind, key),
                key.clone(),
            ),
            // Bookmarks, errors and anything unparsable never overtake what came before.
            _ => {
                let release = self
                    .pending
                    .keys()
                    .next_back()
                    .map_or(now, |k| k.0.max(now));
                self.hold(release, line, rv);
                return;
            }
        };
        if plan.drop {
            self.expire_resume = true;
            if let Some(after) = plan.relist_after {
                let at = now + after;
                self.cut_at = Some(self.cut_at.map_or(at, |c| c.min(at)));
            }
            return;
        }
        let mut release = now + plan.delay;
        if let Some(until) = plan.hidden_until {
            release = release.max(until);
        }
        if let Some(previous) = self.last_for_object.get(&key) {
            release = release.max(*previous);
        }
        self.last_for_object.insert(key, release);
        if plan.duplicate {
            self.hold(release, line.clone(), rv.clone());
        }
        self.hold(release, line, rv);
        if plan.cut_after {
            self.cut_at = Some(self.cut_at.map_or(release, |c| c.min(release)));
        }
        if self.last_for_object.len() > 4096 {
            self.last_for_object.retain(|_, at| *at > now);
        }
    }

    fn hold(&mut self, release: Instant, bytes: Bytes, resource_version: Option<String>) {
        self.seq += 1;
        self.pending.insert(
            (release, self.seq),
            Held {
                bytes,
                resource_version,
            },
        );
    }

    /// Sends every event that is due; false when the client went away.
    async fn emit_due(&mut self) -> bool {
        let now = Instant::now();
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let held = entry.remove();
            if !self.send(held).await {
                return false;
            }
        }
        true
    }

    async fn flush_all(&mut self) {
        while let Some((_, held)) = self.pending.pop_first() {
            if !self.send(held).await {
                return;
            }
        }
    }

    async fn send(&mut self, held: Held) -> bool {
        if let Some(rv) = held.resource_version {
            self.last_rv = Some(rv);
        }
        self.tx.send(held.bytes).await.is_ok()
    }
}
