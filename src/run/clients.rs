//! The sidecar's API clients and its rate limit: `--kube-api-qps/-burst` as
//! one token bucket shared by three lanes (the watches' and freshness
//! rounds' priority, work, and the background's events and tidying), each a
//! client of its own so that none queues behind another's requests, an
//! unthrottled client for the Lease, and the capacity client with a limit of
//! its own; plus what start-up asks discovery.

use std::path::PathBuf;

use kube::Client;
use tracing::{info, warn};

use super::FatalError;
use crate::config::{ClientConfig, RateLimit};
use crate::kube::activity::{Activity, ActivityLayer};
use crate::kube::client;
use crate::kube::throttle::{Lane, SharedBucket, ThrottleLayer};

/// The lanes of one rate limit, and where further clients come from.
pub(super) struct Clients {
    /// The caches' watches and the freshness rounds: the next token, ahead of
    /// queued work.
    pub priority: Client,
    /// Every step of provisioning and deletion: as many requests in flight as
    /// `--worker-threads`.
    pub work: Client,
    /// Events and intent releases: a token only while no work request waits.
    pub background: Client,
    /// The shared bucket (none without a rate limit), to ask whether work waits.
    pub bucket: Option<SharedBucket>,
    /// Whether the work lane is busy: events wait for it to be idle.
    pub activity: Activity,
    kubeconfig: Option<PathBuf>,
    master: Option<String>,
}

impl Clients {
    pub(super) async fn new(cfg: ClientConfig, workers: usize) -> Result<Clients, FatalError> {
        let ClientConfig {
            master,
            kubeconfig,
            rate_limit,
        } = cfg;
        let bucket = bucket(rate_limit);
        let lane = |lane| bucket.as_ref().map(|b| b.layer(lane));
        let activity = Activity::new(bucket.clone());
        let build = |throttle, in_flight, counted: Option<ActivityLayer>| {
            build_with(
                kubeconfig.as_ref(),
                master.as_deref(),
                throttle,
                in_flight,
                counted,
            )
        };
        let single = client::REQUESTS_IN_FLIGHT;
        let priority = build(lane(Lane::Priority), single, None).await?;
        let work_in_flight = workers.max(single);
        let work = build(lane(Lane::Work), work_in_flight, Some(activity.layer())).await?;
        let background = build(lane(Lane::Background), single, None).await?;
        Ok(Clients {
            priority,
            work,
            background,
            bucket,
            activity,
            kubeconfig,
            master,
        })
    }

    /// The Lease's client: never throttled by provisioning work.
    pub(super) async fn unthrottled(&self) -> Result<Client, FatalError> {
        build(self.kubeconfig.as_ref(), self.master.as_deref(), None).await
    }

    /// A client with a token bucket of its own (capacity tracking's:
    /// `--kube-api-capacity-qps/-burst`).
    pub(super) async fn limited(&self, rate_limit: RateLimit) -> Result<Client, FatalError> {
        let throttle = bucket(rate_limit).map(|b| b.layer(Lane::Work));
        build(self.kubeconfig.as_ref(), self.master.as_deref(), throttle).await
    }
}

async fn build(
    kubeconfig: Option<&PathBuf>,
    master: Option<&str>,
    throttle: Option<ThrottleLayer>,
) -> Result<Client, FatalError> {
    build_with(
        kubeconfig,
        master,
        throttle,
        client::REQUESTS_IN_FLIGHT,
        None,
    )
    .await
}

async fn build_with(
    kubeconfig: Option<&PathBuf>,
    master: Option<&str>,
    throttle: Option<ThrottleLayer>,
    in_flight: usize,
    activity: Option<ActivityLayer>,
) -> Result<Client, FatalError> {
    let kubeconfig = kubeconfig.map(PathBuf::as_path);
    Ok(client::build_with(kubeconfig, master, throttle, in_flight, activity).await?)
}

fn bucket(rate_limit: RateLimit) -> Option<SharedBucket> {
    match rate_limit {
        RateLimit::Unlimited => None,
        RateLimit::TokenBucket { qps, burst } => Some(SharedBucket::new(qps, burst)),
    }
}

/// Whether discovery of `snapshot.storage.k8s.io/v1` lists VolumeSnapshot
/// (the CRDs are installed); a failed discovery counts as no.
pub(super) async fn serves_volume_snapshots(client: &Client) -> bool {
    match client
        .list_api_group_resources("snapshot.storage.k8s.io/v1")
        .await
    {
        Ok(list) => list.resources.iter().any(|r| r.kind == "VolumeSnapshot"),
        Err(e) => {
            info!(error = %e, "snapshot.storage.k8s.io/v1 is not served: no snapshot sweep");
            false
        }
    }
}

/// Whether discovery of `storage.k8s.io/v1` lists VolumeAttributesClass: the
/// feature gate when the command line does not set it. A failed discovery
/// leaves the gate on (upstream turns it off only when discovery succeeds
/// without the kind).
pub(super) async fn serves_volume_attributes_class(client: &Client) -> bool {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list) => {
            let served = list
                .resources
                .iter()
                .any(|r| r.kind == "VolumeAttributesClass");
            if !served {
                info!(
                    "the API server does not serve storage.k8s.io/v1 VolumeAttributesClass: feature gate VolumeAttributesClass off"
                );
            }
            served
        }
        Err(e) => {
            warn!(error = %e, "discovery of storage.k8s.io/v1 failed; keeping VolumeAttributesClass on");
            true
        }
    }
}
