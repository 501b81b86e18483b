//! CSI migration, as upstream does it through csi-translation-lib: an in-tree plugin's
//! classes and PVs in its CSI driver's terms and back. One file per plugin behind one
//! table (`PLUGINS`); the steps all plugins share are here and in the files below.

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;

mod aws_ebs;
mod azure_disk;
mod azure_file;
mod cinder;
mod class;
mod gce_pd;
mod portworx;
mod rbd;
mod source;
#[cfg(test)]
mod tests;
mod topology;
mod vsphere;

pub use source::{PvSource, Source, volume_handle, volume_of};

/// An in-tree plugin migrated to a CSI driver, and how each of its objects is
/// translated.
pub struct Plugin {
    /// A StorageClass's provisioner, a migrated PV's `provisioned-by`.
    pub in_tree: &'static str,
    /// The CSI driver the plugin was migrated to.
    pub driver: &'static str,
    /// Its StorageClass in the driver's terms (the provisioner stays in-tree).
    translate_class: fn(&StorageClass) -> Result<StorageClass, String>,
    /// The CSI source of a PV the driver's volume was saved in, as the
    /// plugin's in-tree source (and the annotations it comes with).
    to_in_tree: fn(CSIPersistentVolumeSource, &mut PersistentVolume) -> Result<(), String>,
    /// The driver's node affinity back in the Kubernetes zone/region labels.
    topology_to_in_tree: fn(&mut PersistentVolume) -> Result<(), String>,
    /// The driver's handle of a PV with the plugin's in-tree source (`None`:
    /// the PV has no source of this plugin).
    volume_handle: fn(&PvSource) -> Option<Result<String, String>>,
}

/// Every plugin csi-translation-lib translates, in its order (and
/// `keys::MIGRATED_PLUGINS`'), plus RBD, which it translated until Kubernetes 1.31.
const PLUGINS: [&Plugin; 8] = [
    &aws_ebs::PLUGIN,
    &gce_pd::PLUGIN,
    &azure_disk::PLUGIN,
    &azure_file::PLUGIN,
    &cinder::PLUGIN,
    &vsphere::PLUGIN,
    &portworx::PLUGIN,
    &rbd::PLUGIN,
];

fn by_in_tree(name: &str) -> Option<&'static Plugin> {
    PLUGINS.into_iter().find(|p| p.in_tree == name)
}

fn by_driver(name: &str) -> Option<&'static Plugin> {
    PLUGINS.into_iter().find(|p| p.driver == name)
}

/// The in-tree plugin migrated to the CSI driver `driver`, if any.
pub fn in_tree_plugin(driver: &str) -> Option<&'static str> {
    by_driver(driver).map(|p| p.in_tree)
}

/// Whether `class` is a class of the in-tree plugin migrated to `driver`.
pub fn is_migrated_class(class: &StorageClass, driver: &str) -> bool {
    in_tree_plugin(driver) == Some(class.provisioner.as_str())
}

/// `class` (of the in-tree plugin migrated to our driver) in the CSI driver's
/// terms, as its plugin translates it. The provisioner stays the in-tree name
/// (the PV's `provisioned-by`).
pub fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let plugin = by_in_tree(&class.provisioner).ok_or_else(|| {
        format!(
            "translating a StorageClass of in-tree plugin {} is not supported yet",
            class.provisioner
        )
    })?;
    (plugin.translate_class)(class)
}

/// Turns the CSI PV built for a migrated class into the in-tree plugin's PV
/// source, as csi-translation-lib does, with the driver's topology back in the
/// Kubernetes zone/region labels (node affinity and PV labels) for a rollback
/// to the in-tree plugin.
pub fn pv_to_in_tree(plugin: &str, pv: &mut PersistentVolume) -> Result<(), String> {
    let spec = pv.spec.get_or_insert_with(Default::default);
    let csi = spec
        .csi
        .take()
        .ok_or_else(|| "pv is nil or CSI source not defined on pv".to_string())?;
    let Some(plugin) = by_in_tree(plugin) else {
        spec.csi = Some(csi);
        return Err(format!(
            "translating a PV to in-tree plugin {plugin} is not supported yet"
        ));
    };
    (plugin.to_in_tree)(csi, pv)?;
    (plugin.topology_to_in_tree)(pv).map_err(|e| format!("failed to translate topology: {e}"))
}

/// The `partition` volume attribute of a CSI source, as the in-tree sources
/// that have one take it (empty: none).
fn partition(csi: &CSIPersistentVolumeSource) -> Result<Option<i32>, String> {
    match csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get("partition"))
    {
        None => Ok(None),
        Some(p) if p.is_empty() => Ok(None),
        Some(p) => p
            .parse::<i32>()
            .map(Some)
            .map_err(|e| format!("failed to convert partition {p} to integer: {e}")),
    }
}

/// The spec of a PV being translated (always there: `pv_to_in_tree` made it).
fn spec(pv: &mut PersistentVolume) -> &mut k8s_openapi::api::core::v1::PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

/// The topology step of a plugin whose driver has none to translate back.
fn no_topology(_: &mut PersistentVolume) -> Result<(), String> {
    Ok(())
}
