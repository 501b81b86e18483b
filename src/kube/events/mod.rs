//! Core/v1 Events, as upstream's client-go recorder writes them (the group
//! upstream's RBAC grants), after the same correlation ([`correlate`]): similar
//! messages combined, repeats counted on one Event, and at most 25 events per
//! object, source and type at once, then one per 5 minutes. Messages never contain
//! secret data: callers pass error texts built from names, never from secret
//! values.

mod correlate;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use self::correlate::{Correlator, Subject, Verdict};
use crate::names::Reason;

/// Events waiting to be sent; beyond this, new ones are dropped (with a log
/// line), as client-go's broadcaster drops when its queue is full.
const QUEUE: usize = 1000;

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
            correlator: Correlator::default(),
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
    correlator: Correlator,
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
        let component = p.component.as_deref().unwrap_or(&self.component);
        // Events from another component are sent without a host (see `record_as`).
        let host = Some(self.host.as_str()).filter(|h| !h.is_empty() && p.component.is_none());
        let subject = Subject {
            component: component.to_string(),
            host: host.unwrap_or_default().to_string(),
            api_version: p.involved.api_version.clone().unwrap_or_default(),
            kind: p.involved.kind.clone().unwrap_or_default(),
            namespace: p.involved.namespace.clone().unwrap_or_default(),
            name: p.object_name.clone(),
            uid: p.involved.uid.clone().unwrap_or_default(),
        };
        let verdict = self
            .correlator
            .judge(&subject, p.reason, &p.message, Instant::now(), || {
                format!("{}.{:x}", p.object_name, rand::random::<u64>())
            });
        let Verdict::Send {
            name,
            message,
            count,
        } = verdict
        else {
            debug!(reason = %p.reason, object = %p.object_name, "event not sent: over the object's event budget");
            return Ok(());
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
        if count > 1 {
            let body = json!({"count": count, "lastTimestamp": p.at, "message": message});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => return Ok(()),
                // The Event expired or was deleted: post it again below.
                Err(e) if super::is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(p.namespace.clone()),
                ..Default::default()
            },
            involved_object: p.involved.clone(),
            reason: Some(p.reason.as_str().to_string()),
            message: Some(message),
            type_: Some(p.reason.event_type().as_str().to_string()),
            source: Some(EventSource {
                component: Some(component.to_string()),
                host: host.map(String::from),
            }),
            first_timestamp: Some(p.at.clone()),
            last_timestamp: Some(p.at.clone()),
            count: Some(count),
            reporting_component: Some(component.to_string()),
            reporting_instance: host.map(String::from),
            ..Default::default()
        };
        api.create(&PostParams::default(), &event).await?;
        Ok(())
    }
}
