//! Azure Disk (`kubernetes.io/azure-disk` ↔ `disk.csi.azure.com`).

use super::super::azure_disk::disk_name as azure_disk_name;
use super::super::*;
use super::{class, csi_pv, topology};
use crate::keys::PLUGIN_AZURE_DISK as AZURE_DISK;

#[test]
fn its_class_keeps_fs_type_and_turns_its_zone_into_topology() {
    let c = translate_class(&class(
        AZURE_DISK,
        &[("fsType", "xfs"), ("zone", "eastus-1")],
    ))
    .unwrap();
    assert_eq!(
        c.parameters
            .clone()
            .unwrap()
            .get("fsType")
            .map(String::as_str),
        Some("xfs"),
        "the Azure Disk driver's own parameter name"
    );
    assert_eq!(
        topology(&c),
        vec![(
            "topology.disk.csi.azure.com/zone".to_string(),
            vec!["eastus-1".into()]
        )]
    );
}

#[test]
fn its_pv_is_saved_in_the_in_tree_form() {
    let uri = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/pvc-1";
    let mut pv = csi_pv(uri, None);
    pv_to_in_tree(AZURE_DISK, &mut pv).unwrap();
    let azure = pv.spec.unwrap().azure_disk.unwrap();
    assert_eq!(
        (
            azure.disk_name.as_str(),
            azure.disk_uri.as_str(),
            azure.kind.as_deref(),
            azure.fs_type.as_deref(),
            azure.read_only
        ),
        ("pvc-1", uri, Some("Managed"), Some("ext4"), Some(false))
    );
    assert_eq!(
        azure_disk_name("https://acct.blob.core.windows.net/vhds/pvc-2.vhd"),
        Ok("pvc-2.vhd")
    );
    assert!(azure_disk_name("vol-1").is_err());
}
