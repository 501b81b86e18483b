//! Ceph RBD (`kubernetes.io/rbd` → `rbd.csi.ceph.com`): the admin secret and monitors as
//! the driver's secrets and cluster id, the `rbd` source, the driver's handle annotated.
//! upstream: csi-translation-lib plugins/rbd.go (until Kubernetes 1.31).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, RBDPersistentVolumeSource, SecretReference,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{Plugin, PvSource, Source, no_topology, spec};
use crate::keys;

pub(super) const PLUGIN: Plugin = Plugin {
    in_tree: keys::PLUGIN_RBD,
    driver: keys::DRIVER_RBD,
    translate_class,
    to_in_tree,
    topology_to_in_tree: no_topology,
    volume_handle,
};

/// The secrets the admin secret stands for.
const SECRET_KINDS: [&str; 3] = ["provisioner", "node-stage", "controller-expand"];

/// Defaults first (migration, pool `rbd`, secret namespaces `default`), then
/// the in-tree parameters under the RBD driver's names; the admin secret
/// becomes the provisioner, node-stage and controller-expand secret; the
/// monitors name the cluster.
fn translate_class(class: &StorageClass) -> Result<StorageClass, String> {
    let mut p: BTreeMap<String, String> = BTreeMap::new();
    p.insert("migration".into(), "true".into());
    p.insert("pool".into(), "rbd".into());
    let secrets = |p: &mut BTreeMap<String, String>, what: &str, v: &str| {
        for kind in SECRET_KINDS {
            p.insert(format!("csi.storage.k8s.io/{kind}-secret-{what}"), v.into());
        }
    };
    secrets(&mut p, "namespace", "default");
    for (k, v) in class.parameters.iter().flatten() {
        let renamed = match k.to_lowercase().as_str() {
            "fstype" => keys::PARAM_FSTYPE,
            "imagefeatures" => "imageFeatures",
            "pool" => "pool",
            "imageformat" => "imageFormat",
            "adminid" => "adminId",
            "adminsecretname" => {
                secrets(&mut p, "name", v);
                continue;
            }
            "adminsecretnamespace" => {
                secrets(&mut p, "namespace", v);
                continue;
            }
            "monitors" => {
                p.insert("clusterID".into(), cluster_id(v));
                "monitors"
            }
            _ => continue,
        };
        p.insert(renamed.into(), v.clone());
    }
    let present = |k: &str| p.get(k).is_some_and(|v| !v.is_empty());
    if !present("csi.storage.k8s.io/provisioner-secret-name") {
        return Err("missing Ceph admin secret name".into());
    }
    if !present("monitors") {
        return Err("missing Ceph monitors".into());
    }
    let mut translated = class.clone();
    translated.parameters = Some(p);
    Ok(translated)
}

fn to_in_tree(csi: CSIPersistentVolumeSource, pv: &mut PersistentVolume) -> Result<(), String> {
    let attrs = csi.volume_attributes.clone().unwrap_or_default();
    let attr = |k: &str| attrs.get(k).cloned().unwrap_or_default();
    let user = Some(attr("adminId")).filter(|u| !u.is_empty());
    spec(pv).rbd = Some(RBDPersistentVolumeSource {
        monitors: vec![String::new()],
        image: attr("imageName"),
        fs_type: csi.fs_type.clone(),
        pool: Some(attr("pool")),
        user: Some(user.unwrap_or_else(|| "admin".into())),
        read_only: csi.read_only,
        secret_ref: csi.node_stage_secret_ref.as_ref().map(|s| SecretReference {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
        }),
        ..Default::default()
    });
    let annotations = pv.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(keys::ANN_RBD_VOLUME_HANDLE.into(), csi.volume_handle);
    for key in ["clusterID", "journalPool", "imageFeatures", "imageFormat"] {
        annotations.insert(key.into(), attr(key));
    }
    Ok(())
}

fn volume_handle(pv: &PvSource) -> Option<Result<String, String>> {
    let Source::Rbd {
        monitors,
        pool,
        image,
    } = pv.source?
    else {
        return None;
    };
    Some(handle(
        pv.annotation(keys::ANN_RBD_VOLUME_HANDLE),
        monitors,
        pool.unwrap_or("rbd"),
        image,
    ))
}

/// The RBD driver's handle of an in-tree RBD PV: the handle it was created
/// with (annotation), else the migration handle composed from the monitors,
/// the pool and the image.
pub(super) fn handle(
    annotated: Option<&str>,
    monitors: &[String],
    pool: &str,
    image: &str,
) -> Result<String, String> {
    if let Some(handle) = annotated.filter(|h| !h.is_empty()) {
        return Ok(handle.to_string());
    }
    let image = image
        .split_once("kubernetes-dynamic-pvc-")
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("RBD image {image:?} was not made by the in-tree provisioner"))?;
    let pool_hex: String = pool.bytes().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "mig_mons-{}_image-{image}_{pool_hex}",
        cluster_id(&monitors.join(","))
    ))
}

/// The hex MD5 of the monitors: the cluster id the RBD driver knows them by.
pub(super) fn cluster_id(monitors: &str) -> String {
    use md5::{Digest, Md5};
    Md5::digest(monitors.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
