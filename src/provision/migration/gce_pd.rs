//! GCE PD (`kubernetes.io/gce-pd` → `pd.csi.storage.gke.io`): a zonal class, the
//! `gcePersistentDisk` source, `projects/P/zones/Z/disks/NAME` handles, regions from zones.
//! upstream: csi-translation-lib plugins/gce_pd.go.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::class::{self, Zonal};
use super::{Plugin, PvSource, Source, partition, spec, topology};
use crate::keys;

const ZONE_KEY: &str = "topology.gke.io/zone";

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_GCE_PD,
    driver: keys::DRIVER_GCE_PD,
    translate_class,
    to_in_tree,
    topology_to_in_tree,
    volume_handle,
};

fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let rules = Zonal {
        key: ZONE_KEY,
        zones_are_topology: true,
        fstype_is_csi: true,
    };
    class::zonal(class, &rules)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    spec(pv).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name: pd_name(&csi.volume_handle)?.to_string(),
        partition: partition(&csi)?,
        fs_type: csi.fs_type,
        read_only: csi.read_only,
    });
    Ok(())
}

fn topology_to_in_tree(pv: &mut PersistentVolume) -> Result<(), String> {
    topology::to_in_tree(pv, ZONE_KEY, Some(region))
}

/// The handle of an in-tree disk: its zone from the PV's legacy zone label,
/// as csi-translation-lib reads it; several zones are a regional disk.
fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    let Source::GcePd { pd_name } = pv.source? else {
        return None;
    };
    let zones: Vec<&str> = pv
        .label(keys::LABEL_ZONE_BETA)
        .unwrap_or_default()
        .split(topology::ZONE_DELIMITER)
        .filter(|z| !z.is_empty())
        .collect();
    let location = match zones.as_slice() {
        [] => "UNSPECIFIED".to_string(),
        [zone] => zone.to_string(),
        many => match region_of(many) {
            Ok(region) => region,
            Err(e) => return Some(Err(e)),
        },
    };
    Some(Ok(format!(
        "projects/UNSPECIFIED/zones/{location}/disks/{pd_name}"
    )))
}

/// A GCE PD volume handle's disk name (`projects/P/zones/Z/disks/NAME`).
pub(super) fn pd_name(handle: &str) -> Result<&str, String> {
    let parts: Vec<&str> = handle.split('/').collect();
    if parts.len() < 6 {
        return Err(format!(
            "failed to get id components.Got: {}, wanted 6 components or more. ",
            parts.len()
        ));
    }
    Ok(parts[5])
}

/// A GCE zone's region: `{locale}-{region}-{zone}` → `{locale}-{region}`.
pub(super) fn region(zones: &[String]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".into());
    }
    let zones: Vec<&str> = zones.iter().map(String::as_str).collect();
    region_of(&zones)
}

/// The one region of zones `locale-region-zone` (listed as found when there
/// are several).
fn region_of(zones: &[&str]) -> Result<String, String> {
    let mut regions: Vec<String> = Vec::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        let region = parts[..2].join("-");
        if !regions.contains(&region) {
            regions.push(region);
        }
    }
    match regions.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}
