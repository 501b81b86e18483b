//! Claim and namespace metadata (`--copy-pvc-labels`,
//! `--extra-create-metadata-{pvc,namespace}-{labels,annotations}`): which keys
//! of a claim's and its namespace's labels and annotations are passed on, to
//! the PV or to the driver. Off by default: nothing is passed on unless its
//! key is listed.

use clap::ArgAction;

use super::ConfigError;
use super::cli::heading;
use super::values::{Keys, parse_keys};
use crate::keys;

/// Labels the scheduler reads from PersistentVolumes (its VolumeZone
/// filter): copied from a claim they could make the PV unusable, so they are
/// never copied (the PV's node affinity says where its volume is).
const SCHEDULING_LABELS: [&str; 4] = [
    keys::LABEL_ZONE,
    keys::LABEL_REGION,
    keys::LABEL_ZONE_BETA,
    keys::LABEL_REGION_BETA,
];

/// Claim and namespace metadata passed on.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = heading::METADATA)]
pub struct MetadataArgs {
    /// Copy these labels of a claim onto the PersistentVolume made for it, KEY,...
    /// (repeatable; when the PV is created, not kept in step afterwards). The zone and
    /// region labels the scheduler reads from PersistentVolumes are refused.
    #[arg(long, action = ArgAction::Append, value_parser = parse_keys,
          value_name = "KEY,...")]
    pub copy_pvc_labels: Vec<Keys>,

    /// Pass the values of these labels of the claim to CreateVolume as parameters
    /// csi.storage.k8s.io/pvc/labels/<KEY>, KEY,... (repeatable; without
    /// --extra-create-metadata too). A value CSI does not allow (over 128 bytes, control
    /// characters) fails the claim's provisioning with an event naming the key.
    #[arg(long, action = ArgAction::Append, value_parser = parse_keys,
          value_name = "KEY,...")]
    pub extra_create_metadata_pvc_labels: Vec<Keys>,

    /// Pass the values of these annotations of the claim to CreateVolume as parameters
    /// csi.storage.k8s.io/pvc/annotations/<KEY>, KEY,... (repeatable; as the labels).
    #[arg(long, action = ArgAction::Append, value_parser = parse_keys,
          value_name = "KEY,...")]
    pub extra_create_metadata_pvc_annotations: Vec<Keys>,

    /// Pass the values of these labels of the claim's namespace to CreateVolume as
    /// parameters csi.storage.k8s.io/namespace/labels/<KEY>, KEY,... (repeatable; as the
    /// claim's). Namespaces are then watched, metadata only: needs list and watch (and
    /// get) on namespaces.
    #[arg(long, action = ArgAction::Append, value_parser = parse_keys,
          value_name = "KEY,...")]
    pub extra_create_metadata_namespace_labels: Vec<Keys>,

    /// Pass the values of these annotations of the claim's namespace to CreateVolume as
    /// parameters csi.storage.k8s.io/namespace/annotations/<KEY>, KEY,... (repeatable; as
    /// the namespace's labels).
    #[arg(long, action = ArgAction::Append, value_parser = parse_keys,
          value_name = "KEY,...")]
    pub extra_create_metadata_namespace_annotations: Vec<Keys>,
}

/// The allow-lists, each sorted and without repeats; empty lists pass
/// nothing on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataConfig {
    /// Claim labels copied onto its PV.
    pub copy_pvc_labels: Vec<String>,
    /// Claim labels and annotations, namespace labels and annotations whose
    /// values go to `CreateVolume` as parameters.
    pub pvc_labels: Vec<String>,
    pub pvc_annotations: Vec<String>,
    pub namespace_labels: Vec<String>,
    pub namespace_annotations: Vec<String>,
}

impl MetadataConfig {
    /// Whether requests need the claim's namespace.
    pub fn needs_namespace(&self) -> bool {
        !self.namespace_labels.is_empty() || !self.namespace_annotations.is_empty()
    }
}

/// The metadata group, validated.
pub(super) fn validate(args: &MetadataArgs) -> Result<MetadataConfig, ConfigError> {
    let MetadataArgs {
        copy_pvc_labels,
        extra_create_metadata_pvc_labels,
        extra_create_metadata_pvc_annotations,
        extra_create_metadata_namespace_labels,
        extra_create_metadata_namespace_annotations,
    } = args;
    let copy_pvc_labels = flat(copy_pvc_labels);
    if let Some(key) = copy_pvc_labels
        .iter()
        .find(|k| SCHEDULING_LABELS.contains(&k.as_str()))
    {
        return Err(ConfigError::SchedulingLabel { key: key.clone() });
    }
    Ok(MetadataConfig {
        copy_pvc_labels,
        pvc_labels: parameter_keys(
            "--extra-create-metadata-pvc-labels",
            extra_create_metadata_pvc_labels,
            keys::PARAM_PVC_LABELS,
        )?,
        pvc_annotations: parameter_keys(
            "--extra-create-metadata-pvc-annotations",
            extra_create_metadata_pvc_annotations,
            keys::PARAM_PVC_ANNOTATIONS,
        )?,
        namespace_labels: parameter_keys(
            "--extra-create-metadata-namespace-labels",
            extra_create_metadata_namespace_labels,
            keys::PARAM_NAMESPACE_LABELS,
        )?,
        namespace_annotations: parameter_keys(
            "--extra-create-metadata-namespace-annotations",
            extra_create_metadata_namespace_annotations,
            keys::PARAM_NAMESPACE_ANNOTATIONS,
        )?,
    })
}

/// The keys of a flag whose values become parameters `<prefix><key>`: each
/// such parameter key must fit CSI's string limit, or no driver could be
/// sent it.
fn parameter_keys(
    flag: &'static str,
    values: &[Keys],
    prefix: &str,
) -> Result<Vec<String>, ConfigError> {
    let keys = flat(values);
    if let Some(key) = keys
        .iter()
        .find(|k| prefix.len() + k.len() > keys::CSI_MAX_STRING_BYTES)
    {
        return Err(ConfigError::ParameterKeyTooLong {
            flag,
            parameter: format!("{prefix}{key}"),
        });
    }
    Ok(keys)
}

/// Every value of a repeatable list flag, sorted, without repeats.
fn flat(values: &[Keys]) -> Vec<String> {
    let mut keys: Vec<String> = values.iter().flat_map(|k| k.0.iter().cloned()).collect();
    keys.sort();
    keys.dedup();
    keys
}
