//! Whether the work lane is busy: requests of the work client in flight (counted by a layer from
//! the moment one has its token until its answer) or waiting for a token (the shared bucket says
//! so). Events wait for it to be idle, so that reports never compete with provisioning for the
//! API server during a burst.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tower::{Layer, Service};

use super::throttle::SharedBucket;

/// The work lane's activity: cheap to share.
#[derive(Clone, Default)]
pub struct Activity {
    in_flight: Arc<AtomicUsize>,
    quiet: Arc<Notify>,
    bucket: Option<SharedBucket>,
}

impl Activity {
    pub fn new(bucket: Option<SharedBucket>) -> Activity {
        Activity {
            bucket,
            ..Default::default()
        }
    }

    /// Whether no work request is in flight or waiting for a token.
    pub fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
            && !self
                .bucket
                .as_ref()
                .is_some_and(SharedBucket::work_is_waiting)
    }

    /// Waits until the lane is idle, or `limit` has passed.
    pub async fn wait_idle(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.idle() {
            let quiet = self.quiet.notified();
            // Waiting for a token is not announced: look again a moment later.
            let step = (tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline);
            tokio::select! {
                _ = quiet => {}
                _ = tokio::time::sleep_until(step) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
        }
    }

    /// The layer that counts the work client's requests in flight.
    pub fn layer(&self) -> ActivityLayer {
        ActivityLayer(self.clone())
    }
}

#[derive(Clone)]
pub struct ActivityLayer(Activity);

impl<S> Layer<S> for ActivityLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            activity: self.0.clone(),
        }
    }
}

pub struct Counted<S> {
    inner: S,
    activity: Activity,
}

impl<S, R> Service<R> for Counted<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let guard = InFlight::new(self.activity.clone());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await;
            drop(guard);
            answer
        })
    }
}

/// One request in flight, until dropped (answered, or cancelled).
struct InFlight(Activity);

impl InFlight {
    fn new(activity: Activity) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test(start_paused = true)]
    async fn the_lane_is_idle_once_its_requests_are_answered() {
        let activity = Activity::new(None);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
        let svc = activity.layer().layer(tower::service_fn(move |_: ()| {
            let rx = rx.clone();
            async move {
                let rx = rx.lock().await.take().unwrap();
                let _ = rx.await;
                Ok::<_, std::convert::Infallible>(())
            }
        }));
        let request = tokio::spawn(svc.oneshot(()));
        tokio::task::yield_now().await;
        assert!(!activity.idle(), "a request in flight");
        let waited = tokio::spawn({
            let a = activity.clone();
            async move { a.wait_idle(Duration::from_secs(60)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waited.is_finished());
        tx.send(()).unwrap();
        request.await.unwrap().unwrap();
        waited.await.unwrap();
        assert!(activity.idle());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_limit_however_busy() {
        let bucket = SharedBucket::new(1.0, 1);
        let activity = Activity::new(Some(bucket.clone()));
        let _ = bucket.take_for_test(super::super::throttle::Lane::Work);
        let _ = bucket.take_for_test(super::super::throttle::Lane::Work);
        assert!(!activity.idle(), "work waits for a token");
        let start = tokio::time::Instant::now();
        activity.wait_idle(Duration::from_secs(3)).await;
        assert_eq!(start.elapsed().as_secs(), 3);
    }
}
