//! Every way a step of the volume path can fail, and what each failure means:
//! the event it shows on the PV (reason, type, upstream's text), whether it
//! holds back the attempt that failed, whether it counts as a failed
//! deletion, and a bounded label for logs. [`report`], called by the error
//! policy alone, is the one place that turns a failure into an event and a
//! metric.

use tonic::Status;

use super::Context;
use crate::controller::backend::DeleteError;
use crate::controller::memory::Hold;
use crate::kube::slim::Pv;
use crate::metrics::VolumeLabels;
use crate::names::Reason;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("rpc error: code = {code} desc = {message}", code = crate::csi::code_name(.0.code()), message = .0.message())]
    DeleteVolume(Status),
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("not the leader: not acting")]
    NotLeader,
    /// No volume handle can be read from the PV (no CSI source, or an in-tree
    /// source that does not translate): nothing is touched, retried later.
    #[error("{0}")]
    Invalid(String),
    /// A VolumeAttachment still holds the volume: the deletion waits for the
    /// detach, which is not a failure (upstream v6.4: `canDeleteVolume`'s
    /// `VolumeInUseError`, shown by lib v13.1 as a Normal `VolumeDelete`).
    #[error("persistentvolume {pv} is still attached to node {node}, waiting for detach")]
    Attached { pv: String, node: String },
    /// Whether the volume is attached cannot be told yet (the cache cannot
    /// list VolumeAttachments: RBAC, an API outage): retried, nothing touched.
    #[error("the VolumeAttachments have not been listed yet")]
    AttachmentsNotListed,
}

impl From<DeleteError> for VolumeError {
    fn from(e: DeleteError) -> VolumeError {
        match e {
            DeleteError::NotLeader => VolumeError::NotLeader,
            DeleteError::DeleteVolume(status) => VolumeError::DeleteVolume(status),
        }
    }
}

impl VolumeError {
    /// The event this failure shows on the PV (the reason gives its type).
    /// `None`: only logged, as upstream shows nothing for these either.
    pub fn event(&self) -> Option<Reason> {
        match self {
            VolumeError::Attached { .. } => Some(Reason::VolumeDelete),
            VolumeError::DeleteVolume(_) | VolumeError::Invalid(_) => {
                Some(Reason::VolumeFailedDelete)
            }
            VolumeError::Kube(_) | VolumeError::NotLeader | VolumeError::AttachmentsNotListed => {
                None
            }
        }
    }

    /// Whether the attempt that failed is held back for its backoff (it did
    /// or found something), or only the next look is delayed (nothing was
    /// tried: this replica is not the leader).
    pub fn hold(&self) -> Hold {
        match self {
            VolumeError::NotLeader => Hold::Nothing,
            _ => Hold::Attempt,
        }
    }

    /// Whether this counts in `controller_persistentvolume_delete_failed_total`
    /// (upstream counts a failed `DeleteVolume`, not the steps around it).
    pub fn counts_as_failure(&self) -> bool {
        matches!(self, VolumeError::DeleteVolume(_))
    }

    /// Not a failure at all: the deletion waits for something to happen.
    pub fn is_postponement(&self) -> bool {
        matches!(self, VolumeError::Attached { .. })
    }

    /// A bounded name for logs.
    pub fn label(&self) -> &'static str {
        match self {
            VolumeError::DeleteVolume(_) => "delete_volume",
            VolumeError::Kube(_) => "kube",
            VolumeError::NotLeader => "not_leader",
            VolumeError::Invalid(_) => "invalid",
            VolumeError::Attached { .. } => "attached",
            VolumeError::AttachmentsNotListed => "attachments_not_listed",
        }
    }
}

/// The metric labels of a PV (upstream: `class`).
pub fn labels(pv: &Pv) -> VolumeLabels {
    VolumeLabels {
        class: pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default(),
    }
}

/// Shows a failure on the PV (event, failure metric). The one place that
/// does: the error policy calls it for every failure a reconcile returns.
pub fn report(ctx: &Context, pv: &Pv, err: &VolumeError) {
    if err.counts_as_failure() {
        ctx.shared
            .metrics
            .delete_failed_total
            .get_or_create(&labels(pv))
            .inc();
    }
    if let Some(reason) = err.event() {
        ctx.shared.recorder.record(pv, reason, &err.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::EventType;
    use tonic::Code;

    #[test]
    fn each_failure_knows_its_event_hold_and_metric() {
        let api = kube::Error::Api(Box::new(
            kube::core::Status::failure("boom", "InternalError").with_code(500),
        ));
        // (error, event reason and type, held, counted, text)
        type Row = (
            VolumeError,
            Option<(Reason, EventType)>,
            Hold,
            bool,
            &'static str,
        );
        let rows: Vec<Row> = vec![
            (
                VolumeError::DeleteVolume(Status::new(Code::Internal, "disk busy")),
                Some((Reason::VolumeFailedDelete, EventType::Warning)),
                Hold::Attempt,
                true,
                "rpc error: code = Internal desc = disk busy",
            ),
            (
                VolumeError::Invalid("invalid CSI PV".into()),
                Some((Reason::VolumeFailedDelete, EventType::Warning)),
                Hold::Attempt,
                false,
                "invalid CSI PV",
            ),
            (
                VolumeError::Attached {
                    pv: "pv-1".into(),
                    node: "node-1".into(),
                },
                Some((Reason::VolumeDelete, EventType::Normal)),
                Hold::Attempt,
                false,
                // upstream v6.4's text, which lib v13.1 shows as the Normal event's message.
                "persistentvolume pv-1 is still attached to node node-1, waiting for detach",
            ),
            (
                VolumeError::Kube(api),
                None,
                Hold::Attempt,
                false,
                "kubernetes API error: ApiError: boom",
            ),
            (
                VolumeError::NotLeader,
                None,
                Hold::Nothing,
                false,
                "not the leader: not acting",
            ),
            (
                VolumeError::AttachmentsNotListed,
                None,
                Hold::Attempt,
                false,
                "the VolumeAttachments have not been listed yet",
            ),
        ];
        for (err, event, hold, counted, text) in rows {
            assert_eq!(err.event().map(|r| (r, r.event_type())), event, "{text}");
            assert_eq!(err.hold(), hold, "{text}");
            assert_eq!(err.counts_as_failure(), counted, "{text}");
            assert!(err.to_string().starts_with(text), "{err}");
        }
    }
}
