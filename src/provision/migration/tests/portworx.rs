//! Portworx (`kubernetes.io/portworx-volume` ↔ `pxd.portworx.com`).

use super::super::*;
use super::{class, csi_pv};
use crate::keys::PLUGIN_PORTWORX as PORTWORX;

#[test]
fn its_class_is_taken_as_it_is() {
    let px = class(PORTWORX, &[("repl", "2")]);
    assert_eq!(translate_class(&px).unwrap(), px);
}

#[test]
fn its_pv_is_saved_in_the_in_tree_form() {
    let mut pv = csi_pv("px-1", None);
    pv_to_in_tree(PORTWORX, &mut pv).unwrap();
    assert_eq!(pv.spec.unwrap().portworx_volume.unwrap().volume_id, "px-1");
}
