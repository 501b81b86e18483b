//! Ceph RBD (`kubernetes.io/rbd` ↔ `rbd.csi.ceph.com`).

use super::super::rbd::{cluster_id, handle as rbd_handle};
use super::super::*;
use super::{class, csi_pv_with};
use crate::keys::{ANN_RBD_VOLUME_HANDLE, PLUGIN_RBD as RBD};

#[test]
fn its_class_names_the_cluster_and_the_secrets() {
    let c = translate_class(&class(
        RBD,
        &[
            ("monitors", "10.0.0.1:6789"),
            ("adminSecretName", "ceph"),
            ("pool", "kube"),
        ],
    ))
    .unwrap();
    let params = c.parameters.unwrap();
    assert_eq!(params["clusterID"], cluster_id("10.0.0.1:6789"));
    assert_eq!(params["pool"], "kube");
    assert_eq!(params["csi.storage.k8s.io/provisioner-secret-name"], "ceph");
    assert_eq!(
        params["csi.storage.k8s.io/node-stage-secret-namespace"],
        "default"
    );
    assert_eq!(params["migration"], "true");
    assert_eq!(
        translate_class(&class(RBD, &[("monitors", "m")])).unwrap_err(),
        "missing Ceph admin secret name"
    );
}

#[test]
fn its_pv_keeps_the_csi_handle_and_gives_it_back() {
    // MD5 as everyone computes it (RFC 1321's test vector).
    assert_eq!(cluster_id("abc"), "900150983cd24fb0d6963f7d28e17f72");
    let mut pv = csi_pv_with(
        "0001-rbd-handle",
        &[
            ("imageName", "csi-vol-1"),
            ("pool", "kube"),
            ("clusterID", "c1"),
        ],
    );
    pv_to_in_tree(RBD, &mut pv).unwrap();
    assert_eq!(
        pv.metadata.annotations.as_ref().unwrap()[ANN_RBD_VOLUME_HANDLE],
        "0001-rbd-handle"
    );
    let rbd = pv.spec.unwrap().rbd.unwrap();
    assert_eq!(
        (rbd.image.as_str(), rbd.pool.as_deref(), rbd.user.as_deref()),
        ("csi-vol-1", Some("kube"), Some("admin"))
    );
    assert_eq!(
        rbd_handle(Some("0001-rbd-handle"), &[], "", ""),
        Ok("0001-rbd-handle".to_string())
    );
    assert_eq!(
        rbd_handle(None, &["m1".into()], "rbd", "kubernetes-dynamic-pvc-abc"),
        Ok(format!("mig_mons-{}_image-abc_726264", cluster_id("m1")))
    );
}
