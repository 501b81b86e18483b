//! GCE PD (`kubernetes.io/gce-pd` ↔ `pd.csi.storage.gke.io`).

use super::super::*;
use super::{class, csi_pv, handle_of, topology};
use crate::keys::PLUGIN_GCE_PD as GCE_PD;

#[test]
fn its_zones_become_allowed_topologies() {
    let c = translate_class(&class(GCE_PD, &[("zones", "us-a-1,us-a-2")])).unwrap();
    assert_eq!(
        topology(&c),
        vec![(
            "topology.gke.io/zone".to_string(),
            vec!["us-a-1".into(), "us-a-2".into()]
        )]
    );
    assert!(!c.parameters.unwrap().contains_key("zones"));
}

#[test]
fn its_pv_is_saved_in_the_in_tree_form() {
    let mut pv = csi_pv("projects/p/zones/us-a-1/disks/disk-1", Some(""));
    pv_to_in_tree(GCE_PD, &mut pv).unwrap();
    let gce = pv.spec.unwrap().gce_persistent_disk.unwrap();
    assert_eq!((gce.pd_name.as_str(), gce.partition), ("disk-1", None));
    let mut bad = csi_pv("disk-1", None);
    assert!(pv_to_in_tree(GCE_PD, &mut bad).is_err());
}

#[test]
fn its_in_tree_pv_gives_the_csi_handle_from_its_zone_label() {
    let ok = |r: Option<Result<String, String>>| r.unwrap().unwrap();
    let gce = |zone| handle_of(Source::GcePd { pd_name: "d" }, zone);
    assert_eq!(
        ok(gce(None)),
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d"
    );
    assert_eq!(
        ok(gce(Some("us-central1-a"))),
        "projects/UNSPECIFIED/zones/us-central1-a/disks/d"
    );
    assert_eq!(
        ok(gce(Some("us-central1-a__us-central1-b"))),
        "projects/UNSPECIFIED/zones/us-central1/disks/d"
    );
}
