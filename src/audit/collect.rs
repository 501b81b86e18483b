//! What the audit looks at, read through the same clients the sidecar uses:
//! the driver (Identity, capabilities, `ListVolumes`) and the API server (lists
//! of PersistentVolumes and claims). Nothing here writes: the only calls are
//! reads, which is what makes the audit read-only by construction.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use kube::api::{ListParams, ObjectList};
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use super::args::AuditConfig;
use crate::csi::{ConnectError, CsiClient, DriverCapabilities, pb, with_sources};
use crate::keys;
use crate::kube::slim::Pv;
use crate::metrics::Metrics;
use crate::provision::migration;

/// Objects per page of a list from the API server.
const PAGE: u32 = 500;
/// Volumes per page asked of the driver (it may return fewer).
const VOLUMES_PAGE: i32 = 500;
/// A listing the driver refuses with `ABORTED` (its volumes changed between
/// pages, so a token went stale) is started again this many times.
const LIST_ATTEMPTS: u32 = 3;

/// Why the audit could not be made. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("CSI driver probe failed: {0}")]
    Probe(tonic::Status),
    #[error("CSI driver is not ready (Probe answered ready=false)")]
    NotReady,
    #[error(transparent)]
    Identify(#[from] crate::csi::IdentifyError),
    #[error("ListVolumes failed: {0}")]
    ListVolumes(tonic::Status),
    #[error("ListVolumes returned the page token {0:?} twice; the listing would never end")]
    ListVolumesLoop(String),
    #[error("{0}")]
    KubeConfig(String),
    #[error("failed to list {what}: {}", with_sources(source))]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The volumes the driver holds, when it can say.
#[derive(Clone, Debug, PartialEq)]
pub enum Backend {
    /// Every volume `ListVolumes` returned, by volume ID.
    Listed(BTreeMap<String, pb::Volume>),
    /// The driver has no `LIST_VOLUMES` capability.
    Unlisted,
}

/// One look at both sides. The PersistentVolumes are listed twice, before and
/// after `ListVolumes`, so that a PersistentVolume that existed at any moment
/// of the listing is seen (a volume is an orphan only if no PersistentVolume
/// pointed to it in either list), and one that existed throughout it is
/// known (only such a PersistentVolume can be said to have lost its volume).
#[derive(Clone, Debug)]
pub struct Inventory {
    pub driver: String,
    pub backend: Backend,
    /// The driver's PersistentVolumes, listed before `ListVolumes`: its CSI ones, and the in-tree
    /// ones of the plugin migrated to it (`migration::volume_of`).
    /// Parsed slim and trimmed, as the sidecar's cache holds them.
    pub volumes_before: Vec<Pv>,
    /// The same, listed after `ListVolumes`.
    pub volumes_after: Vec<Pv>,
    /// Every claim in the cluster, listed last, each cut to what the
    /// findings read ([`for_findings`]).
    pub claims: Vec<PersistentVolumeClaim>,
}

/// The driver and the API server, connected.
pub struct Sources {
    csi: CsiClient,
    client: Client,
    driver: String,
    capabilities: DriverCapabilities,
}

impl Sources {
    /// Connects to the driver (retrying for `--timeout`), checks it is ready,
    /// reads its name and capabilities, and builds the Kubernetes client.
    pub async fn connect(cfg: &AuditConfig) -> Result<Sources, AuditError> {
        let metrics = Arc::new(Metrics::unregistered());
        let mut csi =
            CsiClient::connect(&cfg.csi_socket, cfg.timeout, cfg.timeout, metrics).await?;
        let probe = csi.probe().await.map_err(AuditError::Probe)?;
        if !probe.ready.unwrap_or(true) {
            return Err(AuditError::NotReady);
        }
        let (info, capabilities) = csi.identify().await?;
        let client =
            crate::kube::client::build(cfg.kubeconfig.as_deref(), cfg.master.as_deref(), None)
                .await
                .map_err(|e| AuditError::KubeConfig(e.to_string()))?;
        Ok(Sources {
            csi,
            client,
            driver: info.name,
            capabilities,
        })
    }

    /// One look at both sides, in the order [`Inventory`] explains.
    pub async fn inventory(&self) -> Result<Inventory, AuditError> {
        let volumes_before = self.driver_volumes().await?;
        let backend = if self.capabilities.list_volumes {
            Backend::Listed(self.list_backend().await?)
        } else {
            Backend::Unlisted
        };
        let volumes_after = self.driver_volumes().await?;
        let claims = list_all(
            &Api::<PersistentVolumeClaim>::all(self.client.clone()),
            "PersistentVolumeClaims",
            // Their managedFields date a held intent (findings: `sinceFrom`):
            // the entries that wrote it are kept, with their times.
            |claim| Some(for_findings(claim)),
        )
        .await?;
        Ok(Inventory {
            driver: self.driver.clone(),
            backend,
            volumes_before,
            volumes_after,
            claims,
        })
    }

    async fn driver_volumes(&self) -> Result<Vec<Pv>, AuditError> {
        list_all(
            &Api::<Pv>::all(self.client.clone()),
            "PersistentVolumes",
            |mut pv| {
                let ours = migration::volume_of(&pv).is_some_and(|(d, _)| d == self.driver);
                ours.then(|| {
                    pv.trim();
                    pv
                })
            },
        )
        .await
    }

    /// Every page of `ListVolumes`.
    async fn list_backend(&self) -> Result<BTreeMap<String, pb::Volume>, AuditError> {
        let mut attempt = 1;
        loop {
            match self.list_backend_once().await {
                Err(AuditError::ListVolumes(s))
                    if s.code() == tonic::Code::Aborted && attempt < LIST_ATTEMPTS =>
                {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn list_backend_once(&self) -> Result<BTreeMap<String, pb::Volume>, AuditError> {
        let mut volumes = BTreeMap::new();
        let mut token = String::new();
        let mut seen_tokens = std::collections::HashSet::new();
        loop {
            let page = self
                .csi
                .list_volumes(VOLUMES_PAGE, token)
                .await
                .map_err(AuditError::ListVolumes)?;
            for volume in page.entries.into_iter().filter_map(|e| e.volume) {
                volumes.insert(volume.volume_id.clone(), volume);
            }
            if page.next_token.is_empty() {
                return Ok(volumes);
            }
            if !seen_tokens.insert(page.next_token.clone()) {
                return Err(AuditError::ListVolumesLoop(page.next_token));
            }
            token = page.next_token;
        }
    }
}

/// The intent finalizer as a member of a managedFields field set.
pub(super) fn intent_member() -> String {
    format!("v:{}", serde_json::Value::from(keys::FINALIZER_PVC_INTENT))
}

/// Whether a managedFields entry's field set holds `member` among the finalizers.
pub(super) fn wrote(entry: &ManagedFieldsEntry, member: &str) -> bool {
    let fields = entry.fields_v1.as_ref();
    fields
        .and_then(|f| f.0.get("f:metadata")?.get("f:finalizers")?.get(member))
        .is_some()
}

/// A claim cut down to what the findings read of it: its identity, creation
/// and deletion, finalizers, the annotations naming its provisioner, its
/// volume name and phase, and of its managedFields only the entries that
/// wrote the intent, each with its time and that one member. The audit holds
/// every claim of the cluster at once (whole, 20,000 claims took 423 MiB).
pub fn for_findings(claim: PersistentVolumeClaim) -> PersistentVolumeClaim {
    let member = intent_member();
    let meta = claim.metadata;
    let intent_entries: Vec<ManagedFieldsEntry> = (meta.managed_fields.into_iter().flatten())
        .filter(|entry| wrote(entry, &member))
        .map(|entry| ManagedFieldsEntry {
            time: entry.time,
            fields_v1: Some(FieldsV1(serde_json::json!(
                {"f:metadata": {"f:finalizers": {member.as_str(): {}}}}
            ))),
            ..Default::default()
        })
        .collect();
    // What `ClaimView::asks` reads.
    let asks = [
        keys::ANN_STORAGE_PROVISIONER,
        keys::ANN_BETA_STORAGE_PROVISIONER,
        keys::ANN_MIGRATED_TO,
    ];
    let annotations = meta.annotations.map(|mut a| {
        a.retain(|k, _| asks.contains(&k.as_str()));
        a
    });
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            finalizers: meta.finalizers,
            annotations,
            managed_fields: (!intent_entries.is_empty()).then_some(intent_entries),
            ..Default::default()
        },
        spec: claim.spec.map(|s| PersistentVolumeClaimSpec {
            volume_name: s.volume_name,
            ..Default::default()
        }),
        status: claim.status.map(|s| PersistentVolumeClaimStatus {
            phase: s.phase,
            ..Default::default()
        }),
    }
}

/// Every object of a kind, page by page, as `sort` leaves it (`None`: not
/// kept). Each page is sorted out as it comes, so only what is kept is held
/// (holding every PV and claim whole, the audit of 50,000 pairs peaked at
/// 1.7 GiB; the scale profile, 2026-12-07).
async fn list_all<K>(
    api: &Api<K>,
    what: &'static str,
    sort: impl Fn(K) -> Option<K>,
) -> Result<Vec<K>, AuditError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page: ObjectList<K> = api
            .list(&params)
            .await
            .map_err(|source| AuditError::List { what, source })?;
        items.extend(page.items.into_iter().filter_map(&sort));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(items),
        }
    }
}
