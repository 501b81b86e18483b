//! Claim and namespace metadata (`--copy-pvc-labels`): which keys of a
//! claim's labels are passed on, and where. Off by default: nothing is passed
//! on unless its key is listed.

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
}

/// The allow-lists, each sorted and without repeats; empty lists pass
/// nothing on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataConfig {
    /// Claim labels copied onto its PV.
    pub copy_pvc_labels: Vec<String>,
}

/// The metadata group, validated.
pub(super) fn validate(args: &MetadataArgs) -> Result<MetadataConfig, ConfigError> {
    let MetadataArgs { copy_pvc_labels } = args;
    let copy_pvc_labels = flat(copy_pvc_labels);
    if let Some(key) = copy_pvc_labels
        .iter()
        .find(|k| SCHEDULING_LABELS.contains(&k.as_str()))
    {
        return Err(ConfigError::SchedulingLabel { key: key.clone() });
    }
    Ok(MetadataConfig { copy_pvc_labels })
}

/// Every value of a repeatable list flag, sorted, without repeats.
fn flat(values: &[Keys]) -> Vec<String> {
    let mut keys: Vec<String> = values.iter().flat_map(|k| k.0.iter().cloned()).collect();
    keys.sort();
    keys.dedup();
    keys
}
