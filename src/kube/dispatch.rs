//! When a request leaves the client: the innermost layer of every client, after the rate
//! limit's token and a connection slot were had, fires the [`Dispatch`] a request carries in its
//! extensions (and numbers the write-clock stamp it carries: `super::clock`). A freshness round keeps gathering the claims that ask for it until its list is
//! dispatched: each of them began its decision before the request reached the API server, so the
//! version the list answers is valid for all of them, however long the list waited for a token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tower::{Layer, Service};

/// Fired once, when the request that carries it is handed to the connection.
#[derive(Clone, Default)]
pub struct Dispatch {
    wake: Arc<Mutex<Option<oneshot::Sender<()>>>>,
    fired: Arc<AtomicBool>,
}

impl Dispatch {
    /// A signal, and what waits for it.
    pub fn new() -> (Dispatch, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let dispatch = Dispatch {
            wake: Arc::new(Mutex::new(Some(tx))),
            fired: Arc::default(),
        };
        (dispatch, rx)
    }

    /// Whether the request has left: set before anyone is woken.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        if let Some(tx) = self.wake.lock().expect("dispatch poisoned").take() {
            let _ = tx.send(());
        }
    }
}

/// The layer that fires a request's [`Dispatch`].
#[derive(Clone, Copy, Default)]
pub struct DispatchLayer;

impl<S> Layer<S> for DispatchLayer {
    type Service = Dispatching<S>;

    fn layer(&self, inner: S) -> Dispatching<S> {
        Dispatching(inner)
    }
}

#[derive(Clone)]
pub struct Dispatching<S>(S);

impl<S, B> Service<http::Request<B>> for Dispatching<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(dispatch) = req.extensions().get::<Dispatch>() {
            dispatch.fire();
        }
        if let Some(stamp) = req.extensions().get::<super::clock::Stamp>() {
            stamp.dispatched();
        }
        self.0.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_request_fires_its_signal_when_it_is_handed_on() {
        let svc = DispatchLayer.layer(tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(())
        }));
        let (dispatch, mut fired) = Dispatch::new();
        let mut req = http::Request::new(());
        req.extensions_mut().insert(dispatch);
        let flag = req.extensions().get::<Dispatch>().unwrap().clone();
        assert!(fired.try_recv().is_err() && !flag.fired(), "not before");
        svc.oneshot(req).await.unwrap();
        assert!(fired.try_recv().is_ok() && flag.fired());
    }
}
