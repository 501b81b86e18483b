//! The authoritative check of policy mode (DESIGN §2.2) without a request per claim: one
//! consistent read shared by every decision that asks while it waits.
//!
//! - A **version round** asks the API server for its current resourceVersion (a consistent list
//!   of at most one claim). Every check that asked before that list was dispatched (however long
//!   it waited for a token: [`super::dispatch`]) waits until the claim cache has caught up with
//!   that version; the cache then shows each claim as it was at least as of a moment after its
//!   decision began, and a stale copy can no longer be taken for the claim.
//! - A cache that does not catch up in time (nothing wrote a claim since: the tail of a burst, a
//!   trickle) is answered by a **listing round**, shared likewise: one consistent list of the
//!   claims pending for us (the label the provisioning-intent policy puts on them, metadata
//!   only), in which each member finds its own claim's resourceVersion. It never turns into one
//!   read per claim.
//! - A check with nothing else waiting (no other check, no work request waiting for a token) is
//!   told to read its claim at once: one request either way, and no wait.
//! - While our own PV creates leave one after another (a burst), the version comes from the first
//!   of them dispatched after the check began, at no request at all ([`super::clock`]); a round's
//!   list, when one runs, is compared with the clock, which is trusted only while such comparisons
//!   pass.
//!
//! Rounds run one after another per kind, but a round's request is in flight while the next round
//! gathers. Correctness never waits on a round: an answer that cannot be had is "read it".

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::core::{ObjectList, PartialObjectMeta};
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::clock::WriteClock;
use super::dispatch::Dispatch;
use super::throttle::SharedBucket;
use super::watch::Progress;
use crate::keys;
use crate::metrics::Metrics;

/// The least time a check waits for the cache to catch up with its round; at a low rate limit
/// it waits longer ([`catch_up_for`]).
const CATCH_UP: Duration = Duration::from_millis(500);
/// Items per page of a listing round.
const PAGE: u32 = 500;

/// How long a check waits for the cache to catch up: at least [`CATCH_UP`], and five tokens'
/// worth at `qps` (the claim writes that move the cache follow our own PV creates, which wait for
/// tokens too).
pub fn catch_up_for(qps: Option<f32>) -> Duration {
    match qps {
        Some(qps) if qps > 0.0 => CATCH_UP.max(Duration::from_secs_f64(5.0 / f64::from(qps))),
        _ => CATCH_UP,
    }
}

/// What a freshness check answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// The cache has caught up with a resourceVersion the API server gave after the check began:
    /// decide on the cache.
    Caught,
    /// A listing round answered for the claim itself: its resourceVersion as of a moment after
    /// the check began, or `None` when it is not among the claims pending for us (bound, gone,
    /// or never labelled: read it).
    Listed(Option<ListedClaim>),
    /// Read the claim: nothing else waited, or the API server could not be asked.
    Read,
}

/// A claim as a listing round saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedClaim {
    pub uid: String,
    pub resource_version: String,
}

/// What the checks take besides the claim: where rounds are asked, the cache's progress.
pub struct FreshnessConfig {
    /// The client the rounds' lists go through (the priority lane's).
    pub client: kube::Client,
    /// How far the claim cache has caught up.
    pub progress: Progress,
    /// The rate limit's bucket: while work waits for a token, a lone check joins a round instead
    /// of reading (a round's one token serves everyone who asks while it waits).
    pub bucket: Option<SharedBucket>,
    pub metrics: Arc<Metrics>,
    /// Our driver's name: the value of the label the policy puts on the claims pending for us.
    pub driver: String,
    pub catch_up: Duration,
    /// The fewest checks a round starts with when no work waits (2; tests use 1 to force one).
    pub min_round: usize,
    /// Versions from our own PV creates (`--freshness-from-writes`), compared with every round.
    pub clock: Arc<WriteClock>,
}

/// Starts and answers rounds; cheap to share.
#[derive(Clone)]
pub struct Freshness {
    versions: mpsc::UnboundedSender<Ask>,
    listings: mpsc::UnboundedSender<Ask>,
    progress: Progress,
    metrics: Arc<Metrics>,
    catch_up: Duration,
    clock: Arc<WriteClock>,
    bucket: Option<SharedBucket>,
}

/// A check waiting for a round: `None` for "read it".
type Ask = oneshot::Sender<Option<Answer>>;

/// What a round's request answered.
#[derive(Clone)]
enum Answer {
    Version(u64),
    Listing(Arc<HashMap<(String, String), ListedClaim>>),
    Failed,
}

/// The two kinds of rounds.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Version,
    Listing,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Version => "version",
            Kind::Listing => "listing",
        }
    }
}

impl Freshness {
    /// The rounds' tasks live as long as a handle does.
    pub fn start(config: FreshnessConfig) -> Freshness {
        let FreshnessConfig {
            client,
            progress,
            bucket,
            metrics,
            driver,
            catch_up,
            min_round,
            clock,
        } = config;
        let round = |kind| {
            let (tx, rx) = mpsc::unbounded_channel();
            let requests = Requests {
                client: client.clone(),
                kind,
                selector: format!("{}={driver}", keys::LABEL_PROVISIONING),
            };
            let rounds = Rounds {
                requests,
                asks: rx,
                bucket: bucket.clone(),
                metrics: metrics.clone(),
                min_round,
                clock: clock.clone(),
                catch_up,
            };
            tokio::spawn(rounds.run());
            tx
        };
        Freshness {
            versions: round(Kind::Version),
            listings: round(Kind::Listing),
            progress,
            metrics,
            catch_up,
            clock,
            bucket,
        }
    }

    /// The write clock, for the PV creates that stamp it.
    pub fn clock(&self) -> &Arc<WriteClock> {
        &self.clock
    }

    /// Whether the copy of the claim `(namespace, name)` a decision was taken on can be
    /// confirmed without a read of its own, and how.
    pub async fn check(&self, namespace: &str, name: &str) -> Fresh {
        let (version, caught) = match self.version_from_writes().await {
            Some(version) => (version, "write_clocked"),
            None => match ask(&self.versions).await {
                None => return self.counted("alone", Fresh::Read),
                Some(Answer::Version(v)) => (v, "caught_up"),
                Some(_) => return self.counted("failed", Fresh::Read),
            },
        };
        if self.progress.wait_for(version, self.catch_up).await {
            return self.counted(caught, Fresh::Caught);
        }
        debug!(
            version,
            reached = self.progress.reached(),
            "the claim cache did not catch up in time: asking a listing round"
        );
        match ask(&self.listings).await {
            None => self.counted("timed_out", Fresh::Read),
            Some(Answer::Listing(claims)) => {
                let key = (namespace.to_string(), name.to_string());
                self.counted("listed", Fresh::Listed(claims.get(&key).cloned()))
            }
            Some(_) => self.counted("failed", Fresh::Read),
        }
    }

    /// A version from the first PV create dispatched after now, while the clock is trusted and a
    /// create is on its way (queued, in flight, or work waits for a token).
    async fn version_from_writes(&self) -> Option<u64> {
        let work_waits = self
            .bucket
            .as_ref()
            .is_some_and(SharedBucket::work_is_waiting);
        if !self.clock.trusted() || !(self.clock.busy() || work_waits) {
            return None;
        }
        let seq0 = self.clock.now();
        self.clock.version_after(seq0, self.catch_up).await
    }

    fn counted(&self, outcome: &str, answer: Fresh) -> Fresh {
        self.metrics.freshness(outcome);
        answer
    }
}

/// Asks the rounds of one kind; `None`: read the claim (alone, or the rounds are gone).
async fn ask(rounds: &mpsc::UnboundedSender<Ask>) -> Option<Answer> {
    let (tx, rx) = oneshot::channel();
    rounds.send(tx).ok()?;
    rx.await.ok().flatten()
}

/// The request of one kind of round.
#[derive(Clone)]
struct Requests {
    client: kube::Client,
    kind: Kind,
    /// The label selector of the claims pending for us (listing rounds).
    selector: String,
}

impl Requests {
    /// The round's consistent list, its first page carrying `dispatch`.
    async fn send(self, dispatch: Dispatch) -> Answer {
        let answer = match self.kind {
            Kind::Version => self.version(dispatch).await,
            Kind::Listing => self.listing(dispatch).await,
        };
        answer.unwrap_or_else(|e| {
            debug!(round = self.kind.name(), error = %e, "freshness round: the API server could not be asked");
            Answer::Failed
        })
    }

    async fn page(
        &self,
        params: &ListParams,
        dispatch: Option<Dispatch>,
    ) -> kube::Result<ObjectList<PartialObjectMeta<PersistentVolumeClaim>>> {
        let request = kube::core::Request::new("/api/v1/persistentvolumeclaims");
        let mut req = request
            .list_metadata(params)
            .map_err(kube::Error::BuildRequest)?;
        if let Some(dispatch) = dispatch {
            req.extensions_mut().insert(dispatch);
        }
        req.extensions_mut().insert("list_metadata");
        self.client.request(req).await
    }

    /// The API server's current resourceVersion of claims: a consistent list of at most one,
    /// whose resourceVersion is the collection's.
    async fn version(&self, dispatch: Dispatch) -> kube::Result<Answer> {
        let list = self
            .page(&ListParams::default().limit(1), Some(dispatch))
            .await?;
        Ok(list
            .metadata
            .resource_version
            .and_then(|v| v.parse().ok())
            .map_or(Answer::Failed, Answer::Version))
    }

    /// The claims pending for us, each with its UID and resourceVersion, as of one consistent
    /// snapshot (the pages after the first continue it).
    async fn listing(&self, dispatch: Dispatch) -> kube::Result<Answer> {
        let mut claims = HashMap::new();
        let mut params = ListParams::default().labels(&self.selector).limit(PAGE);
        let mut dispatch = Some(dispatch);
        loop {
            let list = self.page(&params, dispatch.take()).await?;
            for item in list.items {
                let meta = item.metadata;
                if let (Some(ns), Some(name), Some(uid), Some(rv)) =
                    (meta.namespace, meta.name, meta.uid, meta.resource_version)
                {
                    let claim = ListedClaim {
                        uid,
                        resource_version: rv,
                    };
                    claims.insert((ns, name), claim);
                }
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => params.continue_token = Some(next),
                None => return Ok(Answer::Listing(Arc::new(claims))),
            }
        }
    }
}

/// The rounds of one kind: one gathering at a time, its request in flight while the next
/// gathers.
struct Rounds {
    requests: Requests,
    asks: mpsc::UnboundedReceiver<Ask>,
    bucket: Option<SharedBucket>,
    metrics: Arc<Metrics>,
    min_round: usize,
    clock: Arc<WriteClock>,
    catch_up: Duration,
}

impl Rounds {
    fn work_waits(&self) -> bool {
        self.bucket
            .as_ref()
            .is_some_and(SharedBucket::work_is_waiting)
    }

    async fn run(mut self) {
        let mut next: Vec<Ask> = Vec::new();
        loop {
            if next.is_empty() {
                match self.asks.recv().await {
                    Some(first) => next.push(first),
                    None => return,
                }
            }
            let mut members = std::mem::take(&mut next);
            while let Ok(more) = self.asks.try_recv() {
                members.push(more);
            }
            if members.len() < self.min_round && !self.work_waits() {
                for ask in members {
                    let _ = ask.send(None);
                }
                continue;
            }
            self.gather(members, &mut next).await;
        }
    }

    /// Sends the round's request and takes in every ask until it is dispatched; asks that come
    /// after go to `next`. Answers the members once the request is answered (in a task of its
    /// own when the round was dispatched before its answer came).
    async fn gather(&mut self, mut members: Vec<Ask>, next: &mut Vec<Ask>) {
        let (dispatch, mut dispatched) = Dispatch::new();
        // What the clock's comparison starts from: completions before the list leaves.
        let before = self.clock.before_list();
        let (clock, wait) = (self.clock.clone(), self.catch_up);
        let compare = move |answer: &Answer| {
            if let Answer::Version(version) = *answer {
                tokio::spawn(async move { clock.compare(before, version, wait).await });
            }
        };
        let mut request = Box::pin(self.requests.clone().send(dispatch.clone()));
        let mut open = true;
        let answered = loop {
            tokio::select! {
                biased;
                answer = &mut request => break Some(answer),
                _ = &mut dispatched => break None,
                ask = self.asks.recv(), if open => match ask {
                    // An ask read after the request left (the signal not seen yet by this
                    // select) is the next round's: its decision may have begun after.
                    Some(ask) if dispatch.fired() => {
                        next.push(ask);
                        break None;
                    }
                    Some(ask) => members.push(ask),
                    None => open = false,
                },
            }
        };
        self.metrics.round(self.requests.kind.name(), members.len());
        match answered {
            Some(answer) => {
                compare(&answer);
                reply(members, answer)
            }
            None => {
                tokio::spawn(async move {
                    let answer = request.await;
                    compare(&answer);
                    reply(members, answer)
                });
            }
        }
    }
}

fn reply(members: Vec<Ask>, answer: Answer) {
    debug!(claims = members.len(), "freshness round answered");
    for ask in members {
        let _ = ask.send(Some(answer.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use http_body_util::BodyExt;
    use hyper::body::Bytes;
    use tower::ServiceBuilder;

    use super::*;
    use crate::kube::dispatch::DispatchLayer;
    use crate::kube::throttle::Lane;

    /// An API server that answers every list with the version of its count of lists so far
    /// (10, 11, ...), recording each list's query.
    fn server(
        seen: Arc<Mutex<Vec<String>>>,
    ) -> impl Clone
    + Send
    + 'static
    + tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<http_body_util::Full<Bytes>>,
        Error = tower::BoxError,
        Future = impl Send,
    > {
        tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                let query = req.uri().query().unwrap_or_default().to_string();
                let _ = req.into_body().collect().await;
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(query);
                    seen.len()
                };
                let body = serde_json::json!({"apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadataList",
                    "metadata": {"resourceVersion": (9 + n).to_string()}, "items": []});
                Ok::<_, tower::BoxError>(http::Response::new(http_body_util::Full::new(
                    Bytes::from(body.to_string()),
                )))
            }
        })
    }

    /// Rounds on a client throttled by `bucket` (the priority lane), whose server `seen` records.
    fn freshness(
        bucket: &SharedBucket,
        seen: &Arc<Mutex<Vec<String>>>,
        min_round: usize,
    ) -> (Freshness, Progress) {
        with_clock(bucket, seen, min_round, WriteClock::new(true))
    }

    fn with_clock(
        bucket: &SharedBucket,
        seen: &Arc<Mutex<Vec<String>>>,
        min_round: usize,
        clock: Arc<WriteClock>,
    ) -> (Freshness, Progress) {
        let svc = ServiceBuilder::new()
            .layer(bucket.layer(Lane::Priority))
            .layer(DispatchLayer)
            .service(server(seen.clone()));
        let client = kube::Client::new(svc, "default");
        let progress = Progress::default();
        let freshness = Freshness::start(FreshnessConfig {
            client,
            progress: progress.clone(),
            bucket: Some(bucket.clone()),
            metrics: Arc::new(Metrics::unregistered()),
            driver: "d".into(),
            catch_up: Duration::from_millis(500),
            min_round,
            clock,
        });
        (freshness, progress)
    }

    #[tokio::test(start_paused = true)]
    async fn checks_that_ask_while_the_rounds_list_waits_for_a_token_share_it() {
        let bucket = SharedBucket::new(1.0, 1);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (freshness, progress) = freshness(&bucket, &seen, 1);
        progress.reach(1_000);
        // The one token is gone: the first round's list waits a second for the next.
        let _ = bucket.take_for_test(Lane::Work);
        let first = tokio::spawn({
            let f = freshness.clone();
            async move { f.check("ns", "a").await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let joined = tokio::spawn({
            let f = freshness.clone();
            async move { f.check("ns", "b").await }
        });
        assert_eq!(first.await.unwrap(), Fresh::Caught);
        assert_eq!(joined.await.unwrap(), Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 1, "one list for both");
        // After it left, a new check needs a round of its own.
        assert_eq!(freshness.check("ns", "c").await, Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_check_reads_unless_work_waits_for_a_token_then_it_starts_a_round() {
        let bucket = SharedBucket::new(1.0, 1);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (freshness, progress) = freshness(&bucket, &seen, 2);
        progress.reach(1_000);
        assert_eq!(
            freshness.check("ns", "a").await,
            Fresh::Read,
            "nothing waits"
        );
        assert!(seen.lock().unwrap().is_empty());
        // Work now waits for a token: a list serves everyone who asks while it waits.
        let _ = bucket.take_for_test(Lane::Work);
        let _ = bucket.take_for_test(Lane::Work);
        assert!(bucket.work_is_waiting());
        assert_eq!(freshness.check("ns", "a").await, Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_the_cache_does_not_catch_up_with_is_followed_by_one_listing_round() {
        let bucket = SharedBucket::new(1000.0, 1000);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (freshness, _progress) = freshness(&bucket, &seen, 1);
        let checks: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let f = freshness.clone();
                tokio::spawn(async move { f.check("ns", name).await })
            })
            .collect();
        for check in checks {
            assert_eq!(check.await.unwrap(), Fresh::Listed(None));
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.len(),
            2,
            "one version round, one listing round: {seen:?}"
        );
        assert!(seen[0].contains("limit=1"), "{seen:?}");
        assert!(
            seen[1].contains("labelSelector=csi-provisioner.rs%2Fprovisioning%3Dd"),
            "{seen:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn during_a_burst_the_version_comes_from_our_own_create_at_no_request() {
        let bucket = SharedBucket::new(1000.0, 1000);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let clock = WriteClock::new(true);
        let (freshness, progress) = with_clock(&bucket, &seen, 1, clock.clone());
        // Not trusted yet: a round's list answers (and the clock is compared with it).
        let queued = clock.stamp();
        progress.reach(100);
        assert_eq!(freshness.check("ns", "a").await, Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 1);
        clock.trust_for_test();
        // A create of another claim is queued: its version answers, once it has left.
        let check = tokio::spawn({
            let f = freshness.clone();
            async move { f.check("ns", "b").await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        queued.dispatched();
        queued.complete(Some("90"));
        assert_eq!(check.await.unwrap(), Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 1, "no request of its own");
        // No create on its way: a round again.
        assert_eq!(freshness.check("ns", "c").await, Fresh::Caught);
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
