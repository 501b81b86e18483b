//! Client-side rate limiting of API requests (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket shared by every request of one client,
//! as client-go's flowcontrol does. A request waits for a token in
//! `poll_ready`, so the client's request buffer holds back everything behind it.

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

#[derive(Clone)]
pub struct ThrottleLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl ThrottleLayer {
    pub fn new(qps: f32, burst: u32) -> ThrottleLayer {
        ThrottleLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
        }
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            has_token: false,
        }
    }
}

pub struct Throttle<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
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
                .bucket
                .lock()
                .expect("bucket poisoned")
                .take_at(tokio::time::Instant::now().into_std())
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
        let layer = ThrottleLayer::new(2.0, 2);
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
}
