//! Pure provisioning decisions: claim + class + driver facts → the
//! `CreateVolume` request; the driver's answer → the PersistentVolume. No I/O
//! here, so every rule is table-tested without a cluster.

mod naming;
mod pv;
pub mod quantity;
mod request;
pub mod secrets;
pub mod topology;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

pub use naming::volume_name;
pub use pv::build_pv;
pub use request::{PreparedVolume, prepare};
pub use secrets::{SecretKind, SecretRef};

use crate::csi::DriverCapabilities;
use crate::keys;

/// Flags that shape requests and PVs.
#[derive(Clone, Debug)]
pub struct ProvisionOptions {
    pub volume_name_prefix: String,
    pub volume_name_uuid_length: i32,
    pub extra_create_metadata: bool,
    pub default_fstype: String,
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
}

impl Default for ProvisionOptions {
    fn default() -> Self {
        ProvisionOptions {
            volume_name_prefix: "pvc".into(),
            volume_name_uuid_length: -1,
            extra_create_metadata: false,
            default_fstype: String::new(),
            controller_publish_readonly: false,
            strict_topology: false,
            immediate_topology: true,
            topology_gate: true,
            volume_attributes_class: true,
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
    #[error("data source {kind:?} is not supported yet by this provisioner")]
    DataSourceNotSupported { kind: String },
    #[error(
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE or controller CREATE_DELETE_VOLUME capability is not reported"
    )]
    ProvisioningNotSupported,
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"{}\" keys",
        keys::PARAM_FSTYPE
    )]
    FsTypeTwice,
    #[error(
        "found unknown parameter key \"{key}\" with reserved namespace {}",
        keys::CSI_PARAMETER_PREFIX
    )]
    UnknownReservedParameter { key: String },
    #[error(
        "{kind} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"
    )]
    SecretKeysBothForms { kind: &'static str },
    #[error("either name and namespace for {kind} secrets specified, Both must be specified")]
    SecretNameOrNamespaceMissing { kind: &'static str },
    #[error(
        "{kind} secrets specified in parameters but value of either namespace or name is empty"
    )]
    SecretEmptyValue { kind: &'static str },
    #[error("failed to resolve {kind} secret template {template:?}: invalid tokens: {tokens:?}")]
    SecretTemplate {
        kind: &'static str,
        template: String,
        tokens: Vec<String>,
    },
    #[error("{template:?} resolved to {resolved:?} which is not a valid namespace name")]
    SecretInvalidNamespace { template: String, resolved: String },
    #[error("{template:?} resolved to {resolved:?} which is not a valid secret name")]
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
    #[error("CreateVolume returned no volume or an empty volume id")]
    EmptyVolumeId,
    #[error("created volume capacity {got} less than requested capacity {want}")]
    VolumeTooSmall { got: i64, want: i64 },
}

/// The StorageClass name of a claim: the legacy annotation wins over the spec.
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANN_BETA_STORAGE_CLASS))
        .map(String::as_str)
        .or_else(|| claim.spec.as_ref()?.storage_class_name.as_deref())
}

/// The provisioner a claim asks for (GA annotation, then beta).
pub fn claim_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    let ann = claim.metadata.annotations.as_ref()?;
    ann.get(keys::ANN_STORAGE_PROVISIONER)
        .or_else(|| ann.get(keys::ANN_BETA_STORAGE_PROVISIONER))
        .map(String::as_str)
}

/// The node chosen by the scheduler for a WaitForFirstConsumer claim.
pub fn claim_selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    let ann = claim.metadata.annotations.as_ref()?;
    ann.get(keys::ANN_SELECTED_NODE)
        .or_else(|| ann.get(keys::ANN_ALPHA_SELECTED_NODE))
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The VolumeAttributesClass a claim asks for, when the gate is on.
pub fn claim_vac_name<'a>(
    claim: &'a PersistentVolumeClaim,
    opts: &ProvisionOptions,
) -> Option<&'a str> {
    if !opts.volume_attributes_class {
        return None;
    }
    claim
        .spec
        .as_ref()?
        .volume_attributes_class_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

fn annotations(claim: &PersistentVolumeClaim) -> BTreeMap<String, String> {
    claim.metadata.annotations.clone().unwrap_or_default()
}
