//! Core/v1 Events, as upstream's client-go recorder writes them (the group
//! upstream's RBAC grants), after the same correlation ([`correlate`]): similar
//! messages combined, repeats counted on one Event, and at most 25 events per
//! object, source and type at once, then one per 5 minutes. Messages never contain
//! secret data: callers pass error texts built from names, never from secret
//! values.
//!
//! An event waits until the work lane is idle (no provisioning or deletion
//! request in flight or waiting for a token: `super::activity`), at most
//! [`DEFER_LIMIT`] after it was recorded, so that reports never compete with
//! a burst for the API server. Every event not sent is counted
//! (`csi_provisioner_events_dropped_total`), where client-go drops silently.

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

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use self::correlate::{Correlator, Subject, Verdict};
use super::activity::Activity;
use crate::metrics::DroppedLabels;
use crate::names::Reason;

/// Events waiting to be sent; beyond this, new ones are dropped (counted, with
/// a log line), as client-go's broadcaster drops when its queue (1,000) is
/// full. Larger than client-go's: events now wait for an idle moment, and a
/// burst of 2,000 claims records 4,000.
const QUEUE: usize = 4096;

/// The longest an event waits for the work lane to be idle.
pub const DEFER_LIMIT: Duration = Duration::from_secs(10);

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
    /// When it was recorded (for how long it may wait for an idle lane).
    recorded: tokio::time::Instant,
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
    dropped: Family<DroppedLabels, Counter>,
}

impl EventRecorder {
    /// Starts the sender task on the current tokio runtime: it sends when
    /// `work` is idle, and counts what it does not send in `dropped`.
    pub fn new(
        client: Client,
        component: &str,
        host: &str,
        work: Activity,
        dropped: Family<DroppedLabels, Counter>,
    ) -> EventRecorder {
        let (queue, rx) = mpsc::channel(QUEUE);
        let sender = Sender {
            client,
            component: component.to_string(),
            host: host.to_string(),
            correlator: Correlator::default(),
            work,
            dropped: dropped.clone(),
        };
        tokio::spawn(sender.run(rx));
        EventRecorder { queue, dropped }
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
            recorded: tokio::time::Instant::now(),
        };
        if let Err(e) = self.queue.try_send(Message::Event(Box::new(pending))) {
            dropped(&self.dropped, "queue_full");
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

/// Counts one event not sent, and why.
fn dropped(counter: &Family<DroppedLabels, Counter>, why: &str) {
    counter
        .get_or_create(&DroppedLabels { why: why.into() })
        .inc();
}

struct Sender {
    client: Client,
    component: String,
    host: String,
    correlator: Correlator,
    work: Activity,
    dropped: Family<DroppedLabels, Counter>,
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<Message>) {
        while let Some(message) = rx.recv().await {
            match message {
                Message::Event(p) => {
                    let waited = p.recorded.elapsed();
                    self.work
                        .wait_idle(DEFER_LIMIT.saturating_sub(waited))
                        .await;
                    if let Err(e) = self.send(&p).await {
                        dropped(&self.dropped, "failed");
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
            dropped(&self.dropped, "over_budget");
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt;
    use hyper::body::Bytes;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::kube::throttle::{Lane, SharedBucket};

    /// An API server that records each request's method and path and echoes its body.
    fn client(seen: Arc<Mutex<Vec<String>>>) -> Client {
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(format!("{} {}", req.method(), req.uri().path()));
                let body = req.into_body().collect().await?.to_bytes();
                Ok::<_, tower::BoxError>(http::Response::new(http_body_util::Full::new(
                    Bytes::from(body.to_vec()),
                )))
            }
        });
        Client::new(svc, "default")
    }

    fn object() -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_waits_for_the_work_lane_to_be_idle_but_not_for_ever() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let bucket = SharedBucket::new(1.0, 1);
        let work = Activity::new(Some(bucket.clone()));
        let dropped = Family::default();
        let recorder = EventRecorder::new(client(seen.clone()), "test", "", work, dropped);
        // Work waits for a token for as long as the test says.
        let _ = bucket.take_for_test(Lane::Work);
        let _ = bucket.take_for_test(Lane::Work);
        recorder.record(&object(), Reason::Provisioning, "busy");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(seen.lock().unwrap().is_empty(), "not while work waits");
        tokio::time::sleep(DEFER_LIMIT).await;
        assert_eq!(seen.lock().unwrap().len(), 1, "sent once its wait ran out");
        // Idle: at once.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = bucket.take_for_test(Lane::Work);
        assert!(!bucket.work_is_waiting());
        recorder.record(&object(), Reason::ProvisioningFailed, "idle");
        recorder.flush(Duration::from_millis(100)).await;
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn events_not_sent_are_counted() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let dropped: Family<DroppedLabels, Counter> = Family::default();
        let recorder = EventRecorder::new(
            client(seen.clone()),
            "test",
            "",
            Activity::default(),
            dropped.clone(),
        );
        for i in 0..30 {
            recorder.record(
                &object(),
                Reason::ProvisioningFailed,
                &format!("failed {i}"),
            );
        }
        recorder.flush(Duration::from_secs(1)).await;
        let over = dropped
            .get_or_create(&DroppedLabels {
                why: "over_budget".into(),
            })
            .get();
        assert!(over >= 5, "over client-go's 25 per object and type: {over}");
    }
}
