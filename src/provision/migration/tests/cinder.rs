//! OpenStack Cinder (`kubernetes.io/cinder` ↔ `cinder.csi.openstack.org`).

use super::super::*;
use super::{class, csi_pv, handle_of};
use crate::keys::{PARAM_FSTYPE as FSTYPE_KEY, PLUGIN_CINDER as CINDER};

#[test]
fn its_class_keeps_availability_for_its_driver() {
    let c = translate_class(&class(
        CINDER,
        &[("availability", "nova"), ("fstype", "ext4")],
    ))
    .unwrap();
    let params = c.parameters.unwrap();
    assert_eq!(params.get("availability").map(String::as_str), Some("nova"));
    assert_eq!(params.get(FSTYPE_KEY).map(String::as_str), Some("ext4"));
}

#[test]
fn its_pv_goes_to_the_in_tree_form_and_back() {
    let mut pv = csi_pv("c-1", None);
    pv_to_in_tree(CINDER, &mut pv).unwrap();
    assert_eq!(pv.spec.unwrap().cinder.unwrap().volume_id, "c-1");
    let cinder = Source::Cinder {
        volume_id: "cinder-id",
    };
    assert_eq!(handle_of(cinder, None).unwrap().unwrap(), "cinder-id");
}
