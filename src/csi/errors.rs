//! The one place that maps a CSI call's outcome to what happens next
//! (DESIGN §2.7). Everything else asks [`classify`].
//! upstream: external-provisioner pkg/controller/controller.go checkError.

use tonic::Code;

/// What a failed CSI `CreateVolume` means for the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsiErrorClass {
    /// The driver may still be creating the volume (or did and we lost the
    /// answer): keep the durable intent and call again with the same name.
    InBackground,
    /// The selected node cannot host the volume: drop the selected-node
    /// annotation so the scheduler picks another node.
    Reschedule,
    /// The request can never succeed as it is (`InvalidArgument`): retry only
    /// slowly, at the maximum retry interval, until the StorageClass changes.
    Infeasible,
    /// The driver definitely did not create the volume: report and retry with
    /// per-claim exponential backoff.
    Final,
}

/// Classifies a `CreateVolume` error code. `reschedulable` is true when the
/// claim has a selected node and the driver supports topology: only then does
/// `ResourceExhausted` move the claim to another node.
pub fn classify(code: Code, reschedulable: bool) -> CsiErrorClass {
    match code {
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted => {
            CsiErrorClass::InBackground
        }
        Code::ResourceExhausted if reschedulable => CsiErrorClass::Reschedule,
        Code::InvalidArgument => CsiErrorClass::Infeasible,
        // `Ok` never reaches here; anything else is a definite "not created".
        _ => CsiErrorClass::Final,
    }
}

impl CsiErrorClass {
    /// Whether a volume with the requested name may exist on the backend after
    /// this error, i.e. whether giving up would risk a leak.
    pub fn volume_may_exist(self) -> bool {
        matches!(self, CsiErrorClass::InBackground)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_class() {
        use CsiErrorClass::*;
        let table = [
            (Code::Cancelled, false, InBackground),
            (Code::DeadlineExceeded, false, InBackground),
            (Code::DeadlineExceeded, true, InBackground),
            (Code::Unavailable, false, InBackground),
            (Code::Aborted, false, InBackground),
            (Code::ResourceExhausted, true, Reschedule),
            (Code::ResourceExhausted, false, Final),
            (Code::InvalidArgument, false, Infeasible),
            (Code::InvalidArgument, true, Infeasible),
            (Code::NotFound, false, Final),
            (Code::AlreadyExists, false, Final),
            (Code::FailedPrecondition, false, Final),
            (Code::OutOfRange, false, Final),
            (Code::Internal, false, Final),
            (Code::Unimplemented, false, Final),
            (Code::Unknown, false, Final),
            (Code::PermissionDenied, false, Final),
            (Code::Unauthenticated, false, Final),
            (Code::DataLoss, false, Final),
        ];
        for (code, resched, want) in table {
            assert_eq!(
                classify(code, resched),
                want,
                "{code:?} reschedulable={resched}"
            );
        }
    }

    #[test]
    fn only_in_background_may_leave_a_volume() {
        assert!(CsiErrorClass::InBackground.volume_may_exist());
        assert!(!CsiErrorClass::Final.volume_may_exist());
        assert!(!CsiErrorClass::Infeasible.volume_may_exist());
        assert!(!CsiErrorClass::Reschedule.volume_may_exist());
    }
}
