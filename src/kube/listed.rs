//! Whether a cache has finished its first list, for any number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` cannot be awaited by two tasks at
//! once: every waiter polls the same oneshot receiver, a receiver keeps one
//! waker, and each poll replaces the waker of the waiter before it. When the
//! list completes only the last waiter to poll is woken. The controller that
//! runs on a store always waits for it, so a claim that also waited for the PV
//! cache was not woken and sat out its whole timeout: with 10,000 PVs to list
//! the first claim after a start waited 10 s. This signal is marked by the
//! trigger stream after the store swapped the list in, and wakes every waiter.

use std::sync::Arc;

use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct Listed(Arc<watch::Sender<bool>>);

impl Default for Listed {
    fn default() -> Listed {
        Listed(Arc::new(watch::Sender::new(false)))
    }
}

impl Listed {
    /// Already listed: for caches a test fills by hand.
    pub fn done() -> Listed {
        let listed = Listed::default();
        listed.mark();
        listed
    }

    /// The store holds a complete list (set after it was swapped in).
    pub fn mark(&self) {
        self.0.send_replace(true);
    }

    pub fn is_listed(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once the first list is in the store.
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|listed| *listed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake, Waker};

    /// A waker that counts its wake-ups.
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counters(n: usize) -> Vec<Arc<Counter>> {
        (0..n)
            .map(|_| Arc::new(Counter(AtomicUsize::new(0))))
            .collect()
    }

    /// Polls each future once, each with its own counting waker.
    fn poll_all<F: std::future::Future + Unpin>(futures: &mut [F], wakers: &[Arc<Counter>]) {
        for (f, w) in futures.iter_mut().zip(wakers) {
            let waker = Waker::from(w.clone());
            assert!(f.poll_unpin(&mut Context::from_waker(&waker)).is_pending());
        }
    }

    fn woken(wakers: &[Arc<Counter>]) -> usize {
        wakers
            .iter()
            .filter(|w| w.0.load(Ordering::SeqCst) > 0)
            .count()
    }

    #[test]
    fn every_waiter_is_woken_by_the_first_list() {
        let listed = Listed::default();
        assert!(!listed.is_listed());
        let mut waiters: Vec<_> = (0..3).map(|_| listed.wait().boxed()).collect();
        let wakers = counters(3);
        poll_all(&mut waiters, &wakers);
        listed.mark();
        assert_eq!(woken(&wakers), 3);
        assert!(listed.is_listed());
        for w in waiters {
            assert!(w.now_or_never().is_some());
        }
        assert!(Listed::done().wait().now_or_never().is_some());
    }

    /// Why this module exists: of two tasks waiting for a kube-runtime store,
    /// only one is woken. If this starts failing, kube-runtime wakes them all
    /// and `Store::wait_until_ready` can be used again.
    #[test]
    fn kube_runtime_wakes_only_the_last_of_two_store_waiters() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let mut waiters: Vec<_> = (0..2).map(|_| store.wait_until_ready().boxed()).collect();
        let wakers = counters(2);
        poll_all(&mut waiters, &wakers);
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(woken(&wakers), 1, "kube-runtime now wakes every waiter");
        assert_eq!(wakers[1].0.load(Ordering::SeqCst), 1);
    }
}
