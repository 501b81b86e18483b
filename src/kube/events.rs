//! Core/v1 Events, as upstream's client-go recorder writes them (the group
//! upstream's RBAC grants), with the same aggregation idea: a repeat of the
//! same reason and message on the same object bumps `count` on the existing
//! Event instead of creating another. Messages never contain secret data:
//! callers pass error texts built from names, never from secret values.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::names::Reason;

/// How long a posted Event is reused for repeats.
const AGGREGATE_FOR: Duration = Duration::from_secs(600);
/// Bound on remembered Events (the map is cleared when it fills).
const MAX_REMEMBERED: usize = 4096;
/// Events waiting to be sent; beyond this, new ones are dropped (with a log
/// line), as client-go's broadcaster drops when its queue is full.
const QUEUE: usize = 1000;

struct Posted {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

/// One event to send, with everything taken from the object at record time.
struct Pending {
    /// The event source's component when not the recorder's own.
    component: Option<String>,
    involved: ObjectReference,
    namespace: String,
    object_name: String,
    reason: Reason,
    message: String,
    at: Time,
}

enum Message {
    Event(Box<Pending>),
    Flush(oneshot::Sender<()>),
}

/// Records Events from a background task, so a report never waits for (or
/// spends the time of) the step it reports on, as client-go's recorder does.
/// Events are sent in the order they were recorded.
pub struct EventRecorder {
    queue: mpsc::Sender<Message>,
}

impl EventRecorder {
    /// Starts the sender task on the current tokio runtime.
    pub fn new(client: Client, component: &str, host: &str) -> EventRecorder {
        let (queue, rx) = mpsc::channel(QUEUE);
        let sender = Sender {
            client,
            component: component.to_string(),
            host: host.to_string(),
            posted: HashMap::new(),
        };
        tokio::spawn(sender.run(rx));
        EventRecorder { queue }
    }

    /// Queues an event on `obj` (its type follows from its reason). Failures
    /// are logged, never returned: an event is a report, not a step of provisioning.
    pub fn record<K>(&self, obj: &K, reason: Reason, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.queue(None, obj, reason, message)
    }

    /// Like [`record`](Self::record), from another event source `component`
    /// (no host), for the events upstream records under another name.
    pub fn record_as<K>(&self, component: &str, obj: &K, reason: Reason, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.queue(Some(component), obj, reason, message)
    }

    fn queue<K>(&self, component: Option<&str>, obj: &K, reason: Reason, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let pending = Pending {
            component: component.map(String::from),
            involved: ObjectReference {
                api_version: Some(K::api_version(&()).to_string()),
                kind: Some(K::kind(&()).to_string()),
                name: Some(obj.name_any()),
                namespace: obj.namespace(),
                uid: obj.uid(),
                resource_version: obj.resource_version(),
                ..Default::default()
            },
            namespace: obj.namespace().unwrap_or_else(|| "default".to_string()),
            object_name: obj.name_any(),
            reason,
            message: message.to_string(),
            at: Time(Timestamp::now()),
        };
        if let Err(e) = self.queue.try_send(Message::Event(Box::new(pending))) {
            warn!(%reason, object = %obj.name_any(), error = %e, "event dropped");
        }
    }

    /// Waits (at most `limit`) until every event recorded so far was sent.
    pub async fn flush(&self, limit: Duration) {
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(limit, async {
            if self.queue.send(Message::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

struct Sender {
    client: Client,
    component: String,
    host: String,
    posted: HashMap<(String, Reason, String), Posted>,
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<Message>) {
        while let Some(message) = rx.recv().await {
            match message {
                Message::Event(p) => {
                    if let Err(e) = self.send(&p).await {
                        warn!(reason = %p.reason, error = %e, object = %p.object_name, "failed to record event");
                    }
                }
                Message::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn send(&mut self, p: &Pending) -> Result<(), kube::Error> {
        let uid = p.involved.uid.clone().unwrap_or_default();
        let key = (uid, p.reason, p.message.clone());
        let repeat = self
            .posted
            .get(&key)
            .filter(|posted| posted.at.elapsed() < AGGREGATE_FOR)
            .map(|posted| (posted.namespace.clone(), posted.name.clone(), posted.count));
        if let Some((namespace, name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let body = json!({"count": count + 1, "lastTimestamp": p.at});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    if let Some(posted) = self.posted.get_mut(&key) {
                        posted.count = count + 1;
                        posted.at = Instant::now();
                    }
                    return Ok(());
                }
                // The Event expired or was deleted: post a new one below.
                Err(e) if super::is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!("{}.{:x}", p.object_name, rand::random::<u64>());
        let component = p
            .component
            .clone()
            .unwrap_or_else(|| self.component.clone());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(p.namespace.clone()),
                ..Default::default()
            },
            involved_object: p.involved.clone(),
            reason: Some(p.reason.as_str().to_string()),
            message: Some(p.message.clone()),
            type_: Some(p.reason.event_type().as_str().to_string()),
            source: Some(EventSource {
                component: Some(component.clone()),
                host: Some(self.host.clone()).filter(|h| !h.is_empty() && p.component.is_none()),
            }),
            first_timestamp: Some(p.at.clone()),
            last_timestamp: Some(p.at.clone()),
            count: Some(1),
            reporting_component: Some(component),
            reporting_instance: Some(self.host.clone())
                .filter(|h| !h.is_empty() && p.component.is_none()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
        api.create(&PostParams::default(), &event).await?;
        if self.posted.len() >= MAX_REMEMBERED {
            self.posted.clear();
        }
        self.posted.insert(
            key,
            Posted {
                namespace: p.namespace.clone(),
                name,
                count: 1,
                at: Instant::now(),
            },
        );
        Ok(())
    }
}
