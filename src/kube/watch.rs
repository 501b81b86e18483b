//! The watches behind the caches, made as client-go 0.36's reflector makes
//! them. The first list streams in the watch itself (`sendInitialEvents`); a
//! relist after the watch was lost is never older than what the cache had
//! seen (`resourceVersionMatch=NotOlderThan` on the last resourceVersion), so a
//! cache cannot travel back in time to an API server that lags behind
//! (kubernetes#59848: kube-runtime relists at `resourceVersion=0`, which any
//! API server may answer from an older watch cache); a server that refuses a
//! streamed list gets a paged list with the same guarantee, from then on.
//!
//! Each event is applied to the cache's store here, and only then is the
//! resourceVersion it carries published as the cache's [`Progress`] — also
//! for bookmarks, which carry no object — so that "the cache has caught up
//! with resourceVersion X" means the store shows every change up to X.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::api::{Api, ListParams, ObjectList, VersionMatch, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, info};

/// The bookmark annotation that ends a streamed list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";
/// Objects per page of a (fallback) paged list.
const PAGE_SIZE: u32 = 500;
/// How long a watch request stays open before the server ends it: as
/// client-go's reflector picks it, 5 minutes times a random factor in
/// [1, 2), so that the watches of many clients (and ours of several kinds)
/// do not all end, and start again, at once.
const MIN_WATCH_TIMEOUT_SECS: u32 = 300;

fn watch_timeout() -> u32 {
    MIN_WATCH_TIMEOUT_SECS + rand::random_range(0..MIN_WATCH_TIMEOUT_SECS)
}

/// How far a cache's store has caught up with the API server: the
/// resourceVersion of the last event or bookmark it has taken, as a number
/// (etcd's revision). 0 until the first list is in, and for ever on a server
/// whose resourceVersions are not numbers (then nobody may rely on it).
#[derive(Clone, Debug)]
pub struct Progress(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for Progress {
    fn default() -> Progress {
        Progress(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Progress {
    /// The resourceVersion the store has reached.
    pub fn reached(&self) -> u64 {
        *self.0.borrow()
    }

    /// Whether the store reaches `version` within `timeout`.
    pub async fn wait_for(&self, version: u64, timeout: Duration) -> bool {
        let mut rx = self.0.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|at| *at >= version))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Marks the store as caught up with `version` (for stores a test fills).
    #[cfg(test)]
    pub fn reach(&self, version: u64) {
        self.publish(&version.to_string());
    }

    fn publish(&self, version: &str) {
        if let Ok(v) = version.parse::<u64>() {
            self.0.send_if_modified(|at| {
                let newer = v > *at;
                if newer {
                    *at = v;
                }
                newer
            });
        }
    }
}

/// Where a watch lists and watches its objects: whole objects (an [`Api`]),
/// or only their metadata ([`Metadata`]), which the API server then sends
/// alone.
pub trait Source: Send + Sync + 'static {
    type Object: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static;

    fn list(
        &self,
        params: &ListParams,
    ) -> impl Future<Output = kube::Result<ObjectList<Self::Object>>> + Send;

    fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> impl Future<Output = kube::Result<Events<Self::Object>>> + Send;
}

impl<K> Source for Api<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    type Object = K;

    async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<K>> {
        Api::list(self, params).await
    }

    async fn watch(&self, params: &WatchParams, version: &str) -> kube::Result<Events<K>> {
        Ok(Api::watch(self, params, version).await?.boxed())
    }
}

/// The objects of an [`Api`] as their metadata alone (`PartialObjectMeta`).
pub struct Metadata<K>(pub Api<K>);

impl<K> Source for Metadata<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    type Object = PartialObjectMeta<K>;

    async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<Self::Object>> {
        self.0.list_metadata(params).await
    }

    async fn watch(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> kube::Result<Events<Self::Object>> {
        Ok(self.0.watch_metadata(params, version).await?.boxed())
    }
}

/// A cache kept by a watch: every object that passes `keep` (trimmed by
/// `trim`) in `writer`'s store, an object that stops passing removed, and the
/// events the store took, for the controller, after it took them.
pub fn cache<S, T>(
    source: S,
    mut writer: Writer<S::Object>,
    trim: T,
    keep: fn(&S::Object) -> bool,
    progress: Progress,
) -> impl Stream<Item = Result<watcher::Event<S::Object>, watcher::Error>> + Send + 'static
where
    S: Source,
    S::Object: Resource<DynamicType = ()> + Sync,
    T: Fn(&mut S::Object) + Send + 'static,
{
    let kind = S::Object::plural(&()).into_owned();
    stream(source, kind)
        .default_backoff()
        .filter_map(move |seen| {
            let out = match seen {
                Err(e) => Some(Err(e)),
                Ok(Seen::Reached(version)) => {
                    progress.publish(&version);
                    None
                }
                Ok(Seen::Event(event, version)) => {
                    let event = kept(event.modify(&trim), keep);
                    if let Some(event) = &event {
                        writer.apply_watcher_event(event);
                    }
                    // The store shows the change before anyone hears of it.
                    if let Some(version) = version {
                        progress.publish(&version);
                    }
                    event.map(Ok)
                }
            };
            futures::future::ready(out)
        })
}

/// A watch event as the cache takes it when only objects that pass `keep` are
/// cached: a listed object that does not is not listed, and a change that
/// makes one not pass is a deletion, so no copy of it stays behind.
pub fn kept<K>(event: watcher::Event<K>, keep: fn(&K) -> bool) -> Option<watcher::Event<K>> {
    match event {
        watcher::Event::InitApply(obj) if !keep(&obj) => None,
        watcher::Event::Apply(obj) if !keep(&obj) => Some(watcher::Event::Delete(obj)),
        event => Some(event),
    }
}

/// What the watch saw: an event (with the resourceVersion the watch reached
/// by it, when it moved the watch on), or a bookmark's resourceVersion.
#[derive(Debug)]
pub enum Seen<K> {
    Event(watcher::Event<K>, Option<String>),
    Reached(String),
}

/// A watch's events, as the API server sends them.
pub type Events<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

enum State<K> {
    /// A (re)list is due: streamed if the server allows it, else paged.
    List,
    /// The streamed list, until its end bookmark.
    Streaming(Events<K>),
    /// The paged list: objects of the page not yet given out, the next page.
    Paging {
        items: VecDeque<K>,
        next: Option<String>,
        version: Option<String>,
    },
    /// A watch is due from the last resourceVersion.
    Resume,
    Watching(Events<K>),
}

struct Watch<S: Source> {
    source: S,
    /// What is watched (the plural), for the log.
    kind: String,
    /// Why the next list or watch request is made, for the log line that
    /// says it is made (every (re)start of a watch says why).
    cause: std::borrow::Cow<'static, str>,
    state: State<S::Object>,
    /// The last resourceVersion the watch reached; `None` before any list.
    version: Option<String>,
    /// The server streams lists (until it refuses one).
    streams: bool,
}

/// The watch of every object of `source`, as [`Seen`] items; errors are
/// returned for a backoff to space the retries (the state carries on).
pub fn stream<S: Source>(
    source: S,
    kind: String,
) -> impl Stream<Item = Result<Seen<S::Object>, watcher::Error>> + Send {
    let watch = Watch {
        source,
        kind,
        cause: "start".into(),
        state: State::List,
        version: None,
        streams: true,
    };
    futures::stream::unfold(watch, |mut w| async move {
        loop {
            if let Some(item) = w.step().await {
                return Some((item, w));
            }
        }
    })
}

impl<S: Source> Watch<S> {
    /// One step; `None`: nothing to give out yet, step again.
    async fn step(&mut self) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        match std::mem::replace(&mut self.state, State::List) {
            State::List if self.streams => self.start_streaming().await,
            State::List => {
                self.state = State::Paging {
                    items: VecDeque::new(),
                    next: None,
                    version: None,
                };
                Some(Ok(Seen::Event(watcher::Event::Init, None)))
            }
            State::Streaming(events) => self.streamed(events).await,
            State::Paging {
                items,
                next,
                version,
            } => self.page(items, next, version).await,
            State::Resume => self.resume().await,
            State::Watching(events) => self.watched(events).await,
        }
    }

    /// A streamed list, not older than what was seen (or a consistent one).
    async fn start_streaming(&mut self) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        let params = WatchParams {
            bookmarks: true,
            send_initial_events: true,
            timeout: Some(watch_timeout()),
            ..Default::default()
        };
        let from = self.version.clone().unwrap_or_default();
        self.log_start("streamed list", &from);
        match self.source.watch(&params, &from).await {
            Ok(events) => {
                self.state = State::Streaming(events);
                Some(Ok(Seen::Event(watcher::Event::Init, None)))
            }
            Err(e) if refuses_streaming(&e) => {
                info!(error = %e, "the API server does not stream lists: listing in pages");
                self.streams = false;
                self.cause = "the API server does not stream lists".into();
                None
            }
            Err(e) => {
                self.cause = format!("the last start failed: {e}").into();
                Some(Err(watcher::Error::WatchStartFailed(e)))
            }
        }
    }

    /// Every list or watch request that (re)starts the watch says so, and why.
    fn log_start(&self, what: &str, from: &str) {
        info!(resource = %self.kind, cause = %self.cause, from, "watch: {what}");
    }

    async fn streamed(
        &mut self,
        mut events: Events<S::Object>,
    ) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        match events.next().await {
            Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                self.state = State::Streaming(events);
                Some(Ok(Seen::Event(watcher::Event::InitApply(obj), None)))
            }
            Some(Ok(WatchEvent::Bookmark(bm)))
                if bm.metadata.annotations.contains_key(INITIAL_EVENTS_END) =>
            {
                let version = bm.metadata.resource_version;
                self.version = Some(version.clone());
                self.state = State::Watching(events);
                Some(Ok(Seen::Event(watcher::Event::InitDone, Some(version))))
            }
            Some(Ok(WatchEvent::Bookmark(_) | WatchEvent::Deleted(_))) => {
                self.state = State::Streaming(events);
                None
            }
            Some(Ok(WatchEvent::Error(e))) => {
                self.cause = format!("the streamed list failed: {}", e.message).into();
                Some(Err(watcher::Error::WatchError(e.boxed())))
            }
            Some(Err(e)) => {
                self.cause = format!("the streamed list failed: {e}").into();
                Some(Err(watcher::Error::WatchFailed(e)))
            }
            // Ended before the list did: a server that ignores the request
            // (older than streamed lists) never sends the end; list in pages.
            None => {
                info!("the API server ended a streamed list early: listing in pages");
                self.streams = false;
                self.cause = "the API server ended a streamed list early".into();
                None
            }
        }
    }

    async fn page(
        &mut self,
        mut items: VecDeque<S::Object>,
        next: Option<String>,
        version: Option<String>,
    ) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        if let Some(obj) = items.pop_front() {
            self.state = State::Paging {
                items,
                next,
                version,
            };
            return Some(Ok(Seen::Event(watcher::Event::InitApply(obj), None)));
        }
        if let (None, Some(version)) = (&next, &version) {
            self.version = Some(version.clone());
            self.state = State::Resume;
            return Some(Ok(Seen::Event(
                watcher::Event::InitDone,
                Some(version.clone()),
            )));
        }
        if next.is_none() {
            self.log_start("paged list", self.version.as_deref().unwrap_or_default());
        }
        let params = list_params(self.version.as_deref(), next);
        match self.source.list(&params).await {
            Ok(list) => {
                let next = list.metadata.continue_.filter(|c| !c.is_empty());
                let version = list.metadata.resource_version.filter(|v| !v.is_empty());
                if next.is_none() && version.is_none() {
                    return Some(Err(watcher::Error::NoResourceVersion));
                }
                self.state = State::Paging {
                    items: list.items.into(),
                    next,
                    version,
                };
                None
            }
            Err(e) => {
                self.cause = format!("the last list failed: {e}").into();
                Some(Err(watcher::Error::InitialListFailed(e)))
            }
        }
    }

    async fn resume(&mut self) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        let params = WatchParams {
            bookmarks: true,
            timeout: Some(watch_timeout()),
            ..Default::default()
        };
        let from = self.version.clone().unwrap_or_default();
        self.log_start("watch", &from);
        match self.source.watch(&params, &from).await {
            Ok(events) => {
                self.state = State::Watching(events);
                None
            }
            Err(e) => {
                self.state = State::Resume;
                self.cause = format!("the last start failed: {e}").into();
                Some(Err(watcher::Error::WatchStartFailed(e)))
            }
        }
    }

    async fn watched(
        &mut self,
        mut events: Events<S::Object>,
    ) -> Option<Result<Seen<S::Object>, watcher::Error>> {
        let item = events.next().await;
        self.state = State::Watching(events);
        let (event, version) = match item {
            Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                let v = obj.resource_version();
                (watcher::Event::Apply(obj), v)
            }
            Some(Ok(WatchEvent::Deleted(obj))) => {
                let v = obj.resource_version();
                (watcher::Event::Delete(obj), v)
            }
            Some(Ok(WatchEvent::Bookmark(bm))) => {
                let version = bm.metadata.resource_version;
                self.version = Some(version.clone());
                return Some(Ok(Seen::Reached(version)));
            }
            Some(Ok(WatchEvent::Error(e))) => {
                // 410 Gone: the watch fell too far behind; list again, not
                // older than what was seen.
                if e.code == 410 {
                    debug!(error = %e.message, "watch expired: listing again");
                    self.state = State::List;
                    self.cause = "the watch expired (410 Gone)".into();
                } else {
                    self.cause = format!("the API server sent an error: {}", e.message).into();
                }
                return Some(Err(watcher::Error::WatchError(e.boxed())));
            }
            // A broken stream is not read again: the watch resumes from
            // what it reached, after the backoff.
            Some(Err(e)) => {
                self.state = State::Resume;
                self.cause = format!("the watch failed: {e}").into();
                return Some(Err(watcher::Error::WatchFailed(e)));
            }
            None => {
                self.state = State::Resume;
                self.cause = "the API server ended the watch (its timeout)".into();
                return None;
            }
        };
        if let Some(v) = &version {
            self.version = Some(v.clone());
        }
        Some(Ok(Seen::Event(event, version)))
    }
}

/// A page of a list: the first not older than `seen` (consistent when
/// nothing was seen yet), the next ones by their continue token.
fn list_params(seen: Option<&str>, next: Option<String>) -> ListParams {
    let first = next.is_none();
    ListParams {
        limit: Some(PAGE_SIZE),
        continue_token: next,
        resource_version: seen.filter(|_| first).map(String::from),
        version_match: seen.filter(|_| first).map(|_| VersionMatch::NotOlderThan),
        ..Default::default()
    }
}

/// Whether the server said no to `sendInitialEvents` itself (a server
/// without streamed lists validates the parameter away), as opposed to a
/// failure any watch may meet.
fn refuses_streaming(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status)
        if (status.code == 400 || status.code == 422)
            && status.message.contains("sendInitialEvents"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use hyper::body::Bytes;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use serde_json::{Value, json};
    use std::sync::Mutex;

    /// A scripted API server: each request (its path and query) is recorded
    /// and answered with the next reply (status, body); a watch body is its
    /// events, one JSON object a line.
    #[derive(Default)]
    struct Server {
        replies: VecDeque<(u16, String)>,
        seen: Vec<String>,
        /// The `Accept` header of each request.
        accepts: Vec<String>,
    }

    fn client(server: Arc<Mutex<Server>>) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let server = server.clone();
            async move {
                let _ = req.body();
                let uri = req.uri().to_string();
                let accept = req
                    .headers()
                    .get("accept")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let _ = req.into_body().collect().await?;
                let (code, body) = {
                    let mut s = server.lock().unwrap();
                    s.seen.push(uri);
                    s.accepts.push(accept);
                    s.replies
                        .pop_front()
                        .unwrap_or((500, status(500, "no more replies")))
                };
                Ok::<_, tower::BoxError>(
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(Bytes::from(body)))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    fn status(code: u16, message: &str) -> String {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": message, "reason": "Invalid", "code": code})
        .to_string()
    }

    fn map(name: &str, rv: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}})
    }

    fn events(events: &[(&str, Value)]) -> String {
        events
            .iter()
            .map(|(kind, object)| json!({"type": kind, "object": object}).to_string() + "\n")
            .collect()
    }

    fn bookmark(rv: &str, end: bool) -> Value {
        let annotations = if end {
            json!({INITIAL_EVENTS_END: "true"})
        } else {
            json!({})
        };
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"resourceVersion": rv, "annotations": annotations}})
    }

    fn list(items: &[Value], rv: &str) -> String {
        json!({"apiVersion": "v1", "kind": "ConfigMapList",
               "metadata": {"resourceVersion": rv}, "items": items})
        .to_string()
    }

    /// Runs a cache over `replies` until `n` events reached the controller;
    /// returns the store's names, the progress and the requests made.
    async fn run(replies: Vec<(u16, String)>, n: usize) -> (Vec<String>, u64, Vec<String>) {
        let server = Arc::new(Mutex::new(Server {
            replies: replies.into(),
            ..Default::default()
        }));
        let api: Api<ConfigMap> = Api::all(client(server.clone()));
        let (store, writer) = reflector::store();
        let progress = Progress::default();
        let events: Vec<_> = cache(api, writer, |_| {}, |_| true, progress.clone())
            .filter_map(|e| futures::future::ready(e.ok()))
            .take(n)
            .collect()
            .await;
        assert_eq!(events.len(), n);
        let mut names: Vec<String> = store.state().iter().map(|c| c.name_any()).collect();
        names.sort();
        let seen = server.lock().unwrap().seen.clone();
        (names, progress.reached(), seen)
    }

    #[tokio::test]
    async fn the_first_list_streams_in_the_watch_and_progress_follows_the_store() {
        let (names, reached, seen) = run(
            vec![(
                200,
                events(&[
                    ("ADDED", map("a", "5")),
                    ("ADDED", map("b", "7")),
                    ("BOOKMARK", bookmark("9", true)),
                    ("MODIFIED", map("a", "12")),
                    ("BOOKMARK", bookmark("15", false)),
                ]),
            )],
            // Init, InitApply a, InitApply b, InitDone, Apply a.
            5,
        )
        .await;
        assert_eq!(names, ["a", "b"]);
        assert!(seen[0].contains("sendInitialEvents=true"), "{seen:?}");
        assert!(seen[0].contains("resourceVersionMatch=NotOlderThan"));
        assert!(seen[0].contains("resourceVersion=&") || seen[0].ends_with("resourceVersion="));
        // The bookmark after the last event moved the cache on too.
        assert!(reached >= 12, "{reached}");
    }

    #[tokio::test]
    async fn a_server_that_refuses_streamed_lists_is_listed_in_pages() {
        let (names, reached, seen) = run(
            vec![
                (
                    422,
                    status(422, "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
                ),
                (200, list(&[map("a", "3")], "20")),
                (200, events(&[("ADDED", map("c", "21"))])),
            ],
            // Init, InitApply a, InitDone, Apply c.
            4,
        )
        .await;
        assert_eq!(names, ["a", "c"]);
        assert_eq!(reached, 21);
        // The list is a consistent read: no resourceVersion=0.
        assert!(
            !seen[1].contains("watch=true") && !seen[1].contains("resourceVersion=0"),
            "{seen:?}"
        );
        assert!(seen[2].contains("watch=true") && seen[2].contains("resourceVersion=20"));
    }

    #[tokio::test]
    async fn a_relist_after_the_watch_expired_is_not_older_than_what_was_seen() {
        let expired = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "message": "too old resource version", "reason": "Expired", "code": 410});
        let (names, _, seen) = run(
            vec![
                (
                    200,
                    events(&[
                        ("ADDED", map("a", "5")),
                        ("BOOKMARK", bookmark("30", true)),
                        ("ERROR", expired),
                    ]),
                ),
                (
                    200,
                    events(&[
                        ("ADDED", map("b", "40")),
                        ("BOOKMARK", bookmark("41", true)),
                    ]),
                ),
            ],
            // Init, InitApply a, InitDone, (error), Init, InitApply b, InitDone.
            6,
        )
        .await;
        assert_eq!(names, ["b"], "the relist replaced the store");
        assert!(
            seen[1].contains("sendInitialEvents=true") && seen[1].contains("resourceVersion=30"),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_metadata_source_asks_for_metadata_alone_and_is_trimmed_by_any_function() {
        let meta = |name: &str, rv: &str| {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                                "labels": {"keep": "1", "drop": "2"}}})
        };
        let server = Arc::new(Mutex::new(Server {
            replies: vec![(
                200,
                events(&[("ADDED", meta("a", "5")), ("BOOKMARK", bookmark("6", true))]),
            )]
            .into(),
            ..Default::default()
        }));
        let api: Api<ConfigMap> = Api::all(client(server.clone()));
        let (store, writer) = reflector::store();
        let kept = String::from("keep");
        let trim = move |m: &mut PartialObjectMeta<ConfigMap>| {
            if let Some(labels) = m.metadata.labels.as_mut() {
                labels.retain(|k, _| *k == kept);
            }
        };
        let events: Vec<_> = cache(Metadata(api), writer, trim, |_| true, Progress::default())
            .filter_map(|e| futures::future::ready(e.ok()))
            .take(3)
            .collect()
            .await;
        assert_eq!(events.len(), 3, "Init, InitApply a, InitDone");
        let held = store.state();
        assert_eq!(held.len(), 1);
        assert_eq!(
            held[0]
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["keep"]
        );
        let accepts = server.lock().unwrap().accepts.clone();
        assert!(
            accepts[0].contains("as=PartialObjectMetadata"),
            "the server is asked for metadata alone: {accepts:?}"
        );
    }

    #[test]
    fn a_paged_relist_asks_for_no_older_than_what_was_seen() {
        let first = list_params(Some("30"), None);
        assert_eq!(first.resource_version.as_deref(), Some("30"));
        assert_eq!(first.version_match, Some(VersionMatch::NotOlderThan));
        let next = list_params(Some("30"), Some("token".into()));
        assert_eq!(
            next.resource_version, None,
            "pages after the first follow the token"
        );
        let fresh = list_params(None, None);
        assert_eq!(
            fresh.resource_version, None,
            "nothing seen yet: a consistent read"
        );
    }
}
