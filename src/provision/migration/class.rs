//! The StorageClass translation the zonal plugins share (AWS EBS, GCE PD, Azure Disk,
//! Cinder; vSphere for its allowed topologies): `fsType` under the CSI key, `zone`/`zones`
//! and the zone labels of allowed topologies under the driver's zone key.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::keys;

/// The legacy and the GA zone label a class's allowed topologies may name.
const ZONE_LABELS: [&str; 2] = [keys::LABEL_ZONE_BETA, keys::LABEL_ZONE];

/// How a zonal plugin's class parameters are read.
pub(super) struct Zonal {
    /// The driver's zonal topology key.
    pub key: &'static str,
    /// `zone`/`zones` become allowed topologies (Cinder's driver reads
    /// `availability` itself, so they stay parameters there).
    pub zones_are_topology: bool,
    /// `fsType` becomes the CSI fstype key (Azure Disk's driver takes it
    /// under its own name).
    pub fstype_is_csi: bool,
}

/// `class` in the driver's terms: `fsType` becomes the CSI fstype key,
/// `zone`/`zones` become allowed topologies of the driver's zone key (not
/// both with allowed topologies), zone labels in allowed topologies become
/// that key.
pub(super) fn zonal(class: &StorageClass, rules: &Zonal) -> Result<StorageClass, String> {
    let mut parameters = BTreeMap::new();
    let mut generated: Option<Vec<String>> = None;
    for (k, v) in class.parameters.iter().flatten() {
        match k.to_lowercase().as_str() {
            "fstype" if rules.fstype_is_csi => {
                parameters.insert(keys::PARAM_FSTYPE.to_string(), v.clone());
            }
            "zone" if rules.zones_are_topology => generated = Some(vec![v.clone()]),
            "zones" if rules.zones_are_topology => {
                generated = Some(v.split(',').map(str::to_string).collect())
            }
            _ => {
                parameters.insert(k.clone(), v.clone());
            }
        }
    }
    let has_allowed = class
        .allowed_topologies
        .as_ref()
        .is_some_and(|terms| !terms.is_empty());
    let mut translated = class.clone();
    translated.parameters = Some(parameters);
    translated.allowed_topologies = match generated {
        Some(_) if has_allowed => {
            return Err(
                "cannot simultaneously set allowed topologies and zone/zones parameters".into(),
            );
        }
        Some(zones) => Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: rules.key.to_string(),
                values: zones,
            }]),
        }]),
        None => allowed_under(class, rules.key),
    };
    Ok(translated)
}

/// The class's allowed topologies with each zone label renamed `key`.
pub(super) fn allowed_under(class: &StorageClass, key: &str) -> Option<Vec<TopologySelectorTerm>> {
    let rename = |e: &TopologySelectorLabelRequirement| TopologySelectorLabelRequirement {
        key: if ZONE_LABELS.contains(&e.key.as_str()) {
            key.to_string()
        } else {
            e.key.clone()
        },
        values: e.values.clone(),
    };
    class.allowed_topologies.as_ref().map(|terms| {
        terms
            .iter()
            .map(|term| TopologySelectorTerm {
                match_label_expressions: term
                    .match_label_expressions
                    .as_ref()
                    .map(|exprs| exprs.iter().map(rename).collect()),
            })
            .collect()
    })
}

/// The class as it is: the driver takes the in-tree parameters (Portworx,
/// Azure File).
pub(super) fn unchanged(class: &StorageClass) -> Result<StorageClass, String> {
    Ok(class.clone())
}
