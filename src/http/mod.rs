//! The HTTP endpoint (`--http-endpoint` / `--metrics-address`): Prometheus
//! metrics at `--metrics-path`, `/healthz/leader-election` and, with
//! `--enable-pprof`, `/debug/pprof/`. It starts before leader election, so
//! standby replicas serve metrics too.

mod pprof;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::{CodeLabels, Metrics};

/// Health of leader election, for `/healthz/leader-election`.
pub trait LeaderHealth: Send + Sync {
    /// `Err(reason)` when this replica believes it leads but failed to renew
    /// in time (upstream: the HealthzAdaptor).
    fn check(&self) -> Result<(), String>;
}

pub struct HttpServer {
    pub registry: Arc<Registry>,
    /// Where scrapes of the metrics path are counted (promhttp's metrics).
    pub metrics: Arc<Metrics>,
    pub metrics_path: String,
    pub leader: Option<Arc<dyn LeaderHealth>>,
    /// Serve the profiles under `/debug/pprof/` (`--enable-pprof`).
    pub pprof: bool,
}

impl HttpServer {
    /// Binds now (a bind failure is fatal, as upstream) and serves until `stop`.
    pub async fn serve(self, addr: &str, stop: CancellationToken) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(normalize_addr(addr)).await?;
        let local = listener.local_addr()?;
        let this = Arc::new(self);
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = listener.accept() => match r {
                        Ok(s) => s,
                        Err(e) => { warn!(error = %e, "accept failed"); continue; }
                    },
                };
                let this = this.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let this = this.clone();
                        async move { Ok::<_, Infallible>(this.handle(req).await) }
                    });
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await
                    {
                        debug!(error = %e, "http connection ended");
                    }
                });
            }
        });
        Ok(local)
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path();
        if let Some(name) = path.strip_prefix(pprof::PREFIX).filter(|_| self.pprof) {
            pprof::handle(name, req.uri().query()).await
        } else if path == self.metrics_path {
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            // As promhttp: the scrape sees itself in flight, and is counted
            // (by its status code) once it has been answered.
            self.metrics.scrapes_in_flight.inc();
            let (content_type, body) = self.encode_metrics(wants_openmetrics(accept));
            self.metrics.scrapes_in_flight.dec();
            let response = match body {
                Ok(body) => reply(StatusCode::OK, content_type, body),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    e.to_string(),
                ),
            };
            self.metrics
                .scrapes
                .get_or_create(&CodeLabels {
                    code: response.status().as_u16().to_string(),
                })
                .inc();
            response
        } else if path == "/healthz/leader-election" && self.leader.is_some() {
            match self.leader.as_ref().map(|l| l.check()) {
                Some(Err(reason)) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("internal server error: {reason}"),
                ),
                _ => reply(StatusCode::OK, "text/plain", "ok"),
            }
        } else {
            reply(StatusCode::NOT_FOUND, "text/plain", "404 page not found\n")
        }
    }
}

impl HttpServer {
    /// Upstream (promhttp without OpenMetrics) always answers in the Prometheus
    /// text format 0.0.4; we do too, unless the scraper asks for OpenMetrics.
    fn encode_metrics(&self, openmetrics: bool) -> (&'static str, Result<String, std::fmt::Error>) {
        let mut body = String::new();
        if openmetrics {
            let r = prometheus_client::encoding::text::encode(&mut body, &self.registry);
            (OPENMETRICS_CONTENT_TYPE, r.map(|()| body))
        } else {
            let r = prometheus_client::encoding::prometheus_text::encode(&mut body, &self.registry);
            (
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                r.map(|()| body),
            )
        }
    }
}

const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether an `Accept` header lists OpenMetrics text (as Prometheus sends it).
fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|part| {
        part.split(';')
            .next()
            .is_some_and(|media| media.trim() == "application/openmetrics-text")
    })
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

/// Go accepts `:8080` meaning every interface.
fn normalize_addr(addr: &str) -> String {
    if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        // What Prometheus 2.x/3.x sends.
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
    }
}
