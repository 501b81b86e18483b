//! The reconcilers. Each reads from the reflector caches to *find* work,
//! re-reads from the API server before any irreversible act (DESIGN §2.2),
//! decides through the pure `provision` module, acts, and records events.
//!
//! kube-runtime's `Controller` gives us the work queue: one reconcile per
//! object at a time, deduplicated triggers, bounded concurrency. What it lacks
//! — per-object exponential backoff that the object's own updates do not cut
//! short — lives in [`memory`].

pub mod backend;
pub mod capacity;
pub mod claim;
pub mod memory;
pub mod node;
pub mod queue;
#[cfg(test)]
pub mod scripted;
pub mod snapshot_sweep;
pub mod topology;
pub mod volume;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;

use crate::csi::CsiClient;
use crate::kube::slim::{Claim, Pv};
use crate::kube::watch::Progress;
use crate::kube::{EventRecorder, LeaderGate, Listed};
use crate::metrics::Metrics;
use crate::provision::{DriverInfo, ProvisionOptions, SecretRef};
use claim::intent::IntentMode;
use claim::{ClaimMemory, IntentReleaser};

/// Everything the reconcilers share. Built once in `run`.
pub struct Context {
    /// The work lane of the API client: every step of provisioning and deletion.
    pub client: Client,
    pub csi: CsiClient,
    pub driver: DriverInfo,
    pub options: ProvisionOptions,
    /// Events, sent in the background lane.
    pub recorder: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub leader: LeaderGate,
    pub caches: Caches,
    /// What the claim path remembers, per claim UID.
    pub claims: Arc<ClaimMemory>,
    /// Releases of intents that are no longer needed, in the background lane.
    pub intents: IntentReleaser,
    /// Who makes the provisioning intent durable: the sidecar or the control plane.
    pub intent: IntentMode,
    /// What the volume path remembers.
    pub volumes: VolumeMemory,
    /// With `--enable-capacity`: poked when a volume was provisioned or
    /// deleted, so that the capacity objects follow at once.
    pub capacity: Option<Arc<tokio::sync::Notify>>,
    /// `--cloning-protection-threads`: how many removals of the cloning
    /// protection run at once (the workers of upstream's cloning-protection
    /// controller; here the claim workers do the work, this bounds it).
    pub clone_releases: tokio::sync::Semaphore,
    /// Where this replica runs: centrally, or one per node (`--node-deployment`).
    pub place: node::Placement,
    /// `--worker-threads`: how many claims are in `CreateVolume` and the PV
    /// save at once (what upstream's workers bound), taken first come first
    /// served once a claim's check is done; the checks themselves wait for no
    /// permit, so they overlap the creates in flight.
    pub creates: tokio::sync::Semaphore,
}

/// The reflector caches: for finding work, never for deciding an
/// irreversible act (DESIGN §2.2).
pub struct Caches {
    pub classes: Store<StorageClass>,
    /// PVs in their slim shape. Trusted for one answer only: a PV seen bound
    /// to a claim's UID did exist.
    pub volumes: Store<Pv>,
    /// The PV cache holds its first list (wakes any number of waiters, which
    /// `Store::wait_until_ready` does not).
    pub volumes_listed: Listed,
    pub claims: Store<Claim>,
    /// The claim cache holds its first list: before it, the cache cannot say
    /// that no claim waits for something.
    pub claims_listed: Listed,
    /// How far the claim cache has caught up with the API server.
    pub claims_progress: Progress,
    /// VolumeAttachments, for a driver with `PUBLISH_UNPUBLISH_VOLUME` only:
    /// a PV one of them still names is not deleted yet (upstream's `vaLister`).
    pub attachments: Option<Attachments>,
    /// Namespaces, metadata only and trimmed to the listed keys, when a
    /// request carries namespace metadata (`--extra-create-metadata-namespace-*`).
    pub namespaces: Option<Store<PartialObjectMeta<Namespace>>>,
    /// CSINodes and Nodes (metadata only), when claims get accessibility
    /// requirements from the cluster (`provision::topology::served`, a
    /// central replica).
    pub topology: Option<topology::TopologyCaches>,
}

/// The VolumeAttachment cache and whether its first list is in.
pub struct Attachments {
    pub store: Store<VolumeAttachment>,
    pub listed: Listed,
}

/// What the volume path remembers, per PV UID.
pub type VolumeMemory = memory::Memory<VolumeEntry>;

#[derive(Default)]
pub struct VolumeEntry {
    /// This process finished the PV's deletion, so a stale cached copy that
    /// still shows it Released with our finalizer costs no second read.
    pub deleted: bool,
}

/// The UID of the claim a PV is bound (or pre-bound) to.
pub fn bound_claim_uid(pv: &Pv) -> Option<&str> {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
}

/// The wait after `failures` failures in a row: `start · 2^failures`, capped
/// at `max` (`--retry-interval-start`, `--retry-interval-max`).
pub fn retry_delay(start: Duration, max: Duration, failures: u32) -> Duration {
    start
        .saturating_mul(2u32.saturating_pow(failures.min(31)))
        .min(max)
}

impl Context {
    /// Tells the capacity tracker (if any) that a volume came or went.
    pub fn capacity_changed(&self) {
        if let Some(trigger) = &self.capacity {
            trigger.notify_one();
        }
    }

    /// Reads the data of a secret the StorageClass refers to.
    pub async fn secret_data(&self, r: &SecretRef) -> Result<HashMap<String, String>, kube::Error> {
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), &r.namespace);
        let secret = api.get(&r.name).await?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// PVs as the sidecar reads, deletes and patches them: the slim shape.
    pub fn pv_api(&self) -> kube::Api<Pv> {
        kube::Api::all(self.client.clone())
    }
}
