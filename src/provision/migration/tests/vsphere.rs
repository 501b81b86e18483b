//! vSphere (`kubernetes.io/vsphere-volume` ↔ `csi.vsphere.vmware.com`).

use std::collections::BTreeMap;

use super::super::*;
use super::{class, csi_pv_with};
use crate::keys::PLUGIN_VSPHERE as VSPHERE;

#[test]
fn its_class_parameters_are_renamed_and_the_unknown_dropped() {
    let c = translate_class(&class(
        VSPHERE,
        &[
            ("datastore", "ds1"),
            ("StoragePolicyName", "gold"),
            ("unknown", "x"),
        ],
    ))
    .unwrap();
    let want: BTreeMap<String, String> = [
        ("datastore-migrationparam", "ds1"),
        ("storagepolicyname", "gold"),
        ("csimigration", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(c.parameters.unwrap(), want);
}

#[test]
fn its_pv_is_saved_with_its_volume_path() {
    let mut pv = csi_pv_with(
        "vsphere-id",
        &[("initialvolumefilepath", "[ds1] kubevols/pvc-1.vmdk")],
    );
    pv_to_in_tree(VSPHERE, &mut pv).unwrap();
    assert_eq!(
        pv.spec.unwrap().vsphere_volume.unwrap().volume_path,
        "[ds1] kubevols/pvc-1.vmdk"
    );
}
