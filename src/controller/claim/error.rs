//! Every way a step of the claim path can fail, and what each failure means:
//! the event it shows (reason, type, text as upstream writes it), whether it is
//! final, whether it counts as a failed provisioning, and a bounded label for
//! logs. [`report`], called by the error policy alone, is the one place that
//! turns a failure into an event and a metric.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use tonic::Status;

use super::Context;
use crate::controller::backend::DeleteError;
use crate::csi::{CsiErrorClass, code_name};
use crate::keys;
use crate::kube::api_message;
use crate::metrics::ClaimLabels;
use crate::names::Reason;
use crate::provision::{ClaimView, ProvisionError};

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The claim's class is not (yet) in the cache. Upstream shows no event.
    #[error("storageclass.storage.k8s.io {name:?} not found")]
    StorageClassNotFound { name: String },
    /// The request cannot be built from the claim and its class.
    #[error(transparent)]
    Invalid(#[from] ProvisionError),
    #[error("error getting secret {name} in namespace {namespace}: {}", api_message(.source))]
    GetSecret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to get VolumeAttributesClass {name}: {}", api_message(.source))]
    GetVolumeAttributesClass {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The snapshot to restore or the claim to clone cannot be used now
    /// (read live; retried).
    #[error("error getting handle for DataSource Type {kind} by Name {name}: {reason}")]
    DataSource {
        kind: &'static str,
        name: String,
        reason: String,
    },
    /// The ReferenceGrants of a cross-namespace source's namespace could not
    /// be listed.
    #[error(
        "error getting ReferenceGrants in {namespace} namespace from api server: {}",
        api_message(.source)
    )]
    ReadGrants {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    /// The claim's namespace, whose listed metadata the request carries
    /// (`--extra-create-metadata-namespace-*`), could not be read
    /// (upstream PR #1531's text).
    #[error("failed to get namespace {name:?} for create metadata: {}", api_message(.source))]
    ReadNamespace {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The protection finalizer could not be put on the snapshot or claim.
    #[error("{}", api_message(.0))]
    ProtectSource(#[source] kube::Error),
    /// The selected node's CSINode is gone: the scheduler must choose again.
    #[error("failed to get selected CSINode {node}: csinode.storage.k8s.io \"{node}\" not found")]
    SelectedNodeGone { node: String },
    /// Confirming that the selected node's CSINode, missing from its cache, is gone.
    #[error("error generating accessibility requirements: {}", api_message(.0))]
    ReadTopology(#[source] kube::Error),
    /// The fenced write of the intent (or the read after a conflict) failed.
    #[error("failed to record the provisioning intent: {}", api_message(.0))]
    RecordIntent(#[source] kube::Error),
    #[error("rpc error: code = {} desc = {}", code_name(.status.code()), .status.message())]
    CreateVolume {
        status: Status,
        class: CsiErrorClass,
    },
    #[error("error saving PersistentVolume {name}: {}", api_message(.source))]
    SavePv {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The driver made a smaller volume than asked, and deleting it failed.
    #[error("{error}. Cleanup of volume {pv} failed, volume is orphaned: {cleanup}")]
    Orphaned {
        error: ProvisionError,
        pv: String,
        cleanup: Box<ClaimError>,
    },
    /// A PV under our deterministic name belongs to another claim.
    #[error("PersistentVolume {name} exists but is bound to another claim ({other})")]
    PvOfAnotherClaim { name: String, other: String },
    /// Reading the PV or the claim while cleaning up after a deleted claim.
    #[error("failed to read {what}: {}", api_message(.source))]
    Read {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("failed to record the handle of abandoned volume {handle}: {}", api_message(.source))]
    RecordHandle {
        handle: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to release the provisioning intent: {}", api_message(.0))]
    ReleaseIntent(#[source] kube::Error),
    #[error("failed to delete volume {handle}: rpc error: code = {} desc = {}", code_name(.status.code()), .status.message())]
    DeleteVolume { handle: String, status: Status },
    /// The driver answers `AlreadyExists` for the deleted claim's name: the
    /// volume's handle cannot be learned, so the claim is kept, not leaked.
    #[error("cannot clean up the volume of deleted claim: {0}")]
    CleanupBlocked(String),
    #[error("not the leader: not acting")]
    NotLeader,
    /// A deleted claim keeps its cloning protection while a clone of it is
    /// pending: not a failure, looked at again after the claim's backoff.
    #[error("a clone of it is pending: keeping its cloning protection")]
    ClonesPending,
}

impl ClaimError {
    pub fn create_volume(status: Status, class: CsiErrorClass) -> ClaimError {
        ClaimError::CreateVolume { status, class }
    }

    /// A failed deletion of the backend volume `handle`.
    pub fn deleting(handle: &str, e: DeleteError) -> ClaimError {
        match e {
            DeleteError::NotLeader => ClaimError::NotLeader,
            DeleteError::DeleteVolume(status) => ClaimError::DeleteVolume {
                handle: handle.to_string(),
                status,
            },
        }
    }

    /// The event this failure shows on the claim: its reason (which gives its
    /// type). `None`: only logged (upstream shows nothing for these either, or
    /// they are steps of ours that a retry repeats without the user having to act).
    pub fn event(&self) -> Option<Reason> {
        use ClaimError::*;
        match self {
            Invalid(ProvisionError::ExternalPopulator { .. }) => Some(Reason::Provisioning),
            Invalid(_)
            | GetSecret { .. }
            | GetVolumeAttributesClass { .. }
            | DataSource { .. }
            | ReadGrants { .. }
            | ReadNamespace { .. }
            | ProtectSource(_)
            | ReadTopology(_)
            | SelectedNodeGone { .. }
            | CreateVolume { .. }
            | Orphaned { .. }
            | PvOfAnotherClaim { .. } => Some(Reason::ProvisioningFailed),
            CleanupBlocked(_) | DeleteVolume { .. } => Some(Reason::ProvisioningCleanupFailed),
            // Upstream retries a failed PV save in the background and says
            // nothing on the claim; so do we.
            StorageClassNotFound { .. }
            | SavePv { .. }
            | RecordIntent(_)
            | Read { .. }
            | RecordHandle { .. }
            | ReleaseIntent(_)
            | NotLeader
            | ClonesPending => None,
        }
    }

    /// The event source when it is not ours: upstream records the populator
    /// note as its provisioner, not as its controller library.
    pub fn event_source(&self) -> Option<&'static str> {
        match self {
            ClaimError::Invalid(ProvisionError::ExternalPopulator { .. }) => {
                Some(keys::EVENT_SOURCE_PROVISIONER)
            }
            _ => None,
        }
    }

    /// Upstream's `IgnoredError`: reported, then the claim is left alone (no
    /// retry, no failure) until it changes.
    pub fn is_ignored(&self) -> bool {
        matches!(
            self,
            ClaimError::Invalid(ProvisionError::ExternalPopulator { .. })
        )
    }

    /// The event's text, as upstream writes it.
    pub fn message(&self) -> String {
        match self {
            ClaimError::Invalid(ProvisionError::ExternalPopulator { .. }) => {
                "Assuming an external populator will provision the volume".to_string()
            }
            ClaimError::CreateVolume {
                class: CsiErrorClass::Infeasible,
                ..
            } => format!(
                "Volume provisioning failed with infeasible error. Retries will be delayed. {self}"
            ),
            _ => self.to_string(),
        }
    }

    /// Whether retrying the same thing, with nothing else changed, cannot help:
    /// the claim or its class must change first (or, for an infeasible
    /// request, a long time pass).
    pub fn is_final(&self) -> bool {
        use ClaimError::*;
        match self {
            Invalid(_)
            | SelectedNodeGone { .. }
            | Orphaned { .. }
            | PvOfAnotherClaim { .. }
            | CleanupBlocked(_) => true,
            CreateVolume { class, .. } => {
                matches!(class, CsiErrorClass::Final | CsiErrorClass::Infeasible)
            }
            _ => false,
        }
    }

    /// Whether this counts in `controller_persistentvolumeclaim_provision_failed_total`.
    pub fn counts_as_failure(&self) -> bool {
        !self.is_ignored()
            && !matches!(
                self,
                ClaimError::NotLeader | ClaimError::ReleaseIntent(_) | ClaimError::ClonesPending
            )
    }

    /// A bounded name for logs.
    pub fn label(&self) -> &'static str {
        use ClaimError::*;
        match self {
            StorageClassNotFound { .. } => "storage_class_not_found",
            Invalid(_) => "invalid",
            GetSecret { .. } => "get_secret",
            GetVolumeAttributesClass { .. } => "get_volume_attributes_class",
            DataSource { .. } => "data_source",
            ReadGrants { .. } => "read_grants",
            ReadNamespace { .. } => "read_namespace",
            ProtectSource(_) => "protect_source",
            ReadTopology(_) => "read_topology",
            SelectedNodeGone { .. } => "selected_node_gone",
            RecordIntent(_) => "record_intent",
            CreateVolume { .. } => "create_volume",
            SavePv { .. } => "save_pv",
            Orphaned { .. } => "orphaned",
            PvOfAnotherClaim { .. } => "pv_of_another_claim",
            Read { .. } => "read",
            RecordHandle { .. } => "record_handle",
            ReleaseIntent(_) => "release_intent",
            DeleteVolume { .. } => "delete_volume",
            CleanupBlocked(_) => "cleanup_blocked",
            NotLeader => "not_leader",
            ClonesPending => "clones_pending",
        }
    }
}

/// The metric labels of a claim (upstream: `class`, `source`).
pub fn labels(claim: &PersistentVolumeClaim) -> ClaimLabels {
    ClaimLabels {
        class: ClaimView(claim).class().unwrap_or_default().to_string(),
        source: ClaimView(claim)
            .data_source()
            .map(|d| d.kind.to_string())
            .unwrap_or_default(),
    }
}

/// Shows a failure on the claim (event, failure metric). The one place that
/// does: the error policy calls it for every failure a reconcile returns.
pub fn report(ctx: &Context, claim: &PersistentVolumeClaim, err: &ClaimError) {
    if err.counts_as_failure() {
        ctx.shared
            .metrics
            .provision_failed_total
            .get_or_create(&labels(claim))
            .inc();
    }
    match (err.event(), err.event_source()) {
        (Some(reason), None) => ctx.shared.recorder.record(claim, reason, &err.message()),
        (Some(reason), Some(source)) => {
            ctx.shared
                .recorder
                .record_as(source, claim, reason, &err.message())
        }
        (None, _) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "NotFound")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn each_failure_knows_its_event_and_text() {
        use crate::names::EventType::{self, *};
        // (failure, event: type and reason as upstream spells it, its text, final)
        type Row = (
            ClaimError,
            Option<(EventType, &'static str)>,
            &'static str,
            bool,
        );
        let cases: Vec<Row> = vec![
            (
                ClaimError::GetSecret {
                    namespace: "ns".into(),
                    name: "s".into(),
                    source: api(404, "secrets \"s\" not found"),
                },
                Some((Warning, "ProvisioningFailed")),
                "error getting secret s in namespace ns: secrets \"s\" not found",
                false,
            ),
            (
                ClaimError::create_volume(
                    Status::new(Code::InvalidArgument, "bad"),
                    CsiErrorClass::Infeasible,
                ),
                Some((Warning, "ProvisioningFailed")),
                "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = bad",
                true,
            ),
            (
                ClaimError::create_volume(
                    Status::new(Code::DeadlineExceeded, "slow"),
                    CsiErrorClass::InBackground,
                ),
                Some((Warning, "ProvisioningFailed")),
                "rpc error: code = DeadlineExceeded desc = slow",
                false,
            ),
            (
                ClaimError::StorageClassNotFound { name: "c".into() },
                None,
                "storageclass.storage.k8s.io \"c\" not found",
                false,
            ),
            (
                ClaimError::Invalid(ProvisionError::SelectorNotSupported),
                Some((Warning, "ProvisioningFailed")),
                "claim Selector is not supported",
                true,
            ),
            (
                ClaimError::ReadGrants {
                    namespace: "b".into(),
                    source: api(403, "referencegrants is forbidden"),
                },
                Some((Warning, "ProvisioningFailed")),
                "error getting ReferenceGrants in b namespace from api server: referencegrants is forbidden",
                false,
            ),
            (
                ClaimError::ReadNamespace {
                    name: "team-a".into(),
                    source: api(404, "namespaces \"team-a\" not found"),
                },
                Some((Warning, "ProvisioningFailed")),
                "failed to get namespace \"team-a\" for create metadata: namespaces \"team-a\" not found",
                false,
            ),
            (
                ClaimError::NotLeader,
                None,
                "not the leader: not acting",
                false,
            ),
            (
                ClaimError::Invalid(ProvisionError::ExternalPopulator {
                    kind: "Backup".into(),
                }),
                Some((Normal, "Provisioning")),
                "Assuming an external populator will provision the volume",
                true,
            ),
        ];
        for (err, event, text, fin) in cases {
            let shown = err.event().map(|r| (r.event_type(), r.as_str()));
            assert_eq!(shown, event, "{err:?}");
            assert_eq!(err.message(), text);
            assert_eq!(err.is_final(), fin, "{err:?}");
        }
    }

    #[test]
    fn only_acts_count_as_failures() {
        let populator = ClaimError::Invalid(ProvisionError::ExternalPopulator {
            kind: "Backup".into(),
        });
        assert!(populator.is_ignored() && !populator.counts_as_failure());
        assert_eq!(populator.event_source(), Some("external-provisioner"));
        assert!(!ClaimError::NotLeader.counts_as_failure());
        assert!(ClaimError::StorageClassNotFound { name: "c".into() }.counts_as_failure());
    }
}
