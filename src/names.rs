//! The Kubernetes API's enumerated values the sidecar reads and writes (PV and claim
//! phases, reclaim policies, binding, volume and access modes) and the types and
//! reasons of the Events it records: each a small type whose spelling is its
//! variant's name, in one place (the bottom layer, like `keys`). The spellings
//! are the API's and upstream's exactly, so the two sidecars show the same events.

/// An enum of API values spelled as its variants are named: `as_str`, `parse`
/// (`None` for a value this type does not know) and `Display`.
macro_rules! spelled {
    ($(#[$meta:meta])* $name:ident { $($(#[$variant_meta:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[$name] = &[$($name::$variant,)+];

            /// The value as the API spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                }
            }

            /// The value spelled `value`, if it is one of these.
            pub fn parse(value: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.as_str() == value)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spelled! {
    /// `status.phase` of a PersistentVolume.
    PvPhase {
        Pending,
        Available,
        Bound,
        Released,
        Failed,
    }
}

spelled! {
    /// `status.phase` of a PersistentVolumeClaim.
    ClaimPhase {
        Pending,
        Bound,
        Lost,
    }
}

spelled! {
    /// `persistentVolumeReclaimPolicy` of a PV, `reclaimPolicy` of a StorageClass.
    ReclaimPolicy {
        Delete,
        Retain,
        Recycle,
    }
}

spelled! {
    /// `volumeBindingMode` of a StorageClass.
    BindingMode {
        Immediate,
        WaitForFirstConsumer,
    }
}

spelled! {
    /// `volumeMode` of a claim or a PV (none means `Filesystem`).
    VolumeMode {
        Filesystem,
        Block,
    }
}

spelled! {
    /// An entry of `accessModes` of a claim or a PV.
    AccessMode {
        ReadWriteOnce,
        ReadOnlyMany,
        ReadWriteMany,
        ReadWriteOncePod,
    }
}

spelled! {
    /// `type` of a core/v1 Event.
    EventType {
        Normal,
        Warning,
    }
}

spelled! {
    /// The reason of every Event the sidecar records, as upstream records it
    /// (sig-storage-lib-external-provisioner's controller and external-provisioner's).
    Reason {
        /// Before each provisioning attempt; also the note that an external
        /// populator will fill the claim.
        Provisioning,
        /// The claim's PV is saved.
        ProvisioningSucceeded,
        /// A provisioning attempt failed.
        ProvisioningFailed,
        /// A backend volume made for a claim could not be deleted again (upstream:
        /// after its PV could not be saved; here also for a claim deleted during
        /// provisioning).
        ProvisioningCleanupFailed,
        /// The backend volume of a released PV could not be deleted.
        VolumeFailedDelete,
        /// The deletion of a released PV's volume waits for a detach (lib v13.1's note).
        VolumeDelete,
    }
}

impl Reason {
    /// The type an event of this reason has: failures are warnings.
    pub fn event_type(self) -> EventType {
        match self {
            Reason::Provisioning | Reason::ProvisioningSucceeded | Reason::VolumeDelete => {
                EventType::Normal
            }
            Reason::ProvisioningFailed
            | Reason::ProvisioningCleanupFailed
            | Reason::VolumeFailedDelete => EventType::Warning,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_spelled_as_the_api_spells_them() {
        let spelled: Vec<&str> = PvPhase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            spelled,
            ["Pending", "Available", "Bound", "Released", "Failed"]
        );
        assert_eq!(
            BindingMode::WaitForFirstConsumer.to_string(),
            "WaitForFirstConsumer"
        );
        assert_eq!(AccessMode::ReadWriteOncePod.as_str(), "ReadWriteOncePod");
        assert_eq!(ReclaimPolicy::parse("Retain"), Some(ReclaimPolicy::Retain));
        assert_eq!(VolumeMode::parse("Block"), Some(VolumeMode::Block));
    }

    #[test]
    fn a_value_parses_back_and_an_unknown_or_misspelled_one_does_not() {
        for phase in ClaimPhase::ALL {
            assert_eq!(ClaimPhase::parse(phase.as_str()), Some(*phase));
        }
        assert_eq!(PvPhase::parse("bound"), None);
        assert_eq!(PvPhase::parse(""), None);
        assert_eq!(ReclaimPolicy::parse("Delete "), None);
        assert_eq!(VolumeMode::parse("Raw"), None);
    }

    #[test]
    fn each_reason_has_upstreams_spelling_and_type() {
        use EventType::*;
        let rows = [
            (Reason::Provisioning, "Provisioning", Normal),
            (
                Reason::ProvisioningSucceeded,
                "ProvisioningSucceeded",
                Normal,
            ),
            (Reason::ProvisioningFailed, "ProvisioningFailed", Warning),
            (
                Reason::ProvisioningCleanupFailed,
                "ProvisioningCleanupFailed",
                Warning,
            ),
            (Reason::VolumeFailedDelete, "VolumeFailedDelete", Warning),
            (Reason::VolumeDelete, "VolumeDelete", Normal),
        ];
        assert_eq!(rows.len(), Reason::ALL.len());
        for (reason, spelled, kind) in rows {
            assert_eq!(reason.as_str(), spelled);
            assert_eq!(reason.event_type(), kind, "{reason}");
        }
        assert_eq!(Warning.as_str(), "Warning");
    }
}
