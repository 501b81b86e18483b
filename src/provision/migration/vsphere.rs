//! vSphere (`kubernetes.io/vsphere-volume` → `csi.vsphere.vmware.com`): the parameters the
//! driver knows under their migration names, the `vsphereVolume` source, zone and region.
//! upstream: csi-translation-lib plugins/vsphere_volume.go.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{Plugin, PvSource, Source, class, spec, topology};
use crate::keys;

const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const REGION_KEY: &str = "topology.csi.vmware.com/region";

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_VSPHERE,
    driver: keys::DRIVER_VSPHERE,
    translate_class,
    to_in_tree,
    topology_to_in_tree,
    volume_handle,
};

/// The parameters the vSphere driver knows under their migration names, the
/// others dropped, `csimigration=true` so that the driver reports the
/// volume's file path, allowed topologies under the driver's zone key.
fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let mut parameters = BTreeMap::new();
    for (k, v) in class.parameters.iter().flatten() {
        let lower = k.to_lowercase();
        let name = match lower.as_str() {
            "fstype" => keys::PARAM_FSTYPE.to_string(),
            "storagepolicyname" => lower.clone(),
            "datastore"
            | "diskformat"
            | "hostfailurestotolerate"
            | "forceprovisioning"
            | "cachereservation"
            | "diskstripes"
            | "objectspacereservation"
            | "iopslimit" => {
                format!("{lower}-migrationparam")
            }
            _ => continue,
        };
        parameters.insert(name, v.clone());
    }
    parameters.insert("csimigration".into(), "true".into());
    let mut translated = class.clone();
    translated.parameters = Some(parameters);
    translated.allowed_topologies = class::allowed_under(class, ZONE_KEY);
    Ok(translated)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    spec(pv).vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
        volume_path: csi
            .volume_attributes
            .as_ref()
            .and_then(|a| a.get("initialvolumefilepath"))
            .cloned()
            .unwrap_or_default(),
        fs_type: csi.fs_type,
        ..Default::default()
    });
    Ok(())
}

fn topology_to_in_tree(pv: &mut PersistentVolume) -> Result<(), String> {
    topology::vsphere_to_in_tree(pv, ZONE_KEY, REGION_KEY);
    Ok(())
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    match pv.source? {
        Source::Vsphere { volume_path } => Some(Ok(volume_path.to_string())),
        _ => None,
    }
}
