//! The HTTP side: accept plain HTTP/1.1 on loopback, apply the request faults, forward
//! everything else to kube-apiserver over TLS with the configured identity, and stream
//! the answer back (watch responses through the event filter).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tracing::{debug, warn};

use crate::ProxyBody;
use crate::hold::{Decision, HeldRequest, Holds, WriteRecord, is_write};
use crate::rules::{HoldAt, RequestInfo, Rule, RuleSet, Stats};

/// State shared by every connection and the control socket.
pub struct Shared {
    rules: Mutex<RuleSet>,
    /// Requests held by `hold` rules, and the journal of writes.
    pub(crate) holds: Holds,
    /// Open watch streams to cut now.
    pub(crate) cuts: broadcast::Sender<CutOrder>,
    /// Bytes of response bodies sent to clients (see [`Stats::bytes_sent`]).
    sent: AtomicU64,
    /// The API server requests go to (one of several, see [`Proxy::set_upstream`]).
    upstream: Mutex<kube::Client>,
}

impl Shared {
    pub(crate) fn rules(&self) -> MutexGuard<'_, RuleSet> {
        self.rules.lock().expect("rule set poisoned")
    }

    fn upstream(&self) -> kube::Client {
        self.upstream.lock().expect("upstream poisoned").clone()
    }

    /// The rules' counters with the bytes sent.
    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.rules().stats();
        stats.bytes_sent = self.sent.load(Ordering::Relaxed);
        stats
    }
}

/// An order to cut the open watch streams of some resources.
#[derive(Debug, Clone, Default)]
pub(crate) struct CutOrder {
    /// Empty: every stream.
    pub resources: Vec<String>,
    /// The resume point of each cut stream is expired: the client's watch from there is
    /// answered 410 Gone, so it lists again.
    pub expire: bool,
}

/// A client for the proxy's upstream side: no read timeout (watches stay open for minutes;
/// only the API server ends them) and no retries (the API server's own 429/503/504 go to
/// the client, which decides).
fn upstream_client(mut config: kube::Config) -> std::io::Result<kube::Client> {
    config.read_timeout = None;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(std::io::Error::other)
}

/// A running proxy. Dropping it stops accepting and closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

impl Proxy {
    /// Listens on `listen` (use port 0 for a free one) and forwards to the API server of
    /// `config` (its CA, its credentials). Faults are drawn from an RNG seeded with `seed`.
    pub async fn start(
        listen: SocketAddr,
        config: kube::Config,
        seed: u64,
    ) -> std::io::Result<Proxy> {
        let client = upstream_client(config)?;
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (cuts, _) = broadcast::channel(16);
        let shared = Arc::new(Shared {
            rules: Mutex::new(RuleSet::new(seed)),
            holds: Holds::default(),
            cuts,
            sent: AtomicU64::new(0),
            upstream: Mutex::new(client),
        });
        let (shutdown, stopped) = watch::channel(false);
        tokio::spawn(accept(listener, shared.clone(), stopped));
        Ok(Proxy {
            addr,
            shared,
            shutdown,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`: the `server` for the proxied client's kubeconfig.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends every request from now on to the API server of `config` (another
    /// kube-apiserver of the same etcd, say), and cuts every open watch stream so that
    /// clients watch again, there.
    pub fn set_upstream(&self, config: kube::Config) -> std::io::Result<()> {
        *self.shared.upstream.lock().expect("upstream poisoned") = upstream_client(config)?;
        self.cut_watches(&[]);
        Ok(())
    }

    pub fn add_rule(&self, rule: Rule) -> u64 {
        self.shared.rules().add(rule)
    }

    pub fn remove_rule(&self, id: u64) -> bool {
        self.shared.rules().remove(id)
    }

    /// Removes every rule; held watch events are released on schedule.
    pub fn clear(&self) {
        self.shared.rules().clear()
    }

    pub fn rules(&self) -> Vec<(u64, Rule)> {
        self.shared.rules().rules()
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The requests `hold` rules hold now.
    pub fn held(&self) -> Vec<HeldRequest> {
        self.shared.holds.held()
    }

    /// Lets every held request go on (forwarded, or its answer sent); returns how many.
    pub fn release_held(&self) -> usize {
        self.shared.holds.decide(Decision::Release)
    }

    /// Ends every held request without forwarding it or sending its real answer.
    pub fn drop_held(&self) -> usize {
        self.shared.holds.decide(Decision::Drop)
    }

    /// Starts a fresh journal of the writes that go through the proxy.
    pub fn record_writes(&self) {
        self.shared.holds.record()
    }

    /// The writes since [`Proxy::record_writes`], in the order they arrived.
    pub fn journal(&self) -> Vec<WriteRecord> {
        self.shared.holds.journal()
    }

    /// Cuts every open watch stream of these resources (all when empty), now. Each client
    /// watches again from where it was.
    pub fn cut_watches(&self, resources: &[&str]) {
        self.cut(resources, false);
    }

    /// Cuts every open watch stream of these resources (all when empty), now, and expires
    /// where each would resume: the client's watch from there is answered 410 Gone, so it
    /// lists everything again (what an API server restart does to a client whose
    /// resourceVersion the new watch cache no longer reaches: a forced relist).
    pub fn expire_watches(&self, resources: &[&str]) {
        self.cut(resources, true);
    }

    fn cut(&self, resources: &[&str], expire: bool) {
        let _ = self.shared.cuts.send(CutOrder {
            resources: resources.iter().map(|s| s.to_string()).collect(),
            expire,
        });
    }

    /// Serves the JSON-lines control protocol on a unix socket (see `control`).
    pub fn serve_control(&self, path: &Path) -> std::io::Result<()> {
        crate::control::serve(path, self.shared.clone(), self.shutdown.subscribe())
    }

    /// Writes a kubeconfig whose cluster is this proxy (no credentials: the proxy uses its
    /// own), with `namespace` as the context's namespace.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig_for(&self.url(), namespace))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// A kubeconfig pointing at `server` without credentials.
pub fn kubeconfig_for(server: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fault-proxy\n  cluster:\n    server: {server}\n\
         users:\n- name: fault-proxy\n  user: {{}}\ncontexts:\n- name: fault-proxy\n  context:\n    \
         cluster: fault-proxy\n    user: fault-proxy\n    namespace: {namespace}\n\
         current-context: fault-proxy\n"
    )
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stopped.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| counted(shared.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => if let Err(e) = r { debug!(error = %e, "connection ended"); },
                _ = stop.changed() => {}
            }
        });
    }
}

/// Request headers that belong to one hop, or that the proxy sets itself.
fn skip_request_header(name: &HeaderName) -> bool {
    [
        header::HOST,
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::AUTHORIZATION,
        header::CONTENT_LENGTH,
        // Plain bodies only: the watch filter reads them.
        header::ACCEPT_ENCODING,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
}

/// [`handle`], counting the bytes of the answer's body as they go to the client.
async fn counted(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let response = handle(shared.clone(), req).await?;
    Ok(response.map(|body| {
        body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                shared.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            frame
        })
        .boxed_unsync()
    }))
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let info = RequestInfo::parse(&parts.method, parts.uri.path(), parts.uri.query());
    let plan = shared.rules().plan_request(&info);
    if let Some(delay) = plan.delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = plan.status {
        debug!(verb = %info.verb, resource = %info.full_resource(), code, "injected status");
        if code == 410 && info.verb == "watch" {
            return Ok(watch_expired_response());
        }
        return Ok(status_response(code, &info, &parts.method));
    }
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return Ok(plain_status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("reading the request body: {e}"),
            ));
        }
    };
    let record = is_write(&info.verb).then(|| WriteRecord::of(&info, &body));
    let slot = record.as_ref().and_then(|r| shared.holds.note(r));
    if plan.hold == Some(HoldAt::Before) {
        let request = record
            .clone()
            .unwrap_or_else(|| WriteRecord::of(&info, &body));
        let (_guard, decision) = shared.holds.hold(HoldAt::Before, request, None);
        if decision.await != Ok(Decision::Release) {
            return Ok(dropped(&info));
        }
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut builder = Request::builder().method(parts.method.clone()).uri(path);
    for (name, value) in parts.headers.iter() {
        if !skip_request_header(name) {
            builder = builder.header(name, value);
        }
    }
    let watch = info.verb == "watch";
    if let Some(headers) = builder.headers_mut()
        && watch
    {
        // The filter reads JSON events; clients decode whatever the response says it is.
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    }
    let upstream = match builder.body(kube::client::Body::from(body)) {
        Ok(r) => r,
        Err(e) => {
            return Ok(plain_status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &e.to_string(),
            ));
        }
    };
    shared.rules().record_forwarded(watch);
    let response = match shared.upstream().send(upstream).await {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, verb = %info.verb, resource = %info.full_resource(), "upstream request failed");
            return Ok(plain_status(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                &format!("kube-fault-proxy: upstream request failed: {e}"),
            ));
        }
    };
    shared.holds.answered(slot, response.status().as_u16());
    if let Some(code) = plan.lost_response {
        let _ = response.into_body().collect().await;
        debug!(verb = %info.verb, resource = %info.full_resource(), code, "injected lost response");
        return Ok(status_response(code, &info, &parts.method));
    }
    if plan.hold == Some(HoldAt::After) {
        let request = record.unwrap_or_else(|| WriteRecord::of(&info, &[]));
        return Ok(hold_answer(&shared, &info, request, response).await);
    }
    let (mut rparts, rbody) = response.into_parts();
    let json = rparts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let body: ProxyBody = if watch && rparts.status == StatusCode::OK && json {
        rparts.headers.remove(header::CONTENT_LENGTH);
        crate::watch::filter(shared, info, rbody)
    } else {
        rbody
            .map_err(|e| Box::new(e) as crate::BoxError)
            .boxed_unsync()
    };
    for h in [header::CONNECTION, header::TRANSFER_ENCODING] {
        rparts.headers.remove(h);
    }
    Ok(Response::from_parts(rparts, body))
}

/// Reads the API server's whole answer, then holds it until the control socket decides.
async fn hold_answer(
    shared: &Shared,
    info: &RequestInfo,
    request: WriteRecord,
    response: Response<kube::client::Body>,
) -> Response<ProxyBody> {
    let (mut rparts, rbody) = response.into_parts();
    let bytes = match rbody.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return plain_status(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                &format!("kube-fault-proxy: reading the answer: {e}"),
            );
        }
    };
    let status = Some(rparts.status.as_u16());
    let (_guard, decision) = shared.holds.hold(HoldAt::After, request, status);
    if decision.await != Ok(Decision::Release) {
        return dropped(info);
    }
    for h in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
    ] {
        rparts.headers.remove(h);
    }
    let body = Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync();
    Response::from_parts(rparts, body)
}

/// The answer to a held request that was dropped (its client is normally gone by then): a
/// 500, which no client retries by itself (kube-rs retries 503).
fn dropped(info: &RequestInfo) -> Response<ProxyBody> {
    debug!(verb = %info.verb, resource = %info.full_resource(), "held request dropped");
    plain_status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        "held request dropped by kube-fault-proxy",
    )
}

/// What kube-apiserver answers a watch from a compacted resourceVersion: `200 OK` and a
/// stream holding one `ERROR` event with a 410 `Status` (clients then relist).
fn watch_expired_response() -> Response<ProxyBody> {
    let event = serde_json::json!({
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version (injected by kube-fault-proxy)",
            "reason": "Expired",
            "code": 410,
        }
    });
    let mut line = serde_json::to_vec(&event).unwrap_or_default();
    line.push(b'\n');
    let mut response = Response::new(
        Full::new(Bytes::from(line))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A Kubernetes `Status` answer for an injected fault, with the reason clients test for
/// (`AlreadyExists` for a create, `Conflict` for other writes, `Expired` for a stale watch).
fn status_response(code: u16, info: &RequestInfo, method: &Method) -> Response<ProxyBody> {
    let what = match &info.name {
        Some(n) => format!("{} \"{n}\"", info.full_resource()),
        None => info.full_resource(),
    };
    let (reason, message) = match code {
        409 if *method == Method::POST => ("AlreadyExists", format!("{what} already exists")),
        409 => (
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what}: the object has been modified; please \
                 apply your changes to the latest version and try again"
            ),
        ),
        410 => ("Expired", "too old resource version".to_string()),
        429 => (
            "TooManyRequests",
            "too many requests, please try again later".to_string(),
        ),
        500 => ("InternalError", "Internal error occurred".to_string()),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request".to_string(),
        ),
        504 => (
            "Timeout",
            "the server was unable to return a response in the time allotted".to_string(),
        ),
        _ => ("", format!("HTTP {code}")),
    };
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = plain_status(
        status,
        reason,
        &format!("{message} (injected by kube-fault-proxy)"),
    );
    if code == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn plain_status(status: StatusCode, reason: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    });
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    let mut response = Response::new(
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
