//! Cinder (`kubernetes.io/cinder` → `cinder.csi.openstack.org`): a zonal class whose
//! `availability` the driver reads itself, the `cinder` source, the volume id as the handle.
//! upstream: csi-translation-lib plugins/openstack_cinder.go.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::class::{self, Zonal};
use super::{Plugin, PvSource, Source, spec, topology};
use crate::keys;

const ZONE_KEY: &str = "topology.cinder.csi.openstack.org/zone";

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_CINDER,
    driver: keys::DRIVER_CINDER,
    translate_class,
    to_in_tree,
    topology_to_in_tree,
    volume_handle,
};

fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let rules = Zonal {
        key: ZONE_KEY,
        // The driver understands `availability` (and zones) itself: not a topology.
        zones_are_topology: false,
        fstype_is_csi: true,
    };
    class::zonal(class, &rules)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    spec(pv).cinder = Some(CinderPersistentVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type,
        read_only: csi.read_only,
        secret_ref: None,
    });
    Ok(())
}

/// Cinder has zones but no regions.
fn topology_to_in_tree(pv: &mut PersistentVolume) -> Result<(), String> {
    topology::to_in_tree(pv, ZONE_KEY, None)
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    match pv.source? {
        Source::Cinder { volume_id } => Some(Ok(volume_id.to_string())),
        _ => None,
    }
}
