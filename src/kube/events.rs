//! Core/v1 Events, as upstream's client-go recorder writes them (the group
//! upstream's RBAC grants), with the same aggregation idea: a repeat of the
//! same reason and message on the same object bumps `count` on the existing
//! Event instead of creating another. Messages never contain secret data:
//! callers pass error texts built from names, never from secret values.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// How long a posted Event is reused for repeats.
const AGGREGATE_FOR: Duration = Duration::from_secs(600);
/// Bound on remembered Events (the map is cleared when it fills).
const MAX_REMEMBERED: usize = 4096;

struct Posted {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

pub struct EventRecorder {
    client: Client,
    component: String,
    host: String,
    posted: Mutex<HashMap<(String, String, String), Posted>>,
}

impl EventRecorder {
    pub fn new(client: Client, component: &str, host: &str) -> EventRecorder {
        EventRecorder {
            client,
            component: component.to_string(),
            host: host.to_string(),
            posted: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event on `obj`. Failures are logged, never returned: an
    /// event is a report, not a step of provisioning.
    pub async fn record<K>(&self, obj: &K, kind: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        if let Err(e) = self.try_record(obj, kind, reason, message).await {
            warn!(reason, error = %e, object = %obj.name_any(), "failed to record event");
        }
    }

    async fn try_record<K>(
        &self,
        obj: &K,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error>
    where
        K: Resource<DynamicType = ()>,
    {
        let uid = obj.uid().unwrap_or_default();
        let key = (uid.clone(), reason.to_string(), message.to_string());
        let now = Time(Timestamp::now());
        let repeat = {
            let posted = self.posted.lock().expect("event map poisoned");
            posted
                .get(&key)
                .filter(|p| p.at.elapsed() < AGGREGATE_FOR)
                .map(|p| (p.namespace.clone(), p.name.clone(), p.count))
        };
        if let Some((namespace, name, count)) = repeat {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let body = json!({"count": count + 1, "lastTimestamp": now});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    let mut posted = self.posted.lock().expect("event map poisoned");
                    if let Some(p) = posted.get_mut(&key) {
                        p.count = count + 1;
                        p.at = Instant::now();
                    }
                    return Ok(());
                }
                // The Event expired or was deleted: post a new one below.
                Err(e) if super::is_status(&e, 404) => {}
                Err(e) => return Err(e),
            }
        }
        let namespace = obj.namespace().unwrap_or_else(|| "default".to_string());
        let name = format!("{}.{:x}", obj.name_any(), rand::random::<u64>());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some(K::api_version(&()).to_string()),
                kind: Some(K::kind(&()).to_string()),
                name: Some(obj.name_any()),
                namespace: obj.namespace(),
                uid: obj.uid(),
                resource_version: obj.resource_version(),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(kind.as_str().to_string()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        let mut posted = self.posted.lock().expect("event map poisoned");
        if posted.len() >= MAX_REMEMBERED {
            posted.clear();
        }
        posted.insert(
            key,
            Posted {
                namespace,
                name,
                count: 1,
                at: Instant::now(),
            },
        );
        Ok(())
    }
}
