//! Pure provisioning decisions: claim + class + driver facts → the
//! `CreateVolume` request; the driver's answer → the PersistentVolume. No I/O
//! here, so every rule is table-tested without a cluster.

mod claim;
pub mod clone;
pub mod grant;
mod metadata;
pub mod migration;
mod naming;
mod pv;
mod request;
pub mod secrets;
pub mod snapshot;
pub mod topology;

pub use claim::{ClaimView, DataSource};
pub use naming::{UidInName, uid_in_name, volume_name};
pub use pv::build_pv;
pub use request::{Gathered, Plan, plan};
pub use secrets::{SecretKind, SecretRef};

use crate::config::MetadataConfig;
use crate::csi::DriverCapabilities;
use crate::keys;
// Sizes are read and written with the crate's one quantity parser (a bottom-layer module);
// the files of this module use it as `super::quantity`.
use crate::quantity;

/// Flags that shape requests and PVs.
#[derive(Clone, Debug)]
pub struct ProvisionOptions {
    pub volume_name_prefix: String,
    /// `None`: the whole claim UID; `Some(n)`: its first `n` characters,
    /// dashes removed (`--volume-name-uuid-length`).
    pub volume_name_uuid_length: Option<usize>,
    pub extra_create_metadata: bool,
    /// `None`: fsType stays unset when the StorageClass has none.
    pub default_fstype: Option<String>,
    pub controller_publish_readonly: bool,
    /// `--strict-topology`: late binding uses only the selected node's topology.
    pub strict_topology: bool,
    /// `--immediate-topology`: Immediate binding asks for the cluster's topology.
    pub immediate_topology: bool,
    /// The `Topology` feature gate (GA, on by default).
    pub topology_gate: bool,
    /// The `VolumeAttributesClass` feature gate, resolved at start-up (on
    /// unless turned off or the API server does not serve the kind).
    pub volume_attributes_class: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// The `CrossNamespaceVolumeDataSource` feature gate (alpha, off by
    /// default): a `dataSourceRef` may name another namespace, where a
    /// ReferenceGrant must allow it.
    pub cross_namespace_data_source: bool,
    /// Which claim (and namespace) labels and annotations are passed on.
    pub metadata: MetadataConfig,
}

impl Default for ProvisionOptions {
    fn default() -> Self {
        ProvisionOptions {
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: None,
            extra_create_metadata: false,
            default_fstype: None,
            controller_publish_readonly: false,
            strict_topology: false,
            immediate_topology: true,
            topology_gate: true,
            volume_attributes_class: true,
            prevent_volume_mode_conversion: true,
            cross_namespace_data_source: false,
            metadata: MetadataConfig::default(),
        }
    }
}

/// Facts about the driver learned at start-up.
#[derive(Clone, Debug)]
pub struct DriverInfo {
    pub name: String,
    /// `storage.kubernetes.io/csiProvisionerIdentity` written into every PV.
    pub identity: String,
    pub capabilities: DriverCapabilities,
}

/// Why a claim cannot be provisioned as asked. Every variant is shown to the
/// user as a `ProvisioningFailed` event; none leaves a backend volume behind.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProvisionError {
    #[error("volume name prefix cannot be of length 0")]
    EmptyVolumeNamePrefix,
    #[error("corrupted PVC object, it is missing UID")]
    ClaimWithoutUid,
    #[error("claim Selector is not supported")]
    SelectorNotSupported,
    #[error(
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    )]
    CrossNamespaceDataSource,
    /// No ReferenceGrant of the source's namespace lets the claim use it.
    #[error(
        "accessing {object} of {} dataSource from {claim} isn't allowed",
        one_line(kind)
    )]
    NotGranted {
        /// `namespace/name` of the source.
        object: String,
        kind: String,
        /// `namespace/name` of the claim.
        claim: String,
    },
    #[error("the PVC source not found for PVC {claim}")]
    DataSourceWithoutName { claim: String },
    #[error(
        "the PVC source does not belong to the right APIGroup. Expected {}, Got {}",
        keys::SNAPSHOT_API_GROUP,
        one_line(got)
    )]
    SnapshotApiGroup { got: String },
    /// Not an error for the user: a volume populator fills claims of this kind
    /// (upstream's `IgnoredError`: an event, no retry, no `CreateVolume`).
    #[error(
        "data source ({}) is not handled by the provisioner, assuming an external populator will provision it",
        one_line(kind)
    )]
    ExternalPopulator { kind: String },
    #[error(
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    )]
    SnapshotRestoreNotSupported,
    #[error(
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    )]
    CloneNotSupported,
    /// The driver answered a restore without saying what it restored from.
    #[error("volume content source missing")]
    ContentSourceMissing,
    /// A class or PV of a migrated in-tree plugin that cannot be translated.
    #[error("{0}")]
    Migration(String),
    #[error(
        "CSI driver does not support dynamic provisioning: {missing} capability is not reported"
    )]
    ProvisioningNotSupported {
        /// `plugin CONTROLLER_SERVICE` or `controller CREATE_DELETE_VOLUME`.
        missing: &'static str,
    },
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"{}\" keys",
        keys::PARAM_FSTYPE
    )]
    FsTypeTwice,
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"{}\" with reserved namespace {}",
        one_line(key),
        keys::CSI_PARAMETER_PREFIX
    )]
    UnknownReservedParameter { key: String },
    #[error(
        "failed to get {}name and namespace template from params: {reason}",
        if *default { "default " } else { "" }
    )]
    SecretParams {
        default: bool,
        reason: secrets::SecretParamsError,
    },
    #[error(
        "error resolving value {template:?}: invalid tokens: {}",
        go_quoted_list(tokens)
    )]
    SecretTemplate {
        template: String,
        tokens: Vec<String>,
    },
    #[error("{}", not_valid(template, resolved, "namespace"))]
    SecretInvalidNamespace { template: String, resolved: String },
    #[error("{}", not_valid(template, resolved, "secret"))]
    SecretInvalidName { template: String, resolved: String },
    #[error("no access modes requested")]
    NoAccessModes,
    #[error("unknown access mode {0:?}")]
    UnknownAccessMode(String),
    #[error("ReadWriteOncePod access mode cannot be combined with other access modes")]
    ReadWriteOncePodCombined,
    #[error("claim has no valid storage request: {0:?}")]
    BadStorageRequest(String),
    #[error("volume mode {0:?} is not supported")]
    UnknownVolumeMode(String),
    #[error("{0}")]
    Topology(String),
    #[error(
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    )]
    VolumeAttributesClassNotSupported,
    #[error(
        "VAC {name} referenced in PVC is for driver {driver} which does not match driver name {ours}"
    )]
    VolumeAttributesClassOfAnotherDriver {
        name: String,
        driver: String,
        ours: String,
    },
    /// A listed label or annotation whose value no driver can be expected to
    /// take (`--extra-create-metadata-*`); the value itself is not shown.
    #[error("cannot pass {from} {key:?} to the driver as parameter {parameter:?}: {reason}")]
    MetadataValue {
        /// `claim label`, `namespace annotation`, …
        from: &'static str,
        key: String,
        parameter: String,
        reason: String,
    },
    #[error(
        "the parameters with the claim's and its namespace's metadata would be {bytes} bytes, more than the {} bytes CSI allows a map",
        keys::CSI_MAX_MAP_BYTES
    )]
    MetadataTooLarge { bytes: usize },
    #[error("CreateVolume returned no volume or an empty volume id")]
    EmptyVolumeId,
    #[error("created volume capacity {got} less than requested capacity {want}")]
    VolumeTooSmall { got: i64, want: i64 },
}

/// A string the API server does not validate (a data source's kind or API
/// group, a parameter key), shown as written but with its control characters
/// escaped (`\n`), so that a user's string cannot break an event or a log
/// line in two, nor forge one. The same text as upstream's for any string
/// without them.
pub fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        s.into()
    }
}

/// Go's `%q` of a string list: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// Upstream's text for a template that does not give a valid name: it says
/// what the template resolved to only when a substitution happened.
fn not_valid(template: &str, resolved: &str, what: &str) -> String {
    if template == resolved {
        format!("{template:?} is not a valid {what} name")
    } else {
        format!("{template:?} resolved to {resolved:?} which is not a valid {what} name")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_string_stays_on_one_line_and_is_otherwise_as_written() {
        assert_eq!(one_line("Restore"), "Restore");
        assert_eq!(one_line("a\nb\tc\u{7}"), "a\\nb\\tc\\u{7}");
        let err = ProvisionError::ExternalPopulator {
            kind: "Backup\nlevel=error msg=forged".into(),
        };
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}

/// The request tests' claim and driver, for the controller's tests.
#[cfg(test)]
pub(crate) mod fixtures {
    pub use super::request::tests::claim;
}
