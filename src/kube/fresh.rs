//! One consistent read shared by many decisions (DESIGN §2.2): instead of a
//! write fenced on each claim's resourceVersion, a round asks the API server
//! once for its current resourceVersion (a consistent list of one claim), and
//! every decision that began before that request was sent waits until the
//! claim cache has caught up with it. The cache then shows each claim as it
//! is at least as of a moment after its decision began: a stale copy can no
//! longer be taken for the claim.
//!
//! A round is worth it only when it is shared: a decision that would be alone
//! in its round is told so at once, and makes its own fenced write (the same
//! one request, no wait). A cache that does not catch up quickly (a trickle
//! of changes, a stalled watch) is no answer either: the decision falls back
//! to the fenced write. Correctness never waits on a round.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::ListParams;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::watch::Progress;

/// How long a decision waits for the cache to catch up with its round.
const CATCH_UP: Duration = Duration::from_millis(500);
/// How long a round gathers asks after its first: decisions taken in a
/// burst a few milliseconds apart share one request, and a lone one waits
/// no longer than this for company.
const GATHER: Duration = Duration::from_millis(10);

/// What a freshness check answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// The cache has caught up with a resourceVersion the API server gave
    /// after the check began: decide on the cache.
    Caught,
    /// No round to share, or the cache did not catch up in time, or the
    /// API server could not be asked: confirm with a fenced write.
    Unknown,
}

/// Starts and answers rounds; cheap to share.
#[derive(Clone)]
pub struct Freshness {
    asks: mpsc::UnboundedSender<oneshot::Sender<Option<u64>>>,
    progress: Progress,
}

impl Freshness {
    /// Rounds over the claims `client` lists, for the cache whose progress
    /// is `progress`. The task lives as long as a handle does.
    pub fn start(client: kube::Client, progress: Progress) -> Freshness {
        Freshness::sharing(client, progress, 2)
    }

    /// Rounds that start with at least `min_round` asks (tests use 1).
    pub fn sharing(client: kube::Client, progress: Progress, min_round: usize) -> Freshness {
        let (asks, rx) = mpsc::unbounded_channel();
        tokio::spawn(rounds(Api::all(client), rx, min_round));
        Freshness { asks, progress }
    }

    /// Whether the claim cache is now at least as new as the API server was
    /// after this call began.
    pub async fn check(&self) -> Fresh {
        let (tx, rx) = oneshot::channel();
        if self.asks.send(tx).is_err() {
            return Fresh::Unknown;
        }
        match rx.await {
            Ok(Some(version)) if self.progress.wait_for(version, CATCH_UP).await => Fresh::Caught,
            Ok(Some(version)) => {
                debug!(
                    version,
                    reached = self.progress.reached(),
                    "the claim cache did not catch up in time"
                );
                Fresh::Unknown
            }
            _ => Fresh::Unknown,
        }
    }
}

/// The rounds: the asks that come within [`GATHER`] of a round's first share
/// its one request; asks that come while it is in flight wait for the next
/// round (the version must come from a request sent after they began). A
/// lone ask gets `None`.
async fn rounds(
    api: Api<PersistentVolumeClaim>,
    mut asks: mpsc::UnboundedReceiver<oneshot::Sender<Option<u64>>>,
    min_round: usize,
) {
    while let Some(first) = asks.recv().await {
        let mut round = vec![first];
        let until = tokio::time::Instant::now() + GATHER;
        while let Ok(Some(more)) = tokio::time::timeout_at(until, asks.recv()).await {
            round.push(more);
        }
        let version = if round.len() < min_round {
            None
        } else {
            current_version(&api).await
        };
        debug!(claims = round.len(), ?version, "freshness round");
        for ask in round {
            let _ = ask.send(version);
        }
    }
}

/// The API server's current resourceVersion of claims: a consistent list of
/// at most one, whose list resourceVersion is that of the whole collection.
async fn current_version(api: &Api<PersistentVolumeClaim>) -> Option<u64> {
    let params = ListParams::default().limit(1);
    match api.list_metadata(&params).await {
        Ok(list) => list.metadata.resource_version?.parse().ok(),
        Err(e) => {
            debug!(error = %e, "freshness round: the API server could not say its version");
            None
        }
    }
}
