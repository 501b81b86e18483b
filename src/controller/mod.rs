//! The reconcilers. Each reads from the reflector caches to *find* work,
//! re-reads from the API server before any irreversible act (DESIGN §2.2),
//! decides through the pure `provision` module, acts, and records events.
//!
//! kube-runtime's `Controller` gives us the work queue: one reconcile per
//! object at a time, deduplicated triggers, bounded concurrency. What it lacks
//! — per-object exponential backoff that the object's own updates do not cut
//! short — lives in [`memory`].
//!
//! Each controller has its own context (`claim::Context`, `volume::Context`):
//! its memory, its caches, its bounds, and the [`Shared`] part every
//! controller reads. The tasks beside them (capacity, the snapshot sweep)
//! take only the parts they use.

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

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::reflector::Store;

use crate::csi::CsiClient;
use crate::kube::slim::Pv;
use crate::kube::{EventRecorder, LeaderGate};
use crate::metrics::Metrics;
use crate::provision::{DriverInfo, SecretRef};

/// What every controller shares: the clients, who the driver is, where this
/// replica runs, how it reports, and the class cache. Built once in `run`;
/// each controller's own state is in its context (`claim::Context`,
/// `volume::Context`), which holds this one.
pub struct Shared {
    /// The work lane of the API client: every step of provisioning and deletion.
    pub client: Client,
    pub csi: CsiClient,
    pub driver: DriverInfo,
    /// Where this replica runs: centrally, or one per node (`--node-deployment`).
    pub place: node::Placement,
    /// Events, sent in the background lane.
    pub recorder: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub leader: LeaderGate,
    /// StorageClasses, for finding work, never for deciding an irreversible
    /// act (DESIGN §2.2): a claim's class, the provisioner secret of a PV
    /// from before the deletion-secret annotations.
    pub classes: Store<StorageClass>,
    /// With `--enable-capacity`: poked when a volume was provisioned or
    /// deleted, so that the capacity objects follow at once.
    pub capacity: Option<Arc<tokio::sync::Notify>>,
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

impl Shared {
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
