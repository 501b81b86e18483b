//! Client-side rate limiting of API requests (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket shared by every request of the process's
//! clients, as client-go's flowcontrol does for one clientset, with two lanes
//! ([`Lane`]). A request waits for a token in `poll_ready`, so the client's
//! request buffer holds back everything behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::time::Sleep;
use tower::{Layer, Service};

/// Tokens refill at `qps` per second up to `burst`; the bucket starts full.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: f32, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: f64::from(qps).max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            last: tokio::time::Instant::now().into_std(),
        }
    }

    /// Takes a token at `now`, or says how long until one is available.
    pub fn take_at(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// Which requests a client sends. The lanes share one bucket, so together
/// they never exceed `--kube-api-qps`. The priority lane (the caches'
/// watches, and the freshness rounds that many claims wait on) takes the next
/// token ahead of the work lane: a watch that (re)starts behind a hundred
/// queued PV creates would freeze its cache for as long, and a round serves
/// every claim waiting on it. The background lane (events, dropping an intent
/// that is no longer needed) takes a token only while no request of the other
/// lanes is waiting for one, so reports and tidying never delay provisioning
/// or deletion. client-go gets a similar effect for events by accident: its
/// one event goroutine queues behind every worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Priority,
    Work,
    Background,
}

struct Shared {
    bucket: TokenBucket,
    /// Whether a priority-lane request is waiting for a token right now.
    priority_waiting: bool,
    /// Whether a work-lane request is waiting for a token right now.
    work_waiting: bool,
}

/// One token bucket for the clients of one process, handed to each client's
/// layer with its lane.
#[derive(Clone)]
pub struct SharedBucket(Arc<Mutex<Shared>>);

impl SharedBucket {
    pub fn new(qps: f32, burst: u32) -> SharedBucket {
        SharedBucket(Arc::new(Mutex::new(Shared {
            bucket: TokenBucket::new(qps, burst),
            priority_waiting: false,
            work_waiting: false,
        })))
    }

    /// Takes a token for `lane` now, as a request would (tests make the lanes wait so).
    #[cfg(test)]
    pub(crate) fn take_for_test(&self, lane: Lane) -> Result<(), Duration> {
        self.take(lane, tokio::time::Instant::now().into_std())
    }

    /// The bucket's refill rate, per second.
    pub fn qps(&self) -> f32 {
        self.0.lock().expect("bucket poisoned").bucket.qps as f32
    }

    /// Whether a request of the work lane is waiting for a token: the bucket,
    /// not the API server, is what provisioning waits on now.
    pub fn work_is_waiting(&self) -> bool {
        self.0.lock().expect("bucket poisoned").work_waiting
    }

    pub fn layer(&self, lane: Lane) -> ThrottleLayer {
        ThrottleLayer {
            shared: self.clone(),
            lane,
        }
    }

    /// Takes a token for `lane` at `now`, or says how long to wait.
    fn take(&self, lane: Lane, now: Instant) -> Result<(), Duration> {
        let mut shared = self.0.lock().expect("bucket poisoned");
        let yields = match lane {
            Lane::Priority => false,
            Lane::Work => shared.priority_waiting,
            Lane::Background => shared.priority_waiting || shared.work_waiting,
        };
        if yields {
            // Look again once the lane ahead could have had its token. A work
            // request that yields still counts as waiting.
            if lane == Lane::Work {
                shared.work_waiting = true;
            }
            return Err(Duration::from_secs_f64(1.0 / shared.bucket.qps));
        }
        let taken = shared.bucket.take_at(now);
        match lane {
            Lane::Priority => shared.priority_waiting = taken.is_err(),
            Lane::Work => shared.work_waiting = taken.is_err(),
            Lane::Background => {}
        }
        taken
    }

    fn stop_waiting(&self, lane: Lane) {
        let mut shared = self.0.lock().expect("bucket poisoned");
        match lane {
            Lane::Priority => shared.priority_waiting = false,
            Lane::Work => shared.work_waiting = false,
            Lane::Background => {}
        }
    }
}

#[derive(Clone)]
pub struct ThrottleLayer {
    shared: SharedBucket,
    lane: Lane,
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            shared: self.shared.clone(),
            lane: self.lane,
            sleep: None,
            has_token: false,
        }
    }
}

/// A client's throttle. kube's client puts a buffer in front of its service
/// stack, so one `Throttle` serves the client's requests one at a time: while
/// it waits, so does every request of its client behind it.
pub struct Throttle<S> {
    inner: S,
    shared: SharedBucket,
    lane: Lane,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S> Drop for Throttle<S> {
    fn drop(&mut self) {
        if self.sleep.is_some() {
            self.shared.stop_waiting(self.lane);
        }
    }
}

impl<S, R> Service<R> for Throttle<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self
                .shared
                .take(self.lane, tokio::time::Instant::now().into_std())
            {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_paces_at_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5.0, 10);
        for _ in 0..10 {
            assert!(b.take_at(t0).is_ok());
        }
        let wait = b.take_at(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        assert!(b.take_at(t0 + Duration::from_millis(200)).is_ok());
        assert!(b.take_at(t0 + Duration::from_millis(200)).is_err());
        // A long idle period refills only up to the burst.
        let later = t0 + Duration::from_secs(100);
        for _ in 0..10 {
            assert!(b.take_at(later).is_ok());
        }
        assert!(b.take_at(later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait() {
        let layer = SharedBucket::new(2.0, 2).layer(Lane::Work);
        let mut svc = layer.layer(tower::service_fn(|x: u32| async move {
            Ok::<_, std::convert::Infallible>(x)
        }));
        let start = tokio::time::Instant::now();
        for i in 0..4 {
            use tower::ServiceExt;
            svc.ready().await.unwrap().call(i).await.unwrap();
        }
        // Two from the burst, then two more at 2 per second.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited < Duration::from_millis(1100),
            "{waited:?}"
        );
    }

    #[test]
    fn the_background_lane_waits_while_work_waits() {
        let t0 = Instant::now();
        let bucket = SharedBucket::new(1.0, 1);
        assert!(bucket.take(Lane::Work, t0).is_ok());
        // The bucket is empty: work waits, and from now on background yields.
        assert!(bucket.take(Lane::Work, t0).is_err());
        let t1 = t0 + Duration::from_secs(1);
        assert!(
            bucket.take(Lane::Background, t1).is_err(),
            "the token that refilled is the waiting work's"
        );
        assert!(bucket.take(Lane::Work, t1).is_ok());
        // Nobody waits now: the next token may go to background.
        let t2 = t1 + Duration::from_secs(1);
        assert!(bucket.take(Lane::Background, t2).is_ok());
        assert!(
            bucket.take(Lane::Background, t2).is_err(),
            "one bucket for both lanes"
        );
    }

    #[test]
    fn the_priority_lane_takes_the_next_token_ahead_of_work() {
        let t0 = Instant::now();
        let bucket = SharedBucket::new(1.0, 1);
        assert!(bucket.take(Lane::Work, t0).is_ok());
        // Both wait for the next token: it is the watch's (or the round's).
        assert!(bucket.take(Lane::Work, t0).is_err());
        assert!(bucket.take(Lane::Priority, t0).is_err());
        let t1 = t0 + Duration::from_secs(1);
        assert!(bucket.take(Lane::Work, t1).is_err(), "priority waits");
        assert!(bucket.work_is_waiting(), "work still counts as waiting");
        assert!(bucket.take(Lane::Priority, t1).is_ok());
        let t2 = t1 + Duration::from_secs(1);
        assert!(bucket.take(Lane::Work, t2).is_ok());
        assert!(!bucket.work_is_waiting());
    }
}
