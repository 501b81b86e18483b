//! The Kubernetes API client every command builds the same way: from a
//! kubeconfig (or the pod's in-cluster config), an optional `--master`, a
//! bound on requests in flight and an optional rate limit.

use std::path::Path;

use kube::Client;

use super::activity::ActivityLayer;
use super::throttle::ThrottleLayer;

/// The client could not be built (kubeconfig, in-cluster config, `--master`).
#[derive(Debug, thiserror::Error)]
#[error("failed to build the Kubernetes client: {0}")]
pub struct ClientError(String);

/// How many API requests one of our clients has in flight at most, unless
/// told otherwise. kube-rs speaks HTTP/1.1 (client-go multiplexes one HTTP/2
/// connection), so every request in flight is a TLS connection of its own,
/// about 90 KiB each with its buffers. The work client allows as many as
/// `--worker-threads`: fewer would queue a claim's request behind the others'
/// where upstream's would be on its way. Watches hold a slot only until their
/// response starts.
pub const REQUESTS_IN_FLIGHT: usize = 16;

/// What our requests say they come from.
pub fn user_agent() -> String {
    format!(
        "csi-provisioner/v{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// A client from the kubeconfig at `kubeconfig` (in-cluster config without
/// one), talking to `master` when given, with at most [`REQUESTS_IN_FLIGHT`]
/// requests in flight and an optional rate limit.
pub async fn build(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
    throttle: Option<ThrottleLayer>,
) -> Result<Client, ClientError> {
    build_with(kubeconfig, master, throttle, REQUESTS_IN_FLIGHT, None).await
}

/// [`build`], with at most `in_flight` requests in flight, counted by `activity` when given
/// (the work lane's: `super::activity`).
pub async fn build_with(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
    throttle: Option<ThrottleLayer>,
    in_flight: usize,
    activity: Option<ActivityLayer>,
) -> Result<Client, ClientError> {
    let err = |e: &dyn std::fmt::Display| ClientError(e.to_string());
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| err(&e))?
        }
        None => kube::Config::incluster().map_err(|e| err(&e))?,
    };
    if let Some(master) = master {
        config.cluster_url = master.parse().map_err(|e: http::uri::InvalidUri| err(&e))?;
    }
    // Named as client-go names upstream's sidecar (`<binary>/<version>
    // (<os>/<arch>)`): audit logs and managedFields say who wrote.
    let agent = http::HeaderValue::from_str(&user_agent()).map_err(|e| err(&e))?;
    config.headers.push((http::header::USER_AGENT, agent));
    // Innermost first: the dispatch signal fires once a token and a
    // connection slot were had (`dispatch`).
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| err(&e))?
        .with_layer(&super::dispatch::DispatchLayer)
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(in_flight.max(1)));
    // Outermost: the throttle, then the activity count (from a token to the answer).
    Ok(match (throttle, activity) {
        (None, None) => builder.build(),
        (Some(throttle), None) => builder.with_layer(&throttle).build(),
        (None, Some(activity)) => builder.with_layer(&activity).build(),
        (Some(throttle), Some(activity)) => {
            builder.with_layer(&throttle).with_layer(&activity).build()
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_client_keeps_at_most_its_limit_of_requests_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // An API server that holds each request a moment and counts how many
        // it holds at once.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (n, m) = (now.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (n, m) = (n.clone(), m.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| {
                        let (n, m) = (n.clone(), m.clone());
                        async move {
                            m.fetch_max(n.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            n.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(hyper::body::Bytes::from("{}")),
                            ))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://{addr}'}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
                 current-context: x\n"
            ),
        )
        .unwrap();
        let client = build(Some(&kubeconfig), None, None).await.unwrap();
        let requests = (0..3 * REQUESTS_IN_FLIGHT).map(|_| {
            let client = client.clone();
            async move {
                client
                    .request_text(http::Request::get("/api").body(Vec::new()).unwrap())
                    .await
                    .unwrap()
            }
        });
        futures::future::join_all(requests).await;
        assert_eq!(
            most.load(Ordering::SeqCst),
            REQUESTS_IN_FLIGHT,
            "held at once by the server"
        );
    }
}
