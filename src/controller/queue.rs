//! A controller's work queue, first come first served: what kube-runtime's scheduler lacks.
//! kube-runtime keeps the objects that wait for a free reconcile in a hash set and takes them
//! in hash order, so in a burst a claim made first may be served last; client-go's workqueue,
//! upstream's, is a FIFO. Here:
//!
//! - an object triggered by its watch joins the back of the queue once (a trigger while it is
//!   queued changes nothing; while it runs, it joins again when that run ends);
//! - `workers` tasks take objects from the front, each reading the object's latest copy from the
//!   store when it starts;
//! - a run returns an [`Action`]: wait for a change, or run again after a delay (an earlier
//!   pending delay wins, as kube-runtime's scheduler keeps it); a failure goes through the error
//!   policy, which returns one too;
//! - a graceful stop lets every run in flight finish.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::WorkQueueMetrics;

/// What a run asks for next (kube-runtime's `Action`, whose delay can be read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Run again after `after`, unless a change runs it sooner.
    pub const fn requeue(after: Duration) -> Action {
        Action {
            requeue_after: Some(after),
        }
    }

    /// Run again when the object changes.
    pub const fn await_change() -> Action {
        Action {
            requeue_after: None,
        }
    }

    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

struct State<T> {
    order: VecDeque<T>,
    queued: HashSet<T>,
    running: HashSet<T>,
    /// Triggered while running: queued again when the run ends.
    dirty: HashSet<T>,
    /// The time each delayed run is due (the earliest asked for).
    due: HashMap<T, Instant>,
    closed: bool,
}

/// The queue of keys `T`, FIFO, each at most once in it and at most once running.
pub struct Fifo<T> {
    state: Mutex<State<T>>,
    ready: Notify,
}

impl<T: Clone + Eq + Hash> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            state: Mutex::new(State {
                order: VecDeque::new(),
                queued: HashSet::new(),
                running: HashSet::new(),
                dirty: HashSet::new(),
                due: HashMap::new(),
                closed: false,
            }),
            ready: Notify::new(),
        }
    }
}

impl<T: Clone + Eq + Hash + Send + 'static> Fifo<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().expect("queue poisoned")
    }

    /// Puts `key` at the back, unless it is queued already (or, while it runs, after its run).
    pub fn add(&self, key: T) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.running.contains(&key) {
            s.dirty.insert(key);
        } else if s.queued.insert(key.clone()) {
            s.order.push_back(key);
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Adds `key` after `after`, unless an earlier run is due already or the key runs before.
    pub fn add_after(self: &Arc<Self>, key: T, after: Duration) {
        let at = Instant::now() + after;
        {
            let mut s = self.lock();
            match s.due.get(&key) {
                Some(earlier) if *earlier <= at => return,
                _ => {
                    s.due.insert(key.clone(), at);
                }
            }
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let due = {
                let mut s = queue.lock();
                let due = s.due.get(&key) == Some(&at);
                if due {
                    s.due.remove(&key);
                }
                due
            };
            if due {
                queue.add(key);
            }
        });
    }

    /// The key at the front, marked running; `None` once closed.
    pub async fn take(&self) -> Option<T> {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                if s.closed {
                    return None;
                }
                if let Some(key) = s.order.pop_front() {
                    s.queued.remove(&key);
                    s.due.remove(&key);
                    s.running.insert(key.clone());
                    let more = !s.order.is_empty();
                    drop(s);
                    if more {
                        // Another worker may take the next.
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// The run of `key` ended: triggered meanwhile, it joins the back again.
    pub fn done(&self, key: &T) {
        let again = {
            let mut s = self.lock();
            s.running.remove(key);
            s.dirty.remove(key)
        };
        if again {
            self.add(key.clone());
        }
    }

    /// No more keys are handed out; workers end after their current run.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_waiters();
    }

    /// Keys waiting to run.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a controller runs on a [`Fifo`].
pub struct Runner<C> {
    pub workers: usize,
    pub ctx: Arc<C>,
    pub metrics: WorkQueueMetrics,
    pub stop: CancellationToken,
}

impl<C: Send + Sync + 'static> Runner<C> {
    /// Runs `reconcile` for every object `triggers` yields (each read from `store` when its run
    /// starts), `error_policy` after each failure, until a graceful stop ends the runs in flight.
    pub async fn run<K, S, R, F, E, P>(
        self,
        triggers: S,
        store: Store<K>,
        reconcile: R,
        error_policy: P,
    ) where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
        S: Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static,
        R: Fn(Arc<K>, Arc<C>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<C>) -> Action + Send + Sync + 'static,
    {
        let queue: Arc<Fifo<ObjectRef<K>>> = Arc::default();
        let feed = {
            let queue = queue.clone();
            tokio::spawn(triggers.for_each(move |object| {
                if let Ok(object) = object {
                    queue.add(ObjectRef::from_obj(&object));
                }
                futures::future::ready(())
            }))
        };
        let (reconcile, error_policy) = (Arc::new(reconcile), Arc::new(error_policy));
        let workers: Vec<_> = (0..self.workers.max(1))
            .map(|_| {
                let worker = Worker {
                    queue: queue.clone(),
                    store: store.clone(),
                    ctx: self.ctx.clone(),
                    metrics: self.metrics.clone(),
                };
                let (reconcile, error_policy) = (reconcile.clone(), error_policy.clone());
                tokio::spawn(async move { worker.run(&*reconcile, &*error_policy).await })
            })
            .collect();
        self.stop.cancelled().await;
        queue.close();
        for worker in workers {
            let _ = worker.await;
        }
        feed.abort();
    }
}

struct Worker<K: kube::Resource<DynamicType = ()> + 'static, C> {
    queue: Arc<Fifo<ObjectRef<K>>>,
    store: Store<K>,
    ctx: Arc<C>,
    metrics: WorkQueueMetrics,
}

impl<K, C> Worker<K, C>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    async fn run<R, F, E, P>(&self, reconcile: &R, error_policy: &P)
    where
        R: Fn(Arc<K>, Arc<C>) -> F,
        F: Future<Output = Result<Action, E>>,
        P: Fn(Arc<K>, &E, Arc<C>) -> Action,
    {
        while let Some(key) = self.queue.take().await {
            // Gone from the store (deleted, or no longer kept): nothing to do.
            if let Some(object) = self.store.get(&key) {
                let work = self.metrics.begin();
                let action = match reconcile(object.clone(), self.ctx.clone()).await {
                    Ok(action) => action,
                    Err(e) => {
                        self.metrics.retried();
                        error_policy(object, &e, self.ctx.clone())
                    }
                };
                work.done();
                if let Some(after) = action.requeue_after() {
                    self.queue.add_after(key.clone(), after);
                }
            }
            self.queue.done(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_served_in_the_order_they_came_each_once() {
        let q: Fifo<u32> = Fifo::default();
        for k in [3, 1, 2, 1, 3] {
            q.add(k);
        }
        assert_eq!(q.len(), 3, "a key already queued is not queued twice");
        let mut order = Vec::new();
        for _ in 0..3 {
            let k = q.take().await.unwrap();
            order.push(k);
            q.done(&k);
        }
        assert_eq!(order, [3, 1, 2]);
    }

    #[tokio::test]
    async fn a_key_triggered_while_it_runs_runs_again_after_at_the_back() {
        let q: Fifo<u32> = Fifo::default();
        q.add(1);
        q.add(2);
        let one = q.take().await.unwrap();
        q.add(1);
        assert_eq!(q.len(), 1, "not queued while it runs");
        q.done(&one);
        assert_eq!(q.take().await, Some(2));
        assert_eq!(q.take().await, Some(1), "again, behind what came before");
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_delay_wins_and_a_run_in_between_cancels_it() {
        let q: Arc<Fifo<u32>> = Arc::default();
        q.add_after(1, Duration::from_secs(10));
        q.add_after(1, Duration::from_secs(5));
        q.add_after(1, Duration::from_secs(20));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(q.len(), 1, "due after 5 s");
        let k = q.take().await.unwrap();
        q.done(&k);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(q.is_empty(), "the later delays were not kept");
        q.add_after(2, Duration::from_secs(5));
        q.add(2);
        let k = q.take().await.unwrap();
        q.done(&k);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(q.is_empty(), "the run before it cancelled the delayed one");
    }

    #[tokio::test]
    async fn a_closed_queue_hands_out_nothing_more() {
        let q: Arc<Fifo<u32>> = Arc::default();
        let waiting = tokio::spawn({
            let q = q.clone();
            async move { q.take().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiting.await.unwrap(), None);
        q.add(1);
        assert_eq!(q.take().await, None);
    }
}
