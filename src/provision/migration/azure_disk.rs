//! Azure Disk (`kubernetes.io/azure-disk` → `disk.csi.azure.com`): a zonal class keeping
//! `fsType`, the `azureDisk` source, the disk URI as the handle.
//! upstream: csi-translation-lib plugins/azure_disk.go.

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::class::{self, Zonal};
use super::{Plugin, PvSource, Source, no_topology, spec};
use crate::keys;

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_AZURE_DISK,
    driver: keys::DRIVER_AZURE_DISK,
    translate_class,
    to_in_tree,
    topology_to_in_tree: no_topology,
    volume_handle,
};

fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let rules = Zonal {
        key: "topology.disk.csi.azure.com/zone",
        zones_are_topology: true,
        // The Azure Disk driver takes `fsType` under its own name.
        fstype_is_csi: false,
    };
    class::zonal(class, &rules)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    let non_empty = |k: &str| attrs.get(k).filter(|v| !v.is_empty()).cloned();
    spec(pv).azure_disk = Some(AzureDiskVolumeSource {
        disk_name: disk_name(&csi.volume_handle)?.to_string(),
        disk_uri: csi.volume_handle.clone(),
        fs_type: non_empty("fsType").or_else(|| Some(csi.fs_type.clone().unwrap_or_default())),
        read_only: Some(csi.read_only.unwrap_or_default()),
        kind: non_empty("kind").or_else(|| Some("Managed".into())),
        caching_mode: attrs.get("cachingMode").cloned(),
    });
    Ok(())
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    match pv.source? {
        Source::AzureDisk { disk_uri } => Some(Ok(disk_uri.to_string())),
        _ => None,
    }
}

/// An Azure disk URI's disk name: after the last `/providers/Microsoft.Compute/disks/`
/// of a managed disk's resource id, after the last `/vhds/` of an unmanaged
/// disk's blob URL.
pub(super) fn disk_name(uri: &str) -> Result<&str, String> {
    let unmanaged = uri.len() > 4 && uri[..4].eq_ignore_ascii_case("http");
    let (shape, marker, format) = if unmanaged {
        (
            uri.starts_with("http") && uri.contains("://"),
            "/vhds/",
            "http(?:.*)://(?:.*)/vhds/(.+)",
        )
    } else {
        let subscriptions = uri.find("/subscriptions/");
        let groups = uri.rfind("/resourceGroups/");
        (
            matches!((subscriptions, groups), (Some(s), Some(g)) if s < g),
            "/providers/Microsoft.Compute/disks/",
            ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)",
        )
    };
    match uri.rfind(marker) {
        Some(at) if shape && at + marker.len() < uri.len() => Ok(&uri[at + marker.len()..]),
        _ => Err(format!(
            "could not get disk name from {uri}, correct format: {format}"
        )),
    }
}
