//! The in-process bench both controllers' sequences are tested on: the API
//! server is a script (each expected request and its answer: an object, a
//! failure status, or an answer that never arrives), the CSI driver is the
//! real test driver on a unix socket. The bench builds the part every
//! controller shares; the claim path's rig (`claim/tests/`) and the volume
//! path's (`volume/tests/`) each add their own context to it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use csi_test_driver::Args as DriverArgs;
use csi_test_driver::control::Client as DriverControl;
use http_body_util::BodyExt;
use hyper::body::Bytes;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::Store;
use serde_json::{Value, json};

use super::Shared;
use super::node::Placement;
use crate::csi::{CsiClient, DriverCapabilities};
use crate::kube::{EventRecorder, LeaderGate};
use crate::metrics::Metrics;
use crate::provision::DriverInfo;

/// The test driver's name, as both paths' fixtures name it.
pub const DRIVER: &str = "d";

/// An answer of the scripted API server.
#[derive(Clone)]
pub enum Reply {
    /// 200/201 with this object.
    Object(Value),
    /// A failure status: 404, 409, 422, 500.
    Status(u16),
    /// No answer reaches the client: a timeout, or a lost response (the
    /// request may have been applied; the row's next step says whether).
    Lost,
}

/// One expected request (`"PUT persistentvolumeclaims/data"`) and its answer.
pub type Step = (&'static str, Reply);

#[derive(Default)]
pub struct Script {
    pub steps: VecDeque<Step>,
    /// Every request other than events, as `METHOD resource[/name]`.
    pub seen: Vec<String>,
    /// Bodies of the requests in `seen`.
    pub bodies: Vec<Value>,
    /// Query strings of the requests in `seen`.
    pub queries: Vec<String>,
    /// Events sent: (reason, message).
    pub events: Vec<(String, String)>,
    /// Requests the script did not expect.
    pub unexpected: Vec<String>,
}

/// `/api/v1/namespaces/ns/persistentvolumeclaims/data` → `persistentvolumeclaims/data`.
pub fn resource_of(path: &str) -> String {
    let rest = path
        .split_once("/v1/")
        .map(|(_, r)| r)
        .unwrap_or(path)
        .split('?')
        .next()
        .unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').collect();
    let parts = if parts.first() == Some(&"namespaces") && parts.len() > 2 {
        &parts[2..]
    } else {
        &parts[..]
    };
    parts.join("/")
}

/// What the script answers `key` (events are answered and recorded apart).
fn next_reply(script: &Mutex<Script>, key: String, query: String, body: Value) -> Reply {
    let mut s = script.lock().unwrap();
    if key
        .split(' ')
        .nth(1)
        .is_some_and(|r| r.starts_with("events"))
    {
        s.events.push((
            body["reason"].as_str().unwrap_or_default().to_string(),
            body["message"].as_str().unwrap_or_default().to_string(),
        ));
        return Reply::Object(body);
    }
    s.seen.push(key.clone());
    s.bodies.push(body);
    s.queries.push(query);
    match s.steps.pop_front() {
        Some((want, reply)) if want == key => reply,
        _ => {
            s.unexpected.push(key);
            Reply::Status(500)
        }
    }
}

/// A client whose API server is `script`.
pub fn api(script: Arc<Mutex<Script>>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let script = script.clone();
        async move {
            let key = format!("{} {}", req.method(), resource_of(req.uri().path()));
            let query = req.uri().query().unwrap_or_default().to_string();
            let body = req.into_body().collect().await?.to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (code, out) = match next_reply(&script, key, query, body) {
                Reply::Object(v) => (200, v),
                Reply::Status(code) => (
                    code,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": format!("scripted {code}"), "reason": "Scripted", "code": code}),
                ),
                Reply::Lost => {
                    return Err::<http::Response<http_body_util::Full<Bytes>>, tower::BoxError>(
                        "connection reset by peer".into(),
                    );
                }
            };
            Ok(http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(Bytes::from(out.to_string())))
                .unwrap())
        }
    });
    kube::Client::new(service, "default")
}

/// The script, the real test driver and a client of each: what a rig adds
/// its context to.
pub struct Bench {
    pub script: Arc<Mutex<Script>>,
    pub client: kube::Client,
    pub driver: DriverControl,
    pub csi: CsiClient,
    pub metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

impl Bench {
    pub async fn start(steps: Vec<Step>) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let control = dir.path().join("control.sock");
        let args = DriverArgs::parse_from([
            "csi-test-driver".to_string(),
            format!("--endpoint=unix://{}", socket.display()),
            format!("--control={}", control.display()),
            format!("--state-dir={}", dir.path().join("state").display()),
            format!("--drivername={DRIVER}"),
            "--capabilities=+CLONE_VOLUME,+CREATE_DELETE_SNAPSHOT".to_string(),
        ]);
        tokio::spawn(async move { csi_test_driver::run(args).await.map_err(|e| e.to_string()) });
        let driver = DriverControl::connect_with_timeout(&control, Duration::from_secs(10))
            .await
            .unwrap();
        let metrics = Arc::new(Metrics::unregistered());
        let csi = CsiClient::connect(
            &socket,
            Duration::from_secs(5),
            Duration::from_secs(5),
            metrics.clone(),
        )
        .await
        .unwrap();
        let script = Arc::new(Mutex::new(Script {
            steps: steps.into(),
            ..Default::default()
        }));
        Bench {
            client: api(script.clone()),
            script,
            driver,
            csi,
            metrics,
            _dir: dir,
        }
    }

    /// The shared part of a context on this bench: a central replica,
    /// always the leader, no capacity tracking, the class cache `classes`.
    pub fn shared(&self, caps: DriverCapabilities, classes: Store<StorageClass>) -> Shared {
        Shared {
            client: self.client.clone(),
            csi: self.csi.clone(),
            driver: DriverInfo {
                name: DRIVER.into(),
                identity: "id".into(),
                capabilities: caps,
            },
            place: Placement::Central,
            recorder: EventRecorder::new(
                self.client.clone(),
                "test",
                "",
                Default::default(),
                self.metrics.events_dropped.clone(),
            ),
            metrics: self.metrics.clone(),
            leader: LeaderGate::always(),
            classes,
            capacity: None,
        }
    }

    pub fn then(&self, steps: Vec<Step>) {
        self.script.lock().unwrap().steps.extend(steps);
    }

    pub fn seen(&self) -> Vec<String> {
        self.script.lock().unwrap().seen.clone()
    }

    pub fn query(&self, i: usize) -> String {
        self.script.lock().unwrap().queries[i].clone()
    }

    pub fn body(&self, i: usize) -> Value {
        self.script.lock().unwrap().bodies[i].clone()
    }

    fn events(&self) -> Vec<(String, String)> {
        self.script.lock().unwrap().events.clone()
    }

    pub fn reasons(&self) -> Vec<String> {
        self.events().into_iter().map(|e| e.0).collect()
    }

    pub fn messages(&self) -> Vec<String> {
        self.events().into_iter().map(|e| e.1).collect()
    }

    /// Every step asked for, and nothing else.
    pub fn assert_script_done(&self) {
        let s = self.script.lock().unwrap();
        assert!(
            s.unexpected.is_empty(),
            "unexpected requests {:?} (seen {:?})",
            s.unexpected,
            s.seen
        );
        assert!(
            s.steps.is_empty(),
            "requests never made: {:?}",
            s.steps.iter().map(|s| s.0).collect::<Vec<_>>()
        );
    }

    /// Volumes the driver holds, and its CreateVolume/DeleteVolume call counts.
    pub async fn backend(&self) -> (usize, u64, u64) {
        let l = self.driver.ledger().await.unwrap();
        (
            l.volumes.len(),
            l.calls.get("CreateVolume").copied().unwrap_or(0),
            l.calls.get("DeleteVolume").copied().unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn resources_are_named_without_their_namespace() {
        assert_eq!(
            resource_of("/api/v1/namespaces/a/persistentvolumeclaims/x"),
            "persistentvolumeclaims/x"
        );
        assert_eq!(
            resource_of("/api/v1/persistentvolumes?fieldManager=x"),
            "persistentvolumes"
        );
        assert_eq!(
            resource_of("/apis/storage.k8s.io/v1/csinodes/n1"),
            "csinodes/n1"
        );
    }
}
