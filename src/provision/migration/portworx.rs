//! Portworx (`kubernetes.io/portworx-volume` → `pxd.portworx.com`): the class as it is,
//! the `portworxVolume` source, the volume id as the handle.
//! upstream: csi-translation-lib plugins/portworx.go.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource,
};

use super::{Plugin, PvSource, Source, class, no_topology, spec};
use crate::keys;

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_PORTWORX,
    driver: keys::DRIVER_PORTWORX,
    translate_class: class::unchanged,
    to_in_tree,
    topology_to_in_tree: no_topology,
    volume_handle,
};

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    spec(pv).portworx_volume = Some(PortworxVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type,
        read_only: csi.read_only,
    });
    Ok(())
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    match pv.source? {
        Source::Portworx { volume_id } => Some(Ok(volume_id.to_string())),
        _ => None,
    }
}
